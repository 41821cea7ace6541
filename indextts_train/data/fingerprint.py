"""A cheap fingerprint of the training data, so a resume notices when the data changed under it.

The stored position of a run is "sample K of epoch E's order", and that order is a pure function of
(seed, epoch, the per-line lengths). If lines were added, removed, reordered or edited between two
invocations, sample K of the new order is not the sample the killed run would have seen next:
samples get skipped or repeated and the exact-resume promise is silently gone. So the checkpoint
records what the index already knows (no array is read): per manifest, its path, how many lines
were used, and a hash of their byte offsets, line numbers, lengths (and IndexTTS-2.5 language rows);
plus one hash of the lengths in index order, which is all the epoch order depends on besides the
line counts.

A manifest that only moved (same lines, other path) is not a change that matters.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Callable

import numpy as np

from indextts_train.data.manifest import ManifestIndex
from indextts_train.errors import UserError

FINGERPRINT_VERSION = 1


def _digest(*arrays: np.ndarray) -> str:
    sha = hashlib.sha256()
    for arr in arrays:
        sha.update(np.ascontiguousarray(arr, dtype=np.int64).tobytes())
    return sha.hexdigest()[:16]


def data_fingerprint(index: ManifestIndex) -> dict:
    """{version, samples, order, files: [{path, lines, digest}]}: plain values, safe in a checkpoint.

    `lines` counts the usable (indexed) lines of each file, so a line dropped by --skip-bad-lines
    counts as removed.
    """
    files = []
    for file_id, path in enumerate(index.files):
        mine = index.file_ids == file_id
        parts = [index.offsets[mine], index.line_numbers[mine], index.text_lengths[mine], index.code_lengths[mine]]
        if index.lang_ids is not None and (index.lang_ids[mine] >= 0).any():  # IndexTTS-2.5: the language rows
            parts.append(index.lang_ids[mine])
        files.append({"path": os.path.abspath(path), "lines": int(mine.sum()), "digest": _digest(*parts)})
    return {"version": FINGERPRINT_VERSION, "samples": len(index),
            "order": _digest(index.total_lengths), "files": files}


def _file_change(old: dict, new: dict) -> str:
    name = new["path"] if old["path"] == new["path"] else f"{old['path']} -> {new['path']}"
    if old["lines"] != new["lines"]:
        verb = "added" if new["lines"] > old["lines"] else "removed"
        return f"{name}: {old['lines']} -> {new['lines']} usable lines ({verb})"
    return f"{name}: the same {new['lines']} lines count, but lines were edited, reordered or replaced"


def describe_data_change(saved: dict, current: dict) -> tuple[list[str], list[str]]:
    """(changes, notes) between a checkpoint's fingerprint and this run's.

    `changes` are what makes the stored position point elsewhere (empty: the data is the same);
    `notes` are harmless differences worth a line (a manifest that moved).
    """
    old_files, new_files = saved.get("files", []), current["files"]
    if len(old_files) != len(new_files):
        return ([f"manifests: {len(old_files)} given before ({', '.join(f['path'] for f in old_files)}), "
                 f"{len(new_files)} now ({', '.join(f['path'] for f in new_files)})"], [])
    changes, notes = [], []
    for old, new in zip(old_files, new_files, strict=True):
        if (old["lines"], old["digest"]) != (new["lines"], new["digest"]):
            changes.append(_file_change(old, new))
        elif old["path"] != new["path"]:
            notes.append(f"{old['path']} moved to {new['path']} (same lines)")
    if not changes and saved.get("order") != current["order"]:
        changes.append("the sample lengths differ, so the epoch order differs")
    return changes, notes


def check_same_data(saved: dict | None, current: dict, *, accept: bool, checkpoint: str, position: str,
                    info: Callable[[str], None], warn: Callable[[str], None]) -> bool:
    """Refuse (UserError, exit 2) to resume on changed data unless `accept`; then say how the position maps.

    `position` is where the checkpoint stopped, e.g. "sample 48 of epoch 2". Returns whether the data
    changed (and `accept` took the change).
    """
    if saved is None:
        warn(f"{checkpoint} was written before data fingerprints existed: a change of the training data since "
             "then cannot be detected; if you changed it, the sample position may point elsewhere")
        return False
    changes, notes = describe_data_change(saved, current)
    for note in notes:
        info(f"training data: {note}")
    if not changes:
        return False
    what = "; ".join(changes)
    if not accept:
        raise UserError(f"the training data changed since {checkpoint} ({what}): the stored position ({position}) "
                        "would point at other samples; restore the data, or pass --accept-data-change to "
                        "continue on the new data, or start a new --output-dir")
    warn(f"the training data changed since {checkpoint} ({what}); --accept-data-change: training continues at "
         f"the same position ({position}) in the new data's order for this epoch, so some samples of this epoch "
         "may be seen twice or not at all; later epochs follow the new data's order from their start")
    return True
