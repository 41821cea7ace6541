"""Reading a text corpus: one text a line, or JSONL with a "text" field (decided per file)."""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from pathlib import Path

from indextts_train.errors import UserError, text_problem
from indextts_train.files.bounded import iter_lines, parse_json
from indextts_train.files.targets import same_path

NO_TEXT = 'give a file with one text a line, or JSONL with a "text" field'


def iter_text_lines(path: Path) -> Iterator[str]:
    """Non-empty texts of a plain text file (one a line) or a JSONL file (its "text" field).

    The format is decided per file from the first non-empty line: a JSON object means JSONL.
    """
    path = Path(path)
    jsonl = None
    for lineno, _, raw in iter_lines(path, "text corpus"):  # missing, a folder, a FIFO: one line; each line bounded
        try:
            line = raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise UserError(f"{path}:{lineno}: not UTF-8 text ({exc.reason} at byte {exc.start} of the line); "
                            "convert the file to UTF-8") from None
        # a byte-order mark (what Windows editors put first) is no text: left in, a JSONL corpus would be read
        # as plain text and its braces and field names learned as pieces
        line = (line.lstrip("\ufeff") if lineno == 1 else line).strip()
        if not line:
            continue
        if jsonl is None:
            jsonl = line.startswith("{") and _is_json_object(line)
        text = _jsonl_text(line, path, lineno) if jsonl else line
        if text:
            yield text


def _is_json_object(line: str) -> bool:
    try:
        return isinstance(parse_json(line, "a corpus line"), dict)
    except (json.JSONDecodeError, UserError):  # too deep is no corpus record either
        return False


def _jsonl_text(line: str, path: Path, lineno: int) -> str:
    try:
        record = parse_json(line, f"{path}:{lineno}")  # nesting bounded: one line naming the line
    except json.JSONDecodeError as exc:
        raise UserError(f"{path}:{lineno}: not valid JSON ({exc.msg}); fix the line or remove it") from None
    text = record.get("text") if isinstance(record, dict) else None
    if not isinstance(text, str):
        raise UserError(f'{path}:{lineno}: no "text" string field; JSONL corpora need one on every line')
    problem = text_problem(text)  # a \ud800 escape: no tokenizer can take it
    if problem:
        raise UserError(f'{path}:{lineno}: "text" {text!r} {problem}; fix the line or remove it')
    return text.strip()


def refuse_corpus_outputs(corpus: Iterable[Path], outputs: dict[str, Path]) -> None:
    """An output (what it is -> its path) that is also a --corpus file would replace the text it is learned
    from: refused, --force or not."""
    for path in corpus:
        hit = next((what for what, out in outputs.items() if same_path(out, path)), None)
        if hit is not None:
            raise UserError(f"{hit} would overwrite the --corpus file {path}; write the tokenizer to a new path")


def refuse_empty_sample(path: Path, lines: int) -> None:
    """A sample without text measures nothing: its 0% unknown would read as full coverage."""
    if not lines:
        raise UserError(f"--sample-text {path}: no text to measure coverage on; {NO_TEXT}")
