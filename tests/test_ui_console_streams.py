"""The console of a run whose standard streams are not what a terminal gives (ui/console.py)."""

from __future__ import annotations

import sys

from indextts_train.ui.console import RunLogger


def test_a_run_started_with_stdout_closed_logs_without_a_console(monkeypatch, tmp_path) -> None:
    """`train-gpt ... >&-`: Python's sys.stdout is None, and `sys.stdout.isatty()` ended the start in an
    AttributeError traceback before any line; the run's lines still reach its text log."""
    monkeypatch.setattr(sys, "stdout", None)
    logger = RunLogger(None, 0, tensorboard=False)
    assert logger.interactive is False
    logger.text_log.attach(tmp_path)
    logger.info("a line with no console to show it")
    logger.text_log.close()
    assert "a line with no console to show it" in (tmp_path / "train.log").read_text()
