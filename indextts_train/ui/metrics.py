"""Logging that can fail without ending the run.

A full disk, a read-only log folder or a `| tee` that died must not cost a long run its progress:
the checkpoints are what matter, the curves and log lines are a convenience. So each output here
turns its first failure into one warning (through whatever channel still works) and then goes
quiet; training goes on, and the save path keeps its own, louder error handling.
"""

from __future__ import annotations

import os
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Protocol


class MetricsWriter(Protocol):
    def add_scalar(self, tag: str, value: float, step: int) -> None: ...
    def flush(self) -> None: ...
    def close(self) -> None: ...


class NullWriter:
    """The writer of ranks that do not write, and of a writer that failed (torchtitan's no-op)."""

    def add_scalar(self, tag: str, value: float, step: int) -> None:
        pass

    def flush(self) -> None:
        pass

    def close(self) -> None:
        pass


def _reason(exc: BaseException) -> str:
    if isinstance(exc, OSError) and exc.strerror:
        return exc.strerror.lower()
    text = str(exc).strip().splitlines()
    return text[0][:160] if text else type(exc).__name__


GOES_ON = "training goes on and checkpoints are still saved"


class SafeWriter:
    """A metrics writer whose first failure is one warning; after it, metrics are dropped.

    TensorBoard writes from a background thread and re-raises its error on the next call, so every
    call is guarded, `close()` included. Any exception counts: whatever breaks TensorBoard, the run
    is worth more than its curves.
    """

    def __init__(self, open_writer: Callable[[], MetricsWriter], warn: Callable[[str], None], where: str,
                 goes_on: str = GOES_ON) -> None:
        self._warn = warn
        self._where = where
        self._goes_on = goes_on
        self.failed = False
        self._writer: MetricsWriter = NullWriter()
        self._guard("open", lambda: setattr(self, "_writer", open_writer()))

    def _guard(self, what: str, call: Callable[[], object]) -> None:
        if self.failed:
            return
        try:
            call()
        except Exception as exc:  # see the class docstring: no metrics failure may end a run
            self.failed = True
            self._writer = NullWriter()
            self._warn(f"TensorBoard logging stopped: could not {what} {self._where} ({_reason(exc)}); "
                       f"{self._goes_on}")

    def add_scalar(self, tag: str, value: float, step: int) -> None:
        self._guard("write to", lambda: self._writer.add_scalar(tag, value, step))

    def add_audio(self, tag: str, samples: object, step: int, sample_rate: int) -> None:
        """A clip (a (1, N) float tensor in [-1, 1]); a writer without audio (NullWriter) drops it."""
        add = getattr(self._writer, "add_audio", None)
        if add is not None:
            self._guard("write to", lambda: add(tag, samples, step, sample_rate=sample_rate))

    def flush(self) -> None:
        self._guard("write to", self._writer.flush)

    def close(self) -> None:
        self._guard("close", self._writer.close)


def _quiet_writer_threads() -> None:
    """TensorBoard's writer thread keeps its error for the next call on the writer (which SafeWriter turns
    into the one warning) and then re-raises it, so Python would also print that thread's traceback."""
    previous = threading.excepthook
    if getattr(previous, "quiet_tensorboard", False):
        return

    def hook(args: threading.ExceptHookArgs) -> None:
        thread = args.thread
        if type(thread).__name__ == "_AsyncWriterThread" and getattr(thread, "exception", None) is args.exc_value:
            return  # kept by the thread, raised again in the writer's next call
        previous(args)

    hook.quiet_tensorboard = True
    threading.excepthook = hook


def open_tensorboard(log_dir: Path, warn: Callable[[str], None], goes_on: str = GOES_ON,
                     **kwargs: object) -> SafeWriter:
    """A SafeWriter over torch's SummaryWriter in `log_dir` (extra kwargs go to SummaryWriter); `goes_on`: what
    its warning says continues (the trainer's by default)."""
    _quiet_writer_threads()

    def make() -> MetricsWriter:
        from torch.utils.tensorboard import SummaryWriter

        return SummaryWriter(str(log_dir), **kwargs)

    return SafeWriter(make, warn, str(log_dir), goes_on)


def silence_stdout() -> None:
    """Point stdout (and stderr, when it is the same pipe) at /dev/null after it broke (`| tee` was killed).

    Otherwise every later print raises again, and Python's own flush at exit fails and turns a
    clean exit code into 120.
    """
    streams = [sys.stdout]
    try:
        if os.path.sameopenfile(sys.stdout.fileno(), sys.stderr.fileno()):  # `2>&1 | tee`: both broke
            streams.append(sys.stderr)
    except (OSError, ValueError):
        pass
    devnull = os.open(os.devnull, os.O_WRONLY)
    for stream in streams:
        try:
            os.dup2(devnull, stream.fileno())
        except (OSError, ValueError):
            pass
    os.close(devnull)


class SafeConsole:
    """Runs print-like calls; the first OSError (EPIPE, EIO, ENOSPC on a redirected log) silences output."""

    def __init__(self) -> None:
        self.broken = False

    def run(self, call: Callable[[], object]) -> None:
        if self.broken:
            return
        try:
            call()
        except OSError:
            self.broken = True
            silence_stdout()
