"""The kinds of file a checkpoint path may hold, and the verdict on each.

Ours (indextts-train), a community train_gpt_v2.py checkpoint, a bare gpt.pth, an adapter file
(`export --adapters-out`), or something else. The verdict on a loaded file is decided by its kind:

- COMPLETE: an exact resume and an export are possible (our format, migrated and validated by state.py, its
  weights the model its stored config describes by model_fit.py, which export asks too);
- PARTIAL: the weights are usable but the resume state is missing (a community checkpoint, a bare
  gpt.pth, a partial file of ours), or an adapter file (judged by adapter_file.py);
- INCOMPLETE: nothing usable, with the reason.

`summary_of` is what `verify` prints besides (family, sizes, progress). Reading the file is reader.py's,
and the pipeline read → verdict is verify.py's.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from indextts_train.checkpoint.adapter_file import adapter_verdict, is_adapter_file
from indextts_train.checkpoint.model_fit import stored_model_problems
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
from indextts_train.model.layout import clean_keys

EXIT_CODES = {"COMPLETE": 0, "PARTIAL": 1, "INCOMPLETE": 2}
WEIGHT_KINDS = ("indextts-train", "community", "gpt.pth")  # the kinds of file that hold a model's weights


@dataclass
class Verdict:
    """What `verify` says about one file. exit_code: 0 COMPLETE, 1 PARTIAL, 2 INCOMPLETE."""

    status: str  # COMPLETE | PARTIAL | INCOMPLETE
    kind: str  # indextts-train | community | gpt.pth | adapters | unknown
    reasons: list[str] = field(default_factory=list)
    summary: dict = field(default_factory=dict)
    unknown: list[str] = field(default_factory=list)  # a COMPLETE repaired file's parts a repair could not tell

    @property
    def exit_code(self) -> int:
        return EXIT_CODES[self.status]

    def to_dict(self) -> dict:
        """JSON-ready (`verify --json`)."""
        return json.loads(json.dumps({"status": self.status, "kind": self.kind, "exit_code": self.exit_code,
                                      "reasons": self.reasons, "summary": self.summary}, default=str))


def kind_of(obj: Any) -> str:
    """indextts-train (ours), adapters, community, gpt.pth or unknown, from a loaded file's structure."""
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


def ignored_by_base_checkpoint(path: Path, obj: Any) -> str | None:
    """What --base-checkpoint leaves out when `obj` is a training checkpoint (ours or community), else None."""
    kind = kind_of(obj)
    if kind not in ("indextts-train", "community"):
        return None
    progress = obj.get("progress") if kind == "indextts-train" else obj
    step = progress.get("step") if isinstance(progress, dict) else None
    at = f" at step {step}" if is_int(step) else ""
    return (f"--base-checkpoint {path} is a training checkpoint{at}: only its weights are used; its optimizer "
            "state and position are ignored and this run starts at step 0 (to continue that run instead, "
            f"pass it as --resume){_grown_note(obj) if kind == 'indextts-train' else ''}")


def _grown_note(obj: dict) -> str:
    """A grown run's frozen base rows are not carried over: all its rows are this run's base. Said, since with
    the same tokenizer nothing is new, so nothing is frozen, and the first run's frozen rows now train."""
    plan = obj.get("vocab_plan")
    if not isinstance(plan, dict) or not plan.get("freeze_base"):
        return ""
    base, tokens = plan.get("base_tokens"), plan.get("tokens")
    if not (is_int(base) and is_int(tokens) and 0 < base < tokens):
        return ""
    return (f"; nor is its vocabulary plan: its run grew {base} base text tokens to {tokens} and kept the {base} "
            "base rows frozen, but here all its rows are the base, so only the rows a larger tokenizer adds are new "
            "and, with none, every row trains (--resume keeps the first run's frozen rows)")


def _weights(obj: dict, kind: str) -> Any:
    return obj if kind == "gpt.pth" and "model" not in obj else obj.get("model")


def summary_of(obj: Any, kind: str, path: Path) -> dict:
    """What `verify` prints about the weights and progress in the file ({} for an unknown file, and for an
    adapter file, whose verdict brings its own)."""
    if kind not in WEIGHT_KINDS:
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


def judge(obj: Any, path: Path, summary: dict) -> Verdict:
    """The verdict on what `path` held, by its kind; `summary` (summary_of's) goes with the verdicts on weights."""
    kind = kind_of(obj)
    if kind == "unknown":
        what = f"a dict with keys {sorted(map(str, obj))[:8]}" if isinstance(obj, dict) else f"a {type(obj).__name__}"
        return Verdict("INCOMPLETE", kind, [f"{path} is not a checkpoint: it holds {what}"])
    if kind in WEIGHT_KINDS:
        return _weights_verdict(obj, kind, summary)
    status, reasons, summary = adapter_verdict(obj)  # an adapter file is judged by its own module
    return Verdict(status, kind, reasons, summary)


def _weights_verdict(obj: dict, kind: str, summary: dict) -> Verdict:
    """A file that holds a model's weights: usable weights first, then what it lacks to resume (our
    format: migrated, then validated by state.py)."""
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
    problems = validate(migrate(obj)) or stored_model_problems(obj)  # the second as export judges it
    if problems:
        return Verdict("PARTIAL", kind, problems, summary)
    notes = [] if stored_version == FORMAT_VERSION else [
        f"format {stored_version}, read through the migration to format {FORMAT_VERSION}"]
    unknown = repaired_unknown(obj)
    if isinstance(obj.get("repaired"), dict):
        notes.append(f"repaired from a {obj['repaired'].get('from')} checkpoint; filled in, not known: "
                     f"{', '.join(map(str, unknown)) or 'nothing'}")
    return Verdict("COMPLETE", kind, notes, summary, unknown)
