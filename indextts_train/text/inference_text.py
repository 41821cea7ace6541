"""Text as official inference presents it to the tokenizer, for both families: the ONE place that does it.

Facts (`tests/data/reference/prepare/README.md` sections 8 and 9, `text_cases.json`,
`tiktoken_cases.json`):

IndexTTS2 (`TextTokenizer.encode`, SentencePiece):
1. empty text -> no ids;
2. a text of one non-space character is encoded raw: no normaliser, no upper-casing;
3. otherwise the normaliser (WeTextProcessing, Chinese or English grammar by `use_chinese`, then a
   character map), then every CJK character becomes its own word, every word is upper-cased and
   the words are joined by one space;
4. SentencePiece ids, no start/stop id.

IndexTTS-2.5 (`infer_v2_5.py`, tiktoken):
1. the character map; 2. the normaliser for zh / zhen / en (other languages are left as they are);
3. lower case for zh, zhen, en, ja, upper case for es, other languages keep their case;
4. pronunciation marks `<word|PRON>`; 5. every `<|...|>` upper-cased; 6. `"<|lang|> " + text`
encoded with every special allowed; 7. ids 0 and 1 dropped (the GPT's start/stop ids).

WeTextProcessing is optional (it needs pynini). Without it the normaliser's own last step, the
character map, stands in: identical output for text without numbers, contractions or symbols the
grammars spell out; texts with digits are counted so commands can say how many and what to install.
"""

from __future__ import annotations

import re
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Any, ClassVar

import sentencepiece as spm

from indextts_train.config.family import INDEXTTS2, INDEXTTS25, Family, family_of_tokenizer
from indextts_train.errors import UserError
from indextts_train.text.spm_model import load_spm_file
from indextts_train.text.tiktoken_vocab import (
    COMMON_LANGUAGE,
    LANGUAGE_CODES,
    START_STOP_IDS,
    TiktokenVocab,
    language_id,
    missing_bytes,
    read_tiktoken,
)

NORMALIZER_CHOICES = ("auto", "wetext", "none")
CHARMAP_ONLY = "character map only"
WETEXT_PACKAGE = "WeTextProcessing"
WETEXT_INSTALL = "pip install 'indextts-train[normalizer]' (WeTextProcessing, needs pynini)"

# The normaliser's character map as (from, to) pairs, in the order the official alternation tries
# them at one position: a full-width comma is replaced on its own before `，，，` could match.
_CHAR_MAP = (
    ("：", ","), ("；", ","), (";", ","), ("，", ","), ("。", "."), ("！", "!"), ("？", "?"), ("\n", " "),
    ("·", "-"), ("、", ","), ("...", "…"), (",,,", "…"), ("，，，", "…"), ("……", "…"),
    ("“", "'"), ("”", "'"), ('"', "'"), ("‘", "'"), ("’", "'"), ("（", "'"), ("）", "'"), ("(", "'"),
    (")", "'"), ("《", "'"), ("》", "'"), ("【", "'"), ("】", "'"), ("[", "'"), ("]", "'"), ("—", "-"),
    ("～", "-"), ("~", "-"), ("「", "'"), ("」", "'"), (":", ","),
)
_ZH_CHAR_MAP = (("$", "."), *_CHAR_MAP)  # after the Chinese grammar `$` becomes `.` as well


def _alternation(pairs: tuple[tuple[str, str], ...]) -> tuple[re.Pattern, dict[str, str]]:
    return re.compile("|".join(re.escape(old) for old, _ in pairs)), dict(pairs)


_MAPS = {False: _alternation(_CHAR_MAP), True: _alternation(_ZH_CHAR_MAP)}
# The CJK ranges of tokenize_by_CJK_char (Ethiopic, Latin, Cyrillic ... are outside them).
_CJK = re.compile("([\u1100-\u11ff\u2e80-\ua4cf\ua840-\ud7af\uf900-\ufaff\ufe30-\ufe4f\uff65-\uffdc"
                  "\U00020000-\U0002ffff])")
_HAN = re.compile("[\u4e00-\u9fff]")
_LATIN = re.compile("[a-zA-Z]")
_EMAIL = re.compile(r"^[a-zA-Z0-9]+@[a-zA-Z0-9]+\.[a-zA-Z]+$")
_PINYIN = re.compile(r"(?<![a-z])((?:[bpmfdtnlgkhjqxzcsryw]|[zcs]h)?(?:[aeiouüv]|[ae]i|u[aio]|ao|ou|i[aue]|[uüv]e|"
                     r"[uvü]ang?|uai|[aeiuv]n|[aeio]ng|ia[no]|i[ao]ng)|ng|er)([1-5])", re.IGNORECASE)
_NAME = re.compile("[\u4e00-\u9fff]+(?:[-·—][\u4e00-\u9fff]+){1,2}")
_CONTRACTION = re.compile(r"(what|where|who|which|how|t?here|it|s?he|that|this)'s", re.IGNORECASE)
_DIGIT = re.compile(r"\d")

# IndexTTS-2.5 rules, by lower-cased language code
V25_NORMALISED = frozenset({"zh", "zhen", "en"})  # WeTextProcessing runs for these
V25_LOWER = frozenset({"zh", "zhen", "en", "ja"})
V25_UPPER = frozenset({"es"})
_PRONUNCIATION = re.compile(r"<([^|>\n]+)\|([^>\n]+)>")
_KANA = re.compile("[\u3040-\u309f]+|[\u30a0-\u30ff]+")
_CONTROL = re.compile(r"<\|.*?\|>")


# ---------------------------------------------------------------------------------------------
# stages


def character_map(text: str, *, chinese: bool = False) -> str:
    """The normaliser's punctuation map (`，`->`,`, brackets/quotes->`'`, `...`->`…`; `$`->`.` after Chinese)."""
    pattern, table = _MAPS[chinese]
    return pattern.sub(lambda match: table[match.group()], text)


def use_chinese(text: str) -> bool:
    """Which grammar the official normaliser picks: Chinese for Han text, text without Latin letters,
    an e-mail address, or pinyin with a tone digit; English otherwise."""
    if _HAN.search(text) or not _LATIN.search(text) or _EMAIL.match(text):
        return True
    return bool(_PINYIN.search(text))


def single_character(text: str) -> bool:
    """IndexTTS2 encodes such a text raw (no normaliser, no upper case): one character besides spaces."""
    return len(text.strip()) == 1


def cjk_split_upper(text: str) -> str:
    """Every CJK character its own word, everything upper-cased, words joined by one space."""
    return " ".join(part.strip().upper() for part in _CJK.split(text.strip()) if part.strip())


def case_rule(text: str, language: str) -> str:
    """IndexTTS-2.5: lower case for zh/zhen/en/ja, upper case for es, any other language as it is."""
    code = language.strip().lower()
    if code in V25_LOWER:
        return text.lower()
    return text.upper() if code in V25_UPPER else text


def pronunciation_marks(text: str) -> str:
    """`<word|PRON>` -> `<|SPECIAL_TOKEN_1|>PRON<|SPECIAL_TOKEN_1|>` (token 2 when the word has a Han
    character), PRON upper-cased; a kana PRON becomes ` PRON `."""
    def replace(match: re.Match) -> str:
        pron = match.group(2).upper()
        if _KANA.fullmatch(pron):
            return f" {pron} "
        token = "<|SPECIAL_TOKEN_2|>" if _HAN.search(match.group(1)) else "<|SPECIAL_TOKEN_1|>"
        return f"{token}{pron}{token}"

    return _PRONUNCIATION.sub(replace, text)


def control_tokens_upper(text: str) -> str:
    """Every `<|...|>` upper-cased (so `<|Laughter|>` is no special token any more: plain bytes)."""
    return _CONTROL.sub(lambda match: match.group().upper(), text)


def language_prefix(language: str) -> str:
    return f"<|{language.strip().lower()}|> "


def has_digits(text: str) -> bool:
    return bool(_DIGIT.search(text))


# ---------------------------------------------------------------------------------------------
# normalisers


def charmap_normalize(text: str) -> str:
    """The stand-in for WeTextProcessing: only its last step, the character map of the chosen grammar."""
    return character_map(text, chinese=use_chinese(text))


def _protect(text: str, pattern: re.Pattern, tag: str) -> tuple[str, list[str]]:
    """Replace each distinct match by `<tag_a>`, `<tag_b>`, ... so the grammar leaves it alone."""
    found = list(dict.fromkeys(match.group() for match in pattern.finditer(text)))
    for i, value in enumerate(found):
        text = text.replace(value, f"<{tag}_{chr(ord('a') + i)}>")
    return text, found


def _restore(text: str, found: list[str], tag: str, fix: Callable[[str], str] = str) -> str:
    for i, value in enumerate(found):
        text = text.replace(f"<{tag}_{chr(ord('a') + i)}>", fix(value))
    return text


def _pinyin_upper(pinyin: str) -> str:
    """A protected pinyin syllable comes back upper-cased; after j/q/x the vowel u/ü is written v."""
    if pinyin[0] not in "jqxJQX":
        return pinyin
    return re.sub(r"([jqx])[uü](n|e|an)*(\d)", r"\g<1>v\g<2>\g<3>", pinyin, flags=re.IGNORECASE).upper()


class WeTextNormalizer:
    """WeTextProcessing with the official wrapper around it (contractions, pinyin and names kept)."""

    def __init__(self) -> None:
        from tn.chinese.normalizer import Normalizer as ChineseNormalizer  # optional: needs pynini
        from tn.english.normalizer import Normalizer as EnglishNormalizer

        self.chinese = ChineseNormalizer(remove_interjections=False, remove_erhua=False, overwrite_cache=False)
        self.english = EnglishNormalizer(overwrite_cache=False)
        self.name = f"{WETEXT_PACKAGE} {metadata.version(WETEXT_PACKAGE)}"

    def __call__(self, text: str) -> str:
        chinese = use_chinese(text)
        text = _CONTRACTION.sub(r"\1 is", text)
        if not chinese:
            return character_map(self.english.normalize(text))
        text, pinyin = _protect(text.rstrip(), _PINYIN, "pinyin")
        text, names = _protect(text, _NAME, "n")
        result = _restore(self.chinese.normalize(text), names, "n")
        return character_map(_restore(result, pinyin, "pinyin", _pinyin_upper), chinese=True)


def check_normalizer_choice(choice: str) -> None:
    """--normalizer is one of NORMALIZER_CHOICES, also where no text is normalised (a typo is still said)."""
    if choice not in NORMALIZER_CHOICES:
        raise UserError(f"--normalizer {choice!r}: choose one of {', '.join(NORMALIZER_CHOICES)}")


def open_normalizer(choice: str = "auto") -> tuple[Callable[[str], str], str]:
    """(normalise function, its name). auto: WeTextProcessing when installed, else the character map."""
    check_normalizer_choice(choice)
    if choice == "none":
        return charmap_normalize, CHARMAP_ONLY
    try:
        normalizer = WeTextNormalizer()
    except ImportError:
        if choice == "wetext":
            raise UserError(f"--normalizer wetext: {WETEXT_PACKAGE} is not installed; {WETEXT_INSTALL}, or "
                            "pass --normalizer none") from None
        return charmap_normalize, CHARMAP_ONLY
    return normalizer, normalizer.name


# ---------------------------------------------------------------------------------------------
# the text path


@dataclass
class TextPath(ABC):
    """One tokenizer with the official text path in front of it (`TextPath.open` picks the family's).

    `digit_lines` counts presented texts that have digits while only the character map runs (the
    official normaliser would have spelled them out); `unknown_languages` counts 2.5 codes that fell
    back to the `common` row. `notes()` turns both into warnings a command prints.
    """

    family: ClassVar[Family]
    normalizer_name: str
    tokenizer: Path
    normalize: Callable[[str], str]
    strict_language: bool = False
    borrowed: dict[str, int] = field(default_factory=dict)
    digit_lines: int = 0
    unknown_languages: dict[str, int] = field(default_factory=dict)

    @classmethod
    def open(cls, tokenizer: Path, *, normalizer: str = "auto", strict_language: bool = False,
             borrowed: dict[str, int] | None = None) -> TextPath:
        """A SentencePiece `.model` is IndexTTS2, a `.tiktoken` ranks file IndexTTS-2.5."""
        tokenizer = Path(tokenizer)
        normalize, name = open_normalizer(normalizer)
        kind = next(path for path in (SentencePiecePath, TiktokenPath)
                    if path.family is family_of_tokenizer(tokenizer))
        given = [flag for flag, value in (("--borrow-language", borrowed), ("--strict-language", strict_language))
                 if value]
        if given and not kind.family.language_rows:  # it would change nothing: said, not ignored
            raise UserError(f"{given[0]} is for IndexTTS-2.5 .tiktoken text; {tokenizer} is {kind.family.name}'s, "
                            f"whose text has no language tag: leave {given[0]} out")
        return kind.load(tokenizer=tokenizer, normalize=normalize, normalizer_name=name,
                         strict_language=strict_language, borrowed=dict(borrowed or {}))

    @classmethod
    @abstractmethod
    def load(cls, **common: Any) -> TextPath:
        """This kind's path over the tokenizer file `common["tokenizer"]` (common: TextPath's fields)."""

    @property
    @abstractmethod
    def size(self) -> int:
        """Text tokens of the tokenizer (2.5: ranks + specials)."""

    def lang_id(self, language: str | None) -> int:
        """The lang_embedding row of a code (IndexTTS2 has none: -1, as ManifestIndex records its lines)."""
        return -1

    @abstractmethod
    def present(self, text: str, language: str | None = None) -> str:
        """The exact string the tokenizer is given (2.5: with the `<|lang|> ` prefix)."""

    def present_body(self, text: str, language: str | None = None) -> str:
        """2.5: the presented text without its `<|lang|> ` prefix (what pieces are learned from);
        IndexTTS2: the same as present()."""
        return self.present(text, language)

    def inexact(self, text: str, language: str | None = None) -> bool:
        """True when official inference would spell out digits of `text` that only the character map saw
        here: its presented form (and ids) then differ from inference's."""
        return self.normalizer_name == CHARMAP_ONLY and has_digits(text) and self._normalised(text, language)

    @abstractmethod
    def _normalised(self, text: str, language: str | None) -> bool:
        """Whether inference's normaliser reads `text` (one character, or a language without it: no)."""

    def encode(self, text: str, language: str | None = None) -> list[int]:
        """Ids as the GPT sees them (2.5: language tag first, every 0 and 1 dropped)."""
        return self._ids(self.present(text, language), text)

    @abstractmethod
    def encode_pieces(self, text: str, language: str | None = None) -> list[tuple[int, str]]:
        """(id, piece) pairs; SentencePiece gives an unknown run's own text as its piece."""

    @abstractmethod
    def _ids(self, presented: str, text: str) -> list[int]:
        """Ids of a presented text (`text` names it in messages)."""

    def unknown(self, text: str, language: str | None = None) -> list[str]:
        """Text the tokenizer cannot encode (its <unk> pieces, without the ▁ word mark); [] when none.

        Always [] for 2.5: a byte-level vocabulary encodes every character.
        """
        return []

    @property
    def unknown_id(self) -> int | None:
        """The id of the tokenizer's <unk> piece (None: it encodes everything)."""
        return None

    @abstractmethod
    def raw_ids(self, text: str, language: str | None = None) -> list[int]:
        """What earlier versions stored: the raw text encoded without the official presentation."""

    def notes(self) -> list[str]:
        """Warnings about what was presented so far (digits without the normaliser, unknown languages)."""
        notes = []
        if self.digit_lines:
            notes.append(f"{self.digit_lines} text(s) have digits, which official inference spells out with "
                         f"{WETEXT_PACKAGE}; here only the character map ran, so their ids differ from "
                         f"inference: {WETEXT_INSTALL}")
        for code, count in self.unknown_languages.items():
            notes.append(f"language {code!r} ({count} text(s)) is not in IndexTTS-2.5's table: encoded as "
                         f"'<|{code}|> ' + text on the `common` row ({COMMON_LANGUAGE}), as inference does; "
                         "`check-data` and `tokenize` refuse it with --strict-language")
        return notes


@dataclass
class SentencePiecePath(TextPath):
    """IndexTTS2's text path: the normaliser, CJK split and upper case, a SentencePiece model."""

    family: ClassVar[Family] = INDEXTTS2
    processor: spm.SentencePieceProcessor | None = None

    @classmethod
    def load(cls, **common: Any) -> SentencePiecePath:
        hint = "pass a SentencePiece .model or a .tiktoken ranks file"
        return cls(processor=load_spm_file(common["tokenizer"], hint), **common)

    @property
    def size(self) -> int:
        return self.processor.get_piece_size()

    def present(self, text: str, language: str | None = None) -> str:
        if not text or single_character(text):
            return text
        self.digit_lines += self.inexact(text)
        return cjk_split_upper(self.normalize(text))

    def _normalised(self, text: str, language: str | None) -> bool:
        return not single_character(text)

    def encode_pieces(self, text: str, language: str | None = None) -> list[tuple[int, str]]:
        presented = self.present(text, language)
        ids = self._ids(presented, text)
        return list(zip(ids, self.processor.encode(presented, out_type=str), strict=True)) if ids else []

    def _ids(self, presented: str, text: str) -> list[int]:
        return self.processor.encode(presented) if presented else []

    @property
    def unknown_id(self) -> int | None:
        return self.processor.unk_id()

    def raw_ids(self, text: str, language: str | None = None) -> list[int]:
        return self.processor.encode(text)

    def unknown(self, text: str, language: str | None = None) -> list[str]:
        unk = self.processor.unk_id()
        return [piece.replace("\u2581", "") for token, piece in self.encode_pieces(text, language) if token == unk]


@dataclass
class TiktokenPath(TextPath):
    """IndexTTS-2.5's text path: `<|lang|> ` + the language's rules, tiktoken ranks, 0/1 dropped."""

    family: ClassVar[Family] = INDEXTTS25
    vocab: TiktokenVocab | None = None
    encoding: object | None = None  # tiktoken.Encoding
    missing_bytes: frozenset[int] = frozenset()  # single bytes the ranks lack (tiktoken panics on them)

    @classmethod
    def load(cls, **common: Any) -> TiktokenPath:
        vocab = read_tiktoken(common["tokenizer"])
        return cls(vocab=vocab, encoding=vocab.encoding(), missing_bytes=missing_bytes(vocab), **common)

    @property
    def size(self) -> int:
        return self.vocab.n_vocab

    def lang_id(self, language: str | None) -> int:
        """The lang_embedding row of a code; unknown -> the `common` row (counted), or refused when strict."""
        if language is None or not language.strip():
            raise UserError("IndexTTS-2.5 text needs a language code: the line's `language` (prepare and "
                            "check-tokenizer take --language for text that names none)")
        code = language.strip().lower()
        row = self.borrowed.get(code, language_id(code))
        if row is not None:
            return row
        if self.strict_language:
            raise UserError(f"language {language!r} is not in IndexTTS-2.5's language table; use one of its codes, "
                            "borrow a row with --borrow-language, or leave out --strict-language to use the "
                            "`common` row")
        self.unknown_languages[code] = self.unknown_languages.get(code, 0) + 1
        return COMMON_LANGUAGE

    def _inference_code(self, language: str | None) -> str:
        """The code inference is called with: a borrowed language speaks as the code whose row it took."""
        code = (language or "").strip().lower()
        if code in self.borrowed:
            return LANGUAGE_CODES[self.borrowed[code]]
        return code

    def present(self, text: str, language: str | None = None) -> str:
        self.lang_id(language)  # refuses or counts an unknown code
        return language_prefix(self._inference_code(language)) + self._body(text, language)

    def present_body(self, text: str, language: str | None = None) -> str:
        """A text without a language gets the character map and keeps its case, as inference does for
        every language without a case rule. A language named is looked up as present() does: a code the
        table lacks (a typo such as `eng` keeps the case `en` lowers) is counted for notes(), or refused."""
        if language is not None:
            self.lang_id(language)
        return self._body(text, language)

    def _body(self, text: str, language: str | None) -> str:
        code = self._inference_code(language)
        text = character_map(text)
        if code in V25_NORMALISED:
            self.digit_lines += self.inexact(text, language)
            text = self.normalize(text)
        return control_tokens_upper(pronunciation_marks(case_rule(text, code)))

    def _normalised(self, text: str, language: str | None) -> bool:
        return self._inference_code(language) in V25_NORMALISED

    def encode_pieces(self, text: str, language: str | None = None) -> list[tuple[int, str]]:
        ids = self._ids(self.present(text, language), text)
        return [(i, self.encoding.decode_single_token_bytes(i).decode("utf-8", "replace")) for i in ids]

    def raw_ids(self, text: str, language: str | None = None) -> list[int]:
        raw = self.encoding.encode(f"<|{language}|> {text}", allowed_special="all")
        return [token for token in raw if token not in START_STOP_IDS]

    def _ids(self, presented: str, text: str) -> list[int]:
        if self.missing_bytes and not self.missing_bytes.isdisjoint(presented.encode("utf-8")):
            raise UserError(f"{text!r}: has bytes {self.tokenizer} has no rank for (a cut-down vocabulary); "
                            "use a vocabulary with all 256 single bytes")
        return [i for i in self.encoding.encode(presented, allowed_special="all") if i not in START_STOP_IDS]


