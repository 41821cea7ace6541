"""`--listen-every K`: each K-th periodic checkpoint (its step a multiple of K x --save-interval) and the
last one are heard by `indextts-train listen` in a process of its own, while training goes on.

Training never imports `listen` and never waits for it: the listener is a detached child (a session of
its own, so Ctrl+C in the terminal or a kill of the trainer leaves it to finish) running the CLI, with
its output appended to RUN/listen/listen.log. Nothing it does reaches the training state, so a run
with listening ends bit-identical to one without. One child at a time: a checkpoint saved while one
runs is heard by the next, which names every due checkpoint still on disk (listen skips what is
already scored, so a killed listener's work is picked up, not redone). A child that fails, or cannot
start, is one warning in train.log; training goes on. When the run ends with checkpoints still waiting
for the child in progress (the last one, always, in a short run), the waiting ones are handed over
(`hand_over`): no watcher outlives the trainer to start them, so the child in progress is stopped
and one child hears them all after the run.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Callable
from pathlib import Path

from indextts_train.files.atomic import open_append

LOG_NAME = "listen.log"
STOP_WAIT_S = 30  # a stopped listener's exit; then it is killed


def due_steps(output_dir: Path, every: int, save_interval: int, last_step: int) -> list[int]:
    """Steps of the checkpoints on disk that are due to be heard (multiples of every x save_interval, or the last)."""
    period = every * save_interval
    steps = []
    for path in Path(output_dir).glob("model_step*.pth"):
        number = path.name[len("model_step"):-len(".pth")]
        if number.isdigit() and (int(number) % period == 0 or int(number) == last_step):
            steps.append(int(number))
    return sorted(steps)


class Listener:
    """Starts `indextts-train listen RUN --checkpoints stepA,stepB,...` children, one at a time."""

    def __init__(self, output_dir: Path, command: list[str], info: Callable[[str], None],
                 warn: Callable[[str], None]) -> None:
        self.output_dir = Path(output_dir)
        self.command = command  # the flags after `listen RUN`
        self.info, self.warn = info, warn
        self.lock = threading.Lock()
        self.child: subprocess.Popen | None = None
        self.pending: list[int] | None = None

    def hear(self, steps: list[int]) -> None:
        """Hear these checkpoints now, or when the child in progress ends."""
        with self.lock:
            self.pending = steps
            if self.child is None:
                self._start()

    def _start(self) -> None:
        steps, self.pending = self.pending, None
        listen_dir = self.output_dir / "listen"
        args = [sys.executable, "-m", "indextts_train", "listen", str(self.output_dir),
                "--checkpoints", ",".join(f"step{s}" for s in steps), *self.command]
        try:
            listen_dir.mkdir(parents=True, exist_ok=True)
            with os.fdopen(open_append(listen_dir / LOG_NAME), "ab") as log:
                self.child = subprocess.Popen(args, stdin=subprocess.DEVNULL, stdout=log, stderr=log,
                                              start_new_session=True, env={**os.environ, "PYTHONUNBUFFERED": "1"})
        except OSError as exc:
            self.warn(f"--listen-every: could not start `indextts-train listen` ({exc}); training goes on")
            return
        self.info(f"listening to step(s) {', '.join(map(str, steps))} in process {self.child.pid} (its output: "
                  f"{listen_dir / LOG_NAME}; scores: {listen_dir / 'index.html'})")
        threading.Thread(target=self._watch, args=(self.child, steps), daemon=True, name="listen-watch").start()

    def _watch(self, child: subprocess.Popen, steps: list[int]) -> None:
        code = child.wait()
        with self.lock:
            if self.child is not child:  # stopped by hand_over, which started its successor
                return
            if code != 0:
                self.warn(f"--listen-every: listening to step(s) {', '.join(map(str, steps))} failed (exit {code}); "
                          f"see {self.output_dir / 'listen' / LOG_NAME}; training goes on")
            self.child = None
            if self.pending is not None:
                self._start()

    def hand_over(self) -> None:
        """The run is done: checkpoints waiting for the child in progress would never be heard (its watcher
        ends with this process), so that child is stopped (its group: the synthesis child too) and one child
        hears every waiting step after the run. Nothing is lost by the stop: what it scored stays scored."""
        with self.lock:
            child = self.child
            if self.pending is None:
                return
            if child is not None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(child.pid, signal.SIGTERM)
                try:
                    child.wait(timeout=STOP_WAIT_S)
                except subprocess.TimeoutExpired:
                    with contextlib.suppress(ProcessLookupError):
                        os.killpg(child.pid, signal.SIGKILL)
                    child.wait()
                self.child = None
            self._start()


def listen_flags(train: object) -> list[str]:
    """The `listen` flags of the run's --listen-* settings."""
    flags = ["--device", train.listen_device]
    if train.listen_asr_model:
        flags += ["--asr-model", train.listen_asr_model]
    if train.listen_inference_python:
        flags += ["--inference-python", train.listen_inference_python]
    return flags
