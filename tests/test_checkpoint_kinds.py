"""checkpoint/kinds.py: what a training checkpoint given as --base-checkpoint leaves out, said at the start."""

from __future__ import annotations

from pathlib import Path

from indextts_train.checkpoint.kinds import ignored_by_base_checkpoint
from indextts_train.checkpoint.state import FORMAT


def ours(step: int, plan: dict | None) -> dict:
    return {"format": FORMAT, "progress": {"step": step}, **({"vocab_plan": plan} if plan is not None else {})}


def test_a_grown_runs_frozen_base_rows_are_said_not_to_carry_over() -> None:
    """A run that grew 100 base tokens to 150 and kept the 100 base rows frozen, given as the base of a new run:
    all its rows are that run's base, so with the same tokenizer nothing is new and the 100 rows train from now on."""
    said = ignored_by_base_checkpoint(Path("r/model_step8.pth"),
                                      ours(8, {"base_tokens": 100, "tokens": 150, "freeze_base": True}))
    assert said.startswith("--base-checkpoint r/model_step8.pth is a training checkpoint at step 8: only its "
                           "weights are used")
    assert ("its run grew 100 base text tokens to 150 and kept the 100 base rows frozen" in said
            and "every row trains (--resume keeps the first run's frozen rows)" in said)
    for plan in (None, {"base_tokens": 150, "tokens": 150, "freeze_base": True},  # nothing grew
                 {"base_tokens": 100, "tokens": 150, "freeze_base": False},  # nothing was frozen
                 {"base_tokens": True, "tokens": 150, "freeze_base": True}):  # no count: not ours to read
        said = ignored_by_base_checkpoint(Path("r/model_step8.pth"), ours(8, plan))
        assert "only its weights are used" in said and "vocabulary plan" not in said, plan
    assert ignored_by_base_checkpoint(Path("gpt.pth"), {"w": 1}) is None
