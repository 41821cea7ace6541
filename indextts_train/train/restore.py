"""Applying a resumed checkpoint to the run being built: the one place the saved state is put in
(start.py builds the state a run starts from, and calls it when the run resumes).

The checkpoint manager (checkpoint/manager.py) chose the file, split into typed parts (resumed.py); here the
run's parts load them (`load_state_dict`) and what changed since is said: the vocabulary, the
settings, the LR schedule's anchor at a new effective batch.
"""

from __future__ import annotations

from indextts_train.checkpoint.resumed import Resumed
from indextts_train.config.settings import Config
from indextts_train.text.vocab import VocabPlan
from indextts_train.train.run import RunState, settings_in_effect
from indextts_train.ui.console import RunLogger


def apply_resumed(state: RunState, resumed: Resumed, *, growth: VocabPlan, reset: bool, config: Config,
                  total_steps: int, log: RunLogger) -> None:
    """Progress, history, the optimizer set and the data record from the checkpoint (or nothing, when
    --on-vocab-change reset starts the run over: step 0, fresh optimizer set, fresh RNG)."""
    optim = state.optim
    if reset:
        log.info(optim.vocab_change_block(growth, reset=True))
        return
    state.progress.load_state_dict(resumed.progress.state_dict())
    state.history.load_state_dict(resumed.history.state_dict())
    _anchor_schedule(state, total_steps, samples_unknown=resumed.samples_unknown)
    optim.resume(resumed.optimizer_set, step=resumed.step, hparams=resumed.hparams, repaired=resumed.repaired,
                 growth=growth, source=resumed.path, train=config.train, total_steps=total_steps, log=log)
    if growth.new_ids:
        log.info(optim.vocab_change_block(growth, reset=False))
    if resumed.hparams:
        report_changed_hparams(resumed.hparams, settings_in_effect(config, total_steps, state.layout), log)
    else:
        log.info("the checkpoint was repaired and records no settings: the current ones apply")
    fingerprint = state.data.fingerprint  # the data this run trains on (check_data compared the two)
    state.data.load_state_dict(resumed.data.state_dict())
    state.data.fingerprint = fingerprint
    state.last_saved, state.last_saved_step = resumed.step_file, state.progress.step


def _anchor_schedule(state: RunState, total_steps: int, *, samples_unknown: bool) -> None:
    """The LR schedule goes on from the samples seen, and ends with the run at this effective batch.

    A repaired file whose sample count is not known gets the steps times this batch, as its count from
    now on (the files this run writes no longer say they were repaired).
    """
    progress, clock = state.progress, state.optim.clock
    if samples_unknown:
        progress.samples_total = progress.step * clock.effective_batch
    clock.anchor_step, clock.anchor_samples = progress.step, progress.samples_total
    clock.total_samples = clock.anchor_samples + (total_steps - progress.step) * clock.effective_batch


def report_changed_hparams(saved: dict, current: dict, log: RunLogger) -> None:
    """Say what differs from the checkpoint's run; warn where it changes the optimisation."""
    # Only keys the checkpoint recorded: an older file knows fewer settings, which is not a change.
    changed = {k: (saved[k], v) for k, v in current.items() if k in saved and saved[k] != v}
    if not changed:
        return
    log.notice("settings changed since the checkpoint:")
    for key, (old, new) in changed.items():
        log.notice(f"  {key}: {old} -> {new}")
    if "effective_batch" in changed:
        log.warn("the effective batch changed: steps now consume a different number of samples; training "
                 "continues from the same sample, and the epochs and the learning-rate schedule follow the "
                 "samples seen (--max-steps still counts steps)")
    elif {"micro_batch", "grad_accumulation", "world_size"} & changed.keys():
        log.notice("  same effective batch: training continues from the same sample")
    if "learning_rate" in changed:
        log.warn("the learning rate changed: the schedule continues with the new peak value")
    if "sort_window" in changed:
        log.warn("the sort window changed: the data order keeps the checkpoint's so that no sample is skipped or "
                 "repeated; a new window applies to a new run")
    if "seed" in changed:
        log.warn("the seed changed: the data order keeps the checkpoint's seed so no sample is skipped "
                 "or repeated; dropout continues from the saved RNG")
