"""--listen-every: checkpoints heard by `indextts-train listen` in a process of its own, never changing training."""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import torch
from helpers import train_tiny_run

from indextts_train.checkpoint.files import load_checkpoint
from indextts_train.checkpoint.run_folder import same_file
from indextts_train.checkpoint.scores import RECORD_FORMAT, append_record, scores_path
from indextts_train.train.listening import Listener, due_steps

pytestmark = pytest.mark.slow  # trains twice and starts the CLI


def _train(tiny_data, out: Path, **extra) -> None:
    train_tiny_run(tiny_data, out, max_steps=6, **extra)


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
    assert "listening to step(s) 4 in process" in log  # due: 2 x save interval 2; the last (6) waits for it ...
    # ... and is heard when the run is done, with 4 (whose listener the hand-over stopped, unless it had ended):
    # a watcher that ended with the trainer left it unheard
    assert log.index("listening to step(s) 4, 6 in process") < log.index("done: 6 steps")
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


def test_the_run_s_end_hands_the_waiting_checkpoints_to_one_listener(tmp_path, monkeypatch) -> None:
    """A listener still at work when the run is done is stopped, and one listener hears every waiting step."""
    said, warned = [], []
    listener = Listener(tmp_path, [], said.append, warned.append)
    slow = [sys.executable, "-c", "import time; time.sleep(600)"]
    watchers: list[threading.Thread] = []
    monkeypatch.setattr(listener, "_start", lambda: watchers.append(_start_fake(listener, slow, said)))
    listener.hear([2])
    first = listener.child
    listener.hear([2, 4])  # the last checkpoint: it waits for the child in progress
    assert listener.pending == [2, 4] and listener.child is first
    listener.hand_over()
    assert first.poll() is not None and listener.child is not first and listener.pending is None
    watchers[0].join(timeout=60)
    assert not watchers[0].is_alive()
    assert said == ["start [2]", "start [2, 4]"] and warned == []  # the stopped one is no failure, and its
    # watcher left the new child alone
    assert listener.child.poll() is None  # the successor runs
    listener.child.kill()
    watchers[1].join(timeout=60)
    listener.hand_over()  # nothing waits: nothing to do
    assert said == ["start [2]", "start [2, 4]"]


def _start_fake(listener: Listener, command: list[str], said: list[str]) -> threading.Thread:
    """Listener._start with a command of the test's: a child of its own session, watched the same way."""
    steps, listener.pending = listener.pending, None
    listener.child = subprocess.Popen(command, start_new_session=True)
    said.append(f"start {steps}")
    watcher = threading.Thread(target=listener._watch, args=(listener.child, steps), daemon=True)
    watcher.start()
    return watcher
