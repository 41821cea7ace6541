"""Checks before any work: a start that is going to fail says so first, and changes nothing on disk.

`check_inputs` runs after the config is read and before the hardware plan is printed or the output
folder is created. It checks the paths itself and asks each input's owner for the rest, cheapest
first, each refusal one line: the output folder and an earlier run's checkpoints in it without
--resume (checkpoint/run_folder.py); then the base checkpoint is read, once (checkpoint/base.read_base:
its keys settle the model family when the config states none, and a whole file's CRC pass comes
only after the checks that cost a stat); a setting typed for the other family's model
(config/unread_settings.py); the tokenizer's family against the model's, read once
(text/vocab.read_tokenizer), whose size is the model's text rows from here on (the plan counts them);
the base checkpoint's keys and shapes against the config, judged when it was read; the first lines of
every manifest (fields, files, text ids against the tokenizer's range, lengths against the config's
limits: data/checkdata.py).
"""

from __future__ import annotations

import os

from indextts_train.checkpoint.base import BaseCheckpoint, read_base
from indextts_train.checkpoint.run_folder import check_run_folder
from indextts_train.config.settings import Config
from indextts_train.config.unread_settings import check_family_settings
from indextts_train.data.checkdata import check_manifest_sample
from indextts_train.data.corpus_forms import corpus_form, refuse_corpus
from indextts_train.files.bounded import check_file
from indextts_train.text.languages import parse_borrowed
from indextts_train.text.vocab import Tokenizer, read_tokenizer
from indextts_train.train.listening import check_listen_settings
from indextts_train.ui.run_settings import RunSettings


def check_paths(options: RunSettings) -> str | None:
    """Every file the start names exists, in the order the flags are usually written; a manifest path that is
    a corpus is said as one. Returns what the output folder is as a corpus (the run folder's check says it,
    for a new run only), asked here with the manifests: each path once, at the start's edge."""
    output_corpus = corpus_form(options.output_dir) if os.path.isdir(options.output_dir) else None
    for flag, specs in (("--train-manifest", options.train_manifests), ("--val-manifest", options.val_manifests)):
        for spec in specs:  # a FIFO would block the first read: one line instead, as for a folder or no file
            refuse_corpus(spec.path, flag)  # clips and transcripts: the line says to run prepare first
            check_file(spec.path, "manifest", flag=flag, missing="check the path, or make the manifests first: "
                       "`indextts-train prepare` writes train.jsonl and val.jsonl")
    for flag, value, what in (("--tokenizer", options.tokenizer, "tokenizer"),
                              ("--base-checkpoint", options.base_checkpoint, "checkpoint")):
        if value is not None:
            check_file(value, what, flag=flag)
    resume = options.resume
    if resume not in (None, "auto"):  # `--resume auto` continues the run in --output-dir
        check_file(resume, "checkpoint", flag="--resume", missing="use --resume auto to pick the newest one")
    return output_corpus


def check_inputs(options: RunSettings, config: Config) -> tuple[Tokenizer, BaseCheckpoint | None]:
    """All the checks above and the run folder's, then the head of every manifest as check-data checks
    it (its owner, data/checkdata.py), cheapest first; returns the tokenizer and the base checkpoint
    the run will use, each read once (None: no --base-checkpoint). `config.gpt`'s family is settled
    by the base checkpoint's keys when the config states none."""
    output_corpus = check_paths(options)
    check_listen_settings(config.train)  # listeners start after saves: a bad --listen-* failed each one, unsaid
    check_run_folder(options.output_dir, options.resume, output_corpus)
    stated = config.gpt.stated_family is not None  # by the config's version:, else the base's keys settle it
    base = read_base(options.base_checkpoint, config.gpt)  # what is wrong with it is said below, in its turn
    source = (f"--config {config.source}" if stated or not options.base_checkpoint
              else f"--base-checkpoint {options.base_checkpoint}")
    check_family_settings(config.train, options.named, config.gpt.stated_family, source)
    tokenizer = read_tokenizer(options.tokenizer, config.gpt, source)
    tokenizer.size_model(config.gpt)  # before the plan, which counts the text rows
    if base is not None and base.problem is not None:
        raise base.problem
    check_manifest_sample([spec.path for spec in (*options.train_manifests, *options.val_manifests)], config.gpt,
                          tokenizer.size if options.tokenizer else None, parse_borrowed(config.train.borrow_languages),
                          skip_bad=options.skip_bad_lines)
    return tokenizer, base
