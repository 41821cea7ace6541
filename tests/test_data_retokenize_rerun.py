"""`indextts-train tokenize` killed and run again: the same command finishes the job (or skips what is
done), and what no tokenize of the same inputs wrote is still refused, untouched."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from typer.testing import CliRunner

from indextts_train.cli import app
from indextts_train.data import retokenize
from tests.conftest import REFERENCE

TOKENIZER = REFERENCE / "prepare" / "text" / "bpe_tiny.model"


def _manifests(tmp_path: Path) -> list[Path]:
    """Two manifests beside the reference's tiny arrays: a.jsonl (3 lines), b.jsonl (its first 2)."""
    folder = tmp_path / "data"
    shutil.copytree(REFERENCE / "tiny", folder, ignore=shutil.ignore_patterns("*.pth"))
    lines = [json.loads(line) for line in (folder / "pairs.jsonl").read_text(encoding="utf-8").splitlines()]
    for line, word in zip(lines, ("zero", "one", "two"), strict=True):
        line["target_text"] = f"tiny target sentence {word}"  # no digits: no normaliser needed
    lines = [json.dumps(line) + "\n" for line in lines]
    (folder / "a.jsonl").write_text("".join(lines), encoding="utf-8")
    (folder / "b.jsonl").write_text("".join(lines[:2]), encoding="utf-8")
    return [folder / "a.jsonl", folder / "b.jsonl"]


def _tokenize(manifests: list[Path], out: Path, tokenizer: Path = TOKENIZER):
    return CliRunner().invoke(app, ["tokenize", *map(str, manifests), "--tokenizer", str(tokenizer),
                                    "--out", str(out), "--normalizer", "none"])


def _tree(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def _killed_after(monkeypatch: pytest.MonkeyPatch, lines: int) -> None:
    """The next tokenize stops as a kill would, after `lines` lines' arrays, leaving half an array behind."""
    real, calls = retokenize._new_line, []

    def new_line(obj, where, text_path, ids_dir, line_no, to_dir):
        if len(calls) == lines:
            (ids_dir / f"{line_no}.target_text.npy").write_bytes(b"\x93NUMPY half")
            raise KeyboardInterrupt
        calls.append(line_no)
        return real(obj, where, text_path, ids_dir, line_no, to_dir)

    monkeypatch.setattr(retokenize, "_new_line", new_line)


def test_a_killed_tokenize_finishes_on_the_same_command(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    manifests = _manifests(tmp_path)
    assert _tokenize(manifests, tmp_path / "ref" / "out").exit_code == 0
    out = tmp_path / "run" / "out"  # as deep as the reference: the same relative paths
    _killed_after(monkeypatch, 4)  # a.jsonl done (3 lines), b.jsonl killed in its second line
    assert _tokenize(manifests, out).exit_code == 130
    assert (out / "a.jsonl").is_file() and not (out / "b.jsonl").exists()
    monkeypatch.undo()
    again = _tokenize(manifests, out)
    assert again.exit_code == 0, again.output
    assert "a.jsonl: 3 line(s) (finished by an earlier run of this command; kept)" in again.stdout
    assert "b.jsonl: 2 line(s)\n" in again.stdout
    assert _tree(out) == _tree(tmp_path / "ref" / "out")  # byte for byte, and no half array or temp file left
    assert _tokenize(manifests, out).stdout.count("finished by an earlier run") == 2


def test_a_folder_killed_before_its_record_is_taken_up(tmp_path: Path):
    manifests = _manifests(tmp_path)[:1]
    out = tmp_path / "out"
    (out / "text_ids" / "a").mkdir(parents=True)  # killed between making the folder and writing its record
    (out / "text_ids" / "a" / ".tokenize.json.tmp-999999999").write_text("{")  # a killed record write
    assert _tokenize(manifests, out).exit_code == 0
    assert sorted(p.name for p in (out / "text_ids" / "a").iterdir()) == [
        "1.target_text.npy", "2.target_text.npy", "3.target_text.npy", "tokenize.json"]


def test_what_tokenize_cannot_prove_it_wrote_is_refused(tmp_path: Path):
    manifests = _manifests(tmp_path)[:1]
    out = tmp_path / "out"
    assert _tokenize(manifests, out).exit_code == 0
    ids = out / "text_ids" / "a"
    (out / "a.jsonl").write_text("edited by hand\n")  # a published manifest the user changed
    result = _tokenize(manifests, out)
    assert result.exit_code == 2 and "a.jsonl: already exists" in result.stderr
    assert (out / "a.jsonl").read_text() == "edited by hand\n"
    (out / "a.jsonl").unlink()
    (ids / "notes.txt").write_text("mine")  # a file of the user's in the ids folder
    result = _tokenize(manifests, out)
    assert result.exit_code == 2 and "holds notes.txt, which tokenize did not write" in result.stderr
    (ids / "notes.txt").unlink()
    before, lines = _tree(out), manifests[0].read_text(encoding="utf-8")
    manifests[0].write_text(lines + lines.splitlines(keepends=True)[0], encoding="utf-8")  # other inputs
    result = _tokenize(manifests, out)
    assert result.exit_code == 2 and "made by a tokenize of other inputs (manifest's lines not the same)" \
        in result.stderr
    manifests[0].write_text(lines, encoding="utf-8")
    assert _tree(out) == before
    (ids / "tokenize.json").unlink()  # no record: nothing proves the arrays are tokenize's
    result = _tokenize(manifests, out)
    assert result.exit_code == 2 and "holds no tokenize.json" in result.stderr
    assert _tree(out) == {k: v for k, v in before.items() if not k.endswith("tokenize.json")}
