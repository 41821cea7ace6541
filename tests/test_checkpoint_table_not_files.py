"""`indextts-train checkpoints RUN` lists an entry under a checkpoint's name that is no file (a FIFO, a folder, a
link to nothing) as such, and never opens it: a FIFO would block the reader."""

from __future__ import annotations

import builtins
import os
from pathlib import Path

import pytest
from test_checkpoint_files import make_state
from typer.testing import CliRunner

from indextts_train.checkpoint.files import save_checkpoint
from indextts_train.checkpoint.table import checkpoint_rows
from indextts_train.cli import app


def test_entries_that_are_no_files_are_listed_as_such_and_never_opened(tmp_path: Path,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    run = tmp_path / "run"
    save_checkpoint(make_state(2), run, 2, keep=3)
    os.mkfifo(run / "model_step5.pth")
    (run / "model_step6.pth").mkdir()
    (run / "model_step7.pth").symlink_to(tmp_path / "nowhere.pth")
    entries = [str(run / f"model_step{n}.pth") for n in (5, 6, 7)]
    opened: list[str] = []
    real_open, real_os_open = builtins.open, os.open

    def watched_open(file, *args, **kwargs):
        opened.append(os.fspath(file) if isinstance(file, (str, os.PathLike)) else "")
        return real_open(file, *args, **kwargs)

    def watched_os_open(path, *args, **kwargs):
        opened.append(os.fspath(path))
        return real_os_open(path, *args, **kwargs)

    monkeypatch.setattr(builtins, "open", watched_open)
    monkeypatch.setattr(os, "open", watched_os_open)
    rows = {row["file"]: row for row in checkpoint_rows(run)}
    monkeypatch.undo()
    assert not set(opened) & set(entries)
    assert set(rows) == {"model_step2.pth", "model_step5.pth", "model_step6.pth", "model_step7.pth"}
    for name, what in (("model_step5.pth", "a FIFO (named pipe)"), ("model_step6.pth", "a folder"),
                       ("model_step7.pth", f"a symbolic link to {tmp_path / 'nowhere.pth'}, which leads to no file")):
        row = rows[name]
        assert (row["status"], row["kind"], row["step"], row["born"]) == ("INCOMPLETE", "not a file", None, None)
        assert row["reason"] == f"not a file: {what}, so it was not read; a checkpoint is a regular file"
    assert rows["model_step2.pth"]["status"] == "COMPLETE"

    result = CliRunner().invoke(app, ["checkpoints", str(run)])
    assert result.exit_code == 0, result.output
    assert "not a file: a FIFO (named pipe), so it was not read" in result.stdout
    assert [line.split()[0] for line in result.stdout.splitlines() if line.startswith("model_step")] == [
        "model_step2.pth", "model_step5.pth", "model_step6.pth", "model_step7.pth"]


def test_a_linked_abandoned_folder_or_branch_is_not_followed(tmp_path: Path) -> None:
    """A rollback makes abandoned/<branch>/ as folders; a symbolic link standing for either led the listing
    (and the page's checkpoints panel) into another folder, naming its files."""
    run, elsewhere = tmp_path / "run", tmp_path / "elsewhere"
    save_checkpoint(make_state(2), run, 2, keep=3)
    save_checkpoint(make_state(4), elsewhere / "20260101-000000-abcdef", 4, keep=3)
    (run / "abandoned").symlink_to(elsewhere)
    assert [row["file"] for row in checkpoint_rows(run)] == ["model_step2.pth"]
    (run / "abandoned").unlink()
    (run / "abandoned").mkdir()
    (run / "abandoned" / "20260101-000000-abcdef").symlink_to(elsewhere / "20260101-000000-abcdef")
    assert [row["file"] for row in checkpoint_rows(run)] == ["model_step2.pth"]


def test_scores_false_leaves_the_listen_scores_unread(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    run = tmp_path / "run"
    save_checkpoint(make_state(2), run, 2, keep=3)
    read: list[Path] = []
    monkeypatch.setattr("indextts_train.checkpoint.table.read_records", lambda path: read.append(path) or [])
    assert [row["listen"] for row in checkpoint_rows(run, scores=False)] == [None]
    assert read == []
    checkpoint_rows(run)
    assert read == [run / "listen" / "scores.jsonl"]  # once, for every row
