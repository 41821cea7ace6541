"""Intelligibility: a transcript against the text it should say, as character and word error rates.

Both sides are normalised the same way before comparing (`normalise`): Unicode NFKC, casefold,
every punctuation character (Unicode category P*) removed, runs of whitespace collapsed to one
space, ends stripped. CER is the Levenshtein distance between the two normalised strings (the
single spaces count as characters) over the reference's length; WER the same over words, reported
only when the reference has more than one space-separated word (Chinese or Japanese text has none).
`alignment` gives the edit operations, for the page that marks the errors.
"""

from __future__ import annotations

import unicodedata
from dataclasses import dataclass

MAX_COMPARED_CHARS = 2000  # a babbling model's transcript can be long; the alignment is quadratic


def normalise(text: str) -> str:
    """NFKC, casefold, punctuation (category P*) removed, whitespace collapsed: 'Hello,  World!' -> 'hello world'."""
    folded = unicodedata.normalize("NFKC", text).casefold()
    kept = "".join(ch for ch in folded if not unicodedata.category(ch).startswith("P"))
    return " ".join(kept.split())


@dataclass(frozen=True)
class Edit:
    """One step of an alignment: `op` is equal, sub, del (in the reference only) or ins (in the transcript only)."""

    op: str
    ref: str
    hyp: str


def _table(ref: list[str], hyp: list[str]) -> list[list[int]]:
    """The Levenshtein table: cell [i][j] is the distance between ref[:i] and hyp[:j]."""
    rows = [list(range(len(hyp) + 1))]
    for i, r in enumerate(ref, 1):
        previous, row = rows[-1], [i]
        for j, h in enumerate(hyp, 1):
            row.append(min(previous[j] + 1, row[j - 1] + 1, previous[j - 1] + (r != h)))
        rows.append(row)
    return rows


def _align(ref: list[str], hyp: list[str]) -> list[Edit]:
    """The edits that turn ref into hyp at the least cost (substitutions preferred when costs tie)."""
    rows = _table(ref, hyp)
    edits: list[Edit] = []
    i, j = len(ref), len(hyp)
    while i or j:
        if i and j and rows[i][j] == rows[i - 1][j - 1] + (ref[i - 1] != hyp[j - 1]):
            edits.append(Edit("equal" if ref[i - 1] == hyp[j - 1] else "sub", ref[i - 1], hyp[j - 1]))
            i, j = i - 1, j - 1
        elif i and rows[i][j] == rows[i - 1][j] + 1:
            edits.append(Edit("del", ref[i - 1], ""))
            i -= 1
        else:
            edits.append(Edit("ins", "", hyp[j - 1]))
            j -= 1
    return edits[::-1]


def _errors(edits: list[Edit]) -> int:
    return sum(edit.op != "equal" for edit in edits)


def alignment(reference: str, transcript: str) -> list[Edit]:
    """Character edits between the normalised reference and the normalised transcript (each cut at
    MAX_COMPARED_CHARS)."""
    return _align(list(normalise(reference)[:MAX_COMPARED_CHARS]), list(normalise(transcript)[:MAX_COMPARED_CHARS]))


def cer(reference: str, transcript: str) -> float | None:
    """Character error rate of the normalised strings; None when the reference has no characters left."""
    ref = normalise(reference)[:MAX_COMPARED_CHARS]
    if not ref:
        return None
    return _errors(_align(list(ref), list(normalise(transcript)[:MAX_COMPARED_CHARS]))) / len(ref)


def wer(reference: str, transcript: str) -> float | None:
    """Word error rate; None unless the normalised reference has more than one space-separated word."""
    ref = normalise(reference)[:MAX_COMPARED_CHARS].split()
    if len(ref) < 2:
        return None
    return _errors(_align(ref, normalise(transcript)[:MAX_COMPARED_CHARS].split())) / len(ref)
