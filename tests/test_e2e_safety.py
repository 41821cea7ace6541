"""Nothing is ever lost, the self-contained parts: the run lock, the output-dir preflight,
metrics that cannot end a run, bad input lines and settings, the data fingerprint, and checkpoints
with NaN weights. The whole-run cases (kills, signals, divergence, disk full) are in
test_e2e_nothing_lost.py.
"""

from __future__ import annotations

import errno
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from helpers import FaultyFolder
from typer.testing import CliRunner

from indextts_train.checkpoint.files import load_checkpoint
from indextts_train.checkpoint.verify import verify_checkpoint
from indextts_train.cli import app
from indextts_train.data.fingerprint import data_fingerprint, describe_data_change
from indextts_train.data.manifest import ManifestIndex
from indextts_train.errors import UserError
from indextts_train.train.runlock import LOCK_NAME, RunLock, holder_pid, preflight_output_dir
from indextts_train.ui.metrics import SafeWriter

ROOT = Path(__file__).resolve().parents[1]
TINY_CONFIG = ROOT / "configs" / "tiny.yaml"


def python(code: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True, cwd=ROOT,
                            env={**os.environ, "PYTHONUNBUFFERED": "1"}, start_new_session=True)


# ----------------------------------------------------------------------------- the run lock


HOLD = """
import os, time
from indextts_train.train.runlock import RunLock
RunLock({out!r}).acquire()
if {fork}:
    ready, told = os.pipe()
    if os.fork() == 0:  # a child like a data-loader worker, left behind when the parent is killed
        os.write(told, b"x")  # its fork hooks have run (as before a worker's first instruction)
        time.sleep(60)
        os._exit(0)
    os.read(ready, 1)
print("held", flush=True)
time.sleep(60)
"""


@pytest.mark.slow  # starts the lock's holder in a process
def test_lock_names_the_holder_and_dies_with_it(tmp_path) -> None:
    assert holder_pid(tmp_path) is None  # no lock file yet, and holder_pid creates none
    assert not (tmp_path / LOCK_NAME).exists()
    holder = python(HOLD.format(out=str(tmp_path), fork=True))
    try:
        assert holder.stdout.readline().strip() == "held"
        assert holder_pid(tmp_path) == holder.pid
        assert holder_pid(tmp_path) == holder.pid  # probing does not disturb the holder
        with pytest.raises(UserError, match=rf"is in use by another training run \(PID {holder.pid}, started "):
            RunLock(tmp_path).acquire()
        holder.kill()  # SIGKILL: no cleanup runs; its forked child is still alive
        holder.wait()
        assert holder_pid(tmp_path) is None
        with RunLock(tmp_path):
            assert holder_pid(tmp_path) == os.getpid()
        assert holder_pid(tmp_path) is None
    finally:
        os.killpg(holder.pid, signal.SIGKILL)


# ----------------------------------------------------------------------------- preflight


def test_preflight_refuses_a_file_or_a_path_under_a_file(tmp_path) -> None:
    (tmp_path / "file").write_text("user data")
    with pytest.raises(UserError, match=r"is a file, not a folder"):
        preflight_output_dir(tmp_path / "file")
    with pytest.raises(UserError, match=rf"{tmp_path / 'file'} is a file, so no folder can be made under it"):
        preflight_output_dir(tmp_path / "file" / "run" / "am")
    assert (tmp_path / "file").read_text() == "user data"
    made = preflight_output_dir(tmp_path / "new" / "run")
    assert made.is_dir() and list(made.iterdir()) == []  # the write probe leaves nothing behind


@pytest.mark.parametrize("target", ["ro", "ro/missing/run"])
def test_preflight_refuses_a_read_only_folder(tmp_path, monkeypatch, target) -> None:
    (tmp_path / "ro").mkdir()
    FaultyFolder(tmp_path / "ro", read_only=True).install(monkeypatch)  # a read-only file system, even for root
    with pytest.raises(UserError) as refused:
        preflight_output_dir(tmp_path / target)
    wanted = "cannot write there" if target == "ro" else "cannot create the folder"
    assert str(refused.value).startswith(f"--output-dir {tmp_path / target}: {wanted} (Read-only file system)")
    assert list((tmp_path / "ro").iterdir()) == []


# ----------------------------------------------------------------------------- metrics


class FullDiskWriter:
    def __init__(self) -> None:
        self.calls = 0

    def add_scalar(self, tag: str, value: float, step: int) -> None:
        self.calls += 1
        if self.calls > 2:
            raise OSError(errno.ENOSPC, "No space left on device")

    def flush(self) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    def close(self) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")


def test_metrics_failure_is_one_warning_then_silence() -> None:
    warnings: list[str] = []
    inner = FullDiskWriter()
    writer = SafeWriter(lambda: inner, warnings.append, "runs/x/logs")
    for step in range(5):
        writer.add_scalar("train/loss", 1.0, step)
    writer.flush()
    writer.close()
    assert inner.calls == 3 and writer.failed
    assert warnings == ["TensorBoard logging stopped: could not write to runs/x/logs (no space left on device); "
                        "training goes on and checkpoints are still saved"]
    refused: list[str] = []
    SafeWriter(lambda: (_ for _ in ()).throw(PermissionError(errno.EACCES, "Permission denied")),
               refused.append, "logs").add_scalar("a", 1.0, 0)
    assert len(refused) == 1 and "could not open logs (permission denied)" in refused[0]


# ----------------------------------------------------------------------------- settings and input lines


def train_args(tiny_data, out: Path, *extra: str) -> list[str]:
    return ["train", "--train-manifest", str(tiny_data["train"]), "--config", str(TINY_CONFIG),
            "--output-dir", str(out), "--max-steps", "2", *extra]


def test_nonsense_setting_is_refused_before_any_work(tiny_data, tmp_path) -> None:
    result = CliRunner().invoke(app, [*train_args(tiny_data, tmp_path / "r"), "--grad-clip", "-1"])
    assert result.exit_code == 2
    assert result.stderr == "error: train.grad_clip (--grad-clip) must be > 0, got -1.0\n"
    assert not (tmp_path / "r").exists()  # no output dir made, no lock taken


@pytest.mark.parametrize(("flag", "value", "message"), [
    ("--learning-rate", "nan", "must be a finite number, got nan"),
    ("--learning-rate", "inf", "must be a finite number, got inf"),
    ("--learning-rate", "0", "must be > 0, got 0.0"),
    ("--weight-decay", "-0.1", "must be >= 0, got -0.1"),
    ("--grad-clip", "inf", "must be a finite number, got inf"),
    ("--dropout", "1", "must be in [0, 1), got 1.0"),
    ("--max-bad-steps", "0", "must be > 0, got 0"),
    ("--warmup-steps", "-1", "must be >= 0, got -1"),
    ("--epochs", "0", "must be > 0, got 0"),
    ("--max-steps", "-5", "must be >= 0, got -5"),
    ("--text-loss-weight", "-1", "must be >= 0, got -1.0"),
    ("--mel-loss-weight", "nan", "must be a finite number, got nan"),
    ("--log-interval", "0", "must be > 0, got 0"),
    ("--save-interval", "-2", "must be > 0, got -2"),
    ("--keep-checkpoints", "0", "must be > 0, got 0"),
    ("--seed", "-1", "must be >= 0, got -1"),
    ("--effective-batch-size", "0", "must be > 0, got 0"),
    ("--num-workers", "-1", "must be >= 0, got -1"),
])
def test_every_numeric_flag_is_range_checked(tiny_data, tmp_path, flag, value, message) -> None:
    result = CliRunner().invoke(app, train_args(tiny_data, tmp_path / "r", flag, value))
    assert result.exit_code == 2, result.output
    key = flag[2:].replace("-", "_")
    assert result.output.strip().splitlines() == [f"error: train.{key} ({flag}) {message}"]


def test_both_loss_weights_zero_and_yaml_types_are_refused(tiny_data, tmp_path) -> None:
    result = CliRunner().invoke(app, train_args(tiny_data, tmp_path / "r", "--text-loss-weight", "0",
                                                "--mel-loss-weight", "0"))
    assert result.exit_code == 2 and "both 0: nothing would be learned" in result.output, result.output
    config = tmp_path / "c.yaml"
    config.write_text(TINY_CONFIG.read_text().replace("epochs: 20", "epochs: twenty"))
    result = CliRunner().invoke(app, ["train", "--train-manifest", str(tiny_data["train"]), "--config",
                                      str(config), "--output-dir", str(tmp_path / "r")])
    assert result.exit_code == 2
    assert result.output == f"error: {config}: train.epochs: expected int, got 'twenty'\n"


def test_check_data_cli_refuses_nan_features_and_empty_manifests(tiny_data, tmp_path) -> None:
    folder = tmp_path / "data"
    shutil.copytree(tiny_data["folder"], folder)
    cond = np.load(folder / "train3_cond.npy")
    cond[0, 0] = np.inf
    np.save(folder / "train3_cond.npy", cond)
    result = CliRunner().invoke(app, ["check-data", str(folder / "train.jsonl"), "--config", str(TINY_CONFIG)])
    assert result.exit_code == 2
    assert f"{folder / 'train.jsonl'}:4: condition {folder / 'train3_cond.npy'} holds NaN or Inf" \
        in result.output, result.output
    (folder / "empty.jsonl").write_text("")
    result = CliRunner().invoke(app, ["check-data", str(folder / "empty.jsonl")])
    assert result.exit_code == 2
    assert result.output == f"error: {folder / 'empty.jsonl'}: manifest is empty: it holds no line " \
                            "(pass a manifest with at least one line)\n"


# ----------------------------------------------------------------------------- data fingerprint


def test_fingerprint_says_what_changed(tiny_data, tmp_path) -> None:
    folder = tmp_path / "data"
    shutil.copytree(tiny_data["folder"], folder)
    manifest = folder / "train.jsonl"
    lines = manifest.read_text().splitlines(keepends=True)
    before = data_fingerprint(ManifestIndex.build([manifest]))
    assert describe_data_change(before, data_fingerprint(ManifestIndex.build([manifest]))) == ([], [])
    moved = folder / "moved.jsonl"
    shutil.copy(manifest, moved)
    assert describe_data_change(before, data_fingerprint(ManifestIndex.build([moved]))) == (
        [], [f"{manifest} moved to {moved} (same lines)"])
    manifest.write_text("".join(lines + lines[:3]))
    assert describe_data_change(before, data_fingerprint(ManifestIndex.build([manifest])))[0] == [
        f"{manifest}: 24 -> 27 usable lines (added)"]
    manifest.write_text("".join(lines[1:]))
    assert describe_data_change(before, data_fingerprint(ManifestIndex.build([manifest])))[0] == [
        f"{manifest}: 24 -> 23 usable lines (removed)"]
    manifest.write_text("".join([lines[1], lines[0], *lines[2:]]))
    assert describe_data_change(before, data_fingerprint(ManifestIndex.build([manifest])))[0] == [
        f"{manifest}: the same 24 lines count, but lines were edited, reordered or replaced"]


# ----------------------------------------------------------------------------- non-finite checkpoints


@pytest.mark.slow  # trains a tiny run
def test_nan_weights_verify_incomplete_and_export_refuses(tiny_data, tmp_path) -> None:
    from indextts_train.train.loop import resolve_settings, train

    out = tmp_path / "run"
    assert train(resolve_settings(train_manifests=[tiny_data["train"]], output_dir=out, config=TINY_CONFIG,
                              base_checkpoint=tiny_data["base"], batch_size=2, grad_accumulation=2,
                              effective_batch_size=4, num_workers=0, max_steps=2, tensorboard=False)) == 0
    state = load_checkpoint(out / "latest.pth")
    for where in ("model", "optimizer"):
        broken = load_checkpoint(out / "latest.pth")
        if where == "model":
            broken["model"]["final_norm.weight"][3] = float("nan")
        else:
            broken["optimizer"]["state"][0]["exp_avg_sq"].view(-1)[0] = float("inf")
        path = tmp_path / f"{where}.pth"
        torch.save(broken, path)
        verdict = verify_checkpoint(path)
        assert verdict.status == "INCOMPLETE" and "holds NaN or Inf values" in verdict.reasons[0], verdict
        result = CliRunner().invoke(app, ["export", str(path), "-o", str(tmp_path / "gpt.pth")])
        assert result.exit_code == 2 and "holds NaN or Inf values" in result.output
        assert not (tmp_path / "gpt.pth").exists()
    assert verify_checkpoint(out / "latest.pth").status == "COMPLETE"
    assert state["progress"]["step"] == 2


@pytest.mark.slow  # the real CLI in a process
def test_a_killed_tee_does_not_end_the_run(tiny_data, tmp_path) -> None:
    """`train-gpt ... | tee`: the reader goes away after the first line; the run must still train to the
    end, save and exit 0 (not 120 from a failed flush at exit, not EPIPE at the next print)."""
    out = tmp_path / "run"
    proc = subprocess.Popen(
        [sys.executable, "-m", "indextts_train", "train", "--train-manifest", str(tiny_data["train"]),
         "--config", str(tiny_data["config"]), "--base-checkpoint", str(tiny_data["base"]), "--output-dir",
         str(out), "--batch-size", "2", "--effective-batch-size", "4", "--max-steps", "6", "--log-interval", "1",
         "--num-workers", "0"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, cwd=ROOT, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    assert proc.stdout.readline()  # the reader saw the run start ...
    proc.stdout.close()  # ... and died: every later write to the pipe fails with EPIPE
    assert proc.wait(timeout=300) == 0
    assert load_checkpoint(out / "latest.pth")["progress"]["step"] == 6
