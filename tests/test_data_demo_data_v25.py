"""make_demo_dataset with configs/tiny_v25.yaml: a real toy tiktoken vocabulary grown by a second script."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from indextts_train.config.settings import load_config
from indextts_train.data.checkdata import check_manifests
from indextts_train.data.demo_data import EXTRA_TOKENS, make_demo_dataset
from indextts_train.text.tiktoken_vocab import check_tiktoken, read_tiktoken

PROJECT = Path(__file__).resolve().parents[1]
GPT = load_config(PROJECT / "configs" / "tiny_v25.yaml").gpt


@pytest.fixture(scope="module")
def demo(tmp_path_factory) -> dict:
    return make_demo_dataset(tmp_path_factory.mktemp("demo25"), gpt_cfg=GPT, n_train=24, n_val=6)


def test_the_base_vocabulary_fits_the_config_and_the_growth_keeps_it(demo):
    base, grown = read_tiktoken(demo["base_tokenizer"]), read_tiktoken(demo["tokenizer"])
    assert base.n_vocab == GPT.number_text_tokens and base.ranks[:2] == [b"!", b'"']
    assert grown.n_vocab == GPT.number_text_tokens + EXTRA_TOKENS and grown.ranks[:base.n_ranks] == base.ranks
    report = check_tiktoken(demo["tokenizer"], base=demo["base_tokenizer"], sample_text=demo["extension_corpus"])
    assert not report["problems"] and report["n_unreachable"] == 0
    assert report["sample"]["extended_token_share"] > 0.3  # the new ranks carry the Amharic text
    assert all("\u1200" <= ch <= "\u137f" or ch == " " for tok in grown.ranks[base.n_ranks:]
               for ch in tok.decode("utf-8", "ignore"))  # the added pieces are the second script's
    # English merges were learned on lower-cased text, as inference gives English to the encoder
    assert not any(chr(c).isupper() for tok in base.ranks[256:] for c in tok)


def test_the_manifests_pass_check_data_with_tags_first_and_both_languages(demo):
    from indextts_train.text.inference_text import TextPath

    report = check_manifests([demo["train_manifest"], demo["val_manifest"]], gpt_cfg=GPT,
                             vocab_size=demo["vocab_size"],
                             text_path=TextPath.open(demo["tokenizer"], normalizer="none"))
    assert report["lines_bad"] == 0, report["errors"]
    assert report["text"]["compared"] == 24 + 6  # every text id array is its text as inference encodes it
    assert set(report["languages"]) == {"en", "am"}
    assert report["checked_against"]["language_tag_base"] == demo["base_ranks"] + EXTRA_TOKENS + 2
    line = json.loads(Path(demo["train_manifest"]).read_text(encoding="utf-8").splitlines()[0])
    assert line["lang_id"] in (0, 75) and "prompt_spk_emb_path" in line


def test_the_same_seed_gives_the_same_files(demo, tmp_path):
    again = make_demo_dataset(tmp_path, gpt_cfg=GPT, n_train=24, n_val=6)
    first = Path(demo["train_manifest"]).parent
    assert Path(again["tokenizer"]).read_bytes() == Path(demo["tokenizer"]).read_bytes()
    for name in ("train.jsonl", "val.jsonl", "codes/train0003.npy", "spk_emb/val0001.npy"):
        assert (tmp_path / name).read_bytes() == (first / name).read_bytes(), name
