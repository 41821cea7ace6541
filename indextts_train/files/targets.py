"""Where a command may write what the user names: the checks every writer makes before any work.

A file the user names is never replaced unless they say so (`--force`), and a symbolic link is never
followed to write its target: the write replaces the name itself (atomic.py renames over it), so a
link counts as an existing file. A folder the user names must be a folder, or not exist yet under a
folder. Each check is one line naming the flag and the path; nothing is created before they pass.
"""

from __future__ import annotations

import os
from pathlib import Path

from indextts_train.errors import UserError


def _occupied(path: Path) -> bool:
    """Something is at `path`: a file, a folder, or a link (a dangling one too)."""
    return path.is_symlink() or path.exists()


def same_path(a: Path | str, b: Path | str) -> bool:
    """Whether two paths name one place, links followed as far as they go (a link loop is no error here:
    it names itself, and the writer's checks say what is wrong with it)."""
    return os.path.realpath(a) == os.path.realpath(b)


def check_parent(flag: str, path: Path) -> None:
    """The nearest existing folder above `path` must be a folder (not a file named like one)."""
    existing = next((p for p in path.absolute().parents if p.exists() or p == p.parent), None)
    if existing is not None and not existing.is_dir():  # None: `path` is the root, above which is nothing
        raise UserError(f"{flag} {path}: {existing} is a file, not a folder; choose another path")


def check_new_file(flag: str, path: Path, *, force: bool) -> None:
    """`path` may be written: not a folder, not under a file, and not existing unless `force`."""
    if path.is_dir():
        raise UserError(f"{flag} {path} is a folder; give the path of the file to write")
    check_parent(flag, path)
    if _occupied(path) and not force:
        kind = "is a symbolic link (the write would replace the link, never its target)" if path.is_symlink() \
            else "already exists"
        raise UserError(f"{flag} {path} {kind}; pass --force to replace it, or choose another path")


def check_output_folder(flag: str, path: Path) -> None:
    """`path` is, or can become, a folder: not a file, not under a file."""
    if _occupied(path) and not path.is_dir():
        raise UserError(f"{flag} {path} is a file, not a folder; give a folder path")
    check_parent(flag, path)


def make_output_folder(flag: str, path: Path) -> None:
    """Create the folder `path` (checked by check_output_folder), or say in one line why it cannot be."""
    check_output_folder(flag, path)
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise UserError(f"{flag} {path}: cannot create it ({exc.strerror or exc}); choose another folder") from None


def writer_gone(temp: Path) -> bool:
    """Whether the writer of a temp file (`.NAME.tmp-PID`, atomic.temp_name) has stopped: a kill left it, so
    it may go. A writer still running (or a name of another form) keeps its file."""
    pid = temp.name.rsplit(".tmp-", 1)[-1]
    if not pid.isdigit():
        return False
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return True
    except PermissionError:  # another user's process
        pass
    return False
