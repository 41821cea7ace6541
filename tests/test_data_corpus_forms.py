"""A corpus for `prepare` given where a manifest belongs is said as such, with the command that makes one."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest

from indextts_train.data import corpus_forms
from indextts_train.data.checkdata import check_manifests
from indextts_train.data.corpus_forms import LOOKED_AT, SUBFOLDERS, corpus_form, refuse_corpus
from indextts_train.data.manifest import ManifestIndex
from indextts_train.errors import UserError


def corpora(root: Path) -> dict[str, Path]:
    """One of each form a newcomer passes as --train-manifest."""
    (root / "lj" / "wavs").mkdir(parents=True)
    (root / "lj" / "metadata.csv").write_text("LJ001-0001|Printing|Printing\n")
    (root / "clips").mkdir()
    (root / "clips" / "a.wav").write_bytes(b"RIFF")
    (root / "speakers" / "alice").mkdir(parents=True)
    (root / "speakers" / "alice" / "x.flac").write_bytes(b"fLaC")
    (root / "cv.tsv").write_text("client_id\tpath\tsentence\n")
    (root / "corpus.jsonl").write_text(json.dumps({"audio": "clips/a.wav", "text": "hello"}) + "\n")
    return {"an LJSpeech folder": root / "lj", "an LJSpeech-style metadata.csv": root / "lj" / "metadata.csv",
            "a folder of audio clips": root / "clips", "a Common Voice .tsv": root / "cv.tsv",
            "an audio clip": root / "clips" / "a.wav"}


def test_each_corpus_form_is_told(tmp_path) -> None:
    for form, path in corpora(tmp_path).items():
        assert corpus_form(path) == form, path
    assert corpus_form(tmp_path / "speakers") == "a folder of audio clips"  # clips one folder down (a speaker's)


def test_manifests_and_what_is_not_there_are_left_to_their_readers(tmp_path, tiny_data) -> None:
    manifest = Path(tiny_data["train"])
    assert corpus_form(manifest) is None and corpus_form(manifest.parent) is None  # features: .npy, no clips
    assert corpus_form(tmp_path / "missing.csv") is None  # the reader says it is not there
    (tmp_path / "bad.jsonl").write_text("not json\n")
    (tmp_path / "empty.jsonl").write_text("")
    (tmp_path / "paths.jsonl").write_text(json.dumps({"audio": "a.wav", "text": "x", "codes_path": "c.npy"}) + "\n")
    assert [corpus_form(tmp_path / n) for n in ("bad.jsonl", "empty.jsonl", "paths.jsonl")] == [None] * 3
    corpora(tmp_path / "c")
    assert corpus_form(tmp_path / "c" / "corpus.jsonl") is None  # its lines tell it, no file is read here (below)


def test_a_folder_is_looked_at_within_bounds(tmp_path, monkeypatch) -> None:
    """A disk root given by mistake: at most LOOKED_AT entries of it, and of SUBFOLDERS of its folders."""
    big = tmp_path / "big"
    for sub in range(SUBFOLDERS + 3):
        (big / f"d{sub}").mkdir(parents=True)
    for i in range(LOOKED_AT + 50):
        (big / f"n{i:05d}.txt").write_bytes(b"")
        (big / "d0" / f"n{i:05d}.txt").write_bytes(b"")
    seen = []
    real_scandir = os.scandir

    def counted(path):
        class Counted:
            def __enter__(self):
                self.scan = real_scandir(path)
                return (seen.append(entry) or entry for entry in self.scan)

            def __exit__(self, *exc):
                self.scan.close()
        return Counted()

    monkeypatch.setattr(corpus_forms.os, "scandir", counted)
    assert corpus_form(big) is None
    assert LOOKED_AT < len(seen) <= LOOKED_AT * (1 + SUBFOLDERS)


def test_the_refusal_names_the_flag_and_the_command_to_run(tmp_path) -> None:
    paths = corpora(tmp_path)
    with pytest.raises(UserError) as refused:
        refuse_corpus(paths["an LJSpeech-style metadata.csv"], "--train-manifest")
    said = str(refused.value)
    assert said.startswith(f"--train-manifest {paths['an LJSpeech-style metadata.csv']} is an LJSpeech-style "
                           "metadata.csv, a corpus for `indextts-train prepare`, not a manifest")
    assert f"`indextts-train prepare {paths['an LJSpeech-style metadata.csv']} --model-dir MODEL_DIR --out " \
           "FEATURES`" in said and said.endswith("FEATURES/train.jsonl (and FEATURES/val.jsonl to --val-manifest)")
    with pytest.raises(UserError, match=rf"prepare {paths['a folder of audio clips']} --model-dir"):
        refuse_corpus(paths["an audio clip"])  # one clip: prepare reads its folder
    with pytest.raises(UserError, match="an LJSpeech-style metadata.csv"):
        check_manifests([paths["an LJSpeech-style metadata.csv"]])  # check-data's paths


def test_a_jsonl_corpus_line_is_told_where_lines_are_judged(tmp_path) -> None:
    """A JSONL of {"audio", "text"} lines given as a manifest: its first line says it, by every manifest reader
    (the line's form is judged in one place), with the prepare command; a manifest line with such keys is one."""
    from indextts_train.data.lines import line_form

    corpora(tmp_path)
    corpus = tmp_path / "corpus.jsonl"
    obj = json.loads(corpus.read_text())
    with pytest.raises(UserError) as refused:
        line_form(obj, f"{corpus}:1")
    assert str(refused.value) == (f"{corpus}:1: a corpus line (audio, text) for `indextts-train prepare`, not a "
                                  f"manifest line; run `indextts-train prepare {corpus} --model-dir MODEL_DIR --out "
                                  "FEATURES` (MODEL_DIR: the official model folder), then pass FEATURES/train.jsonl")
    with pytest.raises(UserError, match="a corpus line"):
        ManifestIndex.build([corpus])
    with pytest.raises(UserError, match="neither the paired form"):  # no audio: not a corpus line either
        line_form({"text": "x"}, f"{corpus}:1")
    assert line_form({**obj, "codes_path": "c.npy", "text_ids_path": "t.npy", "condition_path": "p.npy",
                      "emo_vec_path": "e.npy", "text_len": 1, "code_len": 1}, "x:1")["codes"] == "codes_path"


def test_a_manifest_reads_as_before(tiny_data) -> None:
    refuse_corpus(tiny_data["train"], "--train-manifest")  # a manifest passes
    report = check_manifests([tiny_data["train"]])
    assert report["files"] and not report["bad_lines"]


def test_check_data_of_a_jsonl_corpus_says_it_once(tmp_path) -> None:
    """check-data of prepare's corpus.jsonl reported each of its lines as a bad manifest line (72 for the demo's,
    20 of them printed, each with the prepare command); a first line of the corpus form now refuses the file."""
    corpora(tmp_path)
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text(corpus.read_text() * 30)
    with pytest.raises(UserError, match=rf"^{re.escape(str(corpus))}:1: a corpus line \(audio, text\)"):
        check_manifests([corpus])
