"""Crash-test hook: kill ourselves with a real SIGKILL at a named point of the loop or a save.

The resume tests set INDEXTTS_TRAIN_CRASH_AT=POINT@STEP (e.g. `save_tmp_written@14`) to die at an
exact instant that a random kill would rarely hit (between writing a checkpoint and renaming it,
between publishing it and moving latest.pth, inside gradient accumulation). Unset, it does nothing.
"""

from __future__ import annotations

import os
import signal

_TARGET = os.environ.get("INDEXTTS_TRAIN_CRASH_AT")


def crash_armed(name: str, step: int) -> bool:
    return _TARGET is not None and _TARGET == f"{name}@{step}"


def crash_point(name: str, step: int) -> None:
    if crash_armed(name, step):
        os.kill(os.getpid(), signal.SIGKILL)
