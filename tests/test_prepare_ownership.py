"""`prepare --out` writes, replaces and removes only its own files, through the public command.

A folder holding files prepare did not write where it writes (any of its array folders, its records,
its manifests, a linked folder) is refused in one line before any model is read, and every file in
it stays as it was, also with --restart. A run that prepared nothing (a failed start) is simply
replaced; two ids that clean to the same name both prepare, and so does every rerun; a rerun removes
the temp files of a killed first write.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from pathlib import Path

import pytest
from helpers import ROOT, assert_refused, run_cli, tree_state

from indextts_train.errors import NotOwnFile, UserError
from indextts_train.prepare.outputs import OutputFolder
from indextts_train.prepare.ownership import Ledger
from indextts_train.prepare.tiny import write_synthetic_clips, write_tiny_model_dir

TOKENIZER = ROOT / "tests" / "data" / "reference" / "prepare" / "text" / "bpe_tiny.model"


def _user_files(out: Path, outside: Path, case: str) -> None:
    """A folder as a user might have it before pointing --out at it."""
    out.mkdir()
    (out / "notes.txt").write_text("mine")  # beside prepare's names: never touched, never a reason to refuse
    outside.mkdir()
    (outside / "theirs.npy").write_bytes(b"precious")
    if case in ("text_ids", "codes", "condition", "spk_emb", "emo_vec", "records"):
        (out / case).mkdir()
        (out / case / ("utt0000.json" if case == "records" else "utt0000.npy")).write_bytes(b"user data")
    elif case == "linked_folder":
        (out / "codes").symlink_to(outside, target_is_directory=True)
    elif case == "linked_manifest":
        (out / "train.jsonl").symlink_to(outside / "theirs.npy")
    elif case == "manifest":
        (out / "prepare.json").write_text("{}")


@pytest.mark.slow
@pytest.mark.parametrize(("case", "restart"), [("condition", True), ("records", False), ("linked_folder", True),
                                               ("linked_manifest", False)])
def test_a_folder_with_foreign_files_is_refused_and_left_as_it_was(tmp_path, case, restart) -> None:
    out, outside = tmp_path / "out", tmp_path / "outside"
    _user_files(out, outside, case)
    before = tree_state(tmp_path)
    # no model folder, no corpus: the refusal comes before either is read
    result = run_cli("prepare", tmp_path / "corpus.jsonl", "--model-dir", tmp_path / "models", "--out", out,
                     "--device", "cpu", *(["--restart"] if restart else []))
    line = assert_refused(result, f"--out {out}", "was not written by prepare", "move it out")
    assert "notes.txt" not in line
    assert tree_state(tmp_path) == before


@pytest.mark.parametrize("case", ["text_ids", "codes", "condition", "spk_emb", "emo_vec", "records",
                                  "linked_folder", "linked_manifest", "manifest"])
def test_each_place_prepare_writes_is_checked(tmp_path, case) -> None:
    """The same check as above in-process, for every folder and name prepare writes."""
    out, outside = tmp_path / "out", tmp_path / "outside"
    _user_files(out, outside, case)
    before = tree_state(tmp_path)
    for restart in (False, True):
        with pytest.raises(UserError, match="was not written by prepare"):
            OutputFolder(out).guard_settings({"models": {}}, restart=restart)
        assert tree_state(tmp_path) == before


@pytest.mark.slow
@pytest.mark.parametrize("where", ["file", "under_file"])
def test_an_out_that_is_a_file_or_under_one_is_one_line(tmp_path, where) -> None:
    (tmp_path / "a_file").write_text("mine")
    out = tmp_path / "a_file" if where == "file" else tmp_path / "a_file" / "out"
    before = tree_state(tmp_path)
    result = run_cli("prepare", tmp_path / "corpus.jsonl", "--model-dir", tmp_path / "models", "--out", out)
    assert_refused(result, "--out", "is a file, not a folder")
    assert tree_state(tmp_path) == before


@pytest.fixture
def corpus(tmp_path) -> Path:
    write_tiny_model_dir(tmp_path / "models", gpt_config=ROOT / "configs" / "tiny.yaml", tokenizer=TOKENIZER, seed=1)
    corpus = write_synthetic_clips(tmp_path / "clips", [("Hello world, this is a test.", None)] * 3, speakers=2,
                                   seed=4, seconds=(0.6, 1.1))
    lines = [json.loads(line) for line in corpus.read_text().splitlines()]
    cleaned = f"a_b-{hashlib.sha256(b'a/b').hexdigest()[:12]}"  # the name the id a/b used to be stored under
    for line, uid in zip(lines, ["a/b", cleaned, "utt0000"], strict=True):
        line["id"] = uid
    corpus.write_text("".join(json.dumps(line) + "\n" for line in lines))
    return corpus


def _prepare(tmp_path: Path, corpus: Path, *extra: object):
    return run_cli("prepare", corpus, "--model-dir", tmp_path / "models", "--out", tmp_path / "out",
                   "--device", "cpu", "--val-fraction", "0", *extra)


@pytest.mark.slow
def test_reruns_failed_starts_restart_and_temps(tmp_path, corpus) -> None:
    out = tmp_path / "out"
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    (tmp_path / "bad.model").write_text("not a tokenizer")
    failed = _prepare(tmp_path, corpus, "--tokenizer", tmp_path / "bad.model")
    assert_refused(failed, "bad.model")
    first = _prepare(tmp_path, corpus)  # nothing was prepared: no "prepared with other models"
    assert first.returncode == 0, first.stderr
    report = json.loads((out / "prepare.json").read_text())
    assert report["counts"]["kept"] == 3  # a/b and the id that looks like its cleaned name: two files
    manifests = {name: (out / name).read_bytes() for name in ("utterances.jsonl", "train.jsonl", "prepare.json")}
    again = _prepare(tmp_path, corpus)
    assert again.returncode == 0, again.stderr
    assert {name: (out / name).read_bytes() for name in manifests} == manifests

    (out / "codes" / "my_precious.npy").write_bytes(b"user data")
    before = tree_state(tmp_path)
    refused = _prepare(tmp_path, corpus, "--restart")  # (without --restart: the tests above)
    assert_refused(refused, "codes/my_precious.npy was not written by prepare")
    assert tree_state(tmp_path) == before

    (out / "codes" / "my_precious.npy").unlink()
    stale = [out / ".prepare.settings.json.tmp-999999", out / "codes" / ".utt0000.npy.tmp-999999"]
    for path in stale:
        path.write_bytes(b"half")  # as a run killed inside a write leaves them
    restarted = _prepare(tmp_path, corpus, "--restart")
    assert restarted.returncode == 0, restarted.stderr
    assert not any(path.exists() for path in stale)
    assert (out / "notes.txt").read_text() == "mine"
    assert {name: (out / name).read_bytes() for name in manifests} == manifests


def test_a_ledger_line_cut_by_a_kill_claims_nothing_and_the_next_claim_starts_a_line(tmp_path) -> None:
    ledger = Ledger(tmp_path, rank=1)
    ledger.claim(["utt0000", "utt0001"])
    with open(ledger.path, "ab") as handle:
        handle.write(b"utt00")  # killed inside the append of utt0002
    assert Ledger(tmp_path).stems() == {"utt0000", "utt0001"}
    Ledger(tmp_path, rank=1).claim(["utt0002", "utt0000"])  # listed ones are not appended again
    assert ledger.path.read_bytes() == b"utt0000\nutt0001\nutt0002\n"


def test_a_ledger_is_read_a_bounded_line_at_a_time_and_never_through_a_link(tmp_path) -> None:
    """A line longer than any stem (8 MB, read in pieces of a stem's length) claims nothing, not even its
    stem-sized tail; a ledger name that is a link is not prepare's ledger: its target is not read."""
    ledger = Ledger(tmp_path)
    ledger.claim(["utt0000"])
    with open(ledger.path, "ab") as handle:
        handle.write(b"x" * (8 << 20) + b"utt0009\n")
    (tmp_path / "outside.txt").write_bytes(b"utt0005\n")
    (ledger.folder / "written-1.txt").symlink_to(tmp_path / "outside.txt")
    assert Ledger(tmp_path).stems() == {"utt0000"}
    assert [p.name for p in Ledger(tmp_path).files()] == ["written-0.txt"]


def test_a_ledger_is_appended_to_only_when_it_is_a_file_of_prepares_own(tmp_path) -> None:
    """The append and the cut of a killed line went through a link or into another name's bytes."""
    theirs = tmp_path / "theirs.txt"
    theirs.write_bytes(b"their notes, no line end")
    for make in (lambda path: path.symlink_to(theirs), lambda path: os.link(theirs, path)):
        ledger = Ledger(tmp_path / "out")
        ledger.folder.mkdir(parents=True, exist_ok=True)
        make(ledger.path)
        with pytest.raises(NotOwnFile):
            ledger.claim(["utt0000"])
        assert theirs.read_bytes() == b"their notes, no line end"
        ledger.path.unlink()


def test_a_folder_of_a_version_without_a_ledger_is_adopted_from_its_records(tmp_path) -> None:
    out = tmp_path / "out"
    (out / "records").mkdir(parents=True)
    (out / "codes").mkdir()
    for stem in ("utt0000", "utt0001"):
        (out / "records" / f"{stem}.json").write_text("{}")
        (out / "codes" / f"{stem}.npy").write_bytes(b"array")
    (out / "prepare.settings.json").write_text(json.dumps({"models": {}}))
    OutputFolder(out).guard_settings({"models": {}}, restart=False)
    assert Ledger(out).stems() == {"utt0000", "utt0001"} and [p.name for p in Ledger(out).files()] == ["written-0.txt"]
    (out / "codes" / "utt0002.npy").write_bytes(b"user data")  # no record, not listed: not prepare's
    with pytest.raises(UserError, match="codes/utt0002.npy was not written by prepare"):
        OutputFolder(out).guard_settings({"models": {}}, restart=True)


def test_a_model_or_a_run_folder_as_out_is_refused_unless_prepare_started_there(tmp_path) -> None:
    """`--out checkpoints` (the release's model folder) or a run folder: prepare's arrays and manifests would
    mix with their files. Refused before any work, unchanged; an --out prepare already started goes on."""
    model, run = tmp_path / "checkpoints", tmp_path / "run"
    for folder, names in ((model, ("gpt.pth", "config.yaml")), (run, ("model_step2.pth", "latest.pth"))):
        folder.mkdir()
        for name in names:
            (folder / name).write_bytes(b"theirs")
    before = tree_state(tmp_path)
    for folder, held in ((model, "a model (gpt.pth, config.yaml)"), (run, "a run (its checkpoints)")):
        with pytest.raises(UserError, match=rf"^--out {folder} holds {re.escape(held)}: prepare writes its arrays "
                                            r"and manifests into a folder of its own"):
            OutputFolder(folder).check_foreign()
    assert tree_state(tmp_path) == before
    (model / "prepare.settings.json").write_text("{}")  # a prepare of an earlier release started here
    OutputFolder(model).check_foreign()


def test_a_crafted_record_or_settings_file_is_one_line(tmp_path) -> None:
    """A record nested 200,000 deep or holding a number of 5,000 digits was a traceback (RecursionError,
    ValueError); it is prepare's one line, which says how to start over."""
    folder = OutputFolder(tmp_path / "out")
    folder.record_path("a").parent.mkdir(parents=True)
    for text in ("[" * 200_000 + "]" * 200_000, '{"source": ' + "9" * 5000 + "}"):
        folder.record_path("a").write_text(text)
        with pytest.raises(UserError, match="not a record prepare wrote; rerun with --restart"):
            folder.read_record("a", "clip.wav")
        (tmp_path / "settings.json").write_text(text)
        with pytest.raises(UserError, match="not a settings file prepare wrote; rerun with --restart"):
            folder._previous_settings(tmp_path / "settings.json")
