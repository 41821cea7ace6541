"""The state a run starts from: the schedule, the optimizer set, progress, lineage and the best
tracker, fresh, or with a resumed checkpoint's saved state put in (restore.py).

The data record and the data order are checked against the checkpoint's (resume.py); the run's
schedule follows the samples its data gives at its effective batch. A --resume PATH of another folder
into a folder that holds checkpoints of ours is said at the start: the new branch sets them aside at its
first save (lineage.set_aside).
"""

from __future__ import annotations

from indextts_train.checkpoint.lineage import foreign_resume_note, run_lineage
from indextts_train.checkpoint.resumed import Resumed
from indextts_train.checkpoint.state import History, Progress
from indextts_train.config.settings import Config
from indextts_train.data.fingerprint import data_fingerprint
from indextts_train.distributed import DistInfo
from indextts_train.text.vocab import VocabPlan
from indextts_train.train.accel import compile_blocks
from indextts_train.train.best import restored_best
from indextts_train.train.guard import DivergenceGuard
from indextts_train.train.hardware import HardwarePlan
from indextts_train.train.optim import OptimizerSet
from indextts_train.train.restore import apply_resumed
from indextts_train.train.resume import check_data, data_order
from indextts_train.train.run import RunState, Validation
from indextts_train.train.run_data import RunData
from indextts_train.train.schedule import Schedule, Steps, run_steps
from indextts_train.train.weights import Weights
from indextts_train.ui.console import RunLogger
from indextts_train.ui.run_settings import RunSettings


def start_state(data: RunData, resumed: Resumed | None, weights: Weights, growth: VocabPlan, plan: HardwarePlan, *,
                options: RunSettings, config: Config, dist: DistInfo, val: Validation | None,
                protected: frozenset[str], log: RunLogger) -> tuple[RunState, Schedule, Steps, list | None]:
    """The run's state (fresh, or the checkpoint's), its schedule and its counts, and the RNG streams to continue
    (None: fresh from the seed, also when --on-vocab-change reset starts the run over)."""
    train = config.train
    reset = bool(growth.new_ids) and options.on_vocab_change == "reset"  # the run starts over
    fingerprint = data_fingerprint(data.index)
    changed = resumed is not None and not reset and check_data(resumed, fingerprint, options, log)
    saved = None if reset else resumed
    schedule = Schedule(data_order(saved, data.train_specs, data.index, train, plan, log, data_changed=changed),
                        train.epochs, train.max_steps)
    steps = run_steps(schedule, Progress() if saved is None else saved.progress, train, plan.effective_batch)
    if train.compile:
        compile_blocks(weights.model.gpt.h)
    optim = OptimizerSet.build(weights.trainable, train, plan, steps.fresh)
    progress = Progress(sampler_seed=train.seed)
    state = RunState(weights, optim, progress, History(), plan, DivergenceGuard(progress, train.max_bad_steps))
    state.data.fingerprint = fingerprint
    state.lineage, state.new_branch = run_lineage(
        resumed and resumed.lineage, resumed.step if resumed is not None else 0,
        continues=resumed is not None and resumed.continues, reset=reset)
    note = (foreign_resume_note(resumed.path, options.output_dir, state.lineage, protected)
            if resumed is not None and state.new_branch and dist.is_main else None)
    if note:
        log.warn(note)
    if resumed is not None:
        apply_resumed(state, resumed, growth=growth, reset=reset, config=config, total_steps=steps.total, log=log)
    if val is not None:
        state.best = restored_best(state.history.best, train.best_metric, state.progress.step,
                                   resumed_from=None if saved is None else saved.path, output_dir=options.output_dir,
                                   protected=protected, is_main=dist.is_main, say=log.info,
                                   new_branch=state.new_branch)
    return state, schedule, steps, None if saved is None else saved.rng

