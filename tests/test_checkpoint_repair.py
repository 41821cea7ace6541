"""Repair of community and partial checkpoints: key mapping, optimizer matching, backups, refusals."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from helpers import community_state, names, trained
from typer.testing import CliRunner

from indextts_train.checkpoint.files import CheckpointError, load_checkpoint
from indextts_train.checkpoint.repair import repair_checkpoint
from indextts_train.checkpoint.verify import verify_checkpoint
from indextts_train.cli import app
from indextts_train.config.settings import TrainConfig


def test_repair_community_checkpoint_in_place(tmp_path: Path) -> None:
    path = tmp_path / "model_step3.pth"
    source = community_state()
    torch.save(source, path)
    original = path.read_bytes()
    written, notes = repair_checkpoint(path)  # no --config: not known (test_checkpoint_model_fit: with one)
    assert written == path
    assert (tmp_path / "model_step3.pth.bak").read_bytes() == original
    verdict = verify_checkpoint(path)
    assert verdict.status == "COMPLETE" and "repaired from a community checkpoint" in verdict.reasons[0]
    state = load_checkpoint(path)
    model = trained(0)[0]
    assert list(state["model"]) == list(model.state_dict())  # "module." stripped
    assert state["optimizer_param_names"] == [n for n, _ in model.named_parameters()]  # buffer excluded
    assert torch.equal(state["optimizer"]["state"][1]["exp_avg_sq"], source["optimizer"]["state"][1]["exp_avg_sq"])
    assert state["progress"]["step"] == 3 and state["progress"]["epoch"] == 2
    assert state["progress"]["samples_in_epoch"] == 0 and state["progress"]["sampler_seed"] == TrainConfig().seed
    assert {"rng", "progress.samples_in_epoch", "history", "config"} <= set(state["repaired"]["unknown"])
    assert "optimizer" not in state["repaired"]["unknown"]
    assert state["vocab_plan"] == {"base_tokens": 12, "tokens": 12, "freeze_base": False, "insert_at": None}
    assert any("restarts epoch 2" in n for n in notes)
    repair_checkpoint(path)  # already COMPLETE: nothing written, no second backup
    assert not (tmp_path / "model_step3.pth.bak.1").exists()
    # a --config that does not exist is said, even for a file with nothing to repair
    result = CliRunner().invoke(app, ["repair", str(path), "--config", str(tmp_path / "missing.yaml")])
    assert result.exit_code == 2 and "missing.yaml: config not found" in result.output


def test_repair_drops_an_unmatched_optimizer_set_together(tmp_path: Path) -> None:
    source = community_state()
    source["optimizer"]["param_groups"][0]["params"].append(99)  # one parameter more than the weights
    path, out = tmp_path / "community.pth", tmp_path / "repaired.pth"
    torch.save(source, path)
    original = path.read_bytes()
    repair_checkpoint(path, out)
    assert path.read_bytes() == original and not (tmp_path / "community.pth.bak").exists()
    state = load_checkpoint(out)
    assert verify_checkpoint(out).status == "COMPLETE"
    assert (state["optimizer"], state["scheduler"], state["scaler"], state["optimizer_param_names"]) == (
        None, None, None, [])
    assert {"optimizer", "scheduler", "scaler"} <= set(state["repaired"]["unknown"])


def test_repair_never_writes_over_a_link_given_as_output(tmp_path: Path) -> None:
    """A dangling link, or one that names itself, does not `exist()`: repair renamed its file over it, exit 0."""
    path = tmp_path / "community.pth"
    torch.save(community_state(), path)
    for link, to in ((tmp_path / "loop.pth", tmp_path / "loop.pth"), (tmp_path / "dangling.pth", tmp_path / "gone")):
        link.symlink_to(to)
        with pytest.raises(CheckpointError, match=f"{link.name} is a symbolic link; pass another output path"):
            repair_checkpoint(path, link)
        assert link.is_symlink() and link.readlink() == to


def test_repair_refuses_garbage_and_bare_weights(tmp_path: Path) -> None:
    garbage = tmp_path / "garbage.pth"
    garbage.write_bytes(b"\x00" * 300)
    with pytest.raises(CheckpointError, match="cannot repair"):
        repair_checkpoint(garbage)
    bare = tmp_path / "gpt.pth"
    torch.save(trained(0)[0].state_dict(), bare)
    with pytest.raises(CheckpointError, match="--base-checkpoint"):
        repair_checkpoint(bare)
    assert sorted(names(tmp_path)) == ["garbage.pth", "gpt.pth"]
    assert garbage.read_bytes() == b"\x00" * 300


def test_repair_names_why_a_community_optimizer_was_dropped(tmp_path: Path) -> None:
    """A community file holds no parameter names, so its optimizer is kept only when names can be derived from the
    weights; when they cannot, the note said the missing names ('expected a list of parameter names'), which every
    community file lacks, and hid the real reason (here: one parameter more in the optimizer than the weights)."""
    source = community_state()
    source["optimizer"]["param_groups"][0]["params"].append(99)
    path = tmp_path / "community.pth"
    torch.save(source, path)
    _, notes = repair_checkpoint(path, tmp_path / "repaired.pth")
    dropped = [n for n in notes if n.startswith("optimizer, scheduler and scaler dropped together")]
    weights = len(list(trained(0)[0].parameters()))
    assert dropped == [f"optimizer, scheduler and scaler dropped together (the optimizer holds {weights + 1} "
                       f"parameters but the weights have {weights}); the optimizer restarts fresh at the "
                       "stored step"], notes
