"""Which checkpoints `listen` hears, and the model folder and tokenizer they are heard through.

`--checkpoints` is a comma list of `best`, `latest`, `stepN` and `all` (every model_step file, plus
latest.pth and best.pth when they are not hard links of one). Each named file must verify COMPLETE
(`indextts-train verify`); under `all`, a file that does not is left out with a note. One
checkpoint per step: a step named twice (latest.pth is usually a link of its model_step file) is
heard once.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from indextts_train.checkpoint.files import BEST, LATEST
from indextts_train.checkpoint.lineage import lineage_of
from indextts_train.checkpoint.run_folder import list_checkpoints, run_folder_to_read, same_file, step_of
from indextts_train.checkpoint.verify import verify_checkpoint
from indextts_train.config.schema import is_int
from indextts_train.data.corpus_forms import PREPARE_RECORD
from indextts_train.data.sampling import parse_manifest_spec
from indextts_train.errors import UserError
from indextts_train.files.bounded import kind_of_path, parse_json, read_bounded
from indextts_train.ui.run_record import RECORD_NAME, read_record

MAX_PREPARE_JSON_BYTES = 16 << 20
MAX_STEP_DIGITS = 19  # a step counts optimizer updates: 10**19 is past any run


@dataclass(frozen=True)
class Chosen:
    """A checkpoint to hear: its step and file, its lineage branch (scores.py: a record names it), family
    (IndexTTS2 / IndexTTS-2.5, as verify says it) and text tokens (None: not known)."""

    step: int
    path: Path
    branch: str | None = None
    family: str | None = None
    tokens: int | None = None  # its text tokens (number_text_tokens), as its vocabulary plan says


def _existing(word: str, path: Path, run_dir: Path) -> list[Path]:
    """[path] when it is a file; else one line saying what is there (a FIFO under the name is no file that
    "does not exist": `checkpoints` lists it)."""
    if path.is_file():
        return [path]
    what = f"is {kind_of_path(path)}, not a file" if os.path.lexists(path) else "does not exist"
    raise UserError(f"--checkpoints {word}: {path} {what}; `indextts-train checkpoints {run_dir}` lists what there is")


def _named(run_dir: Path, word: str) -> list[Path]:
    if word in ("best", "latest"):
        return _existing(word, run_dir / (BEST if word == "best" else LATEST), run_dir)
    if word == "all":
        return list_checkpoints(run_dir) + ([run_dir / BEST] if (run_dir / BEST).is_file() else [])
    digits = word[4:]
    # `step²` is a digit to str.isdigit; 5,000 digits are past what int() converts (a traceback), and no step
    if word.startswith("step") and digits.isascii() and digits.isdigit() and len(digits) <= MAX_STEP_DIGITS:
        return _existing(word, run_dir / f"model_step{int(digits)}.pth", run_dir)
    shown = word if len(word) <= 40 and word.isprintable() else f"{word[:40]!r}{'...' if len(word) > 40 else ''}"
    raise UserError(f"--checkpoints {shown}: expected best, latest, stepN (e.g. step500) or all, comma-separated")


def _not_files(run_dir: Path) -> list[str]:
    """Notes on checkpoint names under which no file stands (a FIFO, a folder): `all` hears files only."""
    names = sorted((p for p in run_dir.iterdir() if step_of(p) is not None or p.name in (LATEST, BEST)),
                   key=lambda p: p.name)
    return [f"left out {p.name}: it is {kind_of_path(p)}, not a file" for p in names
            if not p.is_file() and os.path.lexists(p)]


def choose_checkpoints(run_dir: Path, spec: str) -> tuple[list[Chosen], list[str]]:
    """(the checkpoints to hear in step order, notes on files `all` left out); one line for a bad one."""
    run_dir = run_folder_to_read(run_dir)
    by_step: dict[int, Chosen] = {}
    notes: list[str] = []
    seen: list[Path] = []
    words = [w.strip() for w in spec.split(",") if w.strip()]
    if not words:  # `--checkpoints ,` or "": a list that lost its names, not a request for all of them
        raise UserError(f"--checkpoints {spec!r} names no checkpoint; give best, latest, stepN (e.g. step500) "
                        "or all, comma-separated")
    if "all" in words:
        notes += _not_files(run_dir)
    for word in words:
        for path in _named(run_dir, word):
            if any(same_file(path, other) for other in seen):
                continue  # latest.pth / best.pth are usually hard links of a model_step file: read it once
            seen.append(path)
            verdict = verify_checkpoint(path)
            step = verdict.summary.get("step")
            if verdict.status != "COMPLETE" or verdict.kind != "indextts-train" or not isinstance(step, int):
                reason = verdict.reasons[0] if verdict.reasons else f"a {verdict.kind} file"
                if word == "all":
                    notes.append(f"left out {path.name}: {verdict.status} ({reason})")
                    continue
                raise UserError(f"--checkpoints {word}: {path} is {verdict.status}, not a COMPLETE checkpoint of "
                                f"this trainer ({reason}); `indextts-train verify {path}` says more")
            info, plan = lineage_of(path), verdict.summary.get("vocab_plan")
            tokens = plan.get("tokens") if isinstance(plan, dict) and is_int(plan.get("tokens")) else None
            by_step.setdefault(step, Chosen(step, path, info.branch if info else None, verdict.summary.get("family"),
                                            tokens))
    if not by_step:
        left_out = f" ({'; '.join(notes)})" if notes else ""
        raise UserError(f"{run_dir}: no COMPLETE checkpoint to hear{left_out}; `indextts-train checkpoints {run_dir}` "
                        "lists them")
    return [by_step[step] for step in sorted(by_step)], notes


def run_inputs(run_dir: Path) -> dict:
    """What run.yaml says about the run's inputs: `tokenizer` and `val_manifests` as paths (may be absent)."""
    record = read_record(run_dir / RECORD_NAME) or {}
    options = record.get("options") if isinstance(record.get("options"), dict) else {}
    cwd = Path(str(record.get("cwd") or run_dir))
    tokenizer = options.get("tokenizer")
    return {"tokenizer": cwd / str(tokenizer) if tokenizer else None,
            "val_manifests": [str(cwd / str(spec)) for spec in options.get("val_manifests") or []]}


def model_dir_of(run_dir: Path, flag: Path | None) -> Path:
    """`--model-dir`, else the model folder `prepare` recorded beside the run's validation manifests."""
    if flag is not None:
        if not (flag / "config.yaml").is_file():
            raise UserError(f"--model-dir {flag}: no config.yaml there; pass the official IndexTTS model folder "
                            "(checkpoints/) the run was trained from")
        return flag
    for spec in run_inputs(run_dir)["val_manifests"]:
        report = parse_manifest_spec(spec, "--val-manifest").path.parent / PREPARE_RECORD
        try:
            found = Path(str(parse_json(read_bounded(report, MAX_PREPARE_JSON_BYTES), str(report)).get("model_dir")
                             or ""))
        except (OSError, ValueError, AttributeError, UserError):
            continue
        if str(found) not in ("", ".") and (found / "config.yaml").is_file():
            return found
    raise UserError(f"{run_dir}: cannot tell which official model folder the run was trained from (no prepare.json "
                    "beside its validation manifests names one); pass --model-dir checkpoints/")
