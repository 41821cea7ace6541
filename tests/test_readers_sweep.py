"""The readers a sweep of every file the package opens found unbounded: each is refused in one line now.

Sparse files stand in for huge ones (truncate: no disk is used); a FIFO stands in for a file swapped
for one between the check and the open (a read of it would block forever).
"""

from __future__ import annotations

import os
import threading
from pathlib import Path

import pytest

from indextts_train.data import checkdata, retokenize
from indextts_train.errors import UserError
from indextts_train.files.bounded import MAX_LINE_BYTES, iter_lines
from indextts_train.prepare import corpus, corpus_hf, models, ownership


def _sparse(path: Path, size: int) -> Path:
    with open(path, "wb") as handle:
        handle.truncate(size)
    return path


def _outcome_within(call, fifo: Path, seconds: float = 3.0):
    """What `call()` returned or raised, or "blocked" when it still read `fifo` after `seconds` (then
    unblocked: a writer opened and closed gives the reader its end of file)."""
    result: dict = {}

    def run() -> None:
        try:
            result["value"] = call()
        except Exception as exc:  # noqa: BLE001 - the test looks at what it was
            result["value"] = exc

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(seconds)
    if thread.is_alive():
        os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
        thread.join(seconds)
        return "blocked"
    return result["value"]


def test_a_manifest_of_holes_is_refused_before_it_is_hashed(tmp_path: Path) -> None:
    """tokenize hashed the whole manifest before reading a line: 100 GB of holes hashed for minutes."""
    holes = _sparse(tmp_path / "holes.jsonl", 4 * MAX_LINE_BYTES)
    with pytest.raises(UserError, match=r"holes.jsonl:1: a line longer than"):
        retokenize._sha256(holes)
    ours = tmp_path / "m.jsonl"
    ours.write_bytes(b'{"a": 1}\n\n{"b": 2}\n')
    import hashlib

    from indextts_train.files.bounded import sha256_lines  # new with this bound: imported here, not above

    assert sha256_lines(ours, "manifest") == hashlib.sha256(ours.read_bytes()).hexdigest()  # the file's own hash


def test_a_line_holding_nul_bytes_is_refused(tmp_path: Path) -> None:
    """The holes of a sparse file read as NULs: with a newline every few MB each line passed the length bound,
    and readers that skip a bad line (check-data, tokenize) read all 100 GB."""
    path = tmp_path / "holes.jsonl"
    path.write_bytes(b'{"a": 1}\n' + b"\0" * 1000 + b"\n")
    with pytest.raises(UserError, match=r"holes.jsonl:2: a NUL byte, which no manifest holds"):
        list(iter_lines(path, "manifest"))


def test_a_ledger_larger_than_prepare_writes_is_refused(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setattr(ownership, "MAX_LEDGER_BYTES", 1000, raising=False)
    (tmp_path / ownership.RECORDS).mkdir()
    ledger = _sparse(tmp_path / ownership.RECORDS / "written-0.txt", 2000)
    with pytest.raises(UserError, match=rf"{ledger}: 2000 bytes, more than a ledger of prepare's holds"):
        ownership.Ledger(tmp_path).stems()


def test_a_model_file_past_any_model_s_size_is_not_hashed(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setattr(models, "MAX_MODEL_FILE_BYTES", 100, raising=False)
    gpt = _sparse(tmp_path / "gpt.pth", 200)
    with pytest.raises(UserError, match=r"gpt.pth: a model file of 200 bytes, larger than any this reads"):
        models.sha256_file(gpt)


def test_a_dataset_s_json_is_read_within_bounds_before_datasets_reads_it(tmp_path: Path, monkeypatch) -> None:
    """datasets.load_from_disk reads state.json whole (json.load): 100 GB of holes went into memory."""
    datasets = pytest.importorskip("datasets")

    def never(*_args, **_kwargs):
        raise AssertionError("datasets read the folder before its JSON was bounded")

    monkeypatch.setattr(datasets, "load_from_disk", never)
    _sparse(tmp_path / "state.json", 100 << 30)
    (tmp_path / "dataset_info.json").write_text("{}")
    with pytest.raises(UserError, match=r"state.json: dataset state.json of 107374182400 bytes is larger"):
        corpus_hf._open(tmp_path)


def test_a_transcript_swapped_for_a_fifo_is_one_line(tmp_path: Path) -> None:
    fifo = tmp_path / "clip.txt"
    os.mkfifo(fifo)
    outcome = _outcome_within(lambda: corpus._read_transcript(fifo), fifo)
    assert isinstance(outcome, UserError) and "FIFO" in str(outcome)


def test_a_prepare_record_swapped_for_a_fifo_is_not_read(tmp_path: Path, monkeypatch) -> None:
    """check-data reads prepare.json beside the manifest: a FIFO there after the is_file check blocked it."""
    fifo = tmp_path / checkdata.PREPARE_RECORD
    os.mkfifo(fifo)
    monkeypatch.setattr(Path, "is_file", lambda self: True)  # the swap lands right after the check
    assert _outcome_within(lambda: checkdata._prepare_record_models([tmp_path / "train.jsonl"]), fifo) == {}
