"""OUTPUT_DIR/events.jsonl: what a run said, as data.

Every line the trainer prints is also one JSON object here, with its kind and the fields it was
made from (`{"t": 1764151361.2, "kind": "save", "text": "saved ... (step 40, ...)", "step": 40,
"file": ".../model_step40.pth", ...}`). The console line and train.log show `text`; the web page and
`checkpoints` read the fields, so a reworded line never changes what they understand.

Kinds and their fields (besides `t`, `kind`, `text`):
  start        command_line, started            a process began (before its first other event)
  plan         plan (the hardware plan's dict)  the hardware plan the run chose
  notice       -                                a resume decision, a settings change, skipped files
  warning      -                                anything said as `warning:`
  begin        step, total                      the loop starts at `step` of `total`
  step         step, total, epoch, loss, text_loss, mel_loss, mel_top1, lr, samples_per_s
  validation   step, loss, ...                  the validation losses at `step`
  save         step, total, epoch, sample, file, best
  stop         step, exit_code                  stopped by a signal after a safe save
  end          step                             a planned end before the last step (early stop)
  done         step, epochs                     the last step was reached and saved
  diverged     -                                the run ended on non-finite steps (exit 3)
  error        -                                the run ended on bad input (exit 2)
  info         -                                any other line

The file is appended to and never rewritten: a kill can leave a last line cut short, which readers
skip. Writing it never ends a run (a full disk ends the copy, as for train.log). Readers bound their
work: only the last MAX_READ_BYTES are read.
"""

from __future__ import annotations

import bisect
import contextlib
import json
import os
import stat
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO

from indextts_train.config.schema import is_int
from indextts_train.files.atomic import open_append
from indextts_train.files.bounded import json_or_none

EVENTS_NAME = "events.jsonl"
MAX_READ_BYTES = 8 * 1024 * 1024  # about 40,000 step lines: far more than the page shows
ENDINGS = {"stop": "stopped", "end": "finished", "done": "finished", "diverged": "ended with an error",
           "error": "ended with an error"}
NOTICE_KINDS = frozenset({"notice", "warning", "error", "diverged", "stop"})


def event(kind: str, text: str, **fields: Any) -> dict:
    """One event: its time, kind, the line it prints as and its fields (JSON-ready values)."""
    return {"t": round(time.time(), 3), "kind": kind, "text": text, **fields}


class AppendOnlyFile:
    """A file of the run that only grows: what is written before the folder is the run's waits in memory
    (a start refused by its checks creates nothing), then goes out in one O_APPEND write a line, so
    two writers never interleave within a line. A failing disk ends the copy, never the run; a link, a
    FIFO or a file with another hard link in the file's place is refused (the run writes only its own files)."""

    def __init__(self) -> None:
        self._pending: list[str] = []
        self._fd: int | None = None
        self._failed = False

    def write(self, line: str) -> None:
        if self._failed:
            return
        if self._fd is None:
            self._pending.append(line)
            return
        try:
            os.write(self._fd, (line + "\n").encode("utf-8", errors="replace"))
        except OSError:
            self._failed = True

    # How much of an existing file is read to see that it is ours: its first line.
    HEAD_BYTES = 64 * 1024

    def ours(self, first_line: bytes) -> bool:
        """Whether a file whose first line this is was written by this class's writer (subclasses say)."""
        return True

    def attach(self, path: Path, head: str | None = None) -> bool:
        """Start appending to `path`: `head` first, then what was written so far. False, and nothing written,
        when a file is there that is not ours (the user's own notes under the name): it is never appended to."""
        if not self._is_ours(path):
            self.discard()
            return False
        if head is not None:
            self._pending.insert(0, head)
        try:
            self._fd = open_append(path)  # a link, a FIFO or a hard link in its place is not the run's file
        except OSError:
            self._failed = True
            return
        pending, self._pending = self._pending, []
        for line in pending:
            self.write(line)
        return True

    def _is_ours(self, path: Path) -> bool:
        """Missing, empty or first line ours; a file that cannot be read is left to open_append, which
        refuses a link, a FIFO or a hard link in its place."""
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
        except OSError:
            return True
        try:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                return True
            head = os.read(fd, self.HEAD_BYTES)
        except OSError:
            return True
        finally:
            os.close(fd)
        return not head or self.ours(head.partition(b"\n")[0])

    def discard(self) -> None:
        """Nothing more goes to the file (its lines reach it another way)."""
        self._pending.clear()
        self._failed = True

    def close(self) -> None:
        if self._fd is not None:
            with contextlib.suppress(OSError):
                os.close(self._fd)
            self._fd = None


class EventFile(AppendOnlyFile):
    """OUTPUT_DIR/events.jsonl: one event a line."""

    def ours(self, first_line: bytes) -> bool:
        first = json_or_none(first_line)
        return isinstance(first, dict) and "kind" in first and "t" in first

    def record(self, event: dict) -> None:
        self.write(json.dumps(event, ensure_ascii=False, default=str))


def read_events(output_dir: Path) -> list[dict]:
    """The run's events in order ([] when it has none); a cut or foreign line is skipped. Reads at most
    the last MAX_READ_BYTES of a regular file (a link or a device is not a run's record).

    Watch asks once a second: what was parsed is kept by file (device, inode), so a file unchanged since is
    not read again, and a file that grew is read from where the last read stopped (it is appended to,
    never rewritten). One that shrank, or whose bytes before that point changed, is read anew. The
    dicts are shared between calls: read them, do not change them.
    """
    try:
        fd = os.open(Path(output_dir) / EVENTS_NAME, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return []
    with os.fdopen(fd, "rb") as file:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            return []
        with _reads_lock:
            return list(_read(file, info))


@dataclass
class _Read:
    """What was read of one events file: its whole lines' events, by the offset each line starts at."""

    size: int = 0
    mtime_ns: int = 0
    starts: list[int] = field(default_factory=list)
    records: list[dict] = field(default_factory=list)
    end: int = 0  # where the last whole line read ends: the next read of a grown file starts here
    before_end: bytes = b""  # the bytes just before `end`, compared again to tell a rewritten file
    events: list[dict] = field(default_factory=list)  # what the last read returned


# Events kept across files, the last file read always kept: a run's 8 MiB holds some 40,000 events, and
# a crafted file of 12-byte lines 700,000 (about 200 MB of dicts), so at most two such files are kept.
_EVENTS_KEPT = 1_000_000
_CHECKED = 64  # bytes before where the last read stopped, compared on the next read
_reads: OrderedDict[tuple[int, int], _Read] = OrderedDict()
_reads_lock = threading.Lock()


def _read(file: BinaryIO, info: os.stat_result) -> list[dict]:
    key, size = (info.st_dev, info.st_ino), info.st_size
    window = max(size - MAX_READ_BYTES, 0)  # a line starting here or before it is not read whole
    kept = _reads.pop(key, None)
    if kept is not None and (kept.size, kept.mtime_ns) == (size, info.st_mtime_ns):
        _reads[key] = kept
        return kept.events
    if kept is None or size <= kept.size or kept.end < window or not _same_before(file, kept):  # not appended to
        kept = _Read(end=window)
    file.seek(kept.end)
    data = file.read(size - kept.end)
    *lines, tail = data.split(b"\n")  # tail: a line still being written, or cut by a kill
    offset = kept.end
    for line in lines:
        record = _parse(line)
        if record is not None:
            kept.starts.append(offset)
            kept.records.append(record)
        offset += len(line) + 1
    kept.before_end = (kept.before_end + data[:offset - kept.end])[-_CHECKED:]
    kept.end, kept.size, kept.mtime_ns = offset, kept.end + len(data), info.st_mtime_ns
    if kept.size > MAX_READ_BYTES:  # the first line read may be the end of a longer one
        first = bisect.bisect_right(kept.starts, kept.size - MAX_READ_BYTES)
        del kept.starts[:first], kept.records[:first]
    last = _parse(tail) if tail and (kept.size <= MAX_READ_BYTES or offset > kept.size - MAX_READ_BYTES) else None
    kept.events = kept.records if last is None else [*kept.records, last]
    _reads[key] = kept
    while len(_reads) > 1 and sum(len(read.events) for read in _reads.values()) > _EVENTS_KEPT:
        _reads.popitem(last=False)  # the file read longest ago
    return kept.events


def _same_before(file: BinaryIO, kept: _Read) -> bool:
    """Whether the bytes before where the last read stopped are still those it read."""
    file.seek(kept.end - len(kept.before_end))
    return file.read(len(kept.before_end)) == kept.before_end


def _parse(line: bytes) -> dict | None:
    record = json_or_none(line)
    return record if isinstance(record, dict) and isinstance(record.get("kind"), str) else None


def last_start(events: list[dict]) -> list[dict]:
    """The events of the last process that started in the folder."""
    starts = [i for i, record in enumerate(events) if record["kind"] == "start"]
    return events[starts[-1]:] if starts else events


def last_of(events: list[dict], *kinds: str) -> dict | None:
    return next((record for record in reversed(events) if record["kind"] in kinds), None)


def progress(events: list[dict]) -> tuple[int, int] | None:
    """(step, total steps) the run last reported, None before its first step."""
    found = last_of(events, "step", "save", "begin")
    if found is None or not is_int(found.get("step")) or not is_int(found.get("total")):
        return None
    return found["step"], found["total"]


def last_saved(events: list[dict]) -> str | None:
    found = last_of(events, "save")
    return str(found["file"]) if found is not None and found.get("file") else None


def ending(events: list[dict]) -> str | None:
    """How the last start ended (finished, stopped, ended with an error), None when it said nothing."""
    found = last_of(last_start(events), *ENDINGS)
    return ENDINGS[found["kind"]] if found is not None else None


def plan_text(events: list[dict]) -> str:
    found = last_of(events, "plan")
    return str(found.get("text", "")) if found is not None else ""


def notices(events: list[dict]) -> str:
    """Warnings, errors, resume decisions and changed settings, in the order they came."""
    return "\n".join(str(record.get("text", "")) for record in events if record["kind"] in NOTICE_KINDS)
