"""`export` stopped by Ctrl+C while it writes its publishing marker (inside the marker's own atomic write, once
renamed): the temp files are removed, and so must be the marker, or a marker whose temp files are gone says
its files were published, and the next export replaces the user's files without --force."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from helpers import tree_state
from test_checkpoint_files import make_state
from typer.testing import CliRunner

from indextts_train.checkpoint.files import save_checkpoint
from indextts_train.cli import app
from indextts_train.files import atomic

pytestmark = pytest.mark.slow  # a checkpoint trained in setup: over 3 s on a loaded machine


def _ctrl_c_once_the_marker_is_renamed(monkeypatch, out: Path) -> None:
    real = atomic.fsync_dir

    def fsync_dir(directory: Path) -> None:  # atomic_write's: the marker is under its name by now
        if (out / ".gpt.pth.publishing").is_file() and json.loads((out / ".gpt.pth.publishing").read_text())[
                "pid"] != 999999:
            monkeypatch.setattr(atomic, "fsync_dir", real)
            raise KeyboardInterrupt
        real(directory)

    monkeypatch.setattr(atomic, "fsync_dir", fsync_dir)


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory) -> Path:
    return save_checkpoint(make_state(2), tmp_path_factory.mktemp("run"), 2, keep=3)


def test_ctrl_c_while_the_marker_is_written_leaves_the_users_files_guarded(checkpoint, tmp_path, monkeypatch):
    out = tmp_path / "out"
    out.mkdir()
    # files of the kinds these flags write (an earlier export's), which --force may replace
    torch.save({"the user's": torch.zeros(1)}, out / "gpt.pth")
    (out / "config.yaml").write_text("gpt: {the user's: config.yaml}\n")
    before = tree_state(out)
    command = ["export", str(checkpoint), "-o", str(out / "gpt.pth"), "--config-out", str(out / "config.yaml")]
    _ctrl_c_once_the_marker_is_renamed(monkeypatch, out)
    stopped = CliRunner().invoke(app, [*command, "--force"])
    assert stopped.exit_code == 130, stopped.output
    assert tree_state(out) == before  # no temp file, no marker: nothing of the stopped export
    unforced = CliRunner().invoke(app, command)  # another command, without --force: the user's files stay
    assert unforced.exit_code == 2 and "already exists; pass --force" in unforced.stderr
    assert tree_state(out) == before


def test_ctrl_c_while_the_marker_is_written_puts_a_killed_exports_marker_back(checkpoint, tmp_path, monkeypatch):
    """Over an export killed among its renames: its marker, replaced by this one's, is back as it was."""
    out = tmp_path / "out"
    out.mkdir()
    gpt, config = out / "gpt.pth", out / "config.yaml"
    gpt.write_bytes(b"the killed export's gpt.pth")
    config.write_text("gpt: {the user's: config.yaml}\n")  # a YAML config: what --force may replace there
    (out / ".config.yaml.tmp-999999").write_text("the killed export's config.yaml\n")
    (out / ".gpt.pth.publishing").write_text(json.dumps({"pid": 999999, "files": [str(gpt), str(config)]}))
    before = tree_state(out)
    _ctrl_c_once_the_marker_is_renamed(monkeypatch, out)
    stopped = CliRunner().invoke(app, ["export", str(checkpoint), "-o", str(gpt), "--config-out", str(config),
                                        "--force"])
    assert stopped.exit_code == 130, stopped.output
    assert tree_state(out) == before
