"""The one way this project writes a file: temp name, fsync, rename, fsync the directory.

Every writer (checkpoints, export, demo, clean manifests, tokenizers, configs) goes through
`atomic_write`, so a crash or a full disk never leaves a half file under a final name and a
published name survives a power cut. The files that only grow (a run's log and events, listen's
scores and logs) are opened by `open_append`. Both, and the run lock, open only a regular file of our own
(`open_own`): never through a link, never waiting on a FIFO, never into a file with another hard link.
"""

from __future__ import annotations

import errno
import os
import shutil
import stat
from collections.abc import Callable
from pathlib import Path
from typing import BinaryIO

from indextts_train.errors import NotOwnFile

Writer = Callable[[BinaryIO], None]


def temp_name(final: Path, pid: int | None = None) -> Path:
    """`.NAME.tmp-PID` beside `final` (this process's, or `pid`'s): hidden, and never mistaken for a finished
    file."""
    return final.with_name(f".{final.name}.tmp-{os.getpid() if pid is None else pid}")


def stale_temps(final: Path) -> list[Path]:
    """The temp files of `final` that killed writers left behind (`temp_name` of any PID)."""
    return sorted(final.parent.glob(f".{final.name}.tmp-*"))


def fsync_dir(directory: Path) -> None:
    """Make a rename durable. Some filesystems cannot fsync a directory; the rename is still atomic there."""
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    except OSError as exc:
        if exc.errno not in (errno.EINVAL, errno.ENOTSUP, errno.EBADF):
            raise
    finally:
        os.close(fd)


def _not_own(info: os.stat_result) -> str | None:
    """Why a file with this stat is not one this program writes to (None: a regular file, one name)."""
    if stat.S_ISLNK(info.st_mode):
        return "a link"
    if not stat.S_ISREG(info.st_mode):
        return "not a regular file"
    return "a file with another hard link (a write would change that file too)" if info.st_nlink > 1 else None


def own_file_problem(path: Path) -> str | None:
    """Why `open_own` would refuse `path`, asked before any work (None: none yet, or a file of our own)."""
    try:
        return _not_own(os.lstat(path))
    except FileNotFoundError:
        return None


def open_own(path: Path, flags: int) -> int:
    """A descriptor on `path` (`flags` as os.open's; with O_CREAT made when missing), only when it is a
    regular file of our own: no link in its last part, no FIFO or device (opened without waiting for the
    other end), no other hard link. Raises NotOwnFile (EPERM) when it is not ours; the kind is taken from the
    open descriptor, so a file swapped in is caught."""
    try:
        fd = os.open(path, flags | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, 0o666)  # as open(): umask applies
    except OSError as exc:  # ELOOP: a link in its last part; ENXIO: a FIFO with no reader (or a device)
        problem = own_file_problem(path) if exc.errno in (errno.ELOOP, errno.ENXIO) else None
        if problem is None:
            raise
        raise NotOwnFile(errno.EPERM, f"is {problem}, not a file of this program's own", str(path)) from None
    problem = _not_own(os.fstat(fd))
    if problem is not None:
        os.close(fd)
        raise NotOwnFile(errno.EPERM, f"is {problem}, not a file of this program's own", str(path))
    os.set_blocking(fd, True)
    return fd


def open_append(path: Path) -> int:
    """A descriptor appending to `path` (made when missing), only when it is a regular file of our own."""
    return open_own(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT)


def drop_cached_pages(fd: int) -> None:
    """Give a written, fsynced file's (clean) pages back to the kernel.

    The trainer never reads back what it writes; a multi-GB checkpoint left in the page cache evicts
    the dataset's arrays, and on the VM measured by bench_checkpoint the next save then faulted in
    fresh pages: the write phase used up to 5x more CPU time without this.
    """
    if hasattr(os, "posix_fadvise"):
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)


def atomic_write(final: Path, write: Writer, *, before_rename: Callable[[], None] | None = None) -> None:
    """Call `write(handle)` on a temp file, fsync, rename over `final`, fsync the directory.

    `before_rename` runs with the temp file complete on disk (crash tests hook in there). On any
    failure the temp file is removed and `final` is untouched.
    """
    final = Path(final)
    tmp = temp_name(final)
    # A temp of this name that a killed writer of the same PID left (containers reuse PIDs) is ours and
    # is reused; a link, FIFO or hard link under it is not, and is neither written through nor removed.
    try:
        fd = open_own(tmp, os.O_WRONLY | os.O_CREAT)
    except NotOwnFile:  # what is in the way is that name
        raise
    except OSError as exc:
        raise OSError(exc.errno, exc.strerror, str(final)) from exc  # a read-only or full disk: the file the user knows
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.truncate(0)
            write(handle)
            handle.flush()
            os.fsync(handle.fileno())
            drop_cached_pages(handle.fileno())
        if before_rename is not None:
            before_rename()
        os.replace(tmp, final)
    except OSError as exc:
        _remove(tmp)
        if exc.filename is None or os.fsdecode(exc.filename) == str(tmp):  # a full disk's write() names no file
            raise OSError(exc.errno, exc.strerror, str(final)) from exc  # the file the user knows
        raise
    except BaseException:
        _remove(tmp)
        raise
    fsync_dir(final.parent)


def _remove(tmp: Path) -> None:
    """Remove a failed write's temp file; on a read-only disk there is none, and unlink fails (EROFS)."""
    try:
        tmp.unlink(missing_ok=True)
    except OSError:
        pass  # the write's own error is the one to report


def atomic_write_bytes(final: Path, data: bytes) -> None:
    atomic_write(final, lambda handle: handle.write(data))


def atomic_write_text(final: Path, text: str) -> None:
    atomic_write_bytes(final, text.encode("utf-8"))


def link_or_copy(source: Path, dest: Path) -> None:
    """`dest`, a new name, becomes a complete copy of `source`: a hard link, or a synced copy where the
    file system has no links. A `dest` that exists (a file, a link) is never written: FileExistsError."""
    try:
        os.link(source, dest)
    except FileExistsError:
        raise
    except OSError:
        with open(source, "rb") as src, open(dest, "xb") as dst:
            shutil.copyfileobj(src, dst, 16 * 2**20)
            dst.flush()
            os.fsync(dst.fileno())
