"""One `listen` at a time per run folder.

Two at once (a listener `--listen-every` started and one typed by hand, or two terminals) each heard every
pair the other was hearing: every WAV made twice and replaced under the other's scoring, each record
appended twice, each clip twice in TensorBoard. So the work holds an exclusive `fcntl.flock` on the run
folder itself, which writes nothing (a lock file in RUN/listen would be a file written before the input is
checked); the kernel drops it when the holder dies, however it dies. A second listen says that it waits,
waits, and then hears only what is still unheard.
"""

from __future__ import annotations

import errno
import fcntl
import os
from collections.abc import Callable
from pathlib import Path

from indextts_train.errors import UserError


class ListenLock:
    """The exclusive lock of one run folder's listening; `acquire()` returns whether it had to wait."""

    def __init__(self, run_dir: Path) -> None:
        self.run_dir = Path(run_dir)
        self._fd: int | None = None

    def acquire(self, say: Callable[[str], object]) -> bool:
        fd = os.open(self.run_dir, os.O_RDONLY | os.O_DIRECTORY | getattr(os, "O_CLOEXEC", 0))
        waited = False
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError as exc:
                if exc.errno not in (errno.EWOULDBLOCK, errno.EAGAIN):
                    raise UserError(f"{self.run_dir}: cannot lock the run folder for listening ({exc.strerror}); "
                                    "use a run folder on a local disk") from None
                say(f"another `indextts-train listen` is hearing {self.run_dir} (one --listen-every started, or "
                    "one of yours): waiting for it to end, then this one hears what is still unheard (Ctrl+C "
                    "stops this one; nothing heard is lost)")
                fcntl.flock(fd, fcntl.LOCK_EX)
                waited = True
        except BaseException:
            os.close(fd)
            raise
        self._fd = fd
        return waited

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)  # closing the only descriptor drops the flock
            self._fd = None
