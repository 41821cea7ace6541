"""Test hooks: kill or freeze ourselves at a named point of the loop or a save.

The resume tests set INDEXTTS_TRAIN_CRASH_AT=POINT@STEP (e.g. `save_tmp_written@14`) to die with a
real SIGKILL at an exact instant that a random kill would rarely hit (between writing a checkpoint
and renaming it, between publishing it and moving latest.pth, inside gradient accumulation).

INDEXTTS_TRAIN_PAUSE_AT=POINT@STEP stops the process with SIGSTOP there instead (as `kill -STOP`
would), so a test can act on a run that is known to be mid-way, however fast the machine is; a
SIGCONT resumes it and any signal sent meanwhile is delivered then. Unset, both do nothing.
"""

from __future__ import annotations

import os
import signal

_TARGET = os.environ.get("INDEXTTS_TRAIN_CRASH_AT")
_PAUSE = os.environ.get("INDEXTTS_TRAIN_PAUSE_AT")
# Divergence tests: INDEXTTS_TRAIN_NAN_AT=3,4 makes the loss of those optimizer steps NaN, a bad step
# at an exact place (a real divergence cannot be placed, nor made to recover).
# A word that is no step number names no step (read at import: a ValueError there was every command's traceback).
_NAN_STEPS = {int(s) for s in os.environ.get("INDEXTTS_TRAIN_NAN_AT", "").split(",") if s.strip().isdecimal()}


def crash_armed(name: str, step: int) -> bool:
    return _TARGET is not None and _TARGET == f"{name}@{step}"


def crash_point(name: str, step: int) -> None:
    if crash_armed(name, step):
        os.kill(os.getpid(), signal.SIGKILL)
    if _PAUSE is not None and _PAUSE == f"{name}@{step}":
        os.kill(os.getpid(), signal.SIGSTOP)


def nan_loss_at(step: int) -> bool:
    return step in _NAN_STEPS
