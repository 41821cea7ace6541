"""One training run per output dir: an exclusive lock, and a preflight of the folder itself.

Two runs writing one output dir would publish `model_step{N}.pth` files from different trajectories
under the same names and rotate each other's checkpoints away. So a run holds an exclusive
`fcntl.flock` on `OUTPUT_DIR/train.lock` for its whole life.

Contract (the WebUI and scripts rely on it):

- The lock is the flock, not the file. The kernel releases it when the holding process dies, however
  it dies (`kill -9`, OOM killer), so a stale lock cannot exist and nobody ever needs to delete
  `train.lock`; the file stays on disk after a run and is reused by the next one.
- While a run holds it, the file holds one line of text: `pid=<PID> started=<ISO-8601 UTC time>`.
  The text is written after the lock is taken, so a reader that sees the lock held and an empty
  file has caught the instant between the two: treat it as "held, PID not known yet".
- `holder_pid(output_dir)` tells whether the lock is held right now and by which PID (None when it
  is free or the folder has no lock file). It reads the kernel's table of locks (/proc/locks) and
  takes no lock of its own, so a run starting meanwhile never finds the lock busy because of it
  (a probing shared flock made 1 acquire in ~40 fail); it never creates or writes anything: safe
  to call from any process, any number of times. Where /proc/locks is missing it probes as before.
- Under torchrun only rank 0 holds the lock; it is the process to name.
- Data-loader worker processes forked by the run close their inherited copy of the descriptor, so
  a worker left behind by a killed parent does not keep the lock.

flock is advisory and local: it does not protect an output dir shared over NFS by two machines.
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import fcntl
import os
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from indextts_train.distributed import DistInfo, any_rank
from indextts_train.errors import NotOwnFile, UserError, refusal
from indextts_train.files.atomic import open_own
from indextts_train.files.faults import crash_point
from indextts_train.ui.events import EVENTS_NAME
from indextts_train.ui.text_log import LOG_NAME, TextLog

if TYPE_CHECKING:  # torch only for a run's claim: a process that only asks holder_pid() stays light
    import torch

LOCK_NAME = "train.lock"

_held_fds: set[int] = set()  # descriptors this process holds a run lock on (closed in forked children)


def _close_in_child() -> None:
    # A forked child shares the parent's open file description; closing the child's copy (never
    # LOCK_UN, which would release the parent's lock) lets the lock die with the parent.
    for fd in list(_held_fds):
        try:
            os.close(fd)
        except OSError:
            pass
    _held_fds.clear()


os.register_at_fork(after_in_child=_close_in_child)


def _parse_pid(text: str) -> int | None:
    for word in text.split():
        if word.startswith("pid=") and word[4:].isdigit():
            return int(word[4:])
    return None


_HOLDER_BYTES = 4096  # "pid=N started=TIME": one short line


def _read_holder(fd: int) -> str:
    try:
        return os.pread(fd, _HOLDER_BYTES, 0).decode("utf-8", errors="replace").strip()
    except OSError:
        return ""


def _not_a_lock(path: Path, exc: OSError) -> UserError:
    return UserError(f"{path}: {exc.strerror}; the run lock is written into, so it must be a file of the "
                     "run's own: move this one out of the output dir, or choose another --output-dir")


_PROC_LOCKS = Path("/proc/locks")
_PROC_LOCKS_MAX_BYTES = 16 * 2**20  # bounded read: a machine with a million locks is not our business


def _flock_held(fd: int, has_pid: bool) -> bool | None:
    """Whether some process holds an exclusive flock on the file of `fd`, from /proc/locks; None when
    the table cannot be read (not Linux).

    The kernel prints MAJOR:MINOR in hex and the inode in decimal. Some filesystems (btrfs
    subvolumes) report another st_dev than the kernel prints, so a lock on the same inode number
    elsewhere counts too when the file names a holder (`has_pid`: a released lock leaves no text).
    """
    stat = os.fstat(fd)
    device = f"{os.major(stat.st_dev):02x}:{os.minor(stat.st_dev):02x}"
    try:
        with open(_PROC_LOCKS, encoding="ascii", errors="replace") as table:
            text = table.read(_PROC_LOCKS_MAX_BYTES)
    except OSError:
        return None
    same_inode = False
    for line in text.splitlines():
        fields = line.split()
        # "N: FLOCK ADVISORY WRITE PID MAJ:MIN:INODE 0 EOF"; a waiter's line has "->" after "N:".
        if len(fields) < 6 or fields[1] != "FLOCK" or fields[3] != "WRITE":
            continue
        dev, _, inode = fields[5].rpartition(":")
        if inode == str(stat.st_ino):
            if dev == device:
                return True
            same_inode = True
    return same_inode and has_pid


def holder_pid(output_dir: str | Path) -> int | None:
    """The PID holding OUTPUT_DIR's run lock right now, or None when no run holds it.

    Returns -1 when the lock is held but the holder has not written its PID yet (a run starting).
    """
    path = Path(output_dir) / LOCK_NAME
    try:  # a link, a FIFO (the open would wait for a writer) or a hard link is no run's lock
        fd = open_own(path, os.O_RDONLY)
    except OSError:
        return None
    try:
        pid = _parse_pid(_read_holder(fd))
        held = _flock_held(fd, pid is not None)
        if held is not None:
            return (pid if pid is not None else -1) if held else None
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except OSError as exc:
            if exc.errno not in (errno.EWOULDBLOCK, errno.EAGAIN):
                return None
            pid = _parse_pid(_read_holder(fd))
            return pid if pid is not None else -1
        fcntl.flock(fd, fcntl.LOCK_UN)
        return None
    finally:
        os.close(fd)


class RunLock:
    """The exclusive run lock on one output dir; `acquire()` or raise UserError naming the holder."""

    def __init__(self, output_dir: str | Path) -> None:
        self.path = Path(output_dir) / LOCK_NAME
        self._fd: int | None = None

    def acquire(self) -> RunLock:
        # O_CREAT without O_TRUNC: the holder's text must survive our failed attempt. Only a file of our
        # own: the holder line is written into it (a link's target would be truncated).
        try:
            fd = open_own(self.path, os.O_RDWR | os.O_CREAT)
        except NotOwnFile as exc:
            raise _not_a_lock(self.path, exc) from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            busy = self._busy_message(fd)
            os.close(fd)
            if exc.errno not in (errno.EWOULDBLOCK, errno.EAGAIN):
                raise UserError(f"{self.path}: cannot lock the output dir ({exc.strerror}); "
                                "use an output dir on a local disk") from None
            raise UserError(busy) from None
        started = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        try:
            os.ftruncate(fd, 0)
            os.write(fd, f"pid={os.getpid()} started={started}\n".encode())
        except OSError as exc:  # full disk, ...: no run without its holder line; nothing leaks
            os.close(fd)  # closing the only descriptor also drops the lock
            raise UserError(f"{self.path}: cannot write the run lock ({(exc.strerror or str(exc)).lower()}); "
                            "free space or choose a writable --output-dir") from None
        self._fd = fd
        _held_fds.add(fd)
        return self

    def _busy_message(self, fd: int) -> str:
        text = _read_holder(fd)
        pid = _parse_pid(text)
        if pid is None:
            return (f"{self.path.parent} is in use by another training run that is just starting; wait "
                    "for it, or choose another --output-dir")
        started = text.split("started=", 1)[1] if "started=" in text else "unknown"
        return (f"{self.path.parent} is in use by another training run (PID {pid}, started {started}); "
                f"wait for it to finish, stop it (kill {pid}), or choose another --output-dir")

    def release(self) -> None:
        """Drop the lock (the file stays: it is reused, and holds no lock by itself)."""
        if self._fd is None:
            return
        _held_fds.discard(self._fd)
        try:
            os.ftruncate(self._fd, 0)  # no PID left behind that a reader could take for a holder
        except OSError:
            pass
        os.close(self._fd)  # closing the last descriptor releases the flock
        self._fd = None

    def __enter__(self) -> RunLock:
        return self.acquire()

    def __exit__(self, *exc: object) -> None:
        self.release()


def preflight_output_dir(output_dir: str | Path) -> Path:
    """Create OUTPUT_DIR if needed and prove it is a writable folder, before any work is done.

    A file in its place, a file among its parents, a parent that cannot be created or a read-only
    folder each end with one UserError line (exit 2) instead of a traceback minutes later.
    """
    path = Path(output_dir)
    flag = f"--output-dir {path}"
    if path.exists() and not path.is_dir():
        raise UserError(f"{flag}: is a file, not a folder; choose a folder path for the run")
    blocking = next((p for p in path.parents if p.exists() and not p.is_dir()), None)
    if blocking is not None:
        raise UserError(f"{flag}: {blocking} is a file, so no folder can be made under it; choose another path")
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise UserError(f"{flag}: cannot create the folder ({exc.strerror or exc}); check the path and "
                        "its permissions") from None
    fd, probe = None, None
    try:  # a new name of its own (O_EXCL): a file already there under any name is never written or removed
        fd, probe = tempfile.mkstemp(prefix=".write-test-", dir=path)
        os.write(fd, b"ok")
        os.fsync(fd)
    except OSError as exc:
        raise UserError(f"{flag}: cannot write there ({exc.strerror or exc}); choose a writable folder "
                        "or free space") from None
    finally:
        if fd is not None:
            os.close(fd)
        if probe is not None:
            with contextlib.suppress(OSError):
                os.unlink(probe)
    return path


def claim_output_dir(output_dir: Path, dist_info: DistInfo, device: torch.device, made: Path | None = None,
                     created: tuple[str, ...] = ()) -> RunLock | None:
    """Preflight and lock OUTPUT_DIR on rank 0; every rank stops (exit 2) when rank 0 could not.

    Returns the held lock on rank 0, None on the other ranks. When another rank is gone by then (it refused
    its own input before this first collective), rank 0 takes back what it made (`made`, `created`) and
    releases the lock before it stops.
    """
    error, lock = None, None
    if dist_info.is_main:
        try:
            preflight_output_dir(output_dir)
            lock = RunLock(output_dir).acquire()
        except UserError as exc:
            error = exc
    try:
        stop = any_rank(error is not None, dist_info, device)
    except UserError:
        if lock is not None:  # while the lock is held: no other start can take a lock file about to be removed
            take_back(output_dir, made, list(created))
            lock.release()
        raise
    if stop:
        raise error or UserError(f"rank 0 could not claim --output-dir {output_dir} (see its message)")
    return lock


def first_missing(output_dir: Path) -> Path | None:
    """The topmost folder of output_dir that does not exist yet (None: it exists)."""
    missing = None
    for folder in (Path(output_dir), *Path(output_dir).parents):
        if folder.exists():
            return missing
        missing = folder
    return missing


def take_back(output_dir: Path, made: Path | None, names: list[str]) -> None:
    """Remove what a refused start created: `names` in output_dir (its lock, its log), then the folders
    it made (`made`: the topmost, None when the output folder was there), each only if empty."""
    for name in names:
        with contextlib.suppress(OSError):
            (Path(output_dir) / name).unlink()
    folder = Path(output_dir)
    while made is not None:
        try:
            folder.rmdir()  # only an empty folder: anything else in it stays
        except OSError:
            return
        if folder == made:
            return
        folder = folder.parent


@dataclass(frozen=True)
class Claim:
    """A start's hold on its output dir: the lock (rank 0), and what the start created there
    (`made`: the topmost folder it made; `created`: its lock and log files) so a refusal can take it back."""

    output_dir: Path
    lock: RunLock | None
    made: Path | None
    created: list[str]
    kept: tuple[str, ...] = ()  # train.log / events.jsonl there and not ours: never appended to

    def give_back(self, exc: BaseException, dist_info: DistInfo, text_log: TextLog) -> None:
        """A refused start (bad data, changed data, ...) ends here: its error in the log, what it created
        removed, its lock released."""
        if isinstance(exc, UserError):
            text_log.record(text_log.stamp(refusal(exc)), "error")
        text_log.close()
        if dist_info.is_main:  # while the lock is held: no other start can take a lock file about to be removed
            take_back(self.output_dir, self.made, self.created)
        if self.lock is not None:
            self.lock.release()


def claim_run(output_dir: Path, dist_info: DistInfo, device: torch.device, text_log: TextLog) -> Claim:
    """Claim OUTPUT_DIR for this start (one run per output dir) and send the log there (rank 0).

    What the start creates is noted first, so that a refusal can take it back: the folders, the lock
    and the log.
    """
    made = first_missing(output_dir)
    created = [name for name in (LOCK_NAME, LOG_NAME, EVENTS_NAME) if not (output_dir / name).exists()]
    claim = Claim(output_dir, claim_output_dir(output_dir, dist_info, device, made, tuple(created)), made, created)
    try:
        crash_point("setup", 0)  # signal tests stop the run here, in setup with the lock held
        if dist_info.is_main:
            claim = dataclasses.replace(claim, kept=tuple(text_log.attach(output_dir)))
    except BaseException as exc:
        claim.give_back(exc, dist_info, text_log)
        raise
    return claim
