"""What the page shows about a run, read from the run's own records.

Progress, the hardware plan, warnings and how a run ended come from the trainer's events
(OUTPUT_DIR/events.jsonl, ui/events.py: the fields each console line was made from, so no wording is
parsed here); loss curves from its TensorBoard event files (OUTPUT_DIR/logs/run/); the checkpoint
table is `indextts-train checkpoints`' own (checkpoint/table.py, with what `listen` heard). Nothing
here computes what the trainer computes. No module here imports Gradio.
"""

from __future__ import annotations

import functools
import itertools
import os
import signal
import stat
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import NamedTuple

from indextts_train.checkpoint.lineage import ABANDONED, lineage_of
from indextts_train.checkpoint.run_folder import BEST, LATEST, list_checkpoints, same_file
from indextts_train.checkpoint.scores import SUMMARY_KEYS, scores_path
from indextts_train.checkpoint.table import checkpoint_rows as run_checkpoint_rows
from indextts_train.checkpoint.table import listed_step
from indextts_train.ui import events as ev
from indextts_train.ui.run_record import RECORD_NAME, read_record
from indextts_train.webui.roots import MAX_SCAN, Roots, shown
from indextts_train.webui.runs import Launch

MAX_CURVE_BYTES = 32 << 20  # TensorBoard bytes read for one run's curves (a point takes about 50)
MAX_POINTS = 1000  # points kept per curve; a longer curve is sampled (the plot is about that many pixels wide)
MAX_CURVES = 32  # loss series read per folder: the trainer writes a handful (train/, val/, per val group)
MAX_FOLDERS = 32  # TensorBoard folders read, the newest (before logs/run, a run wrote one per invocation)
MAX_STEPS = 1 << 40  # steps a run may take (train.max_steps' bound): more left than that is no run's
MAX_CHECKPOINTS = 200  # checkpoint files the table reads: it verifies each (a full read) and pairs hard links by
# comparing every two; 3,000 files took 35 s, every 3 s
MAX_LISTED = 4 * MAX_SCAN  # entries listed in all to find them (the run folder and its abandoned branches)
_TABLES: dict[tuple, list[dict]] = {}  # the rows of a folder's table, by what they were read from
_TABLES_LOCK = threading.Lock()  # Gradio calls handlers from several threads
_RECORD_FRAME = 16  # a TFRecord's bytes besides its data

progress = ev.progress
last_saved = ev.last_saved
plan_text = ev.plan_text
notices = ev.notices


def invocation_events(launch: Launch | None, events: list[dict]) -> list[dict]:
    """The events of the process the page watches: the last start's, and none yet when the page started
    a process after that start (its own first event is still to come)."""
    part = ev.last_start(events)
    if launch is None or launch.process is None or not part or part[0]["kind"] != "start":
        return part  # a run found through its lock: the last start is its own
    started = part[0].get("started")
    return part if isinstance(started, (int, float)) and started >= launch.started - 1 else []


def superseded(launch: Launch | None, events: list[dict]) -> bool:
    """Whether the page's own run ended and another process started in the folder after it (a resume typed in a
    terminal): Watch showed our exit code beside that later run's step, checkpoint and notices."""
    if launch is None or launch.process is None or launch.running():
        return False
    starts = [record.get("started") for record in events if record["kind"] == "start"]
    starts = [started for started in starts if isinstance(started, (int, float))]
    mine = next((i for i, started in enumerate(starts) if started >= launch.started - 1), None)
    return mine is not None and mine < len(starts) - 1


def exit_text(code: int) -> str:
    """How the page's run ended: its exit code, or the signal that killed it (Popen's code -9 is a shell's 137)."""
    if code >= 0:
        return f"exited with code {code}"
    try:
        name = signal.Signals(-code).name
    except ValueError:
        name = f"signal {-code}"
    return f"killed by {name} (a shell says exit {128 - code})"


def eta_text(launch: Launch, step: int, total: int, now: float | None = None) -> str:
    """Remaining time from the pace seen since this page started watching the run."""
    now = time.time() if now is None else now
    if not launch.steps_seen or launch.steps_seen[-1][1] != step:
        launch.steps_seen[1:] = [(now, step)]  # the first sighting and the latest are all the pace needs
    (t0, s0), (t1, s1) = launch.steps_seen[0], launch.steps_seen[-1]
    if s1 <= s0 or t1 <= t0:
        return "ETA: measuring"
    if not 0 <= total - step <= MAX_STEPS:  # events.jsonl is a file anyone who can write the folder can edit:
        return "ETA: unknown"  # a total of 10**400 raised OverflowError in Watch, once a second
    seconds = int((total - step) * (t1 - t0) / (s1 - s0))
    return f"ETA {seconds // 3600}:{seconds // 60 % 60:02d}:{seconds % 60:02d}"


def recorded_status(events: list[dict]) -> str:
    """How a run nobody is watching ended: finished, stopped or refused, step, checkpoint."""
    part = ev.last_start(events)
    how = ev.ending(part) or "not running (it ended without a last line: killed?)"
    parts = [f"{how} (read from the run's events; not running now)"]
    step = ev.progress(part)
    if step:
        parts.append(f"step {step[0]}/{step[1]}")
    saved = ev.last_saved(part)
    if saved:
        parts.append(f"checkpoint {shown(saved)}")  # from events.jsonl: a line break in it forged a status line
    return " · ".join(parts)


def status_line(launch: Launch | None, events: list[dict]) -> str:
    """One line: running/ended, step, ETA, exit code, the checkpoint left behind."""
    if launch is None:
        return recorded_status(events) if events else "no run in this output dir yet"
    events = invocation_events(launch, events)
    step = progress(events)
    parts = []
    if launch.running():
        parts.append(f"running (PID {launch.pid})")
        if step:
            parts += [f"step {step[0]}/{step[1]}", eta_text(launch, *step)]
        else:
            parts.append("starting")
    else:
        code = launch.exit_code
        parts.append(exit_text(code) if code is not None else f"ended (PID {launch.pid})")
        if step:
            parts.append(f"step {step[0]}/{step[1]}")
    saved = last_saved(events)
    if saved:
        parts.append(f"checkpoint {shown(saved)}")  # from events.jsonl: a line break in it forged a status line
    return " · ".join(parts)


def loss_curves(output_dir: Path, roots: Roots) -> list[tuple[str, int, float]]:
    """(series, step, value) of the loss scalars in the run's TensorBoard files, read with bounded work.

    A run writes logs/run (one folder across resumes, TensorBoard's purge step hiding what a killed
    process logged past its checkpoint); runs begun before that wrote a run_* folder per invocation,
    and where a killed run logged steps that the resumed one logged again, the later folder wins.
    A folder outside the roots, or holding a symlink that leads out of them, is not read (Watch
    lists such links). Only the newest files within MAX_CURVE_BYTES are read (_event_files), and a
    curve keeps at most MAX_POINTS points, sampled past that as TensorBoard samples them.
    """
    points: dict[tuple[str, int], float] = {}
    for files in _event_files(Path(output_dir), roots).chosen:
        points.update(_folder_losses(files))
    return sorted(((tag, step, value) for (tag, step), value in points.items()), key=lambda row: (row[0], row[1]))


class _CurveFiles(NamedTuple):
    chosen: list[tuple[tuple[str, int, int], ...]]  # each folder's files to read, oldest folder first
    left_out: bool  # older files or folders past the byte budget, not read
    newest: tuple[str, int] | None  # (path, size) of the newest file when it alone is over the budget


def _event_files(output_dir: Path, roots: Roots) -> _CurveFiles:
    """The event files to read of each TensorBoard folder of the run, oldest folder first, each folder's
    in order: (resolved path, size, mtime). The newest files whose sizes add up to MAX_CURVE_BYTES, among the
    MAX_FOLDERS newest folders; older ones are not read (a run logs about 400 bytes a logged step, so
    the budget holds some 80,000 of them: a longer run shows its latest logs, and Watch says so)."""
    logs = output_dir / "logs"
    try:
        with os.scandir(logs) as entries:  # a listing bounded as the folder scans are
            names = sorted(entry.name for entry in itertools.islice(entries, MAX_SCAN)
                           if entry.name.startswith("run"))
    except OSError:
        return _CurveFiles([], False, None)
    chosen, budget, newest = [], MAX_CURVE_BYTES, None
    for name in reversed(names[-MAX_FOLDERS:]):
        real = roots.found(logs / name)
        if real is None or not real.is_dir() or roots.leads_outside(real):
            continue
        files = []
        for path in sorted(real.glob("events.out.tfevents.*"), reverse=True):  # newest first: names start with a time
            file = _event_file(path, roots)
            if file is not None and file[1] > budget:
                budget = -1  # this file and every older one: over the budget
                newest = None if chosen or files else (str(logs / name / path.name), file[1])
                break
            if file is not None:
                budget -= file[1]
                files.append(file)
        if files:
            chosen.append(tuple(reversed(files)))
        if budget < 0:
            break
    return _CurveFiles(chosen[::-1], budget < 0 or len(names) > MAX_FOLDERS, newest)


def curves_left_out(output_dir: Path, roots: Roots) -> str | None:
    """Watch's line when the loss curves leave TensorBoard logs out (over the bytes the page reads), else None."""
    found = _event_files(Path(output_dir), roots)
    see = f"`tensorboard --logdir {shown(str(Path(output_dir) / 'logs'))}` shows them all"
    if found.newest is not None:
        path, size = found.newest
        return (f"no loss curve: {shown(path)} is {size / (1 << 20):.1f} MiB, more than the "
                f"{MAX_CURVE_BYTES >> 20} MiB of TensorBoard logs this page reads; {see}")
    if found.left_out:
        return (f"loss curves: older TensorBoard logs are left out (the page reads the newest "
                f"{MAX_CURVE_BYTES >> 20} MiB); {see}")
    return None


def _event_file(path: Path, roots: Roots) -> tuple[str, int, int] | None:
    """(resolved path, size, mtime) of an event file that resolves inside the roots to a regular file."""
    found = roots.found(path)
    try:
        info = os.stat(found) if found is not None else None
    except OSError:
        return None  # gone since the folder was looked at
    return (str(found), info.st_size, info.st_mtime_ns) if info is not None and stat.S_ISREG(info.st_mode) else None


@functools.lru_cache(maxsize=16)
def _folder_losses(files: tuple[tuple[str, int, int], ...]) -> dict[tuple[str, int], float]:
    """One folder's loss points from `files` (path, size, mtime: a grown file is a cache miss), read in
    order as TensorBoard reads a folder: a resume's purge step (a SessionLog START at that step) drops
    the points logged from it on. At most MAX_CURVES loss series, each a reservoir of MAX_POINTS."""
    from google.protobuf.message import DecodeError
    from tensorboard.backend.event_processing.reservoir import Reservoir
    from tensorboard.compat.proto.event_pb2 import Event, SessionLog

    kept = Reservoir(MAX_POINTS)  # TensorBoard's own sampling: uniform, always keeping the last point
    tags: set[str] = set()
    for path, size, _ in files:
        for data in _tfrecords(path, size):
            try:
                event = Event.FromString(data)
            except DecodeError:
                continue  # a damaged record (CRCs are not checked)
            if event.session_log.status == SessionLog.START:
                kept.FilterItems(lambda point, start=event.step: point[0] < start)
            for value in event.summary.value:
                if value.tag.endswith("loss") and value.WhichOneof("value") == "simple_value" and (
                        value.tag in tags or len(tags) < MAX_CURVES):
                    tags.add(value.tag)
                    kept.AddItem(value.tag, (event.step, value.simple_value))
    return {(tag, step): value for tag in tags for step, value in kept.Items(tag)}


def _tfrecords(path: str, size: int) -> Iterator[bytes]:
    """The records of a TFRecord file (length: 8 bytes, its CRC: 4, the data, the data's CRC: 4) within
    its first `size` bytes, the ones budgeted: a file that grew since is read no further. Opened only
    if it is a regular file (a FIFO swapped in would block) and not through a symlink; a torn last
    record ends it. `path` is resolved and was found inside the roots: a file that is elsewhere once open (a
    folder of its path made a link since) is not read."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return
    with os.fdopen(fd, "rb") as file:
        if not stat.S_ISREG(os.fstat(fd).st_mode) or not _opened_as(fd, path):
            return
        left = size
        while left >= _RECORD_FRAME:
            head = file.read(12)
            if len(head) < 12:
                return
            length = int.from_bytes(head[:8], "little")
            if length > left - _RECORD_FRAME:
                return
            data = file.read(length)
            if len(data) < length or len(file.read(4)) < 4:
                return
            left -= length + _RECORD_FRAME
            yield data


def _opened_as(fd: int, path: str) -> bool:
    """Whether the file open on `fd` is where `path` (resolved) says, by /proc/self/fd (True without /proc)."""
    try:
        return os.readlink(f"/proc/self/fd/{fd}") == path
    except OSError:
        return True


REFUSED = "REFUSED"  # the status of a checkpoint the page does not read: it lies outside the roots


def _refused_row(path: Path) -> dict:
    reason = f"a symbolic link to {os.path.realpath(path)}, outside the folders this page may touch: not read"
    return {"file": str(path), "status": REFUSED, "step": None, "epoch": None, "val_loss": None, "marks": "",
            "size_mb": None, **dict.fromkeys(SUMMARY_KEYS), "reasons": reason}


class _Listing(NamedTuple):
    admitted: frozenset[Path]  # the checkpoint files the table may read
    left_out: int  # checkpoint-named entries past MAX_CHECKPOINTS, not read
    partly: bool  # folders too big to list in full: more may be left out


def _listing(output_dir: Path) -> _Listing:
    """The checkpoint-named entries the table reads: latest.pth, best.pth and the newest step files of the run
    folder, then of each abandoned branch (in the table's order), at most MAX_CHECKPOINTS, from listings of at
    most MAX_SCAN entries each and MAX_LISTED in all."""
    abandoned = output_dir / ABANDONED
    branches, partly = ([], False) if abandoned.is_symlink() else _names(abandoned, MAX_SCAN)
    folders = [output_dir, *sorted(abandoned / name for name in branches if not (abandoned / name).is_symlink())]
    admitted: list[Path] = []
    left, budget = 0, MAX_LISTED
    for folder in folders:
        names, cut = _names(folder, min(MAX_SCAN, budget))
        budget, partly = budget - len(names), partly or cut
        steps = sorted((n for n in names if listed_step(n) is not None), key=lambda n: -listed_step(n))
        for name in [n for n in (LATEST, BEST) if n in names] + steps:
            if len(admitted) < MAX_CHECKPOINTS:
                admitted.append(folder / name)
            else:
                left += 1
        if budget <= 0:
            break
    return _Listing(frozenset(admitted), left, partly or budget <= 0)


def _names(folder: Path, limit: int) -> tuple[list[str], bool]:
    """The names of at most `limit` entries of `folder`, and whether it holds more."""
    try:
        with os.scandir(folder) as entries:
            names = [entry.name for entry in itertools.islice(entries, limit + 1)]
    except OSError:
        return [], False
    return names[:limit], len(names) > limit


def _identity(path: Path) -> tuple:
    """What changes when the file at `path`, or where its link leads, changes (the table's rows depend on it)."""
    try:
        info = os.lstat(path)
    except OSError:
        return ()
    mine = (info.st_ino, info.st_size, info.st_mtime_ns, info.st_mode)
    if not stat.S_ISLNK(info.st_mode):
        return mine
    real = os.path.realpath(path)
    try:
        target = os.stat(real)
    except OSError:
        return (*mine, real)
    return (*mine, real, target.st_ino, target.st_size, target.st_mtime_ns, target.st_mode)


def checkpoint_rows(output_dir: Path, roots: Roots) -> list[dict]:
    """The rows of `indextts-train checkpoints OUTPUT_DIR` (abandoned branches included), with the
    page's columns: file, status, step, epoch, val loss at its step, marks, size, what `listen` heard. A
    checkpoint whose resolved path lies outside the roots is a REFUSED row, neither read nor verified;
    a listen/scores.jsonl that does is not read (Watch names the link).

    The table verifies every file it lists (a full read) each time the page looks (every 3 s): the newest
    MAX_CHECKPOINTS files are listed (Watch says when more are there), and the rows are kept while none of
    those files, nor the scores, changed."""
    output_dir = Path(output_dir)
    listing = _listing(output_dir)
    key = (str(output_dir), roots.folders, tuple(sorted((str(p), _identity(p)) for p in listing.admitted)),
           _identity(scores_path(output_dir)))
    with _TABLES_LOCK:
        rows = _TABLES.get(key)
    if rows is None:
        rows = _table_rows(output_dir, roots, listing.admitted)
        with _TABLES_LOCK:
            if len(_TABLES) >= 8:  # a few run folders watched at once
                _TABLES.clear()
            _TABLES[key] = rows
    return [dict(row) for row in rows]


def checkpoints_left_out(output_dir: Path) -> str | None:
    """Watch's line when the checkpoint table leaves files out (past MAX_CHECKPOINTS), else None."""
    listing = _listing(Path(output_dir))
    if not listing.left_out and not listing.partly:
        return None
    more = f"{listing.left_out} older checkpoint file(s)" if listing.left_out else "checkpoint files"
    partly = " (or more: its folders are too big to list in full)" if listing.partly else ""
    return (f"checkpoints: {more} not listed{partly}; the page lists the newest {MAX_CHECKPOINTS}; "
            f"`indextts-train checkpoints {shown(str(output_dir))}` lists them all")


def _table_rows(output_dir: Path, roots: Roots, admitted: frozenset[Path]) -> list[dict]:
    refused: list[Path] = []

    def inside(path: Path) -> bool:
        if path not in admitted:
            return False  # past MAX_CHECKPOINTS: neither read nor listed (Watch says so)
        if roots.found(path) is None:
            refused.append(path)
            return False
        return True

    rows = []
    scores = roots.found(scores_path(output_dir)) is not None  # a scores file leading outside is not opened
    for row in run_checkpoint_rows(output_dir, inside, scores=scores):
        marks = [name for name, flag in (("latest.pth", row["latest"]), ("best.pth", row["best"])) if flag]
        if row["abandoned"]:
            marks.append(f"abandoned branch {row['branch']}")
        val = row["val"] or {}
        rows.append({"file": str(Path(output_dir) / row["file"]), "status": row["status"], "step": row["step"],
                     "epoch": row["epoch"], "val_loss": None if val.get("loss") is None else round(val["loss"], 4),
                     "marks": ", ".join(marks), "size_mb": round(row["bytes"] / 2**20, 2),
                     **{key: _rounded((row["listen"] or {}).get(key)) for key in SUMMARY_KEYS},
                     "reasons": row["reason"] or ""})
    return rows + [_refused_row(path) for path in refused]


def export_name(output_dir: Path, checkpoint: Path) -> str:
    """The folder under OUTPUT_DIR/export the page exports `checkpoint` into: one per checkpoint, so a new
    export never replaces an earlier one. latest.pth and best.pth take the name of the step file they are
    a hard link of (else their step); a file of an abandoned branch keeps its folders in the name."""
    output_dir, checkpoint = Path(output_dir), Path(checkpoint)
    if checkpoint.parent == output_dir and checkpoint.name in (LATEST, BEST):
        twin = next((p for p in list_checkpoints(output_dir) if p.name != LATEST and same_file(p, checkpoint)), None)
        if twin is not None:
            return twin.stem
        info = lineage_of(checkpoint)
        return checkpoint.stem if info is None else f"{checkpoint.stem}_step{info.step}"
    inside = checkpoint.is_relative_to(output_dir)
    return "-".join(checkpoint.relative_to(output_dir).with_suffix("").parts) if inside else checkpoint.stem


def _rounded(value: float | None) -> float | None:
    return None if value is None else round(value, 4)


def recorded_command(output_dir: Path, events: list[dict] | None = None) -> str:
    """The command line of the last start: its start event's (`events`), else the one run.yaml recorded ('' when
    there is none, or it is a symlink). run.yaml is written once a start passed its checks: a start refused
    before that (a resume with another --train-scope) showed the command of an earlier start beside its error."""
    part = ev.last_start(events or [])
    line = part[0].get("command_line") if part and part[0]["kind"] == "start" else None
    if isinstance(line, str):
        return shown(line)
    path = Path(output_dir) / RECORD_NAME
    record = None if path.is_symlink() else read_record(path)
    return shown(str(record.get("command_line", ""))) if record else ""  # a hand-made record's line breaks: escaped
