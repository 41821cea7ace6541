"""One `prepare` per --out: an exclusive flock on the --out folder itself, held for the whole run.

Two prepares on one folder break each other: the second's start removes the temp files the first is
about to rename (the first then dies in a traceback), and a second with --restart removes the first's
finished arrays while the first still lists them. So rank 0 holds `fcntl.flock(LOCK_EX)` on an open
descriptor of the folder (no lock file: nothing of ours lands among the user's files, and the kernel
drops the lock however the holder dies, so a stale lock cannot exist). Other ranks of the same run
write without it; a second run is refused in one line naming the holder's PID when /proc/locks says it.

flock is advisory and may be unsupported (some network filesystems): then prepare goes on unlocked,
as it did before, rather than refusing a folder it can write.
"""

from __future__ import annotations

import errno
import fcntl
import os
from pathlib import Path

from indextts_train.errors import UserError

_LOCKS_TABLE = Path("/proc/locks")
MAX_LOCKS_BYTES = 1 << 20  # the kernel's table of locks: a few lines on any sane machine


def holder_pid(path: Path) -> int | None:
    """The PID holding a FLOCK on `path` per /proc/locks (`1: FLOCK ADVISORY WRITE PID MAJ:MIN:INODE ...`)."""
    try:
        stat = os.stat(path)
        with open(_LOCKS_TABLE, "rb") as handle:
            table = handle.read(MAX_LOCKS_BYTES).decode("ascii", "replace")
    except OSError:
        return None
    wanted = f"{os.major(stat.st_dev):02x}:{os.minor(stat.st_dev):02x}:{stat.st_ino}"
    for line in table.splitlines():
        fields = line.split()
        if len(fields) > 5 and fields[1] == "FLOCK" and fields[5] == wanted and fields[4].isdigit():
            return int(fields[4])
    return None


class OutLock:
    """The exclusive flock on one --out folder; `acquire()` (once the folder exists) or raise UserError."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self._fd: int | None = None

    @property
    def held(self) -> bool:
        return self._fd is not None

    def acquire(self) -> None:
        if self._fd is not None:
            return
        try:
            fd = os.open(self.root, os.O_RDONLY | os.O_DIRECTORY)
        except OSError:
            return  # not readable as a folder: the writes that follow say what is wrong, in their own line
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            os.close(fd)
            if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN):
                raise UserError(self._busy()) from None
            return  # no flock on this filesystem: unlocked, as before
        self._fd = fd

    def _busy(self) -> str:
        pid = holder_pid(self.root)
        who = f"another prepare (PID {pid}) is writing there now" if pid is not None and pid != os.getpid() \
            else "another prepare is writing there now"
        stop = f", stop it (kill {pid})" if pid is not None and pid != os.getpid() else ""
        return f"--out {self.root}: {who}; wait for it to finish{stop}, or use another --out"

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)  # closing the descriptor drops the flock
            self._fd = None

    def __del__(self) -> None:  # an OutputFolder dropped without release (a test's): no lock outlives it
        self.release()
