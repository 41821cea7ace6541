"""Checkpoint storage: atomic save, rotation, safe load, RNG (verifying a file: test_checkpoint_verify.py)."""

from __future__ import annotations

import errno
import os
import random
from pathlib import Path

import numpy as np
import pytest
import torch
from helpers import names, trained

from indextts_train.checkpoint import files as ckpt
from indextts_train.checkpoint.files import CheckpointError, CheckpointSaveError
from indextts_train.checkpoint.lineage import resume_order
from indextts_train.checkpoint.rng import capture_rng, restore_rng
from indextts_train.checkpoint.run_folder import list_checkpoints
from indextts_train.checkpoint.state import History, Lineage
from indextts_train.checkpoint.verify import choose_resume, verify_checkpoint
from indextts_train.config.settings import config_from_dict
from indextts_train.model.layout import official_shapes

# The smallest GPT of the official layout: make_state's weights are the model its stored config describes,
# as verify asks of a COMPLETE file (and export of the file it reads).
MICRO_GPT = {"model_dim": 8, "max_mel_tokens": 8, "max_text_tokens": 8, "heads": 2, "layers": 1,
             "number_text_tokens": 12, "number_mel_codes": 10, "start_mel_token": 8, "stop_mel_token": 9,
             "condition_module": {"output_size": 8, "linear_units": 8, "attention_heads": 2, "num_blocks": 1,
                                  "input_layer": "conv2d2", "perceiver_mult": 2},
             "emo_condition_module": {"output_size": 8, "linear_units": 8, "attention_heads": 1, "num_blocks": 1,
                                      "input_layer": "conv2d2", "perceiver_mult": 0.02}}


def micro_weights(trained_tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """MICRO_GPT's official keys: the trained tensors of helpers.TinyGPT where they fit, fixed random ones else."""
    generator = torch.Generator().manual_seed(0)
    shapes = official_shapes(config_from_dict({"gpt": MICRO_GPT}).gpt)
    return {key: trained_tensors[key] if key in trained_tensors and trained_tensors[key].shape == shape
            else torch.randn(shape, generator=generator) for key, shape in shapes.items()}


def make_state(step: int = 1) -> dict:
    model, optimizer, scheduler = trained(step)
    return {
        "format": ckpt.FORMAT, "format_version": ckpt.FORMAT_VERSION,
        "model": micro_weights(model.state_dict()), "optimizer": optimizer.state_dict(),
        "optimizer_param_names": [n for n, _ in model.named_parameters()],
        "scheduler": scheduler.state_dict(), "scaler": None,
        "progress": {"step": step, "epoch": 0, "samples_in_epoch": 4 * step, "samples_total": 4 * step,
                     "sampler_seed": 7, "micro_batch": 2, "grad_accumulation": 2, "world_size": 1,
                     "bad_steps": 0, "bad_streak": 0, "bad_streak_start": 0, "save_pending": 0},
        "data": {"fingerprint": None, "skipped_loads": 0, "skipped_lines": []},
        "lineage": Lineage().state_dict(),
        "rng": [capture_rng()],
        "history": {**History().state_dict(), "train": [{"step": step, "loss": 1.5}]},
        "hparams": {"learning_rate": 1e-2, "precision": "fp32"}, "config": {"gpt": MICRO_GPT, "train": {}},
        "vocab_plan": {"base_tokens": 10, "tokens": 12, "freeze_base": True},
        "hardware": {"device": "cpu"}, "created": "2025-01-01T00:00:00",
    }


def save_steps(output_dir: Path, steps: list[int], keep: int = 10) -> None:
    for step in steps:
        ckpt.save_checkpoint(make_state(step), output_dir, step, keep=keep)


# ----------------------------------------------------------------------------- save / load


def test_round_trip_loads_with_weights_only(tmp_path: Path) -> None:
    state = make_state(2)
    path = ckpt.save_checkpoint(state, tmp_path, 2, keep=3)
    assert path == tmp_path / "model_step2.pth"
    loaded = torch.load(path, map_location="cpu", weights_only=True)
    assert loaded.keys() == state.keys()
    assert all(torch.equal(loaded["model"][k], v) for k, v in state["model"].items())
    assert torch.equal(loaded["optimizer"]["state"][0]["exp_avg"], state["optimizer"]["state"][0]["exp_avg"])
    assert loaded["progress"] == state["progress"]
    assert ckpt.load_checkpoint(path)["scheduler"] == state["scheduler"]


def test_latest_is_the_newest_complete_file(tmp_path: Path) -> None:
    save_steps(tmp_path, [1, 2, 3])
    latest = tmp_path / "latest.pth"
    assert latest.read_bytes() == (tmp_path / "model_step3.pth").read_bytes()
    assert os.path.samefile(latest, tmp_path / "model_step3.pth")
    assert ckpt.list_checkpoints(tmp_path)[-2:] == [tmp_path / "model_step3.pth", latest]


def test_latest_falls_back_to_a_copy_without_hard_links(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def no_links(src: os.PathLike, dst: os.PathLike) -> None:
        raise OSError(errno.EPERM, "hard links not supported")

    monkeypatch.setattr(ckpt.os, "link", no_links)
    save_steps(tmp_path, [1, 2], keep=1)
    latest = tmp_path / "latest.pth"
    assert not os.path.samefile(latest, tmp_path / "model_step2.pth")
    assert latest.read_bytes() == (tmp_path / "model_step2.pth").read_bytes()
    assert verify_checkpoint(latest).status == "COMPLETE"


def test_rotation_keeps_the_newest(tmp_path: Path) -> None:
    save_steps(tmp_path, [1, 2, 3, 4, 5], keep=2)
    assert names(tmp_path) == {"model_step4.pth", "model_step5.pth", "latest.pth"}


def test_rotation_never_deletes_a_link(tmp_path: Path) -> None:
    """model_step1.pth as a symbolic link to a checkpoint kept elsewhere is the user's: rotation took it for
    one of its files and removed it."""
    run = tmp_path / "run"
    save_steps(tmp_path / "elsewhere", [1])
    run.mkdir()
    (run / "model_step1.pth").symlink_to(tmp_path / "elsewhere" / "model_step1.pth")
    save_steps(run, [2, 3, 4], keep=1)
    assert names(run) == {"model_step1.pth", "model_step4.pth", "latest.pth"}
    assert (run / "model_step1.pth").is_symlink()


def test_milestones_and_best_survive_rotation(tmp_path: Path) -> None:
    for step in range(1, 8):
        ckpt.save_checkpoint(make_state(step), tmp_path, step, keep=1, keep_every=3, best=step == 2)
    assert names(tmp_path) == {"model_step3.pth", "model_step6.pth", "model_step7.pth", "latest.pth", "best.pth"}
    assert torch.load(tmp_path / "best.pth", weights_only=True)["progress"]["step"] == 2
    assert os.path.samefile(tmp_path / "latest.pth", tmp_path / "model_step7.pth")


def test_rotation_never_deletes_what_latest_refers_to(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    save_steps(tmp_path, [1], keep=1)
    # latest.pth stays on step 1 (as when publishing it failed); rotation must still spare its target.
    monkeypatch.setattr(ckpt, "publish", lambda *args: None)
    save_steps(tmp_path, [2, 3], keep=1)
    assert names(tmp_path) == {"model_step1.pth", "model_step3.pth", "latest.pth"}
    assert os.path.samefile(tmp_path / "latest.pth", tmp_path / "model_step1.pth")


def test_stale_temp_files_are_removed_by_the_next_save(tmp_path: Path) -> None:
    for stale in (".model_step5.pth.tmp-99999", ".latest.pth.tmp-12345"):
        (tmp_path / stale).write_bytes(b"half a checkpoint")
    (tmp_path / ".model_step5.pth.tmp-notes").write_text("not ours")
    (tmp_path / "notes.txt").write_text("user file")
    save_steps(tmp_path, [1])
    assert names(tmp_path) == {"model_step1.pth", "latest.pth", ".model_step5.pth.tmp-notes", "notes.txt"}


def enospc_writer(state: dict, handle) -> None:
    handle.write(b"PK\x03\x04 partial")
    raise OSError(errno.ENOSPC, "No space left on device")


def enospc_inside_torch(state: dict, handle) -> None:
    """torch.save reports a failed write as a RuntimeError raised while handling the OSError."""
    handle.write(b"PK\x03\x04 partial")
    try:
        raise OSError(errno.ENOSPC, "No space left on device")
    except OSError:
        raise RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 704 vs 598") from None


@pytest.mark.parametrize("writer", [enospc_writer, enospc_inside_torch])
def test_disk_full_leaves_previous_checkpoint_and_latest(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                          writer) -> None:
    save_steps(tmp_path, [1])
    before = {p.name: p.read_bytes() for p in tmp_path.iterdir()}
    state = make_state(2)
    monkeypatch.setattr(torch, "save", writer)  # the write itself fails, inside atomic_write
    with pytest.raises(CheckpointSaveError) as info:
        ckpt.save_checkpoint(state, tmp_path, 2, keep=3)
    message = str(info.value)
    assert "could not save checkpoint step 2" in message and "disk full" in message
    assert "model_step1.pth is intact" in message and "\n" not in message
    assert {p.name: p.read_bytes() for p in tmp_path.iterdir()} == before  # no temp file left either
    assert choose_resume(resume_order(list_checkpoints(tmp_path))).path == tmp_path / "latest.pth"


def test_save_refuses_a_state_weights_only_cannot_load(tmp_path: Path) -> None:
    state = make_state(1)
    state["history"]["train"].append({"loss": np.float32(1.0)})
    with pytest.raises(ValueError, match=r"state\['history'\]\['train'\]\[1\]\['loss'\] is a numpy"):
        ckpt.save_checkpoint(state, tmp_path, 1, keep=3)
    assert not tmp_path.joinpath("model_step1.pth").exists()


def test_save_refuses_a_state_missing_resume_keys(tmp_path: Path) -> None:
    state = make_state(1)
    del state["rng"]
    with pytest.raises(ValueError, match="missing rng"):
        ckpt.save_checkpoint(state, tmp_path, 1, keep=3)


# ----------------------------------------------------------------------------- RNG


def draws() -> tuple:
    return random.random(), np.random.rand(3).tolist(), torch.rand(3).tolist(), np.random.randn()


def test_rng_round_trip_through_a_weights_only_file(tmp_path: Path) -> None:
    random.seed(1)
    np.random.seed(2)
    torch.manual_seed(3)
    np.random.randn()  # leaves a cached gaussian in numpy's state
    torch.save(capture_rng(), tmp_path / "rng.pth")
    expected = draws()
    state = torch.load(tmp_path / "rng.pth", weights_only=True)
    restore_rng(state)
    assert draws() == expected
    with pytest.raises(CheckpointError, match="RNG state is malformed"):
        restore_rng({**state, "numpy": {"bit_generator": "PCG64"}})
