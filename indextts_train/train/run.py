"""A run in three parts, each with one kind of owner.

- `RunSpec`: what the run is, decided by setup and never reassigned (config, flags, hardware plan,
  schedule, device, processes, data, the model as the loop calls it). Frozen.
- `RunState`: what the run has done and what a checkpoint saves (weights, optimizer set, progress,
  history, data record, lineage, best tracker, the divergence guard's counters in progress) and the
  batch layout in effect, which an OOM halves (progress records it at each save).
- `Services`: what the run talks to (log and TensorBoard, the output folder's lock, the background
  saver, the listener); opened once setup has passed its checks.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
from torch import nn

from indextts_train.checkpoint.async_save import BackgroundSaver
from indextts_train.checkpoint.rng import ProcessRng
from indextts_train.checkpoint.state import DataRecord, History, Lineage, Progress, TrainingState
from indextts_train.config.scope_settings import scope_settings
from indextts_train.config.settings import Config, config_to_dict
from indextts_train.data.manifest import ManifestDataset
from indextts_train.data.sampling import SamplerSpec, epoch_order
from indextts_train.distributed import DistInfo, gather_to_main
from indextts_train.model.gpt import UnifiedVoiceGPT
from indextts_train.text.vocab import RowFreezer, family_freezer
from indextts_train.train.best import BestTracker
from indextts_train.train.guard import DivergenceGuard, SkippingDataset
from indextts_train.train.hardware import HardwarePlan
from indextts_train.train.listen_check import GenerationCheck
from indextts_train.train.listening import Listener
from indextts_train.train.loss_module import LossModule
from indextts_train.train.optim import OptimizerSet
from indextts_train.train.runlock import RunLock
from indextts_train.train.schedule import Schedule, Steps
from indextts_train.train.weights import Weights
from indextts_train.ui.console import RunLogger
from indextts_train.ui.run_settings import RunSettings

Autocast = Callable[[], contextlib.AbstractContextManager]


def autocast_for(plan: HardwarePlan, device: torch.device) -> Autocast:
    """A context factory: autocast in the plan's dtype (HardwarePlan.amp_dtype), or nothing in fp32."""
    if plan.amp_dtype is None:
        return contextlib.nullcontext
    dtype = getattr(torch, plan.amp_dtype)
    return lambda: torch.autocast(device_type=device.type, dtype=dtype)


@dataclass(frozen=True)
class Validation:
    """The validation data, grouped by language (validation.py), and what each validation is judged by
    (the best tracker, which changes, is in RunState)."""

    dataset: ManifestDataset
    groups: dict[str, np.ndarray]  # group -> line indices, manifest order
    limits: dict[str | None, float]  # --forgetting-limit, percent per group (None: every group)
    patience: int  # --early-stop-patience, 0 = off
    generation: GenerationCheck | None = None  # --listen-lines: codes generated at each validation


class EpochOrders:
    """The data order of an epoch (sampling.epoch_order of the run's sampler), computed once per epoch."""

    def __init__(self, sampler: SamplerSpec, lengths: np.ndarray) -> None:
        self.sampler, self.lengths = sampler, lengths
        self._cached: tuple[int, np.ndarray] | None = None

    def __call__(self, epoch: int) -> np.ndarray:
        if self._cached is None or self._cached[0] != epoch:
            self._cached = (epoch, epoch_order(self.sampler, self.lengths, epoch))
        return self._cached[1]


@dataclass(frozen=True)
class RunSpec:
    """What the run is: built by setup, read by the loop, never reassigned."""

    options: RunSettings
    config: Config
    dist: DistInfo
    device: torch.device
    plan: HardwarePlan  # as chosen at the start; the layout in effect is RunState.layout
    schedule: Schedule
    total_steps: int  # schedule.end_step at the start: the same at every step of the run
    steps_per_epoch: int  # at the run's effective batch
    dataset: ManifestDataset | SkippingDataset  # SkippingDataset under --skip-bad-lines
    orders: EpochOrders
    val: Validation | None
    wrapped: nn.Module  # the loss module, DDP-wrapped under torchrun
    freezer: RowFreezer
    protected: frozenset[str] = frozenset()  # names in output_dir this run never replaces or deletes

    @property
    def output_dir(self) -> Path:
        return self.options.output_dir

    @property
    def epoch_samples(self) -> int:
        """The samples an epoch trains at the run's effective batch: the order's epoch without its tail short of
        a step (fewer than the order holds after a resume at another batch)."""
        return self.steps_per_epoch * self.plan.effective_batch

    @property
    def autocast(self) -> Autocast:
        return autocast_for(self.plan, self.device)


@dataclass
class RunState:
    """What the run has done: the parts a checkpoint saves, and where its files are."""

    weights: Weights
    optim: OptimizerSet
    progress: Progress
    history: History
    layout: HardwarePlan  # the batch layout in effect: the plan, its micro-batch halved by each OOM
    guard: DivergenceGuard
    data: DataRecord = field(default_factory=DataRecord)
    lineage: Lineage = field(default_factory=Lineage)  # the branch this run's checkpoints belong to
    best: BestTracker | None = None  # best.pth and the early-stop count (with --val-manifest)
    new_branch: bool = False  # set the abandoned branch's files aside before the first save (lineage.py)
    last_saved: Path | None = None  # the newest checkpoint of this run on disk, and its step
    last_saved_step: int = -1

    @property
    def model(self) -> UnifiedVoiceGPT:
        return self.weights.model


def build_spec(options: RunSettings, dist: DistInfo, config: Config, device: torch.device, schedule: Schedule,
               steps: Steps, dataset: ManifestDataset, val: Validation | None, state: RunState,
               protected: frozenset[str], log: RunLogger) -> RunSpec:
    """The frozen run: the model as the loop calls it (its frozen rows, DDP under torchrun) and its data
    (`dataset`: the training samples as the model reads them, run_data.RunData.datasets).

    Before the first step, a new run's schedule that cannot learn is said, with the flags to pass, and so
    is a --max-steps the epochs end the run before."""
    weights, train, index = state.weights, config.train, dataset.index
    orders = EpochOrders(schedule.sampler, index.total_lengths)
    log.info(weights.vocab_plan.describe())
    log.info(f"train scope: {scope_settings(train).describe()}; "
             f"{sum(p.numel() for _, p in weights.trainable):,} trainable parameters")
    freezer = family_freezer(weights.model, weights.vocab_plan, config.gpt, train, index.lang_ids, log.info)
    wrapped = LossModule(weights.model, weights.adapters)
    if dist.enabled:
        wrapped = nn.parallel.DistributedDataParallel(
            wrapped, device_ids=[device.index] if device.type == "cuda" else None)
    if steps.warning:
        log.warn(steps.warning)
    if steps.cap_note:
        log.warn(steps.cap_note)
    return RunSpec(options, config, dist, device, state.layout, schedule, steps.total, steps.per_epoch,
                   SkippingDataset(dataset) if options.skip_bad_lines else dataset, orders, val, wrapped, freezer,
                   protected)


@dataclass(frozen=True)
class Services:
    """What the run talks to; none of it is saved."""

    log: RunLogger
    lock: RunLock | None = None  # rank 0's hold on the output dir
    saver: BackgroundSaver | None = None  # --async-save: the thread that writes checkpoints
    listener: Listener | None = None  # --listen-every: the child processes that hear checkpoints


def settings_in_effect(config: Config, total_steps: int, layout: HardwarePlan) -> dict:
    """The settings in effect: every `train:` field plus the batch layout and precision."""
    return {**config_to_dict(config)["train"], "total_steps": total_steps,
            "effective_batch": layout.effective_batch, "micro_batch": layout.micro_batch,
            "grad_accumulation": layout.grad_accumulation, "world_size": layout.world_size,
            "precision": layout.precision}


def training_state(run: RunSpec, state: RunState) -> TrainingState:
    """The run's saveable parts, gathered (checkpoint/state.py writes the one dict)."""
    if state.best is not None:
        state.history.best = state.best.state_dict()
    progress, layout = state.progress, state.layout
    progress.micro_batch, progress.grad_accumulation = layout.micro_batch, layout.grad_accumulation
    progress.world_size = layout.world_size
    weights = state.weights
    return TrainingState(
        weights=weights, optimizer_set=state.optim, progress=progress, history=state.history, data=state.data,
        info={"hparams": settings_in_effect(run.config, run.total_steps, layout), "config": config_to_dict(run.config),
              "vocab_plan": weights.vocab_plan.to_dict(), "hardware": layout.to_dict(),
              "sampler": run.schedule.sampler.state_dict(), "lora": weights.adapter_record(),
              "created": time.strftime("%Y-%m-%dT%H:%M:%S%z")}, lineage=state.lineage)


def checkpoint_state(run: RunSpec, state: RunState) -> dict | None:
    """The checkpoint dict on rank 0; other ranks send their RNG state and get None."""
    gathered = training_state(run, state)
    rng = gather_to_main(ProcessRng().state_dict(), run.dist)
    return gathered.state_dict(rng) if run.dist.is_main else None
