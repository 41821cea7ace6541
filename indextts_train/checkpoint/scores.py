"""RUN/listen/scores.jsonl (what `indextts-train listen` heard): one JSON object per checkpoint x line,
appended, never rewritten. Here, below `listen`, so that `checkpoints` and `export --pick` read it.

Each record is one `write` of one whole line followed by fsync, so a kill leaves at most a torn
last line; the next append starts on a fresh line and readers skip what does not parse. A line's
record is its key (checkpoint step, line id); the last record of a key wins, and a record whose
synthesis failed does not count as scored (a rerun tries the line again). Records of checkpoints
that were deleted since stay: the file is the history of what was heard.

A record names its checkpoint's lineage branch too (`branch`): after a rollback the new branch writes
files of the same steps as the abandoned one, and the scores of those abandoned files are not the new
files' (the table showed them, `export --pick` ranked the new files by them, `listen` skipped them as
heard). So a record stands for the file of its step whose lineage names the same branch; a record
written before records named a branch stands for whichever file has its step, as it always did.
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

from indextts_train.checkpoint.files import BEST, LATEST
from indextts_train.checkpoint.lineage import lineage_of
from indextts_train.checkpoint.run_folder import same_file, step_of
from indextts_train.config.schema import is_int
from indextts_train.errors import UserError
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
    text = json.dumps(record, ensure_ascii=False, sort_keys=True)
    try:
        data = (text + "\n").encode("utf-8")
    except UnicodeEncodeError:  # a path of bytes that are no UTF-8 (a folder named in Latin-1) is a lone
        # surrogate here: escaped, it reads back as the same string (it ended listen in a traceback once heard)
        data = (json.dumps(record, sort_keys=True) + "\n").encode("ascii")
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
                and obj["step"] >= 0 and isinstance(obj.get("branch"), (str, type(None))):  # a step is a
            records.append(obj)  # count (`true` or -1 is no step of a run); a branch is a name, or none
    return records


def latest_records(records: list[dict]) -> dict[tuple[int, str], dict]:
    """(step, line id) -> its last record."""
    return {(record["step"], str(record.get("line_id"))): record for record in records}


UNNAMED = "\0unnamed"  # the branch of a record written before records named one: it stands for any file
ANY = "\0any"  # no file to match (gone, or unreadable): every record of the step counts, the last per line


def is_scored(record: dict) -> bool:
    """Synthesized and scored: `ok` is true itself (a hand-edited `"ok": "false"` is a string, and no yes)."""
    return record.get("ok") is True


class Heard:
    """What `listen` recorded, per checkpoint file: (step, branch) -> line id -> its last record."""

    def __init__(self, records: list[dict]) -> None:
        self.by_file: dict[tuple[int, str | None], dict[str, dict]] = {}
        self.by_step: dict[int, dict[str, dict]] = {}
        for record in records:
            line = str(record.get("line_id"))
            self.by_file.setdefault((record["step"], record.get("branch", UNNAMED)), {})[line] = record
            self.by_step.setdefault(record["step"], {})[line] = record

    def lines(self, step: int, branch: str | None = ANY, *, unnamed: bool = True) -> dict[str, dict]:
        """Line id -> the last record of the checkpoint file of `step` on `branch` (its own records over those
        that name no branch; `unnamed` False: its own only, as for a file of an abandoned branch)."""
        if branch == ANY:
            return dict(self.by_step.get(step, {}))
        own = self.by_file.get((step, branch), {})
        return {**self.by_file.get((step, UNNAMED), {}), **own} if unnamed else dict(own)

    def summary(self, step: int, branch: str | None = ANY, *, unnamed: bool = True) -> dict | None:
        """{"cer", "speaker_sim": means over the file's scored lines (None when none had one), "lines": count},
        or None when none of its lines was scored."""
        scored = [r for r in self.lines(step, branch, unnamed=unnamed).values() if is_scored(r)]
        if not scored:
            return None
        return {"lines": len(scored),
                **{key: _mean([v for r in scored if (v := score_value(r, key)) is not None]) for key in SUMMARY_KEYS}}


def scored_keys(records: list[dict], branches: dict[int, str | None] | None = None) -> set[tuple[int, str]]:
    """The (step, line id) pairs that were synthesized and scored; with `branches` (step -> the branch of the
    file to hear), only those steps, and only the records of those files."""
    heard = Heard(records)
    steps = branches if branches is not None else dict.fromkeys(heard.by_step, ANY)
    return {(step, line) for step, branch in steps.items()
            for line, record in heard.lines(step, branch).items() if is_scored(record)}


SUMMARY_KEYS = ("cer", "speaker_sim")  # the per-checkpoint means `checkpoints` shows and `export --pick` ranks
LOWER_IS_BETTER = {"cer": True, "speaker_sim": False}


_RANGES = {"cer": (0.0, math.inf), "speaker_sim": (-1.0, 1.0)}  # what a score of each can be
NO_SCORE_WHY = {"speaker_sim": " (listen found no CAMPPlus weights, campplus_cn_common.bin, in the model folder's "
                               "hf_cache/ nor the Hugging Face cache)"}


def score_value(record: dict, key: str) -> float | None:
    """The record's `key` when it is a score that can be: a number (not a bool), finite and in range. A crafted
    or damaged line (NaN, -5, true) would otherwise rank first in `export --pick`; an integer of 400 digits
    does not fit a float, and is none either. The page shows the same values (listen/page.py)."""
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
    mean = sum(values) / len(values) if values else None
    return mean if mean is None or math.isfinite(mean) else None  # 1e308 + 1e308: no mean of scores


def summary_by_step(run_dir: Path, branches: dict[int, str | None] | None = None) -> dict[int, dict]:
    """step -> {"cer", "speaker_sim": means over its scored lines (None when none had one), "lines": count}.
    A step whose file is on disk counts the records of that file (its branch's, `branches`, by default read from
    the files); a step whose file is gone, all of its records."""
    heard = Heard(read_records(scores_path(run_dir)))
    if branches is None:
        branches = {step: branch for step, (_, branch) in files_by_step(run_dir).items()}
    summary = {step: heard.summary(step, branches.get(step, ANY)) for step in sorted(heard.by_step)}
    return {step: values for step, values in summary.items() if values is not None}


def files_by_step(run_dir: Path) -> dict[int, tuple[Path, str | None]]:
    """step -> (a checkpoint file of ours with it on disk, its lineage branch): its model_step file, else
    latest.pth / best.pth. The step and branch are read from the file (mmap, no tensor data): a file cut
    short, a FIFO, a symbolic link or a file not ours under a step's name is none (`checkpoints` shows no step
    for the first ones)."""
    run_dir = Path(run_dir)
    names = sorted((p for p in run_dir.glob("model_step*.pth") if step_of(p) is not None), key=step_of)
    files: dict[int, tuple[Path, str | None]] = {}
    for path in names + [run_dir / LATEST, run_dir / BEST]:
        if path.is_symlink() or not path.is_file() or any(same_file(path, other) for other, _ in files.values()):
            continue  # a FIFO is never opened, nor a file a symbolic link leads to (the web page reads only inside
            # its folders); latest.pth / best.pth are usually hard links of a step file
        info = lineage_of(path)
        if info is not None:
            files.setdefault(info.step, (path, info.branch))
    return files


def pick_scored(run_dir: Path, metric: str) -> tuple[Path, str]:
    """The checkpoint file that scored best on `metric` (`cer`: lowest; `speaker_sim`: highest) among those
    still on disk, and a line saying why; ties go to the later step."""
    files = files_by_step(run_dir)
    summary = summary_by_step(run_dir, {step: branch for step, (_, branch) in files.items()})
    on_disk = {step: values[metric] for step, values in summary.items()
               if step in files and values[metric] is not None}
    if not on_disk:
        unscored = sorted(step for step in summary if step in files)
        if unscored:  # "run listen first" sent the user to a listen that had nothing left to do
            raise UserError(f"--pick {metric}: step(s) {', '.join(map(str, unscored))} of {run_dir} were heard, but "
                            f"no {metric} was recorded for them{NO_SCORE_WHY.get(metric, '')}; pick by another score, "
                            f"or move {run_dir / LISTEN_DIR} aside and hear them again")
        heard = Heard(read_records(scores_path(run_dir)))
        scored = [step for step in sorted(heard.by_step) if (heard.summary(step) or {}).get(metric) is not None]
        gone = (f" (steps {', '.join(map(str, scored))} were scored, but those files are gone, unreadable, or were "
                "written again since by a rollback)") if scored else ""
        todo = (f"run `indextts-train listen {run_dir}` first" if files else  # with none, listen has nothing to hear
                f"no checkpoint of ours is there to hear (`indextts-train checkpoints {run_dir}` lists what is)")
        raise UserError(f"--pick {metric}: no checkpoint of {run_dir} has a {metric} score{gone}; {todo}")
    sign = 1 if LOWER_IS_BETTER[metric] else -1
    step = min(on_disk, key=lambda s: (sign * on_disk[s], -s))
    return files[step][0], f"step {step}: best {metric} {on_disk[step]:.4f} of {len(on_disk)} scored checkpoints"
