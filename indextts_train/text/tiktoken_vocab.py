"""IndexTTS-2.5 text vocabulary: a tiktoken ranks file plus the official special tokens after it.

Facts (`tests/data/reference/v2_5/README.md`, `languages.json`, `vocab_growth.json`):
- a `.tiktoken` file has one line per rank, `base64(bytes) rank`, ranks 0..R-1 in order; the real
  one has R = 58,836 and one rank (48474) whose bytes are empty, which must be kept as it is;
- stock inference (`get_encoding(num_languages=99)`) numbers 1,673 special tokens from R on, in a
  fixed order: `<|endoftext|>`, `<|startoftranscript|>`, 99 language tags, audio events, emotions,
  task tokens, `<|SPECIAL_TOKEN_1..30|>`, TTS tokens, timestamps. So the model's number_text_tokens
  is R + 1673, and appending k ranks moves every special id up by k;
- text ids never hold 0 or 1 (the official code drops them): those are the GPT's start/stop ids.

Growing (`extend_tiktoken`) learns byte-pair merges on a corpus on top of the base ranks. Each new
rank is the concatenation of two existing ranks and is added only when tiktoken's own merge rule
(lowest rank of a concatenation first) builds it from single bytes, so every new piece is produced
from ordinary text, not only when a whole regex piece happens to equal it. Base lines are copied
byte for byte.
"""

from __future__ import annotations

import base64
import binascii
import heapq
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from indextts_train.errors import UserError
from indextts_train.files.bounded import MAX_TOKENIZER_BYTES, read_checked
from indextts_train.files.targets import check_new_file, same_path
from indextts_train.text.corpus_lines import iter_text_lines, refuse_corpus_outputs, refuse_empty_sample
from indextts_train.text.outputs import check_tokenizer_output, said, write_outputs

START_STOP_IDS = (0, 1)  # the GPT's start/stop text ids; 2.5 inference drops them from the text

# indextts/utils/tokenizer.py LANGUAGES order: the index is the lang_embedding row (LANGUAGE_DICT).
LANGUAGE_CODES = (
    "en zh de es ru ko fr ja pt tr pl ca nl ar sv it id hi fi vi he uk el ms cs ro da hu ta no th ur hr bg lt "
    "la mi ml cy sk te fa lv bn sr az sl kn et mk br eu is hy ne mn bs kk sq sw gl mr pa si km sn yo so af oc "
    "ka be tg sd gu am yi lo uz fo ht ps tk nn mt sa lb my bo tl mg as tt haw ln ha ba jw su yue minnan wuyu "
    "dialect zh/en en/zh common"
).split()
LANGUAGE_IDS = {code: i for i, code in enumerate(LANGUAGE_CODES)}
TAGGED_LANGUAGES = 99  # get_encoding(num_languages=99): only lang ids 0..98 have a <|xx|> token
COMMON_LANGUAGE = LANGUAGE_IDS["common"]  # where lang_to_token sends unknown codes
RELEASED_LANGUAGES = ("zh", "en", "ja", "es", "ar")  # what the IndexTTS-2.5 release supports
_AUDIO_EVENTS = ("ASR", "AED", "SER", "Speech", "/Speech", "BGM", "/BGM", "Laughter", "/Laughter", "Applause",
                 "/Applause")
_EMOTIONS = ("HAPPY", "SAD", "ANGRY", "NEUTRAL")
_TASKS = ("translate", "transcribe", "startoflm", "startofprev", "nospeech", "notimestamps")
_TTS = ("TTS/B", "TTS/O", "TTS/Q", "TTS/A", "TTS/CO", "TTS/CL", "TTS/H", *(f"TTS/SP{i:02d}" for i in range(1, 14)))
SPECIAL_TOKENS = (
    "<|endoftext|>", "<|startoftranscript|>",
    *(f"<|{code}|>" for code in LANGUAGE_CODES[:TAGGED_LANGUAGES]),
    *(f"<|{name}|>" for name in (*_AUDIO_EVENTS, *_EMOTIONS, *_TASKS)),
    *(f"<|SPECIAL_TOKEN_{i}|>" for i in range(1, 31)),
    *(f"<|{name}|>" for name in _TTS),
    *(f"<|{i * 0.02:.2f}|>" for i in range(1501)),
)
TAG_OFFSET = 2  # the tag of lang id L is special number 2 + L
# GPT-2's split pattern, which get_encoding uses.
PAT_STR = r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""
_SHOW = 10

TIKTOKEN_MISSING = "pass an existing .tiktoken ranks file"  # what a missing --tokenizer is told


def language_id(code: str) -> int | None:
    """LANGUAGE_DICT[code.lower()]; None for a code the official table does not have."""
    return LANGUAGE_IDS.get(code.strip().lower())


@dataclass
class TiktokenVocab:
    """The ranks of a `.tiktoken` file; ids R.. are the official special tokens."""

    path: Path
    ranks: list[bytes]  # rank i -> its bytes
    raw: bytes  # the file as read, so growing it keeps every base line byte-identical

    @property
    def n_ranks(self) -> int:
        return len(self.ranks)

    @property
    def n_vocab(self) -> int:
        """number_text_tokens of a model that uses this vocabulary (ranks + 1673 specials)."""
        return len(self.ranks) + len(SPECIAL_TOKENS)

    def tag_id(self, lang_id: int) -> int | None:
        """Id of the language tag `<|xx|>` (None for the untagged lang ids 99..106)."""
        return self.n_ranks + TAG_OFFSET + lang_id if 0 <= lang_id < TAGGED_LANGUAGES else None

    def rank_table(self) -> dict[bytes, int]:
        """bytes -> rank; the first rank wins for repeated bytes (check_tiktoken reports repeats)."""
        table: dict[bytes, int] = {}
        for rank, piece in enumerate(self.ranks):
            table.setdefault(piece, rank)
        return table

    def encoding(self):  # -> tiktoken.Encoding; imported lazily, only encoding needs the package
        """The tiktoken Encoding stock 2.5 inference builds from this file."""
        import tiktoken

        return tiktoken.Encoding(name=self.path.stem, pat_str=PAT_STR, mergeable_ranks=self.rank_table(),
                                 special_tokens={s: self.n_ranks + i for i, s in enumerate(SPECIAL_TOKENS)})


def read_tiktoken(path: str | Path) -> TiktokenVocab:
    """Parse and validate a ranks file; bad input names FILE:LINE."""
    path = Path(path)
    return tiktoken_from_bytes(path, read_checked(path, MAX_TOKENIZER_BYTES, "tokenizer", missing=TIKTOKEN_MISSING))


MAX_RANKS = 1_000_000  # 10^6 ranks took 660 MB and 7 s in check-tokenizer; the 256 MiB file bound allows 20 times more


def tiktoken_from_bytes(path: Path, raw: bytes) -> TiktokenVocab:
    """The ranks of a .tiktoken file's bytes (`path` names it in messages); bad input names FILE:LINE."""
    ranks: list[bytes] = []
    for line_no, line in enumerate(raw.split(b"\n"), 1):
        if not line.strip():
            continue
        if len(ranks) == MAX_RANKS:  # each rank costs tiktoken and the checks hundreds of bytes of memory
            raise UserError(f"{path}: more than {MAX_RANKS:,} ranks, which no IndexTTS vocabulary has (IndexTTS-2.5's "
                            "has 58,836, and each rank is a text row of the GPT); pass a .tiktoken ranks file")
        parts = line.split()
        try:
            # "=" is the empty rank of the real file (base64 of b""), which strict decoding refuses.
            token = b"" if parts[0] == b"=" else base64.b64decode(parts[0], validate=True)
            rank = int(parts[1])
        except (IndexError, ValueError, binascii.Error):
            raise UserError(f"{path}:{line_no}: not a tiktoken line (`base64 rank` expected); the file must be "
                            "a .tiktoken ranks file") from None
        if len(parts) != 2 or rank != len(ranks):
            raise UserError(f"{path}:{line_no}: rank {rank} where {len(ranks)} was expected; ranks must be "
                            "0, 1, 2, ... one a line")
        ranks.append(token)
    if not ranks:
        raise UserError(f"{path}: no ranks; pass a .tiktoken ranks file")
    return TiktokenVocab(path=path, ranks=ranks, raw=raw)


def missing_bytes(vocab: TiktokenVocab) -> frozenset[int]:
    """The single bytes no rank holds: tiktoken panics (a Rust panic, not an exception) on text with one."""
    return frozenset(range(256)) - {piece[0] for piece in vocab.ranks if len(piece) == 1}


# ---------------------------------------------------------------------------------------------
# tiktoken's merge rule, in Python (for learning merges and checking reachability)


def bpe_parts(table: dict[bytes, int], piece: bytes) -> list[bytes]:
    """How tiktoken splits one regex piece: the whole piece when it is a rank, else merge adjacent parts,
    always the pair whose concatenation has the lowest rank (leftmost on ties), until none is a rank."""
    if piece in table:
        return [piece]
    return merged_parts(table, piece)


def merged_parts(table: dict[bytes, int], piece: bytes) -> list[bytes]:
    """The merge loop alone, from single bytes (no whole-piece lookup).

    The same parts as rescanning every adjacent pair after each merge, but the pairs wait in a heap keyed
    by (rank, start), which is the loop's own choice (lowest rank, leftmost on ties): a rescan is quadratic
    in the piece's length: over two minutes for a 64 KB piece (a crafted rank, a corpus line without spaces)."""
    size = len(piece)
    if size <= 1:
        return [piece] if size else []
    following = list(range(1, size + 1))  # start of the part after the part that starts here (size: none)
    before = list(range(-1, size - 1))  # start of the part before it (-1: none)

    def pair(start: int) -> tuple[int, int, int, int] | None:
        middle = following[start]
        if middle >= size:
            return None  # the last part: no pair starts here
        rank = table.get(piece[start:following[middle]])
        return None if rank is None else (rank, start, middle, following[middle])

    heap = [found for found in map(pair, range(size - 1)) if found is not None]
    heapq.heapify(heap)
    while heap:
        _, start, middle, end = heapq.heappop(heap)
        if before[middle] != start or following[middle] != end or following[start] != middle:
            continue  # one of its parts has merged with another since the pair was pushed
        following[start], before[middle] = end, -2  # -2: no longer the start of a part
        if end < size:
            before[end] = start
        for left in (before[start], start):  # the two pairs the merged part now forms
            found = pair(left) if left >= 0 else None
            if found is not None:
                heapq.heappush(heap, found)
    parts, start = [], 0
    while start < size:
        parts.append(piece[start:following[start]])
        start = following[start]
    return parts


def reachable(table: dict[bytes, int], token: bytes) -> bool:
    """True when the merge loop builds `token` from its single bytes (so text inside longer words gets it)."""
    return len(token) <= 1 or merged_parts(table, token) == [token]


# ---------------------------------------------------------------------------------------------
# extend


# Merges are learned on regex pieces of at most this many characters: each merge re-splits every piece that
# holds its pair, so one long piece (a line without spaces or punctuation) would be re-split thousands of
# times; a word is far shorter, and a longer piece is learned from in slices of this length.
LEARN_PIECE_CHARS = 256


def corpus_pieces(texts: Iterable[str]) -> Counter:
    """Regex pieces (as bytes, longer ones in LEARN_PIECE_CHARS slices) of the corpus with their counts;
    special-token text is not split out."""
    import regex  # tiktoken's own dependency; the official split pattern needs \p{L}

    pattern = regex.compile(PAT_STR)
    counts: Counter = Counter()
    for text in texts:
        counts.update(match[at:at + LEARN_PIECE_CHARS].encode("utf-8") for match in pattern.findall(text)
                      for at in range(0, len(match), LEARN_PIECE_CHARS))
    return counts


class _MergeLearner:
    """Greedy BPE on top of fixed base ranks, with the pieces re-split by tiktoken's rule after each merge."""

    def __init__(self, table: dict[bytes, int], pieces: Counter) -> None:
        self.table = dict(table)
        self.words = [(bpe_parts(self.table, p), n) for p, n in pieces.items()]
        self.pairs: Counter = Counter()
        self.where: dict[tuple[bytes, bytes], set[int]] = {}
        for index in range(len(self.words)):
            self._count(index, +1)
        self.rejected: list[bytes] = []

    def _count(self, index: int, sign: int) -> None:
        parts, n = self.words[index]
        for pair in zip(parts, parts[1:], strict=False):
            self.pairs[pair] += sign * n
            if sign > 0:
                self.where.setdefault(pair, set()).add(index)

    def _best(self) -> tuple[bytes, bytes] | None:
        """Most frequent pair (ties: smallest bytes, for determinism) whose join is new and reachable."""
        candidates = [(-n, a + b, (a, b)) for (a, b), n in self.pairs.items() if n > 0 and a + b not in self.table]
        heapq.heapify(candidates)
        while candidates:
            _, joined, pair = heapq.heappop(candidates)
            self.table[joined] = len(self.table)
            if reachable(self.table, joined):
                return pair
            del self.table[joined]  # tiktoken would never build it from text: not a usable rank
            self.rejected.append(joined)
            self.pairs[pair] = 0
        return None

    def learn(self, count: int) -> list[bytes]:
        added: list[bytes] = []
        while len(added) < count:
            pair = self._best()
            if pair is None:
                break
            added.append(pair[0] + pair[1])
            for index in self.where.pop(pair, set()):
                self._count(index, -1)
                self.words[index] = (bpe_parts(self.table, b"".join(self.words[index][0])), self.words[index][1])
                self._count(index, +1)
        return added


def extend_tiktoken(base: Path, corpus: Sequence[Path], target_size: int, out: Path,
                    present: Callable[[str], str] | None = None, *, force: bool = False) -> dict:
    """Append merges learned on `corpus` until ranks + specials = target_size; write `out` atomically.

    target_size is the new number_text_tokens (ranks + 1673 specials). `present` turns a corpus text
    into what inference encodes after the language tag (inference_text.TextPath.present_body: the
    corpus language's case rule, character map, normaliser); None learns on the text as it is.
    Returns a summary.
    """
    check_new_file("--output", Path(out), force=True)  # a folder, under a file: an existing one is checked below
    vocab = read_tiktoken(base)
    if target_size < vocab.n_vocab:
        raise UserError(f"--target-size {target_size} is below the base's {vocab.n_vocab} tokens "
                        f"({vocab.n_ranks} ranks + {len(SPECIAL_TOKENS)} specials); a vocabulary can only grow")
    if same_path(out, base):
        raise UserError(f"{out}: is the base tokenizer; write the extended one to a new file")
    refuse_corpus_outputs(map(Path, corpus), {f"--output {out}": Path(out)})
    check_tokenizer_output(Path(out), "a .tiktoken ranks file", tiktoken_from_bytes, force=force)  # --force: only one
    present = present or (lambda text: text)
    texts = [present(text) for path in corpus for text in iter_text_lines(Path(path))]
    if not texts:
        raise UserError("the corpus holds no text; pass --corpus files with text in the new language")
    learner = _MergeLearner(vocab.rank_table(), corpus_pieces(texts))
    added = learner.learn(target_size - vocab.n_vocab)
    raw = vocab.raw if vocab.raw.endswith(b"\n") else vocab.raw + b"\n"
    lines = b"".join(base64.b64encode(tok) + f" {vocab.n_ranks + i}\n".encode() for i, tok in enumerate(added))
    Path(out).parent.mkdir(parents=True, exist_ok=True)
    kept = write_outputs([(Path(out), raw + lines)], force=force)  # the same bytes there (an earlier run's) stay
    return {"base_ranks": vocab.n_ranks, "added": len(added), "new_ranks": vocab.n_ranks + len(added),
            "new_size": vocab.n_vocab + len(added), "base_size": vocab.n_vocab,
            "short_by": target_size - vocab.n_vocab - len(added),
            "examples": [tok.decode("utf-8", "replace") for tok in added[:_SHOW]], "said": said(out, bool(kept))}


# ---------------------------------------------------------------------------------------------
# check


def check_tiktoken(path: Path, *, base: Path | None = None, sample_text: Path | None = None,
                   present: Callable[[str], str] | None = None) -> dict:
    """Facts about a (possibly grown) ranks file; `problems` lists what makes it unusable.

    `present` turns a sample text into what inference encodes (inference_text.TextPath.present);
    None measures the text as it is.
    """
    vocab = read_tiktoken(path)
    table = vocab.rank_table()
    report: dict = {"model": str(path), "kind": "tiktoken", "ranks": vocab.n_ranks,
                    "specials": len(SPECIAL_TOKENS), "vocab_size": vocab.n_vocab,
                    "empty_ranks": [r for r, tok in enumerate(vocab.ranks) if not tok],
                    "problems": [], "warnings": []}
    repeats = [r for r, tok in enumerate(vocab.ranks) if table[tok] != r]
    report["n_duplicates"] = len(repeats)
    if repeats:
        report["problems"].append(f"{len(repeats)} rank(s) repeat the bytes of an earlier rank, first rank "
                                  f"{repeats[0]}; tiktoken would never emit them")
    base_ranks = _check_tiktoken_base(vocab, base, report) if base is not None else None
    start = base_ranks or 0
    unreachable = [r for r in range(start, vocab.n_ranks) if vocab.ranks[r] and not reachable(table, vocab.ranks[r])]
    report["n_unreachable"] = len(unreachable)
    report["unreachable"] = [{"id": r, "piece": vocab.ranks[r].decode("utf-8", "replace")} for r in unreachable[:_SHOW]]
    if unreachable:
        report["warnings"].append(f"{len(unreachable)} rank(s){' after the base' if base else ''} are not built by "
                                  "merges: only a regex piece equal to one of them produces it")
    if sample_text is not None:
        report["sample"] = _tiktoken_coverage(vocab, Path(sample_text), base_ranks, present or (lambda text: text))
    return report


def _check_tiktoken_base(vocab: TiktokenVocab, base: Path, report: dict) -> int:
    base_vocab = read_tiktoken(base)
    kept = vocab.ranks[:base_vocab.n_ranks] == base_vocab.ranks
    lines_kept = vocab.raw.startswith(base_vocab.raw.rstrip(b"\n"))
    report |= {"base": str(base), "base_ranks": base_vocab.n_ranks, "base_size": base_vocab.n_vocab,
               "base_ids_kept": kept, "base_lines_identical": lines_kept,
               "added_ranks": vocab.n_ranks - base_vocab.n_ranks}
    if vocab.n_ranks < base_vocab.n_ranks and base_vocab.ranks[:vocab.n_ranks] == vocab.ranks:
        report["problems"].append(f"the file has {vocab.n_ranks} ranks and --base {base} has {base_vocab.n_ranks}, "
                                  "its first ones the same: are the two swapped? Pass the grown .tiktoken first and "
                                  "the base after --base")
    elif not kept:
        first = next(i for i, (a, b) in enumerate(zip(base_vocab.ranks, vocab.ranks, strict=False)) if a != b) \
            if len(vocab.ranks) >= base_vocab.n_ranks else vocab.n_ranks
        report["problems"].append(f"base rank {first} changed or is missing; the base GPT rows would mean other "
                                  "tokens: grow the base again with extend-tokenizer")
    return base_vocab.n_ranks


def _tiktoken_coverage(vocab: TiktokenVocab, path: Path, base_ranks: int | None,
                       present: Callable[[str], str]) -> dict:
    """Tokens per line, the share of characters only byte pieces cover, and the share of new ranks."""
    encoding = vocab.encoding()
    missing = missing_bytes(vocab)
    lines = tokens = chars = byte_chars = new_tokens = 0
    for number, text in enumerate(iter_text_lines(path), 1):
        presented = present(text)
        if missing and not missing.isdisjoint(presented.encode("utf-8")):  # tiktoken would panic (a traceback)
            raise UserError(f"--sample-text {path}: text {number} ({_shown_piece(text)}) has bytes {vocab.path} "
                            "has no rank for (a cut-down vocabulary); use a vocabulary with all 256 single bytes")
        # ids 0 and 1 (`!`, `"`) are dropped as inference drops them: the GPT never sees them
        ids = [i for i in encoding.encode(presented, allowed_special="all") if i not in START_STOP_IDS]
        lines, tokens, chars = lines + 1, tokens + len(ids), chars + len(text)
        if base_ranks is not None:
            new_tokens += sum(base_ranks <= i < vocab.n_ranks for i in ids)
        # a character is "byte-level" when no token holds it whole (it is split across tokens)
        for token in ids:
            piece = encoding.decode_single_token_bytes(token)
            if len(piece) == 1 and piece[0] >= 0x80:
                byte_chars += 1
    refuse_empty_sample(path, lines)
    result = {"path": str(path), "lines": lines, "tokens": tokens, "characters": chars,
              "tokens_per_line": tokens / max(lines, 1), "tokens_per_character": tokens / max(chars, 1),
              "single_byte_token_share": byte_chars / max(tokens, 1)}
    if base_ranks is not None:
        result["extended_token_share"] = new_tokens / max(tokens, 1)
    return result


def _shown_piece(piece: str, most: int = 40) -> str:
    """A rank's text as a report line shows it: a crafted rank can be megabytes long."""
    return repr(piece) if len(piece) <= most else f"{piece[:most]!r}... ({len(piece)} characters)"


def render_tiktoken_report(report: dict) -> str:
    lines = [f"{report['model']}: {report['ranks']} ranks + {report['specials']} specials = "
             f"{report['vocab_size']} tokens (tiktoken)"]
    if report["empty_ranks"]:
        lines.append(f"  empty ranks (kept, never emitted): {report['empty_ranks']}")
    if "base_ids_kept" in report:
        kept = "kept" if report["base_ids_kept"] else "NOT kept"
        lines.append(f"  base {report['base']}: {report['base_ranks']} ranks, ids {kept}, "
                     f"{report['added_ranks']} added (specials move up by {report['added_ranks']})")
    shown = ", ".join(f"{u['id']}:{_shown_piece(u['piece'])}" for u in report["unreachable"])
    lines.append(f"  not built by merges: {report['n_unreachable']}" + (f" e.g. {shown}" if shown else ""))
    if "sample" in report:
        s = report["sample"]
        line = (f"  sample {s['path']}: {s['lines']} lines, {s['tokens']} tokens ({s['tokens_per_line']:.1f}/line, "
                f"{s['tokens_per_character']:.2f}/character), single non-ASCII byte tokens "
                f"{s['single_byte_token_share']:.2%}")
        if "extended_token_share" in s:
            line += f", added ranks {s['extended_token_share']:.2%} of tokens"
        lines.append(line)
        if "normalizer" in report:
            lines.append(f"  sample presented as official inference does; normaliser: {report['normalizer']}")
    lines += [f"  warning: {w}" for w in report["warnings"]]
    lines += [f"  PROBLEM: {p}" for p in report["problems"]]
    lines.append("  OK" if not report["problems"] else f"  {len(report['problems'])} problem(s)")
    return "\n".join(lines)
