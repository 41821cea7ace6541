"""Validation of a run: the base model before its first step, then at each --val-interval; what each
validation is judged by (best.pth, early stop, the forgetting limit).

An OOM halves the micro-batch of validation and retries; a bad sample ends the run (steps.bad_data).
"""

from __future__ import annotations

import time

from indextts_train.errors import UserError
from indextts_train.train.best import judge, verdict
from indextts_train.train.hardware import halve_for_oom, is_oom_error
from indextts_train.train.run import RunSpec, RunState
from indextts_train.train.steps import bad_data
from indextts_train.train.validation import describe, evaluate_groups, scalars
from indextts_train.ui.console import RunLogger


def baseline(run: RunSpec, state: RunState, log: RunLogger) -> bool:
    """Validate the model before its first step (the base model: the forgetting report's reference), or on a
    resume say why there is nothing to do when the run already ended early. False: nothing to do."""
    history, val, step = state.history, run.val, state.progress.step
    if step == 0 and history.baseline is None:
        result = validate(run, state, log)
        history.record_baseline(result)
        log.scalars("val", scalars(result), 0)
        log.validated(0, describe(0, result, None, " (before training)"), result)
        return True
    if val.limits and history.baseline is None:
        log.warn("this run recorded no validation of the base model (it started before that existed), so "
                 "--forgetting-limit cannot be checked")
    other = other_validation_lines(run, state)
    if other:
        log.warn(other)
    if history.last_val is None or history.last_val["step"] != step:
        return True
    why = verdict(state.best, history.last_val, step, baseline=history.baseline, limits=val.limits,
                  patience=val.patience)
    if why:
        log.info(f"nothing to do: the run in {run.output_dir} already ended ({why}); raise "
                 "--early-stop-patience or --forgetting-limit to continue it")
    return why is None


def other_validation_lines(run: RunSpec, state: RunState) -> str | None:
    """Why a resumed run's validations do not compare with the checkpoint's (its --val-manifest holds another
    number of lines than the last validation it recorded), or None."""
    recorded = state.history.last_val or state.history.baseline
    then = (recorded.get("total") or {}).get("samples") if recorded else None
    now = sum(len(lines) for lines in run.val.groups.values())
    if then is None or then == now:
        return None
    best = state.best.describe() if state.best is not None and state.best.step is not None else "best.pth"
    return (f"the validation data changed since the checkpoint ({then} lines then, {now} now): the losses from "
            f"here on are of other lines, so their change vs base and the best so far ({best}) do not compare "
            "with them; pass the --val-manifest of the checkpoint's run, or start a new --output-dir")


def validation(run: RunSpec, state: RunState, log: RunLogger) -> tuple[bool, str | None]:
    """Validate, log (total and per language, with the change against the base model), judge best.pth.

    Returns (a new best: save and publish it now, why the run ends now or None).
    """
    result = validate(run, state, log)  # a bad sample: the step is done, and kept
    step, history, val = state.progress.step, state.history, run.val
    history.record_validation(step, result)
    log.scalars("val", scalars(result), step)
    log.validated(step, describe(step, result, history.baseline), result)
    return judge(state.best, result, step, baseline=history.baseline, limits=val.limits, patience=val.patience)


def validate(run: RunSpec, state: RunState, log: RunLogger) -> dict:
    """Validation per group (validation.py) over this rank's shard, in manifest order: {"total", "groups"},
    and on rank 0 the generation check's numbers as "generation" (listen_check.py; --listen-lines).

    An OOM halves the micro-batch and retries; a bad sample ends the run (steps.bad_data).
    """
    try:
        return _validate(run, state, log)
    except UserError as exc:
        raise bad_data(exc) from None


def _validate(run: RunSpec, state: RunState, log: RunLogger) -> dict:
    result = _losses(run, state, log)
    check = run.val.generation
    if check is not None and run.dist.is_main:
        started = time.perf_counter()
        try:
            result["generation"] = check.run(state.model, state.progress.step, run.device, run.autocast)
        except Exception as exc:  # only OOM is handled here: the numbers of this validation are left out
            if not is_oom_error(exc):
                raise
            log.warn(f"CUDA out of memory in the generation check at step {state.progress.step}; it is left "
                     "out of this validation (a smaller --listen-lines needs less memory)")
            return result
        if not check.announced:
            check.announced = True
            log.info(check.cost_line(time.perf_counter() - started))
    return result


def _losses(run: RunSpec, state: RunState, log: RunLogger) -> dict:
    while True:
        try:
            return evaluate_groups(state.model, run.val.dataset, run.val.groups, batch_size=state.layout.micro_batch,
                                   config=run.config, device=run.device, num_workers=state.layout.num_workers,
                                   dist_info=run.dist, autocast=run.autocast)
        except Exception as exc:  # only OOM is handled here; everything else propagates unchanged
            if not is_oom_error(exc):
                raise
            state.layout = halve_for_oom(state.layout, exc)
            log.warn(f"CUDA out of memory in validation; retrying with micro-batch {state.layout.micro_batch}")
