"""train.log: the stamped console lines of every start, held until the run folder is claimed."""

from __future__ import annotations

import json
import re
import sys

from indextts_train.ui.text_log import TextLog, command_line, elapsed_text, unstamp

STAMPED = re.compile(r"^\d\d:\d\d:\d\d \+\d+:\d\d:\d\d ")


def test_stamps_and_lines_held_until_the_folder_is_claimed(tmp_path) -> None:
    log = TextLog(started=1000.0)
    line = log.stamp("step 1/9 loss 1.0", now=1000.0 + 3 * 3600 + 62)
    assert STAMPED.match(line) and line.split()[1] == "+3:01:02" and unstamp(line) == "step 1/9 loss 1.0"
    assert elapsed_text(170 * 3600 + 131) == "170:02:11"  # a week-long run is not wrapped at 24 h
    log.write("before the folder exists")
    assert not (tmp_path / "train.log").exists()
    log.attach(tmp_path)
    log.write("after")
    log.close()
    text = (tmp_path / "train.log").read_text().splitlines()
    assert text[0].startswith("=== start ") and text[1:] == ["before the folder exists", "after"]


def test_a_log_that_stdout_already_writes_is_not_written_twice(tmp_path, monkeypatch) -> None:
    """The web page starts runs with stdout appended to OUTPUT_DIR/train.log."""
    with open(tmp_path / "train.log", "a") as stdout:
        monkeypatch.setattr(sys, "stdout", stdout)
        log = TextLog()
        log.write("said once, through stdout")
        log.attach(tmp_path)
        log.write("again")
        log.close()
    assert (tmp_path / "train.log").read_text() == ""


def test_command_line_is_what_the_user_typed() -> None:
    assert command_line(["/x/indextts_train/__main__.py", "train", "--seed", "1"]) == \
        "python -m indextts_train train --seed 1"
    assert command_line(["/venv/bin/train-gpt", "--output-dir", "my runs/a"]) == "train-gpt --output-dir 'my runs/a'"


def test_a_log_or_events_file_of_someone_elses_is_never_appended_to(tmp_path) -> None:
    """`--output-dir notes/` holding the user's own train.log: each start appended its lines to it."""
    (tmp_path / "train.log").write_text("my notes\n")
    (tmp_path / "events.jsonl").write_text('{"mine": 1}\n')
    log = TextLog()
    log.record(log.stamp("a line"), "info")
    assert sorted(log.attach(tmp_path)) == ["events.jsonl", "train.log"]
    log.record(log.stamp("another"), "info")
    log.close()
    assert (tmp_path / "train.log").read_text() == "my notes\n"
    assert (tmp_path / "events.jsonl").read_text() == '{"mine": 1}\n'

    ours = tmp_path / "ours"  # an earlier start's files (the page's runs start with its own header) go on
    ours.mkdir()
    (ours / "train.log").write_text("=== indextts-train webui 2026-11-28 10:00:00: python -m indextts_train\n")
    first = TextLog()
    assert first.attach(ours) == []
    first.record(first.stamp("one"), "info")
    first.close()
    again = TextLog()
    assert again.attach(ours) == [] and (ours / "train.log").read_text().count("=== start ") == 2
    again.close()
    kinds = [json.loads(line)["kind"] for line in (ours / "events.jsonl").read_text().splitlines()]
    assert kinds == ["start", "info", "start"]  # made by the first start, appended to by the second
