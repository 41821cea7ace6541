"""One error boundary per command: what a careless or hostile user can feed each command gives one
`error:` line (or the command's own one-line verdict), the documented exit code, no traceback, and
leaves no file behind. The crafted checkpoint of issue 23 (a list nested 40 deep whose elements are
shared references) is refused at once by every command that reads checkpoints.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from indextts_train.cli import app
from indextts_train.webui import records
from indextts_train.webui.page import PageServer

ROOT = Path(__file__).resolve().parents[1]
TINY_CONFIG = ROOT / "configs" / "tiny.yaml"
NOT_OURS = "not a checkpoint this program wrote"


def crafted(path: Path, depth: int = 40) -> Path:
    """A few hundred bytes whose naive walk visits 2^depth nodes."""
    nested: list = []
    for _ in range(depth):
        nested = [nested, nested]
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save({"format": "indextts-train", "model": {"w": torch.zeros(2)}, "history": {"train": nested}}, path)
    return path


def files_under(folder: Path) -> set[str]:
    return {str(p.relative_to(folder)) for p in folder.rglob("*") if p.is_file()}


def reader_commands(bad: Path, run: Path, manifest: Path, out: Path) -> dict[str, tuple[list[str], int]]:
    """Every command that reads a checkpoint, pointed at the crafted file: (argv, exit code)."""
    train = ["train", "--train-manifest", str(manifest), "--config", str(TINY_CONFIG), "--max-steps", "1"]
    return {
        "verify": (["verify", str(bad)], 2),
        "checkpoints": (["checkpoints", str(run)], 0),  # a table: the file's row says INCOMPLETE and why
        "repair": (["repair", str(bad), "-o", str(out / "repaired.pth")], 2),
        "export": (["export", str(bad), "-o", str(out / "gpt.pth")], 2),
        "evaluate": (["evaluate", "--checkpoint", str(bad), "--manifest", str(manifest)], 2),
        "resume path": ([*train, "--output-dir", str(out / "run"), "--resume", str(bad)], 2),
        "resume auto": ([*train, "--output-dir", str(run), "--resume", "auto"], 2),
    }


@pytest.fixture()
def crafted_run(tmp_path: Path, tiny_data) -> dict:
    bad = crafted(tmp_path / "bad.pth")
    run = tmp_path / "run"
    crafted(run / "model_step1.pth")
    out = tmp_path / "out"
    out.mkdir()
    return {"commands": reader_commands(bad, run, tiny_data["train"], out), "tmp": tmp_path}


@pytest.mark.slow
def test_every_reader_command_refuses_the_crafted_checkpoint_at_once(crafted_run) -> None:
    before = files_under(crafted_run["tmp"])
    for name, (argv, code) in crafted_run["commands"].items():
        started = time.monotonic()
        done = subprocess.run([sys.executable, "-m", "indextts_train", *argv], capture_output=True, text=True,
                              cwd=ROOT, timeout=120, env={**os.environ, "PYTHONUNBUFFERED": "1"})
        assert done.returncode == code, (name, done.stdout[-500:], done.stderr[-500:])
        assert NOT_OURS in done.stdout + done.stderr and "Traceback" not in done.stderr, name
        assert time.monotonic() - started < 60, name  # interpreter and torch start included
    # the run lock is the only file a refused command may leave (it is how the trainer holds a folder)
    assert {f for f in files_under(crafted_run["tmp"]) - before if not f.endswith("train.lock")} == set()


def test_reader_commands_in_process_take_well_under_a_second(crafted_run) -> None:
    for name, (argv, code) in crafted_run["commands"].items():
        if name.startswith("resume"):
            continue  # setup (data, model) dominates; the subprocess test covers them
        started = time.perf_counter()
        result = CliRunner().invoke(app, argv)
        elapsed = time.perf_counter() - started
        assert result.exit_code == code and NOT_OURS in result.output, (name, result.output)
        assert elapsed < 1.0, (name, elapsed)


def test_the_page_run_table_refuses_the_crafted_file_and_other_requests_still_answer(tmp_path: Path,
                                                                                    monkeypatch) -> None:
    run = tmp_path / "run"
    crafted(run / "model_step1.pth")
    started = time.perf_counter()
    rows = records.checkpoint_rows(run, [])
    assert time.perf_counter() - started < 1.0
    assert rows[0]["status"] == "INCOMPLETE" and NOT_OURS in rows[0]["reasons"]
    # A slow read (a big file on a slow disk) holds only its own request: the table keeps no lock
    # that the log and status requests need.
    reading, release = threading.Event(), threading.Event()

    def slow_verdict(path: str, mtime_ns: int, size: int) -> dict:
        reading.set()
        release.wait(10)
        return {"status": "INCOMPLETE", "reasons": [], "summary": {}}

    monkeypatch.setattr(records, "_verdict", slow_verdict)
    crafted(run / "model_step2.pth", depth=3)
    table = threading.Thread(target=records.checkpoint_rows, args=(run, []))
    table.start()
    assert reading.wait(10)
    try:
        started = time.perf_counter()
        status = PageServer().watch(str(run))
        assert time.perf_counter() - started < 1.0 and status[0]
    finally:
        release.set()
        table.join(10)
