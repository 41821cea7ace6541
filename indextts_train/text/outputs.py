"""Where `extend-tokenizer` may write: `-o` (and, for SentencePiece, the `.vocab` beside it).

An existing file is replaced only with `--force`, and even then only when it is of the kind the command
writes there: a tokenizer of the output's kind under `-o`, a SentencePiece pieces list under the `.vocab`.
Notes, a manifest or a corpus saved under that name by mistake are the user's, and --force does not
replace them (as `export --force` replaces only a torch file, checkpoint/export_targets.py). A symbolic
link is replaced itself, never the file it points to (files/targets.py).

Without --force, a file of the kind that already holds exactly the bytes this run writes is left as it is
(`write_outputs`): an earlier run of the same command wrote it, killed between its two files or finished, so
the same command completes it and nothing anyone had is replaced. Any other existing file is refused.
"""

from __future__ import annotations

import stat
from collections.abc import Callable
from pathlib import Path

from indextts_train.errors import UserError
from indextts_train.files.atomic import atomic_write_bytes
from indextts_train.files.bounded import MAX_TOKENIZER_BYTES, kind_of_path, read_checked
from indextts_train.files.targets import check_new_file

# Reads a file's bytes as the kind written there (a tokenizer's own parser), raising UserError when it is not.
Parser = Callable[[Path, bytes], object]


def check_tokenizer_output(path: Path, kind: str, parse: Parser, *, force: bool) -> None:
    """`path` may be written as `kind` (what `parse` reads): new, a file `parse` reads (without --force only
    when it holds what this run writes: `write_outputs` decides), or with --force a link."""
    check_new_file("--output", path, force=True)  # a folder, or under a file
    if not (path.is_symlink() or path.exists()):
        return
    mode = path.lstat().st_mode
    if stat.S_ISLNK(mode):
        check_new_file("--output", path, force=force)  # a link is never read through: --force or refused
        return
    if not stat.S_ISREG(mode):
        raise UserError(f"--output {path} is {kind_of_path(path)}, not a file; choose another path")
    try:
        parse(path, read_checked(path, MAX_TOKENIZER_BYTES, "tokenizer", missing="choose another path"))
    except (UserError, OSError):
        check_new_file("--output", path, force=force)  # without --force: refused as any existing file is
        raise UserError(f"--output {path} exists and is not {kind}, so --force does not replace it: it may be "
                        "notes, a corpus or another file saved under that name; choose another path") from None


def parse_pieces_list(path: Path, raw: bytes) -> None:
    """What sentencepiece writes beside a model (the .vocab): `piece<TAB>score` a line, nothing else."""
    try:
        lines = raw.decode("utf-8").splitlines()
    except UnicodeDecodeError:
        raise UserError(f"{path}: not UTF-8, not a pieces list") from None
    for line in lines or [""]:
        _, tab, score = line.rpartition("\t")
        try:
            float(score if tab else "no score")
        except ValueError:
            raise UserError(f"{path}: {line[:40]!r} is no `piece<TAB>score` line") from None


def write_outputs(outputs: list[tuple[Path, bytes]], *, force: bool) -> list[Path]:
    """Write each (path, bytes) atomically, once all may be written (none is, when one is refused); returns the
    paths left as they were because they already held those bytes (module docstring)."""
    kept = [] if force else [path for path, data in outputs if _holds(path, data)]
    for path, _ in outputs:
        if path not in kept:
            check_new_file("--output", path, force=force)  # another file there: --force or refused, as before
    for path, data in outputs:
        if path not in kept:
            atomic_write_bytes(path, data)
    return kept


def _holds(path: Path, data: bytes) -> bool:
    """Whether `path` is a regular file (not a link) of exactly `data`."""
    if path.is_symlink() or not path.is_file() or path.stat().st_size != len(data):
        return False
    return path.read_bytes() == data


def said(path: Path, kept: bool) -> str:
    """What a command did with its output, for its summary line: a rerun whose output already held the same bytes
    left it as it was (it said 'wrote')."""
    return f"kept {path} (an earlier run of this command wrote the same bytes)" if kept else f"wrote {path}"
