"""Checks before any work: a start that is going to fail says so first, and changes nothing on disk.

`check_inputs` runs after the config is read and before the hardware plan is printed or the output
folder is created: every path, the base checkpoint's header (its keys and shapes against the
config, read by mmap), the tokenizer, and the first lines of every manifest (fields, files, text
ids against the tokenizer's range, lengths against the config's limits), the tokenizer's family
against the model's, and an earlier run's checkpoints in the output folder without --resume, each
refused in one line.
"""

from __future__ import annotations

from pathlib import Path

from indextts_train.checkpoint.base import check_base_layout
from indextts_train.checkpoint.files import load_checkpoint
from indextts_train.checkpoint.run_folder import check_run_folder
from indextts_train.config.family import family_of_tokenizer
from indextts_train.config.settings import Config
from indextts_train.data.checkdata import check_manifest_sample
from indextts_train.errors import UserError
from indextts_train.files.bounded import check_regular
from indextts_train.text.languages import parse_borrowed
from indextts_train.text.vocab import tokenizer_size
from indextts_train.ui.run_settings import RunSettings


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


def check_tokenizer_family(options: RunSettings, config: Config) -> None:
    """A .tiktoken vocabulary is IndexTTS-2.5's, a SentencePiece .model IndexTTS2's: the tokenizer's family
    against the model's (the base checkpoint's keys settled it, else the config's version)."""
    model = config.gpt.stated_family
    if options.tokenizer is None or model is None or family_of_tokenizer(options.tokenizer) is model:
        return
    source = f"--base-checkpoint {options.base_checkpoint}" if options.base_checkpoint else "the config"
    wanted = f"{model.name}'s {model.tokenizer_label} ({model.tokenizer_name} or its extension)"
    found = family_of_tokenizer(options.tokenizer)
    kind = f"an {found.name} {found.tokenizer_noun}"
    raise UserError(f"--tokenizer {options.tokenizer}: {kind}, but {source} is {config.gpt.family.name}; "
                    f"pass {wanted}, or the checkpoint and config of the tokenizer's family")


def check_base_checkpoint(options: RunSettings, config: Config, loaded: object | None) -> None:
    """The base checkpoint's keys and shapes against the config. `loaded` is the start's one read of it
    (checkpoint.base.read_base); None when it could not be read, which reading again names."""
    if options.base_checkpoint is None:
        return
    if loaded is None:
        loaded = load_checkpoint(Path(options.base_checkpoint), mmap=True)  # raises the one-line reason
    check_base_layout(Path(options.base_checkpoint), config.gpt, loaded=loaded)


def check_inputs(options: RunSettings, config: Config, base: object | None = None) -> int:
    """All the checks above and the run folder's, then the head of every manifest as check-data checks
    it (its owner, data/checkdata.py), cheapest first; returns the text vocabulary size the run will use."""
    check_paths(options)
    check_run_folder(options.output_dir, options.resume)
    check_tokenizer_family(options, config)
    tokens = tokenizer_size(options.tokenizer) if options.tokenizer else config.gpt.number_text_tokens
    check_base_checkpoint(options, config, base)
    check_manifest_sample([spec.path for spec in (*options.train_manifests, *options.val_manifests)], config.gpt,
                          tokens if options.tokenizer else None, parse_borrowed(config.train.borrow_languages),
                          skip_bad=options.skip_bad_lines)
    return tokens
