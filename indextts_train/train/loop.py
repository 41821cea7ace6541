"""The training loop, top to bottom.

`train(options)` is all of `train-gpt`: `setup` (setup.py) builds the run, then `loop` runs one
optimizer step per iteration. Exact resume rests on four rules kept here:
  1. Checkpoints are taken only at optimizer-step boundaries, after validation, and hold everything
     that decides what happens next (weights, the matched optimizer/scheduler/scaler set, the data
     position in samples, every RNG, the divergence guard's counters, the skipped samples).
  2. The data order is a pure function of (seed, epoch) and the position is counted in samples, so
     a resumed run slices the order where the killed one stopped (no replay).
  3. Nothing but the model's dropout draws from the global torch RNG during the loop (data loaders
     get a private generator), so restoring the RNG restores the dropout masks.
  4. Signals only set a flag; the loop saves at the next step boundary.
Nothing is lost: a non-finite step updates nothing and a streak of them stops the run
(exit 3) naming the last good checkpoint; a bad sample found mid-run saves the last completed step
before exit 2; no checkpoint with a NaN/Inf tensor is written.
"""

from __future__ import annotations

import contextlib
import functools
import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import torch

from indextts_train.checkpoint.async_save import BackgroundSaver, cpu_snapshot
from indextts_train.checkpoint.files import BEST, NonFiniteStateError, protected_name_error, publish, save_checkpoint
from indextts_train.checkpoint.lineage import describe_set_aside, owned_by, set_aside
from indextts_train.checkpoint.state import nonfinite_problem
from indextts_train.data.sampling import epoch_length
from indextts_train.data.workers import reap_workers
from indextts_train.distributed import any_rank, barrier, setup_distributed, teardown_distributed
from indextts_train.errors import UserError, user_line
from indextts_train.files.faults import crash_point
from indextts_train.train.best import judge, verdict
from indextts_train.train.guard import EXIT_DIVERGED, diverged_message
from indextts_train.train.hardware import halve_for_oom, prepare_exact_resume_env
from indextts_train.train.optim import lr_factor
from indextts_train.train.setup import Run, setup
from indextts_train.train.steps import OutOfMemory, fetch_step, micro_batches, optimizer_step, validate
from indextts_train.train.validation import describe, scalars
from indextts_train.ui.console import RunLogger
from indextts_train.ui.run_record import TextLog
from indextts_train.ui.run_settings import RunSettings, resolve_settings

__all__ = ["RunSettings", "SignalFlag", "lr_factor", "train", "resolve_settings"]

EXIT_BY_SIGNAL = {signal.SIGINT: 130, signal.SIGTERM: 143, signal.SIGHUP: 129}
METRICS = ("loss", "text_loss", "mel_loss", "mel_top1", "grad_norm")  # what optimizer_step returns


class SetupInterrupted(BaseException):
    """A stop signal during setup (indexing, reading checkpoints, building the model): nothing has been
    trained, so there is nothing to save; the run ends at once. A BaseException, like KeyboardInterrupt,
    so that no `except Exception` on the way turns it into another error."""

    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum


class SignalFlag:
    """During setup (`in_setup`, a single-process run): the first SIGINT/SIGTERM/SIGHUP raises SetupInterrupted.

    Then: first signal, finish the step, save, exit. Second: exit at once.

    Exiting at once is safe because checkpoints are published atomically: the worst a second
    Ctrl+C leaves behind is a temp file that the next save removes. A SIGTERM or SIGHUP within
    DUPLICATE_WINDOW_S of the first signal is the same stop delivered twice (to every process of the
    job and again by a launcher such as torchrun that forwards it), not a request to hurry; a second
    Ctrl+C is always one.
    """

    DUPLICATE_WINDOW_S = 2.0

    def __init__(self, *, announce: bool = True, in_setup: bool = False) -> None:
        self.signum: int | None = None
        self.announce = announce  # rank 0 only: torchrun forwards a signal to every rank
        self.in_setup = in_setup  # until the loop starts: a stop then ends the process without a step
        self._first_at = 0.0
        self._previous = {signum: signal.signal(signum, self._handle) for signum in EXIT_BY_SIGNAL}

    def uninstall(self) -> None:
        for signum, handler in self._previous.items():
            signal.signal(signum, handler)

    def _handle(self, signum: int, frame: object) -> None:
        name = "Ctrl+C" if signum == signal.SIGINT else signal.Signals(signum).name
        if self.signum is None and self.in_setup:
            self.signum = signum
            self._say(f"{name} during setup, before the first step: stopping now; nothing was trained, nothing "
                      "is saved, and no checkpoint was changed")
            raise SetupInterrupted(signum)
        if self.signum is None:
            self.signum, self._first_at = signum, time.monotonic()
            self._say(f"{name}: stopping after this step with a checkpoint ({name} again exits at once, unsaved)")
            return
        if signum != signal.SIGINT and time.monotonic() - self._first_at <= self.DUPLICATE_WINDOW_S:
            return  # the same stop, delivered again
        self._say(f"{name} again: exiting now without saving (exit {EXIT_BY_SIGNAL[signum]}); the last "
                  "checkpoint is intact, rerun with --resume auto to continue from it")
        os._exit(EXIT_BY_SIGNAL[signum])

    def _say(self, line: str) -> None:
        if self.announce:  # os.write: unbuffered, and safe while the status line or a print holds stdout
            with contextlib.suppress(OSError):  # a closed terminal or pipe: the stop goes on unsaid
                os.write(2, f"\n{line}\n".encode())

    @property
    def exit_code(self) -> int:
        return EXIT_BY_SIGNAL.get(self.signum, 0) if self.signum is not None else 0


class Diverged(Exception):
    """The run stops with EXIT_DIVERGED; the message names the last good checkpoint."""


def train(options: RunSettings) -> int:
    """Run `train-gpt`. Returns the exit code: 0 done, 3 diverged, 130/143/129 after a safe save on a signal."""
    # Several ranks stop together at a step boundary (any_rank): one rank leaving setup alone would
    # leave the others waiting in a collective, so only a single process stops in setup at once.
    single = os.environ.get("WORLD_SIZE", "1") == "1"
    signals = SignalFlag(announce=os.environ.get("RANK", "0") == "0", in_setup=single)
    prepare_exact_resume_env()  # before anything starts CUDA (setup_distributed may)
    dist = setup_distributed()
    run: Run | None = None
    text_log = TextLog()  # this start's clock; its lines go to OUTPUT_DIR/train.log once setup claims the folder
    try:
        run = setup(options, dist, text_log)
        signals.in_setup = False
        return loop(run, signals)
    except SetupInterrupted as stop:  # setup released the lock and removed its temp files on the way out
        return EXIT_BY_SIGNAL[stop.signum]
    except Diverged as stop:
        run.log.stop()
        run.log.info(str(stop), "diverged")
        return EXIT_DIVERGED
    except UserError as exc:
        if run is not None:  # setup writes its own refusals; this is one found mid-run (bad data, disk full)
            run.log.stop()
            text_log.record(text_log.stamp(f"error: {user_line(exc)}"), "error")
        raise
    finally:
        if run is not None and run.saver is not None:
            with contextlib.suppress(Exception):  # an exception is on its way: a started save still ends
                run.saver.wait()
        if run is not None:  # every exit, errors included: the terminal's status line and TensorBoard end
            run.log.close()
        reap_workers()
        if run is not None and run.lock is not None:
            run.lock.release()
        signals.uninstall()
        text_log.close()
        teardown_distributed(dist)


def loop(run: Run, signals: SignalFlag) -> int:
    """One iteration = one optimizer step; logging, validation and saving at their intervals."""
    if not begin(run):
        return 0
    progress, train = run.progress, run.config.train
    clock = (time.perf_counter(), progress.samples_total)
    batches: Iterator | None = None
    run.saver = BackgroundSaver() if train.async_save else None
    exit_code = 0
    while progress.step < run.total_steps:
        if end_of_epoch(run):
            progress.epoch, progress.samples_in_epoch, batches = progress.epoch + 1, 0, None
        if batches is None:
            batches = micro_batches(run)
        step_batches = fetch_step(run, batches)
        if isinstance(step_batches, UserError):
            raise stop_for_bad_data(run, step_batches)
        try:
            metrics, finite = optimizer_step(run, step_batches, step=progress.step + 1)
        except OutOfMemory as oom:
            retry_smaller(run, oom)
            batches = None
            continue
        progress.step += 1
        progress.samples_in_epoch += run.plan.effective_batch
        progress.samples_total += run.plan.effective_batch
        count_step(run, metrics, finite)  # a good step's metrics join history.pending, on the device until read
        if run.history.pending and due(run, train.log_interval):
            clock = log_window(run, clock)
        elif run.log.interactive:  # the live line on a terminal: one device->host read per step, not per micro-batch
            values = window_values(run, clock) if run.history.pending else None
            run.log.train_step(progress.step, progress.epoch, values, print_line=False)
        crash_point("step_logged", progress.step)
        new_best, ending = validation(run) if run.val is not None and due(run, train.val_interval) else (False, None)
        stop = any_rank(signals.signum is not None, run.dist, run.device)
        save_when_due(run, stop, best=new_best, ending=ending is not None)
        if ending:  # early stop or forgetting limit: a planned end, exit 0
            run.log.info(ending, "end", step=progress.step)
            break
        if stop:
            exit_code = signals.exit_code or 143
            run.log.stop()
            run.log.stopped(progress.step, exit_code)
            break
    wait_for_save(run)  # the last checkpoint is on disk before the run reports done or stopped
    finish(run, exit_code)
    return exit_code


def count_step(run: Run, metrics: torch.Tensor, finite: bool) -> None:
    """A good step's metrics go to history.pending; a skipped one is counted, said, and may end the run."""
    run.guard.record(finite)
    if finite:
        # An fp16 overflow step is finite for the guard (the scaler skipped it) but its gradient norm
        # is Inf: NaN marks it, and the window mean leaves it out. On the device: no read per step.
        grad_norm = metrics[4]
        metrics[4] = torch.where(torch.isfinite(grad_norm), grad_norm, torch.full_like(grad_norm, float("nan")))
        run.history.pending.append(metrics)
        return
    loss, grad_norm = metrics[[0, 4]].tolist()  # a skipped step is rare: its own read of the device
    run.log.warn(run.guard.skipped_line(loss, grad_norm))
    if run.guard.should_stop:
        wait_for_save(run)  # the last good checkpoint named below is on disk
        raise Diverged(run.guard.stop_message(run.last_saved, run.last_saved_step))


def save_when_due(run: Run, stop: bool, *, best: bool = False, ending: bool = False) -> None:
    """Save at the interval, a new best, the last step, an early end and a stop.

    A periodic save inside a streak of skipped steps waits for the next good step, so rotation never
    trades the last checkpoint before a divergence for one written during it. The wait is part of the
    progress (progress.save_pending): a stop or a best taken inside the streak does not settle it, and
    a resumed run still owes it, as the uninterrupted run does.
    """
    progress = run.progress
    periodic = progress.step % run.config.train.save_interval == 0 or bool(progress.save_pending)
    must = stop or ending or progress.step == run.total_steps
    progress.save_pending = int(periodic and run.guard.in_streak)  # saved with the checkpoint below
    if must or best or (periodic and not run.guard.in_streak):
        save(run, must=must, best=best)


def save_before_exit(run: Run) -> str:
    """Save the last completed step (unless it is on disk already); says what is kept."""
    wait_for_save(run)
    step = run.progress.step
    if run.last_saved_step != step and step > 0:
        run.log.stop()
        save(run)
        wait_for_save(run)
    saved = run.last_saved if run.last_saved_step == step else None
    return (f"step {step}, the last completed one, is saved in {saved}" if saved is not None
            else "no step was completed, nothing to save")


def stop_for_bad_data(run: Run, error: UserError) -> UserError:
    """Save the last completed step (unless it is on disk already); the error to exit 2 with."""
    kept = save_before_exit(run)
    return UserError(f"{user_line(error)}; {kept}; fix or remove the line (`indextts-train check-data` lists every "
                     "bad line) or pass --skip-bad-lines, then rerun with --resume auto")


def begin(run: Run) -> bool:
    """Open the run's log and TensorBoard, put the RNG in place; False when there is nothing to do."""
    options, progress, plan = run.options, run.progress, run.plan
    options.output_dir.mkdir(parents=True, exist_ok=True)
    run.log = RunLogger(options.output_dir, run.total_steps, enabled=run.dist.is_main,
                        tensorboard=options.tensorboard, start_step=progress.step, text_log=run.log.text_log)
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
                 f"sample {progress.samples_in_epoch})", "begin", step=progress.step, total=run.total_steps)
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
    """The same samples again at half the micro-batch; at micro-batch 1 the run ends (exit 2) with the
    steps since the last checkpoint saved (the failed step changed nothing: its gradients were cleared)."""
    try:
        run.plan = halve_for_oom(run.plan, RuntimeError(oom.message))
    except UserError as exc:
        raise UserError(f"{user_line(exc)}; {save_before_exit(run)}; then rerun with --resume auto") from None
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


def window_mean(rows: list) -> list[float]:
    """The mean of each metric over the window's rows; a NaN (an fp16 overflow step's gradient norm)
    is left out of its column's mean, and a column with nothing else is NaN."""
    table = np.asarray(rows, dtype=np.float64)  # (steps, metrics)
    kept = np.isfinite(table)
    counts = kept.sum(axis=0)
    sums = np.where(kept, table, 0.0).sum(axis=0)
    return np.where(counts > 0, sums / np.maximum(counts, 1), np.nan).tolist()


def window_values(run: Run, clock: tuple[float, int]) -> dict[str, float]:
    """Mean metrics of the steps since the last line, the LR, and samples/s since `clock`."""
    run.history.pending = host_rows(run.history.pending)
    now, samples = time.perf_counter(), run.progress.samples_total
    values = dict(zip(METRICS, window_mean(run.history.pending), strict=True))
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


def checked_validate(run: Run) -> dict:
    """validate(run); a bad validation sample stops the run (exit 2) with the completed steps saved."""
    try:
        return validate(run)
    except UserError as exc:
        raise stop_for_bad_data(run, exc) from None


def baseline(run: Run) -> bool:
    """Validate the model before its first step (the base model: the forgetting report's reference), or on a
    resume say why there is nothing to do when the run already ended early. False: nothing to do."""
    history, val = run.history, run.val
    if run.progress.step == 0 and history.baseline is None:
        result = checked_validate(run)
        history.record_baseline(result)
        run.log.scalars("val", scalars(result), 0)
        run.log.validated(0, describe(0, result, None, " (before training)"), result)
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
    result = checked_validate(run)  # a bad validation sample: the step is done, keep it
    step, history, val = run.progress.step, run.history, run.val
    history.record_validation(step, result)
    run.log.scalars("val", scalars(result), step)
    run.log.validated(step, describe(step, result, history.baseline), result)
    return judge(val.tracker, result, step, baseline=history.baseline, limits=val.limits, patience=val.patience)


def diverged(run: Run, problem: str) -> Diverged:
    return Diverged(diverged_message(problem, run.last_saved, run.last_saved_step))


def wait_for_save(run: Run) -> None:
    """The background save in flight (--async-save) is on disk, or its error raised here."""
    if run.saver is not None:
        try:
            run.saver.wait()
        except NonFiniteStateError as exc:
            raise diverged(run, str(exc)) from None


def nonfinite_now(run: Run) -> str | None:
    """Why the weights or optimizer moments hold a NaN/Inf, or None; one read of the device.

    Every rank holds the same weights, so every rank reaches the same answer and stops together.
    """
    tensors = [p.detach() for p in run.model.parameters()]
    tensors += [v for slots in run.optim.optimizer.state.values() for v in slots.values()
                if isinstance(v, torch.Tensor) and v.is_floating_point() and v.dim() > 0]
    if not tensors or bool(torch.stack([torch.isfinite(t).all() for t in tensors]).all()):
        return None
    return nonfinite_problem(run.weights.state_dict(), run.optim.optimizer.state_dict())


def save(run: Run, *, must: bool = True, best: bool = False) -> Path | None:
    """Checkpoint at this step boundary (rank 0 writes; every rank contributes its RNG); `best` publishes
    best.pth. Returns the file it writes (None on other ranks, or when it was skipped).

    With `run.saver` (--async-save) the state is snapshotted to CPU memory here and written by a
    background thread while training goes on (async_save.py); best.pth is published by that write too.
    `must=False`: a periodic or best save, skipped with a warning when its file name belongs to a file
    the run must not touch. A state with a NaN/Inf tensor is never written: the run stops instead.
    """
    progress, output_dir, train = run.progress, run.options.output_dir, run.config.train
    step = progress.step
    refused = protected_name_error(output_dir, step, run.protected)  # the same answer on every rank
    if refused is not None:
        if must:
            raise refused
        run.log.warn(f"{refused}; the next save goes on")
        return None
    problem = nonfinite_now(run)
    if problem is not None:
        wait_for_save(run)
        raise diverged(run, f"not saving step {step}: {problem}")
    run.log.flush()  # TensorBoard holds everything up to this step before the checkpoint exists
    run.history.pending = host_rows(run.history.pending)  # the checkpoint stores plain floats
    state = run.checkpoint_state()
    path = None
    if state is not None:
        log, keep, keep_every, protected = run.log, train.keep_checkpoints, train.keep_every, run.protected
        own = owned_by(run.lineage)
        if run.new_branch:  # before its first file: the abandoned branch's names must not be clobbered
            set_aside_abandoned(run)
        at = {"step": step, "total": run.total_steps, "epoch": progress.epoch, "sample": progress.samples_in_epoch}

        def write(state: dict) -> None:
            written = save_checkpoint(state, output_dir, step, keep=keep, keep_every=keep_every, best=best,
                                      protected=protected, own=own)
            log.saved(written, best=best, **at)
            run.saved(written, step)

        path = output_dir / f"model_step{step}.pth"
        if run.saver is None:
            write(state)
        else:
            wait_for_save(run)
            run.saver.start(functools.partial(write, cpu_snapshot(state)))
    barrier(run.dist)
    return path


def set_aside_abandoned(run: Run) -> None:
    """A new branch's first save: the files of the branch it left go under abandoned/ (lineage.py)."""
    output_dir = run.options.output_dir
    moved = set_aside(output_dir, run.lineage, run.protected)
    if moved:
        run.log.info(describe_set_aside(moved, run.lineage))
    run.new_branch = False
    # best.pth named an abandoned file: it names this branch's best again, if that file is still here.
    tracker = run.val.tracker if run.val is not None else None
    kept = output_dir / f"model_step{tracker.step}.pth" if tracker is not None and tracker.step is not None else None
    if kept is not None and kept.is_file() and not (output_dir / BEST).exists():
        publish(output_dir, kept, BEST, run.protected)


def finish(run: Run, exit_code: int) -> None:
    run.log.stop()
    skipped = run.data.skipped_summary()
    if skipped:  # one message: its time stamp heads the list, whose lines stay indented under it
        run.log.info("\n".join(skipped))
    if run.progress.bad_steps:
        run.log.info(f"{run.progress.bad_steps} step(s) had a non-finite loss or gradient norm and were skipped")
    if exit_code == 0:
        progress = run.progress
        best = run.val.tracker.describe() if run.val is not None else "no best.pth (no --val-manifest)"
        run.log.done(progress.step, progress.epoch + 1, best, run.options.output_dir)
    run.log.close()
