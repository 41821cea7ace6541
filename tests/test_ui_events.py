"""ui/events.py: the run's append-only files write only to files of their own, and never block."""

from __future__ import annotations

import os
import threading
from pathlib import Path

import pytest

from indextts_train.ui.events import EVENTS_NAME, read_events
from indextts_train.ui.text_log import LOG_NAME, TextLog


def _attach_within(log: TextLog, folder: Path, seconds: float = 10.0) -> None:
    """attach() in a thread; still blocked after `seconds` fails the test (its FIFOs are then opened for
    reading, so the suite goes on)."""
    worker = threading.Thread(target=log.attach, args=(folder,), daemon=True)
    worker.start()
    worker.join(seconds)
    if worker.is_alive():
        while worker.is_alive():  # each FIFO the writer waits on, in turn
            for name in (LOG_NAME, EVENTS_NAME):
                if (folder / name).is_fifo():
                    os.close(os.open(folder / name, os.O_RDONLY | os.O_NONBLOCK))
            worker.join(0.1)
        pytest.fail("attaching the run's log blocked on a FIFO")


def test_a_fifo_in_place_of_the_log_or_the_events_is_left_alone_and_never_blocks(tmp_path) -> None:
    os.mkfifo(tmp_path / LOG_NAME)
    os.mkfifo(tmp_path / EVENTS_NAME)
    log = TextLog()
    log.record(log.stamp("a line"), "info")
    _attach_within(log, tmp_path)
    log.record(log.stamp("another"), "info")
    log.close()
    assert (tmp_path / LOG_NAME).is_fifo() and (tmp_path / EVENTS_NAME).is_fifo()
    assert read_events(tmp_path) == []


def test_a_file_with_another_hard_link_is_not_written(tmp_path) -> None:
    """A train.log hard-linked to someone's file: appending would change that file too."""
    theirs = tmp_path / "theirs.txt"
    theirs.write_text("mine\n", encoding="utf-8")
    run = tmp_path / "run"
    run.mkdir()
    os.link(theirs, run / LOG_NAME)
    log = TextLog()
    log.record(log.stamp("a line"), "info")
    _attach_within(log, run)
    log.close()
    assert theirs.read_text(encoding="utf-8") == "mine\n"
    assert [e["kind"] for e in read_events(run)] == ["start", "info"]  # events.jsonl is its own: written
