"""SentencePiece tools: extend a base tokenizer with pieces learned from a corpus, and check the result.

The model file is read and written by spm_model.py, which carries every field and base piece
byte-for-byte.

Extending appends pieces at the end: every base piece keeps its id and score, so the base rows of
the GPT's text embedding keep their meaning. New pieces get scores below the base's lowest score,
so the base's own preferences win wherever a base piece applies.
"""

from __future__ import annotations

import io
import os
import tempfile
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import sentencepiece as spm

from indextts_train.errors import UserError
from indextts_train.files.bounded import check_file
from indextts_train.files.targets import same_path
from indextts_train.text.corpus_lines import iter_text_lines, refuse_corpus_outputs, refuse_empty_sample
from indextts_train.text.inference_text import TextPath, check_normalizer_choice
from indextts_train.text.outputs import check_tokenizer_output, parse_pieces_list, said
from indextts_train.text.spm_model import (
    BPE,
    MODEL_TYPES,
    NORMAL,
    NORMALIZER_SPEC,
    TRAINER_SPEC,
    TYPE_NAMES,
    Piece,
    SpmModel,
    float32,
    load_processor,
    parse_model,
    read_model,
    spm_from_bytes,
    write_model,
)

_SPACE = "\u2581"  # "▁": SentencePiece's escaped whitespace
_BUILTIN_NORMALIZERS = {"nmt_nfkc", "nfkc", "nmt_nfkc_cf", "nfkc_cf", "identity"}
# Trainer/normalizer settings copied from the base into the temporary model, so that new pieces are
# cut and normalized the way the base cuts and normalizes text (field number -> trainer kwarg).
_TRAINER_PASSTHROUGH = {20: ("max_sentencepiece_length", int), 21: ("split_by_unicode_script", bool),
                        22: ("split_by_whitespace", bool), 23: ("split_by_number", bool),
                        24: ("treat_whitespace_as_suffix", bool), 25: ("split_digits", bool),
                        26: ("allow_whitespace_only_pieces", bool)}
_NORMALIZER_PASSTHROUGH = {3: ("add_dummy_prefix", bool), 4: ("remove_extra_whitespaces", bool)}
# 0.9999 rather than spm's 0.9995: the corpus is chosen for the new language, and every character
# left out becomes <unk> at inference; 1.0 would also admit one-off junk characters from web text.
_CHARACTER_COVERAGE = 0.9999
_TRAIN_ATTEMPTS = 3
SPM_MAX_SENTENCE_LENGTH = 4192  # spm's default max_sentence_length (bytes): kept when every line fits
_SHOW = 10  # how many examples a report lists
# A tokenizer made for a language leaves well under 1% of its characters unknown; past this share
# the text of the sample cannot be spoken, so check-tokenizer warns and exits 1.
UNK_CHAR_WARN = 0.05


@dataclass
class TrainingText:
    """What _write_training_text wrote: its lines, their distinct characters, the longest line's bytes."""

    lines: int = 0
    chars: int = 0
    longest: int = 0


def _write_training_text(corpus: Sequence[Path], dest: Path, text_path: TextPath) -> TrainingText:
    """Write the corpus texts as inference presents them (normalised, CJK-split, upper case) into one
    plain file for spm. Pieces learned from the raw text would include lower-case pieces inference
    never produces."""
    written, chars = TrainingText(), set()
    with dest.open("wb") as out:
        for path in corpus:
            for raw in iter_text_lines(path):
                text = text_path.present(raw)
                line = (text.replace("\n", " ") + "\n").encode("utf-8")
                out.write(line)
                chars.update(text)
                written.lines += 1
                written.longest = max(written.longest, len(line) - 1)
    written.chars = len(chars)
    return written


# ---------------------------------------------------------------------------------------------
# extend


def extend_tokenizer(base: Path, corpus: Sequence[Path], target_size: int, out: Path, *, seed: int = 0,
                     normalizer: str = "auto", force: bool = False) -> dict:
    """Append pieces learned from `corpus` to `base` until it has `target_size` pieces; write `out`.

    A temporary SentencePiece model of the base's type (BPE, unigram, ...) and normalization is
    trained on the corpus as inference presents it (inference_text.TextPath: normalised, CJK-split,
    upper-cased), so no new piece holds text inference never gives SentencePiece. Its NORMAL pieces
    that the base lacks are appended in its order. When there are more than needed, single
    characters are kept first: a character left out is <unk> in every text that uses it, while a
    left-out merge only costs a longer encoding.
    """
    base, out = Path(base), Path(out)
    base_model = read_model(base)
    load_processor(base_model, str(base))
    base_size = len(base_model.pieces)
    _check_extend_args(base, base_size, corpus, target_size, out, force)
    text_path = TextPath.open(base, normalizer=normalizer)
    needed = target_size - base_size
    warnings: list[str] = []
    with tempfile.TemporaryDirectory(prefix="spm-extend-") as tmp:
        text_file = Path(tmp) / "corpus.txt"
        written = _write_training_text(corpus, text_file, text_path)
        if written.lines == 0:
            raise UserError(f"{', '.join(map(str, corpus))}: the corpus has no text; give a file with one "
                            'sentence a line, or JSONL with a "text" field')
        new = _learn_new_pieces(base_model, text_file, needed, written, seed, warnings) if needed else []
    if len(new) < needed:
        raise UserError(
            f"{', '.join(map(str, corpus))}: the corpus yields only {len(new)} new pieces, {needed} are needed "
            f"to reach {target_size}; use --target-size {base_size + len(new)} or add more text")
    added = _score_new_pieces(_keep(new, needed), base_model)
    extended = SpmModel(base_model.pieces + added, base_model.rest)
    load_processor(extended, str(out))  # refuse to write a file spm would not load
    vocab, kept = write_model(extended, out, force=force)
    warnings += [f"{path} already held this tokenizer's pieces (an earlier run of this command); left as it was"
                 for path in kept if path != Path(out)]  # the output's own line says it (`said`)
    return {"said": said(out, Path(out) in kept), "base": str(base), "out": str(out), "vocab": str(vocab),
            "model_type": MODEL_TYPES.get(base_model.model_type, "unknown"),
            "base_size": base_size, "new_size": len(extended.pieces), "added": needed,
            "sample_new_pieces": [p.text for p in added[:_SHOW]], "normalizer": text_path.normalizer_name,
            "warnings": warnings + text_path.notes()}


def _check_extend_args(base: Path, base_size: int, corpus: Sequence[Path], target_size: int, out: Path,
                       force: bool) -> None:
    if target_size < base_size:
        raise UserError(f"--target-size {target_size} is smaller than the base's {base_size} pieces "
                        f"({base}); pass a size >= {base_size}")
    if same_path(out, base):
        raise UserError(f"{out}: the output would overwrite the base model; pass another -o path")
    if out.is_dir():
        raise UserError(f"{out}: is a folder; pass the path of the .model file to write")
    if out.suffix == ".vocab":
        raise UserError(f"{out}: the output must be the .model path; the .vocab is written beside it")
    if not corpus:
        raise UserError("no corpus given; pass --corpus with a text or JSONL file")
    for path in corpus:
        check_file(path, "corpus", missing="pass --corpus with a text or JSONL file")  # a FIFO: one line too
    vocab = out.with_suffix(".vocab")
    refuse_corpus_outputs(corpus, {f"--output {out}": out,
                                   f"the .vocab written beside --output {out}, {vocab},": vocab})
    # an existing one is replaced only with --force, and only when it is a model / a pieces list
    check_tokenizer_output(out, "a SentencePiece model", lambda path, raw: spm_from_bytes(path, raw, ""),
                           force=force)
    check_tokenizer_output(vocab, "a .vocab pieces list", parse_pieces_list, force=force)


def _learn_new_pieces(base: SpmModel, text_file: Path, needed: int, written: TrainingText, seed: int,
                      warnings: list[str]) -> list[Piece]:
    """New pieces (learned scores) in append order; fewer than `needed` when the corpus runs out.

    The first request leaves room for the corpus's characters plus a tenth more for pieces the base
    already has; if that overlap was larger, train again with more room.
    """
    known = {p.text for p in base.pieces}
    request = needed + written.chars + needed // 10 + 8
    # spm skips every line longer than max_sentence_length (4192 bytes by default) without a word: an
    # 18 KB paragraph taught nothing, and a corpus of only such lines failed. Raising the limit to the
    # longest line written is simpler than splitting and exact: every line is learned from as it is,
    # while a split would have to find cut points that change no piece (a space is no piece boundary
    # under split_by_whitespace false, and CJK text has no spaces). The reader bounds a line (64 MiB;
    # presented text grows a few times at most), far below spm's int32 limit.
    kwargs = _trainer_kwargs(base, warnings) | {"max_sentence_length": max(SPM_MAX_SENTENCE_LENGTH, written.longest)}
    for _ in range(_TRAIN_ATTEMPTS):
        learned = _train_temporary(text_file, request, seed, kwargs)
        new = [p for p in learned.pieces if p.kind == NORMAL and p.text not in known]
        if len(new) >= needed or len(learned.pieces) < request:  # enough, or the corpus is exhausted
            return new
        request += 2 * (needed - len(new))
    return new


def _keep(new: list[Piece], needed: int) -> list[Piece]:
    """The first `needed` pieces, characters before longer pieces, returned in learned order.

    Learned order is frequency order within each kind (spm lists BPE characters after all merges),
    and a prefix of BPE merges keeps every merge's parts, so truncation never breaks a merge chain.
    """
    by_priority = sorted(range(len(new)), key=lambda i: len(new[i].text) != 1)  # stable
    return [new[i] for i in sorted(by_priority[:needed])]


def _trainer_kwargs(base: SpmModel, warnings: list[str]) -> dict:
    trainer, normalizer = base.spec(TRAINER_SPEC), base.spec(NORMALIZER_SPEC)
    kwargs = {"model_type": MODEL_TYPES.get(base.model_type, "unigram")}
    for spec, passthrough in ((trainer, _TRAINER_PASSTHROUGH), (normalizer, _NORMALIZER_PASSTHROUGH)):
        kwargs |= {name: cast(spec[n]) for n, (name, cast) in passthrough.items() if n in spec}
    rule = normalizer.get(1, b"nmt_nfkc")
    rule = rule.decode("utf-8", "replace") if isinstance(rule, bytes) else "nmt_nfkc"
    if rule in _BUILTIN_NORMALIZERS:
        kwargs["normalization_rule_name"] = rule
    else:
        warnings.append(f"the base uses a custom normalizer ({rule!r}); new pieces were learned with "
                        "nmt_nfkc, so run check-tokenizer to find pieces it cannot produce")
    return kwargs


def _train_temporary(text_file: Path, vocab_size: int, seed: int, kwargs: dict) -> SpmModel:
    spm.set_random_generator_seed(seed)  # spm samples/shuffles sentences with a global generator
    model = io.BytesIO()
    try:
        spm.SentencePieceTrainer.train(
            input=str(text_file), model_writer=model, vocab_size=vocab_size, hard_vocab_limit=False,
            character_coverage=_CHARACTER_COVERAGE, byte_fallback=False, unk_id=0, bos_id=-1, eos_id=-1,
            pad_id=-1, input_sentence_size=5_000_000, shuffle_input_sentence=True,
            num_threads=min(os.cpu_count() or 1, 16), minloglevel=2, **kwargs)
    except RuntimeError as exc:
        raise UserError(f"sentencepiece could not learn pieces from the corpus ({exc})") from None
    return parse_model(model.getvalue(), "temporary model")


def _score_new_pieces(new: list[Piece], base: SpmModel) -> list[Piece]:
    """Scores below the base's lowest, strictly decreasing in file (float32) precision.

    BPE scores are merge ranks, so new pieces get the next ranks. Unigram scores are log
    probabilities the Viterbi search adds up, so they keep the learned differences, shifted down.
    """
    lowest = min(p.score for p in base.pieces)
    scored, previous = [], lowest
    for k, piece in enumerate(new):
        if base.model_type == BPE:
            score = lowest - (k + 1)
        else:
            score = lowest - 1.0 + (piece.score - new[0].score)
        score = float32(score)
        if score >= previous:
            score = float(np.nextafter(np.float32(previous), np.float32(-np.inf)))
        scored.append(Piece(piece.text, score, NORMAL))
        previous = score
    return scored


# ---------------------------------------------------------------------------------------------
# check


def check_tokenizer(model: Path, *, base: Path | None = None, base_vocab: int | None = None,
                    sample_text: Path | None = None, normalizer: str = "auto") -> dict:
    """Facts about a (possibly extended) tokenizer; `problems` lists what makes it unusable.

    Unreachable pieces use a cheap heuristic: a NORMAL piece is unreachable when encoding its own
    surface text (▁ as a space) does not produce it. A piece starting with ▁ is encoded as a word
    (with the dummy prefix); any other piece as a bare fragment (without it). Pieces that only arise
    inside longer words can be reported although real text reaches them.

    The sample is measured through the official text path (inference_text.TextPath), so coverage is
    what inference gets; new pieces with lower-case letters (a tokenizer grown from raw text) are a
    problem, as inference upper-cases every text it gives SentencePiece.
    """
    check_normalizer_choice(normalizer)
    model = Path(model)
    spm_model = read_model(model)
    pieces = spm_model.pieces
    report: dict = {"model": str(model), "vocab_size": len(pieces),
                    "model_type": MODEL_TYPES.get(spm_model.model_type, "unknown"),
                    "types": _count_types(pieces), "problems": [], "warnings": []}
    _check_duplicates(pieces, report)
    base_size = _check_base(spm_model, base, base_vocab, report)
    try:
        processor = load_processor(spm_model, str(model))
    except UserError as exc:
        report["problems"].append(str(exc))
        return report
    _check_reachable(spm_model, base_size, report)
    _check_lower_case(spm_model, base_size, report)
    if sample_text is not None:
        text_path = TextPath.open(model, normalizer=normalizer)
        report["sample"] = _sample_coverage(processor, Path(sample_text), base_size, text_path)
        report["normalizer"] = text_path.normalizer_name
        report["warnings"] += text_path.notes()
        rate = report["sample"]["unk_char_rate"]
        report["sample_not_covered"] = rate > UNK_CHAR_WARN
        if report["sample_not_covered"]:
            report["warnings"].append(f"{rate:.0%} of the sample's characters are unknown (<unk>) to this "
                                      "tokenizer: it does not cover the sample's language; extend it with "
                                      "extend-tokenizer on text of that language")
    return report


def tokenizer_exit_code(report: dict) -> int:
    """2: unusable (problems); 1: usable, but the sample text is mostly unknown to it; 0: OK."""
    return 2 if report["problems"] else 1 if report.get("sample_not_covered") else 0


def _count_types(pieces: list[Piece]) -> dict[str, int]:
    counts: dict[str, int] = {}
    for piece in pieces:
        name = TYPE_NAMES[piece.kind]
        counts[name] = counts.get(name, 0) + 1
    return counts


def _check_duplicates(pieces: list[Piece], report: dict) -> None:
    first_id: dict[str, int] = {}
    duplicates = []
    for i, piece in enumerate(pieces):
        if piece.text in first_id:
            duplicates.append({"piece": piece.text, "ids": [first_id[piece.text], i]})
        else:
            first_id[piece.text] = i
    report["duplicates"] = duplicates[:_SHOW]
    report["n_duplicates"] = len(duplicates)
    if duplicates:
        report["problems"].append(f"{len(duplicates)} duplicate piece(s), e.g. {duplicates[0]['piece']!r} "
                                  f"at ids {duplicates[0]['ids']}; sentencepiece refuses such a model")


def _check_base(model: SpmModel, base: Path | None, base_vocab: int | None, report: dict) -> int | None:
    """Compare with the base; returns the base size (None when unknown)."""
    if base is None:
        if base_vocab is not None and not 0 < base_vocab <= len(model.pieces):
            raise UserError(f"--base-vocab {base_vocab} must be between 1 and the model's {len(model.pieces)} pieces")
        report["base_size"] = base_vocab
        return base_vocab
    base_pieces = read_model(Path(base)).pieces
    if base_vocab is not None and base_vocab != len(base_pieces):
        raise UserError(f"--base-vocab {base_vocab} disagrees with {base} ({len(base_pieces)} pieces); "
                        "pass only one of them")
    mismatches, score_changes = [], 0
    for i, old in enumerate(base_pieces):
        new = model.pieces[i] if i < len(model.pieces) else None
        if new is None or new.text != old.text or new.kind != old.kind:
            mismatches.append({"id": i, "base": old.text, "model": None if new is None else new.text})
        elif new.score != old.score:
            score_changes += 1
    report |= {"base": str(base), "base_size": len(base_pieces), "base_ids_kept": not mismatches,
               "id_mismatches": mismatches[:_SHOW], "n_id_mismatches": len(mismatches),
               "n_score_changes": score_changes}
    swapped = len(model.pieces) < len(base_pieces) and all(  # the model is a prefix of the "base": a swap
        a.text == b.text for a, b in zip(model.pieces, base_pieces, strict=False))
    if swapped:
        report["problems"].append(f"the model has {len(model.pieces)} pieces and --base {base} has "
                                  f"{len(base_pieces)}, its first ones the same: are the two swapped? Pass the "
                                  "extended tokenizer first and the base after --base")
    elif mismatches:
        first = mismatches[0]
        report["problems"].append(f"{len(mismatches)} base piece(s) moved or changed, first at id {first['id']} "
                                  f"({first['base']!r} -> {first['model']!r}); the base GPT rows would mean "
                                  "other tokens — extend the base again with extend-tokenizer")
    if score_changes:
        report["warnings"].append(f"{score_changes} base piece(s) kept their id but changed score, so base "
                                  "text may now tokenize differently")
    return len(base_pieces)


def _check_reachable(model: SpmModel, base_size: int | None, report: dict) -> None:
    as_word = load_processor(model.with_normalizer_flag(3, True), "word variant")  # 3: add_dummy_prefix
    as_fragment = load_processor(model.with_normalizer_flag(3, False), "fragment variant")
    word_ids, fragment_ids = [], []
    for i, piece in enumerate(model.pieces):
        surface = piece.text.replace(_SPACE, " ")
        if piece.kind != NORMAL or not surface.strip():
            continue
        (word_ids if surface.startswith(" ") else fragment_ids).append(i)
    unreachable = []
    for processor, ids, strip in ((as_word, word_ids, 1), (as_fragment, fragment_ids, 0)):
        texts = [model.pieces[i].text.replace(_SPACE, " ")[strip:] for i in ids]
        for i, encoded in zip(ids, processor.encode(texts), strict=True):
            if i not in encoded:
                unreachable.append(i)
    unreachable.sort()
    report["n_unreachable"] = len(unreachable)
    report["unreachable"] = [{"id": i, "piece": model.pieces[i].text} for i in unreachable[:_SHOW]]
    if base_size is not None:
        report["n_unreachable_extended"] = sum(i >= base_size for i in unreachable)
    if unreachable:
        report["warnings"].append(f"{len(unreachable)} piece(s) not produced when encoding their own text "
                                  "(heuristic; their GPT rows may never train)")


def _check_lower_case(model: SpmModel, base_size: int | None, report: dict) -> None:
    """New pieces of two or more characters with a lower-case letter: IndexTTS2 inference upper-cases
    every text of two or more characters, so it never produces them (their rows never train)."""
    if base_size is None:
        return
    lower = [i for i in range(base_size, len(model.pieces)) if model.pieces[i].kind == NORMAL
             and len(model.pieces[i].text.replace(_SPACE, "")) > 1
             and any(ch != ch.upper() for ch in model.pieces[i].text)]
    report["n_lower_case_extended"] = len(lower)
    if lower:
        shown = ", ".join(repr(model.pieces[i].text) for i in lower[:3])
        report["problems"].append(f"{len(lower)} new piece(s) hold lower-case letters (e.g. {shown}), which IndexTTS2 "
                                  "inference never produces (it upper-cases text): the tokenizer was grown from raw "
                                  "text; grow the base again with extend-tokenizer, then re-encode the manifests "
                                  "with `indextts-train tokenize`")


def _sample_coverage(processor: spm.SentencePieceProcessor, path: Path, base_size: int | None,
                     text_path: TextPath) -> dict:
    """Token and character shares on sample text as inference presents it; characters are the
    normalized, non-space ones."""
    unk = processor.unk_id()
    lines = tokens = chars = unk_tokens = unk_chars = ext_tokens = ext_chars = 0
    batch: list[str] = []
    unknown: Counter = Counter()  # character -> how often inference would meet it as <unk>

    def flush() -> None:
        nonlocal tokens, chars, unk_tokens, unk_chars, ext_tokens, ext_chars
        for ids, pieces in zip(processor.encode(batch), processor.encode(batch, out_type=str), strict=True):
            for token, piece in zip(ids, pieces, strict=True):
                # spm returns the surface text for <unk>, so its characters are counted too
                size = len(piece.replace(_SPACE, ""))
                tokens, chars = tokens + 1, chars + size
                if token == unk:
                    unk_tokens, unk_chars = unk_tokens + 1, unk_chars + size
                    unknown.update(piece.replace(_SPACE, ""))
                elif base_size is not None and token >= base_size:
                    ext_tokens, ext_chars = ext_tokens + 1, ext_chars + size
        batch.clear()

    for text in iter_text_lines(path):
        batch.append(text_path.present(text))
        lines += 1
        if len(batch) == 1000:
            flush()
    flush()
    refuse_empty_sample(path, lines)
    result = {"path": str(path), "lines": lines, "tokens": tokens, "characters": chars,
              "unk_token_rate": unk_tokens / max(tokens, 1), "unk_char_rate": unk_chars / max(chars, 1),
              "tokens_per_line": tokens / max(lines, 1), "unknown_characters": unknown.most_common(_SHOW)}
    if base_size is not None:
        result |= {"extended_token_share": ext_tokens / max(tokens, 1),
                   "extended_char_share": ext_chars / max(chars, 1)}
    return result


def render_tokenizer_report(report: dict) -> str:
    """The report as a few readable lines, problems and warnings last."""
    types = ", ".join(f"{n} {name}" for name, n in report["types"].items())
    lines = [f"{report['model']}: {report['vocab_size']} pieces ({report['model_type']}; {types})"]
    if "base_ids_kept" in report:
        kept = "kept" if report["base_ids_kept"] else f"NOT kept ({report['n_id_mismatches']} moved)"
        lines.append(f"  base {report['base']}: {report['base_size']} pieces, ids {kept}, "
                     f"{report['vocab_size'] - report['base_size']} extended")
        lines += [f"    id {m['id']}: base {m['base']!r}, now {m['model']!r}" for m in report["id_mismatches"]]
    elif report.get("base_size") is not None:
        lines.append(f"  base size {report['base_size']}: {report['vocab_size'] - report['base_size']} extended")
    if report.get("n_duplicates"):
        lines.append(f"  duplicates: {report['n_duplicates']} "
                     + ", ".join(f"{d['piece']!r} {d['ids']}" for d in report["duplicates"]))
    if "n_unreachable" in report:
        shown = ", ".join(f"{u['id']}:{u['piece']!r}" for u in report["unreachable"])
        extended = (f" ({report['n_unreachable_extended']} extended)"
                    if "n_unreachable_extended" in report else "")
        example = f" e.g. {shown}" if shown else ""
        lines.append(f"  unreachable (heuristic): {report['n_unreachable']}{extended}{example}")
    if "sample" in report:
        s = report["sample"]
        line = (f"  sample {s['path']}: {s['lines']} lines, {s['tokens']} tokens ({s['tokens_per_line']:.1f}/line), "
                f"unk {s['unk_token_rate']:.2%} of tokens / {s['unk_char_rate']:.2%} of characters")
        if "extended_token_share" in s:
            line += (f", extended pieces {s['extended_token_share']:.2%} of tokens / "
                     f"{s['extended_char_share']:.2%} of characters")
        lines.append(line)
        if s["unknown_characters"]:
            lines.append("  unknown characters (most frequent): "
                         + ", ".join(f"{char!r} {count}" for char, count in s["unknown_characters"]))
        lines.append(f"  sample presented as official inference does; normaliser: {report['normalizer']}")
    lines += [f"  warning: {w}" for w in report["warnings"]]
    lines += [f"  PROBLEM: {p}" for p in report["problems"]]
    verdict = {0: "OK", 1: "WARNING: the sample is not covered", 2: f"{len(report['problems'])} problem(s)"}
    lines.append(f"  {verdict[tokenizer_exit_code(report)]}")
    return "\n".join(lines)
