"""The training loop, top to bottom.

`train(options)` is all of `train-gpt`: `setup` (setup.py) builds the run (run.py: its frozen spec,
its state, its services), then `loop` runs one optimizer step per iteration. Exact resume rests on
four rules kept here:
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
import os
import signal
import time
from collections.abc import Iterator

from indextts_train.checkpoint.async_save import BackgroundSaver
from indextts_train.checkpoint.files import BEST, LATEST, kept_names
from indextts_train.data.workers import reap_workers
from indextts_train.distributed import (
    any_rank,
    ddp_collectives,
    said_by_main,
    setup_distributed,
    teardown_distributed,
)
from indextts_train.errors import UserError, refusal
from indextts_train.files.faults import crash_point
from indextts_train.train.guard import EXIT_DIVERGED, Diverged, StreakStop, count_step
from indextts_train.train.hardware import prepare_exact_resume_env
from indextts_train.train.listening import Listener, listen_flags
from indextts_train.train.optim import lr_factor
from indextts_train.train.resume import restore_rng_for_rank
from indextts_train.train.run import RunSpec, RunState, Services
from indextts_train.train.saving import save_before_exit, save_when_due, wait_for_save
from indextts_train.train.setup import Started, setup
from indextts_train.train.steps import EndAfterSaving, next_step, optimizer_step
from indextts_train.train.validating import baseline, validation
from indextts_train.train.window import report_step
from indextts_train.ui.console import RunLogger
from indextts_train.ui.run_settings import RunSettings, resolve_settings
from indextts_train.ui.text_log import TextLog

__all__ = ["RunSettings", "SignalFlag", "lr_factor", "train", "resolve_settings"]

EXIT_BY_SIGNAL = {signal.SIGINT: 130, signal.SIGTERM: 143, signal.SIGHUP: 129}
EXIT_REFUSED = 2  # the code of every refusal (cli.run_guarded); a rank whose line rank 0 printed returns it


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


def train(options: RunSettings) -> int:
    """Run `train-gpt`. Returns the exit code: 0 done, 3 diverged, 130/143/129 after a safe save on a signal,
    2 on a rank whose refusal rank 0 printed (any other refusal is raised, for the CLI to print)."""
    # Several ranks stop together at a step boundary (any_rank): one rank leaving setup alone would
    # leave the others waiting in a collective, so only a single process stops in setup at once.
    single = os.environ.get("WORLD_SIZE", "1") == "1"
    signals = SignalFlag(announce=os.environ.get("RANK", "0") == "0", in_setup=single)
    prepare_exact_resume_env()  # before anything starts CUDA (setup_distributed may)
    dist = setup_distributed()
    started: Started | None = None
    services: Services | None = None
    text_log = TextLog()  # this start's clock; its lines go to OUTPUT_DIR/train.log once setup claims the folder
    try:
        started = setup(options, dist, text_log)
        signals.in_setup = False
        services = open_services(started)
        return run_to_end(started.run, started.state, services, signals, started.rng)
    except SetupInterrupted as stop:  # setup released the lock and removed its temp files on the way out
        return EXIT_BY_SIGNAL[stop.signum]
    except Diverged as stop:
        services.log.stop()
        services.log.info(str(stop), "diverged")
        return EXIT_DIVERGED
    except UserError as exc:
        if started is not None:  # setup writes its own refusals; this is one found mid-run (bad data, disk full)
            (services or started).log.stop()
            text_log.record(text_log.stamp(refusal(exc)), "error")
        if said_by_main(refusal(exc), dist):  # torchrun: the line once, not once a rank
            return EXIT_REFUSED
        raise
    finally:
        if services is not None and services.saver is not None:
            with contextlib.suppress(Exception):  # an exception is on its way: a started save still ends
                services.saver.wait()
        if started is not None:  # every exit, errors included: the terminal's status line and TensorBoard end
            (services or started).log.close()
        reap_workers()
        if started is not None and started.lock is not None:
            started.lock.release()
        signals.uninstall()
        text_log.close()
        teardown_distributed(dist)


def open_services(started: Started) -> Services:
    """The run's log (console, train.log, TensorBoard) from its first step on, its saver and listener."""
    run, train = started.run, started.run.config.train
    run.output_dir.mkdir(parents=True, exist_ok=True)
    log = RunLogger(run.output_dir, run.total_steps, enabled=run.dist.is_main, tensorboard=run.options.tensorboard,
                    start_step=started.state.progress.step, text_log=started.log.text_log)
    listener = (Listener(run.output_dir, listen_flags(train), log.info, log.warn)
                if train.listen_every and run.dist.is_main else None)  # rank 0 saves, and hears
    return Services(log, started.lock, BackgroundSaver() if train.async_save else None, listener)


def run_to_end(run: RunSpec, state: RunState, services: Services, signals: SignalFlag,
               rng: list[dict] | None) -> int:
    """Begin (`rng`: each rank's RNG stream to continue, None for a fresh run), loop, finish. A mid-run
    error (a bad sample, out of memory at micro-batch 1) ends the run, exit 2, once the completed
    steps are saved."""
    try:
        if not begin(run, state, services, rng):
            return 0
        with ddp_collectives(run.dist):  # a peer lost in DDP's own all-reduce (in backward): one line, no traceback
            exit_code = loop(run, state, services, signals)
    except EndAfterSaving as end:
        raise UserError(f"{end.line}; {save_before_exit(run, state, services)}; {end.then}") from None
    except StreakStop:
        wait_for_save(state, services)  # the last good checkpoint named below is on disk
        raise Diverged(state.guard.stop_message(state.last_saved, state.last_saved_step)) from None
    finish(run, state, services, exit_code)
    return exit_code


def loop(run: RunSpec, state: RunState, services: Services, signals: SignalFlag) -> int:
    """One iteration = one optimizer step; logging, validation and saving at their intervals. Returns the
    exit code: 0 at the end (or an early one), 130/143/129 after a safe save on a signal."""
    progress = state.progress
    log = services.log
    train = run.config.train
    clock = (time.perf_counter(), progress.samples_total)
    batches: Iterator | None = None
    exit_code = 0
    while progress.step < run.total_steps:
        if end_of_epoch(run, state):
            progress.epoch, progress.samples_in_epoch, batches = progress.epoch + 1, 0, None
        step_batches, batches = next_step(run, state, batches)  # a bad sample ends the run (EndAfterSaving)
        done = optimizer_step(run, state, step_batches, progress.step + 1, log)
        if done is None:  # out of memory: the same samples again at half the micro-batch
            batches = None
            continue
        progress.step += 1
        progress.samples_in_epoch += state.layout.effective_batch
        progress.samples_total += state.layout.effective_batch
        count_step(state.guard, state.history, log, *done)  # a good step's metrics join history.pending
        clock = report_step(state.history, progress, state.optim, log, clock,
                            line_due=due(run, state, train.log_interval))
        crash_point("step_logged", progress.step)
        validating = run.val is not None and due(run, state, train.val_interval)
        new_best, ending = validation(run, state, log) if validating else (False, None)
        if validating and run.dist.enabled:  # --best-metric listen/...: only rank 0 reads the scores, and so only
            # its patience moves; every rank ends with it (the others went on alone, and the job failed)
            agreed = any_rank(ending is not None, run.dist, run.device)  # every rank joins this collective
            ending = ending or ("rank 0 ended the run" if agreed else None)
        stop = any_rank(signals.signum is not None, run.dist, run.device)
        save_when_due(run, state, services, stop, best=new_best, ending=ending is not None)
        if ending:  # early stop or forgetting limit: a planned end, exit 0
            log.info(ending, "end", step=progress.step)
            break
        if stop:
            exit_code = signals.exit_code or 143
            log.stop()
            log.stopped(progress.step, exit_code)
            break
    wait_for_save(state, services)  # the last checkpoint is on disk before the run reports done or stopped
    return exit_code


def begin(run: RunSpec, state: RunState, services: Services, rng: list[dict] | None) -> bool:
    """Put the RNG in place and validate the base model; False when there is nothing to do."""
    progress, plan, log = state.progress, run.plan, services.log
    if progress.step >= run.total_steps:
        log.info(f"nothing to do: the run in {run.output_dir} already reached step {progress.step} "
                 f"of {run.total_steps}: {run.schedule.to_train_on(progress, state.layout.effective_batch)}")
        log.close()
        return False
    # Last: model building and data setup may draw random numbers.
    restore_rng_for_rank(rng, progress.step, run.dist, run.config.train.seed, log)
    if run.val is not None and not baseline(run, state, log):
        log.close()
        return False
    log.info(f"training {run.total_steps} steps: {run.epoch_samples} samples an epoch, "
             f"effective batch {plan.effective_batch} = {plan.micro_batch} x {plan.grad_accumulation} x "
             f"{plan.world_size}, starting at step {progress.step} (epoch {progress.epoch}, "
             f"sample {progress.samples_in_epoch})", "begin", step=progress.step, total=run.total_steps)
    log.start(progress.step)
    run.wrapped.train()
    return True


def due(run: RunSpec, state: RunState, interval: int) -> bool:
    """Every `interval` steps, and at the last step."""
    return state.progress.step % interval == 0 or state.progress.step == run.total_steps


def end_of_epoch(run: RunSpec, state: RunState) -> bool:
    """Whether the next step would run past the epoch (its tail short of a step is dropped)."""
    return state.progress.samples_in_epoch + state.layout.effective_batch > run.epoch_samples


def finish(run: RunSpec, state: RunState, services: Services, exit_code: int) -> None:
    log, progress = services.log, state.progress
    log.stop()
    skipped = state.data.skipped_summary()
    if skipped:  # one message: its time stamp heads the list, whose lines stay indented under it
        log.info("\n".join(skipped))
    if progress.bad_steps:
        log.info(f"{progress.bad_steps} step(s) had a non-finite loss or gradient norm and were skipped")
    if exit_code == 0:
        if services.listener is not None:  # the checkpoints still waiting to be heard: heard after the run
            services.listener.hand_over()
        kept = kept_names(run.output_dir, run.protected)  # names this run left as they were: not its own
        best = state.best.describe(BEST not in kept) if state.best is not None else "no best.pth (no --val-manifest)"
        newest = state.last_saved.name if state.last_saved is not None else "none saved"
        latest = LATEST if LATEST not in kept else f"{newest}; {LATEST} there is not this run's"
        whole = progress.samples_in_epoch >= run.epoch_samples  # the epoch under way is complete
        log.done(progress.step, progress.epoch + whole, best, run.output_dir, latest,
                 partial=None if whole or not progress.samples_in_epoch else (progress.samples_in_epoch,
                                                                              run.epoch_samples))
    log.close()
