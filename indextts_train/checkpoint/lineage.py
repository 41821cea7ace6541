"""Checkpoint lineage: which branch of a run a checkpoint belongs to, and what a new branch sets aside.

A rollback (`--resume RUN/model_step4.pth` on a run that reached step 8) starts a new branch. The
highest step on disk is then not the run's present: the present is the newest branch. So:

- every checkpoint records its branch, its parent and when the branch was born (state.Lineage);
- `--resume auto` tries the newest branch first, its highest step first (`resume_order`);
- rotation deletes only the current branch's own files (`owned_by`);
- before a new branch writes its first checkpoint, every file of ours that is not one of its
  ancestors is moved under `OUT/abandoned/<branch>/` (`set_aside`): kept, never deleted, and never
  overwritten by the new branch's files of the same step names. Until that first save nothing
  moves, so a rollback killed before it saved leaves the run as it was; a kill during the move
  leaves each file whole, in one place or the other (a hard link, then the old name removed).

Files this run must not touch (`protected`: not ours, or unreadable) are never moved.
"""

from __future__ import annotations

import errno
import os
import secrets
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from indextts_train.checkpoint.reader import read_unchecked
from indextts_train.checkpoint.run_folder import BEST, LATEST, RunFolder, list_checkpoints, same_file
from indextts_train.checkpoint.state import FORMAT, Lineage, is_branch_name
from indextts_train.config.schema import is_int
from indextts_train.errors import CheckpointError
from indextts_train.files.atomic import fsync_dir

ABANDONED = "abandoned"  # OUT/abandoned/<branch>/: the files of branches a rollback left
OLD_BRANCH = "before-lineage"  # the folder and name of the branch of files written before lineage
_UNREADABLE_FIRST = 1  # resume_order: files whose lineage cannot be read are tried (and reported) first


@dataclass(frozen=True)
class FileLineage:
    """What one checkpoint file says about its place in the run."""

    branch: str | None
    parent: str | None
    parent_step: int | None
    born: int
    step: int


_CACHE_ENTRIES = 1024
_cache: dict[tuple, FileLineage | None] = {}  # (path, inode, mtime, size) -> its lineage: files are read once


def _read_lineage(path: Path) -> FileLineage | None:
    try:
        obj = read_unchecked(path)  # tensor data stays on disk
    except CheckpointError:
        return None
    if not isinstance(obj, dict) or obj.get("format") != FORMAT:
        return None
    progress, record = obj.get("progress"), obj.get("lineage")
    step = progress.get("step") if isinstance(progress, dict) else None
    if not is_int(step):
        return None
    if Lineage.problems(record):  # written before lineage: one old branch, older than any other
        return FileLineage(None, None, None, 0, step)
    return FileLineage(record["branch"], record["parent"], record["parent_step"], record["born"], step)


def lineage_of(path: Path) -> FileLineage | None:
    """The lineage of our checkpoint at `path`; None when it is unreadable or not ours."""
    try:
        stat = os.stat(path)
    except OSError:
        return None
    key = (str(path), stat.st_ino, stat.st_mtime_ns, stat.st_size)
    if key not in _cache:
        if len(_cache) >= _CACHE_ENTRIES:  # a long run's saves: forget the old files' entries
            _cache.clear()
        _cache[key] = _read_lineage(Path(path))
    return _cache[key]


@dataclass(frozen=True)
class FolderLineage:
    """One look at a run folder's files, each read once for its lineage, and what follows from it."""

    order: list[Path]  # the checkpoints in the order --resume auto tries them (resume_order)
    foreign: frozenset[str]  # the names (best.pth included) not checkpoints of ours, or unreadable: a run
    # never replaces, moves or deletes them

    def continues(self, path: Path) -> bool:
        """Whether resuming `path` goes on with the folder's newest branch where it stands: `path` is (a copy of)
        the newest checkpoint of the newest branch, so the run starts no new branch."""
        here = lineage_of(path)
        head = next((info for p in self.order if (info := lineage_of(p)) is not None), None)
        return here is not None and head is not None and (here.branch, here.step, here.born) == (
            head.branch, head.step, head.born)


def look(folder: RunFolder) -> FolderLineage:
    """The lineage of every checkpoint-named file in `folder`: the order to resume in, and the names not ours."""
    return FolderLineage(resume_order(folder.checkpoints),
                         frozenset(path.name for path in folder.files if lineage_of(path) is None))


def new_branch(parent: Lineage | None = None, parent_step: int | None = None, *, continues: bool = False) -> Lineage:
    """A branch born now; `parent` is the Lineage of the checkpoint it starts from, if any.

    `continues`: its steps go on from `parent_step` (a rollback), so the parent's files up to that step
    are its ancestors; a reset run (step 0 again) continues nothing.
    """
    branch = f"{time.strftime('%Y%m%d-%H%M%S', time.gmtime())}-{secrets.token_hex(3)}"  # not the run's RNG
    forks = [*parent.forks, [parent.branch, parent_step]] if parent is not None and continues else []
    return Lineage(branch=branch, parent=parent.branch if parent is not None else None,
                   parent_step=parent_step if parent is not None else None, born=time.time_ns(), forks=forks)


def _order_key(path: Path) -> tuple:
    info = lineage_of(path)
    is_latest = int(path.name == LATEST)
    if info is None:  # unreadable: tried first, so that --resume auto says why it skipped it
        name_step = int(path.stem.removeprefix("model_step")) if path.name != LATEST else float("inf")
        return (_UNREADABLE_FIRST, 0, name_step, is_latest)
    return (0, info.born, info.step, is_latest)


def resume_order(checkpoints: Iterable[Path]) -> list[Path]:
    """A run folder's checkpoint files (run_folder.list_checkpoints) in the order --resume auto tries
    them: newest branch, highest step."""
    return sorted(checkpoints, key=_order_key, reverse=True)


def run_lineage(saved: Lineage | None, step: int, *, continues: bool, reset: bool) -> tuple[Lineage, bool]:
    """The lineage this run's checkpoints carry, and whether it is a new branch (set_aside before its
    first save). `saved` is the lineage of the checkpoint resumed from (at `step`), None for a fresh run;
    `continues`: the manager found that resuming it goes on with its branch (Resumed.continues)."""
    if saved is None:
        return new_branch(), True
    if reset:
        return new_branch(saved, step), True
    if continues:
        return Lineage(**saved.state_dict()), False
    return new_branch(saved, step, continues=True), True


def is_ancestor(info: FileLineage, lineage: Lineage) -> bool:
    """Whether the file is the current branch's own, or a step of a branch it continues (up to the fork)."""
    if info.branch == lineage.branch:
        return True
    return any(info.branch == branch and info.step <= step for branch, step in lineage.forks)


def owned_by(lineage: Lineage) -> Any:
    """The rotation rule of a branch: a file may be rotated away only when it is the branch's own."""
    def own(path: Path) -> bool:
        info = lineage_of(path)
        return info is not None and info.branch == lineage.branch

    return own


def _move_keeping(src: Path, folder: Path) -> Path:
    """Move `src` into `folder` under its name, or name.N.pth when that is taken: nothing is overwritten."""
    folder.mkdir(parents=True, exist_ok=True)
    for n in range(10_000):
        dest = folder / (src.name if n == 0 else f"{src.stem}.{n}{src.suffix}")
        if same_file(dest, src):  # an earlier, interrupted set-aside already linked it
            src.unlink()
            return dest
        try:
            os.link(src, dest)  # fails when dest exists: never clobbers
        except FileExistsError:
            continue
        except OSError as exc:
            if exc.errno not in (errno.EPERM, errno.ENOTSUP, errno.EOPNOTSUPP, errno.EMLINK):
                raise
            if dest.exists():
                continue
            os.rename(src, dest)  # no hard links here: we hold the run lock, nobody else writes dest
            return dest
        src.unlink()
        return dest
    raise OSError(errno.EEXIST, f"no free name for {src.name} in {folder}")


def not_ancestors(output_dir: Path, lineage: Lineage, protected: frozenset[str]) -> list[tuple[Path, FileLineage]]:
    """The checkpoints of ours in `output_dir` (best.pth included) that are not ancestors of `lineage`, each
    with its lineage: what `set_aside` moves, step files first."""
    best = output_dir / BEST
    paths = [p for p in [*reversed(list_checkpoints(output_dir)), *([best] if best.is_file() else [])]
             if p.name not in protected]
    paths.sort(key=lambda p: p.name in (LATEST, BEST))  # step files first: the names' twins are moved by then
    return [(path, info) for path in paths
            if (info := lineage_of(path)) is not None and not is_ancestor(info, lineage)]


def foreign_resume_note(resumed: Path, output_dir: Path, lineage: Lineage, protected: frozenset[str]) -> str | None:
    """A new branch resumed from `resumed` in another folder: the warning line when `output_dir` holds checkpoints
    of ours that its first save sets aside (None: nothing to set aside, or a rollback in the same folder, which
    is asked for in so many words). Counted as `set_aside` would move them now: a hard-link twin of a file it
    moves is only unlinked."""
    if resumed.resolve().is_relative_to(output_dir.resolve()):
        return None
    paths = [path for path, _ in not_ancestors(output_dir, lineage, protected)]
    count = sum(1 for i, path in enumerate(paths) if not any(same_file(other, path) for other in paths[:i]))
    if not count:
        return None
    return (f"--resume {resumed} is a checkpoint of another folder ({resumed.parent}): this run starts a new "
            f"branch in {output_dir}, and its first save sets the {count} checkpoint(s) already there aside "
            f"under {output_dir / ABANDONED}/ (kept, not deleted); pass --output-dir of a new folder to "
            "keep them in place")


def set_aside(output_dir: Path, lineage: Lineage, protected: frozenset[str]) -> list[tuple[Path, Path]]:
    """Move every checkpoint of ours in `output_dir` that is not an ancestor of `lineage` under
    abandoned/<its branch>/. Returns (from, to) pairs.

    A latest.pth or best.pth that is a hard link of a moved step file is only unlinked (its twin keeps
    the bytes, and an abandoned folder holds no name that looks current); one that is a file of its
    own is moved like the step files.
    """
    moved: list[tuple[Path, Path]] = []
    for path, info in not_ancestors(output_dir, lineage, protected):
        twin = next((dest for _, dest in moved if same_file(dest, path)), None)
        if twin is not None:
            path.unlink()
            continue
        branch = info.branch if is_branch_name(info.branch) else OLD_BRANCH  # read_lineage checked it too
        moved.append((path, _move_keeping(path, output_dir / ABANDONED / branch)))
    fsync_dir(output_dir)
    return moved


def describe_set_aside(moved: list[tuple[Path, Path]], lineage: Lineage) -> str:
    """The log line of a set-aside."""
    folders = sorted({str(dest.parent) for _, dest in moved})
    return (f"new branch {lineage.branch} (from {lineage.parent or OLD_BRANCH} at step {lineage.parent_step}): "
            f"{len(moved)} checkpoint(s) of the abandoned branch moved to {', '.join(folders)} "
            "(kept, never deleted)")
