"""The training loop, top to bottom.

`train(options)` is all of `train-gpt`: `setup` (run.py) builds the run, then `loop` runs one
optimizer step per iteration. Exact resume rests on four rules kept here:
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

import functools
import os
import signal
import time
from collections.abc import Iterator

import numpy as np
import torch

from indextts_train.async_save import BackgroundSaver, cpu_snapshot
from indextts_train.best import judge, verdict
from indextts_train.checkpoint import save_checkpoint
from indextts_train.config import TrainOptions
from indextts_train.console import RunLogger
from indextts_train.distributed import any_rank, barrier, setup_distributed, teardown_distributed
from indextts_train.faults import crash_point
from indextts_train.hardware import halve_for_oom
from indextts_train.model import Batch
from indextts_train.optim import lr_factor
from indextts_train.run import Run, setup
from indextts_train.sampling import epoch_length
from indextts_train.steps import OutOfMemory, micro_batches, optimizer_step, validate
from indextts_train.validation import describe, scalars

__all__ = ["SignalFlag", "TrainOptions", "lr_factor", "train"]

EXIT_BY_SIGNAL = {signal.SIGINT: 130, signal.SIGTERM: 143, signal.SIGHUP: 129}
METRICS = ("loss", "text_loss", "mel_loss", "mel_top1", "grad_norm")  # what optimizer_step returns


class SignalFlag:
    """First SIGINT/SIGTERM/SIGHUP: finish the step, save, exit. Second: exit at once.

    Exiting at once is safe because checkpoints are published atomically: the worst a second
    Ctrl+C leaves behind is a temp file that the next save removes.
    """

    def __init__(self, *, announce: bool = True) -> None:
        self.signum: int | None = None
        self.announce = announce  # rank 0 only: torchrun forwards a signal to every rank
        self._previous = {signum: signal.signal(signum, self._handle) for signum in EXIT_BY_SIGNAL}

    def uninstall(self) -> None:
        for signum, handler in self._previous.items():
            signal.signal(signum, handler)

    def _handle(self, signum: int, frame: object) -> None:
        name = "Ctrl+C" if signum == signal.SIGINT else signal.Signals(signum).name
        if self.signum is not None:
            self._say(f"{name} again: exiting now without saving (exit {EXIT_BY_SIGNAL[signum]}); the last "
                      "checkpoint is intact, rerun with --resume auto to continue from it")
            os._exit(EXIT_BY_SIGNAL[signum])
        self.signum = signum
        self._say(f"{name}: stopping after this step with a checkpoint ({name} again exits at once, unsaved)")

    def _say(self, line: str) -> None:
        if self.announce:  # os.write: unbuffered, and safe while the status line or a print holds stdout
            os.write(2, f"\n{line}\n".encode())

    @property
    def exit_code(self) -> int:
        return EXIT_BY_SIGNAL.get(self.signum, 0) if self.signum is not None else 0


def train(options: TrainOptions) -> int:
    """Run `train-gpt`. Returns the exit code: 0 done, 130/143/129 after a safe save on a signal."""
    signals = SignalFlag(announce=os.environ.get("RANK", "0") == "0")
    dist = setup_distributed()
    try:
        return loop(setup(options, dist), signals)
    finally:
        signals.uninstall()
        teardown_distributed(dist)


def loop(run: Run, signals: SignalFlag) -> int:
    """One iteration = one optimizer step; logging, validation and saving at their intervals."""
    if not begin(run):
        return 0
    progress, train = run.progress, run.config.train
    clock = (time.perf_counter(), progress.samples_total)
    batches: Iterator[Batch] | None = None
    saver = BackgroundSaver() if train.async_save else None
    exit_code = 0
    while progress.step < run.total_steps:
        if end_of_epoch(run):
            progress.epoch, progress.samples_in_epoch, batches = progress.epoch + 1, 0, None
        if batches is None:
            batches = micro_batches(run)
        try:
            metrics = optimizer_step(run, batches, step=progress.step + 1)
        except OutOfMemory as oom:
            retry_smaller(run, oom)
            batches = None
            continue
        progress.step += 1
        progress.samples_in_epoch += run.plan.effective_batch
        progress.samples_total += run.plan.effective_batch
        run.history.pending.append(metrics)  # the steps since the last log line, on the device until read
        if due(run, train.log_interval):
            clock = log_window(run, clock)
        elif run.log.interactive:  # the live line on a terminal: one device->host read per step, not per micro-batch
            run.log.train_step(progress.step, progress.epoch, window_values(run, clock), print_line=False)
        crash_point("step_logged", progress.step)
        new_best, ending = validation(run) if run.val is not None and due(run, train.val_interval) else (False, None)
        stop = any_rank(signals.signum is not None, run.dist, run.device)
        if due(run, train.save_interval) or stop or new_best or ending:
            save(run, saver, best=new_best)
        if ending:  # early stop or forgetting limit: a planned end, exit 0
            run.log.info(ending)
            break
        if stop:
            exit_code = signals.exit_code or 143
            run.log.stop()
            run.log.info(f"stopped by signal after step {progress.step}; rerun the same command with "
                         f"--resume auto to continue (exit {exit_code})")
            break
    if saver is not None:
        saver.wait()  # the last checkpoint is on disk before the run reports done or stopped
    finish(run, exit_code)
    return exit_code


def begin(run: Run) -> bool:
    """Open the run's log and TensorBoard, put the RNG in place; False when there is nothing to do."""
    options, progress, plan = run.options, run.progress, run.plan
    options.output_dir.mkdir(parents=True, exist_ok=True)
    run.log = RunLogger(options.output_dir, run.total_steps, enabled=run.dist.is_main,
                        tensorboard=options.tensorboard, start_step=progress.step)
    if progress.step >= run.total_steps:
        run.log.info(f"nothing to do: the run in {options.output_dir} already reached step {progress.step} "
                     f"of {run.total_steps}")
        run.log.close()
        return False
    run.start_rng()  # last: model building and data setup may draw random numbers
    if run.val is not None and not baseline(run):
        run.log.close()
        return False
    run.log.info(f"training {run.total_steps} steps: {epoch_length(run.schedule.sampler)} samples an epoch, "
                 f"effective batch {plan.effective_batch} = {plan.micro_batch} x {plan.grad_accumulation} x "
                 f"{plan.world_size}, starting at step {progress.step} (epoch {progress.epoch}, "
                 f"sample {progress.samples_in_epoch})")
    run.log.start(progress.step)
    run.wrapped.train()
    return True


def due(run: Run, interval: int) -> bool:
    """Every `interval` steps, and at the last step."""
    return run.progress.step % interval == 0 or run.progress.step == run.total_steps


def end_of_epoch(run: Run) -> bool:
    """Whether the next step would run past the epoch (its tail short of a step is dropped)."""
    usable = run.schedule.steps_per_epoch(run.plan.effective_batch) * run.plan.effective_batch
    return run.progress.samples_in_epoch + run.plan.effective_batch > usable


def retry_smaller(run: Run, oom: OutOfMemory) -> None:
    run.plan = halve_for_oom(run.plan)  # raises a UserError when the micro-batch is already 1
    run.log.warn(f"CUDA out of memory at step {run.progress.step + 1} ({oom.message}); retrying the same "
                 f"samples with micro-batch {run.plan.micro_batch} x accumulation {run.plan.grad_accumulation}")


def host_rows(pending: list) -> list:
    """`pending` with its device tensors (this process's steps) as plain float rows, read together.

    The steps' metrics stay on the device until a line, a live status update or a checkpoint needs
    them: one device->host read then, none per micro-batch. Rows from a checkpoint are floats already.
    """
    on_device = [i for i, row in enumerate(pending) if isinstance(row, torch.Tensor)]
    if not on_device:
        return pending
    rows = list(pending)
    for i, values in zip(on_device, torch.stack([pending[i] for i in on_device]).tolist(), strict=True):
        rows[i] = values
    return rows


def window_values(run: Run, clock: tuple[float, int]) -> dict[str, float]:
    """Mean metrics of the steps since the last line, the LR, and samples/s since `clock`."""
    run.history.pending = host_rows(run.history.pending)
    now, samples = time.perf_counter(), run.progress.samples_total
    values = dict(zip(METRICS, np.mean(run.history.pending, axis=0).tolist(), strict=True))
    values["lr"] = run.optim.scheduler.get_last_lr()[0]
    values["samples_per_s"] = (samples - clock[1]) / max(now - clock[0], 1e-9)
    return values


def log_window(run: Run, clock: tuple[float, int]) -> tuple[float, int]:
    """One line for the steps since the last: history, TensorBoard, console. Returns the new clock."""
    values = window_values(run, clock)
    run.history.record_train(run.progress.step, values)
    run.history.pending = []
    run.log.scalars("train", values, run.progress.step)
    run.log.train_step(run.progress.step, run.progress.epoch, values, print_line=True)
    return time.perf_counter(), run.progress.samples_total


def baseline(run: Run) -> bool:
    """Validate the model before its first step (the base model: the forgetting report's reference), or on a
    resume say why there is nothing to do when the run already ended early. False: nothing to do."""
    history, val = run.history, run.val
    if run.progress.step == 0 and history.baseline is None:
        history.baseline = validate(run)
        run.log.scalars("val", scalars(history.baseline), 0)
        run.log.info(describe(0, history.baseline, None, " (before training)"))
        return True
    if val.limits and history.baseline is None:
        run.log.warn("this run recorded no validation of the base model (it started before that existed), so "
                     "--forgetting-limit cannot be checked")
    if history.last_val is None or history.last_val["step"] != run.progress.step:
        return True
    why = verdict(val.tracker, history.last_val, run.progress.step, baseline=history.baseline, limits=val.limits,
                  patience=val.patience)
    if why:
        run.log.info(f"nothing to do: the run in {run.options.output_dir} already ended ({why}); raise "
                     "--early-stop-patience or --forgetting-limit to continue it")
    return why is None


def validation(run: Run) -> tuple[bool, str | None]:
    """Validate, log (total and per language, with the change against the base model), judge best.pth.

    Returns (a new best: save and publish it now, why the run ends now or None).
    """
    result = validate(run)
    step, history, val = run.progress.step, run.history, run.val
    history.record_validation(step, result)
    run.log.scalars("val", scalars(result), step)
    run.log.info(describe(step, result, history.baseline))
    return judge(val.tracker, result, step, baseline=history.baseline, limits=val.limits, patience=val.patience)


def save(run: Run, saver: BackgroundSaver | None = None, *, best: bool = False) -> None:
    """Checkpoint at this step boundary (rank 0 writes; every rank contributes its RNG).

    With a `saver` (--async-save) the state is snapshotted to CPU memory here and written by a
    background thread while training goes on (async_save.py); best.pth is published by that write too.
    """
    run.log.flush()  # TensorBoard holds everything up to this step before the checkpoint exists
    run.history.pending = host_rows(run.history.pending)  # the checkpoint stores plain floats
    state = run.checkpoint_state()
    if state is not None:
        progress, output_dir, log, train = run.progress, run.options.output_dir, run.log, run.config.train
        step, keep, keep_every = progress.step, train.keep_checkpoints, train.keep_every
        where = f"step {step}, epoch {progress.epoch}, sample {progress.samples_in_epoch}"

        def write(state: dict) -> None:
            path = save_checkpoint(state, output_dir, step, keep=keep, keep_every=keep_every, best=best)
            log.info(f"saved {path} ({where}){', best.pth' if best else ''}")

        if saver is None:
            write(state)
        else:
            saver.start(functools.partial(write, cpu_snapshot(state)))
    barrier(run.dist)


def finish(run: Run, exit_code: int) -> None:
    run.log.stop()
    if exit_code == 0:
        progress = run.progress
        best = run.val.tracker.describe() if run.val is not None else "no best.pth (no --val-manifest)"
        logs = f", TensorBoard logs in {run.log.log_dir}" if run.log.log_dir else ""
        run.log.info(f"done: {progress.step} steps, {progress.epoch + 1} epoch(s), {best}; "
                     f"checkpoints in {run.options.output_dir} (latest.pth){logs}")
    run.log.close()
