"""CER, WER, normalisation and the alignment on real strings whose answers are known by hand."""

from __future__ import annotations

import pytest

from indextts_train.listen.text_score import alignment, cer, normalise, wer


@pytest.mark.parametrize(("text", "expected"), [
    ("Hello,  World!", "hello world"),
    ("ＡＢＣ１２３", "abc123"),  # NFKC: full-width letters and digits
    ("Straße", "strasse"),  # casefold, not lower()
    ("«Bonjour», dit-il.", "bonjour ditil"),  # guillemets and the hyphen are punctuation
    ("ሰላም። እንዴት ነህ፧", "ሰላም እንዴት ነህ"),  # Ethiopic full stop and question mark
    ("你好，世界。", "你好世界"),  # CJK punctuation, no spaces
    ("\ttab\n\nnew line ", "tab new line"),
])
def test_normalise(text, expected):
    assert normalise(text) == expected


def test_cer_counts_substitutions_insertions_and_deletions():
    assert cer("kitten", "sitting") == 3 / 6  # k->s, e->i, +g
    assert cer("abc", "abd") == 1 / 3
    assert cer("Hello, world!", "hello world") == 0.0  # the same after normalisation
    assert cer("abc", "") == 1.0
    assert cer("ab", "abab") == 1.0  # two insertions over two characters
    assert cer("!!!", "anything") is None  # nothing left to compare against


def test_wer_only_for_space_separated_text():
    assert wer("the cat sat", "the cat sat down") == 1 / 3
    assert wer("the cat sat", "a cat sat") == 1 / 3
    assert wer("the cat sat", "sat") == 2 / 3
    assert wer("你好世界", "你好") is None
    assert wer("word", "word") is None


def test_alignment_marks_each_error():
    ops = [(e.op, e.ref, e.hyp) for e in alignment("kitten", "sitting")]
    assert ops == [("sub", "k", "s"), ("equal", "i", "i"), ("equal", "t", "t"), ("equal", "t", "t"),
                   ("sub", "e", "i"), ("equal", "n", "n"), ("ins", "", "g")]
    assert [e.op for e in alignment("abc", "ac")] == ["equal", "del", "equal"]
