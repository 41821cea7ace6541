"""Verifying a checkpoint file, and choosing the one `--resume` continues from.

Verification is one pipeline: the file is read safely (reader.py: bounds, zip CRC, no pickled code,
a state dict's structure), then its kind decides the verdict (kinds.py: COMPLETE, PARTIAL or
INCOMPLETE, with reasons). Resuming and loading need the verdict alone (`verdict_of`); `verify` prints
a summary too (`verify_checkpoint`). `--resume auto` takes the first candidate, in lineage order, that
verifies, and `--resume PATH` a file that does (`choose_resume`, which reads the chosen file once, in
full); nothing that fails to verify is ever deleted or renamed.
"""

from __future__ import annotations

import dataclasses
import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from indextts_train.checkpoint.adapter_file import is_adapter_file
from indextts_train.checkpoint.kinds import Verdict, judge, kind_of, summary_of
from indextts_train.checkpoint.reader import _read, read_unchecked
from indextts_train.checkpoint.run_folder import BEST, LATEST, step_of
from indextts_train.checkpoint.state import FORMAT, migrate
from indextts_train.config.schema import is_int
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
    # The summary first: judging a file of our format migrates its dict in place. Its text is the file's: a
    # crafted `created` or `precision` holding escape sequences or line breaks is printed escaped, never run
    # by the terminal (containers print as their repr, which escapes already).
    summary = {key: one_line(value) if isinstance(value, str) else value
               for key, value in summary_of(obj, kind_of(obj), path).items()}
    return _judged(obj, path, summary)


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
    return obj, _judged(obj, path, {})


def _judged(obj: Any, path: Path, summary: dict) -> Verdict:
    """kinds.judge's verdict, and a COMPLETE file of ours PARTIAL when torch could not load the values it holds."""
    verdict = judge(obj, path, summary)
    if verdict.status != "COMPLETE" or verdict.kind != "indextts-train":
        return verdict
    problems = resume_value_problems(obj)
    return dataclasses.replace(verdict, status="PARTIAL", reasons=problems) if problems else verdict


# The values an exact resume hands to torch, which state.py's structural checks do not read: a crafted or
# hand-edited file with `lr: 'x'` in a param group, moments of another shape or a scheduler's `last_epoch` of
# -7 would load, then fail steps later with a traceback (or quietly train on another schedule).
_GROUP_NUMBERS = ("lr", "initial_lr", "eps", "weight_decay")
_GROUP_FLAGS = ("amsgrad", "maximize", "foreach", "capturable", "differentiable", "fused", "decoupled_weight_decay")
MAX_STEP = 1 << 40  # as --max-steps' upper end: no run reaches a step beyond it


def _finite(value: Any, least: float = 0.0) -> bool:
    """A finite real number (a 0-dim float tensor too, as torch may store a learning rate) of at least `least`."""
    if isinstance(value, torch.Tensor):
        value = value.item() if value.dim() == 0 and value.is_floating_point() else None
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) and value >= least


def resume_value_problems(state: dict) -> list[str]:
    """Why torch could not resume from the values of a (migrated, structurally valid) checkpoint of ours."""
    model = state["model"]
    odd = next((k for k, v in model.items() if v.dtype != torch.float32), None)
    if odd is not None:
        return [f"model: {odd!r} is {model[odd].dtype}; an exact resume needs float32 weights"]
    step = state["progress"]["step"]
    if step > MAX_STEP:
        return [f"progress: step {step:,} is beyond any run (at most {MAX_STEP:,})"]
    if state["optimizer"] is None:  # a repaired file whose optimizer could not be recovered: none to load
        return []
    problem = optimizer_value_problem(state)
    return [problem] if problem else []


def optimizer_value_problem(state: dict) -> str | None:
    """Why torch could not load a structurally valid optimizer set (state.optimizer_problems passes it)."""
    groups = state["optimizer"]["param_groups"]
    return _group_problem(groups) or _moments_problem(state) or _scheduler_problem(state["scheduler"], len(groups))


def _group_problem(groups: list[dict]) -> str | None:
    ids = [p for group in groups for p in group["params"]]
    if not all(is_int(p) for p in ids) or len(set(ids)) != len(ids):
        return "optimizer: param_groups' params are not distinct parameter numbers"
    for i, group in enumerate(groups):
        bad = next((k for k in _GROUP_NUMBERS if k in group and not _finite(group[k])), None)
        if bad is not None:
            return f"optimizer: param_groups[{i}].{bad} is {group[bad]!r}, not a finite number >= 0"
        betas = group.get("betas", (0.0, 0.0))
        if not (isinstance(betas, (list, tuple)) and len(betas) == 2 and all(_finite(b) and b < 1 for b in betas)):
            return f"optimizer: param_groups[{i}].betas is {betas!r}, not two numbers in [0, 1)"
        flag = next((k for k in _GROUP_FLAGS if k in group and group[k] not in (True, False, None)), None)
        if flag is not None:
            return f"optimizer: param_groups[{i}].{flag} is {group[flag]!r}, not true or false"
    return None


def _moments_problem(state: dict) -> str | None:
    """Each parameter's AdamW state: a step count, and moments of its parameter's shape in float32."""
    optimizer, names = state["optimizer"], state["optimizer_param_names"]
    ids = [p for group in optimizer["param_groups"] for p in group["params"]]
    adapters = (state.get("lora") or {}).get("adapters") or {}
    shapes = {name: tensor.shape for name, tensor in (*state["model"].items(), *adapters.items())}
    for key, moments in optimizer["state"].items():
        if key not in ids or not isinstance(moments, dict):
            return f"optimizer: state[{key!r}] is not the state of one of its parameters"
        name = names[ids.index(key)]
        for what, value in moments.items():
            shown = f"{value.dtype} {list(value.shape)}" if isinstance(value, torch.Tensor) else repr(value)[:40]
            if what == "step" and not _finite(value):
                return f"optimizer: state of {name!r}: step is {shown}, not a step count"
            wanted = list(shapes.get(name, getattr(value, "shape", ())))
            if what != "step" and not (isinstance(value, torch.Tensor) and value.dtype == torch.float32
                                       and list(value.shape) == wanted):
                return f"optimizer: state of {name!r}: {what} is {shown}, not float32 {wanted} as its parameter"
    return None


def _scheduler_problem(scheduler: dict, groups: int) -> str | None:
    for key in ("last_epoch", "_step_count"):
        if key in scheduler and not (is_int(scheduler[key]) and scheduler[key] >= 0):
            return f"scheduler: {key} is {scheduler[key]!r}, not a step count"
    for key in ("base_lrs", "_last_lr"):
        values = scheduler.get(key, [0.0] * groups)
        if not (isinstance(values, list) and len(values) == groups and all(map(_finite, values))):
            return f"scheduler: {key} is {values!r}, not one learning rate per param group"
    lambdas = scheduler.get("lr_lambdas", [None] * groups)
    if not (isinstance(lambdas, list) and len(lambdas) == groups and all(v is None or isinstance(v, dict)
                                                                         for v in lambdas)):
        return f"scheduler: lr_lambdas is {lambdas!r}, not one entry per param group"
    return None


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
