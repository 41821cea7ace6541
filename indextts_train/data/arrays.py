"""A manifest line's arrays, checked once they are read: kind, shape and length, the ids each embedding
can take, IndexTTS-2.5's language tag, and the text ids against the line's own text.

Pure checks of arrays already in memory, in the order a line is refused; lines.py reads them (through
files/bounded.py, never unpickled) and calls these (check-data, the sample before a run, the dataset).
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from indextts_train.config.constants import CONDITION_LATENTS, SPK_EMB_DIM
from indextts_train.errors import UserError
from indextts_train.text.inference_text import TextPath
from indextts_train.text.tiktoken_vocab import (
    LANGUAGE_CODES,
    SPECIAL_TOKENS,
    START_STOP_IDS,
    TAG_OFFSET,
    TAGGED_LANGUAGES,
)

# What the text-id limit is and what to do past it, as training says it; check-data and evaluate
# name their own source of the limit.
TEXT_VOCAB_SOURCE = ("text vocabulary size", "pass the --tokenizer the data was made with")


def _check_ids(arr: np.ndarray, what: str, path: str, need: int, limit: int | None, limit_key: str,
               where: str) -> None:
    if arr.ndim != 1 or arr.dtype.kind not in "iu":
        raise UserError(f"{where}: {what} {path} must be a 1-D integer array, "
                        f"got {arr.dtype} {list(arr.shape)}")
    if len(arr) < need:
        raise UserError(f"{where}: {what} {path} has {len(arr)} ids but the manifest says {need}; "
                        "fix the length field or re-create the array")
    if limit is not None and len(arr) > limit:
        raise UserError(f"{where}: {what} {path} has {len(arr)} ids > gpt.{limit_key} {limit} (the batch is "
                        "padded to the longest array); trim the array or drop the line")


def _check_features(arrays: dict[str, np.ndarray], model_dim: int | None, where: str,
                    paths: dict[str, str]) -> None:
    emo_vec = arrays["emo_vec"]
    if "spk_emb" in arrays:
        check_speaker_vector(arrays["spk_emb"], paths["spk_emb"], where)
        dim = model_dim if model_dim is not None else (emo_vec.shape[0] if emo_vec.ndim == 1 else -1)
    else:
        condition = arrays["condition"]
        if condition.ndim != 2 or condition.shape[0] != CONDITION_LATENTS or condition.dtype.kind != "f":
            raise UserError(f"{where}: condition {paths['condition']} must be float [32, D], "
                            f"got {condition.dtype} {list(condition.shape)}")
        dim = condition.shape[1] if model_dim is None else model_dim
        if condition.shape[1] != dim:
            raise UserError(f"{where}: condition {paths['condition']} has D={condition.shape[1]} but "
                            f"gpt.model_dim is {dim}; it was made for another model")
    if emo_vec.shape != (dim,) or emo_vec.dtype.kind != "f":
        raise UserError(f"{where}: emo_vec {paths['emo_vec']} must be float [{dim}], "
                        f"got {emo_vec.dtype} {list(emo_vec.shape)}")
    for name in ("condition", "emo_vec"):  # spk_emb: check_speaker_vector
        if name in arrays and not np.isfinite(arrays[name]).all():
            raise UserError(f"{where}: {name} {paths[name]} holds NaN or Inf values (one such input makes every "
                            f"loss NaN); re-create it or drop the line")


def check_arrays(arrays: Mapping[str, np.ndarray], paths: Mapping[str, str], fields: Mapping[str, str],
                 text_len: int, code_len: int, *, max_text: int | None, max_mel: int | None, model_dim: int | None,
                 where: str) -> None:
    """The four arrays of one line (lines.read_arrays) checked for kind, shape and length; UserError names file:line."""
    _check_ids(arrays["text_ids"], fields["text_ids"], paths["text_ids"], text_len, max_text,
               "max_text_tokens", where)
    _check_ids(arrays["codes"], fields["codes"], paths["codes"], code_len, max_mel, "max_mel_tokens", where)
    _check_features(arrays, model_dim, where, paths)


def check_ids(text_ids: np.ndarray, codes: np.ndarray, text_vocab: int | None, mel_codes: int | None,
              fields: dict, where: str, text_source: tuple[str, str] = TEXT_VOCAB_SOURCE,
              mel_specials: tuple[int, ...] = ()) -> None:
    """The one id check (check-data, training, evaluate): ids the embedding lookups can take.

    Negative ids are refused even when no limit is known; `mel_specials` (the start/stop mel tokens)
    may not appear inside a target's codes: the model adds them, and one in the data teaches it to stop.
    """
    _check_id_range(text_ids, text_vocab, fields["text_ids"], text_source[0], where, text_source[1])
    _check_id_range(codes, mel_codes, fields["codes"], "gpt.number_mel_codes", where,
                    "the codes were made for another codec or config")
    special = np.isin(codes, mel_specials) if mel_specials else None
    if special is not None and special.any():
        position = int(np.argmax(special))
        raise UserError(f"{where}: {fields['codes']} holds the start/stop mel token {int(codes[position])} at "
                        f"position {position}; the codes of a target must not contain them (the model adds "
                        "them): re-create the codes or drop the line")


def _check_id_range(ids: np.ndarray, limit: int | None, what: str, limit_key: str, where: str, hint: str) -> None:
    if not len(ids):
        return
    low, high = int(ids.min()), int(ids.max())
    if low < 0:
        raise UserError(f"{where}: {what} holds id {low}, which is negative; re-create the array or drop the line")
    if limit is not None and high >= limit:
        raise UserError(f"{where}: {what} holds id {high}, outside [0, {limit}) ({limit_key}); {hint}")


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


def check_text_ids(ids: np.ndarray, lang_id: int, text_vocab: int | None, path: str, where: str) -> None:
    """check-data rules for 2.5 text: no start/stop ids inside, and the language tag first.

    ids are the first text_len ids; the tag is checked when the vocabulary of `text_vocab` tokens is a full
    one (`tag_base`).
    """
    inside = np.isin(ids, START_STOP_IDS)
    if inside.any():
        position = int(np.flatnonzero(inside)[0])
        raise UserError(f"{where}: {path} holds id {int(ids[position])} at position {position}; ids 0 and 1 are the "
                        "GPT's start/stop (the official text path drops them): remove every 0 and 1")
    first_tag = tag_base(text_vocab)
    if first_tag is None or lang_id >= TAGGED_LANGUAGES:
        return  # untagged languages start with the bytes of "<|xx|> "
    tag = first_tag + lang_id
    if not len(ids) or int(ids[0]) != tag:
        first = int(ids[0]) if len(ids) else None
        raise UserError(f"{where}: {path} starts with id {first}, not the tag <|{LANGUAGE_CODES[lang_id]}|> ({tag}) "
                        f"of lang_id {lang_id} in a vocabulary of {text_vocab} tokens (the tags follow the ranks); "
                        f"if the data was made with another tokenizer (grown, or not), pass that one as --tokenizer, "
                        f"else encode '<|{LANGUAGE_CODES[lang_id]}|> ' + text, as inference does")




def _shown_ids(ids: list[int]) -> str:
    head = ", ".join(map(str, ids[:12]))
    return f"[{head}{', ...' if len(ids) > 12 else ''}] ({len(ids)} ids)"


def compare_text(obj: dict, ids_field: str, text_ids: np.ndarray, where: str,
                 text_path: TextPath) -> tuple[bool | None, str | None]:
    """A line that carries its text: text_ids must be that text as official inference encodes it.

    (compared, problem): compared is None when the line carries no text, False when it is not compared
    (digits only WeTextProcessing spells as inference does); problem is the refusal of ids that differ
    (a line compared and refused still counts as compared in check-data's report)."""
    text_field = "text" if ids_field == "text_ids_path" else "target_text"
    text, language = obj.get(text_field), obj.get("language")
    if not isinstance(text, str) or not text.strip():
        return None, None
    if text_path.inexact(text, language):
        return False, None
    try:
        expected, stored = text_path.encode(text, language), text_ids.tolist()
    except UserError as exc:  # its language (--strict-language) or bytes the vocabulary lacks
        raise UserError(f"{where}: {text_field}: {exc}") from None
    if stored == expected:
        return True, None
    redo = (f"re-encode with `indextts-train tokenize MANIFEST --tokenizer {text_path.tokenizer} --out NEW_DIR`")
    if stored == text_path.raw_ids(text, language):
        return True, (f"{where}: {ids_field} is the raw text's encoding, made without the official text path "
                      f"(normaliser, {'case rule' if language else 'upper case, CJK split'}); inference gives "
                      f"the model {_shown_ids(expected)}: {redo}")
    at = next((i for i, (a, b) in enumerate(zip(stored, expected, strict=False)) if a != b),
              min(len(stored), len(expected)))
    return True, (f"{where}: {ids_field} {_shown_ids(stored)} differs at position {at} from its {text_field} as "
                  f"inference encodes it {_shown_ids(expected)}; {redo} (or pass the tokenizer the data was "
                  "made with)")
