"""IndexTTS-2.5 language rows a run borrows: `--borrow-language NEW=CODE`, checked against the official table.

A language without its own tag trains on the row and tag of an official language the release does
not speak; the notes say how to call inference for it afterwards.
"""

from __future__ import annotations

from indextts_train.errors import UserError
from indextts_train.text.tiktoken_vocab import LANGUAGE_CODES, RELEASED_LANGUAGES, TAGGED_LANGUAGES, language_id


def parse_borrowed(values: list[str] | None) -> dict[str, int]:
    """`--borrow-language NEW=CODE` values -> {new code: lang_embedding row of CODE}."""
    borrowed: dict[str, int] = {}
    for value in values or []:
        new, _, code = value.partition("=")
        new, row = new.strip().lower(), language_id(code)
        if not new or row is None:
            raise UserError(f"--borrow-language {value!r}: expected NEW=CODE with CODE one of the official language "
                            f"codes (e.g. kab=yo)")
        own = language_id(new)
        if own is not None and own < TAGGED_LANGUAGES:
            raise UserError(f"--borrow-language {value!r}: {new!r} has its own row ({own}) and tag; borrowing is "
                            "for languages without a tag")
        if code.strip().lower() in RELEASED_LANGUAGES:
            raise UserError(f"--borrow-language {value!r}: {code} is a language the release speaks; borrow the row "
                            "of a language it does not use")
        if row in borrowed.values():
            raise UserError(f"--borrow-language {value!r}: row {row} is already borrowed by another language")
        borrowed[new] = row
    return borrowed


def borrow_notes(values: list[str] | None) -> list[str]:
    """One sentence per borrowed row, for the training log and the export."""
    notes = []
    for new, row in parse_borrowed(values).items():
        code = LANGUAGE_CODES[row]
        notes.append(f"language {new} was trained on the row and tag of {code} (lang_id {row}): call IndexTTS-2.5 "
                     f"inference with lang='{code}' and start its text with <|{code}|>")
    return notes
