"""The lines listen hears by default (listen/lines.py): held-out lines of the run's validation manifests."""

from __future__ import annotations

import pytest

from indextts_train.errors import UserError
from indextts_train.listen.lines import default_lines
from indextts_train.ui.run_record import write_run_record


@pytest.mark.parametrize("record", [None, {"train_manifests": ["train.jsonl"]}])
def test_a_run_without_validation_lines_says_to_pass_lines(tmp_path, record) -> None:
    """A run started without --val-manifest (or a folder with no run.yaml) has no held-out lines."""
    if record is not None:
        write_run_record(tmp_path, record, {}, {}, 0.0)
    with pytest.raises(UserError) as refused:
        default_lines(tmp_path, seed=0)
    assert str(refused.value) == (f"{tmp_path / 'run.yaml'}: the run was started without --val-manifest (or no "
                                  "run.yaml records it), so there are no held-out lines to hear; pass --lines "
                                  "FILE.jsonl")
