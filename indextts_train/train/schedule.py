"""The run's schedule: how many optimizer steps it has, and whether they can teach the model anything.

`Schedule` counts full epochs of the data in samples, cut at max_steps; `run_steps` takes its counts
once, at the start, for the step the run starts from (`Steps`): the loop, the optimizer set's LR
schedule and the first lines of a new run read them.

A schedule that cannot learn is said before the first step. The defaults are sized for a real
corpus (a 1,000-step warmup, 10 epochs at an effective batch of 64). On a small corpus they give a
run of a few dozen steps whose learning rate never leaves the warmup: it trains nothing, ends with
"-0.0% vs base" and exits 0. It is a warning, not a refusal: a short run is also how a setup is
tried (`--max-steps 2`), and it harms nothing; the line names the flags that make the schedule learn.
"""

from __future__ import annotations

from dataclasses import dataclass

from indextts_train.checkpoint.state import Progress
from indextts_train.config.settings import TrainConfig
from indextts_train.data.sampling import SamplerSpec, epoch_length
from indextts_train.errors import UserError

# Fewer optimizer steps than this over the whole run barely moves a fine-tune: the new text rows
# start random, and the demo (150 steps on 72 clips) is about the least that visibly learns.
MIN_LEARNING_STEPS = 100


def schedule_warning(train: TrainConfig, total_steps: int, steps_per_epoch: int, effective_batch: int) -> str | None:
    """One line saying why the schedule cannot learn and what to pass, or None when it can.

    `total_steps`: the step the run ends at; `steps_per_epoch`: optimizer steps an epoch of the data gives
    at `effective_batch` samples a step."""
    if total_steps <= 0:
        return None
    capped = 0 < train.max_steps <= total_steps  # the user asked for this length in so many words
    few = total_steps < MIN_LEARNING_STEPS and not capped
    epochs = -(-MIN_LEARNING_STEPS // max(1, steps_per_epoch))
    more = (f"--epochs {epochs} or --max-steps {MIN_LEARNING_STEPS} (a smaller --effective-batch-size also "
            "gives more steps)")
    if train.warmup_steps >= total_steps:
        peak = train.learning_rate * total_steps / max(1, train.warmup_steps)
        steps = MIN_LEARNING_STEPS if few else total_steps
        return (f"the learning rate never leaves its warmup: --warmup-steps {train.warmup_steps} is not shorter "
                f"than the run's {total_steps} optimizer steps, so it climbs only to {peak:.1e} of its "
                f"{train.learning_rate:.1e} peak and the model barely changes; pass --warmup-steps "
                f"{max(1, steps // 10)} (a tenth of the run)"
                + (f" and {more}" if few else ", or more steps with --epochs / --max-steps"))
    if few:
        return (f"{total_steps} optimizer steps ({train.epochs} epochs of {steps_per_epoch} at an effective batch "
                f"of {effective_batch}) are too few to learn from this data; pass {more}")
    return None


@dataclass(frozen=True)
class Schedule:
    """How many optimizer steps the run has: full epochs of the data, cut at max_steps (a step number).

    The epochs are counted in samples (progress.epoch and samples_in_epoch), so a resume at another
    effective batch finishes the same epochs: no "nothing to do" and no extra epoch.
    """

    sampler: SamplerSpec  # decides the epoch's length (sampling.py)
    epochs: int
    max_steps: int

    def steps_per_epoch(self, effective_batch: int) -> int:
        steps = epoch_length(self.sampler) // effective_batch
        if steps == 0:
            raise UserError(f"{self.sampler.sources[0].name}: an epoch of the training manifests has fewer samples "
                            f"({self.sampler.total_lines} usable lines) than one effective batch ({effective_batch}); "
                            "lower --effective-batch-size or add data")
        return steps

    def end_step(self, progress: Progress, effective_batch: int) -> int:
        """The step the run ends at: the rest of the current epoch, then the epochs left, at `effective_batch`.

        With one effective batch from the start this is epochs x steps an epoch, at every step of the run.
        """
        per_epoch = self.steps_per_epoch(effective_batch)
        if progress.epoch >= self.epochs:
            end = progress.step
        else:
            # The loop's rule (loop.end_of_epoch): a step that would run past the epoch starts the next one.
            left_in_epoch = max(0, (per_epoch * effective_batch - progress.samples_in_epoch) // effective_batch)
            end = progress.step + left_in_epoch + (self.epochs - 1 - progress.epoch) * per_epoch
        return min(end, self.max_steps) if self.max_steps else end


@dataclass(frozen=True)
class Steps:
    """The schedule's counts at the run's effective batch, taken once at the start."""

    total: int  # the step the run ends at, from where it starts (a checkpoint's progress, or step 0)
    fresh: int  # the step a run from step 0 ends at: a new optimizer set's LR schedule is built for it
    per_epoch: int
    warning: str | None  # why a new run's schedule cannot learn (schedule_warning), or None


def run_steps(schedule: Schedule, start: Progress, train: TrainConfig, effective_batch: int) -> Steps:
    """The counts of `schedule` for a run that starts at `start`; refused when an epoch is under one batch."""
    per_epoch = schedule.steps_per_epoch(effective_batch)
    fresh = schedule.end_step(Progress(), effective_batch)
    warning = schedule_warning(train, fresh, per_epoch, effective_batch) if start.step == 0 else None
    return Steps(schedule.end_step(start, effective_batch), fresh, per_epoch, warning)
