"""Reading a text corpus: one text a line, or JSONL with a "text" field (decided per file)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

from indextts_train.errors import TOO_LONG_NUMBER, UserError, text_problem


def iter_text_lines(path: Path) -> Iterator[str]:
    """Non-empty texts of a plain text file (one a line) or a JSONL file (its "text" field).

    The format is decided per file from the first non-empty line: a JSON object means JSONL.
    """
    path = Path(path)
    if not path.is_file():
        raise UserError(f"{path}: text file not found")
    jsonl = None
    try:
        with path.open(encoding="utf-8") as handle:
            for lineno, line in enumerate(handle, 1):
                line = line.strip()
                if not line:
                    continue
                if jsonl is None:
                    jsonl = line.startswith("{") and _is_json_object(line)
                text = _jsonl_text(line, path, lineno) if jsonl else line
                if text:
                    yield text
    except UnicodeDecodeError as exc:
        raise UserError(f"{path}: not UTF-8 text ({exc.reason} at byte {exc.start}); convert it to UTF-8") from None


def _is_json_object(line: str) -> bool:
    try:
        return isinstance(json.loads(line), dict)
    except (ValueError, RecursionError):  # too deep, or a number too long, is no corpus record either
        return False


def _jsonl_text(line: str, path: Path, lineno: int) -> str:
    try:
        record = json.loads(line)
    except json.JSONDecodeError as exc:
        raise UserError(f"{path}:{lineno}: not valid JSON ({exc.msg}); fix the line or remove it") from None
    except RecursionError:
        raise UserError(f"{path}:{lineno}: JSON nested too deeply; fix the line or remove it") from None
    except ValueError:
        raise UserError(f"{path}:{lineno}: {TOO_LONG_NUMBER}; fix the line or remove it") from None
    text = record.get("text") if isinstance(record, dict) else None
    if not isinstance(text, str):
        raise UserError(f'{path}:{lineno}: no "text" string field; JSONL corpora need one on every line')
    problem = text_problem(text)  # a \ud800 escape: no tokenizer can take it
    if problem:
        raise UserError(f'{path}:{lineno}: "text" {text!r} {problem}; fix the line or remove it')
    return text.strip()
