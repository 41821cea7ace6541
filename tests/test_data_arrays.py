"""A line's arrays checked once read (data/arrays.py): shapes and lengths, id ranges, the 2.5 language tag."""

from __future__ import annotations

import numpy as np
import pytest

from indextts_train.data.arrays import check_arrays, check_ids, check_text_ids, tag_base
from indextts_train.errors import UserError
from indextts_train.text.tiktoken_vocab import SPECIAL_TOKENS

FIELDS = {"text_ids": "text_ids_path", "codes": "codes_path", "condition": "condition_path",
          "emo_vec": "emo_vec_path", "text_len": "text_len", "code_len": "code_len"}
PATHS = {key: f"{key}.npy" for key in ("text_ids", "codes", "condition", "emo_vec")}


def arrays(dim: int = 8, condition_dim: int | None = None) -> dict[str, np.ndarray]:
    return {"text_ids": np.array([5, 6, 7]), "codes": np.array([3, 4, 5, 6]),
            "condition": np.zeros((32, condition_dim or dim), dtype=np.float32),
            "emo_vec": np.zeros(dim, dtype=np.float32)}


def check(values: dict[str, np.ndarray], text_len: int = 3, **limits: int | None) -> None:
    check_arrays(values, PATHS, FIELDS, text_len, 4, max_text=limits.get("max_text"), max_mel=None,
                 model_dim=limits.get("model_dim"), where="m.jsonl:3")


def test_arrays_that_fit_the_line_and_the_model_pass_and_each_misfit_is_named() -> None:
    check(arrays(), model_dim=8)
    with pytest.raises(UserError, match=r"m.jsonl:3: text_ids_path text_ids.npy has 3 ids but the manifest says 4"):
        check(arrays(), text_len=4)
    with pytest.raises(UserError, match=r"has 3 ids > gpt.max_text_tokens 2"):
        check(arrays(), max_text=2)
    with pytest.raises(UserError, match=r"condition condition.npy has D=6 but gpt.model_dim is 8"):
        check(arrays(condition_dim=6), model_dim=8)
    bad = arrays()
    bad["emo_vec"][0] = np.nan
    with pytest.raises(UserError, match="emo_vec emo_vec.npy holds NaN or Inf"):
        check(bad)


def test_ids_outside_an_embedding_and_mel_specials_inside_codes_are_refused() -> None:
    codes = np.array([3, 4])
    check_ids(np.array([0, 9]), codes, 10, 5, FIELDS, "m.jsonl:1")
    with pytest.raises(UserError, match="holds id -1, which is negative"):
        check_ids(np.array([-1, 2]), codes, None, None, FIELDS, "m.jsonl:1")
    with pytest.raises(UserError, match=r"holds id 10, outside \[0, 10\)"):
        check_ids(np.array([10]), codes, 10, 5, FIELDS, "m.jsonl:1")
    with pytest.raises(UserError, match="start/stop mel token 4 at position 1"):
        check_ids(np.array([2]), codes, 10, 5, FIELDS, "m.jsonl:1", mel_specials=(4,))


def test_the_language_tag_is_checked_only_against_a_full_vocabulary() -> None:
    full = len(SPECIAL_TOKENS) + 300  # 300 ranks, then the specials
    tag = tag_base(full)
    assert tag == 300 + 2  # <|en|>: the third special after the ranks
    assert tag_base(len(SPECIAL_TOKENS)) is None  # a cut-down vocabulary: no tag rule
    check_text_ids(np.array([tag + 1, 50]), 1, full, "ids.npy", "m.jsonl:2")
    check_text_ids(np.array([50, 51]), 1, len(SPECIAL_TOKENS), "ids.npy", "m.jsonl:2")
    refused = (rf"m.jsonl:2: ids.npy starts with id 50, not the tag <\|[a-z]+\|> \({tag + 1}\) of lang_id 1 in a "
               rf"vocabulary of {full} tokens .*made with another tokenizer .*pass that one as --tokenizer")
    with pytest.raises(UserError, match=refused):
        check_text_ids(np.array([50, 51]), 1, full, "ids.npy", "m.jsonl:2")
    with pytest.raises(UserError, match="holds id 1 at position 1"):
        check_text_ids(np.array([tag + 1, 1]), 1, len(SPECIAL_TOKENS), "ids.npy", "m.jsonl:2")
