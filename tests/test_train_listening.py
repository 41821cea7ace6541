"""--listen-every: checkpoints heard by `indextts-train listen` in a process of its own, never changing training."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import torch

from indextts_train.checkpoint.files import load_checkpoint
from indextts_train.checkpoint.run_folder import same_file
from indextts_train.checkpoint.scores import RECORD_FORMAT, append_record, scores_path
from indextts_train.train.listening import Listener, due_steps
from indextts_train.train.loop import resolve_settings, train

pytestmark = pytest.mark.slow  # trains twice and starts the CLI


def _train(tiny_data, out: Path, **extra) -> None:
    options = resolve_settings(train_manifests=[tiny_data["train"]], val_manifests=[tiny_data["val"]], output_dir=out,
                           config=tiny_data["config"], base_checkpoint=tiny_data["base"], batch_size=4,
                           grad_accumulation=1, effective_batch_size=4, num_workers=0, max_steps=6, epochs=100,
                           val_interval=2, save_interval=2, tensorboard=False, **extra)
    assert train(options) == 0


def test_training_with_listening_ends_bit_identical(tiny_data, tmp_path) -> None:
    _train(tiny_data, tmp_path / "plain")
    _train(tiny_data, tmp_path / "heard", listen_every=2)
    got, want = load_checkpoint(tmp_path / "heard" / "latest.pth"), load_checkpoint(tmp_path / "plain" / "latest.pth")
    for part in ("progress", "history", "scheduler"):
        assert got[part] == want[part], part
    for key, tensor in want["model"].items():
        assert torch.equal(got["model"][key], tensor), key
    for index, slots in want["optimizer"]["state"].items():
        for slot, tensor in slots.items():
            assert torch.equal(got["optimizer"]["state"][index][slot], tensor), f"{index}.{slot}"
    log = (tmp_path / "heard" / "train.log").read_text(encoding="utf-8")
    assert "listening to step(s) 4 in process" in log  # due: 2 x save interval 2; the last (6) waits for it
    assert "listening to step" not in (tmp_path / "plain" / "train.log").read_text(encoding="utf-8")


def test_a_failed_listener_is_a_warning_and_the_next_one_hears_what_is_due(tmp_path) -> None:
    for step in (2, 3, 4, 6):
        (tmp_path / f"model_step{step}.pth").write_bytes(b"not a checkpoint")
    assert due_steps(tmp_path, 2, 1, last_step=3) == [2, 3, 4, 6]
    assert due_steps(tmp_path, 2, 2, last_step=7) == [4]
    said, warned = [], []
    listener = Listener(tmp_path, ["--device", "cpu"], said.append, warned.append)
    listener.hear([4])
    deadline = time.monotonic() + 300
    while not warned and time.monotonic() < deadline:
        time.sleep(0.5)
    assert said[0].startswith("listening to step(s) 4 in process")
    log = tmp_path / "listen" / "listen.log"
    assert warned == [f"--listen-every: listening to step(s) 4 failed (exit 2); see {log}; training goes on"]
    assert "model_step4.pth is INCOMPLETE" in log.read_text(encoding="utf-8")


def test_best_follows_the_heard_cer(tiny_data, tmp_path) -> None:
    """--best-metric listen/cer: best.pth names the saved checkpoint with the lowest mean CER in
    RUN/listen/scores.jsonl (records as `listen` appends them), taken as each checkpoint is saved."""
    out = tmp_path / "run"
    for step, cers in ((2, (0.5, 0.7)), (4, (0.2, 0.3)), (6, (0.4, 0.4))):
        for line, cer in enumerate(cers):
            append_record(scores_path(out), {"format": RECORD_FORMAT, "step": step, "line_id": f"l{line}",
                                             "ok": True, "cer": cer, "speaker_sim": 0.5})
    _train(tiny_data, out, best_metric="listen/cer")
    assert same_file(out / "best.pth", out / "model_step4.pth")
    log = (out / "train.log").read_text(encoding="utf-8")
    assert "best.pth now names model_step2.pth: listen/cer 0.6000" in log
    assert "best.pth now names model_step4.pth: listen/cer 0.2500" in log and "model_step6.pth: listen" not in log
    # the state saved with step 6 was taken before its file existed, so before its scores were taken
    assert load_checkpoint(out / "latest.pth")["history"]["best"] == {
        "metric": "listen/cer", "value": 0.25, "step": 4, "stale": 0, "heard": 4}
