"""Checkpoints: atomic save, publish latest.pth/best.pth, rotate.

The promise is that a trainer killed at any instant (kill -9 mid-save included) resumes bit-exactly
with `--resume auto`. This module is the storage half of it:

- a checkpoint is written to a temp file, fsynced, renamed into place and the directory fsynced;
  `latest.pth` moves (hard link, or copy) only after that, and rotation deletes old files last, so
  every name on disk always refers to a complete file;
- a file this run must not touch (`protected`: it could not verify it, or did not write it) is never
  written, replaced or deleted.

Reading a file safely is reader.py's, verifying it and choosing the one to resume verify.py's, the
run folder's names and listing run_folder.py's; the layout, its checks and its migrations state.py's.
"""

from __future__ import annotations

import errno
import io
import os
import re
from collections.abc import Callable
from pathlib import Path
from typing import BinaryIO

import torch

from indextts_train.checkpoint.reader import (  # noqa: F401  (re-exported: callers import them from here)
    _first_line,
    config_for,
    load_checkpoint,
    read_unchecked,
)
from indextts_train.checkpoint.run_folder import BEST, LATEST, latest_target, list_checkpoints, step_of
from indextts_train.checkpoint.state import (  # noqa: F401  (FORMAT_VERSION: re-exported for callers)
    FORMAT,
    FORMAT_VERSION,
    nonfinite_problem,
    unsafe_value,
    validate,
)
from indextts_train.errors import CheckpointError, UserError  # noqa: F401  (CheckpointError: re-exported)
from indextts_train.files.atomic import atomic_write as atomic_write_file
from indextts_train.files.atomic import fsync_dir, link_or_copy, temp_name
from indextts_train.files.faults import crash_armed, crash_point

_TEMP_FILE = re.compile(r"^\.(model_step\d+|latest|best)\.pth\.tmp-\d+$")  # only names this module writes


class CheckpointSaveError(UserError):
    """A save that did not happen (disk full, ...); the previous checkpoints are untouched."""


class ProtectedNameError(CheckpointSaveError):
    """A save whose file name belongs to a file the run must not touch (it could not verify it)."""


class NonFiniteStateError(Exception):
    """A state with a NaN/Inf weight or optimizer tensor: refused before anything touches the disk."""


# ----------------------------------------------------------------------------- save


def write_state(state: dict, final: Path, step: int) -> None:
    """torch.save `state` to `final` atomically (crash tests hook in: half a file, or a complete temp file)."""

    def write(handle: BinaryIO) -> None:
        if crash_armed("save_partial", step):  # crash tests: die with half the bytes on disk
            buffer = io.BytesIO()
            torch.save(state, buffer)
            handle.write(buffer.getvalue()[: buffer.tell() // 2])
            handle.flush()
            os.fsync(handle.fileno())
            crash_point("save_partial", step)
        torch.save(state, handle)

    atomic_write_file(final, write, before_rename=lambda: crash_point("save_tmp_written", step))


def _replaceable(published: Path, protected: frozenset[str]) -> bool:
    """`published` (latest.pth, best.pth) may move unless it is protected and the only name of its bytes."""
    if published.name not in protected or not published.exists():
        return True
    return os.stat(published).st_nlink > 1  # its twin model_step file keeps the bytes (protected too)


def kept_names(output_dir: Path, protected: frozenset[str]) -> frozenset[str]:
    """The names (latest.pth, best.pth) that publish leaves as they are in `output_dir`: files not ours."""
    return frozenset(name for name in (LATEST, BEST) if not _replaceable(Path(output_dir) / name, protected))


def publish(output_dir: Path, target: Path, name: str, protected: frozenset[str] = frozenset()) -> None:
    """Atomically make `output_dir/name` (latest.pth, best.pth) the complete file `target`.

    A `protected` name that is the only name of a file this run could not verify is left as it is.
    """
    published = output_dir / name
    if not _replaceable(published, protected):
        return
    tmp = temp_name(published)
    try:
        tmp.unlink(missing_ok=True)  # a killed publish of the same PID: the temp names are this module's
        link_or_copy(target, tmp)
        os.replace(tmp, published)
    finally:
        # Also covers rename(2) between two links of one inode, which succeeds without removing tmp.
        tmp.unlink(missing_ok=True)
    fsync_dir(output_dir)


def is_milestone(step: int, keep_every: int) -> bool:
    """Whether the checkpoint of `step` stays out of rotation (`--keep-every N`; 0 = none)."""
    return keep_every > 0 and step > 0 and step % keep_every == 0


def _rotate(output_dir: Path, keep: int, newest: Path, keep_every: int = 0,
            protected: frozenset[str] = frozenset(), own: Callable[[Path], bool] | None = None) -> None:
    """Delete the oldest of this run's model_step files beyond `keep`.

    Only files `own` accepts (the current branch's, lineage.owned_by; every file when None). Never
    `newest`, latest.pth's target, a milestone (kept aside: it does not count toward `keep` either),
    nor a `protected` name (a file the run could not verify or did not write: the user's, not ours to
    rotate), nor a symbolic link (this program writes files, never links: a link is the user's, even to
    a checkpoint of this branch). best.pth is a name of its own (a hard link), so deleting its step file
    never removes it.
    """
    steps = [p for p in list_checkpoints(output_dir) if p.name != LATEST and p.name not in protected
             and not p.is_symlink() and not is_milestone(step_of(p), keep_every) and (own is None or own(p))]
    spared = {newest, latest_target(output_dir)}
    for path in steps[:-keep]:
        if path not in spared:
            path.unlink(missing_ok=True)


def _remove_stale_temps(output_dir: Path) -> None:
    for path in output_dir.iterdir():
        if _TEMP_FILE.match(path.name):
            path.unlink(missing_ok=True)


def failure_reason(exc: BaseException) -> str:
    """A short cause; torch wraps the OSError of a failed write in a RuntimeError, so follow the chain."""
    seen: BaseException | None = exc
    while seen is not None:
        if isinstance(seen, OSError) and seen.errno in (errno.ENOSPC, errno.EDQUOT):
            return "disk full" if seen.errno == errno.ENOSPC else "disk quota exceeded"
        if isinstance(seen, OSError) and seen.strerror:
            return seen.strerror.lower()
        seen = seen.__cause__ or seen.__context__
    return _first_line(exc)


def _previous_description(output_dir: Path) -> str:
    previous = latest_target(output_dir)
    if previous is None and (output_dir / LATEST).is_file():
        previous = output_dir / LATEST
    if previous is None:
        steps = [p for p in list_checkpoints(output_dir) if p.name != LATEST]
        previous = steps[-1] if steps else None
    return f"the previous checkpoint {previous.name} is intact" if previous else "no earlier checkpoint exists"


def _check_state(state: dict, step: int) -> None:
    """A state the trainer built wrong is a bug: say which key, before anything touches the disk."""
    problems = validate(state) if state.get("format") == FORMAT else [f"format is not {FORMAT!r}"]
    unsafe = unsafe_value(state, "state")
    if unsafe:
        problems.append(f"{unsafe}, which torch.load(weights_only=True) refuses; store plain values")
    if not problems and state["progress"]["step"] != step:
        problems.append(f"progress.step is {state['progress']['step']} but the file is for step {step}")
    if problems:
        raise ValueError(f"checkpoint state for step {step} is invalid: {'; '.join(problems)}")
    nonfinite = nonfinite_problem(state["model"], state["optimizer"])
    if nonfinite:
        raise NonFiniteStateError(f"not saving step {step}: {nonfinite}")


def protected_name_error(output_dir: Path, step: int, protected: frozenset[str]) -> ProtectedNameError | None:
    """The error of a save of `step` whose file name is `protected` (a file this run must not touch), or None."""
    final = Path(output_dir) / f"model_step{step}.pth"
    if final.name not in protected:
        return None
    return ProtectedNameError(
        f"not saving step {step}: {final} is a file this run could not verify (or did not write), and it is "
        f"left untouched; move it out of {final.parent} and rerun with --resume auto "
        f"({_previous_description(final.parent)})")


def save_checkpoint(state: dict, output_dir: Path, step: int, *, keep: int, keep_every: int = 0,
                    best: bool = False, protected: frozenset[str] = frozenset(),
                    own: Callable[[Path], bool] | None = None) -> Path:
    """Publish `output_dir/model_step{step}.pth` atomically, point latest.pth (and best.pth when `best`) at
    it, then rotate to `keep`, sparing milestones (steps that are multiples of `keep_every`) and files
    `own` does not accept (another branch's: lineage.owned_by).

    best.pth moves before latest.pth: a kill in between resumes from the new step file (newer than
    latest.pth), whose history already names it best.

    A failure (disk full, ...) leaves every earlier checkpoint and latest.pth as they were, removes the
    temp file and raises CheckpointSaveError. `protected` names (checkpoint/manager.select_resume) are never
    written, replaced or deleted: a save under such a name raises ProtectedNameError before any write.
    """
    if keep < 1:
        raise UserError(f"--keep-checkpoints must be >= 1, got {keep}")
    _check_state(state, step)
    output_dir = Path(output_dir)
    final = output_dir / f"model_step{step}.pth"
    refused = protected_name_error(output_dir, step, protected)
    if refused is not None:
        raise refused
    try:
        output_dir.mkdir(parents=True, exist_ok=True)
        _remove_stale_temps(output_dir)
        write_state(state, final, step)
    except (OSError, RuntimeError) as exc:
        raise CheckpointSaveError(
            f"could not save checkpoint step {step} to {output_dir}: {failure_reason(exc)}; "
            f"{_previous_description(output_dir)}; free space or fix the directory, then rerun "
            "with --resume auto") from exc
    crash_point("save_before_latest", step)
    try:
        if best:
            publish(output_dir, final, BEST, protected)
        publish(output_dir, final, LATEST, protected)
        crash_point("save_before_rotate", step)
        _rotate(output_dir, keep, final, keep_every, protected, own)
    except OSError as exc:
        raise CheckpointSaveError(
            f"saved {final}, but could not update latest.pth/best.pth or remove old checkpoints: "
            f"{failure_reason(exc)}; --resume auto still finds the newest complete checkpoint") from exc
    return final
