"""The lines listen hears by default (listen/lines.py): held-out lines of the run's validation manifests."""

from __future__ import annotations

import re

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


def test_a_manifest_or_a_corpus_given_as_lines_is_said_as_such(tmp_path) -> None:
    """The two JSONL files a newcomer has at hand, given as --lines: what each is and what to do instead."""
    import json

    from indextts_train.listen.lines import read_lines_file

    (tmp_path / "a.wav").write_bytes(b"RIFF")
    cases = {"val.jsonl": ({"target_text": "hi", "prompt_audio_path": "a.wav", "target_codes_path": "c.npy"},
                           "line 1: a manifest line (target_text, prompt_audio_path); leave --lines out"),
             "corpus.jsonl": ({"audio": "a.wav", "text": "hi"}, "line 1: a corpus line (audio, text); a line to "
                                                                "hear names the voice to speak in as 'prompt_audio'")}
    for name, (line, said) in cases.items():
        (tmp_path / name).write_text(json.dumps(line) + "\n")
        with pytest.raises(UserError, match=re.escape(f"--lines {tmp_path / name} {said}")):
            read_lines_file(tmp_path / name)
    (tmp_path / "both.jsonl").write_text(json.dumps({"audio": "x.wav", "text": "hi", "prompt_audio": "a.wav"}) + "\n")
    assert [line.text for line in read_lines_file(tmp_path / "both.jsonl")] == ["hi"]  # a lines file with more keys


def test_a_lines_path_that_is_no_file_says_what_it_is(tmp_path) -> None:
    """A FIFO, a folder or a device given as --lines was "no such file"."""
    import os

    from indextts_train.listen.lines import read_lines_file

    os.mkfifo(tmp_path / "fifo.jsonl")
    for path, said in ((tmp_path / "fifo.jsonl", "a FIFO (named pipe), not a file"), (tmp_path, "a folder, not a file"),
                       (tmp_path / "none.jsonl", "no such file")):
        with pytest.raises(UserError, match=re.escape(f"--lines {path}: {said}; pass a JSONL file")):
            read_lines_file(path)
