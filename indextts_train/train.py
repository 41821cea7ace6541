"""The training loop, top to bottom.

`train(options)` is all of `train-gpt`: set up (config, hardware plan, data, model, optimizer), find
what to resume from, then one flat loop of optimizer steps. Exact resume rests on four rules kept
here:
  1. Checkpoints are taken only at optimizer-step boundaries, after validation, and hold everything
     that decides what happens next (weights, the matched optimizer/scheduler/scaler set, the data
     position in samples, every RNG).
  2. The data order is a pure function of (seed, epoch) and the position is counted in samples, so
     a resumed run slices the order where the killed one stopped (no replay).
  3. Nothing but the model's dropout draws from the global torch RNG during the loop (data loaders
     get a private generator), so restoring the RNG restores the dropout masks.
  4. Signals only set a flag; the loop saves at the next step boundary.
"""

from __future__ import annotations

import contextlib
import math
import os
import signal
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
from torch import nn

from indextts_train import checkpoint as ckpt_io
from indextts_train.config import Config, config_to_dict, load_config
from indextts_train.data import (
    ManifestDataset,
    ManifestIndex,
    ResumableBatchSampler,
    make_loader,
    sequential_batches,
)
from indextts_train.distributed import (
    DistInfo,
    any_rank,
    barrier,
    gather_to_main,
    setup_distributed,
    sum_across_ranks,
    teardown_distributed,
)
from indextts_train.errors import UserError
from indextts_train.evaluate import evaluate
from indextts_train.faults import crash_point
from indextts_train.hardware import HardwarePlan, choose_plan, detect_device, halve_for_oom, is_oom_error
from indextts_train.logging import RunLogger
from indextts_train.model import (
    Batch,
    UnifiedVoiceGPT,
    full_state_dict,
    init_carried,
    load_base_checkpoint,
    split_state_dict,
)
from indextts_train.resume import (
    apply_changed_optimizer_settings,
    optimizer_state_for,
    remap_optimizer_state,
    remembered_oom_plan,
    report_changed_hparams,
    restore_rng_for_rank,
    restore_scaler,
    seed_everything,
    select_checkpoint,
    vocab_change_block,
)
from indextts_train.vocab import RowFreezer, VocabPlan, resize_text_rows, tokenizer_size

EXIT_BY_SIGNAL = {signal.SIGINT: 130, signal.SIGTERM: 143, signal.SIGHUP: 129}


@dataclass
class TrainOptions:
    """Everything `train-gpt` accepts. `None` means "take it from the config's train: section"."""

    train_manifests: list[Path]
    output_dir: Path
    config: Path
    val_manifests: list[Path] = field(default_factory=list)
    tokenizer: Path | None = None
    base_checkpoint: Path | None = None
    resume: str | None = None  # None, "auto" or a checkpoint path
    batch_size: int | None = None  # 0 = auto
    grad_accumulation: int | None = None  # 0 = auto
    effective_batch_size: int | None = None
    num_workers: int | None = None  # 0 = auto
    amp: bool | None = None
    epochs: int | None = None
    max_steps: int | None = None
    learning_rate: float | None = None
    weight_decay: float | None = None
    warmup_steps: int | None = None
    text_loss_weight: float | None = None
    mel_loss_weight: float | None = None
    grad_clip: float | None = None
    dropout: float | None = None
    log_interval: int | None = None
    val_interval: int | None = None
    save_interval: int | None = None
    keep_checkpoints: int | None = None
    seed: int | None = None
    activation_checkpointing: bool | None = None
    on_vocab_change: str = "keep"  # "keep" the optimizer state (remapped) or "reset" the matched set
    unfreeze_base_vocab: bool = False
    skip_bad_lines: bool = False
    tensorboard: bool = True


@dataclass
class Progress:
    """Where the run is. `samples_in_epoch` is global (all ranks) and counts consumed samples."""

    step: int = 0
    epoch: int = 0
    samples_in_epoch: int = 0
    samples_total: int = 0


@dataclass
class History:
    train: list = field(default_factory=list)  # [step, loss, text_loss, mel_loss, mel_top1, lr]
    val: list = field(default_factory=list)  # [step, loss, text_loss, mel_loss, mel_top1]
    best_val_loss: float | None = None


class SignalFlag:
    """First SIGINT/SIGTERM/SIGHUP: finish the step, save, exit. Second: exit at once.

    Exiting at once is safe because checkpoints are published atomically: the worst a second
    Ctrl+C leaves behind is a temp file that the next save removes.
    """

    def __init__(self) -> None:
        self.signum: int | None = None
        self._previous = {signum: signal.signal(signum, self._handle) for signum in EXIT_BY_SIGNAL}

    def uninstall(self) -> None:
        for signum, handler in self._previous.items():
            signal.signal(signum, handler)

    def _handle(self, signum: int, frame: object) -> None:
        if self.signum is not None:
            os._exit(EXIT_BY_SIGNAL[signum])
        self.signum = signum

    @property
    def exit_code(self) -> int:
        return EXIT_BY_SIGNAL.get(self.signum, 0) if self.signum is not None else 0


class LossModule(nn.Module):
    """DDP only syncs gradients through `forward`, so the loss computation is the forward here."""

    def __init__(self, model: UnifiedVoiceGPT) -> None:
        super().__init__()
        self.model = model

    def forward(self, batch: Batch) -> tuple[torch.Tensor, ...]:
        out = self.model.compute_losses(batch)
        return (out.text_loss, out.mel_loss, out.text_ce_sum, out.text_count, out.mel_ce_sum,
                out.mel_count, out.mel_correct)


class CheckedDataset(ManifestDataset):
    """Adds the id-range check the embedding lookup needs, naming the manifest line on failure."""

    def __init__(self, index: ManifestIndex, text_rows: int, mel_codes: int, model_dim: int) -> None:
        super().__init__(index, model_dim=model_dim)
        self.text_rows = text_rows
        self.mel_codes = mel_codes

    def __getitem__(self, i: int) -> dict:
        item = super().__getitem__(i)
        text, codes = item["text_ids"][: item["text_len"]], item["codes"][: item["code_len"]]
        if len(text) and int(text.max()) >= self.text_rows - 1:
            raise UserError(f"{self.index.source(i)}: text id {int(text.max())} is outside the "
                            f"vocabulary ({self.text_rows - 1} tokens); pass the --tokenizer the data was made with")
        if len(codes) and int(codes.max()) >= self.mel_codes:
            raise UserError(f"{self.index.source(i)}: code {int(codes.max())} >= "
                            f"number_mel_codes {self.mel_codes}; check the config")
        return item


def lr_factor(step: int, warmup_steps: int, total_steps: int, min_ratio: float) -> float:
    """Linear warmup to 1, then cosine to min_ratio at total_steps (LambdaLR multiplier)."""
    if step < warmup_steps:
        return (step + 1) / warmup_steps
    progress = min(1.0, (step - warmup_steps) / max(1, total_steps - warmup_steps))
    return min_ratio + (1.0 - min_ratio) * 0.5 * (1.0 + math.cos(math.pi * progress))


def apply_overrides(config: Config, options: TrainOptions) -> None:
    """CLI flags beat the config's train: section; the dataclass re-validates the result."""
    train = config.train
    for name in ("batch_size", "grad_accumulation", "effective_batch_size", "num_workers", "epochs",
                 "max_steps", "learning_rate", "weight_decay", "warmup_steps", "text_loss_weight",
                 "mel_loss_weight", "grad_clip", "dropout", "log_interval", "val_interval",
                 "save_interval", "keep_checkpoints", "seed"):
        value = getattr(options, name)
        if value is not None:
            setattr(train, name, value)
    if options.activation_checkpointing is not None:
        train.activation_checkpointing = options.activation_checkpointing
    if options.unfreeze_base_vocab:
        train.freeze_base_vocab = False
    for name in ("log_interval", "val_interval", "save_interval"):
        if getattr(train, name) <= 0:
            raise UserError(f"--{name.replace('_', '-')} must be > 0, got {getattr(train, name)}")
    train.__post_init__()


def build_optimizer(model: UnifiedVoiceGPT, config: Config) -> tuple[torch.optim.AdamW, list[str]]:
    """AdamW; no weight decay on biases, norms and the speed embedding (1-D or tiny tensors).

    Returns the optimizer and the parameter names in optimizer order, which the checkpoint stores
    so optimizer state can be remapped by name when the vocabulary grows.
    """
    train = config.train
    decay, no_decay = [], []
    for name, param in model.named_parameters():
        (decay if param.dim() >= 2 and not name.startswith("speed_emb") else no_decay).append((name, param))
    groups = [
        {"params": [p for _, p in decay], "weight_decay": train.weight_decay},
        {"params": [p for _, p in no_decay], "weight_decay": 0.0},
    ]
    optimizer = torch.optim.AdamW(groups, lr=train.learning_rate, betas=train.adam_betas, eps=train.adam_eps)
    return optimizer, [n for n, _ in decay] + [n for n, _ in no_decay]


def hparams_of(config: Config, plan: HardwarePlan, total_steps: int) -> dict:
    train = config.train
    return {
        "learning_rate": train.learning_rate, "weight_decay": train.weight_decay,
        "warmup_steps": train.warmup_steps, "total_steps": total_steps, "epochs": train.epochs,
        "max_steps": train.max_steps, "effective_batch": plan.effective_batch,
        "micro_batch": plan.micro_batch, "grad_accumulation": plan.grad_accumulation,
        "world_size": plan.world_size, "text_loss_weight": train.text_loss_weight,
        "mel_loss_weight": train.mel_loss_weight, "grad_clip": train.grad_clip, "seed": train.seed,
        "dropout": train.dropout, "precision": plan.precision,
        "freeze_base_vocab": train.freeze_base_vocab,
    }


@dataclass
class RunState:
    """Everything built during setup that the loop needs."""

    model: UnifiedVoiceGPT
    carried: dict
    vocab_plan: VocabPlan
    optimizer: torch.optim.AdamW
    param_names: list[str]
    scheduler: torch.optim.lr_scheduler.LambdaLR
    scaler: torch.amp.GradScaler
    progress: Progress
    history: History
    sampler_seed: int
    resumed_from: Path | None = None


def text_tokens_for(options: TrainOptions, config: Config) -> int:
    if options.tokenizer is not None:
        return tokenizer_size(options.tokenizer)
    return config.gpt.number_text_tokens


def build_fresh(options: TrainOptions, config: Config, tokens: int, log: RunLogger) -> tuple:
    """Model weights for a new run: the base checkpoint grown to the tokenizer, or random init."""
    train = config.train
    generator = torch.Generator().manual_seed(train.seed)
    if options.base_checkpoint is None:
        log.warn("no --base-checkpoint: the GPT starts from random weights (fine for the demo, "
                 "not for fine-tuning)")
        config.gpt.number_text_tokens = tokens
        model = UnifiedVoiceGPT(config.gpt, dropout=train.dropout,
                                activation_checkpointing=train.activation_checkpointing)
        return model, init_carried(config.gpt, generator), VocabPlan(tokens, tokens, train.freeze_base_vocab)
    trained, carried, base_tokens = load_base_checkpoint(options.base_checkpoint, config.gpt)
    plan = VocabPlan(base_tokens=base_tokens, tokens=tokens, freeze_base=train.freeze_base_vocab)
    if tokens != base_tokens:
        trained = resize_text_rows(trained, plan, generator)
    config.gpt.number_text_tokens = tokens
    model = UnifiedVoiceGPT(config.gpt, dropout=train.dropout,
                            activation_checkpointing=train.activation_checkpointing)
    model.load_state_dict(trained, strict=True)
    log.info(plan.describe())
    return model, carried, plan


def restore_run(ckpt: dict, path: Path, options: TrainOptions, config: Config, tokens: int,
                plan: HardwarePlan, total_steps_of, log: RunLogger, device: torch.device) -> RunState:
    """Rebuild the run from a checkpoint, growing the vocabulary if the tokenizer grew."""
    train = config.train
    trained, carried = split_state_dict(ckpt["model"], config.gpt)
    saved_plan = VocabPlan.from_dict(ckpt["vocab_plan"])
    saved_tokens = trained["text_embedding.weight"].shape[0] - 1
    vocab_changed = saved_tokens != tokens
    vocab_plan = VocabPlan(base_tokens=saved_plan.base_tokens, tokens=tokens, freeze_base=train.freeze_base_vocab)
    if vocab_changed:
        if tokens < saved_tokens:
            raise UserError(f"the tokenizer has {tokens} pieces but the checkpoint {path} was trained with "
                            f"{saved_tokens}; a vocabulary can grow between runs, not shrink")
        trained = resize_text_rows(trained, VocabPlan(saved_tokens, tokens),
                                   torch.Generator().manual_seed(train.seed + tokens))
    config.gpt.number_text_tokens = tokens
    model = UnifiedVoiceGPT(config.gpt, dropout=train.dropout,
                            activation_checkpointing=train.activation_checkpointing)
    try:
        model.load_state_dict(trained, strict=True)
    except RuntimeError as exc:
        first = str(exc).splitlines()[0]
        raise UserError(f"{path} does not fit --config {config.source}: {first}") from None
    model.to(device)
    optimizer, names = build_optimizer(model, config)
    total_steps = total_steps_of(plan.effective_batch)
    scheduler = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda s: lr_factor(s, train.warmup_steps, total_steps, train.min_lr_ratio))
    scaler = torch.amp.GradScaler("cuda", enabled=plan.use_grad_scaler)
    reset = vocab_changed and options.on_vocab_change == "reset"
    progress = Progress(**{k: ckpt["progress"][k] for k in ("step", "epoch", "samples_in_epoch", "samples_total")})
    history = History(**ckpt["history"])
    if reset:
        progress, history = Progress(), History()
    else:
        opt_state = optimizer_state_for(ckpt, names, optimizer, path)
        if opt_state is None:  # a repaired checkpoint whose optimizer could not be recovered
            log.warn(f"{path} has no usable optimizer state (repaired): optimizer, scheduler and scaler "
                     f"start fresh together at step {progress.step}")
            scheduler.last_epoch = progress.step
            apply_changed_optimizer_settings(optimizer, scheduler, {}, train, total_steps)
        else:
            if vocab_changed:
                opt_state = remap_optimizer_state(opt_state, names, saved_tokens, tokens)
            optimizer.load_state_dict(opt_state)
            scheduler.load_state_dict(ckpt["scheduler"])
            apply_changed_optimizer_settings(optimizer, scheduler, ckpt["hparams"], train, total_steps)
        restore_scaler(scaler, ckpt.get("scaler"), log)
    if vocab_changed:
        log.info(vocab_change_block(saved_tokens, tokens, reset, names))
    log.info(vocab_plan.describe())
    return RunState(model, carried, vocab_plan, optimizer, names, scheduler, scaler, progress, history,
                    sampler_seed=ckpt["progress"]["sampler_seed"] if not reset else train.seed,
                    resumed_from=None if reset else path)


def fresh_run(options: TrainOptions, config: Config, tokens: int, plan: HardwarePlan, total_steps_of,
              log: RunLogger, device: torch.device) -> RunState:
    model, carried, vocab_plan = build_fresh(options, config, tokens, log)
    model.to(device)
    optimizer, names = build_optimizer(model, config)
    train = config.train
    total_steps = total_steps_of(plan.effective_batch)
    scheduler = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda s: lr_factor(s, train.warmup_steps, total_steps, train.min_lr_ratio))
    scaler = torch.amp.GradScaler("cuda", enabled=plan.use_grad_scaler)
    return RunState(model, carried, vocab_plan, optimizer, names, scheduler, scaler, Progress(), History(),
                    sampler_seed=train.seed)


def checkpoint_state(run: RunState, config: Config, plan: HardwarePlan, hparams: dict,
                     dist_info: DistInfo) -> dict | None:
    """The checkpoint dict (on rank 0; other ranks return None after sending their RNG)."""
    rng_states = gather_to_main(ckpt_io.capture_rng(), dist_info)
    if not dist_info.is_main:
        return None
    progress = run.progress
    return {
        "format": ckpt_io.FORMAT, "format_version": ckpt_io.FORMAT_VERSION,
        "model": full_state_dict(run.model, run.carried),
        "optimizer": run.optimizer.state_dict(),
        "optimizer_param_names": list(run.param_names),
        "scheduler": run.scheduler.state_dict(),
        "scaler": run.scaler.state_dict() if run.scaler.is_enabled() else None,
        "progress": {"step": progress.step, "epoch": progress.epoch,
                     "samples_in_epoch": progress.samples_in_epoch, "samples_total": progress.samples_total,
                     "sampler_seed": run.sampler_seed, "micro_batch": plan.micro_batch,
                     "grad_accumulation": plan.grad_accumulation, "world_size": plan.world_size},
        "rng": rng_states,
        "history": {"train": run.history.train, "val": run.history.val,
                    "best_val_loss": run.history.best_val_loss},
        "hparams": hparams, "config": config_to_dict(config), "vocab_plan": run.vocab_plan.to_dict(),
        "hardware": plan.to_dict(), "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }


def save(run: RunState, config: Config, plan: HardwarePlan, hparams: dict, dist_info: DistInfo,
         options: TrainOptions, log: RunLogger) -> Path | None:
    state = checkpoint_state(run, config, plan, hparams, dist_info)
    path = None
    if state is not None:
        path = ckpt_io.save_checkpoint(state, options.output_dir, run.progress.step, keep=config.train.keep_checkpoints)
        log.info(f"saved {path} (step {run.progress.step}, epoch {run.progress.epoch}, "
                 f"sample {run.progress.samples_in_epoch})")
    barrier(dist_info)
    return path


def train(options: TrainOptions) -> int:
    """Run `train-gpt`. Returns the exit code: 0 done, 130/143/129 after a safe save on a signal."""
    signals = SignalFlag()
    dist_info = setup_distributed()
    try:
        return _train(options, signals, dist_info)
    finally:
        signals.uninstall()
        teardown_distributed(dist_info)


def _train(options: TrainOptions, signals: SignalFlag, dist_info: DistInfo) -> int:
    config = load_config(options.config)
    apply_overrides(config, options)
    train = config.train
    startup_log = RunLogger(None, 0, enabled=dist_info.is_main, tensorboard=False)

    # ---- hardware: precision, micro-batch, accumulation, workers --------------------------------
    device_info = detect_device(dist_info.local_rank)
    plan = choose_plan(device_info, config.gpt, effective_batch=train.effective_batch_size,
                       batch_size=train.batch_size, grad_accumulation=train.grad_accumulation,
                       num_workers=train.num_workers, amp=options.amp,
                       activation_checkpointing=train.activation_checkpointing,
                       world_size=dist_info.world_size)
    device = torch.device(f"cuda:{dist_info.local_rank}" if device_info.kind == "cuda" else "cpu")
    if plan.tf32:
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
    startup_log.info(plan.describe())

    # ---- data ----------------------------------------------------------------------------------
    train_index = ManifestIndex.build(options.train_manifests, skip_bad=options.skip_bad_lines,
                                      max_text_tokens=config.gpt.max_text_tokens,
                                      max_mel_tokens=config.gpt.max_mel_tokens)
    if train_index.skipped:
        startup_log.warn(f"skipped {train_index.skipped} bad manifest line(s), e.g. {train_index.skipped_examples[0]}")
    val_index = None
    if options.val_manifests:
        val_index = ManifestIndex.build(options.val_manifests, skip_bad=options.skip_bad_lines,
                                        max_text_tokens=config.gpt.max_text_tokens,
                                        max_mel_tokens=config.gpt.max_mel_tokens)

    def steps_per_epoch(effective_batch: int) -> int:
        steps = len(train_index) // effective_batch
        if steps == 0:
            raise UserError(f"{options.train_manifests[0]}: {len(train_index)} usable samples is fewer than one "
                            f"effective batch ({effective_batch}); lower --batch-size/--grad-accumulation")
        return steps

    def total_steps_of(effective_batch: int) -> int:
        total = train.epochs * steps_per_epoch(effective_batch)
        return min(total, train.max_steps) if train.max_steps else total

    # ---- model, optimizer, resume --------------------------------------------------------------
    tokens = text_tokens_for(options, config)
    seed_everything(train.seed + dist_info.rank)
    ckpt, ckpt_path = select_checkpoint(options.output_dir, options.resume, startup_log)
    if ckpt is not None and train.batch_size == 0:
        plan = remembered_oom_plan(plan, ckpt.get("hardware") or {}, startup_log)
    if ckpt is not None:
        run = restore_run(ckpt, ckpt_path, options, config, tokens, plan, total_steps_of, startup_log, device)
    else:
        run = fresh_run(options, config, tokens, plan, total_steps_of, startup_log, device)
    total_steps = total_steps_of(plan.effective_batch)
    hparams = hparams_of(config, plan, total_steps)
    if run.resumed_from is not None and ckpt["hparams"]:
        report_changed_hparams(ckpt["hparams"], hparams, startup_log)
    elif run.resumed_from is not None:
        startup_log.info("the checkpoint was repaired and records no settings: the current ones apply")
    freezer = RowFreezer(run.model, run.vocab_plan)
    wrapped: nn.Module = LossModule(run.model)
    if dist_info.enabled:
        wrapped = nn.parallel.DistributedDataParallel(
            wrapped, device_ids=[device.index] if device.type == "cuda" else None)
    autocast_dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(plan.precision)

    def autocast():
        if autocast_dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(device_type=device.type, dtype=autocast_dtype)

    dataset = CheckedDataset(train_index, config.gpt.text_rows, config.gpt.number_mel_codes, config.gpt.model_dim)
    val_dataset = None
    if val_index is not None:
        val_dataset = CheckedDataset(val_index, config.gpt.text_rows, config.gpt.number_mel_codes,
                                     config.gpt.model_dim)

    options.output_dir.mkdir(parents=True, exist_ok=True)
    log = RunLogger(options.output_dir, total_steps, enabled=dist_info.is_main, tensorboard=options.tensorboard)
    if run.progress.step >= total_steps:
        log.info(f"nothing to do: the run in {options.output_dir} already reached step {run.progress.step} "
                 f"of {total_steps}")
        log.close()
        return 0
    # Restored last: model building and data setup above may draw random numbers.
    restore_rng_for_rank(ckpt if run.resumed_from is not None else None, dist_info, train.seed, log)
    del ckpt

    progress, history = run.progress, run.history
    log.info(f"training {total_steps} steps: {len(train_index)} samples, effective batch {plan.effective_batch} "
             f"= {plan.micro_batch} x {plan.grad_accumulation} x {plan.world_size}, starting at step "
             f"{progress.step} (epoch {progress.epoch}, sample {progress.samples_in_epoch})")
    log.start(progress.step)
    wrapped.train()
    last_time, last_samples = time.perf_counter(), progress.samples_total
    window: list[list[float]] = []
    exit_code = 0

    # ---- the loop: one iteration = one optimizer step ------------------------------------------
    batches = None
    while progress.step < total_steps:
        usable = steps_per_epoch(plan.effective_batch) * plan.effective_batch  # the tail short of a step is dropped
        if progress.samples_in_epoch + plan.effective_batch > usable:
            progress.epoch += 1
            progress.samples_in_epoch = 0
            batches = None
        if batches is None:
            batches = micro_batches(dataset, run, plan, config, progress, dist_info, device)
        try:
            metrics = optimizer_step(wrapped, run, freezer, batches, plan, config, dist_info, device, autocast,
                                     step=progress.step + 1)
        except _OutOfMemory as oom:
            plan = halve_for_oom(plan)  # raises a UserError when the micro-batch is already 1
            log.warn(f"CUDA out of memory at step {progress.step + 1} ({oom.message}); retrying the same "
                     f"samples with micro-batch {plan.micro_batch} x accumulation {plan.grad_accumulation}")
            hparams = hparams_of(config, plan, total_steps)
            batches = None
            continue
        progress.step += 1
        progress.samples_in_epoch += plan.effective_batch
        progress.samples_total += plan.effective_batch
        window.append(metrics)

        if progress.step % train.log_interval == 0 or progress.step == total_steps:
            now = time.perf_counter()
            values = dict(zip(("loss", "text_loss", "mel_loss", "mel_top1", "grad_norm"),
                              np.mean(window, axis=0).tolist(), strict=True))
            values["lr"] = run.scheduler.get_last_lr()[0]
            values["samples_per_s"] = (progress.samples_total - last_samples) / max(now - last_time, 1e-9)
            last_time, last_samples, window = now, progress.samples_total, []
            history.train.append([progress.step, values["loss"], values["text_loss"], values["mel_loss"],
                                  values["mel_top1"], values["lr"]])
            log.scalars("train", values, progress.step)
            log.train_step(progress.step, progress.epoch, values, print_line=True)

        if val_dataset is not None and (progress.step % train.val_interval == 0 or progress.step == total_steps):
            result, plan = validate(run.model, val_dataset, plan, config, dist_info, device, autocast, log)
            hparams = hparams_of(config, plan, total_steps)
            history.val.append([progress.step, result["loss"], result["text_loss"], result["mel_loss"],
                                result["mel_top1"]])
            if history.best_val_loss is None or result["loss"] < history.best_val_loss:
                history.best_val_loss = result["loss"]
            log.scalars("val", {k: v for k, v in result.items() if k != "samples"}, progress.step)
            log.info(f"val step {progress.step}: loss {result['loss']:.4f} text {result['text_loss']:.4f} "
                     f"mel {result['mel_loss']:.4f} top1 {result['mel_top1']:.3f}")

        stop = any_rank(signals.signum is not None, dist_info, device)
        if progress.step % train.save_interval == 0 or progress.step == total_steps or stop:
            save(run, config, plan, hparams, dist_info, options, log)
        if stop:
            exit_code = signals.exit_code or 143
            log.stop()
            log.info(f"stopped by signal after step {progress.step}; rerun the same command with "
                     f"--resume auto to continue (exit {exit_code})")
            break

    log.stop()
    if exit_code == 0:
        best = f"{history.best_val_loss:.4f}" if history.best_val_loss is not None else "n/a (no --val-manifest)"
        logs = f", TensorBoard logs in {log.log_dir}" if log.log_dir else ""
        log.info(f"done: {progress.step} steps, {progress.epoch + 1} epoch(s), best val loss {best}; "
                 f"checkpoints in {options.output_dir} (latest.pth){logs}")
    log.close()
    return exit_code


def validate(model: UnifiedVoiceGPT, dataset: ManifestDataset, plan: HardwarePlan, config: Config,
             dist_info: DistInfo, device: torch.device, autocast, log: RunLogger) -> tuple[dict, HardwarePlan]:
    """Validation over this rank's shard, in manifest order; an OOM halves the micro-batch and retries."""
    shard = list(range(dist_info.rank, len(dataset), dist_info.world_size))
    while True:
        loader = make_loader(dataset, sequential_batches(shard, plan.micro_batch), plan.num_workers,
                             device.type == "cuda")
        try:
            return evaluate(model, loader, config, device, dist_info, autocast), plan
        except Exception as exc:  # only OOM is handled here; everything else propagates unchanged
            if not is_oom_error(exc):
                raise
            plan = halve_for_oom(plan, exc)
            log.warn(f"CUDA out of memory in validation; retrying with micro-batch {plan.micro_batch}")


class _OutOfMemory(Exception):
    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


def micro_batches(dataset: ManifestDataset, run: RunState, plan: HardwarePlan, config: Config,
                  progress: Progress, dist_info: DistInfo, device: torch.device):
    """Iterator over this rank's micro-batches from the current sample of the epoch onward.

    Rebuilt only at an epoch change, a resume or an OOM retry; slicing the epoch order at
    `samples_in_epoch` is what makes a resume cost nothing and an OOM retry see the same samples.
    """
    sampler = ResumableBatchSampler(
        dataset.index.total_lengths, seed=run.sampler_seed, epoch=progress.epoch,
        micro_batch=plan.micro_batch, start_sample=progress.samples_in_epoch, world_size=plan.world_size,
        rank=dist_info.rank, sort_window=config.train.sort_window)
    return iter(make_loader(dataset, sampler, plan.num_workers, device.type == "cuda"))


def optimizer_step(wrapped: nn.Module, run: RunState, freezer: RowFreezer, batches, plan: HardwarePlan,
                   config: Config, dist_info: DistInfo, device: torch.device, autocast, step: int) -> list[float]:
    """One optimizer step over the next `grad_accumulation` micro-batches.

    Returns [loss, text_loss, mel_loss, mel_top1, grad_norm] for logging. A CUDA OOM surfaces as
    `_OutOfMemory` with the gradients cleared, so the caller can retry the same samples.
    """
    train = config.train
    text_ce = text_n = mel_ce = mel_n = mel_ok = total = 0.0
    try:
        for micro in range(plan.grad_accumulation):
            batch = next(batches)
            # DDP: all-reduce gradients only on the last micro-batch of the step.
            last = micro == plan.grad_accumulation - 1
            sync = contextlib.nullcontext() if last or not dist_info.enabled else wrapped.no_sync()
            with sync:
                with autocast():
                    text_loss, mel_loss, t_ce, t_n, m_ce, m_n, m_ok = wrapped(batch.to(device))
                    loss = train.text_loss_weight * text_loss + train.mel_loss_weight * mel_loss
                run.scaler.scale(loss / plan.grad_accumulation).backward()
            total += loss.item() / plan.grad_accumulation
            crash_point("accumulation", step)
            text_ce, text_n = text_ce + t_ce.item(), text_n + t_n.item()
            mel_ce, mel_n, mel_ok = mel_ce + m_ce.item(), mel_n + m_n.item(), mel_ok + m_ok.item()
    except Exception as exc:  # only OOM is handled here; everything else propagates unchanged
        if not is_oom_error(exc):
            raise
        run.optimizer.zero_grad(set_to_none=True)
        if device.type == "cuda":
            torch.cuda.empty_cache()
        raise _OutOfMemory(str(exc).splitlines()[0] if str(exc) else type(exc).__name__) from None
    freezer.mask_grads()  # frozen rows: no update, and no weight in the clipping norm
    run.scaler.unscale_(run.optimizer)
    grad_norm = torch.nn.utils.clip_grad_norm_(run.model.parameters(), train.grad_clip)
    run.scaler.step(run.optimizer)
    run.scaler.update()
    freezer.restore()  # undo AdamW's decoupled decay and stale momentum on the frozen rows
    run.scheduler.step()
    run.optimizer.zero_grad(set_to_none=True)
    if dist_info.enabled:  # log the whole effective batch, not rank 0's share
        total, text_ce, text_n, mel_ce, mel_n, mel_ok = sum_across_ranks(
            [total / dist_info.world_size, text_ce, text_n, mel_ce, mel_n, mel_ok], dist_info, device)
    return [total, text_ce / max(text_n, 1.0), mel_ce / max(mel_n, 1.0), mel_ok / max(mel_n, 1.0),
            float(grad_norm)]
