"""IndexTTS-2.5 manifests: fields, language rows, FILE:LINE errors, check-data, and evaluate on the reference."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from test_model_gpt_v25 import EXPECTED, TINY, v25_batch

from indextts_train.config.family import INDEXTTS2, INDEXTTS25
from indextts_train.data.checkdata import check_manifests
from indextts_train.data.manifest import ManifestDataset, ManifestIndex, collate
from indextts_train.errors import UserError
from indextts_train.text.languages import parse_borrowed

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture()
def data(tmp_path: Path) -> Path:
    """A copy of the reference's tiny folder, to edit."""
    shutil.copytree(TINY, tmp_path / "tiny", ignore=shutil.ignore_patterns("*.pth"))
    return tmp_path / "tiny"


def lines_of(manifest: Path) -> list[dict]:
    return [json.loads(line) for line in manifest.read_text().splitlines()]


def write(manifest: Path, lines: list[dict]) -> Path:
    manifest.write_text("".join(json.dumps(line) + "\n" for line in lines))
    return manifest


def test_the_reference_manifest_collates_into_the_reference_batch():
    index = ManifestIndex.build([TINY / "pairs.jsonl"], family=INDEXTTS25)
    assert index.lang_ids.tolist() == [0, 7, 9]
    batch = collate([ManifestDataset(index, model_dim=64)[i] for i in range(3)])
    expected = v25_batch()
    for name in ("text_ids", "codes", "text_lengths", "code_lengths", "emo_vec", "spk_emb", "lang_ids"):
        assert torch.equal(getattr(batch, name), getattr(expected, name)), name
    assert batch.condition is None


@pytest.mark.slow  # the real CLI in a subprocess
def test_evaluate_on_the_reference_equals_expected_json():
    result = subprocess.run(
        [sys.executable, "-m", "indextts_train", "evaluate", "--checkpoint", str(TINY / "gpt.pth"),
         "--manifest", str(TINY / "pairs.jsonl"), "--config", str(TINY / "config.yaml"), "--json"],
        capture_output=True, text=True, cwd=ROOT, check=True)
    out, ref = json.loads(result.stdout), EXPECTED["eval"]
    assert out["text_loss"] == pytest.approx(ref["text_loss"], abs=1e-5)
    assert out["mel_loss"] == pytest.approx(ref["mel_loss"], abs=1e-5)
    assert out["mel_top1"] == pytest.approx(ref["mel_top1"], abs=1e-6)
    assert out["loss"] == pytest.approx(ref["total_loss"], abs=1e-5)


@pytest.mark.parametrize("case", ["text id beyond the checkpoint", "code beyond the codec"])
def test_evaluate_names_an_id_outside_the_checkpoint_without_a_traceback(data: Path, case: str):
    from typer.testing import CliRunner

    from indextts_train.cli import app

    ids, codes = data / "text_ids" / "tgt1.npy", data / "codes" / "tgt1.npy"
    if case == "text id beyond the checkpoint":  # the reference GPT has 120 text tokens
        np.save(ids, np.array([109, 94, 120, *np.load(ids)[3:]], np.int32))
        needles = ["target_text_ids_path holds id 120", "outside [0, 120)", "gpt.pth", "tokenizer"]
    else:  # ... and 66 mel codes
        np.save(codes, np.array([3, 66, *np.load(codes)[2:]], np.int32))
        needles = ["target_codes_path holds id 66", "gpt.number_mel_codes"]
    result = CliRunner().invoke(app, ["evaluate", "--checkpoint", str(TINY / "gpt.pth"), "--manifest",
                                      str(data / "pairs.jsonl"), "--config", str(TINY / "config.yaml")])
    assert result.exception is None or isinstance(result.exception, SystemExit), result.exception
    assert result.exit_code == 2 and result.stdout == "", result.stdout
    (line,) = [line for line in result.stderr.splitlines() if line.strip()]
    assert line.startswith(f"error: {data / 'pairs.jsonl'}:2: ") and "Traceback" not in result.stderr
    assert all(needle in line for needle in needles), line


def test_the_single_utterance_form(data: Path):
    single = [{"id": line["id"], "text_ids_path": line["target_text_ids_path"], "codes_path": line["target_codes_path"],
               "spk_emb_path": line["prompt_spk_emb_path"], "emo_vec_path": line["prompt_emo_vec_path"],
               "text_len": line["target_text_len"], "code_len": line["target_code_len"], "language": line["language"]}
              for line in lines_of(data / "pairs.jsonl")]
    index = ManifestIndex.build([write(data / "single.jsonl", single)], family=INDEXTTS25)
    batch = collate([ManifestDataset(index)[i] for i in range(3)])
    assert torch.equal(batch.spk_emb, v25_batch().spk_emb) and batch.lang_ids.tolist() == [0, 7, 9]


@pytest.mark.parametrize("edit, message", [
    (lambda line: line.pop("prompt_spk_emb_path"), r"missing field\(s\) prompt_spk_emb_path"),
    (lambda line: (line.pop("lang_id"), line.pop("language")), "an IndexTTS-2.5 line needs lang_id or language"),
    (lambda line: line.update(lang_id=107), "lang_id 107 must be a whole number in 0..106"),
    (lambda line: line.update(lang_id=3), "lang_id 3 disagrees with language 'ja' \\(row 7\\)"),
    (lambda line: (line.pop("lang_id"), line.update(language="kab")),
     "language 'kab' has no row .* --borrow-language kab=CODE"),
])
def test_bad_lines_name_file_and_line(data: Path, edit, message: str):
    lines = lines_of(data / "pairs.jsonl")
    edit(lines[1])
    manifest = write(data / "bad.jsonl", lines)
    with pytest.raises(UserError, match=f"bad.jsonl:2: {message}"):
        ManifestIndex.build([manifest], family=INDEXTTS25)


def test_a_line_of_the_other_family_is_refused(data: Path):
    with pytest.raises(UserError, match="pairs.jsonl:1: an IndexTTS-2.5 line, but the model is IndexTTS2"):
        ManifestIndex.build([data / "pairs.jsonl"], family=INDEXTTS2)


def test_a_borrowed_row_trains_a_language_without_a_tag(data: Path):
    lines = lines_of(data / "pairs.jsonl")
    lines[2].pop("lang_id")
    lines[2]["language"] = "kab"
    manifest = write(data / "kab.jsonl", lines)
    index = ManifestIndex.build([manifest], family=INDEXTTS25, borrowed=parse_borrowed(["kab=tr"]))
    assert index.lang_ids.tolist() == [0, 7, 9]
    with pytest.raises(UserError, match="'en' has its own row"):
        parse_borrowed(["en=tr"])
    with pytest.raises(UserError, match="zh is a language the release speaks"):
        parse_borrowed(["kab=zh"])


def _break_text_ids(data: Path, case: str) -> None:
    """Line 2's text ids: a start/stop id inside ("start_id"), or without their language tag ("tag")."""
    ids = data / "text_ids" / "tgt1.npy"
    if case == "start_id":
        np.save(ids, np.array([109, 94, 74, 1, *np.load(ids)[4:]], np.int32))
    else:
        np.save(ids, np.load(ids)[1:])
        lines = lines_of(data / "pairs.jsonl")
        lines[1]["target_text_len"] -= 1
        write(data / "pairs.jsonl", lines)


@pytest.mark.parametrize("case, message", [
    ("shape", r"spk_emb .*prm1.npy must be the prompt's CAMPPlus vector, float \[192\], got float32 \[191\]"),
    ("nan", "spk_emb .*prm1.npy holds NaN or Inf"),
    ("start_id", "holds id 1 at position 3; ids 0 and 1 are the GPT's start/stop"),
    ("tag", r"starts with id 94, not the tag <\|ja\|> \(109\) of lang_id 7"),
])
def test_check_data_knows_the_25_rules(data: Path, case: str, message: str):
    spk = data / "spk_emb" / "prm1.npy"
    if case == "shape":
        np.save(spk, np.zeros(191, np.float32))
    elif case == "nan":
        np.save(spk, np.full(192, np.nan, np.float32))
    else:
        _break_text_ids(data, case)
    # a full tiktoken vocabulary (100 ranks + 1673 specials): the tag of lang id L is 102 + L
    report = check_manifests([data / "pairs.jsonl"], vocab_size=1773)
    assert report["lines_ok"] == 2 and report["bad_lines"] == [[str(data / "pairs.jsonl"), 2]]
    assert len(report["errors"]) == 1 and __import__("re").search(message, report["errors"][0]), report["errors"]


def test_check_data_passes_the_reference_and_counts_languages():
    report = check_manifests([TINY / "pairs.jsonl"], vocab_size=1773)
    assert report["lines_bad"] == 0 and report["languages"] == {"en": 1, "ja": 1, "tr": 1}
    assert report["checked_against"]["language_tag_base"] == 102


@pytest.mark.parametrize("case, message", [
    ("start_id", "tgt1.npy holds id 1 at position 3; ids 0 and 1 are the GPT's start/stop"),
    ("tag", r"starts with id 94, not the tag <\|ja\|> \(109\) of lang_id 7"),
])
def test_training_reads_refuse_bad_25_text_ids_by_file_and_line(data: Path, case: str, message: str):
    """What train-gpt and evaluate read (ManifestDataset) applies check-data's 2.5 text rules."""
    _break_text_ids(data, case)
    index = ManifestIndex.build([data / "pairs.jsonl"], family=INDEXTTS25)
    dataset = ManifestDataset(index, model_dim=64, text_vocab=1773)  # a full vocabulary: tags are known
    dataset[0], dataset[2]  # the good lines load
    with pytest.raises(UserError, match=f"pairs.jsonl:2: .*{message}"):
        dataset[1]


def test_evaluate_refuses_a_start_stop_id_in_25_text(data: Path):
    from typer.testing import CliRunner

    from indextts_train.cli import app

    ids = data / "text_ids" / "tgt1.npy"
    np.save(ids, np.array([109, 0, *np.load(ids)[2:]], np.int32))
    result = CliRunner().invoke(app, ["evaluate", "--checkpoint", str(TINY / "gpt.pth"), "--manifest",
                                      str(data / "pairs.jsonl"), "--config", str(TINY / "config.yaml")])
    assert result.exit_code == 2 and "Traceback" not in result.stderr
    (line,) = [line for line in result.stderr.splitlines() if line.strip()]
    assert line.startswith(f"error: {data / 'pairs.jsonl'}:2: ") and "holds id 0 at position 1" in line, line


def test_check_data_finds_25_text_ids_made_from_raw_text(data: Path):
    """`Hello World` for en: inference lower-cases it; ids of the raw text are named with the fix."""
    from indextts_train.text.inference_text import TextPath

    toy = ROOT / "tests" / "data" / "reference" / "prepare" / "text" / "toy_base.tiktoken"
    path = TextPath.open(toy, normalizer="none")
    lines = lines_of(data / "pairs.jsonl")
    raw = [i for i in path.encoding.encode("<|en|> Hello World", allowed_special="all") if i > 1]
    for line, ids in zip(lines[:2], (path.encode("Hello World", "en"), raw), strict=True):
        np.save(data / line["target_text_ids_path"], np.asarray(ids, np.int32))
        line.update(target_text="Hello World", target_text_len=len(ids), language="en", lang_id=0)
    write(data / "pairs.jsonl", lines[:2])
    report = check_manifests([data / "pairs.jsonl"], vocab_size=path.size, text_path=path)
    assert report["bad_lines"] == [[str(data / "pairs.jsonl"), 2]] and report["text"]["compared"] == 2
    assert "pairs.jsonl:2: target_text_ids_path is the raw text's encoding" in report["errors"][0]
    assert "case rule" in report["errors"][0] and "indextts-train tokenize" in report["errors"][0]
