"""Checkpoints: atomic save, safe load, verify, find the newest complete one, rotate.

The promise is that a trainer killed at any instant (kill -9 mid-save included) resumes bit-exactly
with `--resume auto`. This module is the storage half of it:

- a checkpoint is written to a temp file, fsynced, renamed into place and the directory fsynced;
  `latest.pth` moves (hard link, or copy) only after that, and rotation deletes old files last, so
  every name on disk always refers to a complete file;
- files are read with `torch.load(weights_only=True)`, so a checkpoint from a stranger cannot run
  code, and the zip CRC-32 of every member is checked first, because torch itself does not notice a
  flipped byte inside tensor data;
- nothing that fails to verify is ever deleted or renamed: `--resume auto` says what it skipped.

The layout, its checks and its migrations belong to state.py; this module stores and finds files.
"""

from __future__ import annotations

import errno
import io
import json
import os
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO

import torch

from indextts_train.checkpoint.adapter_file import adapter_verdict, is_adapter_file
from indextts_train.checkpoint.reader import (  # noqa: F401  (re-exported: callers import them from here)
    _first_line,
    _read,
    config_for,
    load_checkpoint,
    read_unchecked,
)
from indextts_train.checkpoint.state import (  # noqa: F401  (FORMAT_VERSION: re-exported for callers)
    FORMAT,
    FORMAT_VERSION,
    migrate,
    model_problem,
    nonfinite_problem,
    repaired_unknown,
    unsafe_value,
    validate,
)
from indextts_train.config.family import family_of_keys
from indextts_train.config.schema import is_int
from indextts_train.errors import CheckpointError, UserError
from indextts_train.files.atomic import atomic_write as atomic_write_file
from indextts_train.files.atomic import fsync_dir, link_or_copy, temp_name
from indextts_train.files.faults import crash_armed, crash_point
from indextts_train.model.layout import (
    clean_keys,
)

LATEST = "latest.pth"
BEST = "best.pth"  # the lowest validation metric so far (best.py decides); never rotated
EXIT_CODES = {"COMPLETE": 0, "PARTIAL": 1, "INCOMPLETE": 2}

_STEP_FILE = re.compile(r"^model_step(\d+)\.pth$")
_TEMP_FILE = re.compile(r"^\.(model_step\d+|latest|best)\.pth\.tmp-\d+$")  # only names this module writes


class CheckpointSaveError(UserError):
    """A save that did not happen (disk full, ...); the previous checkpoints are untouched."""


class ProtectedNameError(CheckpointSaveError):
    """A save whose file name belongs to a file the run must not touch (it could not verify it)."""


class NonFiniteStateError(Exception):
    """A state with a NaN/Inf weight or optimizer tensor: refused before anything touches the disk."""


# ----------------------------------------------------------------------------- verify


@dataclass
class Verdict:
    """What `verify` says about one file. exit_code: 0 COMPLETE, 1 PARTIAL, 2 INCOMPLETE."""

    status: str  # COMPLETE | PARTIAL | INCOMPLETE
    kind: str  # indextts-train | community | gpt.pth | unknown
    reasons: list[str] = field(default_factory=list)
    summary: dict = field(default_factory=dict)

    @property
    def exit_code(self) -> int:
        return EXIT_CODES[self.status]

    def to_dict(self) -> dict:
        """JSON-ready (`verify --json`)."""
        return json.loads(json.dumps({"status": self.status, "kind": self.kind, "exit_code": self.exit_code,
                                      "reasons": self.reasons, "summary": self.summary}, default=str))


def _kind(obj: Any) -> str:
    if not isinstance(obj, dict):
        return "unknown"
    if obj.get("format") == FORMAT:
        return "indextts-train"
    if is_adapter_file(obj):
        return "adapters"
    if isinstance(obj.get("model"), dict) and {"optimizer", "step", "epoch"} & obj.keys():
        return "community"
    weights = obj["model"] if set(obj) == {"model"} else obj  # IndexTTS2 also accepts {"model": sd}
    if isinstance(weights, dict) and weights and all(isinstance(v, torch.Tensor) for v in weights.values()):
        return "gpt.pth"
    return "unknown"


def is_training_checkpoint(path: Path) -> bool:
    """Whether `path` holds a training state (ours or a community one): by its name, else by its contents."""
    path = Path(path)
    if path.name in (LATEST, BEST) or _step_of(path) is not None:
        return True
    try:
        return _kind(read_unchecked(path)) in ("indextts-train", "community")
    except CheckpointError:
        return False


def ignored_by_base_checkpoint(path: Path, obj: Any) -> str | None:
    """What --base-checkpoint leaves out when `obj` is a training checkpoint (ours or community), else None."""
    kind = _kind(obj)
    if kind not in ("indextts-train", "community"):
        return None
    progress = obj.get("progress") if kind == "indextts-train" else obj
    step = progress.get("step") if isinstance(progress, dict) else None
    at = f" at step {step}" if is_int(step) else ""
    return (f"--base-checkpoint {path} is a training checkpoint{at}: only its weights are used; its optimizer "
            "state and position are ignored and this run starts at step 0 (to continue that run instead, "
            "pass it as --resume)")


def _weights(obj: dict, kind: str) -> Any:
    return obj if kind == "gpt.pth" and "model" not in obj else obj.get("model")


def _summary(obj: dict, kind: str, path: Path) -> dict:
    weights = _weights(obj, kind)
    tensors = list(weights.values()) if isinstance(weights, dict) else []
    sizes = {"file_bytes": path.stat().st_size, "tensors": len(tensors),
             "params": sum(t.numel() for t in tensors if isinstance(t, torch.Tensor))}
    found = family_of_keys(clean_keys(weights).state) if isinstance(weights, dict) else None
    family = "unknown" if found is None else found.name  # IndexTTS2 or IndexTTS-2.5, from the weights' keys
    if kind == "community":
        return {"step": obj.get("step"), "epoch": obj.get("epoch"), "family": family, "sizes": sizes}
    if kind != "indextts-train":
        return {"family": family, "sizes": sizes}
    progress = obj.get("progress") if isinstance(obj.get("progress"), dict) else {}
    hparams = obj.get("hparams") if isinstance(obj.get("hparams"), dict) else {}
    summary = {k: progress.get(k) for k in ("step", "epoch", "samples_in_epoch", "samples_total")}
    summary.update(family=family, vocab_plan=obj.get("vocab_plan"), precision=hparams.get("precision"),
                   hardware=obj.get("hardware"), hparams=hparams, created=obj.get("created"),
                   format_version=obj.get("format_version"), sizes=sizes)
    return summary


def _community_reasons(obj: dict) -> list[str]:
    have = [k for k in ("optimizer", "scheduler", "scaler", "step", "epoch") if obj.get(k) is not None]
    return [f"community train_gpt_v2.py checkpoint with {', '.join(['model', *have])}",
            "lacks RNG states, the sample position in the epoch, loss history, config and vocab plan, "
            "so it cannot resume exactly; `indextts-train repair` converts it"]


def verify_checkpoint(path: Path) -> Verdict:
    """COMPLETE (exact resume possible), PARTIAL (weights usable, resume state missing) or INCOMPLETE."""
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
    return migrate(obj) if obj.get("format") == FORMAT else obj  # not INCOMPLETE: a dict


def _read_and_verify(path: Path) -> tuple[Any, Verdict]:
    """The file's objects (None when unreadable) and verify_checkpoint's verdict on them."""
    try:
        obj = _read(path, mmap=True)  # mmap: shapes and types are enough, tensor data stays on disk
    except CheckpointError as exc:
        return None, Verdict("INCOMPLETE", "unknown", [str(exc)])
    return obj, _verdict(obj, path)


def _verdict(obj: Any, path: Path) -> Verdict:
    """verify_checkpoint's verdict on what `path` held."""
    kind = _kind(obj)
    if kind == "unknown":
        what = f"a dict with keys {sorted(map(str, obj))[:8]}" if isinstance(obj, dict) else f"a {type(obj).__name__}"
        return Verdict("INCOMPLETE", kind, [f"{path} is not a checkpoint: it holds {what}"])
    if kind == "adapters":
        status, reasons, summary = adapter_verdict(obj)
        return Verdict(status, kind, reasons, summary)
    summary = _summary(obj, kind, path)
    optimizer = obj.get("optimizer") if kind != "gpt.pth" else None
    problem = model_problem(_weights(obj, kind)) or nonfinite_problem(_weights(obj, kind), optimizer)
    if problem:
        return Verdict("INCOMPLETE", kind, [f"no usable weights: {problem}"], summary)
    if kind == "community":
        return Verdict("PARTIAL", kind, _community_reasons(obj), summary)
    if kind == "gpt.pth":
        return Verdict("PARTIAL", kind, ["bare gpt.pth weights: no optimizer, scheduler, RNG or progress; "
                                         "use it as --base-checkpoint to start a run"], summary)
    stored_version = obj.get("format_version")
    problems = validate(migrate(obj))
    if problems:
        return Verdict("PARTIAL", kind, problems, summary)
    notes = [] if stored_version == FORMAT_VERSION else [
        f"format {stored_version}, read through the migration to format {FORMAT_VERSION}"]
    if isinstance(obj.get("repaired"), dict):
        unknown = ", ".join(map(str, repaired_unknown(obj))) or "nothing"
        notes.append(f"repaired from a {obj['repaired'].get('from')} checkpoint; filled in, not known: {unknown}")
    return Verdict("COMPLETE", kind, notes, summary)


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


def publish(output_dir: Path, target: Path, name: str, protected: frozenset[str] = frozenset()) -> None:
    """Atomically make `output_dir/name` (latest.pth, best.pth) the complete file `target`.

    A `protected` name that is the only name of a file this run could not verify is left as it is.
    """
    published = output_dir / name
    if not _replaceable(published, protected):
        return
    tmp = temp_name(published)
    try:
        link_or_copy(target, tmp)
        os.replace(tmp, published)
    finally:
        # Also covers rename(2) between two links of one inode, which succeeds without removing tmp.
        tmp.unlink(missing_ok=True)
    fsync_dir(output_dir)


def _step_of(path: Path) -> int | None:
    match = _STEP_FILE.match(path.name)
    return int(match.group(1)) if match else None


def list_checkpoints(output_dir: Path) -> list[Path]:
    """Checkpoint files in `output_dir`: model_step*.pth oldest step first, then latest.pth if present."""
    output_dir = Path(output_dir)
    if not output_dir.is_dir():
        return []
    steps = sorted((p for p in output_dir.iterdir() if _step_of(p) is not None and p.is_file()), key=_step_of)
    latest = output_dir / LATEST
    return steps + [latest] if latest.is_file() else steps


def same_file(a: Path, b: Path) -> bool:
    """Whether `a` and `b` are one file (hard links included); False when either is missing."""
    try:
        return os.path.samefile(a, b)
    except OSError:
        return False


def _latest_target(output_dir: Path) -> Path | None:
    """The model_step file latest.pth is a hard link of, if any."""
    latest = output_dir / LATEST
    steps = [p for p in list_checkpoints(output_dir) if p.name != LATEST]
    return next((p for p in steps if same_file(p, latest)), None) if latest.is_file() else None


def is_milestone(step: int, keep_every: int) -> bool:
    """Whether the checkpoint of `step` stays out of rotation (`--keep-every N`; 0 = none)."""
    return keep_every > 0 and step > 0 and step % keep_every == 0


def step_file_of(path: Path) -> Path | None:
    """The model_step{N}.pth that `path` is (itself, or the file latest.pth is a hard link of), if any."""
    if _step_of(path) is not None:
        return path
    return _latest_target(path.parent) if path.name == LATEST else None


def _rotate(output_dir: Path, keep: int, newest: Path, keep_every: int = 0,
            protected: frozenset[str] = frozenset(), own: Callable[[Path], bool] | None = None) -> None:
    """Delete the oldest of this run's model_step files beyond `keep`.

    Only files `own` accepts (the current branch's, lineage.owned_by; every file when None). Never
    `newest`, latest.pth's target, a milestone (kept aside: it does not count toward `keep` either),
    nor a `protected` name (a file the run could not verify or did not write: the user's, not ours to
    rotate). best.pth is a name of its own (a hard link), so deleting its step file never removes it.
    """
    steps = [p for p in list_checkpoints(output_dir) if p.name != LATEST and p.name not in protected
             and not is_milestone(_step_of(p), keep_every) and (own is None or own(p))]
    spared = {newest, _latest_target(output_dir)}
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
    previous = _latest_target(output_dir)
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
    temp file and raises CheckpointSaveError. `protected` names (resume.untouchable_names) are never
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


# ----------------------------------------------------------------------------- find


def find_resume_checkpoint(ordered: list[Path]) -> tuple[Path | None, list[tuple[Path, str]]]:
    """The first of `ordered` that verifies COMPLETE, and what was skipped before it, with why.

    `ordered` is lineage.resume_order's: the newest branch first, its highest step first (latest.pth
    before its twin), files that cannot be read first of all. Skipped files stay on disk untouched.
    """
    skipped: list[tuple[Path, str]] = []
    failures: dict[Path, str] = {}
    for path in ordered:
        twin = next((bad for bad in failures if same_file(path, bad)), None)
        if twin is not None:  # a hard link of a file that already failed
            skipped.append((path, f"same file as {twin.name}, {failures[twin]}"))
            continue
        verdict = verify_checkpoint(path)
        if verdict.status == "COMPLETE":
            return path, skipped
        failures[path] = reason = f"{verdict.status}: {'; '.join(verdict.reasons)}"
        skipped.append((path, reason))
    return None, skipped
