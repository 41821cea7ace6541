"""Manifest lines: reading, the two forms of each family, and the checks one line needs on its own.

A manifest is JSONL, one example a line, in one of two forms (README, "Data"):

- paired (what the community preprocessing writes): `prompt_condition_path`,
  `prompt_emo_vec_path`, `target_text_ids_path`, `target_codes_path`, `target_text_len`,
  `target_code_len` — the prompt gives the conditioning, the target gives text and codes;
- single: `text_ids_path`, `codes_path`, `condition_path`, `emo_vec_path`, `text_len`, `code_len`.

IndexTTS-2.5 lines (`tests/data/reference/v2_5/README.md`, "Manifest fields") carry the prompt's
192-d CAMPPlus vector (`prompt_spk_emb_path` / `spk_emb_path`) instead of the conditioning latents,
and the language: `lang_id` (the `lang_embedding` row) and/or `language` (a code of the official
LANGUAGE_DICT). The field tables are the family's (config/family.py); a line's fields say its family,
and a line of the other family than the model's is refused by FILE:LINE. A language without a tag
may *borrow* the row of a tagged language the release does not speak (`--borrow-language NEW=CODE`).

A line's arrays (`.npy`, relative paths resolve against the manifest's folder) are read here, within
bounds, and checked by arrays.py (kind, shape, length, the ids each embedding can take). `check_line`
runs every check on one line in the order a line is refused (check-data, and the head of each manifest
before a run starts: data/checkdata.py reads the lines); the index (manifest.py) parses lines, the
dataset loads and checks their arrays and ids.

Other fields (`id`, `speaker`, `language`, durations, audio paths, ...) are allowed and ignored by
training. Relative paths resolve against the manifest's folder. Lengths come from the manifest
fields, never from the arrays, which may be longer (reference README, exact definitions 1–2).
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from indextts_train.config.constants import LANG_ROWS
from indextts_train.config.family import FAMILIES, INDEXTTS2, Family
from indextts_train.data.arrays import check_arrays, check_ids, check_text_ids, compare_text
from indextts_train.data.corpus_forms import prepare_command
from indextts_train.errors import TOO_LONG_NUMBER, UserError, WrongKindOfFile, text_problem
from indextts_train.files.bounded import json_depth_problem, read_npy
from indextts_train.text.inference_text import TextPath
from indextts_train.text.tiktoken_vocab import LANGUAGE_CODES, language_id

SPEAKER_FIELDS = ("speaker", "prompt_speaker", "target_speaker")
DURATION_FIELDS = ("duration", "target_duration", "prompt_duration")
LANGUAGE_FIELDS = ("language", "target_language")

_JSON_DECODE = json.JSONDecoder().decode
FIX_LINE = "fix or remove the line (`indextts-train check-data` lists every bad line)"


def line_family(obj: dict, where: str, family: Family | None) -> Family:
    """The family a line's speaker field names; it must be the model's (`family`, None = any).

    A line with the fields of both is the later family's (a 2.5 line may keep IndexTTS2's fields)."""
    found = next((kind for kind in reversed(FAMILIES) if not obj.keys().isdisjoint(kind.line_markers)), None)
    if found is None:
        return family or INDEXTTS2  # the missing-field message then lists the model's fields
    if family is not None and found is not family:
        raise UserError(f"{where}: an {found.name} line, but the model is {family.name} (its lines carry "
                        f"{' / '.join(family.line_markers)}); use data made for this model, or the config of the "
                        "other family")
    return found


def line_form(obj: dict, where: str, family: Family | None = None) -> Mapping[str, str]:
    """Which field names this line uses (paired or single form, of its family)."""
    if "target_codes_path" in obj or "target_text_ids_path" in obj:
        paired = True
    elif "codes_path" in obj or "text_ids_path" in obj:
        paired = False
    elif "audio" in obj and "text" in obj:  # prepare's input given where its output belongs
        raise WrongKindOfFile(f"{where}: a corpus line (audio, text) for `indextts-train prepare`, not a manifest "
                              f"line; {prepare_command(where.rsplit(':', 1)[0])}")
    else:
        raise UserError(
            f"{where}: neither the paired form (target_text_ids_path, target_codes_path, ...) nor the "
            f"single form (text_ids_path, codes_path, ...); {FIX_LINE}"
        )
    fields, required = line_family(obj, where, family).manifest_forms[paired]
    if not obj.keys() >= required:  # one set comparison per line: indexing is the hot loop
        missing = [name for name in fields.values() if name not in obj]
        raise UserError(
            f"{where}: missing field(s) {', '.join(missing)}; a line of this form needs "
            f"{', '.join(fields.values())}"
        )
    return fields


def _length(obj: dict, name: str, maximum: int | None, config_key: str, where: str) -> int:
    value = obj[name]
    if type(value) is not int:  # bool is an int subclass and 7.0 is not a token count
        raise UserError(f"{where}: {name} must be a whole number, got {value!r}; {FIX_LINE}")
    if value <= 0:
        raise UserError(f"{where}: {name} is {value}, it must be > 0; {FIX_LINE}")
    if maximum is not None and value > maximum:
        raise UserError(
            f"{where}: {name} {value} > gpt.{config_key} {maximum}, which the model cannot take; "
            f"drop the line (check-data can write a clean manifest) or raise gpt.{config_key}"
        )
    return value


def line_language(obj: dict) -> str | None:
    """The line's language as its fields state it (`language`, else `target_language`), None if neither."""
    return next((str(obj[name]) for name in LANGUAGE_FIELDS if obj.get(name) is not None), None)


def array_keys(fields: Mapping[str, str]) -> tuple[str, ...]:
    """text_ids, codes, the speaker feature of the line's family, emo_vec."""
    return ("text_ids", "codes", "spk_emb" if "spk_emb" in fields else "condition", "emo_vec")


def parse_line(
    raw: bytes, where: str, max_text: int | None, max_mel: int | None, family: Family | None = None
) -> tuple[dict, Mapping[str, str], int, int]:
    """(object, field names, text_len, code_len) of one manifest line, or UserError."""
    try:
        # decode + JSONDecoder is ~30% faster than json.loads(bytes), which sniffs the encoding.
        obj = _JSON_DECODE(raw.decode("utf-8").strip().lstrip("\ufeff"))
    except json.JSONDecodeError as exc:  # its own "line 1" would mislead: the line is `where`
        raise UserError(f"{where}: not valid JSON ({exc.msg} at character {exc.pos + 1}); {FIX_LINE}") from None
    except UnicodeDecodeError as exc:
        raise UserError(f"{where}: not UTF-8 ({exc.reason} at byte {exc.start}); {FIX_LINE}") from None
    except ValueError:
        raise UserError(f"{where}: {TOO_LONG_NUMBER}; {FIX_LINE}") from None
    except RecursionError:  # json nests by recursion: a line nested thousands deep is no manifest line
        raise UserError(f"{where}: JSON nested too deeply to be a manifest line; {FIX_LINE}") from None
    if not isinstance(obj, dict):
        raise UserError(f"{where}: expected a JSON object, got {type(obj).__name__}; {FIX_LINE}")
    nested = any(isinstance(v, (dict, list)) for v in obj.values()) and json_depth_problem(obj)
    if nested:  # what a later walk of the line (check-data's rewrite) would recurse into
        raise UserError(f"{where}: {nested}; {FIX_LINE}")
    if b"\\u" in raw:  # only a \u escape puts a NUL or a lone surrogate into a decoded UTF-8 line
        check_strings(obj, where)
    fields = line_form(obj, where, family)
    for key in array_keys(fields):
        value = obj[fields[key]]
        if not isinstance(value, str) or not value:
            raise UserError(f"{where}: {fields[key]} must be a non-empty path string, got {value!r}")
    text_len = _length(obj, fields["text_len"], max_text, "max_text_tokens", where)
    code_len = _length(obj, fields["code_len"], max_mel, "max_mel_tokens", where)
    return obj, fields, text_len, code_len


def check_strings(obj: dict, where: str) -> None:
    """The line's keys and text values are usable: no NUL (no path holds one) and no lone surrogate (no
    UTF-8 file, log or console can hold one); else one UserError naming the field."""
    for key, value in obj.items():
        for text in (key, value) if isinstance(value, str) else (key,):
            problem = text_problem(text)
            if problem:
                raise UserError(f"{where}: field {key!r}: {text!r} {problem}; {FIX_LINE}")


def resolve_paths(obj: dict, manifest_dir: str) -> dict:
    """Copy of `obj` with every relative `*_path` string made absolute against the manifest folder."""
    out = dict(obj)
    for key, value in obj.items():
        if key.endswith("_path") and isinstance(value, str) and value:
            out[key] = os.path.normpath(os.path.join(manifest_dir, value))
    return out


def lang_id_of(obj: dict, where: str, borrowed: Mapping[str, int]) -> int:
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


def language_code(lang_id: int) -> str:
    return LANGUAGE_CODES[lang_id] if lang_id < len(LANGUAGE_CODES) else f"lang_id {lang_id}"


# ---------------------------------------------------------------------------------------------
# Arrays


def _load_npy(path: str, what: str, where: str) -> np.ndarray:
    if os.path.isdir(path):  # "not found" would send the user looking for a file that is there, as a folder
        raise UserError(f"{where}: {what} {path} is a folder, not a .npy file; fix the path to name the array")
    if not os.path.exists(path):
        raise UserError(
            f"{where}: {what} {path} not found; re-run preprocessing or fix the path "
            "(relative paths resolve against the manifest's folder)"
        )
    try:  # never unpickled; the header's claim is checked against the file before any allocation
        return read_npy(path, what)
    except UserError as exc:
        raise UserError(f"{where}: {exc}") from None


def read_arrays(record: dict, fields: Mapping[str, str]) -> tuple[dict[str, str], dict[str, np.ndarray]]:
    """The paths and arrays of one record's four .npy files (record as `resolve_paths` made it, with
    `_source`), read within bounds; arrays.check_arrays checks them."""
    where = record["_source"]
    keys = array_keys(fields)
    paths = {key: record[fields[key]] for key in keys}
    return paths, {key: _load_npy(paths[key], fields[key], where) for key in keys}


# ---------------------------------------------------------------------------------------------
# One line, every check


@dataclass(frozen=True)
class LineLimits:
    """What a line is checked against (None = not known, not checked)."""

    max_text: int | None
    max_mel: int | None
    model_dim: int | None
    text_vocab: int | None
    mel_codes: int | None
    family: Family | None  # the config's stated family; None accepts lines of either
    borrowed: Mapping[str, int]  # untagged language codes -> the row they borrow
    text_source: tuple[str, str]  # what text_vocab is and what to do past it
    mel_specials: tuple[int, ...]  # start/stop mel tokens, never inside a target's codes
    text_path: TextPath | None  # the tokenizer's official text path: text_ids must be its encoding


@dataclass(frozen=True)
class CheckedLine:
    """A line that passed every check, but perhaps the text comparison (`text_problem`)."""

    obj: dict  # as written; a 2.5 line without `language` gets the code of its lang_id
    fields: Mapping[str, str]
    text_len: int
    code_len: int
    text_ids: np.ndarray  # the first text_len ids: only these reach the model, the rest become stop tokens
    text_compared: bool | None = None  # with a text path: whether its text was compared (compare_text)
    text_problem: str | None = None  # ... and the refusal when the ids are not the text's: the last check


def _check_speakers(obj: dict, where: str) -> None:
    """Prompt and target must be the same speaker wherever the line says who both are.

    Any two of `speaker`, `prompt_speaker`, `target_speaker` that are present must agree (the
    IndexTTS2 prompt carries the voice; a cross-speaker pair teaches the wrong voice).
    """
    named = {name: obj[name] for name in SPEAKER_FIELDS if obj.get(name) is not None}
    if len({json.dumps(value) for value in named.values()}) > 1:
        listed = ", ".join(f"{name}={value!r}" for name, value in named.items())
        raise UserError(f"{where}: prompt and target speakers differ ({listed}); pair each target "
                        "with a prompt of the same speaker")


def check_line(raw: bytes, where: str, manifest_dir: str, limits: LineLimits) -> CheckedLine:
    """Every check on one line, first refusal first: JSON and fields, language, speakers (here), then its
    arrays read and checked (arrays.py): kind and shape, ids, the language tag, and with a text path the text
    ids against the text."""
    obj, fields, text_len, code_len = parse_line(raw, where, limits.max_text, limits.max_mel, limits.family)
    lang_id = lang_id_of(obj, where, limits.borrowed) if "spk_emb" in fields else None
    language = None if lang_id is None else language_code(lang_id)  # given to a line without one once it passes
    _check_speakers(obj, where)
    record = resolve_paths(obj, manifest_dir)
    record["_source"] = where
    paths, arrays = read_arrays(record, fields)
    check_arrays(arrays, paths, fields, text_len, code_len, max_text=limits.max_text, max_mel=limits.max_mel,
                 model_dim=limits.model_dim, where=where)
    text_ids = arrays["text_ids"][:text_len]
    check_ids(text_ids, arrays["codes"][:code_len], limits.text_vocab, limits.mel_codes, fields, where,
              limits.text_source, limits.mel_specials)
    if lang_id is not None:
        check_text_ids(text_ids, lang_id, limits.text_vocab, fields["text_ids"], where)
        obj.setdefault("language", language)
    compared, problem = (None, None) if limits.text_path is None else compare_text(
        obj, fields["text_ids"], text_ids, where, limits.text_path)
    return CheckedLine(obj, fields, text_len, code_len, text_ids, compared, problem)
