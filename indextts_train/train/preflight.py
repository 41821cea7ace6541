"""Checks before any work: a start that is going to fail says so first, and changes nothing on disk.

`check_inputs` runs after the config is read and before the hardware plan is printed or the output
folder is created: every path, the base checkpoint's header (its keys and shapes against the
config, read by mmap), the tokenizer, and the first lines of every manifest (fields, files, text
ids against the tokenizer's range, lengths against the config's limits), the tokenizer's family
against the model's, and an earlier run's checkpoints in the output folder without --resume, each
refused in one line.
"""

from __future__ import annotations

import os
from pathlib import Path

from indextts_train.checkpoint.base import BaseCheckpoint
from indextts_train.checkpoint.manager import check_no_earlier_run
from indextts_train.config.settings import Config
from indextts_train.data.checkdata import check_manifests
from indextts_train.errors import UserError
from indextts_train.files.bounded import check_regular
from indextts_train.text.languages import parse_borrowed
from indextts_train.text.vocab import Tokenizer, read_tokenizer
from indextts_train.ui.run_settings import RunSettings

# Lines read from the head of each manifest: enough to catch data made with another tokenizer or
# for another config (every line is alike then), bounded so a start stays quick on any manifest.
SAMPLE_LINES = 64


def check_output_dir(output_dir: Path) -> None:
    """The run folder can be made and written, checked without making it."""
    path = Path(output_dir)
    flag = f"--output-dir {path}"
    if path.exists() and not path.is_dir():
        raise UserError(f"{flag}: is a file, not a folder; choose a folder path for the run")
    existing = next((p for p in (path, *path.parents) if p.exists()), None)
    if existing is not None and not existing.is_dir():
        raise UserError(f"{flag}: {existing} is a file, so no folder can be made under it; choose another path")
    if existing is not None and not os.access(existing, os.W_OK | os.X_OK):
        raise UserError(f"{flag}: {existing} is not writable; choose a writable folder")


def check_paths(options: RunSettings) -> None:
    """Every file the start names exists, in the order the flags are usually written."""
    for spec in (*options.train_manifests, *options.val_manifests):
        if not Path(spec.path).exists() or Path(spec.path).is_dir():
            raise UserError(f"{spec.path}: manifest not found; check the path you passed")
        check_regular(spec.path, "manifest")  # a FIFO would block the first read: one line instead
    for flag, value in (("--tokenizer", options.tokenizer), ("--base-checkpoint", options.base_checkpoint)):
        if value is not None and (not Path(value).exists() or Path(value).is_dir()):
            raise UserError(f"{flag} {value}: no such file; check the path")
        if value is not None:
            check_regular(value, flag)
    resume = options.resume
    if resume not in (None, "auto") and not Path(resume).is_file():
        raise UserError(f"--resume {resume}: no such checkpoint file; use --resume auto to pick the newest one")
    check_output_dir(options.output_dir)


def check_manifest_sample(options: RunSettings, config: Config, tokens: int) -> None:
    """The first SAMPLE_LINES lines of every manifest, as check-data checks them; the first bad one
    is refused (under --skip-bad-lines the run skips such lines itself)."""
    paths = [spec.path for spec in (*options.train_manifests, *options.val_manifests)]
    report = check_manifests(paths, gpt_cfg=config.gpt, vocab_size=tokens if options.tokenizer else None,
                             borrowed=parse_borrowed(config.train.borrow_languages), max_lines=SAMPLE_LINES)
    if report["lines_bad"] and not options.skip_bad_lines:
        raise UserError(f"{report['errors'][0]} (checked before training; `indextts-train check-data` lists "
                        "every bad line)")


def check_inputs(options: RunSettings, config: Config, base: BaseCheckpoint | None = None) -> Tokenizer:
    """All the checks above, cheapest first; returns the tokenizer the run will use, read once.

    `base` is the start's one read of the base checkpoint (checkpoint.base.read_base): what is wrong
    with it was found then and is said here, in its turn."""
    check_paths(options)
    check_no_earlier_run(Path(options.output_dir), options.resume)
    source = f"--base-checkpoint {options.base_checkpoint}" if options.base_checkpoint else "the config"
    tokenizer = read_tokenizer(options.tokenizer, config.gpt, source)
    if base is not None and base.problem is not None:
        raise base.problem
    check_manifest_sample(options, config, tokenizer.size)
    return tokenizer
