"""train.log: the stamped console lines of every start, held until the run folder is claimed."""

from __future__ import annotations

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
