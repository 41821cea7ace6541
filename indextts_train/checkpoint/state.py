"""The training state: one owner of the checkpoint format.

Every part of a run that an exact resume needs gives its own `state_dict()` / `load_state_dict()`
(progress, history, each rank's RNG here; model weights, optimizer set and vocab plan where they live), and
`TrainingState` gathers them into the one plain dict that checkpoint/files.py stores. This module is the
only place that knows the layout:

- `validate(state)`: what keeps a checkpoint from an exact resume (empty list: COMPLETE);
- `migrate(state)`: the chain that brings an older `format_version` up to `FORMAT_VERSION`, so a
  file any earlier version wrote still resumes, verifies, repairs and exports;
- `Progress`, `History` and `DataRecord` are dataclasses: a new field with a default is one edit
  here (its value for older files is the default, unless a migration step says otherwise); a new
  part all of whose fields are `added_field`s (DataRecord) is created for older files the same way.

Layout (a plain dict, loadable with torch.load(weights_only=True)):
    format, format_version, model {key: float32 Tensor} (full official gpt.pth layout),
    optimizer (AdamW state_dict), optimizer_param_names (param names in optimizer order),
    scheduler (LambdaLR state_dict), scaler (GradScaler state_dict or None),
    progress (Progress), rng [one capture_rng() dict per rank], history (History), data (DataRecord:
    the training data's fingerprint and the samples --skip-bad-lines left out; created empty for
    files older than it), lineage (Lineage: the branch and its parent; created empty for older files),
    hparams, config, vocab_plan, hardware, created, sampler
    (sampling.SamplerSpec: the data order rule and mix; absent in files from before order rules,
    which resume with rule 1), lora (the adapters and their settings of a --train-scope lora run, else
    None or absent), and after a repair: repaired.
A repaired checkpoint whose optimizer could not be matched to the weights holds None for
optimizer, scheduler and scaler together (one matched set, reset together) and lists them in
`repaired["unknown"]`; the trainer then starts a fresh optimizer at the stored step.
"""

from __future__ import annotations

import dataclasses
import re
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

import torch

from indextts_train.checkpoint.rng import rng_problem
from indextts_train.config.schema import field_types, is_int, type_problem
from indextts_train.data.sampling import sampler_problem
from indextts_train.model.lora import record_problem
from indextts_train.text.vocab import VocabPlan

FORMAT = "indextts-train-checkpoint"
FORMAT_VERSION = 2
OPTIMIZER_SET = ("optimizer", "scheduler", "scaler")


# ----------------------------------------------------------------------------- components


def added_field(default: Any = dataclasses.MISSING, *, factory: Any = dataclasses.MISSING) -> Any:
    """A component field newer than some files: `migrate` fills in `default` where a file lacks it.

    Adding such a field (say `bad_steps: int = added_field(0)` in Progress) is the whole edit: saved by
    `state_dict`, type-checked by `validate`, filled for older files. Fields whose value for older
    files is not the default need a migration step instead (see `_v1_to_v2`). Mutable defaults
    (lists, dicts) come from `factory`.
    """
    return field(default=default, default_factory=factory, metadata={"filled_when_missing": True})


class Component:
    """A dataclass part of a checkpoint: its state is its fields, as plain values."""

    def state_dict(self) -> dict:
        return dataclasses.asdict(self)

    def load_state_dict(self, state: dict) -> None:
        for f in dataclasses.fields(self):
            setattr(self, f.name, state[f.name])


@dataclass
class Progress(Component):
    """Where the run is. `samples_in_epoch` is global (all ranks) and counts consumed samples."""

    step: int = 0
    epoch: int = 0  # the 0-based epoch in progress
    samples_in_epoch: int = 0
    samples_total: int = 0
    sampler_seed: int = 0
    micro_batch: int = 0
    grad_accumulation: int = 0
    world_size: int = 1
    # The divergence guard (guard.py): skipped non-finite steps, in all and in a row, and where the
    # current streak began. A resume needs them to stop at exactly the same step.
    bad_steps: int = added_field(0)
    bad_streak: int = added_field(0)
    bad_streak_start: int = added_field(0)
    # 1 while a periodic save waits for the end of a streak of skipped steps (saving.save_when_due).
    save_pending: int = added_field(0)

    @staticmethod
    def problems(state: Any) -> list[str]:
        if not isinstance(state, dict):
            return ["progress: expected a dict"]
        bad = [k for k in field_types(Progress) if not (is_int(state.get(k)) and state[k] >= 0)]
        return [f"progress: {', '.join(bad)} missing or not a non-negative int"] if bad else []


@dataclass
class History(Component):
    """Logged losses and the best validation so far; carried across resumes."""

    train: list = field(default_factory=list)  # [step, loss, text_loss, mel_loss, mel_top1, lr]
    val: list = field(default_factory=list)  # [step, loss, text_loss, mel_loss, mel_top1]
    best_val_loss: float | None = None
    best_val_step: int | None = None  # the step of best_val_loss (format 2)
    val_groups: list = added_field(factory=list)  # [{"step", "groups": {name: losses}}] with 2+ val groups
    baseline: dict | None = added_field(None)  # validation of the model before step 1: {"total", "groups"}
    last_val: dict | None = added_field(None)  # the latest validation, {"step", "total", "groups"}
    best: dict | None = added_field(None)  # BestTracker.state_dict(): the step best.pth holds, patience
    # The generation check of each validation (--listen-lines): [{"step", "total", "groups"}]
    generation: list = added_field(factory=list)
    # Metrics of the steps since the last logged line ([loss, text, mel, top1, grad_norm] each): a
    # resume averages the next line over the same steps as an uninterrupted run.
    pending: list = added_field(factory=list)

    def record_train(self, step: int, values: dict) -> None:
        self.train.append([step, values["loss"], values["text_loss"], values["mel_loss"], values["mel_top1"],
                           values["lr"]])

    def record_val(self, step: int, result: dict) -> None:
        self.val.append([step, result["loss"], result["text_loss"], result["mel_loss"], result["mel_top1"]])
        if self.best_val_loss is None or result["loss"] < self.best_val_loss:
            self.best_val_loss, self.best_val_step = result["loss"], step

    def record_validation(self, step: int, result: dict) -> None:
        """A validation's result: the total as a `val` row, groups (if any) and the losses as last_val,
        the generation check (if any) in `generation`."""
        self.record_val(step, result["total"])
        if result["groups"]:
            self.val_groups.append({"step": step, "groups": result["groups"]})
        self.last_val = {"step": step, **self._without_generation(step, result)}

    def record_baseline(self, result: dict) -> None:
        """The validation of the model before step 1 (its generation check, if any, as step 0's)."""
        self.baseline = self._without_generation(0, result)

    def _without_generation(self, step: int, result: dict) -> dict:
        """The result less its generation check, which joins `generation` under `step`."""
        if "generation" in result:
            self.generation.append({"step": step, **result["generation"]})
        return {k: v for k, v in result.items() if k != "generation"}

    @staticmethod
    def problems(state: Any) -> list[str]:
        if not isinstance(state, dict):
            return ["history: expected a dict"]
        types = field_types(History)
        missing = [k for k in types if k not in state]
        if missing:
            return [f"history: missing {', '.join(missing)}"]
        return [f"history.{k}: {p}" for k, t in types.items() if (p := type_problem(state[k], t))]


@dataclass
class DataRecord(Component):
    """What the run knows about its training data: the fingerprint of the index it trains on
    (fingerprint.py; None in files written before fingerprints existed) and the samples that
    --skip-bad-lines left out at load time (how many loads, and the first few lines with why)."""

    fingerprint: dict | None = added_field(None)
    skipped_loads: int = added_field(0)
    skipped_lines: list = added_field(factory=list)

    def add_skipped(self, reasons: list[str], listed: int = 200) -> None:
        for reason in reasons:
            self.skipped_loads += 1
            if reason not in self.skipped_lines and len(self.skipped_lines) < listed:
                self.skipped_lines.append(reason)

    def skipped_summary(self) -> list[str]:
        if not self.skipped_loads:
            return []
        return [f"skipped {self.skipped_loads} sample load(s) of {len(self.skipped_lines)} bad line(s) "
                "(--skip-bad-lines):", *(f"  {line}" for line in self.skipped_lines)]

    @staticmethod
    def problems(state: Any) -> list[str]:
        if not isinstance(state, dict):
            return ["data: expected a dict"]
        types = field_types(DataRecord)
        return [f"data.{k}: {p}" for k, t in types.items() if (p := type_problem(state.get(k), t))]


BRANCH_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,99}")


def is_branch_name(name: Any) -> bool:
    """Whether `name` can be a branch (and so a folder name): no separators, no '..', not absolute."""
    return isinstance(name, str) and BRANCH_NAME.fullmatch(name) is not None and ".." not in name


@dataclass
class Lineage(Component):
    """Which branch of the run a checkpoint belongs to (lineage.py decides when a branch is born).

    A branch is born when a run starts (from scratch or a base), on an explicit `--resume PATH` to a
    step other than the newest, and on `--on-vocab-change reset`. `forks` lists the (branch, step)
    points whose earlier steps this branch continues, oldest first; a reset run continues none.
    Files written before lineage get branch None and born 0 (one old branch, older than any other).
    """

    branch: str | None = added_field(None)
    parent: str | None = added_field(None)
    parent_step: int | None = added_field(None)
    born: int = added_field(0)  # time.time_ns() of the branch's birth: --resume auto takes the newest
    forks: list = added_field(factory=list)  # [[branch, step], ...]

    @staticmethod
    def problems(state: Any) -> list[str]:
        if not isinstance(state, dict):
            return ["lineage: expected a dict"]
        types = field_types(Lineage)
        problems = [f"lineage.{k}: {p}" for k, t in types.items() if (p := type_problem(state.get(k), t))]
        forks = state.get("forks")
        if not problems and not all(isinstance(f, list) and len(f) == 2 and is_int(f[1]) for f in forks):
            problems.append("lineage.forks: expected [branch, step] pairs")
        if not problems:  # a branch names a folder (abandoned/<branch>/): a value read from a file is data
            names = [state["branch"], state["parent"], *(f[0] for f in forks)]
            odd = next((n for n in names if n is not None and not is_branch_name(n)), None)
            if odd is not None:
                problems.append(f"lineage: branch name {str(odd)[:60]!r} is not a plain name "
                                "(letters, digits, '.', '_', '-')")
        return problems


# ----------------------------------------------------------------------------- validation


def unsafe_value(obj: Any, where: str) -> str | None:
    """Where `obj` holds something torch.load(weights_only=True) would refuse, or None."""
    if isinstance(obj, torch.Tensor):
        return None if type(obj) in (torch.Tensor, torch.nn.Parameter) else f"{where} is a {type(obj).__name__}"
    if isinstance(obj, (torch.Size, torch.dtype, torch.device)):
        return None
    if type(obj) in (dict, OrderedDict):
        for key, value in obj.items():
            if type(key) not in (str, int):
                return f"{where} has a key of type {type(key).__name__}"
            found = unsafe_value(value, f"{where}[{key!r}]")
            if found:
                return found
        return None
    if type(obj) in (list, tuple):
        for i, value in enumerate(obj):
            found = unsafe_value(value, f"{where}[{i}]")
            if found:
                return found
        return None
    # Exact types: numpy scalars subclass float/int but are pickled as numpy objects.
    if type(obj) in (str, int, float, bool, type(None)):
        return None
    return f"{where} is a {type(obj).__module__}.{type(obj).__name__}"


def model_problem(model: Any) -> str | None:
    if not isinstance(model, dict) or not model:
        return "model: expected a non-empty dict of tensors"
    bad = [k for k, v in model.items() if not isinstance(k, str) or not isinstance(v, torch.Tensor)]
    return f"model: {bad[0]!r} is not a named tensor" if bad else None


def _first_nonfinite(tensors: Any, where: str) -> str | None:
    """`where[key]` of the first floating tensor in a nested dict/list holding NaN or Inf, or None."""
    if isinstance(tensors, torch.Tensor):
        # A NaN or Inf anywhere makes the sum NaN or Inf, so a finite sum proves the tensor finite
        # with one reduction and no bool copy (saves check every tensor of a multi-GB state); only
        # a non-finite sum, which an overflow can also give, needs the element-wise check.
        finite = (not tensors.is_floating_point() or bool(torch.isfinite(tensors.sum()))
                  or bool(torch.isfinite(tensors).all()))
        return None if finite else where
    if isinstance(tensors, dict):
        items = tensors.items()
    else:
        items = enumerate(tensors) if isinstance(tensors, (list, tuple)) else ()
    for key, value in items:
        found = _first_nonfinite(value, f"{where}[{key!r}]")
        if found:
            return found
    return None


def nonfinite_problem(model: Any, optimizer: Any) -> str | None:
    """Why the weights or optimizer moments of a checkpoint are unusable (a NaN or Inf tensor), or None.

    Such a file comes from a run that diverged; resuming or exporting it would spread the NaN.
    """
    found = _first_nonfinite(model, "model") if isinstance(model, dict) else None
    if found is None and isinstance(optimizer, dict):
        found = _first_nonfinite(optimizer.get("state"), "optimizer.state")
    if found is None:
        return None
    return (f"{found} holds NaN or Inf values: the run had diverged when this was written; use an earlier "
            "checkpoint (and a lower --learning-rate)")


def optimizer_params(optimizer: dict) -> list:
    """The parameter ids of an optimizer state_dict, in optimizer order (groups flattened)."""
    return [p for group in optimizer["param_groups"] for p in group["params"]]


def repaired_unknown(state: dict) -> list:
    """What a repair marked as not known (empty for a checkpoint the trainer wrote)."""
    repaired = state.get("repaired")
    unknown = repaired.get("unknown") if isinstance(repaired, dict) else None
    return unknown if isinstance(unknown, list) else []


def optimizer_problems(state: dict) -> list[str]:
    """What is wrong with the optimizer set (optimizer, names, scheduler, scaler); empty when usable."""
    optimizer, names = state["optimizer"], state["optimizer_param_names"]
    if "optimizer" in repaired_unknown(state):
        if any(state[k] is not None for k in OPTIMIZER_SET) or names != []:
            return ["optimizer, scheduler and scaler are marked reset by repair but are not all None"]
        return []
    problems = []
    if not (isinstance(optimizer, dict) and isinstance(optimizer.get("state"), dict)
            and isinstance(optimizer.get("param_groups"), list)
            and all(isinstance(g, dict) and isinstance(g.get("params"), list) for g in optimizer["param_groups"])):
        problems.append("optimizer: expected an optimizer state_dict with 'state' and 'param_groups'")
    elif not (isinstance(names, list) and all(isinstance(n, str) for n in names)):
        problems.append("optimizer_param_names: expected a list of parameter names")
    elif len(names) != len(optimizer_params(optimizer)):
        problems.append(f"optimizer_param_names has {len(names)} names but the optimizer holds "
                        f"{len(optimizer_params(optimizer))} parameters")
    elif isinstance(state["model"], dict) and set(names) - set(state["model"]) - _adapter_names(state):
        stray = sorted(set(names) - set(state["model"]) - _adapter_names(state))
        problems.append(f"optimizer_param_names: {stray[0]!r} is not in model")
    if not isinstance(state["scheduler"], dict):
        problems.append("scheduler: expected a scheduler state_dict")
    if state["scaler"] is not None and not isinstance(state["scaler"], dict):
        problems.append("scaler: expected a GradScaler state_dict or None")
    return problems


def _adapter_names(state: dict) -> set[str]:
    record = state.get("lora")
    adapters = record.get("adapters") if isinstance(record, dict) else None
    return set(adapters) if isinstance(adapters, dict) else set()


def lora_problems(state: dict) -> list[str]:
    """`lora` (optional key): the adapters of a --train-scope lora run, and only of one."""
    config = state["config"] if isinstance(state["config"], dict) else {}
    train, gpt = config.get("train") or {}, config.get("gpt") or {}
    lora_run = isinstance(train, dict) and train.get("train_scope") == "lora"
    record = state.get("lora")
    if not lora_run:
        return [] if record is None else ["lora: adapters stored, but config.train.train_scope is not lora"]
    if record is None:
        return ["lora: missing; a --train-scope lora checkpoint needs its adapters"]
    problem = record_problem(record, gpt.get("layers") if isinstance(gpt, dict) else None)
    return [problem] if problem else []


def _rng_problems(state: dict) -> list[str]:
    rng = state["rng"]
    if not isinstance(rng, list) or not rng:
        return ["rng: expected a non-empty list with one RNG state per rank"]
    problems = [f"rng[{i}]: {p}" for i, p in enumerate(map(rng_problem, rng)) if p]
    if len(rng) != state["progress"]["world_size"]:
        problems.append(f"rng has {len(rng)} rank states but progress.world_size is {state['progress']['world_size']}")
    return problems


# Every top-level key an exact resume needs; `hardware`, `created` and `repaired` are informative.
REQUIRED_KEYS = ("format", "format_version", "model", "optimizer", "optimizer_param_names", "scheduler", "scaler",
                 "progress", "rng", "history", "hparams", "config", "vocab_plan")


def validate(state: dict) -> list[str]:
    """What keeps a (migrated) checkpoint of our format from an exact resume; empty when COMPLETE."""
    missing = [k for k in REQUIRED_KEYS if k not in state]
    if missing:
        return [f"missing {', '.join(missing)} (needed for an exact resume)"]
    version = state["format_version"]
    if version != FORMAT_VERSION:
        return [f"format_version {version!r} is not {FORMAT_VERSION}; this indextts-train reads versions "
                f"1 to {FORMAT_VERSION} (a newer file needs a newer indextts-train)"]
    model = state["model"]
    problems = [p for p in (model_problem(model),) if p] + History.problems(state["history"])
    if not model_problem(model):
        not_fp32 = [k for k, v in model.items() if v.is_floating_point() and v.dtype != torch.float32]
        if not_fp32:
            problems.append(f"model: {not_fp32[0]!r} is {model[not_fp32[0]].dtype}; "
                            "an exact resume needs float32 weights")
    problems += optimizer_problems(state) + lora_problems(state)
    progress = Progress.problems(state["progress"])
    problems += progress or _rng_problems(state)
    problems += DataRecord.problems(state.get("data")) + Lineage.problems(state.get("lineage"))
    problems += [f"{k}: expected a dict" for k in ("hparams", "config", "vocab_plan") if not isinstance(state[k], dict)]
    if "sampler" in state:  # the data order record; files from before order rules have none (rule 1)
        problems += [p for p in (sampler_problem(state["sampler"]),) if p]
    return problems


# ----------------------------------------------------------------------------- the whole


class Stateful(Protocol):
    """A part of a run that saves and loads itself: `load_state_dict(state_dict())` gives it back."""

    def state_dict(self) -> dict: ...

    def load_state_dict(self, state: dict) -> None: ...


@dataclass
class TrainingState:
    """A live run's parts, gathered into the one checkpoint dict this module defines.

    `weights` gives the official-layout `model`; `optimizer_set` its four matched keys (optimizer,
    optimizer_param_names, scheduler, scaler); `info` what the run was (hparams, config, vocab_plan,
    hardware, created), stored for resume checks and humans. Reading back is the reverse: the checkpoint
    manager (manager.py) splits a file into its typed parts (resumed.py), which each part loads with `load_state_dict`.
    """

    weights: Stateful
    optimizer_set: Stateful
    progress: Progress
    history: History
    data: DataRecord
    info: dict[str, Any]
    lineage: Lineage = field(default_factory=Lineage)

    def state_dict(self, rng: list[dict]) -> dict:
        """`rng`: one capture_rng() per rank, gathered on rank 0."""
        return {"format": FORMAT, "format_version": FORMAT_VERSION, "model": self.weights.state_dict(),
                **self.optimizer_set.state_dict(), "progress": self.progress.state_dict(), "rng": rng,
                "history": self.history.state_dict(), "data": self.data.state_dict(),
                "lineage": self.lineage.state_dict(), **self.info}


# ----------------------------------------------------------------------------- migrations


def _v1_to_v2(state: dict) -> None:
    """Format 2 records the step of the best validation loss (the best checkpoint needs it)."""
    history = state.get("history")
    if isinstance(history, dict) and isinstance(history.get("val"), list) and "best_val_step" not in history:
        rows = [row for row in history["val"] if isinstance(row, list) and len(row) > 1]
        best = min(rows, key=lambda row: row[1]) if rows else None
        history["best_val_step"] = best[0] if best is not None else None


# format_version N -> N + 1, applied in order; each edits the dict in place.
MIGRATIONS: dict[int, Callable[[dict], None]] = {1: _v1_to_v2}


# Dataclass parts of a checkpoint. A part all of whose fields are `added_field`s is created for files
# older than it (DataRecord), so the whole part is one edit too.
COMPONENTS: dict[str, type] = {"progress": Progress, "history": History, "vocab_plan": VocabPlan, "data": DataRecord,
                               "lineage": Lineage}


def _fill_added_fields(state: dict) -> None:
    for key, cls in COMPONENTS.items():
        part = state.get(key)
        if part is None and all(f.metadata.get("filled_when_missing") for f in dataclasses.fields(cls)):
            part = state[key] = {}
        if isinstance(part, dict):
            for f in dataclasses.fields(cls):
                if f.metadata.get("filled_when_missing") and f.name not in part:
                    part[f.name] = f.default if f.default is not dataclasses.MISSING else f.default_factory()


def migrate(state: dict) -> dict:
    """Bring a checkpoint dict of an older format_version up to FORMAT_VERSION (in place; returned).

    A newer or unknown version is left as it is: `validate` then says a newer indextts-train is needed.
    """
    version = state.get("format_version")
    while is_int(version) and version < FORMAT_VERSION and version in MIGRATIONS:
        MIGRATIONS[version](state)
        version += 1
        state["format_version"] = version
    _fill_added_fields(state)
    return state
