"""One `train-gpt` start, resolved once at the edge: the flags, a recorded run (`--from-run`), the
config file and its `train:` section become one frozen RunSettings before training starts.

Everything a start reads from its inputs is decided here, in this order (the order of the one-line
refusals): the recorded run under the flags typed beside it, the required inputs, the config file
(--config, else the official one beside --base-checkpoint, else ours) with the `train:` settings given
as flags applied over it (each checked against its field's range), and the manifest values parsed into
specs; a setting named that this start would not read (--lora-rank without --train-scope lora,
--val-interval without --val-manifest) or that others override (--effective-batch-size against
--batch-size x --grad-accumulation) is refused (config/unread_settings.py). The run, the `hardware`
command and the web page read these parts; none parses them again.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Collection
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from indextts_train.config.run_inputs import TrainOptions, config_choice
from indextts_train.config.settings import Config, TrainConfig, load_config
from indextts_train.config.unread_settings import check_modes, check_start_settings
from indextts_train.data.sampling import ManifestSpec, parse_manifest_specs
from indextts_train.distributed import launched_processes
from indextts_train.errors import UserError
from indextts_train.files.bounded import check_file
from indextts_train.ui.run_record import recorded_options

# The inputs a run cannot do without; not required by the parser, so that --from-run can supply them.
REQUIRED_INPUTS = {"train_manifests": "--train-manifest", "output_dir": "--output-dir"}
INPUT_NAMES = frozenset(f.name for f in dataclasses.fields(TrainOptions))
SETTING_NAMES = frozenset(f.name for f in dataclasses.fields(TrainConfig))


@dataclass(frozen=True)
class RunSettings:
    """A start's inputs as given, and what they resolve to: the config with every `train:` setting in
    effect (`config.train`, mixed precision included), the manifests as specs, the paths as Paths."""

    inputs: TrainOptions  # as given: what run.yaml records
    config: Config  # a run settles the model family on its own copy (setup)
    train_manifests: tuple[ManifestSpec, ...]
    val_manifests: tuple[ManifestSpec, ...]
    output_dir: Path
    tokenizer: Path | None
    base_checkpoint: Path | None
    resume: str | None  # 'auto' or a checkpoint path
    on_vocab_change: str
    skip_bad_lines: bool
    accept_data_change: bool
    tensorboard: bool
    config_note: str | None = None  # which config was taken, when --config was not given
    named: frozenset[str] = frozenset()  # the train: settings this start names (a recorded run's and the config
    # file's are not named: they may hold every setting)


def _path(value: Any) -> Path | None:
    return None if value is None else Path(value)


def resolve_settings(*, typed: Collection[str] | None = None, **values: Any) -> RunSettings:
    """The settings of one start. `values`: TrainOptions' inputs and any `train:` setting by name (None:
    not given, the config decides); `typed`: the names given on the command line, which beat a recorded
    run's (None: every one in `values`)."""
    asked = set(values) if typed is None else set(typed)  # what this start names, not a recorded run
    from_run = values.get("from_run")
    values = _over_recorded_run(values, typed)
    if values.get("resume") is not None and not str(values["resume"]).strip():
        raise UserError("--resume is empty; pass auto (the newest checkpoint in --output-dir that verifies) or a "
                        "checkpoint's path, or leave --resume out for a new run")
    unknown = sorted(set(values) - INPUT_NAMES - SETTING_NAMES)
    if unknown:
        raise TypeError(f"train-gpt got unknown option(s) {', '.join(unknown)}")
    inputs = TrainOptions(**{name: value for name, value in values.items() if name in INPUT_NAMES})
    if inputs.resume is None:  # what a resume alone reads, typed for a new run, would change nothing
        for name, flag in (("on_vocab_change", "--on-vocab-change"), ("accept_data_change", "--accept-data-change")):
            if name in asked and values.get(name) not in (None, False, "keep"):
                raise UserError(f"{flag} is read when a run resumes, and this start has no --resume: the flag "
                                "would change nothing; add --resume auto, or leave it out")
    path, note = config_choice(inputs.config, inputs.base_checkpoint)
    if inputs.config is not None:  # a folder (the model folder for the config.yaml in it) said with its flag
        check_file(path, "config", flag="--config")
    config = load_config(path)
    try:
        config.override({name: value for name, value in values.items() if name in SETTING_NAMES and value is not None})
    except UserError as exc:  # a recorded value out of range: name the record, as its wrong types are
        raise _from_record(exc, from_run, asked) from None
    named = frozenset(name for name in asked & SETTING_NAMES if values.get(name) is not None)
    check_modes(config.train, named)
    train = parse_manifest_specs(inputs.train_manifests, "--train-manifest", weights=True)
    val = parse_manifest_specs(inputs.val_manifests or [], "--val-manifest", weights=False)
    # named but not read without validation data (--val-interval), or overridden (--effective-batch-size)
    check_start_settings(config.train, named, bool(val), launched_processes())
    return RunSettings(inputs, config, tuple(train), tuple(val), output_dir=Path(inputs.output_dir),
                       tokenizer=_path(inputs.tokenizer), base_checkpoint=_path(inputs.base_checkpoint),
                       resume=None if inputs.resume is None else str(inputs.resume),
                       on_vocab_change=inputs.on_vocab_change, skip_bad_lines=inputs.skip_bad_lines,
                       accept_data_change=inputs.accept_data_change, tensorboard=inputs.tensorboard,
                       config_note=note, named=named)


def _over_recorded_run(values: dict[str, Any], typed: Collection[str] | None) -> dict[str, Any]:
    """With --from-run, the recorded run's values under the ones given; then the required inputs."""
    from_run = values.pop("from_run", None)
    if from_run is not None:
        given = {name: value for name, value in values.items() if typed is None or name in typed}
        values = {**recorded_options(from_run), **given}
    for name, flag in REQUIRED_INPUTS.items():
        if not values.get(name):
            raise UserError(f"{flag} is required (or --from-run OUTPUT_DIR/run.yaml of an earlier run)")
    return values


def _from_record(exc: UserError, from_run: Any, asked: set[str]) -> UserError:
    """`exc` about a `train:` setting, said as the recorded run's when --from-run gave it and no flag did."""
    name = str(exc).partition("train.")[2].partition(" ")[0]
    if from_run is None or not str(exc).startswith("train.") or name in asked:
        return exc
    return UserError(f"--from-run {from_run}: config.{exc}; fix it or pass the flag beside --from-run")
