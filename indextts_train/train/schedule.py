"""The run's schedule: how many optimizer steps it has, and whether they can teach the model anything.

`Schedule` counts full epochs of the data in samples, cut at max_steps; `run_steps` takes its counts
once, at the start, for the step the run starts from (`Steps`): the loop, the optimizer set's LR
schedule and the first lines of a new run read them.

A schedule that cannot learn is said before the first step. The defaults are sized for a real
corpus (a 1,000-step warmup, 10 epochs at an effective batch of 64). On a small corpus they give a
run of a few dozen steps whose learning rate never leaves the warmup: it trains nothing, ends with
"-0.0% vs base" and exits 0. It is a warning, not a refusal: a short run is also how a setup is
tried (`--max-steps 2`), and it harms nothing; the line names the flags that make the schedule learn.

A --max-steps past the end of the epochs is said too (`cap_note`): the epochs end the run first, so the
line gives the --epochs that reaches it, and a finished run's "nothing to do" names the flag that ended
it (`to_train_on`), not a --max-steps that cannot help.
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
    # Not --max-steps: the epochs end a run that has too few steps before any --max-steps would.
    more = f"--epochs {epochs} (a smaller --effective-batch-size also gives more steps)"
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
        end = self.epochs_end(progress, effective_batch, self.epochs)
        return min(end, self.max_steps) if self.max_steps else end

    def epochs_end(self, progress: Progress, effective_batch: int, epochs: int) -> int:
        """The step `epochs` epochs of the data end at, from `progress` (max_steps aside)."""
        per_epoch = self.steps_per_epoch(effective_batch)
        if progress.epoch >= epochs:
            return progress.step
        # The loop's rule (loop.end_of_epoch): a step that would run past the epoch starts the next one.
        left_in_epoch = max(0, (per_epoch * effective_batch - progress.samples_in_epoch) // effective_batch)
        return progress.step + left_in_epoch + (epochs - 1 - progress.epoch) * per_epoch

    def epochs_to_reach(self, step: int, progress: Progress, effective_batch: int) -> int:
        """The smallest --epochs whose epochs reach `step` from `progress`: each epoch past the current one
        adds a whole epoch of steps."""
        short = step - self.epochs_end(progress, effective_batch, progress.epoch + 1)
        return progress.epoch + 1 + max(0, -(-short // self.steps_per_epoch(effective_batch)))

    def epochs_cap(self, progress: Progress, effective_batch: int) -> bool:
        """Whether the epochs, not --max-steps, end the run: --max-steps was named and lies past them."""
        return self.max_steps > self.epochs_end(progress, effective_batch, self.epochs)

    def to_train_on(self, progress: Progress, effective_batch: int) -> str:
        """What ends the run and what to pass to train past it: the flag that ends it, never one that cannot help."""
        epochs_end = self.epochs_end(progress, effective_batch, self.epochs)
        if self.max_steps and not self.epochs_cap(progress, effective_batch):
            return (f"--max-steps {self.max_steps} ends it (its --epochs {self.epochs} end at step {epochs_end}); "
                    "pass a larger --max-steps to train on")
        if self.max_steps:
            return (f"--epochs {self.epochs} end it, before --max-steps {self.max_steps}; pass --epochs "
                    f"{self.epochs_to_reach(self.max_steps, progress, effective_batch)} to reach step "
                    f"{self.max_steps} (a larger --max-steps alone trains nothing more)")
        return f"--epochs {self.epochs} end it; pass a larger --epochs to train on"

    def cap_note(self, progress: Progress, effective_batch: int) -> str | None:
        """One line when the epochs end the run before the step --max-steps asks for, or None."""
        if not self.epochs_cap(progress, effective_batch):
            return None
        end = self.epochs_end(progress, effective_batch, self.epochs)
        return (f"--max-steps {self.max_steps} is past the end of the epochs: --epochs {self.epochs} allow "
                f"{end} steps at an effective batch of {effective_batch}, so the run stops at step {end}; pass "
                f"--epochs {self.epochs_to_reach(self.max_steps, progress, effective_batch)} to reach step "
                f"{self.max_steps}")


@dataclass(frozen=True)
class Steps:
    """The schedule's counts at the run's effective batch, taken once at the start."""

    total: int  # the step the run ends at, from where it starts (a checkpoint's progress, or step 0)
    fresh: int  # the step a run from step 0 ends at: a new optimizer set's LR schedule is built for it
    per_epoch: int
    warning: str | None  # why a new run's schedule cannot learn (schedule_warning), or None
    cap_note: str | None  # the epochs end the run before --max-steps (Schedule.cap_note), or None


def run_steps(schedule: Schedule, start: Progress, train: TrainConfig, effective_batch: int) -> Steps:
    """The counts of `schedule` for a run that starts at `start`; refused when an epoch is under one batch.

    A run with nothing left to do gets no cap note: its "nothing to do" line names the flag to pass."""
    per_epoch = schedule.steps_per_epoch(effective_batch)
    fresh = schedule.end_step(Progress(), effective_batch)
    total = schedule.end_step(start, effective_batch)
    warning = schedule_warning(train, fresh, per_epoch, effective_batch) if start.step == 0 else None
    cap_note = schedule.cap_note(start, effective_batch) if start.step < total else None
    return Steps(total, fresh, per_epoch, warning, cap_note)
