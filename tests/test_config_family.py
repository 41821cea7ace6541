"""config/family.py: one Family per model family, chosen once from a config, a checkpoint or a tokenizer."""

from __future__ import annotations

import copy
import json
import pickle
import re
from pathlib import Path

import pytest

from indextts_train.config.family import (
    FAMILIES,
    INDEXTTS2,
    INDEXTTS25,
    family_named,
    family_of_keys,
    family_of_tokenizer,
    family_of_version,
)
from indextts_train.config.settings import GPTConfig, config_to_dict, load_config
from indextts_train.errors import UserError
from indextts_train.listen import child_infer, child_parts
from indextts_train.model.layout import official_shapes

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "indextts_train"
FAMILY_MODULE = PACKAGE / "config" / "family.py"
# What a family check looks like: the old flags, and a test of which instance a family is.
FAMILY_CHECK = re.compile(r"is_v25|FAMILY_V25|is_tiktoken\(|(?:==|!=|\bis|\bis not) INDEXTTS|tokenizer_kind [!=]=")
MAX_FAMILY_CHECKS = 10  # issue 31: outside the family module


@pytest.mark.parametrize("family", FAMILIES, ids=lambda f: f.key)
def test_each_tiny_config_names_its_family_and_writes_it_back(family) -> None:
    config = load_config(ROOT / family.tiny_config)
    assert config.gpt.family is family  # tiny.yaml states none: IndexTTS2
    config.gpt.stated_family = family
    assert config_to_dict(config)["version"] == family.version
    assert family_of_version(str(family.version), "version") is family and family_named(family.key) is family


def test_an_unstated_family_reads_as_indextts2_and_is_not_written() -> None:
    config = load_config(ROOT / "configs" / "tiny.yaml")
    assert config.gpt.stated_family is None
    assert config.gpt.family is INDEXTTS2 and "version" not in config_to_dict(config)
    assert family_of_version(None, "version") is None


@pytest.mark.parametrize("value", ["3", True, "2.5.1"])
def test_an_unknown_version_is_one_line(value) -> None:
    with pytest.raises(UserError, match=r"^v: version .* is not a known model family; use 2.0 \(IndexTTS2\) or 2.5"):
        family_of_version(value, "v")


@pytest.mark.parametrize("family", FAMILIES, ids=lambda f: f.key)
def test_the_keys_of_a_family_s_gpt_name_it(family) -> None:
    keys = official_shapes(GPTConfig(number_text_tokens=120, model_dim=64, heads=4, layers=2, stated_family=family))
    assert family_of_keys(keys) is family
    assert all(marker in keys for marker in family.weight_markers)
    other = next(f for f in FAMILIES if f is not family)
    assert family_of_keys({**keys, other.weight_markers[0]: None}) is None  # both: not one family
    assert family_of_keys({"text_embedding.weight": None}) is None


def test_the_tokenizer_s_suffix_names_its_family() -> None:
    assert family_of_tokenizer("x/multilingual_zh_ja_yue_char_del.tiktoken") is INDEXTTS25
    assert family_of_tokenizer(Path("bpe.model")) is INDEXTTS2
    assert family_of_tokenizer("odd.bin") is INDEXTTS2  # read as a SentencePiece model, which then names it
    assert family_of_tokenizer(INDEXTTS25.tokenizer_name) is INDEXTTS25


def test_copies_and_pickles_stay_the_one_instance() -> None:
    cfg = GPTConfig(stated_family=INDEXTTS25)
    assert copy.deepcopy(cfg).family is INDEXTTS25 and pickle.loads(pickle.dumps(cfg)).family is INDEXTTS25
    assert copy.copy(INDEXTTS2) is INDEXTTS2 and repr(INDEXTTS25) == "Family(IndexTTS-2.5)"
    with pytest.raises(ValueError, match="unknown model family 'indextts3'"):
        family_named("indextts3")


def test_manifest_forms_follow_the_reference_fields() -> None:
    """The paired and single fields of each family, as the reference READMEs name them."""
    paired25, needed25 = INDEXTTS25.manifest_forms[True]
    assert dict(paired25) == {"text_ids": "target_text_ids_path", "codes": "target_codes_path",
                              "spk_emb": "prompt_spk_emb_path", "emo_vec": "prompt_emo_vec_path",
                              "text_len": "target_text_len", "code_len": "target_code_len"}
    assert needed25 == frozenset(paired25.values())
    single2, _ = INDEXTTS2.manifest_forms[False]
    assert list(single2.values()) == ["text_ids_path", "codes_path", "condition_path", "emo_vec_path", "text_len",
                                      "code_len"]
    assert INDEXTTS2.line_markers == ("prompt_condition_path", "condition_path")
    assert INDEXTTS25.line_markers == ("prompt_spk_emb_path", "spk_emb_path")
    reference = (ROOT / "tests" / "data" / "reference" / "v2_5" / "README.md").read_text(encoding="utf-8")
    assert all(name in reference for name in paired25.values())


def test_the_inference_children_know_every_family() -> None:
    """The scripts the inference environment runs cannot import the type: they key on Family.key."""
    keys = {family.key for family in FAMILIES}
    assert set(child_infer.ENGINES) == keys and set(child_parts.CLASSES) == keys
    assert [child_infer.ENGINES[f.key].hub_files for f in FAMILIES] == [f.hub_parts for f in FAMILIES]


def test_family_checks_outside_the_family_module_stay_few() -> None:
    """Code asks the family what it needs; it does not test which family it is (issue 31: at most 10)."""
    found = [f"{path.relative_to(ROOT)}:{number}" for path in sorted(PACKAGE.rglob("*.py")) if path != FAMILY_MODULE
             for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
             for _ in FAMILY_CHECK.finditer(line)]  # every occurrence, definitions included
    assert len(found) <= MAX_FAMILY_CHECKS, json.dumps(found, indent=1)
    assert FAMILY_CHECK.search("if cfg.is_v25:") and FAMILY_CHECK.search("if family is INDEXTTS25:")


def test_a_grown_tokenizer_keeps_its_base_suffix(tmp_path) -> None:
    """The suffix is how every reader tells a tokenizer's family: `-o grown` (no suffix) wrote a model that
    train-gpt would then misread; refused with the name meant."""
    from indextts_train.config.family import INDEXTTS2, INDEXTTS25, grown_tokenizer_family
    from indextts_train.errors import UserError

    assert grown_tokenizer_family(tmp_path / "bpe.model", tmp_path / "am.model") is INDEXTTS2
    assert grown_tokenizer_family(tmp_path / "q.tiktoken", tmp_path / "am.tiktoken") is INDEXTTS25
    for base, out, meant in (("bpe.model", "grown", "grown.model"), ("bpe.model", "am.tiktoken", "am.model"),
                             ("q.tiktoken", "am.model", "am.tiktoken")):
        with pytest.raises(UserError, match=f"must end in .*; e.g. {tmp_path / meant}$"):
            grown_tokenizer_family(tmp_path / base, tmp_path / out)
