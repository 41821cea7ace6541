"""IndexTTS-2.5 manifest lines: their fields, language rows and the checks only this family needs.

Paired form (`tests/data/reference/v2_5/README.md`, "Manifest fields"): `prompt_spk_emb_path`
(the prompt's CAMPPlus vector, float32 [192]) instead of IndexTTS2's `prompt_condition_path`,
`prompt_emo_vec_path`, `target_text_ids_path` (language tag first, no 0/1 ids), `target_codes_path`,
the two lengths, and the language: `lang_id` (the `lang_embedding` row) and/or `language` (a code of
the official LANGUAGE_DICT). Single form: `spk_emb_path`, `emo_vec_path`, `text_ids_path`,
`codes_path`, `text_len`, `code_len`, `lang_id`/`language`.

A language without a tag (one the official table does not have, or one of its untagged codes such
as `yue`) may *borrow* the row of a tagged language the release does not speak
(`--borrow-language NEW=CODE`): its lines then train CODE's row and start with CODE's tag, and
inference is called with `lang=CODE`.
"""

from __future__ import annotations

import numpy as np

from indextts_train.config.constants import LANG_ROWS, SPK_EMB_DIM
from indextts_train.config.settings import FAMILY_NAMES, FAMILY_V2, FAMILY_V25
from indextts_train.errors import UserError
from indextts_train.text.tiktoken_vocab import (
    LANGUAGE_CODES,
    SPECIAL_TOKENS,
    START_STOP_IDS,
    TAG_OFFSET,
    TAGGED_LANGUAGES,
    language_id,
)

PAIRED_FIELDS = {
    "text_ids": "target_text_ids_path",
    "codes": "target_codes_path",
    "spk_emb": "prompt_spk_emb_path",
    "emo_vec": "prompt_emo_vec_path",
    "text_len": "target_text_len",
    "code_len": "target_code_len",
}
SINGLE_FIELDS = {
    "text_ids": "text_ids_path",
    "codes": "codes_path",
    "spk_emb": "spk_emb_path",
    "emo_vec": "emo_vec_path",
    "text_len": "text_len",
    "code_len": "code_len",
}
FORMS = {True: (PAIRED_FIELDS, frozenset(PAIRED_FIELDS.values())),  # paired? -> fields, the set a line needs
         False: (SINGLE_FIELDS, frozenset(SINGLE_FIELDS.values()))}
MARKERS = ("prompt_spk_emb_path", "spk_emb_path")  # a line with one of these is an IndexTTS-2.5 line
V2_MARKERS = ("prompt_condition_path", "condition_path")  # ... and one with these an IndexTTS2 line


def line_family(obj: dict, where: str, family: str | None) -> str:
    """The family a line's speaker field names; it must be the model's (`family`, None = any)."""
    if any(name in obj for name in MARKERS):
        found = FAMILY_V25
    elif any(name in obj for name in V2_MARKERS):
        found = FAMILY_V2
    else:
        return family or FAMILY_V2  # the missing-field message then lists the model's fields
    if family is not None and found != family:
        want = " / ".join(MARKERS if family == FAMILY_V25 else V2_MARKERS)
        raise UserError(f"{where}: an {FAMILY_NAMES[found]} line, but the model is {FAMILY_NAMES[family]} (its lines "
                        f"carry {want}); use data made for this model, or the config of the other family")
    return found


def lang_id_of(obj: dict, where: str, borrowed: dict[str, int]) -> int:
    """The lang_embedding row of one line, from `lang_id` and/or `language` (which must agree)."""
    lang_id, language = obj.get("lang_id"), obj.get("language")
    if lang_id is not None and (type(lang_id) is not int or not 0 <= lang_id < LANG_ROWS):
        raise UserError(f"{where}: lang_id {lang_id!r} must be a whole number in 0..{LANG_ROWS - 1}; fix the line")
    from_code = None
    if language is not None:
        if not isinstance(language, str):
            raise UserError(f"{where}: language must be a language code string, got {language!r}")
        from_code = borrowed.get(language.strip().lower(), language_id(language))
        if from_code is None and lang_id is None:
            raise UserError(f"{where}: language {language!r} has no row in IndexTTS-2.5's language table; give "
                            "the line a lang_id, or borrow an unused row with --borrow-language "
                            f"{language}=CODE")
    if lang_id is None and from_code is None:
        raise UserError(f"{where}: an IndexTTS-2.5 line needs lang_id or language; add the language code")
    if lang_id is not None and from_code is not None and lang_id != from_code:
        raise UserError(f"{where}: lang_id {lang_id} disagrees with language {language!r} (row {from_code}); "
                        "fix one of them")
    return lang_id if lang_id is not None else from_code


def check_speaker_vector(spk_emb: np.ndarray, path: str, where: str) -> None:
    if spk_emb.shape != (SPK_EMB_DIM,) or spk_emb.dtype.kind != "f":
        raise UserError(f"{where}: spk_emb {path} must be the prompt's CAMPPlus vector, float [{SPK_EMB_DIM}], "
                        f"got {spk_emb.dtype} {list(spk_emb.shape)}")
    if not np.isfinite(spk_emb).all():
        raise UserError(f"{where}: spk_emb {path} holds NaN or Inf; re-extract the speaker vector")


def tag_base(text_vocab: int | None) -> int | None:
    """Id of <|en|> in a 2.5 vocabulary of `text_vocab` tokens: its ranks + 2 (the specials follow the ranks)."""
    if text_vocab is None or text_vocab <= len(SPECIAL_TOKENS):
        return None  # a cut-down vocabulary (like the reference's tiny one): the tag rule cannot be checked
    return text_vocab - len(SPECIAL_TOKENS) + TAG_OFFSET


def language_code(lang_id: int) -> str:
    return LANGUAGE_CODES[lang_id] if lang_id < len(LANGUAGE_CODES) else f"lang_id {lang_id}"


def check_text_ids(ids: np.ndarray, lang_id: int, tag_base: int | None, path: str, where: str) -> None:
    """check-data rules for 2.5 text: no start/stop ids inside, and the language tag first.

    ids are the first text_len ids; tag_base is the id of `<|en|>` (ranks + 2), None when unknown.
    """
    inside = np.isin(ids, START_STOP_IDS)
    if inside.any():
        position = int(np.flatnonzero(inside)[0])
        raise UserError(f"{where}: {path} holds id {int(ids[position])} at position {position}; ids 0 and 1 are the "
                        "GPT's start/stop (the official text path drops them): remove every 0 and 1")
    if tag_base is None or lang_id >= TAGGED_LANGUAGES:
        return  # untagged languages start with the bytes of "<|xx|> "
    tag = tag_base + lang_id
    if not len(ids) or int(ids[0]) != tag:
        first = int(ids[0]) if len(ids) else None
        raise UserError(f"{where}: {path} starts with id {first}, not the tag <|{LANGUAGE_CODES[lang_id]}|> ({tag}) "
                        f"of lang_id {lang_id}; encode '<|{LANGUAGE_CODES[lang_id]}|> ' + text, as inference does")
