"""Verifying a checkpoint file, and choosing the one `--resume` continues from.

Verification is one pipeline: the file is read safely (reader.py: bounds, zip CRC, no pickled code,
a state dict's structure), then its kind decides the verdict (kinds.py: COMPLETE, PARTIAL or
INCOMPLETE, with reasons). Resuming and loading need the verdict alone (`verdict_of`); `verify` prints
a summary too (`verify_checkpoint`). `--resume auto` takes the first candidate, in lineage order, that
verifies, and `--resume PATH` a file that does (`choose_resume`, which reads the chosen file once, in
full); nothing that fails to verify is ever deleted or renamed.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from indextts_train.checkpoint.adapter_file import is_adapter_file
from indextts_train.checkpoint.kinds import Verdict, judge, kind_of, summary_of
from indextts_train.checkpoint.reader import _read, read_unchecked
from indextts_train.checkpoint.run_folder import BEST, LATEST, step_of
from indextts_train.checkpoint.state import FORMAT, migrate
from indextts_train.errors import CheckpointError, ListedError, UserError, one_line


def is_training_checkpoint(path: Path) -> bool:
    """Whether `path` holds a training state (ours or a community one): by its name, else by its contents."""
    path = Path(path)
    if path.name in (LATEST, BEST) or step_of(path) is not None:
        return True
    try:
        return kind_of(read_unchecked(path)) in ("indextts-train", "community")
    except CheckpointError:
        return False


def verify_checkpoint(path: Path) -> Verdict:
    """COMPLETE (exact resume possible), PARTIAL (weights usable, resume state missing) or INCOMPLETE,
    with the summary of what the file holds that `verify` prints."""
    path = Path(path)
    try:
        obj = _read(path, mmap=True)  # mmap: shapes and types are enough, tensor data stays on disk
    except CheckpointError as exc:  # a folder or no file at all is said as such, not as a damaged checkpoint
        return Verdict("INCOMPLETE", "unknown" if path.is_file() else "not a file", [str(exc)])
    # The summary first: judging a file of our format migrates its dict in place.
    return judge(obj, path, summary_of(obj, kind_of(obj), path))


def verdict_of(path: Path) -> Verdict:
    """verify_checkpoint's status and reasons, without the summary: what choosing a file to resume needs."""
    return _read_and_verify(Path(path))[1]


def load_verified(path: Path) -> dict:
    """The one read of a checkpoint whose weights a command uses (export, evaluate).

    verify_checkpoint's checks (CRC, no pickled code, usable finite weights), an INCOMPLETE file
    refused with its one-line reason, then what `load_checkpoint(path, mmap=True)` returns: tensor
    data stays on disk until touched, so the callers share it without reading the file again.
    """
    path = Path(path)
    obj, verdict = _read_and_verify(path)
    if verdict.status == "INCOMPLETE":
        reason = verdict.reasons[0]
        raise CheckpointError(reason if str(path) in reason else f"{path}: {reason}")
    if is_adapter_file(obj):  # complete as what it is, but no model: the advice for a bare file would mislead
        raise CheckpointError(f"{path} is an adapters file (export --adapters-out: the adapters alone, without the "
                              "weights they apply to); pass the run's checkpoint, which holds both")
    return migrate(obj) if obj.get("format") == FORMAT else obj  # not INCOMPLETE: a dict


def _read_and_verify(path: Path, *, mmap: bool = True) -> tuple[Any, Verdict]:
    """The file's objects (None when unreadable) and the verdict on them, without a summary.

    `mmap` False reads the tensor data into memory: the file a run resumes from is read once, here."""
    try:
        obj = _read(path, mmap=mmap)
    except CheckpointError as exc:
        return None, Verdict("INCOMPLETE", "unknown", [str(exc)])
    return obj, judge(obj, path, {})


@dataclass(frozen=True)
class Choice:
    """The file `--resume` continues from (None: none), read and migrated, and the files skipped before it."""

    path: Path | None
    state: dict | None  # the chosen file in full (tensor data in memory), migrated by its verification
    skipped: list[tuple[Path, str]]  # each with why; left on disk untouched
    unknown: list[str]  # what a repair could not tell about the chosen file (its verdict's)


def choose_resume(candidates: list[Path], *, named: bool = False, folder: Path | None = None) -> Choice:
    """The first of `candidates` that verifies COMPLETE, read once, and what was skipped before it.

    For --resume auto, `candidates` are lineage.resume_order's: the newest branch first, its highest
    step first (latest.pth before its twin), files that cannot be read first of all. For --resume PATH
    (`named`) the one file, refused with its reasons when it does not verify. With the run `folder`
    they come from, a folder that holds checkpoints none of which resumes is refused: starting fresh
    there would rotate them away.
    """
    skipped: list[tuple[Path, str]] = []
    failed: dict[tuple[int, int], tuple[Path, str]] = {}  # a file's identity: its first name tried, and why
    for path in candidates:
        if named and not path.is_file():
            raise UserError(f"--resume {path}: no such checkpoint file; use --resume auto to pick the newest one")
        identity = _identity(path)
        if identity in failed:  # a hard link of a file that already failed
            twin, reason = failed[identity]
            skipped.append((path, f"same file as {twin.name}, {reason}"))
            continue
        obj, verdict = _read_and_verify(path, mmap=False)
        if verdict.status == "COMPLETE":
            return Choice(path, obj, skipped, verdict.unknown)
        reason = f"{verdict.status}: {'; '.join(verdict.reasons)}"
        if named:  # a community file's reasons already say to repair it, and repair cannot turn bare
            # weights into a run: only our own partial files get the hint
            ours = verdict.status == "PARTIAL" and verdict.kind == "indextts-train"
            raise UserError(f"--resume {path}: {reason}" + ("; `indextts-train repair` can convert it" if ours else ""))
        if identity is not None:
            failed[identity] = path, reason
        skipped.append((path, reason))
    if folder is not None and skipped:
        raise _refuse_fresh_start(folder, skipped)
    return Choice(None, None, skipped, [])


def _what_to_do(path: Path, reason: str) -> str:
    if "format_version" in reason and "newer" in reason:
        return "written by a newer indextts-train: resume it with that version"
    if "PARTIAL:" in reason:
        return f"convert it with `indextts-train repair {path}` (a .bak backup is kept), then rerun"
    return "it cannot be used; keep it, or remove it yourself if you do not need it"


def _refuse_fresh_start(folder: Path, skipped: list[tuple[Path, str]]) -> UserError:
    """--resume auto found checkpoints in `folder` but none resumes (`skipped`: each with its reason)."""
    lines = [f"--resume auto: {one_line(str(folder))} holds checkpoints but none of them can resume this run, so "
             "nothing was started and no file was changed:"]
    for path, reason in skipped:  # a line each: a line break in a name or a reason is escaped, not a new line
        short = reason if len(reason) <= 200 else reason[:200] + "..."
        lines.append(one_line(f"  {path}: {short}; {_what_to_do(path, reason)}"))
    lines.append("  or start a new run with another --output-dir")
    return ListedError("\n".join(lines))


def _identity(path: Path) -> tuple[int, int] | None:
    """(device, inode): the same for every hard link of one file; None when it cannot be read."""
    try:
        stat = os.stat(path)
    except OSError:
        return None
    return stat.st_dev, stat.st_ino
