"""Setting up a run: config, hardware plan, data, model, the optimizer set, and what to resume from.

`setup(options, dist)` returns a `Started`: the frozen `RunSpec`, the `RunState` (resumed from the
checkpoint the manager chose, or fresh) and the startup's log and lock. Model building may draw
random numbers, so the RNG of the run (fresh seed or the checkpoint's) is put in place last, when
the loop begins (`Started.rng`).
"""

from __future__ import annotations

import copy
import os
from dataclasses import dataclass

import torch
from torch import nn

from indextts_train.checkpoint.base import read_base, settle_family
from indextts_train.checkpoint.lineage import run_lineage
from indextts_train.checkpoint.manager import Resumed, select_resume
from indextts_train.checkpoint.state import History, Progress
from indextts_train.config.metric_names import parse_forgetting_limit
from indextts_train.config.scope_settings import scope_settings
from indextts_train.config.settings import Config, config_to_dict
from indextts_train.data.fingerprint import data_fingerprint
from indextts_train.data.manifest import ManifestDataset, ManifestIndex
from indextts_train.data.sampling import ManifestSpec
from indextts_train.distributed import DistInfo
from indextts_train.errors import UserError, user_line
from indextts_train.files.faults import crash_point
from indextts_train.model.scope import check_resume_scope
from indextts_train.text.languages import parse_borrowed
from indextts_train.text.vocab import VocabPlan, family_freezer
from indextts_train.train.accel import compile_blocks
from indextts_train.train.best import BestTracker, check_metric
from indextts_train.train.guard import DivergenceGuard, SkippingDataset
from indextts_train.train.hardware import HardwarePlan, apply_determinism, detect_device
from indextts_train.train.listen_check import GenerationCheck
from indextts_train.train.loss_module import LossModule
from indextts_train.train.optim import OptimizerSet
from indextts_train.train.plan import plan_for
from indextts_train.train.preflight import check_inputs
from indextts_train.train.restore import apply_resumed, republish_best
from indextts_train.train.resume import (
    check_data,
    data_order,
    note_changed_arithmetic,
    remembered_oom_plan,
    seed_everything,
)
from indextts_train.train.run import EpochOrders, RunSpec, RunState, Schedule, Validation
from indextts_train.train.runlock import LOCK_NAME as RUN_LOCK_NAME
from indextts_train.train.runlock import RunLock, claim_output_dir
from indextts_train.train.schedule_check import schedule_warning
from indextts_train.train.validation import check_limit_groups, group_lines
from indextts_train.train.weights import Weights, fresh_weights, resumed_weights
from indextts_train.ui.console import RunLogger
from indextts_train.ui.events import EVENTS_NAME
from indextts_train.ui.run_record import (
    LOG_NAME,
    TextLog,
    first_missing,
    recordable_options,
    take_back,
    write_run_record,
)
from indextts_train.ui.run_settings import RunSettings


@dataclass(frozen=True)
class Started:
    """What setup hands the loop: the run, its state, and the startup's log and lock."""

    run: RunSpec
    state: RunState
    log: RunLogger  # the startup's lines; the run's log goes on from its text log
    lock: RunLock | None  # rank 0's hold on the output dir
    rng: list[dict] | None  # each rank's RNG stream to continue; None: fresh from the seed


def _hardware(config: Config, dist: DistInfo) -> tuple[HardwarePlan, torch.device]:
    device_info = detect_device(dist.local_rank)
    plan = plan_for(config, device_info, dist.world_size)
    if plan.tf32:
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
    if apply_determinism(plan):
        plan.reasons.append("Deterministic CUDA algorithms (CUBLAS_WORKSPACE_CONFIG="
                            f"{os.environ['CUBLAS_WORKSPACE_CONFIG']}): a resumed run stays bit-identical.")
    return plan, torch.device(f"cuda:{dist.local_rank}" if device_info.kind == "cuda" else "cpu")


def _index(manifests: list[ManifestSpec], options: RunSettings, config: Config) -> ManifestIndex:
    """Lines of either family are indexed; `require_family` checks them once the model's family is known."""
    return ManifestIndex.build([m.path for m in manifests], skip_bad=options.skip_bad_lines,
                               max_text_tokens=config.gpt.max_text_tokens, max_mel_tokens=config.gpt.max_mel_tokens,
                               borrowed=parse_borrowed(config.train.borrow_languages))


def _validation(index: ManifestIndex, manifests: list[ManifestSpec], config: Config) -> Validation:
    train = config.train
    groups = group_lines(index, manifests)
    reported = list(groups) if len(groups) > 1 else []  # one group is only the total
    check_metric(train.best_metric, reported)
    limits = parse_forgetting_limit(train.forgetting_limit) if train.forgetting_limit else {}
    check_limit_groups(limits, reported)
    dataset = _dataset(index, config)
    generation = GenerationCheck.build(dataset, groups, count=train.listen_lines, seed=train.seed,
                                       max_codes=config.gpt.max_mel_tokens)
    return Validation(dataset, groups, limits, train.early_stop_patience, generation)


def _dataset(index: ManifestIndex, config: Config) -> ManifestDataset:
    gpt = config.gpt
    return ManifestDataset(index, model_dim=gpt.model_dim, text_vocab=gpt.number_text_tokens,
                           mel_codes=gpt.number_mel_codes, mel_specials=(gpt.start_mel_token, gpt.stop_mel_token))


def _data(options: RunSettings, config: Config, log: RunLogger) -> tuple:
    """(training manifests, their index, validation manifests, their index or None)."""
    train_specs, val_specs = list(options.train_manifests), list(options.val_manifests)
    index = _index(train_specs, options, config)
    if index.skipped:
        log.warn(f"skipped {index.skipped} bad manifest line(s), e.g. {index.skipped_examples[0]}")
    if not val_specs and (config.train.early_stop_patience or config.train.forgetting_limit):
        raise UserError("--early-stop-patience and --forgetting-limit judge validations: pass --val-manifest")
    return train_specs, index, val_specs, _index(val_specs, options, config) if val_specs else None


def setup(options: RunSettings, dist: DistInfo, text_log: TextLog | None = None) -> Started:
    """Build the run: config + flags, checks of every input, hardware plan, data, weights, optimizer set,
    resume state. Nothing is created on disk before the checks pass; a start refused later removes
    what it created (the output folder it made, its lock and log)."""
    startup = RunLogger(None, 0, enabled=dist.is_main, tensorboard=False, text_log=text_log)
    if options.config_note:
        startup.info(options.config_note)
    config = copy.deepcopy(options.config)  # the run settles the model family on its own copy
    base = read_base(options.base_checkpoint)  # one read serves the family, the checks and the weights
    settle_family(config.gpt, base, options.base_checkpoint)  # before the hardware plan sizes the model
    tokens = check_inputs(options, config, base)  # before the plan is printed and before anything is created
    plan, device = _hardware(config, dist)
    # What this start creates, so that a refusal can take it back: the folders, the lock and the log.
    made = first_missing(options.output_dir)
    created = [name for name in (RUN_LOCK_NAME, LOG_NAME, EVENTS_NAME) if not (options.output_dir / name).exists()]
    lock = claim_output_dir(options.output_dir, dist, device)  # before any work: one run per output dir
    try:
        crash_point("setup", 0)  # signal tests stop the run here, in setup with the lock held
        if dist.is_main:
            startup.text_log.attach(options.output_dir)
        started = _build(options, dist, config, plan, device, startup, lock, tokens, base)
        _warn_schedule(started)
        if dist.is_main:
            write_run_record(options.output_dir, recordable_options(options.inputs, config), config_to_dict(config),
                             started.run.plan.to_dict(), startup.text_log.started)
        return started
    except BaseException as exc:  # refused (bad data, changed data, ...): the run ends here, and so does its hold
        if isinstance(exc, UserError):
            startup.text_log.record(startup.text_log.stamp(f"error: {user_line(exc)}"), "error")
        startup.text_log.close()
        if dist.is_main:  # while the lock is held: no other start can take a lock file about to be removed
            take_back(options.output_dir, made, created)
        if lock is not None:
            lock.release()
        raise


def _warn_schedule(started: Started) -> None:
    """Before the first step of a run: a schedule that cannot learn is said, with the flags to pass."""
    run = started.run
    batch = run.plan.effective_batch
    warning = schedule_warning(run.config.train, run.schedule.end_step(Progress(), batch),
                               run.schedule.steps_per_epoch(batch), batch)
    if warning and started.state.progress.step == 0:
        started.log.warn(warning)


def _checked_plan(resumed: Resumed | None, plan: HardwarePlan, config: Config, log: RunLogger) -> HardwarePlan:
    """The resumed run's scope must be today's; its OOM-reduced micro-batch is kept; a change of arithmetic said."""
    if resumed is None:
        return plan
    check_resume_scope(resumed.train_config, scope_settings(config.train), resumed.path)
    if config.train.batch_size == 0:
        plan = remembered_oom_plan(plan, resumed.hardware, log)
    note_changed_arithmetic(plan, resumed.hardware, log)
    return plan


def _weights(resumed: Resumed | None, options: RunSettings, config: Config, tokens: int, log: RunLogger,
             base: object | None) -> tuple[Weights, VocabPlan]:
    """The model's weights (the checkpoint's, or fresh from the base) and the vocabulary growth since."""
    if resumed is None:
        return fresh_weights(options, config, tokens, log, base), VocabPlan(tokens, tokens)
    return resumed_weights(resumed, config, tokens, options.tokenizer)


def _build(options: RunSettings, dist: DistInfo, config: Config, plan: HardwarePlan, device: torch.device,
           startup: RunLogger, lock: RunLock | None, tokens: int, base: object | None) -> Started:
    train = config.train
    startup.info(plan.describe(), "plan", plan=plan.to_dict())
    train_specs, index, val_specs, val_index = _data(options, config, startup)
    seed_everything(train.seed + dist.rank)
    resumed, protected = select_resume(options.output_dir, options.resume, warn=startup.warn, notice=startup.notice)
    plan = _checked_plan(resumed, plan, config, startup)
    weights, growth = _weights(resumed, options, config, tokens, startup, base)
    config.gpt.stated_family = config.gpt.family  # a random-init model of an unstated family is IndexTTS2
    for part in (index, val_index):
        if part is not None:
            part.require_family(config.gpt.family)
    weights.apply_scope(train, resumed.lora if resumed is not None else None, str(resumed and resumed.path))
    weights.to(device)
    reset = bool(growth.new_ids) and options.on_vocab_change == "reset"  # the run starts over
    fingerprint = data_fingerprint(index)
    changed = resumed is not None and not reset and check_data(resumed, fingerprint, options, startup)
    schedule = Schedule(data_order(None if reset else resumed, train_specs, index, train, plan, startup,
                                   data_changed=changed), train.epochs, train.max_steps)
    if train.compile:
        compile_blocks(weights.model.gpt.h)
    optim = OptimizerSet.build(weights.trainable(), train, plan, schedule.end_step(Progress(), plan.effective_batch))
    progress = Progress(sampler_seed=train.seed)
    state = RunState(weights, optim, progress, History(), plan, DivergenceGuard(progress, train.max_bad_steps))
    state.data.fingerprint = fingerprint
    state.lineage, state.new_branch = run_lineage(
        resumed and resumed.lineage, resumed.step if resumed is not None else 0, resumed and resumed.path,
        options.output_dir, auto=options.resume == "auto", reset=reset)
    if resumed is not None:
        apply_resumed(state, resumed, growth=growth, reset=reset, config=config, schedule=schedule, log=startup)
    val = _validation(val_index, val_specs, config) if val_index else None
    if val is not None:
        state.best = BestTracker.from_state_dict(state.history.best, train.best_metric)
    republish_best(state, None if reset or resumed is None else resumed.path, options.output_dir, protected,
                   dist, startup)
    return Started(_spec(options, dist, config, device, schedule, index, val, state, protected, startup),
                   state, startup, lock, None if reset or resumed is None else resumed.rng)


def _spec(options: RunSettings, dist: DistInfo, config: Config, device: torch.device, schedule: Schedule,
          index: ManifestIndex, val: Validation | None, state: RunState, protected: frozenset[str],
          startup: RunLogger) -> RunSpec:
    """The frozen run: the model as the loop calls it (its frozen rows, DDP under torchrun) and its data."""
    weights, train = state.weights, config.train
    startup.info(weights.vocab_plan.describe())
    startup.info(f"train scope: {scope_settings(train).describe()}; "
                 f"{sum(p.numel() for _, p in weights.trainable()):,} trainable parameters")
    freezer = family_freezer(weights.model, weights.vocab_plan, config.gpt, train, index.lang_ids, startup.info)
    wrapped = LossModule(weights.model, weights.adapters)
    if dist.enabled:
        wrapped = nn.parallel.DistributedDataParallel(
            wrapped, device_ids=[device.index] if device.type == "cuda" else None)
    dataset = _dataset(index, config)
    plan = state.layout
    total_steps = schedule.end_step(state.progress, plan.effective_batch)
    return RunSpec(options, config, dist, device, plan, schedule, total_steps,
                   schedule.steps_per_epoch(plan.effective_batch),
                   SkippingDataset(dataset) if options.skip_bad_lines else dataset,
                   EpochOrders(schedule.sampler, index.total_lengths), val, wrapped, freezer, protected)
