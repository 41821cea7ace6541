"""`repair` killed in place and rerun: the rerun ends as an uninterrupted repair does, with the original
kept once as PATH.bak, and nothing of the killed repair left (its half-written temp file is a checkpoint's
size). A PATH.bak the repair did not make, even a link to nothing, is never written."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch
from helpers import community_state

from indextts_train.checkpoint.repair import repair_checkpoint
from indextts_train.checkpoint.verify import verify_checkpoint

pytestmark = pytest.mark.slow  # trains a tiny model for the community file: over 3 s on a loaded machine


@pytest.fixture
def community(tmp_path) -> Path:
    path = tmp_path / "model_step3.pth"
    torch.save(community_state(), path)
    return path


def test_a_rerun_after_a_kill_between_the_backup_and_the_rename(community) -> None:
    """Killed after the backup link and with the new file half written: the rerun reuses that backup (it is
    the original) and removes the dead process's temp file."""
    original = community.read_bytes()
    os.link(community, community.with_name("model_step3.pth.bak"))  # what the killed repair had done
    community.with_name(".model_step3.pth.tmp-999999").write_bytes(b"half a checkpoint")  # pid 999999: gone
    written, notes = repair_checkpoint(community)
    assert written == community and verify_checkpoint(community).status == "COMPLETE"
    assert sorted(p.name for p in community.parent.iterdir()) == ["model_step3.pth", "model_step3.pth.bak"]
    assert community.with_name("model_step3.pth.bak").read_bytes() == original
    assert f"original kept as {community.with_name('model_step3.pth.bak')}" in notes


def test_a_bak_that_is_not_the_original_is_never_written(community, tmp_path) -> None:
    original = community.read_bytes()
    mine = community.with_name("model_step3.pth.bak")
    mine.write_bytes(b"the user's own backup")
    gone = community.with_name("model_step3.pth.bak.1")
    gone.symlink_to(tmp_path / "nothing")  # a link to nothing: a name taken all the same
    link = community.with_name("model_step3.pth.bak.2")
    link.symlink_to(community.name)  # would show the repaired file once PATH is replaced: not a backup
    repair_checkpoint(community)
    assert mine.read_bytes() == b"the user's own backup" and os.readlink(gone) == str(tmp_path / "nothing")
    assert not (tmp_path / "nothing").exists() and os.readlink(link) == community.name
    assert community.with_name("model_step3.pth.bak.3").read_bytes() == original

