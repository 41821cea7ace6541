"""make_demo_dataset with configs/tiny.yaml: real tokenizers, well-formed paired manifests, determinism."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import sentencepiece as spm

from indextts_train.config.settings import load_config
from indextts_train.data.demo_data import EXTRA_TOKENS, make_demo_dataset
from indextts_train.errors import UserError
from indextts_train.text.tokenizer import check_tokenizer

PROJECT = Path(__file__).resolve().parents[1]
REFERENCE = Path(__file__).resolve().parent / "data" / "reference"
GPT = load_config(PROJECT / "configs" / "tiny.yaml").gpt


@pytest.fixture(scope="module")
def demo(tmp_path_factory) -> dict:
    return make_demo_dataset(tmp_path_factory.mktemp("demo"), gpt_cfg=GPT, seed=0)


def read_manifest(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


def tree(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def test_tokenizers_load_and_extension_keeps_the_base(demo):
    base = spm.SentencePieceProcessor(model_file=str(demo["base_tokenizer"]))
    ext = spm.SentencePieceProcessor(model_file=str(demo["tokenizer"]))
    assert base.get_piece_size() == GPT.number_text_tokens
    assert ext.get_piece_size() == GPT.number_text_tokens + EXTRA_TOKENS == demo["vocab_size"]
    # the GPT's start/stop text ids are control pieces, so encoding never produces them
    assert (base.bos_id(), base.eos_id()) == (GPT.start_text_token, GPT.stop_text_token)
    report = check_tokenizer(demo["tokenizer"], base=demo["base_tokenizer"], sample_text=demo["corpus"])
    assert report["problems"] == [] and report["base_ids_kept"] and report["sample"]["unk_token_rate"] == 0
    amharic = check_tokenizer(demo["tokenizer"], base=demo["base_tokenizer"], sample_text=demo["extension_corpus"])
    assert amharic["sample"]["extended_char_share"] > 0.9
    new_pieces = [ext.id_to_piece(i) for i in range(GPT.number_text_tokens, ext.get_piece_size())]
    assert all(any("\u1200" <= ch <= "\u137f" for ch in piece) for piece in new_pieces)  # Ethiopic block


def test_manifests_are_paired_like_the_reference(demo):
    reference_keys = list(json.loads((REFERENCE / "tiny" / "pairs.jsonl").read_text().splitlines()[0]))
    train, val = read_manifest(demo["train_manifest"]), read_manifest(demo["val_manifest"])
    assert (len(train), len(val)) == (demo["n_train"], demo["n_val"]) == (96, 16)
    for lines in (train, val):
        speaker_of = {line["target_id"]: line["speaker"] for line in lines}
        for line in lines:
            assert list(line) == reference_keys
            assert speaker_of[line["prompt_id"]] == line["speaker"]  # prompt and target: same speaker
            assert line["prompt_id"] != line["target_id"]
            assert line["id"] == f"{line['target_id']}__{line['prompt_id']}"
            assert not Path(line["target_codes_path"]).is_absolute()
    assert len({line["speaker"] for line in train}) == 3
    assert not {line["target_id"] for line in train} & {line["target_id"] for line in val}


def test_arrays_have_the_trainer_shapes_dtypes_and_ranges(demo):
    ext = spm.SentencePieceProcessor(model_file=str(demo["tokenizer"]))
    folder = demo["train_manifest"].parent
    languages = set()
    for manifest in (demo["train_manifest"], demo["val_manifest"]):
        for line in read_manifest(manifest):
            text_ids = np.load(folder / line["target_text_ids_path"])
            codes = np.load(folder / line["target_codes_path"])
            condition = np.load(folder / line["prompt_condition_path"])
            emo = np.load(folder / line["prompt_emo_vec_path"])
            assert (text_ids.dtype, codes.dtype, condition.dtype, emo.dtype) == (np.int32, np.int32, np.float32,
                                                                                   np.float32)
            # as official inference gives it to SentencePiece: the demo text needs only upper case
            assert text_ids.tolist() == ext.encode(line["target_text"].upper())
            assert (len(text_ids), len(codes)) == (line["target_text_len"], line["target_code_len"])
            assert 0 < len(text_ids) <= GPT.max_text_tokens and 0 < len(codes) <= GPT.max_mel_tokens
            assert not set(text_ids.tolist()) & {GPT.start_text_token, GPT.stop_text_token, ext.unk_id()}
            assert text_ids.min() >= 0 and text_ids.max() < demo["vocab_size"]
            assert codes.min() >= 0 and codes.max() < GPT.number_mel_codes - 2
            assert condition.shape == (32, GPT.model_dim) and emo.shape == (GPT.model_dim,)
            assert np.load(folder / line["target_emo_vec_path"]).shape == (GPT.model_dim,)
            languages.add(bool(text_ids.max() >= GPT.number_text_tokens))
    assert languages == {True, False}  # both English-only and Ethiopic utterances


def test_check_data_finds_the_demo_text_ids_to_be_the_presented_text(demo):
    from indextts_train.data.checkdata import check_manifests
    from indextts_train.text.inference_text import TextPath

    report = check_manifests([demo["train_manifest"]], gpt_cfg=GPT,
                             text_path=TextPath.open(demo["tokenizer"], normalizer="none"))
    assert report["lines_bad"] == 0 and report["text"]["compared"] == demo["n_train"]


def test_codes_are_a_function_of_speaker_and_text(demo):
    folder = demo["train_manifest"].parent
    seen: dict[tuple[str, str], list[int]] = {}
    repeats = 0
    for line in read_manifest(demo["train_manifest"]):
        codes = np.load(folder / line["target_codes_path"]).tolist()
        key = (line["speaker"], line["target_text"])
        repeats += key in seen
        assert seen.setdefault(key, codes) == codes
    assert repeats > 0  # the check above compared something
    by_speaker = {}
    for line in read_manifest(demo["train_manifest"]):
        by_speaker.setdefault(line["speaker"], set()).add(
            tuple(np.load(folder / line["target_codes_path"])[:2].tolist()))
    assert all(len(starts) == 1 for starts in by_speaker.values())  # a start pattern per speaker
    assert len({next(iter(s)) for s in by_speaker.values()}) == 3


def test_same_seed_same_bytes_other_seed_other_data(demo, tmp_path):
    again = make_demo_dataset(tmp_path / "again", gpt_cfg=GPT, seed=0)
    assert tree(again["train_manifest"].parent) == tree(demo["train_manifest"].parent)
    other = make_demo_dataset(tmp_path / "other", gpt_cfg=GPT, seed=1)
    assert other["train_manifest"].read_bytes() != demo["train_manifest"].read_bytes()


def test_rejects_empty_splits(tmp_path):
    with pytest.raises(UserError, match="at least one"):
        make_demo_dataset(tmp_path, gpt_cfg=GPT, n_val=0)
