"""Every command that writes where the user says, through the public commands: an existing file is
replaced only with --force, a link is never followed to write its target, and an output that is a
file, under a file or empty is one line, exit 2, with every file as it was."""

from __future__ import annotations

from pathlib import Path

import pytest
from helpers import ROOT, assert_refused, run_cli, tree_state

from indextts_train.errors import UserError

PAIRS = ROOT / "tests" / "data" / "reference" / "tiny" / "pairs.jsonl"
TINY_BPE = ROOT / "tests" / "data" / "reference" / "prepare" / "text" / "bpe_tiny.model"  # 150 pieces
TURKISH = ["Bugün hava çok güzel, Ayşe ile parka gidiyoruz.", "Öğretmenimiz yarın sınavı erteleyeceğini söyledi.",
           "Çocuklar bahçede top oynarken Ömer kitabını okuyordu.", "Güzel bir günün ardından herkes evine döndü.",
           "Şehrin eski sokaklarında yürümek insana huzur veriyor.", "Ağaçların yaprakları sonbaharda sararıp."]


def _user_files(tmp_path: Path) -> tuple[Path, Path]:
    """A user file, a link to it, and a plain file to put outputs under."""
    (tmp_path / "precious.txt").write_text("mine")
    (tmp_path / "link").symlink_to(tmp_path / "precious.txt")
    (tmp_path / "a_file").write_text("also mine")
    return tmp_path / "precious.txt", tmp_path / "link"


@pytest.mark.slow
def test_check_data_write_clean_replaces_only_with_force_and_never_a_links_target(tmp_path) -> None:
    precious, link = _user_files(tmp_path)
    before = tree_state(tmp_path)
    cases = [(precious, "already exists; pass --force"), (link, "is a symbolic link"),
             (tmp_path / "a_file" / "clean.jsonl", "is a file, not a folder")]
    for target, message in cases:
        assert_refused(run_cli("check-data", PAIRS, "--write-clean", target), f"--write-clean {target}", message)
        assert tree_state(tmp_path) == before
    forced = run_cli("check-data", PAIRS, "--write-clean", link, "--force")
    assert forced.returncode == 0, forced.stderr
    assert not link.is_symlink() and link.read_text().count("\n") == len(PAIRS.read_text().splitlines())
    assert precious.read_text() == "mine"  # the link was replaced, never its target


@pytest.mark.slow
def test_extend_tokenizer_never_replaces_a_model_or_its_vocab_without_force(tmp_path) -> None:
    precious, link = _user_files(tmp_path)
    corpus = tmp_path / "turkish.txt"
    corpus.write_text("\n".join(TURKISH) + "\n", encoding="utf-8")
    (tmp_path / "old.model").write_bytes(b"an earlier model")
    (tmp_path / "new.vocab").write_text("an earlier vocab")  # beside a new .model: replaced with it
    (tmp_path / "linked.model").symlink_to(precious)
    before = tree_state(tmp_path)
    args = ["extend-tokenizer", "--base", TINY_BPE, "--corpus", corpus, "--target-size", 160, "--normalizer", "none"]
    for target, message in [("old.model", "old.model already exists"), ("new.model", "new.vocab already exists"),
                            ("linked.model", "is a symbolic link"), ("a_file/x.model", "is a file, not a folder")]:
        assert_refused(run_cli(*args, "-o", tmp_path / target), "--output", message)
        assert tree_state(tmp_path) == before
    forced = run_cli(*args, "-o", tmp_path / "linked.model", "--force")
    assert forced.returncode == 0, forced.stderr
    assert not (tmp_path / "linked.model").is_symlink() and precious.read_text() == "mine"


@pytest.mark.slow
def test_output_folders_that_cannot_be_folders_are_one_line(tmp_path) -> None:
    _user_files(tmp_path)
    (tmp_path / "demo_done").mkdir()
    before = tree_state(tmp_path)
    under = tmp_path / "a_file" / "out"
    commands = [
        (["tokenize", PAIRS, "--tokenizer", TINY_BPE, "--out", tmp_path / "a_file"], "--out", "is a file"),
        (["tokenize", PAIRS, "--tokenizer", TINY_BPE, "--out", under], "--out", "is a file, not a folder"),
        (["demo", tmp_path / "a_file"], "OUT_DIR", "is a file"),
        (["demo", under, "--max-steps", 1], "OUT_DIR", "is a file, not a folder"),
        (["demo", ""], "OUT_DIR is empty"),
        (["train", "--train-manifest", PAIRS, "--output-dir", ""], "--output-dir is empty"),
        (["train", "--train-manifest", PAIRS, "--output-dir="], "--output-dir is empty"),
        (["train", "--train-manifest", PAIRS, "--output-dir", under], "is a file"),
    ]
    for args, *needles in commands:
        assert_refused(run_cli(*args, cwd=tmp_path / "demo_done"), *needles)
        assert tree_state(tmp_path) == before


def test_the_demo_writes_only_in_a_folder_of_its_own(tmp_path) -> None:
    """`demo OUT` replaced OUT/export/gpt.pth (its export passes --force) and wrote data/ and models/
    beside whatever OUT held; now a folder holding anything it did not make is refused, unchanged."""
    from indextts_train.demo import MARKER, claim_demo_folder, run_demo
    from indextts_train.errors import UserError

    theirs = tmp_path / "theirs"
    (theirs / "export").mkdir(parents=True)
    (theirs / "export" / "gpt.pth").write_bytes(b"their model")
    (theirs / "config.yaml").write_text("gpt: {}\n")
    before = tree_state(theirs)
    with pytest.raises(UserError, match=r"OUT_DIR .*theirs: holds files the demo did not make \(config.yaml, export\)"):
        run_demo(theirs, max_steps=1)
    assert tree_state(theirs) == before
    claim_demo_folder(tmp_path / "new")  # new, or empty: the demo's from now on
    assert sorted(p.name for p in (tmp_path / "new").iterdir()) == [MARKER]
    earlier = tmp_path / "earlier"  # a demo of a version before the mark: its config.yaml is the tiny one
    earlier.mkdir()
    (earlier / "config.yaml").write_bytes((ROOT / "configs" / "tiny_v25.yaml").read_bytes())
    (earlier / "run").mkdir()
    claim_demo_folder(earlier)
    claim_demo_folder(earlier)
    assert (earlier / MARKER).is_file()


def test_a_file_output_given_a_folder_path_is_one_line(tmp_path, capsys) -> None:
    """`-o out/` ended as a file named `out` (Path drops the slash): the export, the grown tokenizer or the
    clean manifest written under the folder's name. Refused before any work, with the file meant."""
    from indextts_train.cli import app, run_app

    _user_files(tmp_path)
    before = tree_state(tmp_path)
    out = f"{tmp_path / 'out'}/"
    cases = [(["export", tmp_path / "x.pth", "-o", out], f"-o {out} names a folder; give the path of the file to "
                                                           f"write (e.g. {out}gpt.pth)"),
             (["export", tmp_path / "x.pth", f"--output={out}"], f"--output {out} names a folder"),
             (["extend-tokenizer", "--base", TINY_BPE, "--corpus", PAIRS, "--target-size", "200", "-o", out],
              f"(e.g. {out}bpe.model)"),
             (["check-data", PAIRS, "--write-clean", out], f"(e.g. {out}clean.jsonl)"),
             (["export", tmp_path / "x.pth", "-o", tmp_path / "gpt.pth", "--config-out", out],
              f"(e.g. {out}config.yaml)"),
             # `.`, `..` and `out/.` name folders too (Path drops the `.`): `-o .` raised a traceback
             (["export", tmp_path / "x.pth", "-o", "."], "-o . names a folder; give the path of the file to write "
                                                         "(e.g. ./gpt.pth)"),
             (["export", tmp_path / "x.pth", "-o", ".."], "(e.g. ../gpt.pth)"),
             (["export", tmp_path / "x.pth", "-o", f"{tmp_path / 'out'}/."], f"(e.g. {tmp_path / 'out'}/./gpt.pth)"),
             (["check-data", PAIRS, "--write-clean", "/"], "--write-clean / names a folder")]
    for args, said in cases:
        assert run_app(app, [str(a) for a in args]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and said in err, err
    assert tree_state(tmp_path) == before and not (tmp_path / "out").exists()


def test_the_root_folder_has_no_folder_above_it_to_check() -> None:
    """`tokenize --out /` raised StopIteration: the check of the folder above found none above the root."""
    from indextts_train.files.targets import check_output_folder, check_parent

    check_output_folder("--out", Path("/"))
    check_parent("--out", Path("/"))
    with pytest.raises(UserError, match="is a file, not a folder"):
        check_parent("--out", Path("/dev/null/x"))
