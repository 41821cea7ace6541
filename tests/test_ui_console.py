"""After a kill and a resume, TensorBoard and the loss history hold exactly what an uninterrupted run logs."""

from __future__ import annotations

import contextlib
import os
import signal
import sys
from pathlib import Path

import pytest
from helpers import start
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from indextts_train.checkpoint.files import load_checkpoint

pytestmark = pytest.mark.slow  # every test here trains a tiny run or starts the CLI: seconds each


def args(data: dict, out: Path) -> list[str]:
    # Logs every 3 steps, saves every 4: a checkpoint falls inside a log window, so a resume has to
    # carry the steps already in the window to average the next logged loss over the same steps.
    return [sys.executable, "-m", "indextts_train", "train", "--train-manifest", str(data["train"]),
            "--val-manifest", str(data["val"]), "--config", str(data["config"]), "--base-checkpoint",
            str(data["base"]), "--output-dir", str(out), "--resume", "auto", "--batch-size", "2",
            "--grad-accumulation", "2", "--effective-batch-size", "4", "--num-workers", "0", "--max-steps", "15",
            "--epochs", "100", "--seed", "3", "--log-interval", "3", "--save-interval", "4", "--val-interval", "6"]


def run(command: list[str], env: dict | None = None) -> tuple[int, str]:
    proc = start(command, env=env)
    code = proc.wait(timeout=300)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    return code, proc.stdout.read()


def scalars(out: Path) -> dict[str, list[tuple[int, float]]]:
    """What TensorBoard shows: every scalar series of the run's one folder, events past a restart's
    purge step dropped as TensorBoard drops them. samples_per_s is wall-clock, so it cannot repeat."""
    folders = [p for p in (out / "logs").iterdir() if p.is_dir()]
    assert len(folders) == 1, f"one TensorBoard run expected, found {sorted(p.name for p in folders)}"
    events = EventAccumulator(str(folders[0]), size_guidance={"scalars": 0})
    events.Reload()
    return {tag: [(e.step, e.value) for e in events.Scalars(tag)]
            for tag in events.Tags()["scalars"] if tag != "train/samples_per_s"}


def test_kill_and_resume_log_exactly_what_an_uninterrupted_run_logs(tiny_data, tmp_path) -> None:
    whole = tmp_path / "whole"
    code, output = run(args(tiny_data, whole))
    assert code == 0, output

    out = tmp_path / "killed"
    # Killed while writing the step-12 checkpoint: steps 9..12 were logged (and flushed for the save)
    # after the last complete checkpoint (step 8), so the resumed run must hide them and log them again.
    code, output = run(args(tiny_data, out), env={"INDEXTTS_TRAIN_CRASH_AT": "save_tmp_written@12"})
    assert code == -signal.SIGKILL, output
    assert max(step for step, _ in scalars(out)["train/loss"]) == 12  # the orphaned events are on disk
    code, output = run(args(tiny_data, out))
    assert code == 0 and "resuming from" in output and "starting at step 8" in output, output

    want, got = scalars(whole), scalars(out)
    assert set(got) == set(want) and "train/loss" in want and "val/loss" in want
    for tag, series in want.items():
        assert got[tag] == series, tag  # same steps, same float32 values, bit for bit
    assert [step for step, _ in want["train/loss"]] == [3, 6, 9, 12, 15]
    history, whole_history = load_checkpoint(out / "latest.pth")["history"], load_checkpoint(
        whole / "latest.pth")["history"]
    assert history["train"] == whole_history["train"] and history["val"] == whole_history["val"]
