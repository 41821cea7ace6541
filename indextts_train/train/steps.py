"""One optimizer step: its micro-batches, forward and backward, the guarded update, and its CUDA
out-of-memory handling (the gradients cleared, the micro-batch halved, the same samples again).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import TYPE_CHECKING

import torch

from indextts_train.data.manifest import make_loader
from indextts_train.data.sampling import ResumableBatchSampler
from indextts_train.distributed import all_reduce_sum, any_rank
from indextts_train.errors import LoaderDied, UserError, user_line
from indextts_train.files.faults import crash_point, nan_loss_at
from indextts_train.model.gpt import Batch
from indextts_train.train.guard import collate_skipping
from indextts_train.train.hardware import halve_for_oom, is_oom_error

if TYPE_CHECKING:
    from indextts_train.train.run import RunSpec, RunState
    from indextts_train.ui.console import RunLogger


class EndAfterSaving(Exception):
    """A mid-run error that ends the run (exit 2) once the completed steps are saved (loop.run_to_end
    saves them): its one line, then what is kept, then what to do."""

    def __init__(self, line: str, then: str) -> None:
        super().__init__(line)
        self.line, self.then = line, then


def bad_data(error: UserError) -> EndAfterSaving:
    """A bad sample ends the run (exit 2) with the last completed step saved; so does a data-loader worker that
    died (LoaderDied), whose line blames no line of the data."""
    if isinstance(error, LoaderDied):
        return EndAfterSaving(user_line(error), "then rerun with --resume auto")
    return EndAfterSaving(user_line(error), "fix or remove the line (`indextts-train check-data` lists every bad "
                          "line) or pass --skip-bad-lines, then rerun with --resume auto")


StepBatches = list[tuple[Batch | None, list[str]]]  # per micro-batch: its good samples, the bad ones' reasons


def micro_batches(run: RunSpec, state: RunState) -> Iterator[tuple[Batch | None, list[str]]]:
    """This rank's micro-batches from the current sample of the epoch onward.

    Rebuilt only at an epoch change, a resume or an OOM retry; slicing the epoch order at
    `samples_in_epoch` is what makes a resume cost nothing and an OOM retry see the same samples.
    """
    plan, progress = state.layout, state.progress
    sampler = ResumableBatchSampler(
        run.orders(progress.epoch), micro_batch=plan.micro_batch, start_sample=progress.samples_in_epoch,
        world_size=plan.world_size, rank=run.dist.rank)
    return iter(make_loader(run.dataset, sampler, plan.num_workers, run.device.type == "cuda",
                            collate_fn=collate_skipping))


def step_is_finite(loss: torch.Tensor, grad_norm: torch.Tensor, *, scaled: bool) -> bool:
    """Whether the divergence guard lets this step update the weights (guard.py): its loss and gradient
    norm are finite. The guard's one read of the device per step (never per micro-batch).

    With the fp16 gradient scaler (`scaled`) a gradient that overflowed under a finite loss is the
    scaler's ordinary skip (it lowers its scale and `scaler.step` updates nothing), not a divergence.
    """
    grads_ok = torch.isfinite(grad_norm) | scaled
    return bool((torch.isfinite(loss) & grads_ok).item())


def next_step(run: RunSpec, state: RunState, batches: Iterator | None) -> tuple[StepBatches, Iterator]:
    """The step's micro-batches, all loaded before any compute, and the iterator they come from (`batches`,
    or a new one when it is None: at an epoch's start, a resume or an OOM retry); a bad sample ends
    the run (bad_data).

    Loading first means a bad sample costs no half-done step, and every rank learns of it at the
    same step (a rank that stopped alone would leave the others waiting in an all-reduce).
    """
    if batches is None:
        batches = micro_batches(run, state)
    error = None
    try:
        step_batches = [next(batches) for _ in range(state.layout.grad_accumulation)]
        if run.dist.enabled and any(batch is None for batch, _ in step_batches):
            raise UserError("every sample of a micro-batch failed to load, which --skip-bad-lines cannot "
                            "skip with several processes: " + step_batches[0][1][0])
    except UserError as exc:
        error = exc
    if any_rank(error is not None, run.dist, run.device):
        raise bad_data(error or UserError("another rank found a bad sample (see its message)"))
    return step_batches, batches


def _accumulate_or_oom(run: RunSpec, state: RunState, step_batches: StepBatches,
                       step: int) -> tuple[torch.Tensor | None, str | None]:
    """(_accumulate's sums, None), or (None, the first line of a CUDA OOM) with the gradients cleared."""
    try:
        return _accumulate(run, state, step_batches, step), None
    except Exception as exc:  # only OOM is handled here; everything else propagates unchanged
        if not is_oom_error(exc):
            raise
        state.optim.optimizer.zero_grad(set_to_none=True)
        if run.device.type == "cuda":
            torch.cuda.empty_cache()
        return None, str(exc).splitlines()[0] if str(exc) else type(exc).__name__


def _retry_smaller(state: RunState, log: RunLogger, message: str) -> None:
    """The same samples again at half the micro-batch; at micro-batch 1 the run ends (exit 2) with the
    steps since the last checkpoint saved (the failed step changed nothing: its gradients were cleared)."""
    try:
        state.layout = halve_for_oom(state.layout, RuntimeError(message))
    except UserError as exc:
        raise EndAfterSaving(user_line(exc), "then rerun with --resume auto") from None
    log.warn(f"CUDA out of memory at step {state.progress.step + 1} ({message}); retrying the same samples with "
             f"micro-batch {state.layout.micro_batch} x accumulation {state.layout.grad_accumulation}")


def _accumulate(run: RunSpec, state: RunState, step_batches: StepBatches, step: int) -> torch.Tensor:
    """Forward and backward over the step's micro-batches.

    Returns the logged sums (6,) float64 *on the device*: total loss, text_ce, text_count, mel_ce,
    mel_count, mel_correct. Nothing here waits for the device: a `.item()` per micro-batch would
    stop the CPU from queueing the next kernels until the GPU caught up.
    """
    accumulation, wrapped, autocast = state.layout.grad_accumulation, run.wrapped, run.autocast
    non_blocking = run.device.type == "cuda"  # batches come from pinned memory there
    sums = torch.zeros(6, dtype=torch.float64, device=run.device)
    for micro, (batch, _) in enumerate(step_batches):
        if batch is None:  # every sample of it failed to load (--skip-bad-lines, one process)
            continue
        # DDP: all-reduce gradients only on the last micro-batch of the step.
        last = micro == accumulation - 1
        sync = contextlib.nullcontext() if last or not run.dist.enabled else wrapped.no_sync()
        with sync:
            with autocast():
                text_loss, mel_loss, *counts = wrapped(batch.to(run.device, non_blocking=non_blocking))
                loss = run.config.train.loss(text_loss, mel_loss)
                if nan_loss_at(step):
                    loss = loss * float("nan")
            state.optim.scaler.scale(loss / accumulation).backward()
        crash_point("accumulation", step)
        sums += torch.stack([loss.detach().double() / accumulation, *(c.detach().double() for c in counts)])
    return sums


def optimizer_step(run: RunSpec, state: RunState, step_batches: StepBatches, step: int,
                   log: RunLogger) -> tuple[torch.Tensor, bool] | None:
    """One optimizer step over the step's micro-batches.

    Returns [loss, text_loss, mel_loss, mel_top1, grad_norm] for logging as a (5,) float64 tensor on
    the device (the loop reads it once per log interval, and once per step for a terminal's live
    line), and whether the step was applied: a step whose loss or gradient norm is not finite
    changes no weight and no optimizer moment (the scheduler still advances with the step count).
    A CUDA OOM clears the gradients and halves the micro-batch: None, retry the same samples.
    """
    optim = state.optim
    sums, oom = _accumulate_or_oom(run, state, step_batches, step)
    if oom is not None:
        _retry_smaller(state, log, oom)
        return None
    for _, skipped in step_batches:  # counted once the step went through (an OOM retry loads them again)
        state.data.add_skipped(skipped)
    run.freezer.mask_grads()  # frozen rows: no update, and no weight in the clipping norm
    optim.scaler.unscale_(optim.optimizer)
    grad_norm = torch.nn.utils.clip_grad_norm_([p for _, p in state.weights.trainable], run.config.train.grad_clip)
    finite_here = step_is_finite(sums[0], grad_norm, scaled=optim.scaler.is_enabled())
    finite = not any_rank(not finite_here, run.dist, run.device)
    if finite:
        optim.scaler.step(optim.optimizer)
        run.freezer.restore()  # undo AdamW's decoupled decay and stale momentum on the frozen rows
    optim.scaler.update()  # fp16: a skipped step lowers the scale, as the scaler's own skip would
    optim.scheduler.step()
    optim.optimizer.zero_grad(set_to_none=True)
    if run.dist.enabled:  # log the whole effective batch, not rank 0's share
        sums[0] /= run.dist.world_size
        all_reduce_sum(sums, run.dist)
    total, text_ce, text_n, mel_ce, mel_n, mel_ok = sums
    metrics = torch.stack([total, text_ce / text_n.clamp(min=1.0), mel_ce / mel_n.clamp(min=1.0),
                           mel_ok / mel_n.clamp(min=1.0), grad_norm.detach().to(sums.device, torch.float64)])
    return metrics, finite
