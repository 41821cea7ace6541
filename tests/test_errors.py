"""The refusal line: one line whatever its message holds."""

from __future__ import annotations

from indextts_train.errors import ListedError, UserError, error_line, one_line, refusal, user_line


def test_line_breaks_and_control_characters_are_escaped_and_tabs_kept() -> None:
    assert one_line("a\nb\r\x1b[31mc\td\x7f") == "a\\nb\\r\\x1b[31mc\td\\x7f"
    assert one_line("plain: é ✓") == "plain: é ✓"
    assert error_line("runs/a\nb: no such file") == "error: runs/a\\nb: no such file"


def test_user_line_is_one_line_also_from_a_worker_traceback() -> None:
    assert user_line(UserError("x\ny")) == "x\\ny"
    worker = UserError("Caught UserError in DataLoader worker process 0.\nOriginal Traceback (most recent call last):\n"
                       "  File ...\nindextts_train.errors.UserError: m.jsonl:3: bad\x1b line\n")
    assert user_line(worker) == "m.jsonl:3: bad\\x1b line"



def test_a_listed_refusal_keeps_its_lines_and_escapes_each() -> None:
    """--resume auto's refusal lists every file of the folder, a line each: its breaks are its own; a control
    character in a line is escaped, and the lister escapes a name's line break before it joins the lines."""
    from pathlib import Path

    from indextts_train.checkpoint.verify import _refuse_fresh_start

    listed = ListedError("head:\n  a\x1b[2J.pth: bad\n  or not")
    assert refusal(listed) == "error: head:\n  a\\x1b[2J.pth: bad\n  or not"
    said = refusal(_refuse_fresh_start(Path("run"), [(Path("run/a\nb.pth"), "INCOMPLETE: x")]))
    assert said.splitlines() == [
        "error: --resume auto: run holds checkpoints but none of them can resume this run, so nothing was started "
        "and no file was changed:",
        "  run/a\\nb.pth: INCOMPLETE: x; it cannot be used; keep it, or remove it yourself if you do not need it",
        "  or start a new run with another --output-dir"]


def test_a_refusal_naming_a_value_of_100000_characters_is_a_line_of_readable_length() -> None:
    """A path or flag value of 100,000 characters made the refusal a line that long; its middle is left out, its
    start (the flag) and end (what to do) kept."""
    value = "A" * 100_000
    for line in (error_line(f"--out {value}: cannot write; use a shorter path"),
                 refusal(UserError(f"--out {value}: cannot write; use a shorter path"))):
        assert len(line) < 2100 and "\n" not in line
        assert line.startswith("error: --out AAA") and line.endswith("use a shorter path")
        assert "characters left out" in line
    assert error_line("short") == "error: short"
