"""Checks before any work: a start that is going to fail says so first, and changes nothing on disk.

`check_inputs` runs after the config is read and before the hardware plan is printed or the output
folder is created. It checks the paths itself and asks each input's owner for the rest, in this
order, each refusal one line: the output folder and an earlier run's checkpoints in it without
--resume (checkpoint/run_folder.py); the tokenizer's family against the model's, read once
(text/vocab.read_tokenizer); the base checkpoint's keys and shapes against the config, judged when
setup read it (checkpoint/base.read_base); the first lines of every manifest (fields, files, text
ids against the tokenizer's range, lengths against the config's limits: data/checkdata.py).
"""

from __future__ import annotations

import contextlib
import itertools
import os
from pathlib import Path

from indextts_train.checkpoint.base import BaseCheckpoint
from indextts_train.checkpoint.run_folder import check_run_folder
from indextts_train.config.settings import Config
from indextts_train.data.checkdata import check_manifest_sample
from indextts_train.errors import UserError
from indextts_train.files.bounded import check_regular
from indextts_train.text.languages import parse_borrowed
from indextts_train.text.vocab import Tokenizer, read_tokenizer
from indextts_train.ui.run_settings import RunSettings

LOOKED_AT = 1000  # entries of a folder given for a file that are looked at for the file meant


def _is_folder(flag: str, value: str | Path, wanted: str, suffixes: tuple[str, ...]) -> None:
    """A folder where a file belongs is said as such, with the files in it that could be meant."""
    if not Path(value).is_dir():
        return
    found: list[str] = []
    with contextlib.suppress(OSError), os.scandir(value) as entries:  # a folder it may not list: no example
        for entry in itertools.islice(entries, LOOKED_AT):
            if entry.name.endswith(suffixes) and len(found) < 3:
                found.append(entry.name)
    meant = f" (e.g. {' or '.join(str(Path(value) / name) for name in sorted(found))})" if found else ""
    raise UserError(f"{flag} {value} is a folder; pass the {wanted} file in it{meant}")


def check_paths(options: RunSettings) -> None:
    """Every file the start names exists, in the order the flags are usually written."""
    for flag, specs in (("--train-manifest", options.train_manifests), ("--val-manifest", options.val_manifests)):
        for spec in specs:
            _is_folder(flag, spec.path, "manifest", (".jsonl",))
            if not Path(spec.path).exists():
                raise UserError(f"{spec.path}: manifest not found; check the path you passed")
            check_regular(spec.path, "manifest")  # a FIFO would block the first read: one line instead
    for flag, value, wanted, suffixes in (("--tokenizer", options.tokenizer, "tokenizer", (".model", ".tiktoken")),
                                          ("--base-checkpoint", options.base_checkpoint, "checkpoint", (".pth",))):
        if value is None:
            continue
        _is_folder(flag, value, wanted, suffixes)
        if not Path(value).exists():
            raise UserError(f"{flag} {value}: no such file; check the path")
        check_regular(value, flag)
    resume = options.resume
    if resume not in (None, "auto"):
        _is_folder("--resume", resume, "checkpoint", (".pth",))  # `--resume auto` continues the --output-dir run
    if resume not in (None, "auto") and not Path(resume).is_file():
        raise UserError(f"--resume {resume}: no such checkpoint file; use --resume auto to pick the newest one")


def check_inputs(options: RunSettings, config: Config, base: BaseCheckpoint | None = None) -> Tokenizer:
    """All the checks above and the run folder's, then the head of every manifest as check-data checks
    it (its owner, data/checkdata.py), cheapest first; returns the tokenizer the run will use, read once.

    `base` is the start's one read of the base checkpoint (checkpoint.base.read_base): what is wrong
    with it was found then and is said here, in its turn."""
    check_paths(options)
    check_run_folder(options.output_dir, options.resume)
    source = f"--base-checkpoint {options.base_checkpoint}" if options.base_checkpoint else "the config"
    tokenizer = read_tokenizer(options.tokenizer, config.gpt, source)
    if base is not None and base.problem is not None:
        raise base.problem
    check_manifest_sample([spec.path for spec in (*options.train_manifests, *options.val_manifests)], config.gpt,
                          tokenizer.size if options.tokenizer else None, parse_borrowed(config.train.borrow_languages),
                          skip_bad=options.skip_bad_lines)
    return tokenizer
