"""One optimizer step and one validation pass, each with its CUDA out-of-memory handling.

An OOM in a step clears the gradients and surfaces as `OutOfMemory`, so the loop can halve the
micro-batch and retry the same samples; validation retries by itself.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import TYPE_CHECKING

import torch
from torch import nn

from indextts_train.data import make_loader
from indextts_train.distributed import all_reduce_sum
from indextts_train.faults import crash_point
from indextts_train.hardware import halve_for_oom, is_oom_error
from indextts_train.model import Batch, UnifiedVoiceGPT
from indextts_train.sampling import ResumableBatchSampler
from indextts_train.validation import evaluate_groups

if TYPE_CHECKING:
    from indextts_train.run import Run


class LossModule(nn.Module):
    """DDP only syncs gradients through `forward`, so the loss computation is the forward here."""

    def __init__(self, model: UnifiedVoiceGPT) -> None:
        super().__init__()
        self.model = model

    def forward(self, batch: Batch) -> tuple[torch.Tensor, ...]:
        out = self.model.compute_losses(batch)
        return (out.text_loss, out.mel_loss, out.text_ce_sum, out.text_count, out.mel_ce_sum,
                out.mel_count, out.mel_correct)


class OutOfMemory(Exception):
    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


def micro_batches(run: Run) -> Iterator[Batch]:
    """This rank's micro-batches from the current sample of the epoch onward.

    Rebuilt only at an epoch change, a resume or an OOM retry; slicing the epoch order at
    `samples_in_epoch` is what makes a resume cost nothing and an OOM retry see the same samples.
    """
    plan, progress = run.plan, run.progress
    sampler = ResumableBatchSampler(
        run.epoch_order(progress.epoch), micro_batch=plan.micro_batch, start_sample=progress.samples_in_epoch,
        world_size=plan.world_size, rank=run.dist.rank)
    return iter(make_loader(run.dataset, sampler, plan.num_workers, run.device.type == "cuda"))


def _accumulate(run: Run, batches: Iterator[Batch], step: int) -> torch.Tensor:
    """Forward and backward over `grad_accumulation` micro-batches.

    Returns the logged sums (6,) float64 *on the device*: total loss, text_ce, text_count, mel_ce,
    mel_count, mel_correct. Nothing here waits for the device: a `.item()` per micro-batch would
    stop the CPU from queueing the next kernels until the GPU caught up.
    """
    accumulation, wrapped, autocast = run.plan.grad_accumulation, run.wrapped, run.autocast
    non_blocking = run.device.type == "cuda"  # batches come from pinned memory there
    sums = torch.zeros(6, dtype=torch.float64, device=run.device)
    for micro in range(accumulation):
        batch = next(batches)
        # DDP: all-reduce gradients only on the last micro-batch of the step.
        last = micro == accumulation - 1
        sync = contextlib.nullcontext() if last or not run.dist.enabled else wrapped.no_sync()
        with sync:
            with autocast():
                text_loss, mel_loss, *counts = wrapped(batch.to(run.device, non_blocking=non_blocking))
                loss = run.config.train.loss(text_loss, mel_loss)
            run.optim.scaler.scale(loss / accumulation).backward()
        crash_point("accumulation", step)
        sums += torch.stack([loss.detach().double() / accumulation, *(c.detach().double() for c in counts)])
    return sums


def optimizer_step(run: Run, batches: Iterator[Batch], step: int) -> torch.Tensor:
    """One optimizer step over the next `grad_accumulation` micro-batches.

    Returns [loss, text_loss, mel_loss, mel_top1, grad_norm] for logging as a (5,) float64 tensor on
    the device: the loop reads it once per log interval (and once per step for a terminal's live
    line). A CUDA OOM surfaces as `OutOfMemory` with the gradients cleared, so the caller can retry
    the same samples.
    """
    optim = run.optim
    try:
        sums = _accumulate(run, batches, step)
    except Exception as exc:  # only OOM is handled here; everything else propagates unchanged
        if not is_oom_error(exc):
            raise
        optim.optimizer.zero_grad(set_to_none=True)
        if run.device.type == "cuda":
            torch.cuda.empty_cache()
        raise OutOfMemory(str(exc).splitlines()[0] if str(exc) else type(exc).__name__) from None
    run.freezer.mask_grads()  # frozen rows: no update, and no weight in the clipping norm
    optim.scaler.unscale_(optim.optimizer)
    grad_norm = torch.nn.utils.clip_grad_norm_(run.model.parameters(), run.config.train.grad_clip)
    optim.scaler.step(optim.optimizer)
    optim.scaler.update()
    run.freezer.restore()  # undo AdamW's decoupled decay and stale momentum on the frozen rows
    optim.scheduler.step()
    optim.optimizer.zero_grad(set_to_none=True)
    if run.dist.enabled:  # log the whole effective batch, not rank 0's share
        sums[0] /= run.dist.world_size
        all_reduce_sum(sums, run.dist)
    total, text_ce, text_n, mel_ce, mel_n, mel_ok = sums
    return torch.stack([total, text_ce / text_n.clamp(min=1.0), mel_ce / mel_n.clamp(min=1.0),
                        mel_ok / mel_n.clamp(min=1.0), grad_norm.detach().to(sums.device, torch.float64)])


def validate(run: Run) -> dict:
    """Validation per group (validation.py) over this rank's shard, in manifest order: {"total", "groups"}.

    An OOM halves the micro-batch and retries.
    """
    while True:
        try:
            return evaluate_groups(run.model, run.val.dataset, run.val.groups, batch_size=run.plan.micro_batch,
                                   config=run.config, device=run.device, num_workers=run.plan.num_workers,
                                   dist_info=run.dist, autocast=run.autocast)
        except Exception as exc:  # only OOM is handled here; everything else propagates unchanged
            if not is_oom_error(exc):
                raise
            run.plan = halve_for_oom(run.plan, exc)
            run.log.warn(f"CUDA out of memory in validation; retrying with micro-batch {run.plan.micro_batch}")
