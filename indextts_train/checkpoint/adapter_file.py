"""What `verify` says about an adapter file written by `export --adapters-out`, and about a path
that is not a file at all.

Such a file is not a training checkpoint (no optimizer, no position) and not a gpt.pth: it holds
LoRA adapters, the other tensors the run trained, and the fingerprint of the base weights they
apply to. `verify` reports it as PARTIAL (exit 1): complete as an adapter file, but it cannot
resume a run, and it says what it holds.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from torch import Tensor

from indextts_train.checkpoint.state import nonfinite_problem
from indextts_train.model.lora import ADAPTER_FILE_FORMAT, adapter_names


def is_adapter_file(obj: Any) -> bool:
    return isinstance(obj, dict) and obj.get("format") == ADAPTER_FILE_FORMAT


def adapter_verdict(obj: dict) -> tuple[str, list[str], dict]:
    """(status, reasons, summary) of an adapter file: INCOMPLETE when a part is missing or not finite."""
    adapters, tensors = obj.get("adapters"), obj.get("tensors")
    info, applies_to = obj.get("lora"), obj.get("applies_to")
    parts = {"adapters": adapters, "tensors": tensors, "lora": info, "applies_to": applies_to}
    missing = [name for name, part in parts.items() if not isinstance(part, dict)]
    if missing:
        return "INCOMPLETE", [f"an adapter file without {', '.join(missing)}: re-export it with --adapters-out"], {}
    if not all(isinstance(v, Tensor) for v in (*adapters.values(), *tensors.values())):
        return "INCOMPLETE", ["an adapter file with non-tensor entries: re-export it with --adapters-out"], {}
    problem = nonfinite_problem({**adapters, **tensors}, None)
    if problem:
        return "INCOMPLETE", [f"no usable adapters: {problem}"], {}
    layers = adapter_names(adapters)
    summary = {"rank": info.get("rank"), "alpha": info.get("alpha"), "adapted_layers": len(layers),
               "trained_tensors": len(tensors), "applies_to": applies_to,
               "params": sum(t.numel() for t in (*adapters.values(), *tensors.values()))}
    base = str(applies_to.get("base_weights_sha256", "?"))[:12]
    reasons = [f"LoRA adapter file (export --adapters-out): rank {info.get('rank')} on {len(layers)} layer(s), "
               f"{len(tensors)} other trained tensors, for the base whose adapted weights hash {base}...; "
               "complete as adapters, but not a training checkpoint: it cannot resume a run (export the "
               "run's checkpoint for a full gpt.pth)"]
    return "PARTIAL", reasons, summary


LISTED_FILES = 5  # names shown when a path is missing: enough to spot a typo, bounded in a huge folder


def missing_reason(path: Path) -> str:
    """Why `path` cannot be read as a checkpoint file: a folder, a missing folder, or a missing file
    (then a few .pth files that are there, to spot a typo)."""
    if path.is_dir():
        return ("is a folder, not a checkpoint file; pass a file in it (e.g. latest.pth), or list a run's "
                "checkpoints with `indextts-train checkpoints FOLDER`")
    if path.is_symlink():  # a dangling link or a loop of links: its name is there, what it leads to is not
        return (f"a symbolic link to {os.readlink(path)}, which leads to no file (missing, or a loop of links); "
                "pass the checkpoint file itself")
    parent = path.parent
    if not parent.is_dir():
        return f"no such checkpoint file: its folder {parent} does not exist"
    found = []
    for entry in os.scandir(parent):
        if entry.name.endswith(".pth"):
            found.append(entry.name)
            if len(found) == LISTED_FILES:
                break
    there = f"; .pth files there: {', '.join(sorted(found))}" if found else "; the folder holds no .pth file"
    return f"no such checkpoint file{there}"
