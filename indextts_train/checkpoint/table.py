"""`indextts-train checkpoints OUT_DIR`: every checkpoint of a run in one table.

One row per file on disk — `latest.pth` and `best.pth` are usually hard links of a
`model_step{N}.pth`, so they are marks on that row rather than rows of their own. Each file is
verified (the same COMPLETE/PARTIAL/INCOMPLETE as `verify`) and its step, epoch and validation
losses are read with mmap: the tensor data stays on disk. When each was written is its file's
modification time (checkpoints are renamed into place complete, so that is when the write ended).
"""

from __future__ import annotations

import os
import re
import time
from collections.abc import Callable
from pathlib import Path

from indextts_train.checkpoint.files import BEST, LATEST, is_milestone, load_checkpoint
from indextts_train.checkpoint.lineage import ABANDONED, OLD_BRANCH, lineage_of
from indextts_train.checkpoint.run_folder import run_folder_to_read, runs_inside
from indextts_train.checkpoint.scores import SUMMARY_KEYS, Heard, read_records, scores_path
from indextts_train.checkpoint.verify import verify_checkpoint
from indextts_train.files.bounded import kind_of_mode

_STEP_FILE = re.compile(r"^model_step(\d+)(?:\.\d+)?\.pth$")  # .N: a second abandoned file of one name
VAL_KEYS = ("loss", "text_loss", "mel_loss", "mel_top1")  # the columns of a history.val row after its step


def listed_step(name: str) -> int | None:
    """N of a file name the table lists as a step file (model_step{N}.pth, or model_step{N}.{K}.pth: a second
    abandoned file of one name); None for any other name."""
    found = _STEP_FILE.match(name)
    return int(found.group(1)) if found else None


def _files(output_dir: Path, include: Callable[[Path], bool]) -> list[list[Path]]:
    """The run's checkpoint-named entries grouped by identity (hard links together), step files first: files,
    and what is there under such a name but is none (a FIFO, a folder, a link to nothing), to be said as such."""
    steps = sorted((p for p in output_dir.iterdir() if listed_step(p.name) is not None and include(p)),
                   key=lambda p: listed_step(p.name))
    named = [output_dir / name for name in (LATEST, BEST)
             if os.path.lexists(output_dir / name) and include(output_dir / name)]
    # Keyed by the file's identity: comparing every file with every group was quadratic (3,000 step files: 4.5
    # million stat calls); an entry that cannot be stat'ed (a link to nothing) is a group of its own.
    groups: dict[object, list[Path]] = {}
    for path in steps + named:
        try:
            info = path.stat()
            identity: object = (info.st_dev, info.st_ino)
        except OSError:
            identity = path
        groups.setdefault(identity, []).append(path)
    return list(groups.values())


def _val_at(history: dict, step: int) -> dict | None:
    """The validation losses the run recorded at `step` (total, and per group when it has groups)."""
    row = next((row for row in reversed(history.get("val", [])) if row and row[0] == step), None)
    if row is None:
        return None
    losses = dict(zip(VAL_KEYS, row[1:], strict=False))
    groups = next((entry["groups"] for entry in reversed(history.get("val_groups", []))
                   if entry.get("step") == step), None)
    if groups:
        losses["groups"] = {name: values["loss"] for name, values in groups.items()}
    return losses


def _metadata(path: Path) -> dict:
    """Step, epoch, validation losses and the milestone setting of one of our checkpoints."""
    state = load_checkpoint(path, mmap=True, crc_checked=True)  # verify read the whole file just before
    progress = state.get("progress") if isinstance(state.get("progress"), dict) else {}
    history = state.get("history") if isinstance(state.get("history"), dict) else {}
    config = state.get("config") if isinstance(state.get("config"), dict) else {}
    step = progress.get("step")
    keep_every = (config.get("train") or {}).get("keep_every", 0)
    return {"step": step, "epoch": progress.get("epoch"),
            "val": _val_at(history, step) if step is not None else None,
            "milestone": bool(step is not None and is_milestone(step, keep_every or 0))}


def checkpoint_rows(output_dir: Path, include: Callable[[Path], bool] = lambda path: True, *,
                    scores: bool = True) -> list[dict]:
    """One JSON-ready dict per checkpoint file of `output_dir` and of its abandoned branches
    (abandoned/<branch>/, lineage.py), in step order within each folder. `include`: which files may be
    read at all (the web page passes only files inside its roots). `listen`: the mean CER and speaker
    similarity `indextts-train listen` scored for that step, if any; `scores` False: listen/scores.jsonl
    is not read (the page, when it leads outside its roots), and `listen` is None.

    Branch folders are the ones a rollback made (lineage.set_aside): a symbolic link standing for
    abandoned/ or for a branch is not followed, so the listing names no file of another folder."""
    output_dir = run_folder_to_read(output_dir)
    abandoned = output_dir / ABANDONED
    folders = (sorted(p for p in abandoned.iterdir() if p.is_dir() and not p.is_symlink())
               if abandoned.is_dir() and not abandoned.is_symlink() else [])
    rows = [row for folder in [output_dir, *folders] for row in _folder_rows(folder, output_dir, include)]
    # What `listen` scored: each file's own records, by its step and branch (scores.py: a rollback writes its
    # steps again), as export --pick ranks them; those naming no branch (written before records did) stand for
    # the run folder's file of their step, not for an abandoned one. The scores file is read once.
    heard = Heard(read_records(scores_path(output_dir))) if scores else None
    for row in rows:
        ours = row["kind"] == "indextts-train" and row["born"] is not None and row["step"] is not None
        row["listen"] = (heard.summary(row["step"], row["branch"], unnamed=not row["abandoned"])
                         if heard is not None and ours else None)
    return rows


def _lineage_columns(path: Path, abandoned: bool) -> dict:
    info = lineage_of(path)
    return {"branch": info.branch if info else None, "parent": info.parent if info else None,
            "parent_step": info.parent_step if info else None, "born": info.born if info else None,
            "abandoned": abandoned}


def _not_a_file(path: Path) -> str:
    """What stands under a checkpoint's name that is no regular file, from its status alone (never opened:
    a FIFO would block the reader)."""
    try:
        mode = path.stat().st_mode
    except OSError:  # a link to nothing, or a loop of links
        return f"a symbolic link to {os.readlink(path)}, which leads to no file"
    return kind_of_mode(mode)


def _not_a_file_row(names: list[Path], output_dir: Path) -> dict:
    """The row of an entry that is no checkpoint file: listed, not read."""
    info = names[0].lstat()
    all_names = {p.name for p in names}
    return {"file": str(names[0].relative_to(output_dir)), "also": [p.name for p in names[1:]],
            "status": "INCOMPLETE", "kind": "not a file",
            "reason": f"not a file: {_not_a_file(names[0])}, so it was not read; a checkpoint is a regular file",
            "bytes": 0, "step": None, "epoch": None, "val": None, "milestone": False,
            "written": time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(info.st_mtime)), "mtime": info.st_mtime,
            "latest": LATEST in all_names, "best": BEST in all_names,
            "branch": None, "parent": None, "parent_step": None, "born": None,
            "abandoned": names[0].parent != output_dir}


def _folder_rows(folder: Path, output_dir: Path, include: Callable[[Path], bool]) -> list[dict]:
    rows = []
    for names in _files(folder, include):
        if not names[0].is_file():
            rows.append(_not_a_file_row(names, output_dir))
            continue
        verdict = verify_checkpoint(names[0])
        stat = names[0].stat()  # a checkpoint is renamed into place complete: its mtime is when it was written
        row = {"file": str(names[0].relative_to(output_dir)), "also": [p.name for p in names[1:]],
               "status": verdict.status,
               "kind": verdict.kind, "reason": verdict.reasons[0] if verdict.status != "COMPLETE" and
               verdict.reasons else None, "bytes": stat.st_size, "step": None, "epoch": None,
               "val": None, "milestone": False,
               "written": time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(stat.st_mtime)), "mtime": stat.st_mtime}
        if verdict.kind == "indextts-train":
            row.update(_metadata(names[0]))
        elif verdict.kind == "community":
            row.update(step=verdict.summary.get("step"), epoch=verdict.summary.get("epoch"))
        all_names = {p.name for p in names}
        row.update(latest=LATEST in all_names, best=BEST in all_names)
        row.update(_lineage_columns(names[0], folder != output_dir))
        rows.append(row)
    return rows


def _size(n: int) -> str:
    for unit in ("B", "KB", "MB", "GB"):
        if n < 1024 or unit == "GB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n} B"


def age_text(seconds: float) -> str:
    """How long ago, in the largest unit that is at least 1: `42s`, `17m`, `5h`, `3d` (fits a narrow column)."""
    seconds = max(seconds, 0)
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{int(seconds // size)}{unit}"
    return f"{int(seconds)}s"


def _marks(row: dict) -> str:
    marks = [name for name, flag in (("latest", row["latest"]), ("best", row["best"]),
                                     ("milestone", row["milestone"])) if flag]
    return ", ".join(marks)


def _branch_heading(row: dict) -> str:
    if row["born"] is None:
        return "not written by this program, or unreadable:"
    name = row["branch"] or OLD_BRANCH
    forked = row["parent_step"] is not None
    origin = f" (from {row['parent'] or OLD_BRANCH} at step {row['parent_step']})" if forked else ""
    return f"{'abandoned ' if row['abandoned'] else ''}branch {name}{origin}:"


def _score_text(value: object) -> str:
    """A mean score in its 6-wide column: 3 decimals, or 3 significant digits once that would not fit (a CER of
    1e308 in a hand-edited scores.jsonl printed 300 digits)."""
    if not isinstance(value, (int, float)):
        return "-"
    return f"{value:.3f}" if abs(value) < 100 else f"{value:.3g}"


def _heard(row: dict) -> str:
    scores = row.get("listen") or {}
    cells = [_score_text(scores.get(key)) for key in SUMMARY_KEYS]
    return f"{cells[0]:>6} {cells[1]:>6}  "


def render_table(rows: list[dict], output_dir: Path, now: float | None = None) -> str:
    """The plain-text table (fits 80 columns without the per-language column); `age` is how long ago
    each file was written (`--json` has the time itself)."""
    if not rows:
        return f"{output_dir}: no checkpoints{runs_inside(output_dir)}"
    now = time.time() if now is None else now
    heard = any(row.get("listen") for row in rows)  # the CER / similarity columns only once listen has run
    head = (f"{'file':<20} {'step':>6} {'epoch':>5} {'val loss':>8}  " + (f"{'CER':>6} {'sim':>6}  " if heard else "")
            + f"{'status':<10} {'size':>8} {'age':>4}  marks")
    lines = [head]
    branch = ()
    for row in rows:
        if (row["branch"], row["abandoned"]) != branch:  # one heading per branch (lineage.py)
            branch = (row["branch"], row["abandoned"])
            lines.append(_branch_heading(row))
        val = row["val"] or {}
        loss = f"{val['loss']:.4f}" if "loss" in val else "-"
        step = "-" if row["step"] is None else str(row["step"])
        epoch = "-" if row["epoch"] is None else str(row["epoch"])
        line = (f"{row['file']:<20} {step:>6} {epoch:>5} {loss:>8}  " + (_heard(row) if heard else "") +
                f"{row['status']:<10} "
                f"{_size(row['bytes']):>8} {age_text(now - row['mtime']):>4}  {_marks(row)}").rstrip()
        if val.get("groups"):
            line += "  [" + " ".join(f"{k} {v:.4f}" for k, v in val["groups"].items()) + "]"
        if row["reason"]:
            line += f"\n{'':<24}{row['reason']}"
        lines.append(line)
    return "\n".join(lines)
