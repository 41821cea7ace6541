"""What keeps a long run from spending its progress on bad steps and bad samples.

- The divergence guard: a step whose loss or gradient norm is not finite updates nothing (no
  optimizer step; the scheduler still moves, so the LR stays tied to the step count; the test is
  steps.step_is_finite). It is counted
  and logged; after `max_bad_steps` in a row the run stops with EXIT_DIVERGED and names the last
  checkpoint written before the streak. The decision is a pure function of the step's numbers, so
  a killed and resumed run skips exactly the same steps (the counters are in the checkpoint).
- Skipped samples (`--skip-bad-lines`): a sample that fails when loaded is left out of its
  micro-batch. Which samples fail depends only on the data, so a resumed run leaves out the same
  ones; the list is kept in the checkpoint (state.DataRecord) and printed at the end.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from torch.utils.data import Dataset

from indextts_train.checkpoint.state import History, Progress
from indextts_train.data.manifest import ManifestDataset, collate
from indextts_train.errors import UserError
from indextts_train.model.gpt import Batch
from indextts_train.ui.console import RunLogger

EXIT_DIVERGED = 3


class Diverged(Exception):
    """The run stops with EXIT_DIVERGED; the message names the last good checkpoint."""


class StreakStop(Exception):
    """max_bad_steps skipped steps in a row: the run stops, Diverged once the save in flight is on disk
    (loop.run_to_end)."""


class DivergenceGuard:
    """Counts non-finite steps in the run's Progress (bad_steps, bad_streak, bad_streak_start), so
    the counters are saved and restored with it and a resumed run stops at exactly the same step."""

    def __init__(self, progress: Progress, max_bad_steps: int) -> None:
        self.progress = progress
        self.max_bad_steps = max_bad_steps

    def record(self, finite: bool) -> None:
        """After `progress.step` moved to the step just done."""
        progress = self.progress
        if finite:
            progress.bad_streak = 0
            return
        progress.bad_steps += 1
        if progress.bad_streak == 0:
            progress.bad_streak_start = progress.step
        progress.bad_streak += 1

    @property
    def in_streak(self) -> bool:
        return self.progress.bad_streak > 0

    @property
    def should_stop(self) -> bool:
        return self.progress.bad_streak >= self.max_bad_steps

    def skipped_line(self, loss: float, grad_norm: float) -> str:
        progress = self.progress
        return (f"step {progress.step}: loss {loss:.4g}, gradient norm {grad_norm:.4g}: not finite, so the weights "
                f"were not updated ({progress.bad_streak} in a row, {progress.bad_steps} in this run; the run "
                f"stops after {self.max_bad_steps} in a row)")

    def stop_message(self, last_good: Path | None, last_good_step: int) -> str:
        progress = self.progress
        start = progress.bad_streak_start
        # A stop or a new best inside the streak saves a checkpoint of it: the weights of the step before it,
        # which no skipped step changed.
        kept = (f"and changed no weight (the checkpoint of step {last_good_step}, taken among them, holds the "
                f"weights of step {start - 1})" if last_good is not None and last_good_step >= start
                else "and were not saved")
        return diverged_message(f"stopped: the last {progress.bad_streak} steps ({start}-{progress.step}) all had a "
                                f"non-finite loss or gradient norm (the run diverged) {kept}",
                                last_good, last_good_step)


def count_step(guard: DivergenceGuard, history: History, log: RunLogger, metrics: torch.Tensor,
               finite: bool) -> None:
    """A good step's metrics go to history.pending; a skipped one is counted, said, and may end the run."""
    guard.record(finite)
    if finite:
        # An fp16 overflow step is finite for the guard (the scaler skipped it) but its gradient norm
        # is Inf: NaN marks it, and the window mean leaves it out. On the device: no read per step.
        grad_norm = metrics[4]
        metrics[4] = torch.where(torch.isfinite(grad_norm), grad_norm, torch.full_like(grad_norm, float("nan")))
        history.pending.append(metrics)
        return
    loss, grad_norm = metrics[[0, 4]].tolist()  # a skipped step is rare: its own read of the device
    log.warn(guard.skipped_line(loss, grad_norm))
    if guard.should_stop:
        raise StreakStop


def diverged_message(problem: str, last_good: Path | None, last_good_step: int) -> str:
    """`problem`, where the last good checkpoint is, and what to do: the one line of exit 3."""
    where = (f"the last good checkpoint is {last_good} (step {last_good_step})" if last_good is not None
             else "no checkpoint was written before it")
    return (f"{problem}; {where}: lower --learning-rate or check the data, then rerun with --resume auto "
            f"(exit {EXIT_DIVERGED})")


class SkippingDataset(Dataset):
    """--skip-bad-lines at load time: a sample whose arrays fail their checks becomes its reason.

    Whether a sample fails depends only on its files, so leaving it out is a pure function of the
    data: a resumed run leaves out the same samples at the same places.
    """

    def __init__(self, dataset: ManifestDataset) -> None:
        self.dataset = dataset
        self.index = dataset.index

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, i: int) -> dict[str, Any]:
        try:
            return self.dataset[i]
        except UserError as exc:
            return {"bad": str(exc)}


def collate_skipping(samples: list[dict]) -> tuple[Batch | None, list[str]]:
    """(the good samples collated, or None when there are none; the bad ones' reasons)."""
    good = [s for s in samples if "bad" not in s]
    return (collate(good) if good else None), [s["bad"] for s in samples if "bad" in s]
