"""Settings a run would not read, typed all the same: a refusal each, before any work.

A `train:` field says under which other setting it is read (`needs`: --lora-rank under --train-scope lora,
--listen-device under --listen-every) and which model family's capability it needs (`family_needs`:
--train-speaker-proj a speaker vector, --borrow-language language rows). Typed without it, the flag would
change nothing and the run would not be the one meant (`--lora-rank 8` alone trained the whole model). The
same for what only validations read (--val-interval, --listen-lines) in a start without --val-manifest, and
for --effective-batch-size under a micro-batch and an accumulation that make another batch. Only what a
start names is judged: a config file or a recorded run may keep every setting.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable

from indextts_train.config.family import FAMILIES, Family
from indextts_train.config.schema import field_default
from indextts_train.config.settings import TrainConfig
from indextts_train.errors import UserError

_TRAIN_FIELDS = {f.name: f for f in dataclasses.fields(TrainConfig)}


def _flag(name: str) -> str:
    """The flag of a `train:` setting, as typed (its field's own name for it, else the name with dashes)."""
    return (_TRAIN_FIELDS[name].metadata.get("flag") or f"--{name.replace('_', '-')}").split("/")[0]


def setting_unread(train: TrainConfig, name: str) -> str | None:
    """Why the `train:` setting `name` is not read by a run of these settings (its field's `needs`), as the
    refusal of a flag typed for it; None when it is read."""
    needs = _TRAIN_FIELDS[name].metadata.get("needs")
    if needs is None:
        return None
    key, wanted = needs
    have = getattr(train, key)
    if have == wanted or (wanted is None and have):
        return None
    flag, other = _flag(name), _flag(key)
    under = f"{other} {wanted}" if wanted is not None else f"{other} K (K > 0)"
    return (f"{flag} is read under {under} only, and this run has {other} {have}: the flag would change nothing; "
            f"add {under}, or leave {flag} out")


def setting_of_other_family(train: TrainConfig, family: Family, name: str, source: str) -> str | None:
    """Why the `train:` setting `name` is not read for a model of `family` (its field's `family_needs`), as
    the refusal of a flag typed for it; `source` says where the family came from. None when it is read, or
    holds its default (what a model without it does anyway: `--freeze-speaker-proj`)."""
    needs = _TRAIN_FIELDS[name].metadata.get("family_needs")
    if needs is None or getattr(family, needs) or getattr(train, name) == field_default(_TRAIN_FIELDS[name]):
        return None
    meant = " or ".join(f.name for f in FAMILIES if getattr(f, needs))
    return f"{_flag(name)} is for an {meant} model, and this run's is {family.name} ({source}): leave {_flag(name)} out"


def _refuse_first(reasons: Iterable[str | None]) -> None:
    problem = next((why for why in reasons if why is not None), None)
    if problem is not None:
        raise UserError(problem)


def check_modes(train: TrainConfig, named: frozenset[str]) -> None:
    """A setting named for a mode the run is not in (--lora-rank without --train-scope lora, --listen-device
    without --listen-every) is refused: it would change nothing, and the run would not be the one meant.
    `named`: what this start names (a recorded run or the config file may hold every setting)."""
    _refuse_first(setting_unread(train, name) for name in sorted(named))


def check_family_settings(train: TrainConfig, named: frozenset[str], family: Family | None, source: str) -> None:
    """A setting typed for the other family's model (--train-speaker-proj, --borrow-language for IndexTTS2) is
    one line: it would change nothing. Unchecked while the family is not known yet (a resume whose config states
    none: its checkpoint settles it)."""
    if family is not None:
        _refuse_first(setting_of_other_family(train, family, name, source) for name in sorted(named))


# Read at validations only: without a validation manifest there is none (`--early-stop-patience` and
# `--forgetting-limit`, which would judge them, are refused from any source: train/run_data.py).
VALIDATION_SETTINGS = ("val_interval", "listen_lines")


def validation_unread(named: frozenset[str], has_validation: bool) -> str | None:
    """Why a setting named for validations is not read by a start without --val-manifest, as its refusal;
    None when there is validation data, or none is named."""
    typed = [name for name in VALIDATION_SETTINGS if name in named]
    if has_validation or not typed:
        return None
    flag = _flag(typed[0])
    return (f"{flag} is read at validations only, and this start has no --val-manifest: the flag would change "
            f"nothing; add --val-manifest PATH (prepare writes val.jsonl), or leave {flag} out")


def batch_unread(train: TrainConfig, named: frozenset[str], world_size: int) -> str | None:
    """Why --effective-batch-size, named, is not what the run would train with: the micro-batch and the
    accumulation both in effect (typed, or the config's) set the batch themselves, and theirs differs (the
    planner takes them as given: train/hardware.py). None when it agrees, or either is 0 (auto)."""
    micro, accum, asked = train.batch_size, train.grad_accumulation, train.effective_batch_size
    made = micro * accum * world_size
    if "effective_batch_size" not in named or not (micro and accum) or made == asked:
        return None
    source = {name: _flag(name) if name in named else f"train.{name}" for name in ("batch_size", "grad_accumulation")}
    return (f"--effective-batch-size {asked} does not match {source['batch_size']} {micro} x "
            f"{source['grad_accumulation']} {accum} x {world_size} process(es) = {made}, the batch the run would "
            f"train with: set --effective-batch-size {made}, or leave one of --batch-size and --grad-accumulation at 0 "
            f"(auto), and it is chosen to reach {asked}")


def check_start_settings(train: TrainConfig, named: frozenset[str], has_validation: bool, world_size: int) -> None:
    """A setting named that this start would not read (validation settings without validation data) or that
    the others override (--effective-batch-size under a micro-batch and an accumulation) is one line."""
    _refuse_first((validation_unread(named, has_validation), batch_unread(train, named, world_size)))
