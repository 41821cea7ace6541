"""Where `extend-tokenizer` may write: `-o` (and, for SentencePiece, the `.vocab` beside it).

An existing file is replaced only with `--force`, and even then only when it is of the kind the command
writes there: a tokenizer of the output's kind under `-o`, a SentencePiece pieces list under the `.vocab`.
Notes, a manifest or a corpus saved under that name by mistake are the user's, and --force does not
replace them (as `export --force` replaces only a torch file, checkpoint/export_targets.py). A symbolic
link is replaced itself, never the file it points to (files/targets.py).
"""

from __future__ import annotations

import stat
from collections.abc import Callable
from pathlib import Path

from indextts_train.errors import UserError
from indextts_train.files.bounded import MAX_TOKENIZER_BYTES, kind_of_path, read_checked
from indextts_train.files.targets import check_new_file

# Reads a file's bytes as the kind written there (a tokenizer's own parser), raising UserError when it is not.
Parser = Callable[[Path, bytes], object]


def check_tokenizer_output(path: Path, kind: str, parse: Parser, *, force: bool) -> None:
    """`path` may be written as `kind` (what `parse` reads): new, or with --force a link or a file `parse` reads."""
    check_new_file("--output", path, force=force)  # a folder, under a file, or existing without --force
    if not (path.is_symlink() or path.exists()):
        return
    mode = path.lstat().st_mode
    if stat.S_ISLNK(mode):
        return
    if not stat.S_ISREG(mode):
        raise UserError(f"--output {path} is {kind_of_path(path)}, not a file; choose another path")
    try:
        parse(path, read_checked(path, MAX_TOKENIZER_BYTES, "tokenizer", missing="choose another path"))
    except (UserError, OSError):
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
