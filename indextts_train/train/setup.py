"""Setting up a run: config, hardware plan, data, model, the optimizer set, and what to resume from.

`setup(options, dist)` returns a `Run`, everything the loop in loop.py needs, built once. Model
building may draw random numbers, so the RNG of the run (fresh seed or the checkpoint's) is put in
place last, by `Run.start_rng`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
from torch import nn

from indextts_train.checkpoint import files as ckpt_io
from indextts_train.checkpoint.async_save import BackgroundSaver
from indextts_train.checkpoint.base import read_base, settle_family
from indextts_train.checkpoint.files import BEST, publish, same_file
from indextts_train.checkpoint.lineage import run_lineage
from indextts_train.checkpoint.rng import capture_rng
from indextts_train.checkpoint.state import DataRecord, History, Lineage, Progress, TrainingState, repaired_unknown
from indextts_train.config.metric_names import parse_forgetting_limit
from indextts_train.config.schema import is_int
from indextts_train.config.scope_settings import scope_settings
from indextts_train.config.settings import Config, TrainConfig, TrainOptions, config_to_dict
from indextts_train.data.fingerprint import check_same_data, data_fingerprint
from indextts_train.data.manifest import ManifestDataset, ManifestIndex
from indextts_train.data.sampling import (
    LEGACY_RULE,
    ManifestSpec,
    SamplerSpec,
    describe_epoch,
    epoch_length,
    epoch_order,
    legacy_spec,
    mix_change,
    parse_manifest_specs,
    sampler_spec,
)
from indextts_train.distributed import DistInfo, gather_to_main
from indextts_train.errors import UserError, user_line
from indextts_train.files.faults import crash_point
from indextts_train.model.gpt import UnifiedVoiceGPT
from indextts_train.model.scope import check_resume_scope
from indextts_train.text.languages import parse_borrowed
from indextts_train.text.vocab import (
    RowFreezer,
    VocabPlan,
    family_freezer,
)
from indextts_train.train.accel import compile_blocks
from indextts_train.train.best import BestTracker, check_metric
from indextts_train.train.guard import DivergenceGuard, SkippingDataset
from indextts_train.train.hardware import HardwarePlan, apply_determinism, choose_plan, detect_device
from indextts_train.train.listen_check import GenerationCheck
from indextts_train.train.listening import Listener, after_save
from indextts_train.train.loss_module import LossModule
from indextts_train.train.optim import OptimizerSet
from indextts_train.train.preflight import check_inputs
from indextts_train.train.resume import (
    note_changed_arithmetic,
    remembered_oom_plan,
    report_changed_hparams,
    restore_rng_for_rank,
    seed_everything,
    select_checkpoint,
)
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

Autocast = Callable[[], contextlib.AbstractContextManager]


@dataclass
class Schedule:
    """How many optimizer steps the run has: full epochs of the data, cut at max_steps (a step number).

    The epochs are counted in samples (progress.epoch and samples_in_epoch), so a resume at another
    effective batch finishes the same epochs: no "nothing to do" and no extra epoch.
    """

    sampler: SamplerSpec  # decides the epoch's length (sampling.py)
    epochs: int
    max_steps: int

    def steps_per_epoch(self, effective_batch: int) -> int:
        steps = epoch_length(self.sampler) // effective_batch
        if steps == 0:
            raise UserError(f"{self.sampler.sources[0].name}: an epoch of the training manifests has fewer samples "
                            f"({self.sampler.total_lines} usable lines) than one effective batch ({effective_batch}); "
                            "lower --effective-batch-size or add data")
        return steps

    def end_step(self, progress: Progress, effective_batch: int) -> int:
        """The step the run ends at: the rest of the current epoch, then the epochs left, at `effective_batch`.

        With one effective batch from the start this is epochs x steps an epoch, at every step of the run.
        """
        per_epoch = self.steps_per_epoch(effective_batch)
        if progress.epoch >= self.epochs:
            end = progress.step
        else:
            # The loop's rule (train.end_of_epoch): a step that would run past the epoch starts the next one.
            left_in_epoch = max(0, (per_epoch * effective_batch - progress.samples_in_epoch) // effective_batch)
            end = progress.step + left_in_epoch + (self.epochs - 1 - progress.epoch) * per_epoch
        return min(end, self.max_steps) if self.max_steps else end


def autocast_for(plan: HardwarePlan, device: torch.device) -> Autocast:
    """A context factory: autocast in the plan's dtype (HardwarePlan.amp_dtype), or nothing in fp32."""
    if plan.amp_dtype is None:
        return contextlib.nullcontext
    dtype = getattr(torch, plan.amp_dtype)
    return lambda: torch.autocast(device_type=device.type, dtype=dtype)


@dataclass
class Run:
    """Everything the loop needs, built by `setup`."""

    options: TrainOptions
    config: Config
    dist: DistInfo
    device: torch.device
    plan: HardwarePlan
    schedule: Schedule
    weights: Weights
    optim: OptimizerSet
    progress: Progress
    history: History
    dataset: ManifestDataset | SkippingDataset  # SkippingDataset under --skip-bad-lines
    val: Validation | None
    log: RunLogger
    resumed: dict | None  # the checkpoint resumed from (until start_rng has used its RNG states)
    wrapped: nn.Module | None = None  # the loss module, DDP-wrapped under torchrun
    freezer: RowFreezer | None = None
    _order: tuple[int, np.ndarray] | None = None  # (epoch, its order): computed once per epoch
    data: DataRecord = field(default_factory=DataRecord)
    guard: DivergenceGuard | None = None
    lock: RunLock | None = None  # rank 0's hold on the output dir
    protected: frozenset[str] = frozenset()  # names in output_dir this run never replaces or deletes
    lineage: Lineage = field(default_factory=Lineage)  # the branch this run's checkpoints belong to
    new_branch: bool = False  # set the abandoned branch's files aside before the first save (lineage.py)
    last_saved: Path | None = None  # the newest checkpoint of this run on disk, and its step
    last_saved_step: int = -1
    saver: BackgroundSaver | None = None  # --async-save: the thread that writes checkpoints
    listener: Listener | None = None  # --listen-every: the child processes that hear checkpoints

    def saved(self, path: Path, step: int) -> None:
        """The checkpoint of `step` is on disk at `path` (called by the writer, maybe its background thread)."""
        self.last_saved, self.last_saved_step = path, step
        after_save(self, step)  # --best-metric listen/...; --listen-every: heard by a process of its own

    def epoch_order(self, epoch: int) -> np.ndarray:
        """The data order of `epoch` (sampling.epoch_order of the run's sampler)."""
        if self._order is None or self._order[0] != epoch:
            self._order = (epoch, epoch_order(self.schedule.sampler, self.dataset.index.total_lengths, epoch))
        return self._order[1]

    @property
    def model(self) -> UnifiedVoiceGPT:
        return self.weights.model

    @property
    def total_steps(self) -> int:
        return self.schedule.end_step(self.progress, self.plan.effective_batch)

    @property
    def autocast(self) -> Autocast:
        return autocast_for(self.plan, self.device)

    def hparams(self) -> dict:
        """The settings in effect: every `train:` field plus the plan's batch layout and precision."""
        plan = self.plan
        return {**config_to_dict(self.config)["train"], "total_steps": self.total_steps,
                "effective_batch": plan.effective_batch, "micro_batch": plan.micro_batch,
                "grad_accumulation": plan.grad_accumulation, "world_size": plan.world_size, "precision": plan.precision}

    def training_state(self) -> TrainingState:
        if self.val is not None:
            self.history.best = self.val.tracker.state_dict()
        self.progress.micro_batch = self.plan.micro_batch
        self.progress.grad_accumulation = self.plan.grad_accumulation
        self.progress.world_size = self.plan.world_size
        return TrainingState(
            weights=self.weights, optimizer_set=self.optim, progress=self.progress, history=self.history,
            data=self.data, info={"hparams": self.hparams(), "config": config_to_dict(self.config),
                  "vocab_plan": self.weights.vocab_plan.to_dict(), "hardware": self.plan.to_dict(),
                  "sampler": self.schedule.sampler.state_dict(), "lora": self.weights.adapter_record(),
                  "created": time.strftime("%Y-%m-%dT%H:%M:%S%z")}, lineage=self.lineage)

    def checkpoint_state(self) -> dict | None:
        """The checkpoint dict on rank 0; other ranks send their RNG state and get None."""
        rng = gather_to_main(capture_rng(), self.dist)
        return self.training_state().state_dict(rng) if self.dist.is_main else None

    def start_rng(self) -> None:
        """Last step of setup: the checkpoint's RNG streams, or fresh ones from the seed."""
        restore_rng_for_rank(self.resumed, self.dist, self.config.train.seed, self.log)
        self.resumed = None


def _hardware(config: Config, options: TrainOptions, dist: DistInfo) -> tuple[HardwarePlan, torch.device]:
    train = config.train
    device_info = detect_device(dist.local_rank)
    plan = choose_plan(device_info, config.gpt, effective_batch=train.effective_batch_size,
                       batch_size=train.batch_size, grad_accumulation=train.grad_accumulation,
                       num_workers=train.num_workers, amp=options.amp,
                       activation_checkpointing=train.activation_checkpointing, world_size=dist.world_size,
                       scope=scope_settings(train))
    if plan.tf32:
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
    if apply_determinism(plan):
        plan.reasons.append("Deterministic CUDA algorithms (CUBLAS_WORKSPACE_CONFIG="
                            f"{os.environ['CUBLAS_WORKSPACE_CONFIG']}): a resumed run stays bit-identical.")
    return plan, torch.device(f"cuda:{dist.local_rank}" if device_info.kind == "cuda" else "cpu")


def _index(manifests: list[ManifestSpec], options: TrainOptions, config: Config) -> ManifestIndex:
    """Lines of either family are indexed; `require_family` checks them once the model's family is known."""
    return ManifestIndex.build([m.path for m in manifests], skip_bad=options.skip_bad_lines,
                               max_text_tokens=config.gpt.max_text_tokens, max_mel_tokens=config.gpt.max_mel_tokens,
                               borrowed=parse_borrowed(config.train.borrow_languages))


@dataclass
class Validation:
    """The validation data, grouped by language (validation.py), and what each validation is judged by."""

    dataset: ManifestDataset
    groups: dict[str, np.ndarray]  # group -> line indices, manifest order
    tracker: BestTracker  # best.pth and the early-stop count
    limits: dict[str | None, float]  # --forgetting-limit, percent per group (None: every group)
    patience: int  # --early-stop-patience, 0 = off
    generation: GenerationCheck | None = None  # --listen-lines: codes generated at each validation


def _validation(index: ManifestIndex, manifests: list[ManifestSpec], history: History, config: Config) -> Validation:
    train = config.train
    groups = group_lines(index, manifests)
    reported = list(groups) if len(groups) > 1 else []  # one group is only the total
    check_metric(train.best_metric, reported)
    limits = parse_forgetting_limit(train.forgetting_limit) if train.forgetting_limit else {}
    check_limit_groups(limits, reported)
    dataset = _dataset(index, config)
    generation = GenerationCheck.build(dataset, groups, count=train.listen_lines, seed=train.seed,
                                       max_codes=config.gpt.max_mel_tokens)
    return Validation(dataset, groups, BestTracker.from_state_dict(history.best, train.best_metric),
                      limits, train.early_stop_patience, generation)


def _sampler(ckpt: dict | None, manifests: list[ManifestSpec], index: ManifestIndex, train: TrainConfig,
             plan: HardwarePlan, log: RunLogger, *, data_changed: bool = False) -> SamplerSpec:
    """The data order of the run: new runs take rule 2 and the flags' mix; a resumed run keeps its own.

    `data_changed` (the data changed and --accept-data-change took it): the run's order settings
    apply to the new data's line counts.
    """
    lines = np.bincount(index.file_ids, minlength=len(index.files)).tolist()
    current = sampler_spec(manifests, lines, seed=train.seed, sort_window=train.sort_window,
                           step_samples=plan.effective_batch)
    if ckpt is None:
        spec = current
    elif ckpt.get("sampler", {}).get("rule", LEGACY_RULE) == LEGACY_RULE:  # no record: written before rules
        log.info("this run started before data order rule 2: it keeps the order it started with (rule 1)")
        spec = legacy_spec(ckpt["progress"]["sampler_seed"], _legacy_window(ckpt, train), plan.effective_batch,
                           len(index))
    else:
        spec = SamplerSpec.from_state_dict(ckpt["sampler"])
        if data_changed and [s.lines for s in spec.sources] != lines:
            spec = _on_new_data(spec, current)
        if [s.lines for s in spec.sources] != lines:
            raise UserError(f"the training manifests now have {lines} usable lines per file, the run was made with "
                            f"{[s.lines for s in spec.sources]}; resume with the same data or start a new --output-dir")
        change = mix_change(spec, current)
        if change:
            log.warn(change)
    log.info(describe_epoch(spec))
    return spec


def _legacy_window(ckpt: dict, train: TrainConfig) -> int:
    """The sort window a rule-1 run was started with: the one in its stored config (rule 1 recorded no
    sampler part), else the flag. Its order depends on it, and the default has changed since (512)."""
    stored = (ckpt.get("config") or {}).get("train", {}).get("sort_window")
    return stored if is_int(stored) and stored > 0 else train.sort_window


def _on_new_data(spec: SamplerSpec, current: SamplerSpec) -> SamplerSpec:
    """The run's order settings (seed, window, step, mix) over the new data's line counts; with another
    number of manifests, the flags' mix."""
    if len(spec.sources) == len(current.sources):
        sources = tuple(dataclasses.replace(old, lines=new.lines)
                        for old, new in zip(spec.sources, current.sources, strict=True))
    else:
        sources = current.sources
    return dataclasses.replace(spec, sources=sources)


def _dataset(index: ManifestIndex, config: Config) -> ManifestDataset:
    gpt = config.gpt
    return ManifestDataset(index, model_dim=gpt.model_dim, text_vocab=gpt.number_text_tokens,
                           mel_codes=gpt.number_mel_codes, mel_specials=(gpt.start_mel_token, gpt.stop_mel_token))


def _restore(run: Run, ckpt: dict, path: Path, growth: VocabPlan, train: TrainConfig) -> None:
    """Progress, history and the optimizer set from the checkpoint (or reset, by --on-vocab-change)."""
    if growth.new_ids and run.options.on_vocab_change == "reset":
        run.log.info(run.optim.vocab_change_block(growth, reset=True))
        run.progress.sampler_seed = train.seed
        run.resumed = None  # a reset run starts over: fresh RNG, nothing resumed
        return
    run.progress.load_state_dict(ckpt["progress"])
    run.history.load_state_dict(ckpt["history"])
    _anchor_schedule(run, ckpt)
    run.optim.load_from(ckpt, path, growth, train, run.total_steps, run.log)
    if growth.new_ids:
        run.log.info(run.optim.vocab_change_block(growth, reset=False))
    if ckpt["hparams"]:
        report_changed_hparams(ckpt["hparams"], run.hparams(), run.log)
    else:
        run.log.info("the checkpoint was repaired and records no settings: the current ones apply")


def _anchor_schedule(run: Run, ckpt: dict) -> None:
    """The LR schedule goes on from the samples seen, and ends with the run at this effective batch.

    A repaired file whose sample count is not known gets the steps times this batch, as its count from
    now on (the files this run writes no longer say they were repaired).
    """
    progress, clock = run.progress, run.optim.clock
    if "progress.samples_total" in repaired_unknown(ckpt):
        progress.samples_total = progress.step * clock.effective_batch
    clock.anchor_step, clock.anchor_samples = progress.step, progress.samples_total
    clock.total_samples = clock.anchor_samples + (run.total_steps - progress.step) * clock.effective_batch


def _data(options: TrainOptions, config: Config, log: RunLogger) -> tuple:
    """(training manifests, their index, validation manifests, their index or None)."""
    train_specs = parse_manifest_specs(options.train_manifests, "--train-manifest", weights=True)
    val_specs = parse_manifest_specs(options.val_manifests or [], "--val-manifest", weights=False)
    index = _index(train_specs, options, config)
    if index.skipped:
        log.warn(f"skipped {index.skipped} bad manifest line(s), e.g. {index.skipped_examples[0]}")
    if not val_specs and (config.train.early_stop_patience or config.train.forgetting_limit):
        raise UserError("--early-stop-patience and --forgetting-limit judge validations: pass --val-manifest")
    return train_specs, index, val_specs, _index(val_specs, options, config) if val_specs else None


def _republish_best(run: Run, path: Path | None) -> None:
    """A kill between saving a new best and publishing best.pth leaves the run resuming from that very file."""
    tracker = run.val.tracker if run.val is not None else None
    best = run.options.output_dir / BEST
    if (run.dist.is_main and path is not None and tracker is not None and tracker.step == run.progress.step
            and not same_file(best, path)):
        publish(run.options.output_dir, path, BEST, run.protected)
        run.log.info(f"{best} now names {path.name}, the best checkpoint (its publication was interrupted)")


def _check_data(ckpt: dict, path: Path, fingerprint: dict, options: TrainOptions, log: RunLogger) -> bool:
    """Whether the training data is the one the checkpoint was trained on; refuses a change (exit 2)
    unless --accept-data-change, then says how the stored position maps onto the new data."""
    progress = ckpt["progress"]
    saved = ckpt["data"]["fingerprint"]  # migrate() gave files older than the record None
    return check_same_data(saved, fingerprint, accept=options.accept_data_change, checkpoint=str(path),
                           position=f"sample {progress['samples_in_epoch']} of epoch {progress['epoch']}",
                           info=log.info, warn=log.warn)


def _restore_data(run: Run, ckpt: dict, path: Path) -> None:
    """The skipped-sample record, and which file on disk holds the step resumed from."""
    saved = ckpt["data"]
    run.data.skipped_loads, run.data.skipped_lines = saved["skipped_loads"], list(saved["skipped_lines"])
    run.last_saved, run.last_saved_step = ckpt_io.step_file_of(path) or path, run.progress.step


def setup(options: TrainOptions, dist: DistInfo, text_log: TextLog | None = None) -> Run:
    """Build the run: config + flags, checks of every input, hardware plan, data, weights, optimizer set,
    resume state. Nothing is created on disk before the checks pass; a start refused later removes
    what it created (the output folder it made, its lock and log)."""
    startup = RunLogger(None, 0, enabled=dist.is_main, tensorboard=False, text_log=text_log)
    chosen = options.config_path()[1]
    if chosen:
        startup.info(chosen)
    config = options.load_config()
    base = read_base(options.base_checkpoint)  # one read serves the family, the checks and the weights
    settle_family(config.gpt, base, options.base_checkpoint)  # before the hardware plan sizes the model
    tokens = check_inputs(options, config, base)  # before the plan is printed and before anything is created
    plan, device = _hardware(config, options, dist)
    # What this start creates, so that a refusal can take it back: the folders, the lock and the log.
    made = first_missing(options.output_dir)
    created = [name for name in (RUN_LOCK_NAME, LOG_NAME, EVENTS_NAME) if not (options.output_dir / name).exists()]
    lock = claim_output_dir(options.output_dir, dist, device)  # before any work: one run per output dir
    try:
        crash_point("setup", 0)  # signal tests stop the run here, in setup with the lock held
        if dist.is_main:
            startup.text_log.attach(options.output_dir)
        run = _build(options, dist, config, plan, device, startup, lock, tokens, base)
        _warn_schedule(run)
        if dist.is_main:
            write_run_record(options.output_dir, recordable_options(options, config), config_to_dict(config),
                             run.plan.to_dict(), startup.text_log.started)
        return run
    except BaseException as exc:  # refused (bad data, changed data, ...): the run ends here, and so does its hold
        if isinstance(exc, UserError):
            startup.text_log.record(startup.text_log.stamp(f"error: {user_line(exc)}"), "error")
        startup.text_log.close()
        if dist.is_main:  # while the lock is held: no other start can take a lock file about to be removed
            take_back(options.output_dir, made, created)
        if lock is not None:
            lock.release()
        raise


def _warn_schedule(run: Run) -> None:
    """Before the first step of a run: a schedule that cannot learn is said, with the flags to pass."""
    batch = run.plan.effective_batch
    warning = schedule_warning(run.config.train, run.schedule.end_step(Progress(), batch),
                               run.schedule.steps_per_epoch(batch), batch)
    if warning and run.progress.step == 0:
        run.log.warn(warning)


def _build(options: TrainOptions, dist: DistInfo, config: Config, plan: HardwarePlan, device: torch.device,
           startup: RunLogger, lock: RunLock | None, tokens: int, base: object | None) -> Run:
    train = config.train
    startup.info(plan.describe(), "plan", plan=plan.to_dict())
    train_specs, index, val_specs, val_index = _data(options, config, startup)
    seed_everything(train.seed + dist.rank)
    ckpt, path, protected = select_checkpoint(options.output_dir, options.resume, startup)
    if ckpt is not None:
        check_resume_scope(ckpt["config"].get("train") or {}, scope_settings(train), path)
    if ckpt is not None and train.batch_size == 0:
        plan = remembered_oom_plan(plan, ckpt.get("hardware") or {}, startup)
    if ckpt is not None:
        note_changed_arithmetic(plan, ckpt.get("hardware") or {}, startup)
    growth = VocabPlan(tokens, tokens)
    if ckpt is None:
        weights = fresh_weights(options, config, tokens, startup, base)
    else:
        weights, growth = resumed_weights(ckpt, path, config, tokens, options.tokenizer)
    config.gpt.stated_family = config.gpt.family  # a random-init model of an unstated family is IndexTTS2
    for part in (index, val_index):
        if part is not None:
            part.require_family(config.gpt.family)
    weights.apply_scope(train, ckpt.get("lora") if ckpt is not None else None, str(path))
    weights.to(device)
    reset = bool(growth.new_ids) and options.on_vocab_change == "reset"  # the run starts over
    fingerprint = data_fingerprint(index)
    changed = ckpt is not None and not reset and _check_data(ckpt, path, fingerprint, options, startup)
    schedule = Schedule(_sampler(None if reset else ckpt, train_specs, index, train, plan, startup,
                                 data_changed=changed), train.epochs, train.max_steps)
    if train.compile:
        compile_blocks(weights.model.gpt.h)
    optim = OptimizerSet.build(weights.trainable(), train, plan, schedule.end_step(Progress(), plan.effective_batch))
    dataset = _dataset(index, config)
    run = Run(options, config, dist, device, plan, schedule, weights, optim, Progress(sampler_seed=train.seed),
              History(), SkippingDataset(dataset) if options.skip_bad_lines else dataset, None, startup, ckpt,
              lock=lock, protected=protected)
    run.data.fingerprint = fingerprint
    run.lineage, run.new_branch = run_lineage(ckpt, path, options.output_dir, auto=options.resume == "auto",
                                              reset=reset)
    if ckpt is not None:
        _restore(run, ckpt, path, growth, train)
    if run.resumed is not None:  # resumed, not reset by --on-vocab-change
        _restore_data(run, ckpt, path)
    run.guard = DivergenceGuard(run.progress, train.max_bad_steps)
    run.val = _validation(val_index, val_specs, run.history, config) if val_index else None
    _republish_best(run, None if reset else path)
    startup.info(weights.vocab_plan.describe())
    startup.info(f"train scope: {scope_settings(train).describe()}; "
                 f"{sum(p.numel() for _, p in weights.trainable()):,} trainable parameters")
    run.freezer = family_freezer(weights.model, weights.vocab_plan, config.gpt, train, index.lang_ids, startup.info)
    run.wrapped = LossModule(weights.model, weights.adapters)
    if dist.enabled:
        run.wrapped = nn.parallel.DistributedDataParallel(
            run.wrapped, device_ids=[device.index] if device.type == "cuda" else None)
    return run
