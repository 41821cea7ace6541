"""The logging window: the metrics of the steps since the last logged line, averaged when a line is due.

The steps' metrics stay on the device (history.pending) until a line, a live status update or a
checkpoint needs them: one device->host read then, none per micro-batch.
"""

from __future__ import annotations

import time

import numpy as np
import torch

from indextts_train.checkpoint.state import History, Progress
from indextts_train.train.optim import OptimizerSet
from indextts_train.ui.console import RunLogger

METRICS = ("loss", "text_loss", "mel_loss", "mel_top1", "grad_norm")  # what steps.optimizer_step returns
Clock = tuple[float, int]  # (time.perf_counter(), progress.samples_total) at the last line


def host_rows(pending: list) -> list:
    """`pending` with its device tensors (this process's steps) as plain float rows, read together.

    Rows from a checkpoint are floats already.
    """
    on_device = [i for i, row in enumerate(pending) if isinstance(row, torch.Tensor)]
    if not on_device:
        return pending
    rows = list(pending)
    for i, values in zip(on_device, torch.stack([pending[i] for i in on_device]).tolist(), strict=True):
        rows[i] = values
    return rows


def window_mean(rows: list) -> list[float]:
    """The mean of each metric over the window's rows; a NaN (an fp16 overflow step's gradient norm)
    is left out of its column's mean, and a column with nothing else is NaN."""
    table = np.asarray(rows, dtype=np.float64)  # (steps, metrics)
    kept = np.isfinite(table)
    counts = kept.sum(axis=0)
    sums = np.where(kept, table, 0.0).sum(axis=0)
    return np.where(counts > 0, sums / np.maximum(counts, 1), np.nan).tolist()


def window_values(history: History, progress: Progress, optim: OptimizerSet, clock: Clock) -> dict[str, float]:
    """Mean metrics of the steps since the last line, the LR, and samples/s since `clock`."""
    history.pending = host_rows(history.pending)
    now, samples = time.perf_counter(), progress.samples_total
    values = dict(zip(METRICS, window_mean(history.pending), strict=True))
    values["lr"] = optim.last_step_lr()
    values["samples_per_s"] = (samples - clock[1]) / max(now - clock[0], 1e-9)
    return values


def report_step(history: History, progress: Progress, optim: OptimizerSet, log: RunLogger, clock: Clock, *,
                line_due: bool) -> Clock:
    """After a step: a logged line for the steps since the last when one is due (history, TensorBoard,
    console; returns the new clock), else on a terminal the live status line (one device->host read
    per step, not per micro-batch)."""
    line = bool(history.pending) and line_due
    if not line and not log.interactive:
        return clock
    values = window_values(history, progress, optim, clock) if history.pending else None
    if line:
        history.record_train(progress.step, values)
        history.pending = []
        log.scalars("train", values, progress.step)
    log.train_step(progress.step, progress.epoch, values, print_line=line)
    return (time.perf_counter(), progress.samples_total) if line else clock
