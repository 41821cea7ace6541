"""What a run says about itself agrees with what it did: the lines and events a start and a resume print,
read against the checkpoints' own contents and the files on disk (tiny config, in-process runs)."""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path

import pytest
import torch

from indextts_train.checkpoint.files import load_checkpoint
from indextts_train.files import faults
from indextts_train.train import loop as loop_mod
from indextts_train.train.guard import EXIT_DIVERGED
from indextts_train.train.loop import RunSettings, resolve_settings, train
from indextts_train.ui.events import last_start, read_events

pytestmark = pytest.mark.slow  # every test here trains a tiny run: seconds each


def options(data: dict, out: Path, **overrides) -> RunSettings:
    values = dict(train_manifests=[data["train"]], val_manifests=[data["val"]], output_dir=out,
                  config=data["config"], base_checkpoint=data["base"], batch_size=2, grad_accumulation=2,
                  effective_batch_size=4, num_workers=0, max_steps=4, epochs=100, learning_rate=3e-3,
                  warmup_steps=2, log_interval=1, val_interval=2, save_interval=2, tensorboard=False,
                  resume="auto")
    values.update(overrides)
    return resolve_settings(**values)


def texts(out: Path, kind: str | None = None) -> list[str]:
    """The lines of the last start in the run's events.jsonl (of one kind)."""
    return [e["text"] for e in last_start(read_events(out)) if kind is None or e["kind"] == kind]


def test_an_epoch_after_a_resume_at_another_batch_is_the_samples_it_trains(tiny_data, tmp_path) -> None:
    """24 samples cut into steps of 4; resumed at an effective batch of 5, an epoch trains 4 steps = 20 samples
    (the tail short of a step is dropped), so the run says 20, not the order's 24."""
    out = tmp_path / "run"
    assert train(options(tiny_data, out, max_steps=4)) == 0
    assert train(options(tiny_data, out, batch_size=1, grad_accumulation=5, effective_batch_size=5,
                         max_steps=14, save_interval=1, keep_checkpoints=20)) == 0
    seen = [load_checkpoint(path)["progress"] for path in sorted(out.glob("model_step*.pth"))]
    assert max(p["samples_in_epoch"] for p in seen) == 20  # the truth: no epoch went past 20 samples
    begin = texts(out, "begin")
    assert len(begin) == 1 and "20 samples an epoch" in begin[0], begin
    order = next(t for t in texts(out) if t.startswith("epoch: "))
    assert "20 of them train an epoch (4 steps)" in order, order


def test_best_pth_named_again_on_a_rollback_or_another_folder_says_why(tiny_data, tmp_path) -> None:
    """A rollback to a checkpoint that was the best at its step, and a --resume of another folder's file, point
    best.pth at the file resumed from; nothing was interrupted, and another folder's file is named in full."""
    out = tmp_path / "run"
    assert train(options(tiny_data, out, max_steps=4, keep_checkpoints=5)) == 0
    assert load_checkpoint(out / "best.pth")["progress"]["step"] == 4  # the branch's best is past step 2
    assert load_checkpoint(out / "model_step2.pth")["history"]["best"]["step"] == 2
    assert train(options(tiny_data, out, max_steps=3, resume=str(out / "model_step2.pth"))) == 0
    said = [t for t in texts(out) if "best.pth now" in t]
    assert len(said) == 1 and "interrupted" not in said[0] and "model_step2.pth" in said[0], said
    other = tmp_path / "other"
    assert train(options(tiny_data, other, max_steps=3, resume=str(out / "model_step2.pth"))) == 0
    said = [t for t in texts(other) if "best.pth now" in t]
    assert len(said) == 1 and "interrupted" not in said[0] and str(out / "model_step2.pth") in said[0], said
    assert not (other / "model_step2.pth").exists()  # so naming it without its folder would name no file


def test_a_resume_on_other_validation_lines_says_its_losses_do_not_compare(tiny_data, tmp_path) -> None:
    """The checkpoint's validations (and the base model's, and best.pth's loss) were of 8 lines; a resume
    validating 4 prints losses of other lines next to them, and says so."""
    out = tmp_path / "run"
    assert train(options(tiny_data, out, max_steps=2)) == 0
    folder = Path(tiny_data["val"]).parent
    lines = [json.loads(line) for line in Path(tiny_data["val"]).read_text().splitlines()[:4]]
    for line in lines:
        line.update({k: str(folder / v) for k, v in line.items() if k.endswith("_path")})
    fewer = tmp_path / "val4.jsonl"
    fewer.write_text("".join(json.dumps(line) + "\n" for line in lines))
    assert load_checkpoint(out / "latest.pth")["history"]["last_val"]["total"]["samples"] == 8
    assert train(options(tiny_data, out, max_steps=4, val_manifests=[fewer])) == 0
    assert load_checkpoint(out / "latest.pth")["history"]["last_val"]["total"]["samples"] == 4
    warned = [t for t in texts(out, "warning") if "validation data changed" in t]
    assert len(warned) == 1 and "8 lines then, 4 now" in warned[0], texts(out, "warning")
    assert train(options(tiny_data, out, max_steps=6, val_manifests=[fewer])) == 0  # the same lines again
    assert not [t for t in texts(out, "warning") if "validation data changed" in t]


def test_done_counts_the_epochs_trained_not_the_one_begun(tiny_data, tmp_path) -> None:
    """24 samples at 4 a step: 4 steps are 16 samples of the first epoch (not "1 epoch"), 6 steps are one epoch."""
    out = tmp_path / "run"
    assert train(options(tiny_data, out, max_steps=4)) == 0
    progress = load_checkpoint(out / "latest.pth")["progress"]
    assert (progress["epoch"], progress["samples_in_epoch"]) == (0, 16)
    done = texts(out, "done")
    assert len(done) == 1, done
    assert done[0].startswith("done: 4 steps, 0 epoch(s) and 16 of the next one's 24 samples, "), done
    assert train(options(tiny_data, out, max_steps=6)) == 0
    progress = load_checkpoint(out / "latest.pth")["progress"]
    assert (progress["epoch"], progress["samples_in_epoch"]) == (0, 24)
    assert texts(out, "done")[0].startswith("done: 6 steps, 1 epoch(s), best.pth"), texts(out, "done")


def test_a_divergence_that_saved_a_best_among_its_steps_does_not_say_none_was_saved(tiny_data, tmp_path,
                                                                                   monkeypatch) -> None:
    """Steps 5-7 are not finite; the validation at step 6 (the weights of step 4) is a new best, so step 6 is
    saved: the stop line names that file, and must not say the steps were not saved."""
    monkeypatch.setattr(faults, "_NAN_STEPS", {5, 6, 7})
    out = tmp_path / "run"
    code = train(options(tiny_data, out, max_steps=20, save_interval=2, val_interval=3, max_bad_steps=3,
                         keep_checkpoints=1))
    assert code == EXIT_DIVERGED
    saved = load_checkpoint(out / "model_step6.pth")["progress"]
    assert saved["step"] == 6 and saved["bad_streak_start"] == 5  # the truth: a step of the streak is on disk
    said = texts(out, "diverged")
    assert len(said) == 1 and "(5-7)" in said[0] and "model_step6.pth (step 6)" in said[0], said
    assert "were not saved" not in said[0] and "holds the weights of step 4" in said[0], said


def test_a_resume_with_another_min_lr_ratio_trains_its_first_step_at_the_lr_its_line_says(tiny_data, tmp_path,
                                                                                          monkeypatch) -> None:
    """Stopped at step 4 of 8, resumed with --min-lr-ratio 0.5 (the only change): step 5's line and history say
    the new schedule's LR, and AdamW must take that one (it took the old schedule's, loaded with the groups)."""
    out = tmp_path / "run"

    def stop_at_4(name: str, step: int) -> None:
        if name == "step_logged" and step == 4:
            os.kill(os.getpid(), signal.SIGINT)

    monkeypatch.setattr(loop_mod, "crash_point", stop_at_4)
    assert train(options(tiny_data, out, max_steps=8, warmup_steps=2)) == 130
    monkeypatch.undo()
    used: list[float] = []
    step = torch.optim.AdamW.step

    def recording(self, *args, **kwargs):
        used.append(self.param_groups[0]["lr"])
        return step(self, *args, **kwargs)

    monkeypatch.setattr(torch.optim.AdamW, "step", recording)
    assert train(options(tiny_data, out, max_steps=8, warmup_steps=2, min_lr_ratio=0.5)) == 0
    said = {row[0]: row[-1] for row in load_checkpoint(out / "latest.pth")["history"]["train"]}
    assert [said[s] for s in range(5, 9)] == used, (said, used)
    assert any("min_lr_ratio: 0.0 -> 0.5" in t for t in texts(out, "notice"))


def test_a_resume_with_another_adam_eps_trains_with_the_one_it_says_changed(tiny_data, tmp_path) -> None:
    """"adam_eps: 1e-08 -> 1e-06" is said and stored in the checkpoint's hparams: AdamW must take it (the groups
    loaded from the checkpoint kept 1e-08)."""
    out = tmp_path / "run"
    assert train(options(tiny_data, out, max_steps=4)) == 0
    assert train(options(tiny_data, out, max_steps=6, adam_eps=1e-6)) == 0
    assert any("adam_eps: 1e-08 -> 1e-06" in t for t in texts(out, "notice"))
    state = load_checkpoint(out / "latest.pth")
    assert state["hparams"]["adam_eps"] == 1e-6
    assert [group["eps"] for group in state["optimizer"]["param_groups"]] == [1e-6, 1e-6]
