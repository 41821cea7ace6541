"""`indextts-train tokenize`: manifests re-encoded through the official text path, originals untouched."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import sentencepiece
from typer.testing import CliRunner

from indextts_train.cli import app
from indextts_train.text.tiktoken_vocab import read_tiktoken
from tests.conftest import REFERENCE

TEXT = REFERENCE / "prepare" / "text"
V2_CASES = {c["id"]: c for c in json.loads((TEXT / "text_cases.json").read_text(encoding="utf-8"))["cases"]}
V25_CASES = {c["id"]: c for c in json.loads((TEXT / "tiktoken_cases.json").read_text(encoding="utf-8"))["cases"]}


def _copy(source: Path, tmp_path: Path, texts: list[dict]) -> Path:
    """The reference's tiny folder with the given text fields set on its three lines."""
    folder = tmp_path / "data"
    shutil.copytree(source, folder, ignore=shutil.ignore_patterns("*.pth"))
    manifest = folder / "pairs.jsonl"
    lines = [json.loads(line) for line in manifest.read_text().splitlines()]
    for line, fields in zip(lines, texts, strict=True):
        line.update(fields)
    manifest.write_text("".join(json.dumps(line, ensure_ascii=False) + "\n" for line in lines), encoding="utf-8")
    return manifest


def _snapshot(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def _run(*args: str):
    return CliRunner().invoke(app, ["tokenize", *args])


def test_tokenize_indextts2_end_to_end(tmp_path: Path):
    manifest = _copy(REFERENCE / "tiny", tmp_path, [
        {"target_text": V2_CASES["en_plain"]["text"], "prompt_text": V2_CASES["single_char_cjk"]["text"],
         "prompt_text_ids_path": "text_ids/tgt0.npy", "prompt_text_len": 7},
        {"target_text": "The quick brown fox jumps over the lazy dog near the river bank..."},
        {"target_text": "Hello 3"},  # digits: only WeTextProcessing spells them as inference does
    ])
    before = _snapshot(manifest.parent)
    out = tmp_path / "out"
    result = _run(str(manifest), "--tokenizer", str(TEXT / "bpe_tiny.model"), "--out", str(out),
                  "--normalizer", "none")
    assert result.exit_code == 1, result.output
    assert "normaliser: character map only" in result.stdout
    assert f"{manifest}:3: target_text has digits, which official inference spells out with WeTextProcessing" \
        in result.stdout
    assert _snapshot(manifest.parent) == before  # originals untouched
    new = [json.loads(line) for line in (out / "pairs.jsonl").read_text(encoding="utf-8").splitlines()]
    assert [line["id"] for line in new] == ["tgt0__prm0", "tgt1__prm1"]
    # the second text as official inference gives it to SentencePiece, written out by hand
    second = sentencepiece.SentencePieceProcessor(model_file=str(TEXT / "bpe_tiny.model")).encode(
        "THE QUICK BROWN FOX JUMPS OVER THE LAZY DOG NEAR THE RIVER BANK…")
    for line, expected in zip(new, (V2_CASES["en_plain"]["ids"], second), strict=True):
        ids = np.load(out / line["target_text_ids_path"])
        assert ids.dtype == np.int32 and ids.tolist() == expected
        assert line["target_text_len"] == len(ids)
        # every other path still reaches the original file
        assert (out / line["target_codes_path"]).resolve() == (manifest.parent / "codes" / f"{line['target_id']}.npy")
    assert np.load(out / new[0]["prompt_text_ids_path"]).tolist() == V2_CASES["single_char_cjk"]["ids"]
    assert new[0]["prompt_text_len"] == 2


def test_tokenize_refuses_an_old_output_and_reports_nothing_usable(tmp_path: Path):
    texts = [{"target_text": "3"}, {"target_text": "é ü"}, {"target_text": None}]
    manifest = _copy(REFERENCE / "tiny", tmp_path, texts)
    out = tmp_path / "out"
    result = _run(str(manifest), "--tokenizer", str(TEXT / "bpe_tiny.model"), "--out", str(out),
                  "--normalizer", "none")
    assert result.exit_code == 2, result.output
    assert not out.exists()  # nothing written: the folders it made go too (text_ids/ and --out were left empty)
    (tmp_path / "given").mkdir()  # a folder that was there before stays
    assert _run(str(manifest), "--tokenizer", str(TEXT / "bpe_tiny.model"), "--out", str(tmp_path / "given"),
                "--normalizer", "none").exit_code == 2
    assert list((tmp_path / "given").iterdir()) == []
    assert "0 line(s) written, 3 could not be encoded" in result.stdout
    assert "pairs.jsonl:2: target_text has 2 run(s) the tokenizer cannot encode ('É', 'Ü')" in result.stdout
    assert "pairs.jsonl:3: target_text must be a non-empty string, got None" in result.stdout
    out.mkdir()
    (out / "pairs.jsonl").write_text("mine\n")
    again = _run(str(manifest), "--tokenizer", str(TEXT / "bpe_tiny.model"), "--out", str(out))
    assert again.exit_code == 2 and "already exists" in again.stderr
    assert (out / "pairs.jsonl").read_text() == "mine\n"
    same = _run(str(manifest), "--tokenizer", str(TEXT / "bpe_tiny.model"), "--out", str(manifest.parent))
    assert same.exit_code == 2 and "the manifest's own folder" in same.stderr


def test_tokenize_indextts25_lines_with_their_languages(tmp_path: Path):
    manifest = _copy(REFERENCE / "v2_5" / "tiny", tmp_path, [
        {"target_text": V25_CASES["en_case"]["input"]},  # language en
        {"target_text": "Hola amigo"},  # ja: lower case
        {"target_text": "Merhaba Dunya"},  # tr: its case kept
    ])
    out = tmp_path / "out"
    result = _run(str(manifest), "--tokenizer", str(TEXT / "toy_base.tiktoken"), "--out", str(out),
                  "--normalizer", "none", "--json")
    assert result.exit_code == 0, result.output
    new = [json.loads(line) for line in (out / "pairs.jsonl").read_text(encoding="utf-8").splitlines()]
    ids = [np.load(out / line["target_text_ids_path"]).tolist() for line in new]
    assert ids[0] == V25_CASES["en_case"]["ids_as_gpt_sees_them"]
    assert ids[1][0] == 102 + 7 and ids[2][0] == 102 + 9  # <|ja|>, <|tr|>
    # The official rule spelled out, independent of the text path: "<|lang|> " + the text (ja lower-cased,
    # tr as written), every special allowed, ids 0 and 1 dropped.
    encoding = read_tiktoken(TEXT / "toy_base.tiktoken").encoding()

    def official(text: str) -> list[int]:
        return [i for i in encoding.encode(text, allowed_special="all") if i not in (0, 1)]

    assert ids[1] == official("<|ja|> hola amigo") and ids[2] == official("<|tr|> Merhaba Dunya")
    assert all(0 not in row and 1 not in row for row in ids)


@pytest.mark.parametrize("flag", [["--strict-language"], []])
def test_tokenize_unknown_language(tmp_path: Path, flag: list[str]):
    manifest = _copy(REFERENCE / "v2_5" / "tiny", tmp_path, [
        {"target_text": "a b"}, {"target_text": "c d"}, {"target_text": "e f", "language": "xx", "lang_id": None}])
    result = _run(str(manifest), "--tokenizer", str(TEXT / "toy_base.tiktoken"), "--out", str(tmp_path / "out"),
                  "--normalizer", "none", *flag)
    if flag:
        assert result.exit_code == 1 and "pairs.jsonl:3: target_text: language 'xx' is not in" in result.stdout
    else:
        assert result.exit_code == 0 and "language 'xx' (1 text(s))" in result.stderr
