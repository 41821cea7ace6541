"""read_events, asked once a second by Watch, parses a file's lines once: an unchanged file is not read
again, a grown one only from where the last read stopped; a file replaced, shrunk or rewritten is read
anew. It parsed up to 8 MiB on every call (1.3 to 1.7 s of CPU for 8 MiB of tiny events)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from indextts_train.ui import events as ev
from indextts_train.ui.events import EVENTS_NAME, read_events


@pytest.fixture()
def parses(monkeypatch) -> list[bytes]:
    """The lines read_events parses, in order."""
    seen: list[bytes] = []
    real = ev._parse

    def counted(line: bytes):
        seen.append(line)
        return real(line)

    monkeypatch.setattr(ev, "_parse", counted)
    return seen


def _line(kind: str, **fields) -> bytes:
    return json.dumps({"kind": kind, **fields}).encode() + b"\n"


def _append(path: Path, data: bytes) -> None:
    with open(path, "ab") as file:
        file.write(data)


def _as_read_whole(path: Path) -> list[dict]:
    """What a read of the last MAX_READ_BYTES from scratch gives (the bound read_events keeps)."""
    data = path.read_bytes()
    lines = data[-ev.MAX_READ_BYTES:].split(b"\n")
    lines = lines[1:] if len(data) > ev.MAX_READ_BYTES else lines
    return [record for record in map(_event, lines) if record is not None]


def _event(line: bytes) -> dict | None:
    try:
        record = json.loads(line)
    except ValueError:
        return None
    return record if isinstance(record, dict) and isinstance(record.get("kind"), str) else None


def test_an_unchanged_file_is_not_parsed_again_and_an_appended_line_alone_is(tmp_path, parses) -> None:
    path = tmp_path / EVENTS_NAME
    path.write_bytes(b"".join(_line("step", step=i) for i in range(1000)))
    first = read_events(tmp_path)
    assert [e["step"] for e in first] == list(range(1000)) and len(parses) >= 1000
    parses.clear()
    assert read_events(tmp_path) == first and parses == []  # unchanged: nothing parsed
    _append(path, _line("save", step=1000))
    assert read_events(tmp_path)[-1] == {"kind": "save", "step": 1000} and parses == [_line("save", step=1000)[:-1]]
    parses.clear()
    _append(path, b'{"kind": "done", "st')  # a line being written: not yet an event
    assert read_events(tmp_path)[-1]["kind"] == "save"
    _append(path, b'ep": 1000}\n')
    assert read_events(tmp_path)[-1] == {"kind": "done", "step": 1000}
    assert len(read_events(tmp_path)) == 1002 and len(parses) <= 3  # the cut line, then it whole


def test_a_file_replaced_shrunk_or_rewritten_is_read_anew_then_kept(tmp_path, parses) -> None:
    path = tmp_path / EVENTS_NAME
    other = tmp_path / "new.jsonl"
    other.write_bytes(_line("start") + _line("step", step=1) + _line("step", step=2))
    changes = [(lambda: path.write_bytes(_line("start") + _line("step", step=1)), ["start", "step"]),
               (lambda: os.replace(other, path), ["start", "step", "step"]),  # another, longer file in its place
               (lambda: path.write_bytes(_line("plan")), ["plan"]),  # shrunk
               (lambda: path.write_bytes(_line("warn") + _line("info")), ["warn", "info"])]  # grown, its start changed
    for change, kinds in changes:
        change()
        assert [e["kind"] for e in read_events(tmp_path)] == kinds
        parses.clear()
        assert [e["kind"] for e in read_events(tmp_path)] == kinds and parses == []


def test_appends_keep_the_last_max_read_bytes_as_a_whole_read_does(tmp_path, parses, monkeypatch) -> None:
    """A file growing past MAX_READ_BYTES gives what a read of its last MAX_READ_BYTES gives (the line cut
    by the bound left out), while each append is parsed once."""
    monkeypatch.setattr(ev, "MAX_READ_BYTES", 200)
    path = tmp_path / EVENTS_NAME
    path.touch()
    for i in range(60):
        _append(path, _line("step", step=i, pad="x" * (i % 7)))
        if i % 5 == 4:
            _append(path, b"not json\n")
        assert read_events(tmp_path) == _as_read_whole(path)
    parses.clear()
    before = read_events(tmp_path)
    _append(path, _line("done", step=60))
    assert read_events(tmp_path) == [*before[1:], {"kind": "done", "step": 60}] == _as_read_whole(path)
    assert parses == [_line("done", step=60)[:-1]]
    _append(path, _line("x" * 300))  # one line longer than the bound: nothing of what came before is left
    assert read_events(tmp_path) == _as_read_whole(path) == []
