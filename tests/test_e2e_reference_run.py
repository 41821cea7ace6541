"""A fixed-seed tiny run through the real CLI gives the numbers pinned in `tests/data/fixtures/`.

The kill/resume tests compare two runs of today's code with each other; this one compares today's
code with the numbers an earlier tree computed, so that a refactor that claims to change nothing is
held to it (every trained parameter, every optimizer slot, the param groups and the logged history,
with `torch.equal`). `make_fixtures.py` says when and how the reference may be remade.

The same torch build gives other bits on another kind of CPU, so each pin is exact for the machine kind
that made it (`make_fixtures.kernels`): a run must equal some pin bit for bit, and on a machine of a
pinned kind, that kind's pin. On a kind no pin names, bits cannot be judged: the run must then agree
with a pin to rounding (a changed data order, schedule or loss moves the numbers far beyond it).
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent / "data" / "fixtures"))

from make_fixtures import compare, kernels, load_gz, numbers, pins, run  # noqa: E402


@pytest.mark.slow
def test_the_reference_run_gives_the_pinned_numbers(tmp_path: Path) -> None:
    pinned = [(made_by, path, load_gz(path)) for made_by, path in pins()]
    assert all(want["model"] and want["optimizer"]["state"] for _, _, want in pinned), \
        "an empty reference would prove nothing"
    got = numbers(run(tmp_path, max_steps=12, save_interval=4))
    exact = {path.name: compare(got, want) for _, path, want in pinned}
    if any(not diffs for diffs in exact.values()):
        return  # bit for bit
    mine = [path.name for made_by, path, _ in pinned if made_by == kernels()]
    assert not mine, f"this machine's kind made {mine[0]}, and today's run differs from it in {exact[mine[0]][:5]}"
    apart = {path.name: compare(got, want, close=True) for _, path, want in pinned}
    assert any(not diffs for diffs in apart.values()), f"beyond rounding from every pin: {apart}"


def test_a_pin_of_another_machine_kind_is_matched_to_rounding_and_no_further() -> None:
    """The rounding rule itself: what two machine kinds give passes, a change of the numbers does not."""
    first, *others = [load_gz(path) for _, path in pins()]
    assert others, "one pin alone: the rule below would be tested on nothing"
    for other in others:
        assert compare(other, first) and not compare(other, first, close=True)
    moved = {**first, "model": dict(first["model"])}
    name = "gpt.h.0.attn.c_attn.weight"
    moved["model"][name] = first["model"][name] * (1 + 1e-3) + 1e-4  # what one step at another rate moves
    assert compare(moved, first, close=True) == [f"model.{name}"]
    history = {**first["history"], "val": [[s, loss * (1 + 1e-4), *rest] for s, loss, *rest in first["history"]["val"]]}
    assert compare({**first, "history": history}, first, close=True) == ["history.val"]
