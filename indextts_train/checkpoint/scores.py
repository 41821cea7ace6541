"""RUN/listen/scores.jsonl (what `indextts-train listen` heard): one JSON object per checkpoint x line,
appended, never rewritten. Here, below `listen`, so that `checkpoints` and `export --pick` read it.

Each record is one `write` of one whole line followed by fsync, so a kill leaves at most a torn
last line; the next append starts on a fresh line and readers skip what does not parse. A line's
record is its key (checkpoint step, line id); the last record of a key wins, and a record whose
synthesis failed does not count as scored (a rerun tries the line again). Records of checkpoints
that were deleted since stay: the file is the history of what was heard.
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

from indextts_train.checkpoint.files import BEST, LATEST, load_checkpoint
from indextts_train.checkpoint.run_folder import same_file
from indextts_train.config.schema import is_int
from indextts_train.errors import CheckpointError, UserError
from indextts_train.files.atomic import open_append, own_file_problem
from indextts_train.files.bounded import json_or_none, read_bounded

RECORD_FORMAT = "indextts-train listen 1"  # marks a record as ours
SCORES_NAME = "scores.jsonl"
LISTEN_DIR = "listen"
MAX_SCORES_BYTES = 512 << 20  # about a million records; a larger file is not ours


def scores_path(run_dir: Path) -> Path:
    return Path(run_dir) / LISTEN_DIR / SCORES_NAME


def append_record(path: Path, record: dict) -> None:
    """Append one record durably (one write, fsync); starts a fresh line after a torn one."""
    data = (json.dumps(record, ensure_ascii=False, sort_keys=True) + "\n").encode("utf-8")
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = open_append(path)  # what it refuses, check_scores_file said before any work
    try:
        size = os.fstat(fd).st_size
        if size:
            with open(path, "rb") as handle:
                handle.seek(size - 1)
                if handle.read(1) != b"\n":  # a killed writer's torn line: leave it, start a new one
                    data = b"\n" + data
        os.write(fd, data)
        os.fsync(fd)
    finally:
        os.close(fd)


def check_scores_file(path: Path) -> None:
    """Before `listen` does any work: it appends only to a scores file of its own (files/atomic.open_append),
    so none yet, or a regular file with no other name (a link's target is someone else's file; a FIFO would
    block the append)."""
    problem = own_file_problem(path)
    if problem is not None:
        raise UserError(f"{path}: is {problem}, and listen appends only to a scores file of its own; move it "
                        "aside and rerun")


def read_records(path: Path) -> list[dict]:
    """Every whole record of the file, in order (torn or foreign lines skipped); [] when there is none."""
    try:
        raw = read_bounded(path, MAX_SCORES_BYTES, "listen scores file")
    except (UserError, OSError):  # none yet, larger than ours grows, or no regular file (a FIFO would block)
        return []
    records = []
    for line in raw.splitlines():
        obj = json_or_none(line)  # a torn line, or one nested 100,000 deep (a crafted file), is skipped
        if isinstance(obj, dict) and obj.get("format") == RECORD_FORMAT and is_int(obj.get("step")) \
                and obj["step"] >= 0:  # a step is a count: `true` or -1 is no step of a run
            records.append(obj)
    return records


def latest_records(records: list[dict]) -> dict[tuple[int, str], dict]:
    """(step, line id) -> its last record."""
    return {(record["step"], str(record.get("line_id"))): record for record in records}


def scored_keys(records: list[dict]) -> set[tuple[int, str]]:
    """The (step, line id) pairs that were synthesized and scored."""
    return {key for key, record in latest_records(records).items() if record.get("ok")}


SUMMARY_KEYS = ("cer", "speaker_sim")  # the per-checkpoint means `checkpoints` shows and `export --pick` ranks
LOWER_IS_BETTER = {"cer": True, "speaker_sim": False}


_RANGES = {"cer": (0.0, math.inf), "speaker_sim": (-1.0, 1.0)}  # what a score of each can be


def _score(record: dict, key: str) -> float | None:
    """The record's `key` when it is a score that can be: a number (not a bool), finite and in range. A crafted
    or damaged line (NaN, -5, true) would otherwise rank first in `export --pick`; an integer of 400 digits
    does not fit a float, and is none either."""
    value = record.get(key)
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    try:
        value = float(value)
    except OverflowError:
        return None
    if not math.isfinite(value):
        return None
    low, high = _RANGES[key]
    return value if low <= value <= high else None


def _mean(values: list[float]) -> float | None:
    return sum(values) / len(values) if values else None


def summary_by_step(run_dir: Path) -> dict[int, dict]:
    """step -> {"cer", "speaker_sim": means over its scored lines (None when none had one), "lines": count}."""
    by_step: dict[int, list[dict]] = {}
    for (step, _), record in sorted(latest_records(read_records(scores_path(run_dir))).items()):
        if record.get("ok"):
            by_step.setdefault(step, []).append(record)
    return {step: {"lines": len(records),
                   **{key: _mean([v for r in records if (v := _score(r, key)) is not None])
                      for key in SUMMARY_KEYS}}
            for step, records in by_step.items()}


def _files_by_step(run_dir: Path) -> dict[int, Path]:
    """step -> a checkpoint file of it on disk: its model_step file, else latest.pth / best.pth (read for
    their step)."""
    files = {int(p.name[len("model_step"):-len(".pth")]): p for p in Path(run_dir).glob("model_step*.pth")
             if p.name[len("model_step"):-len(".pth")].isdigit()}
    for name in (LATEST, BEST):
        path = Path(run_dir) / name
        if path.is_file() and not any(same_file(path, other) for other in files.values()):
            try:
                step = load_checkpoint(path, mmap=True).get("progress", {}).get("step")
            except (CheckpointError, AttributeError):
                continue
            if is_int(step):
                files.setdefault(step, path)
    return files


def pick_scored(run_dir: Path, metric: str) -> tuple[Path, str]:
    """The checkpoint file that scored best on `metric` (`cer`: lowest; `speaker_sim`: highest) among those
    still on disk, and a line saying why; ties go to the later step."""
    summary = {step: values[metric] for step, values in summary_by_step(run_dir).items() if values[metric] is not None}
    files = _files_by_step(run_dir)
    on_disk = {step: value for step, value in summary.items() if step in files}
    if not on_disk:
        steps = ", ".join(map(str, sorted(summary)))
        gone = f" (steps {steps} were scored but their files are gone)" if summary else ""
        raise UserError(f"--pick {metric}: no checkpoint of {run_dir} has a {metric} score{gone}; run "
                        f"`indextts-train listen {run_dir}` first")
    sign = 1 if LOWER_IS_BETTER[metric] else -1
    step = min(on_disk, key=lambda s: (sign * on_disk[s], -s))
    return files[step], f"step {step}: best {metric} {on_disk[step]:.4f} of {len(on_disk)} scored checkpoints"
