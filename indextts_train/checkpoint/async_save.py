"""Checkpoints written in a background thread (`--async-save`), with every crash guarantee kept.

At the step boundary the loop takes a *snapshot*: the checkpoint dict with every tensor copied to
CPU memory (the model's official-layout tensors are fresh copies already), so training may change
the weights and the optimizer's moments at once. A thread then runs the ordinary
`save_checkpoint` on the snapshot: temp file, fsync, rename, latest.pth, rotation. Nothing about
the files differs from a synchronous save, so a kill at any instant, mid-write included, leaves the
previous checkpoints and latest.pth as they were, and `--resume auto` resumes exactly.

At most one save is in flight: the next save, and the end of the run (or a signal stop), wait for
the previous one first, and a failure of a background save (disk full) is raised there. The thread
is not a daemon, so even an exception in the loop lets a started save finish.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import torch


def cpu_snapshot(state: dict) -> dict:
    """`state` with every tensor copied to CPU and every container copied (state["model"] is fresh)."""
    return {key: value if key == "model" else _copied(value) for key, value in state.items()}


def _copied(obj: Any) -> Any:
    if isinstance(obj, torch.Tensor):
        return obj.detach().to("cpu", copy=True)
    if isinstance(obj, dict):
        return type(obj)((k, _copied(v)) for k, v in obj.items())
    if isinstance(obj, (list, tuple)):
        return type(obj)(_copied(v) for v in obj)
    return obj  # str, int, float, bool, None: immutable


class BackgroundSaver:
    """Runs one write at a time in a thread; `wait()` joins it and re-raises what it raised."""

    def __init__(self) -> None:
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None

    def start(self, write: Callable[[], object]) -> None:
        self.wait()
        self._thread = threading.Thread(target=self._run, args=(write,), name="checkpoint-save")
        self._thread.start()

    def _run(self, write: Callable[[], object]) -> None:
        try:
            write()
        except BaseException as exc:  # handed to the loop at the next wait()
            self._error = exc

    @property
    def in_flight(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def wait(self) -> None:
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        error, self._error = self._error, None
        if error is not None:
            raise error
