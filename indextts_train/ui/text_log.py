"""`train.log`: the console of every start, timestamped, in the run folder.

Every start appends its console lines to OUTPUT_DIR/train.log, each with the wall-clock time and the
time since the start, and each line's event to OUTPUT_DIR/events.jsonl (events.py). Lines are kept in
memory until the output folder has been claimed (`TextLog.attach`): a start that fails its checks
creates nothing on disk.
"""

from __future__ import annotations

import os
import re
import shlex
import sys
import time
from pathlib import Path
from typing import Any

from indextts_train.ui.events import EVENTS_NAME, AppendOnlyFile, EventFile, event

LOG_NAME = "train.log"

# The stamp TextLog.stamp puts before each console line: `13:02:41 +0:04:10 `.
STAMP = re.compile(r"^\d\d:\d\d:\d\d \+\d+:\d\d:\d\d ", re.M)


def unstamp(text: str) -> str:
    """Console text without the stamps, for readers that match what a line says (the web page, tests)."""
    return STAMP.sub("", text)


def elapsed_text(seconds: float) -> str:
    """`0:04:10`: hours are not wrapped, so a week-long run reads `170:02:11`."""
    whole = int(max(seconds, 0))
    return f"{whole // 3600}:{whole % 3600 // 60:02d}:{whole % 60:02d}"


class TextLog:
    """Timestamps for console lines, and their copy in OUTPUT_DIR/train.log once the folder is ours,
    with each line's event in OUTPUT_DIR/events.jsonl (events.py)."""

    def __init__(self, started: float | None = None) -> None:
        self.started = time.time() if started is None else started
        self._log = _LogFile()  # train.log: lines before attach() are written then, or never
        self.events = EventFile()
        self.events.record(event("start", f"=== start {self._when()}: {command_line(sys.argv)}",
                                 command_line=command_line(sys.argv), started=self.started))

    def _when(self) -> str:
        return time.strftime("%Y-%m-%d %H:%M:%S %z", time.localtime(self.started))

    def record(self, line: str, kind: str, **fields: Any) -> None:
        """A stamped line (write) and its event: what `text` says, as data."""
        self.write(line)
        self.events.record(event(kind, unstamp(line), **fields))

    def stamp(self, message: str, now: float | None = None) -> str:
        """`13:02:41 +0:04:10 message`: the time of day and the time since this start."""
        now = time.time() if now is None else now
        return f"{time.strftime('%H:%M:%S', time.localtime(now))} +{elapsed_text(now - self.started)} {message}"

    def write(self, line: str) -> None:
        """One stamped line (may hold several text lines); a failing disk ends the copy, never the run."""
        self._log.write(line)

    def attach(self, output_dir: Path) -> list[str]:
        """Start appending to OUTPUT_DIR/train.log and events.jsonl, with the lines said so far. Returns the
        names of those files that are there and not ours (the user's notes under the name): they are kept
        as they are, never appended to.

        When stdout already appends to that very file (the web page starts runs that way), the lines
        reach it through stdout and are not written twice.
        """
        kept = [] if self.events.attach(Path(output_dir) / EVENTS_NAME) else [EVENTS_NAME]
        path = Path(output_dir) / LOG_NAME
        if _stdout_is(path):
            self._log.discard()
            return kept
        if not self._log.attach(path, head=f"=== start {self._when()}: {command_line(sys.argv)}"):
            kept.append(LOG_NAME)
        return kept

    def close(self) -> None:
        self.events.close()
        self._log.close()


class _LogFile(AppendOnlyFile):
    """OUTPUT_DIR/train.log: each start's lines after its `=== start` line (the page's runs after its own
    `=== indextts-train webui` line)."""

    def ours(self, first_line: bytes) -> bool:
        return first_line.startswith(b"=== ")


def command_line(argv: list[str]) -> str:
    """The command as the user typed it: `train-gpt ...`, or `python -m indextts_train ...` (whose argv[0]
    is the package's __main__.py path)."""
    program = "python -m indextts_train" if Path(argv[0]).name == "__main__.py" else Path(argv[0]).name
    return " ".join([program, *map(shlex.quote, argv[1:])])


def _stdout_is(path: Path) -> bool:
    try:
        return path.exists() and os.path.samestat(os.fstat(sys.stdout.fileno()), os.stat(path))
    except (OSError, ValueError, AttributeError):  # no real stdout (captured by a test, closed)
        return False
