"""Whether a run's learning-rate schedule can teach the model anything, said before the first step.

The defaults are sized for a real corpus (a 1,000-step warmup, 10 epochs at an effective batch of
64). On a small corpus they give a run of a few dozen steps whose learning rate never leaves the
warmup: it trains nothing, ends with "-0.0% vs base" and exits 0. It is a warning, not a refusal:
a short run is also how a setup is tried (`--max-steps 2`), and it harms nothing; the line names the
flags that make the schedule learn.
"""

from __future__ import annotations

from indextts_train.config.settings import TrainConfig

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
