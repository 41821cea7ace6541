"""`indextts-train check-data`: every manifest line checked, a report, and a clean manifest.

The checks are the ones training applies when it reads a line (data/lines.py, its arrays data/arrays.py),
run over every line at once so a user sees all bad lines before a GPU run, not the first one an hour in.
`check_lines` reads each manifest's lines (files/bounded.py) and has each checked in turn; the sample
checked before a run goes the same way.
"""

from __future__ import annotations

import json
import os
import stat
from array import array
from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from indextts_train.config.settings import GPTConfig
from indextts_train.data.arrays import tag_base
from indextts_train.data.corpus_forms import PREPARE_RECORD, refuse_corpus
from indextts_train.data.lines import DURATION_FIELDS, FIX_LINE, CheckedLine, LineLimits, check_line, line_language
from indextts_train.data.manifest import REPORT_ERRORS, refuse_given_twice
from indextts_train.errors import UserError, WrongKindOfFile
from indextts_train.files.atomic import atomic_write_bytes
from indextts_train.files.bounded import iter_lines, json_or_none, read_bounded
from indextts_train.files.targets import check_new_file, make_output_folder
from indextts_train.text.inference_text import TextPath, check_normalizer_choice
from indextts_train.text.tiktoken_vocab import SPECIAL_TOKENS


@dataclass
class _CheckStats:
    """What check_manifests accumulates over the good lines."""

    text_lengths: array = field(default_factory=lambda: array("i"))
    code_lengths: array = field(default_factory=lambda: array("i"))
    speakers: Counter = field(default_factory=Counter)
    languages: Counter = field(default_factory=Counter)
    durations: dict[str, float] = field(default_factory=dict)
    text_tokens: int = 0
    extended_tokens: int = 0
    text_compared: int = 0  # lines whose text_ids were compared with their text's presented encoding
    text_not_compared: int = 0  # ... and lines with digits only WeTextProcessing spells as inference does
    first_line_of: dict[str, str] = field(default_factory=dict)  # id -> FILE:LINE where it first appeared
    duplicates: list[str] = field(default_factory=list)  # the first REPORT_ERRORS, both places named
    duplicate_count: int = 0
    extended_ids: tuple[int, int | None] | None = None  # ids counted as the extension's (--base-vocab): from, to

    def add(self, line: CheckedLine, where: str, limits: _Limits) -> str | None:
        """A line checked by lines.check_line: counted as compared with its text or not; its refusal when its ids are
        not the text's, else None once its lengths, speaker, language, durations and id are added."""
        obj, text_ids = line.obj, line.text_ids
        self.text_compared += line.text_compared is True
        self.text_not_compared += line.text_compared is False
        if line.text_problem is not None:
            return line.text_problem
        self.text_lengths.append(line.text_len)
        self.code_lengths.append(line.code_len)
        speaker = obj.get("target_speaker", obj.get("speaker"))
        if speaker is not None:
            self.speakers[str(speaker)] += 1
        language = line_language(obj)
        if language is not None:
            self.languages[language] += 1
        for name in DURATION_FIELDS:
            if isinstance(obj.get(name), (int, float)) and not isinstance(obj[name], bool):
                self.durations[name] = self.durations.get(name, 0.0) + float(obj[name])
        self.text_tokens += line.text_len
        self.note_id(obj.get("id"), where)
        if limits.base_vocab is not None:
            start, stop = self.extended_ids = limits.extended_ids(two_five="spk_emb" in line.fields)
            new = text_ids >= start if stop is None else (text_ids >= start) & (text_ids < stop)
            self.extended_tokens += int(np.count_nonzero(new))
        return None

    def note_id(self, sample_id: object, where: str) -> None:
        """An id seen twice is one utterance trained twice as often, or two utterances under one name."""
        if sample_id is None:
            return
        key = str(sample_id)
        first = self.first_line_of.setdefault(key, where)
        if first != where:
            self.duplicate_count += 1
            if len(self.duplicates) < REPORT_ERRORS:
                self.duplicates.append(f"{where}: id {key!r} is also the id of {first}")


@dataclass(frozen=True)
class _Limits:
    """What a line is checked against: the checks of every line (lines.py), and check-data's own."""

    line: LineLimits
    base_vocab: int | None  # the base vocabulary's size: the ids it lacks are the extension's (the report's share)

    def extended_ids(self, *, two_five: bool) -> tuple[int, int | None]:
        """(first, end) of the ids a tokenizer grown from `base_vocab` tokens added (end None: all after).
        SentencePiece appends: every id from base_vocab on. A tiktoken vocabulary inserts its new ranks before
        the 1,673 specials, which move up: ids base_vocab - 1673 .. text_vocab - 1673 (an id >= base_vocab there
        is a special, such as the language tag every line starts with)."""
        base, text_vocab, specials = self.base_vocab, self.line.text_vocab, len(SPECIAL_TOKENS)
        if not two_five:
            return base, None
        if text_vocab is None:
            raise UserError(f"--base-vocab {base}: IndexTTS-2.5 lines put the grown ranks before the special "
                            "tokens, and the vocabulary's size is not known here: add --tokenizer (or --config)")
        if base <= specials:
            raise UserError(f"--base-vocab {base}: an IndexTTS-2.5 vocabulary has {specials} special tokens after "
                            "its ranks; pass the base model's gpt.number_text_tokens (its ranks + "
                            f"{specials})")
        return base - specials, text_vocab - specials

    def checked_against(self) -> dict:
        """The report's account of these limits."""
        line = self.line
        return {"max_text_tokens": line.max_text, "max_mel_tokens": line.max_mel, "model_dim": line.model_dim,
                "text_vocab": line.text_vocab, "number_mel_codes": line.mel_codes, "base_vocab": self.base_vocab,
                "family": None if line.family is None else line.family.key,
                "language_tag_base": tag_base(line.text_vocab), "borrowed": dict(line.borrowed)}


def _text_vocab_source(from_tokenizer: bool) -> tuple[str, str]:
    """What the text-id limit is, and what to do when an id is beyond it."""
    if from_tokenizer:
        return "size of --tokenizer", "the data was made with another tokenizer; pass that one as --tokenizer"
    return ("gpt.number_text_tokens of --config",
            "pass the tokenizer the data was made with as --tokenizer (without it the config's size is the limit)")


def _distribution(values: array) -> dict[str, float] | None:
    if not values:
        return None
    arr = np.frombuffer(values, dtype=np.int32)
    return {"min": int(arr.min()), "mean": round(float(arr.mean()), 3), "p50": float(np.percentile(arr, 50)),
            "p95": float(np.percentile(arr, 95)), "max": int(arr.max())}


def _limits_for(gpt_cfg: GPTConfig | None, vocab_size: int | None, base_vocab: int | None,
                borrowed: dict[str, int] | None, text_path: TextPath | None) -> _Limits:
    """What every line is checked against: the config's sizes, the tokenizer's id range, the family."""
    text_vocab = vocab_size if vocab_size is not None else (gpt_cfg.number_text_tokens if gpt_cfg else None)
    text_source = _text_vocab_source(vocab_size is not None)
    if base_vocab is not None and text_vocab is not None and base_vocab > text_vocab:  # no id would count
        raise UserError(f"--base-vocab {base_vocab} is above the {text_vocab} tokens of the vocabulary checked "
                        f"against ({text_source[0]}); pass the base tokenizer's size")
    line = LineLimits(
        max_text=gpt_cfg.max_text_tokens if gpt_cfg else None,
        max_mel=gpt_cfg.max_mel_tokens if gpt_cfg else None,
        model_dim=gpt_cfg.model_dim if gpt_cfg else None,
        text_vocab=text_vocab,
        mel_codes=gpt_cfg.number_mel_codes if gpt_cfg else None,
        family=gpt_cfg.stated_family if gpt_cfg else None,
        borrowed=borrowed or {},
        text_source=text_source,
        mel_specials=(gpt_cfg.start_mel_token, gpt_cfg.stop_mel_token) if gpt_cfg else (),
        text_path=text_path,
    )
    return _Limits(line, base_vocab)


def check_lines(paths: Sequence[str | Path], limits: LineLimits,
                max_lines: int | None = None) -> Iterator[tuple[str, int, CheckedLine | UserError]]:
    """(file, line number, the line checked or its refusal) for every line of the manifests, or for the first
    `max_lines` of each: each line read (files/bounded.py), then checked (lines.check_line); an empty manifest
    is refused at once (a training or validation manifest with nothing to read is a mistake)."""
    for path in paths:
        manifest_dir = os.path.dirname(os.path.abspath(path))
        seen_lines = 0
        for line_no, _, raw in iter_lines(path, "manifest"):
            if max_lines is not None and seen_lines >= max_lines:
                break
            seen_lines += 1
            try:
                checked: CheckedLine | UserError = check_line(raw, f"{path}:{line_no}", manifest_dir, limits)
            except UserError as exc:
                checked = exc
            yield path, line_no, checked
        if not seen_lines:
            raise UserError(f"{path}: manifest is empty: it holds no line (pass a manifest with at least one line)")


def _refuse_other_family(gpt_cfg: GPTConfig | None, text_path: TextPath | None) -> None:
    """A tokenizer of another family than the config states: one line, not every line refused for a reason of
    the other family's (a missing language tag, ids past the vocabulary)."""
    stated = gpt_cfg.stated_family if gpt_cfg else None
    if text_path is not None and stated is not None and text_path.family is not stated:
        raise UserError(f"--tokenizer {text_path.tokenizer} is an {text_path.family.name} "
                        f"{text_path.family.tokenizer_noun}, but the config is {stated.name}'s; pass the "
                        f"tokenizer the data was made with ({stated.tokenizer_label})")


def check_manifests(paths: Sequence[str | Path], *, gpt_cfg: GPTConfig | None = None,
                    vocab_size: int | None = None, base_vocab: int | None = None,
                    borrowed: dict[str, int] | None = None, text_path: TextPath | None = None,
                    max_lines: int | None = None) -> dict:
    """Check every line of every manifest (JSON, fields, files, shapes, id ranges, lengths, speakers).

    Returns a JSON-able report: counts, the first errors, every bad (file, line), and statistics of
    the good lines. Text ids are checked against `vocab_size`, else gpt_cfg.number_text_tokens.
    IndexTTS-2.5 lines also: the 192-d speaker vector, the language row, no 0/1 text ids, and the
    language tag first (when the vocabulary is a full tiktoken one). With `text_path` (the
    tokenizer's official text path), a line that carries its text (`text` / `target_text`) must hold
    that text's presented encoding as its text ids.
    `max_lines`: only the first lines of each manifest (the trainer's check before a start).
    """
    if vocab_size is None and text_path is not None:
        vocab_size = text_path.size  # the tokenizer the text is checked with bounds the ids too
    _refuse_other_family(gpt_cfg, text_path)
    limits = _limits_for(gpt_cfg, vocab_size, base_vocab, borrowed, text_path)
    files = [str(p) for p in paths]
    for path in files:  # check-data's paths: a corpus for prepare is said as such
        refuse_corpus(path)
    refuse_given_twice(files)
    stats = _CheckStats()
    errors: list[str] = []
    bad_lines: list[list] = []
    for path, line_no, line in check_lines(files, limits.line, max_lines):
        if line_no == 1 and isinstance(line, WrongKindOfFile):  # a corpus: one line for the file, not one a line
            raise line
        refusal = str(line) if isinstance(line, UserError) else stats.add(line, f"{path}:{line_no}", limits)
        if refusal is not None:
            bad_lines.append([path, line_no])
            if len(errors) < REPORT_ERRORS:
                errors.append(refusal)
    lines_ok = len(stats.text_lengths)
    return {
        "files": files,
        "lines_ok": lines_ok,
        "lines_bad": len(bad_lines),
        "errors": errors,
        "bad_lines": bad_lines,
        "checked_against": limits.checked_against(),
        "speakers": {"count": len(stats.speakers), "top": stats.speakers.most_common(10)},
        "languages": dict(stats.languages.most_common()),
        "text_len": _distribution(stats.text_lengths),
        "code_len": _distribution(stats.code_lengths),
        "durations_s": {name: round(total, 3) for name, total in stats.durations.items()},
        "extended_token_share": (stats.extended_tokens / stats.text_tokens
                                 if base_vocab is not None and stats.text_tokens else None),
        "extended_ids": None if stats.extended_ids is None else list(stats.extended_ids),
        "text": None if text_path is None else {
            "normalizer": text_path.normalizer_name, "compared": stats.text_compared,
            "not_compared": stats.text_not_compared, "notes": text_path.notes()},
        "duplicate_ids": stats.duplicate_count,
        "duplicates": stats.duplicates,
    }


# Lines read from the head of each manifest before a run starts: enough to catch data made with another
# tokenizer or for another config (every line is alike then), bounded so a start stays quick on any manifest.
SAMPLE_LINES = 64


def check_manifest_sample(paths: Sequence[str | Path], gpt_cfg: GPTConfig, vocab_size: int | None,
                          borrowed: dict[str, int], *, skip_bad: bool) -> None:
    """The first SAMPLE_LINES lines of every manifest, checked before a run starts; the first bad one is
    refused (under --skip-bad-lines the run skips such lines itself)."""
    limits = _limits_for(gpt_cfg, vocab_size, None, borrowed, None)
    # every head is read before the first bad line is refused: an empty manifest after it is refused first
    refusals = [line for _, _, line in check_lines(paths, limits.line, SAMPLE_LINES)
                if isinstance(line, UserError)]
    if refusals and not skip_bad:
        said = str(refusals[0])  # a bad line's own fix (FIX_LINE) already names check-data; else it is said here
        lists = "" if said.endswith(FIX_LINE) else "; `indextts-train check-data` lists every bad line"
        raise UserError(f"{said} (checked before training{lists})")


def _render_distribution(name: str, dist: dict | None) -> str:
    if dist is None:
        return f"{name}: -"
    return (f"{name}: min {dist['min']}, mean {dist['mean']:.1f}, p50 {dist['p50']:g}, "
            f"p95 {dist['p95']:g}, max {dist['max']}")


def render_check_report(report: dict) -> str:
    """The human summary of a check_manifests report."""
    total = report["lines_ok"] + report["lines_bad"]
    verdict = "OK" if report["lines_bad"] == 0 else f"{report['lines_bad']} BAD"
    lines = [f"{total} lines in {len(report['files'])} manifest(s): {report['lines_ok']} ok, {verdict}",
             _render_distribution("text_len", report["text_len"]),
             _render_distribution("code_len", report["code_len"])]
    speakers = report["speakers"]
    if speakers["count"]:
        top = ", ".join(f"{name} {count}" for name, count in speakers["top"])
        lines.append(f"speakers: {speakers['count']} (top: {top})")
    if report["languages"]:
        lines.append("languages: " + ", ".join(f"{k} {v}" for k, v in report["languages"].items()))
    seen = {str(code).strip().lower() for code in report["languages"]}
    unused = sorted(set(report["checked_against"].get("borrowed") or {}) - seen)
    if unused:  # a typo of the code the lines carry, or lines of another manifest: said, as it changed nothing
        lines.append(f"note: --borrow-language {', '.join(unused)}: no line is in that language, so the flag "
                     "changed nothing here")
    for name, seconds in report["durations_s"].items():
        lines.append(f"{name}: {seconds / 3600:.2f} h total ({seconds:.0f} s)")
    share, ids = report["extended_token_share"], report.get("extended_ids")
    if share is not None:
        first, end = ids or (report["checked_against"]["base_vocab"], None)
        counted = f"id >= {first}" if end is None else f"ids {first}..{end - 1}, the ranks added before the specials"
        lines.append(f"extended-vocabulary tokens ({counted}): {100 * share:.1f}% of text tokens")
    text = report.get("text")
    if text:
        lines.append(f"text ids compared with the text as official inference encodes it: {text['compared']} line(s) "
                     f"(normaliser: {text['normalizer']})")
        if text["not_compared"]:
            lines.append(f"  not compared: {text['not_compared']} line(s) with digits, which only WeTextProcessing "
                         "presents as inference does")
    if report.get("duplicate_ids"):
        shown = len(report["duplicates"])
        lines.append(f"duplicate ids (first {shown} of {report['duplicate_ids']}; a warning, the lines are kept):")
        lines.extend(f"  {duplicate}" for duplicate in report["duplicates"])
    if report["errors"]:
        shown = len(report["errors"])
        lines.append(f"errors (first {shown} of {report['lines_bad']}):")
        lines.extend(f"  {error}" for error in report["errors"])
    return "\n".join(lines)


# ---------------------------------------------------------------------------------------------
# Clean manifest


def relocate_paths(obj: dict, from_dir: str, to_dir: str) -> dict:
    """`obj` with its relative `*_path` values re-written to point at the same files from `to_dir`."""
    for key, value in obj.items():
        if key.endswith("_path") and isinstance(value, str) and value and not os.path.isabs(value):
            target = os.path.normpath(os.path.join(from_dir, value))
            try:
                obj[key] = os.path.relpath(target, to_dir)
            except ValueError:  # another drive on Windows: no relative path exists
                obj[key] = target
    return obj


def _relocated_line(raw: bytes, from_dir: str, to_dir: str) -> bytes:
    """The line re-written so its relative `*_path` values still point at the same files from `to_dir`."""
    obj = relocate_paths(json.loads(raw), from_dir, to_dir)
    return (json.dumps(obj, ensure_ascii=False) + "\n").encode("utf-8")


def _good_lines(report: dict, bad: set, out_dir: str) -> list[bytes]:
    lines = []
    for path in report["files"]:
        from_dir = os.path.dirname(os.path.abspath(path))
        for line_no, _, raw in iter_lines(path, "manifest"):
            if (path, line_no) in bad:
                continue
            if from_dir != out_dir:
                raw = _relocated_line(raw, from_dir, out_dir)
            lines.append(raw if raw.endswith(b"\n") else raw + b"\n")
    return lines


def write_clean_manifest(source: dict | Sequence[str | Path], out_path: str | Path, *,
                         gpt_cfg: GPTConfig | None = None, vocab_size: int | None = None, force: bool = False) -> int:
    """Write only the good lines of a check report (or of `check_manifests(source, ...)`) to `out_path`.

    Lines stay byte-for-byte when `out_path` sits in the manifest's folder; elsewhere relative
    paths are rewritten to stay valid from the new folder. Returns the number of lines written (0: no line is
    good, and nothing is written).
    An existing `out_path` (a link too: it is replaced, never its target) is replaced only with `force`.
    """
    report = source if isinstance(source, dict) else check_manifests(source, gpt_cfg=gpt_cfg,
                                                                      vocab_size=vocab_size)
    _refuse_input_as_output(report["files"], out_path)
    check_clean_target(Path(out_path), force=force)
    bad = {(path, line) for path, line in report["bad_lines"]}
    out_dir = os.path.dirname(os.path.abspath(out_path))
    lines = _good_lines(report, bad, out_dir)
    if not lines:  # an empty manifest trains nothing (train refuses it): none is written
        return 0
    make_output_folder("--write-clean", Path(out_dir))  # as export does for its outputs
    try:
        # the name itself, never a link's target (an existing name was refused above without force)
        atomic_write_bytes(Path(out_path), b"".join(lines))  # never a half-written manifest under the final name
    except OSError as exc:
        raise UserError(f"{out_path}: cannot write the clean manifest ({exc.strerror or exc})") from None
    return len(lines)


def _refuse_input_as_output(manifests: Sequence[str | Path], out_path: str | Path) -> None:
    out = os.path.realpath(out_path)
    if any(os.path.realpath(path) == out for path in manifests):
        raise UserError(f"{out_path}: is an input manifest; write the clean manifest to a new file")


def clean_line(path: Path, written: int) -> str:
    """What check-data says of its --write-clean file."""
    if not written:
        return f"no clean manifest written to {path}: no line is good (an empty manifest trains nothing)"
    return f"clean manifest: {path} ({written} good line{'s' if written != 1 else ''})"


PREPARE_RECORD_BYTES = 4 * 1024 * 1024  # a record is a few KiB; a larger file is not one


# How much of an existing --write-clean file is read to see that it is a manifest: a line is a few KiB.
MANIFEST_HEAD_BYTES = 1 << 20


def check_clean_target(path: Path, *, force: bool) -> None:
    """--write-clean may be written: new, or (--force) a link, which is replaced itself, or a manifest. Any other
    file is refused even with --force: the config, the tokenizer or an array the lines name (inputs all) is
    easily typed there, and a JSONL manifest is the only thing a clean manifest replaces on purpose."""
    check_new_file("--write-clean", path, force=force)
    try:
        info = path.lstat()
    except OSError:
        return  # nothing there: nothing to lose
    if stat.S_ISLNK(info.st_mode) or (stat.S_ISREG(info.st_mode) and _reads_as_manifest(path)):
        return
    raise UserError(f"--write-clean {path} exists and is not a manifest (its first line is no JSON object), so "
                    "--force does not replace it: it may be the config, the tokenizer or a file the lines name; "
                    "choose another path")


def _reads_as_manifest(path: Path) -> bool:
    """Empty, or its first line a JSON object (read within MANIFEST_HEAD_BYTES)."""
    try:
        with path.open("rb") as handle:
            head = handle.read(MANIFEST_HEAD_BYTES)
    except OSError:
        return False
    head = head.lstrip(b"\xef\xbb\xbf \t\r\n")
    if not head:
        return True
    first, newline, _ = head.partition(b"\n")
    if not newline and len(head) >= MANIFEST_HEAD_BYTES - 3:
        return False  # a first line past the head: no manifest line is that long
    return isinstance(json_or_none(first), dict)


def check_flags_read(*, force: bool, write_clean: Path | None, normalizer: str, vocabulary: Path | None,
                     manifests: Sequence[str | Path] = ()) -> None:
    """check-data's flags that are read only beside another one: typed without it, each would change nothing.
    A --write-clean that cannot be written (an input manifest, a file there without --force, one that --force
    may not replace) is said here, before the lines are checked: the check of a large manifest takes minutes,
    and its report would be lost to the refusal (write_clean_manifest says it again, for its other callers)."""
    if force and write_clean is None:
        raise UserError("--force lets --write-clean replace an existing file, and no --write-clean is given: the "
                        "flag would change nothing; add --write-clean FILE, or leave --force out")
    if write_clean is not None:
        _refuse_input_as_output(manifests, write_clean)
        check_clean_target(write_clean, force=force)
    check_normalizer_choice(normalizer)  # a typo first: it is said even where nothing is normalised
    if normalizer != "auto" and vocabulary is None:
        raise UserError(f"--normalizer {normalizer} presents text for a tokenizer's encoding, and none is at hand (no "
                        "--tokenizer, no prepare.json beside the manifest naming one): the flag would change "
                        "nothing; add --tokenizer")


def prepared_with(manifests: Sequence[str | Path], config: Path | None,
                  tokenizer: Path | None) -> tuple[Path | None, Path | None, list[str]]:
    """check-data's config and tokenizer: those given, else the model folder's config.yaml and the
    tokenizer that prepared these manifests (prepare.json beside the first one names them); and the
    lines that say which were taken, or that no model limits are checked."""
    named = _prepare_record_models(manifests) if config is None or tokenizer is None else {}
    limits, vocabulary = config or named.get("config"), tokenizer or named.get("tokenizer")
    record, notes = "named by prepare.json beside the manifest", []
    if config is None:
        notes.append(f"--config not given: checking against {limits}, the model folder's config {record}" if limits
                     else "--config not given: lengths, feature shapes and code ids are not checked against a "
                     "model; pass --config checkpoints/config.yaml")
    if tokenizer is None and vocabulary is not None:
        notes.append(f"--tokenizer not given: text ids checked against {vocabulary}, the tokenizer {record}")
    return limits, vocabulary, notes


def _prepare_record_models(manifests: Sequence[str | Path]) -> dict[str, Path]:
    """The config and tokenizer prepare.json beside the first manifest names, those still there."""
    record = Path(manifests[0]).parent / PREPARE_RECORD if manifests else None
    try:
        if record is None or not record.is_file():
            return {}
        data = json_or_none(read_bounded(record, PREPARE_RECORD_BYTES, "prepare record"))  # swapped since: one
    except (OSError, UserError):  # line, never a FIFO's blocked read
        return {}  # not a record of ours: the caller says that no config was used
    models = data.get("models") if isinstance(data, dict) else None
    named = {key: models.get(key) for key in ("config", "tokenizer")} if isinstance(models, dict) else {}
    return {key: Path(value) for key, value in named.items() if isinstance(value, str) and Path(value).is_file()}
