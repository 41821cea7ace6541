"""state.py: the checkpoint format's owner. A format-1 file written by main before format 2 (the
fixture in tests/data/fixtures) still verifies, resumes and exports through the migration chain;
the components round-trip; validation names what is wrong.
"""

from __future__ import annotations

import gzip
import sys
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from indextts_train.checkpoint.files import load_checkpoint
from indextts_train.checkpoint.state import FORMAT_VERSION, History, Progress, migrate, nonfinite_problem, validate
from indextts_train.checkpoint.verify import verify_checkpoint
from indextts_train.cli import app
from indextts_train.errors import UserError
from indextts_train.train.loop import resolve_settings, train

FIXTURES = Path(__file__).resolve().parent / "data" / "fixtures"
sys.path.insert(0, str(FIXTURES))


@pytest.fixture()
def format1(tmp_path) -> Path:
    """The format-1 checkpoint (step 4 of a tiny run, written by main at 3b73139) as a run's latest.pth."""
    out = tmp_path / "run"
    out.mkdir()
    with gzip.open(FIXTURES / "format1_step4.pth.gz", "rb") as f:
        (out / "model_step4.pth").write_bytes(f.read())
    (out / "latest.pth").hardlink_to(out / "model_step4.pth")
    return out / "latest.pth"


def test_the_fixture_is_format_1_and_verifies_complete_through_the_migration(format1) -> None:
    raw = torch.load(format1, weights_only=True)
    assert raw["format_version"] == 1 and "best_val_step" not in raw["history"]
    verdict = verify_checkpoint(format1)
    assert verdict.status == "COMPLETE", verdict.reasons
    assert verdict.reasons == [f"format 1, read through the migration to format {FORMAT_VERSION}"]
    migrated = load_checkpoint(format1)
    assert migrated["format_version"] == FORMAT_VERSION
    history = migrated["history"]
    assert history["val"][0][0] == 4 and history["best_val_step"] == 4  # derived by the 1 -> 2 migration
    assert history["pending"] == []  # an added field: a file from before it has no steps since its last line


def test_format_1_run_resumes_and_saves_the_current_format(format1, tmp_path) -> None:
    from make_fixtures import CONFIG, write_dataset

    data = tmp_path / "data"
    train_manifest = write_dataset(data, 24, seed=1, name="train.jsonl")  # the fixture run's data
    code = train(resolve_settings(train_manifests=[train_manifest], output_dir=format1.parent, config=CONFIG,
                              resume="auto", max_steps=6, epochs=100, batch_size=2, grad_accumulation=2,
                              effective_batch_size=4, learning_rate=3e-3, warmup_steps=4, weight_decay=0.1,
                              seed=11, log_interval=1, tensorboard=False))
    assert code == 0
    state = load_checkpoint(format1.parent / "latest.pth")
    assert state["format_version"] == FORMAT_VERSION and state["progress"]["step"] == 6
    assert [row[0] for row in state["history"]["train"]][:4] == [1, 2, 3, 4]  # format-1 history carried on


def test_format_1_run_was_trained_full_and_refuses_another_scope(format1, tmp_path) -> None:
    """A file from before --train-scope records none: it was a full run, and resumes only as one."""
    from make_fixtures import CONFIG, write_dataset

    train_manifest = write_dataset(tmp_path / "data", 24, seed=1, name="train.jsonl")
    before = format1.read_bytes()
    with pytest.raises(UserError) as refused:
        train(resolve_settings(train_manifests=[train_manifest], output_dir=format1.parent, config=CONFIG,
                           resume="auto", max_steps=6, train_scope="lora", tensorboard=False))
    message = str(refused.value)
    assert "\n" not in message and "was trained with --train-scope full" in message and "asks for lora" in message
    assert format1.read_bytes() == before


def test_format_1_exports(format1, tmp_path) -> None:
    out = tmp_path / "gpt.pth"
    result = CliRunner().invoke(app, ["export", str(format1), "-o", str(out)])
    assert result.exit_code == 0, result.output
    exported = torch.load(out, weights_only=True)
    weights = load_checkpoint(format1)["model"]
    assert list(exported) == list(weights)
    assert all(torch.equal(exported[k], weights[k]) for k in weights)


def test_migration_1_to_2_derives_the_best_validation_step() -> None:
    state = {"format_version": 1, "history": {"train": [], "val": [[5, 2.0], [10, 1.5], [15, 1.7]],
                                              "best_val_loss": 1.5}}
    assert migrate(state)["history"]["best_val_step"] == 10 and state["format_version"] == FORMAT_VERSION


def test_a_newer_format_is_left_alone_and_refused() -> None:
    state = {"format_version": FORMAT_VERSION + 1}
    assert migrate(state)["format_version"] == FORMAT_VERSION + 1
    keys = ("format", "model", "optimizer", "optimizer_param_names", "scheduler", "scaler", "progress", "rng",
            "history", "hparams", "config", "vocab_plan")
    problems = validate({**dict.fromkeys(keys), **state})
    assert problems and "a newer file needs a newer indextts-train" in problems[0]


def test_components_round_trip_and_name_bad_fields() -> None:
    progress = Progress(step=3, epoch=1, samples_in_epoch=8, samples_total=20, sampler_seed=7, micro_batch=2,
                        grad_accumulation=2, world_size=1)
    again = Progress()
    again.load_state_dict(progress.state_dict())
    assert again == progress
    history = History()
    history.record_val(5, {"loss": 2.0, "text_loss": 1.0, "mel_loss": 2.2, "mel_top1": 0.1})
    history.record_val(10, {"loss": 2.5, "text_loss": 1.0, "mel_loss": 2.8, "mel_top1": 0.1})
    assert (history.best_val_loss, history.best_val_step) == (2.0, 5)
    assert Progress.problems({**progress.state_dict(), "step": -1}) == [
        "progress: step missing or not a non-negative int"]
    assert History.problems({**history.state_dict(), "best_val_step": "five"}) == [
        "history.best_val_step: expected int or None, got 'five'"]


def test_nonfinite_check_finds_nan_and_inf_but_not_a_large_finite_tensor() -> None:
    """The check sums each tensor first (one reduction); a sum that overflows must not be taken for
    a NaN, and a NaN or Inf anywhere, in weights or optimizer moments, must be found and named."""
    large = torch.full((8,), 3e38)  # every element finite, the sum is inf
    assert nonfinite_problem({"w": large}, {"state": {0: {"exp_avg": large}}}) is None
    for bad in (float("nan"), float("inf"), float("-inf")):
        weights = torch.zeros(4, 3)
        weights[2, 1] = bad
        assert "model['w']" in nonfinite_problem({"w": weights, "n": torch.zeros(2)}, {"state": {}})
        moments = torch.zeros(5)
        moments[4] = bad
        found = nonfinite_problem({"w": torch.zeros(2)}, {"state": {0: {"exp_avg_sq": moments}}})
        assert "optimizer.state[0]['exp_avg_sq']" in found
