"""Resuming: how a checkpoint's saved state (checkpoint/manager.py chose and typed it) meets this run.

What changed since it was written (settings, an OOM-reduced micro-batch, the number of ranks, the
data), the data order it keeps, and each rank's RNG stream; the parts of the state load themselves
(restore.py applies them).
"""

from __future__ import annotations

import dataclasses
import random

import numpy as np
import torch

from indextts_train.checkpoint.resumed import Resumed
from indextts_train.checkpoint.rng import ProcessRng
from indextts_train.config.settings import Config, TrainConfig
from indextts_train.data.fingerprint import check_same_data
from indextts_train.data.manifest import ManifestIndex
from indextts_train.data.sampling import (
    ManifestSpec,
    SamplerSpec,
    describe_epoch,
    epoch_length,
    legacy_spec,
    mix_change,
    sampler_spec,
)
from indextts_train.distributed import DistInfo
from indextts_train.errors import UserError
from indextts_train.train.hardware import HardwarePlan
from indextts_train.ui.console import RunLogger
from indextts_train.ui.run_settings import RunSettings


def checked_plan(resumed: Resumed | None, plan: HardwarePlan, config: Config, log: RunLogger) -> HardwarePlan:
    """The resumed run's OOM-reduced micro-batch is kept; a change of arithmetic said. (Its scope, which
    must be today's, is checked before: model/scope.check_resume_fits.)"""
    if resumed is None:
        return plan
    if config.train.batch_size == 0:
        plan = remembered_oom_plan(plan, resumed.hardware, log)
    note_changed_arithmetic(plan, resumed.hardware, log)
    return plan


def remembered_oom_plan(plan: HardwarePlan, saved: dict, log: RunLogger) -> HardwarePlan:
    """Start at the micro-batch an earlier run on this GPU fell back to after an OOM, not above it."""
    same_setup = (saved.get("device_name") == plan.device_name and saved.get("world_size") == plan.world_size
                  and saved.get("effective_batch") == plan.effective_batch)
    hit_oom = any(reason.startswith("Out of memory") for reason in saved.get("reasons", []))
    if not (same_setup and hit_oom and saved["micro_batch"] < plan.micro_batch):
        return plan
    log.info(f"an earlier run on this {plan.device_name} ran out of memory above micro-batch "
             f"{saved['micro_batch']}: starting at micro-batch {saved['micro_batch']} x accumulation "
             f"{saved['grad_accumulation']}")
    return dataclasses.replace(plan, micro_batch=saved["micro_batch"], grad_accumulation=saved["grad_accumulation"],
                               reasons=[*plan.reasons, *(r for r in saved["reasons"] if r.startswith("Out of memory"))])


# What decides the floating-point rounding of a step besides the data and the weights.
ARITHMETIC = (("device_name", "device"), ("precision", "precision"), ("tf32", "TF32"), ("world_size", "processes"),
              ("micro_batch", "micro-batch"), ("grad_accumulation", "accumulation"))


def note_changed_arithmetic(plan: HardwarePlan, saved: dict, log: RunLogger) -> None:
    """Say so when the run resumes on a setup that rounds differently from the one that saved it.

    The run goes on from the same sample with the same effective batch, but "exactly as if it had
    never stopped" is bit for bit only on the same device, precision, batch split and, on the CPU,
    the same thread count (another count sums in another order).
    """
    changes = [f"{label} {saved[key]} -> {getattr(plan, key)}" for key, label in ARITHMETIC
               if key in saved and saved[key] != getattr(plan, key)]
    if plan.device == "cpu" and saved.get("device") == "cpu" and saved.get("cpu_threads") \
            and saved["cpu_threads"] != plan.cpu_threads:
        changes.append(f"torch threads {saved['cpu_threads']} -> {plan.cpu_threads}")
    if changes:  # the effective batch is the same only when the processes and the split still multiply to it
        same = saved.get("effective_batch") in (None, plan.effective_batch)
        batch = "with the same effective batch" if same else (f"with an effective batch of {plan.effective_batch} "
                                                              f"(it was {saved['effective_batch']})")
        log.warn(f"resuming on another setup ({', '.join(changes)}): training continues from the same sample "
                 f"{batch}, but rounds differently, so the weights will not match bit for bit a run that never "
                 "stopped" + (" (they follow the same course)" if same else ""))


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def restore_rng_for_rank(rng: list[dict] | None, step: int, dist_info: DistInfo, seed: int, log: RunLogger) -> None:
    """Each rank continues its own saved RNG stream (`rng`, resumed at `step`); a rank the checkpoint did
    not have starts a new one. None: a fresh run, seeded."""
    if rng is None:
        seed_everything(seed + dist_info.rank)
        return
    if dist_info.rank < len(rng):
        ProcessRng().load_state_dict(rng[dist_info.rank])
    else:
        seed_everything(seed + dist_info.rank + 7919 * step)
    if len(rng) != dist_info.world_size:
        log.warn(f"the checkpoint was written by {len(rng)} process(es), this run has {dist_info.world_size}: "
                 "training continues from the same global sample (the plan says the effective batch); "
                 "dropout streams of new ranks are freshly seeded")


def check_data(resumed: Resumed, fingerprint: dict, options: RunSettings, log: RunLogger) -> bool:
    """Whether the training data is the one the checkpoint was trained on; refuses a change (exit 2)
    unless --accept-data-change, then says how the stored position maps onto the new data."""
    progress = resumed.progress  # the data record of files older than it has fingerprint None
    return check_same_data(resumed.data.fingerprint, fingerprint, accept=options.accept_data_change,
                           checkpoint=str(resumed.path),
                           position=f"sample {progress.samples_in_epoch} of epoch {progress.epoch}",
                           info=log.info, warn=log.warn)


def data_order(resumed: Resumed | None, manifests: list[ManifestSpec], index: ManifestIndex, train: TrainConfig,
               plan: HardwarePlan, log: RunLogger, *, data_changed: bool = False) -> SamplerSpec:
    """The data order of the run: new runs take rule 2 and the flags' mix; a resumed run keeps its own.

    `data_changed` (the data changed and --accept-data-change took it): the run's order settings
    apply to the new data's line counts.
    """
    lines = np.bincount(index.file_ids, minlength=len(index.files)).tolist()
    current = sampler_spec(manifests, lines, seed=train.seed, sort_window=train.sort_window,
                           step_samples=plan.effective_batch)
    if resumed is None:
        spec = current
    elif resumed.sampler is None:  # no record: written before rules
        log.info("this run started before data order rule 2: it keeps the order it started with (rule 1)")
        spec = legacy_spec(resumed.progress.sampler_seed, resumed.legacy_window(train.sort_window),
                           plan.effective_batch, len(index))
    else:
        spec = resumed.sampler
        if data_changed and [s.lines for s in spec.sources] != lines:
            spec = _on_new_data(spec, current)
        if [s.lines for s in spec.sources] != lines:
            raise UserError(f"the training manifests now have {lines} usable lines per file, the run was made with "
                            f"{[s.lines for s in spec.sources]}; resume with the same data or start a new --output-dir")
        change = mix_change(spec, current)
        if change:
            log.warn(change)
    log.info(describe_epoch(spec) + _trained_share(spec, plan.effective_batch))
    return spec


def _trained_share(spec: SamplerSpec, effective_batch: int) -> str:
    """What an epoch of the order trains at this effective batch, when a resume at another batch than the order
    was cut for leaves a tail short of a step (loop.end_of_epoch drops it); else nothing."""
    samples = epoch_length(spec)
    trained = samples // effective_batch * effective_batch
    if trained in (samples, 0):  # 0: the schedule refuses an epoch under one batch (Schedule.steps_per_epoch)
        return ""
    return (f"; at an effective batch of {effective_batch}, {trained} of them train an epoch "
            f"({trained // effective_batch} steps)")


def _on_new_data(spec: SamplerSpec, current: SamplerSpec) -> SamplerSpec:
    """The run's order settings (seed, window, step, mix) over the new data's line counts; with another
    number of manifests, the flags' mix."""
    if len(spec.sources) == len(current.sources):
        sources = tuple(dataclasses.replace(old, lines=new.lines)
                        for old, new in zip(spec.sources, current.sources, strict=True))
    else:
        sources = current.sources
    return dataclasses.replace(spec, sources=sources)
