"""Verifying a checkpoint file, and choosing the one `--resume` continues from.

Verification is one pipeline: the file is read safely (reader.py: bounds, zip CRC, no pickled code,
a state dict's structure), its kind decides the verdict, and `verify` adds a summary of what it holds:

- COMPLETE: an exact resume is possible (our format, migrated and validated by state.py);
- PARTIAL: the weights are usable but the resume state is missing (a community train_gpt_v2.py
  checkpoint, a bare gpt.pth, an adapter file judged by adapter_file.py, a partial file of ours);
- INCOMPLETE: nothing usable, with the reason.

Resuming and loading need the verdict alone (`verdict_of`); the summary is what `verify` prints
(`verify_checkpoint`). `--resume auto` takes the first candidate, in lineage order, that verifies
(`find_resume_checkpoint`), and `--resume PATH` a file that does (`verified_resume_file`); nothing that
fails to verify is ever deleted or renamed, and a folder none of whose files resumes is refused
(`refuse_fresh_start`) rather than started over.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from indextts_train.checkpoint.adapter_file import adapter_verdict, is_adapter_file
from indextts_train.checkpoint.reader import _read, read_unchecked
from indextts_train.checkpoint.run_folder import BEST, LATEST, same_file, step_of
from indextts_train.checkpoint.state import (
    FORMAT,
    FORMAT_VERSION,
    migrate,
    model_problem,
    nonfinite_problem,
    repaired_unknown,
    validate,
)
from indextts_train.config.family import family_of_keys
from indextts_train.config.schema import is_int
from indextts_train.errors import CheckpointError, UserError
from indextts_train.model.layout import clean_keys

EXIT_CODES = {"COMPLETE": 0, "PARTIAL": 1, "INCOMPLETE": 2}


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
    if path.name in (LATEST, BEST) or step_of(path) is not None:
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


def _summary(obj: Any, kind: str, path: Path) -> dict:
    """What `verify` prints about the weights and progress in the file ({} for an unknown file, and for an
    adapter file, whose verdict brings its own)."""
    if kind not in ("indextts-train", "community", "gpt.pth"):
        return {}
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
    """COMPLETE (exact resume possible), PARTIAL (weights usable, resume state missing) or INCOMPLETE,
    with the summary of what the file holds that `verify` prints."""
    path = Path(path)
    try:
        obj = _read(path, mmap=True)  # mmap: shapes and types are enough, tensor data stays on disk
    except CheckpointError as exc:
        return Verdict("INCOMPLETE", "unknown", [str(exc)])
    # The summary first: judging a file of our format migrates its dict in place.
    return _verdict(obj, path, _summary(obj, _kind(obj), path))


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
    return migrate(obj) if obj.get("format") == FORMAT else obj  # not INCOMPLETE: a dict


def _read_and_verify(path: Path) -> tuple[Any, Verdict]:
    """The file's objects (None when unreadable) and the verdict on them, without a summary."""
    try:
        obj = _read(path, mmap=True)
    except CheckpointError as exc:
        return None, Verdict("INCOMPLETE", "unknown", [str(exc)])
    return obj, _verdict(obj, path, {})


def _verdict(obj: Any, path: Path, summary: dict) -> Verdict:
    """The verdict on what `path` held, by its kind; `summary` (_summary's) goes with the verdicts on weights."""
    kind = _kind(obj)
    if kind == "unknown":
        what = f"a dict with keys {sorted(map(str, obj))[:8]}" if isinstance(obj, dict) else f"a {type(obj).__name__}"
        return Verdict("INCOMPLETE", kind, [f"{path} is not a checkpoint: it holds {what}"])
    if kind == "adapters":
        status, reasons, summary = adapter_verdict(obj)
        return Verdict(status, kind, reasons, summary)
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
        verdict = verdict_of(path)
        if verdict.status == "COMPLETE":
            return path, skipped
        failures[path] = reason = f"{verdict.status}: {'; '.join(verdict.reasons)}"
        skipped.append((path, reason))
    return None, skipped


def verified_resume_file(resume: str) -> Path:
    """`--resume PATH`: the file, verified COMPLETE."""
    path = Path(resume)
    if not path.is_file():
        raise UserError(f"--resume {path}: no such checkpoint file; use --resume auto to pick the newest one")
    verdict = verdict_of(path)
    if verdict.status != "COMPLETE":
        # A community file's reasons already say to repair it, and repair cannot turn bare weights
        # into a run: only our own partial files get the hint here.
        ours = verdict.status == "PARTIAL" and verdict.kind == "indextts-train"
        hint = "; `indextts-train repair` can convert it" if ours else ""
        raise UserError(f"--resume {path}: {verdict.status}: {'; '.join(verdict.reasons)}{hint}")
    return path


def _what_to_do(path: Path, reason: str) -> str:
    if "format_version" in reason and "newer" in reason:
        return "written by a newer indextts-train: resume it with that version"
    if "PARTIAL:" in reason:
        return f"convert it with `indextts-train repair {path}` (a .bak backup is kept), then rerun"
    return "it cannot be used; keep it, or remove it yourself if you do not need it"


def refuse_fresh_start(output_dir: Path, skipped: list[tuple[Path, str]]) -> UserError:
    """--resume auto found checkpoints but none resumes: starting fresh would rotate them away."""
    lines = [f"--resume auto: {output_dir} holds checkpoints but none of them can resume this run, so nothing "
             "was started and no file was changed:"]
    for path, reason in skipped:
        short = reason if len(reason) <= 200 else reason[:200] + "..."
        lines.append(f"  {path}: {short}; {_what_to_do(path, reason)}")
    lines.append("  or start a new run with another --output-dir")
    return UserError("\n".join(lines))
