"""Setting up a run: config, hardware plan, data, model, the optimizer set, and what to resume from.

`setup(options, dist)` returns a `Started`: the frozen `RunSpec`, the `RunState` (resumed from the
checkpoint the manager chose, or fresh) and the startup's log and lock. Model building may draw
random numbers, so the RNG of the run (fresh seed or the checkpoint's) is put in place last, when
the loop begins (`Started.rng`).

Each stage is owned by the module of its concern and called once, in order: the checks of every
input, which read the base checkpoint and the tokenizer once (preflight.py), the hardware plan
(plan.py), the claim of the output folder (runlock.py), the checkpoint to resume
(checkpoint/manager.py), its train scope against today's (model/scope.py) and its batch layout
(resume.py), the weights (weights.py), the data, read once the weights have settled the model's
family (run_data.py), the state (start.py), the frozen run (run.py) and its record
(ui/run_record.py). The base checkpoint and the tokenizer are read once and passed on typed.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass

from indextts_train.checkpoint.manager import select_resume
from indextts_train.config.settings import config_to_dict
from indextts_train.distributed import DistInfo
from indextts_train.model.scope import check_resume_fits
from indextts_train.train.plan import run_plan
from indextts_train.train.preflight import check_inputs
from indextts_train.train.resume import checked_plan, seed_everything
from indextts_train.train.run import RunSpec, RunState, build_spec
from indextts_train.train.run_data import RunData
from indextts_train.train.runlock import RunLock, claim_run
from indextts_train.train.start import start_state
from indextts_train.train.weights import run_weights
from indextts_train.ui.console import RunLogger
from indextts_train.ui.run_record import RECORD_NAME, recordable_options, write_run_record
from indextts_train.ui.run_settings import RunSettings
from indextts_train.ui.text_log import TextLog


@dataclass(frozen=True)
class Started:
    """What setup hands the loop: the run, its state, and the startup's log and lock."""

    run: RunSpec
    state: RunState
    log: RunLogger  # the startup's lines; the run's log goes on from its text log
    lock: RunLock | None  # rank 0's hold on the output dir
    rng: list[dict] | None  # each rank's RNG stream to continue; None: fresh from the seed


def setup(options: RunSettings, dist: DistInfo, text_log: TextLog | None = None) -> Started:
    """Build the run: config + flags, checks of every input, hardware plan, data, weights, optimizer set,
    resume state. Nothing is created on disk before the checks pass; a start refused later removes
    what it created (the output folder it made, its lock and log)."""
    startup = RunLogger(None, 0, enabled=dist.is_main, tensorboard=False, text_log=text_log)
    if options.config_note:
        startup.info(options.config_note)
    config = copy.deepcopy(options.config)  # the run settles the model family on its own copy
    tokenizer, base = check_inputs(options, config)  # before the plan is printed and before anything is created;
    # each read once: the base checkpoint settles the family, and serves the checks and the weights
    plan, device = run_plan(config, dist)
    claim = claim_run(options.output_dir, dist, device, startup.text_log)  # before any work: one run per folder
    try:
        for name in claim.kept:  # the user's own file under the name: kept as it is, as run.yaml below
            startup.warn(f"{options.output_dir / name} is not this trainer's {name}: kept as it is, so this run's "
                         "lines are on the console only; move it away to keep them there from the next start")
        startup.info(plan.describe(), "plan", plan=plan.to_dict())
        seed_everything(config.train.seed + dist.rank)
        resumed, protected = select_resume(options.output_dir, options.resume, warn=startup.warn, notice=startup.notice)
        if resumed is not None:  # a run resumes the model and the scope it was trained in, or is refused
            check_resume_fits(resumed.gpt_config, resumed.train_config, config, resumed.path, resumed.model.keys())
        plan = checked_plan(resumed, plan, config, startup)
        weights, growth = run_weights(resumed, config, tokenizer, startup, base, device)
        data = RunData.read(options, config, startup)  # once the weights have settled the model's family
        dataset, val = data.datasets(config)
        state, schedule, steps, rng = start_state(data, resumed, weights, growth, plan, options=options, config=config,
                                           dist=dist, val=val, protected=protected, log=startup)
        run = build_spec(options, dist, config, device, schedule, steps, dataset, val, state, protected, startup)
        if dist.is_main and write_run_record(options.output_dir, recordable_options(options.inputs, config),
                                             config_to_dict(config), run.plan.to_dict(),
                                             startup.text_log.started) is None:
            startup.warn(f"{options.output_dir / RECORD_NAME} is not a run record of ours: kept as it is, so this "
                         "start is recorded in train.log only (--from-run cannot rerun it)")
        return Started(run, state, startup, claim.lock, rng)
    except BaseException as exc:  # refused (bad data, changed data, ...): the run ends here, and so does its hold
        claim.give_back(exc, dist, startup.text_log)
        raise
