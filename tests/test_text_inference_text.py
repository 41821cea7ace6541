"""inference_text: every stage of both official text paths against the oracles of reference/prepare/text."""

from __future__ import annotations

import dataclasses
import json
import sys
import types

import pytest

from indextts_train.config.family import INDEXTTS2, INDEXTTS25
from indextts_train.errors import UserError
from indextts_train.text import inference_text
from indextts_train.text.inference_text import (
    CHARMAP_ONLY,
    TextPath,
    case_rule,
    character_map,
    cjk_split_upper,
    control_tokens_upper,
    language_prefix,
    open_normalizer,
    pronunciation_marks,
    single_character,
    use_chinese,
)
from tests.conftest import REFERENCE

TEXT = REFERENCE / "prepare" / "text"
V2_CASES = json.loads((TEXT / "text_cases.json").read_text(encoding="utf-8"))["cases"]
V25_CASES = json.loads((TEXT / "tiktoken_cases.json").read_text(encoding="utf-8"))["cases"]
_DIGITS_OR_GRAMMAR = {"zh_digits", "en_digits_time", "mixed_tech", "en_contraction", "mixed_percent", "email_phone"}


@pytest.fixture(scope="module")
def spm_path() -> TextPath:
    return TextPath.open(TEXT / "bpe_tiny.model", normalizer="none")


@pytest.fixture(scope="module")
def tiktoken_path() -> TextPath:
    return TextPath.open(TEXT / "toy_base.tiktoken", normalizer="none")


def _oracle(cases: list[dict], source: str, target: str):
    """A normaliser that answers what WeTextProcessing answered for the oracle's own texts."""
    table = {case[source]: case[target] for case in cases if case.get(target) is not None}
    return lambda text: table[text]


def test_families_and_normaliser_name(spm_path, tiktoken_path):
    assert (spm_path.family, tiktoken_path.family) == (INDEXTTS2, INDEXTTS25)
    assert spm_path.normalizer_name == CHARMAP_ONLY
    assert (spm_path.size, tiktoken_path.size) == (150, 1773)


@pytest.mark.parametrize("case", V2_CASES, ids=lambda c: c["id"])
def test_v2_stages_without_any_normaliser(case, spm_path):
    """The oracle's `no_normalizer` pipeline: CJK split + upper case, then SentencePiece."""
    expected = case["no_normalizer"]
    assert single_character(case["text"]) == case["single_char_shortcut"]
    if case["single_char_shortcut"] or case["empty"]:
        assert expected["cjk_split_upper"] is None
        return
    split = cjk_split_upper(case["text"])
    assert split == expected["cjk_split_upper"]
    assert spm_path.processor.encode(split, out_type=str) == expected["pieces"]
    assert spm_path.processor.encode(split) == expected["ids"]
    assert use_chinese(case["text"]) == case["use_chinese"]


@pytest.mark.parametrize("case", V2_CASES, ids=lambda c: c["id"])
def test_v2_character_map_path_gives_the_official_ids(case, spm_path):
    """Where the grammar has nothing to spell out, the character map alone is the official path."""
    if case["id"] in _DIGITS_OR_GRAMMAR:
        assert spm_path.present(case["text"]) != case["cjk_split_upper"]  # these need WeTextProcessing
        return
    presented = case["text"] if case["cjk_split_upper"] is None else case["cjk_split_upper"]
    assert spm_path.present(case["text"]) == presented
    assert [piece for _, piece in spm_path.encode_pieces(case["text"])] == case["pieces"]
    assert spm_path.encode(case["text"]) == case["ids"]
    assert len(spm_path.unknown(case["text"])) == case["n_unk"]


@pytest.mark.parametrize("case", V2_CASES, ids=lambda c: c["id"])
def test_v2_full_path_with_the_normaliser_output(case, spm_path):
    """Everything around the normaliser: with WeTextProcessing's answers every case gives the official ids."""
    path = dataclasses.replace(spm_path, normalize=_oracle(V2_CASES, "text", "normalized"), normalizer_name="oracle")
    presented = case["text"] if case["cjk_split_upper"] is None else case["cjk_split_upper"]
    assert path.present(case["text"]) == presented
    assert path.encode(case["text"]) == case["ids"] == case["ids_via_tokenize_then_convert_tokens_to_ids"]
    assert len(path.unknown(case["text"])) == case["n_unk"]


@pytest.mark.parametrize("case", V25_CASES, ids=lambda c: c["id"])
def test_v25_stages(case):
    assert character_map(case["input"]) == case["char_map"]
    cased = case_rule(case["normalized"], case["lang"])
    assert cased == case["cased"]
    assert pronunciation_marks(cased) == case["pron_annotations"]
    assert control_tokens_upper(case["pron_annotations"]) == case["control_tokens_upper"]
    assert language_prefix(case["lang"]) == case["lang_prefix"]


@pytest.mark.parametrize("case", V25_CASES, ids=lambda c: c["id"])
def test_v25_path_gives_the_official_ids(case, tiktoken_path):
    path = tiktoken_path
    if case["normalized"] != case["char_map"]:  # digits: with WeTextProcessing's answer
        path = dataclasses.replace(tiktoken_path, normalize=_oracle(V25_CASES, "char_map", "normalized"),
                                   normalizer_name="oracle")
    assert path.present(case["input"], case["lang"]) == case["encoder_input"]
    assert path.lang_id(case["lang"]) == case["lang_id"]
    if case["ids"] is None:  # the toy vocabulary has no bytes for Chinese or Ethiopic text
        with pytest.raises(UserError, match="no rank for"):
            path.encode(case["input"], case["lang"])
        return
    # inference's own ids: the presented text encoded with every special allowed, then the stop id 1
    assert path.encoding.encode(case["encoder_input"], allowed_special="all") + [1] == case["ids_with_appended_stop"]
    assert path.encode(case["input"], case["lang"]) == case["ids_as_gpt_sees_them"]
    assert path.unknown(case["input"], case["lang"]) == []


def test_v25_drops_start_and_stop_ids(tiktoken_path):
    """`!` and `"` are ranks 0 and 1 of the toy vocabulary: the GPT never sees them."""
    ids = tiktoken_path.encode('Wow! "yes"', "fr")
    assert 0 not in ids and 1 not in ids
    assert ids[0] == 108  # <|fr|>


def test_unknown_language_uses_the_common_row_or_is_refused(tiktoken_path):
    path = dataclasses.replace(tiktoken_path, unknown_languages={})
    assert path.lang_id("xx") == 105 and path.lang_id("Am") == 75 and path.lang_id("zh/en") == 103
    assert path.present("abc", "xx") == "<|xx|> abc"
    assert any("'xx'" in note and "common" in note for note in path.notes())
    strict = dataclasses.replace(tiktoken_path, strict_language=True)
    with pytest.raises(UserError, match="--strict-language"):
        strict.encode("abc", "xx")
    with pytest.raises(UserError, match="language"):
        path.lang_id(None)


def test_borrowed_language_speaks_as_the_code_of_its_row(tiktoken_path):
    path = dataclasses.replace(tiktoken_path, borrowed={"kab": 6})
    assert path.lang_id("kab") == 6
    assert path.present("Azul", "kab") == "<|fr|> Azul"


def test_digits_without_normaliser_are_counted(spm_path):
    path = dataclasses.replace(spm_path, digit_lines=0)
    path.present("I have 23 apples")
    path.present("no digits here")
    path.present("5")  # single character: inference skips the normaliser too
    (note,) = path.notes()
    assert note.startswith("1 text(s) have digits") and "WeTextProcessing" in note
    assert path.inexact("I have 23 apples") and not path.inexact("5") and not path.inexact("no digits")


def test_digits_matter_only_where_25_inference_normalises(tiktoken_path):
    path = dataclasses.replace(tiktoken_path, digit_lines=0)
    assert path.inexact("I have 23", "en") and path.inexact("23", "zh") and not path.inexact("J'ai 23", "fr")
    path.present("I have 23", "en")
    path.present("J'ai 23", "fr")
    assert path.digit_lines == 1
    wetext = dataclasses.replace(tiktoken_path, normalizer_name="WeTextProcessing 1.0.4.1")
    assert not wetext.inexact("I have 23", "en")


def test_normaliser_choice_without_wetext(monkeypatch):
    monkeypatch.setitem(sys.modules, "tn", None)  # not installed, whatever this machine has
    assert open_normalizer("auto")[1] == CHARMAP_ONLY
    assert open_normalizer("none")[1] == CHARMAP_ONLY
    with pytest.raises(UserError, match="WeTextProcessing is not installed"):
        open_normalizer("wetext")
    with pytest.raises(UserError, match="--normalizer 'spacy'"):
        open_normalizer("spacy")


def _fake_wetext(monkeypatch) -> list:
    """tn.chinese / tn.english stand-ins that record what they are given and spell '3' as 'three'."""
    seen = []

    class Grammar:
        def __init__(self, **options) -> None:
            self.options = options

        def normalize(self, text: str) -> str:
            seen.append(text)
            return text.replace("3", "three")

    for name in ("tn", "tn.chinese", "tn.english", "tn.chinese.normalizer", "tn.english.normalizer"):
        module = types.ModuleType(name)
        module.Normalizer = Grammar
        monkeypatch.setitem(sys.modules, name, module)
    monkeypatch.setattr(inference_text.metadata, "version", lambda package: "9.9")
    return seen


def test_wetext_is_used_when_installed(monkeypatch, spm_path):
    seen = _fake_wetext(monkeypatch)
    normalize, name = open_normalizer("auto")
    assert name == "WeTextProcessing 9.9"
    assert normalize.chinese.options == {"remove_interjections": False, "remove_erhua": False,
                                         "overwrite_cache": False}
    assert normalize("it's 3: fine") == "it is three, fine"  # contraction, grammar, character map
    # Chinese grammar: the pinyin syllable is hidden from it and comes back upper case, `$` -> `.`
    assert normalize("银行xing2 3$") == "银行XING2 three."
    assert seen[-1] == "银行<pinyin_a> 3$"
    path = TextPath.open(TEXT / "bpe_tiny.model")
    assert path.normalizer_name == "WeTextProcessing 9.9"
    assert path.present("it's 3") == "IT IS THREE" and path.notes() == []
