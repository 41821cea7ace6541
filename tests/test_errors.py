"""The refusal line: one line whatever its message holds."""

from __future__ import annotations

from indextts_train.errors import UserError, error_line, one_line, user_line


def test_line_breaks_and_control_characters_are_escaped_and_tabs_kept() -> None:
    assert one_line("a\nb\r\x1b[31mc\td\x7f") == "a\\nb\\r\\x1b[31mc\td\\x7f"
    assert one_line("plain: é ✓") == "plain: é ✓"
    assert error_line("runs/a\nb: no such file") == "error: runs/a\\nb: no such file"


def test_user_line_is_one_line_also_from_a_worker_traceback() -> None:
    assert user_line(UserError("x\ny")) == "x\\ny"
    worker = UserError("Caught UserError in DataLoader worker process 0.\nOriginal Traceback (most recent call last):\n"
                       "  File ...\nindextts_train.errors.UserError: m.jsonl:3: bad\x1b line\n")
    assert user_line(worker) == "m.jsonl:3: bad\\x1b line"
