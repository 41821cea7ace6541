"""The test hooks read from the environment at import (files/faults.py)."""

from __future__ import annotations

import importlib

from indextts_train.files import faults


def test_a_nan_hook_word_that_is_no_step_names_none(monkeypatch) -> None:
    """INDEXTTS_TRAIN_NAN_AT=abc was a ValueError at import: every command's traceback, before any of its work."""
    monkeypatch.setenv("INDEXTTS_TRAIN_NAN_AT", "abc,3, 4,²")
    try:
        importlib.reload(faults)
        assert [step for step in range(6) if faults.nan_loss_at(step)] == [3, 4]
    finally:
        monkeypatch.delenv("INDEXTTS_TRAIN_NAN_AT")
        importlib.reload(faults)
    assert not any(faults.nan_loss_at(step) for step in range(6))
