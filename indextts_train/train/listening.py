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
import re
import shutil
import signal
import subprocess
import sys
import threading
from collections.abc import Callable
from pathlib import Path

from indextts_train.checkpoint.run_folder import step_of
from indextts_train.errors import UserError
from indextts_train.files.atomic import open_append

LOG_NAME = "listen.log"
STOP_WAIT_S = 30  # a stopped listener's exit; then it is killed


def due_steps(output_dir: Path, every: int, save_interval: int, last_step: int) -> list[int]:
    """Steps of the checkpoints on disk that are due to be heard (multiples of every x save_interval, or the last)."""
    period = every * save_interval
    steps = []
    for path in Path(output_dir).glob("model_step*.pth"):
        step = step_of(path)
        if step is not None and _heard_as(path, step) and (step % period == 0 or step == last_step):
            steps.append(step)
    return sorted(steps)


def _heard_as(path: Path, step: int) -> bool:
    """Whether `listen --checkpoints step{step}` names this very file: a regular file under the plain name. A
    `model_step².pth` ended training in int()'s traceback; a FIFO or folder under a step's name (which listen
    refuses) failed every listener after it, each naming every due step."""
    return path.name == f"model_step{step}.pth" and path.is_file() and not path.is_symlink()


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
        self.asked: set[int] = set()  # every step named to hear(): the run's due checkpoints so far
        self.last_written: int | None = None  # the step of the newest checkpoint this run wrote (wrote())

    def wrote(self, step: int) -> None:
        """This run saved the checkpoint of `step` (due or not): the last one is heard at the end (hand_over)."""
        self.last_written = step

    def hear(self, steps: list[int]) -> None:
        """Hear these checkpoints now, or when the child in progress ends."""
        with self.lock:
            self.pending = steps
            self.asked.update(steps)
            if self.child is None:
                self._start()

    def _start(self) -> None:
        # the steps as named when they were due, less the files rotation removed since (the child starts when
        # the one before it ends, perhaps many saves later): listen refuses a name with no file, and heard none
        steps = [step for step in self.pending if _heard_as(self.output_dir / f"model_step{step}.pth", step)]
        self.pending = None
        if not steps:
            return
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
        hears every waiting step after the run. Nothing is lost by the stop: what it scored stays scored.
        A run that stopped before its last step (early stop) saved its last checkpoint at a step that was not
        due: it is heard too, as the last one always is."""
        with self.lock:
            child, last = self.child, self.last_written
            if last is not None and last not in self.asked:
                self.pending = sorted({*(self.pending or ()), *self.asked, last})  # and what a stopped child hears
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


def interpreter_path(flag_value: Path) -> Path:
    """The very file --inference-python names, made absolute against the current folder: Path("./python") is
    "python", which the start would look up on PATH (another interpreter ran, or FileNotFoundError). A bare
    name with no such file here is looked up on PATH (`--inference-python python3.11`); the `./` a value was
    typed with is gone by now, so a file of that name here comes first. (Here, below `listen`, so that the
    trainer checks --listen-inference-python by the same rule before its first step.)"""
    python = Path(os.path.abspath(flag_value.expanduser()))
    if os.sep not in str(flag_value) and not python.exists():
        found = shutil.which(str(flag_value))
        if found is not None:
            return Path(os.path.abspath(found))
    return python


_DEVICE = re.compile(r"auto|cpu|cuda(:(0|[1-9][0-9]{0,3}))?")  # what `listen --device` takes (cuda:01: no)


def check_listen_settings(train: object) -> None:
    """The --listen-* settings, before the run's first step: each listener is started with them after a save
    (the last one after the run is done), so a `--listen-device gpu` or a python that is not there failed every
    listener, said only in RUN/listen/listen.log once the trainer had ended. What takes seconds (the inference
    package's import, the ASR model's load) stays `listen`'s own check."""
    if not train.listen_every:
        return
    device = train.listen_device
    if not _DEVICE.fullmatch(device):
        raise UserError(f"--listen-device {device}: not a device the listener runs on; use cpu, auto, cuda or "
                        "cuda:N (N: a GPU's index, written as cuda:1)")
    import torch

    if device.startswith("cuda") and int(device.partition(":")[2] or 0) >= torch.cuda.device_count():
        raise UserError(f"--listen-device {device}: this machine has {torch.cuda.device_count()} GPU(s); use "
                        "--listen-device cpu" + (f", or cuda:0 to cuda:{torch.cuda.device_count() - 1}"
                                                 if torch.cuda.device_count() else ""))
    if train.listen_inference_python:
        python = interpreter_path(Path(train.listen_inference_python))
        if not python.is_file() or not os.access(python, os.X_OK):
            raise UserError(f"--listen-inference-python {train.listen_inference_python}: not an executable file; "
                            "pass the python of the environment with the official inference package")
    _check_asr_model(train.listen_asr_model)


def is_hub_id(text: str) -> bool:
    """Whether `text` is spelled as a Hugging Face model id: NAME or ORG/NAME, each part of letters,
    digits, '_', '-' and '.', starting with a letter or digit, at most 96 characters; no '..'."""
    parts = text.split("/")
    return len(parts) <= 2 and ".." not in text and all(
        0 < len(part) <= 96 and part[0].isascii() and part[0].isalnum()
        and all(c.isascii() and (c.isalnum() or c in "_-.") for c in part) for part in parts)


def _check_asr_model(model: str) -> None:
    """A local folder must hold a transformers model (config.json); a path that is not there is no Hugging
    Face id either (an id is NAME or ORG/NAME), so it is refused here rather than fetched from the hub."""
    if not model:
        return
    local = Path(model).expanduser()
    looks_like_path = model.startswith(("/", ".", "~")) or model.count("/") > 1
    if local.exists() and not (local / "config.json").is_file():
        what = "no config.json in that folder" if local.is_dir() else "not a folder"
        raise UserError(f"--listen-asr-model {model}: {what}; pass a transformers ASR model folder, or a Hugging "
                        "Face id")
    if not local.exists() and (looks_like_path or not is_hub_id(model)):  # `-`, `a b`, `am=en`: the hub is
        raise UserError(f"--listen-asr-model {model}: no such folder, nor a Hugging Face id; pass a "  # not asked
                        "transformers ASR model folder, or an id such as facebook/mms-1b-all")
