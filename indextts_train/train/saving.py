"""Saving a run: when a checkpoint is due, writing it (in the background under --async-save), and what
follows a save (best.pth from heard scores, listening).

Checkpoints are taken only at optimizer-step boundaries, after validation; a state with a NaN/Inf
tensor is never written: the run stops instead (guard.Diverged).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from pathlib import Path

import torch

from indextts_train.checkpoint.async_save import cpu_snapshot
from indextts_train.checkpoint.files import (
    BEST,
    NonFiniteStateError,
    kept_names,
    protected_name_error,
    publish,
    save_checkpoint,
)
from indextts_train.checkpoint.lineage import describe_set_aside, owned_by, set_aside
from indextts_train.checkpoint.state import nonfinite_problem
from indextts_train.distributed import barrier
from indextts_train.train.best import take_heard
from indextts_train.train.guard import Diverged, diverged_message
from indextts_train.train.listening import due_steps
from indextts_train.train.run import RunSpec, RunState, Services, checkpoint_state
from indextts_train.train.window import host_rows


def save_when_due(run: RunSpec, state: RunState, services: Services, stop: bool, *, best: bool = False,
                  ending: bool = False) -> None:
    """Save at the interval, a new best, the last step, an early end and a stop.

    A periodic save inside a streak of skipped steps waits for the next good step, so rotation never
    trades the last checkpoint before a divergence for one written during it. The wait is part of the
    progress (progress.save_pending): a stop or a best taken inside the streak does not settle it, and
    a resumed run still owes it, as the uninterrupted run does.
    """
    progress, guard = state.progress, state.guard
    periodic = progress.step % run.config.train.save_interval == 0 or bool(progress.save_pending)
    must = stop or ending or progress.step == run.total_steps
    progress.save_pending = int(periodic and guard.in_streak)  # saved with the checkpoint below
    if must or best or (periodic and not guard.in_streak):
        save(run, state, services, must=must, best=best)


def save_before_exit(run: RunSpec, state: RunState, services: Services) -> str:
    """Save the last completed step (unless it is on disk already); says what is kept."""
    wait_for_save(state, services)
    step = state.progress.step
    if state.last_saved_step != step and step > 0:
        services.log.stop()
        save(run, state, services)
        wait_for_save(state, services)
    saved = state.last_saved if state.last_saved_step == step else None
    return (f"step {step}, the last completed one, is saved in {saved}" if saved is not None
            else "no step was completed, nothing to save")


def diverged(state: RunState, problem: str) -> Diverged:
    return Diverged(diverged_message(problem, state.last_saved, state.last_saved_step))


def wait_for_save(state: RunState, services: Services) -> None:
    """The background save in flight (--async-save) is on disk, or its error raised here."""
    if services.saver is not None:
        try:
            services.saver.wait()
        except NonFiniteStateError as exc:
            raise diverged(state, str(exc)) from None


def nonfinite_now(state: RunState) -> str | None:
    """Why the weights or optimizer moments hold a NaN/Inf, or None; one read of the device.

    Every rank holds the same weights, so every rank reaches the same answer and stops together.
    """
    optimizer = state.optim.optimizer
    tensors = [p.detach() for p in state.model.parameters()]
    tensors += [v for slots in optimizer.state.values() for v in slots.values()
                if isinstance(v, torch.Tensor) and v.is_floating_point() and v.dim() > 0]
    if not tensors or bool(torch.stack([torch.isfinite(t).all() for t in tensors]).all()):
        return None
    return nonfinite_problem(state.weights.state_dict(), optimizer.state_dict())


def save(run: RunSpec, state: RunState, services: Services, *, must: bool = True, best: bool = False) -> Path | None:
    """Checkpoint at this step boundary (rank 0 writes; every rank contributes its RNG); `best` publishes
    best.pth. Returns the file it writes (on other ranks, the file rank 0 writes; None when it was skipped).

    With `services.saver` (--async-save) the state is snapshotted to CPU memory here and written by a
    background thread while training goes on (async_save.py); best.pth is published by that write too.
    `must=False`: a periodic or best save, skipped with a warning when its file name belongs to a file
    the run must not touch.
    """
    output_dir, step, log = run.output_dir, state.progress.step, services.log
    refused = protected_name_error(output_dir, step, run.protected)  # the same answer on every rank
    if refused is not None:
        if must:
            raise refused
        log.warn(f"{refused}; the next save goes on")
        return None
    problem = nonfinite_now(state)
    if problem is not None:
        wait_for_save(state, services)
        raise diverged(state, f"not saving step {step}: {problem}")
    log.flush()  # TensorBoard holds everything up to this step before the checkpoint exists
    state.history.pending = host_rows(state.history.pending)  # the checkpoint stores plain floats
    if state.new_branch and run.dist.is_main:  # before its first file: the abandoned branch's names stay whole
        set_aside_abandoned(run, state, services)
    saved = checkpoint_state(run, state)
    path = None
    if saved is not None:
        progress = state.progress  # where the run is now: an --async-save write ends steps later
        at = {"step": step, "total": run.total_steps, "epoch": progress.epoch, "sample": progress.samples_in_epoch}
        write = functools.partial(_write, run, state, services, at=at, own=owned_by(state.lineage), best=best)
        path = output_dir / f"model_step{step}.pth"
        if services.saver is None:
            write(saved)
        else:
            wait_for_save(state, services)
            services.saver.start(functools.partial(write, cpu_snapshot(saved)))
    barrier(run.dist)
    if not run.dist.is_main:  # rank 0 writes it: every rank knows this step is saved, so a stop that follows (a
        # bad sample found by any rank) saves it no second time, where only rank 0 would skip the collectives
        state.last_saved, state.last_saved_step = output_dir / f"model_step{step}.pth", step
    return path


def _write(run: RunSpec, state: RunState, services: Services, saved: dict, *, at: dict, own: Callable[[Path], bool],
           best: bool) -> None:
    """Write the checkpoint of step `at["step"]` (maybe in the background thread); what follows a save."""
    train, step = run.config.train, at["step"]
    written = save_checkpoint(saved, run.output_dir, step, keep=train.keep_checkpoints, keep_every=train.keep_every,
                              best=best, protected=run.protected, own=own)
    published = best and BEST not in kept_names(run.output_dir, run.protected)  # a best.pth not ours stays
    services.log.saved(written, best=published, **at)
    state.last_saved, state.last_saved_step = written, step
    after_save(run, state, services, step)


def after_save(run: RunSpec, state: RunState, services: Services, step: int) -> None:
    """The checkpoint of `step` is on disk (rank 0 only saves): take the scores heard so far
    (--best-metric listen/...; not while a listener is mid-checkpoint), and start hearing it when it is due
    (--listen-every: heard by a process of its own)."""
    train, listener, log = run.config.train, services.listener, services.log
    if state.best is not None and (listener is None or listener.child is None):
        take_heard(state.best, run.output_dir, step, run.protected, log.info)
    if listener is not None:
        listener.wrote(step)  # a run that stops early still hears its last checkpoint (Listener.hand_over)
    if listener is None or not (step % (train.listen_every * train.save_interval) == 0 or step == run.total_steps):
        return
    steps = due_steps(run.output_dir, train.listen_every, train.save_interval, run.total_steps)
    if steps:
        listener.hear(steps)


def set_aside_abandoned(run: RunSpec, state: RunState, services: Services) -> None:
    """A new branch's first save: the files of the branch it left go under abandoned/ (lineage.py)."""
    output_dir = run.output_dir
    moved = set_aside(output_dir, state.lineage, run.protected)
    if moved:
        services.log.info(describe_set_aside(moved, state.lineage))
    state.new_branch = False
    # best.pth named an abandoned file: it names this branch's best again, if that file is still here.
    tracker = state.best
    kept = output_dir / f"model_step{tracker.step}.pth" if tracker is not None and tracker.step is not None else None
    if kept is not None and kept.is_file() and not (output_dir / BEST).exists():
        publish(output_dir, kept, BEST, run.protected)
