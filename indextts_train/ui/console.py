"""What the user sees: a live status line on a terminal, plain lines always, TensorBoard always.

Every `log_interval` steps one plain line that greps well is printed: in `| tee`, nohup and CI logs
that is all there is (a redrawing line turns into garbage there). On a terminal the status line of
progress.py also moves every step, and the plain lines scroll above it, so the scrollback keeps one
line per interval. Only rank 0 talks; other ranks get a `RunLogger(enabled=False)`.
"""

from __future__ import annotations

import math
import sys
from pathlib import Path
from typing import Any

from rich.console import Console

from indextts_train.ui.metrics import MetricsWriter, NullWriter, SafeConsole, open_tensorboard, silence_stdout
from indextts_train.ui.progress import LiveStatus, speed_text
from indextts_train.ui.text_log import TextLog


class _Console(Console):
    """rich's own answer to a closed stdout is SystemExit(1), which would end the run unsaved."""

    def on_broken_pipe(self) -> None:
        self.quiet = True
        silence_stdout()


def tensorboard_dir(output_dir: Path, start_step: int) -> Path:
    """The run's one TensorBoard folder, logs/run; a resume of a run begun before it existed keeps
    writing into that run's newest logs/run_* folder instead."""
    logs = output_dir / "logs"
    folder = logs / "run"
    if start_step > 0 and not folder.is_dir():
        older = sorted(p for p in logs.glob("run_*") if p.is_dir())
        return older[-1] if older else folder
    return folder


def _plain(values: dict[str, float]) -> dict[str, float]:
    """Metric values as JSON numbers (a NaN becomes None: JSON has no NaN)."""
    return {name: (float(v) if math.isfinite(float(v)) else None) for name, v in values.items()}


class RunLogger:
    def __init__(self, output_dir: Path | None, total_steps: int, *, enabled: bool = True,
                 tensorboard: bool = True, start_step: int = 0, text_log: TextLog | None = None) -> None:
        self.enabled = enabled
        self.text_log = text_log or TextLog()  # timestamps every line; copies it to train.log once attached
        # sys.stdout is None when the run starts with its stdout closed (`train-gpt ... >&-`): not a terminal
        self.interactive = enabled and sys.stdout is not None and sys.stdout.isatty()
        # One decision, ours: rich's own terminal detection can disagree (TERM unset, CI variables).
        self.console = _Console(highlight=False, soft_wrap=True, force_terminal=self.interactive or None)
        self.total_steps = total_steps
        self._safe = SafeConsole()  # a broken stdout (`| tee` killed, full disk) never ends the run
        self.writer: MetricsWriter = NullWriter()
        self.log_dir: Path | None = None
        if enabled and tensorboard and output_dir is not None:
            # One folder for the whole run: each start adds an event file whose purge step hides what
            # a killed process logged after the checkpoint this one starts from (TensorBoard drops
            # earlier events at or past it), so the curves read as one uninterrupted run. A fresh
            # start (step 0) hides anything older in the folder. A writer that fails (full disk,
            # read-only folder) is one warning, never the end of the run (metrics.SafeWriter).
            self.log_dir = tensorboard_dir(output_dir, start_step)
            self.writer = open_tensorboard(self.log_dir, self.warn, purge_step=start_step + 1 if start_step else 0)
        self._status: LiveStatus | None = None

    def info(self, message: str, kind: str = "info", **fields: Any) -> None:
        """One console line, its copy in train.log and its event (events.py: `kind` and the fields the
        line was made from, which is what the page and `checkpoints` read)."""
        if self.enabled:
            line = self.text_log.stamp(message)
            self.text_log.record(line, kind, **fields)
            self._safe.run(lambda: self.console.print(line, markup=False))

    def warn(self, message: str, **fields: Any) -> None:
        if self.enabled:
            line = self.text_log.stamp(f"warning: {message}")
            self.text_log.record(line, "warning", **fields)
            self._safe.run(lambda: self.console.print(line, markup=False, style="yellow"))

    def notice(self, message: str) -> None:
        """A resume decision or a changed setting: a plain line the page lists with the warnings."""
        self.info(message, "notice")

    def validated(self, step: int, line: str, result: dict) -> None:
        """A validation's line; its event holds the losses (`total`, `groups`)."""
        self.info(line, "validation", step=step, **result)

    def saved(self, file: Path, *, best: bool, step: int, total: int, epoch: int, sample: int) -> None:
        self.info(f"saved {file} (step {step}, epoch {epoch}, sample {sample}){', best.pth' if best else ''}",
                  "save", file=str(file), best=best, step=step, total=total, epoch=epoch, sample=sample)

    def stopped(self, step: int, exit_code: int) -> None:
        self.info(f"stopped by signal after step {step}; rerun the same command with --resume auto to continue "
                  f"(exit {exit_code})", "stop", step=step, exit_code=exit_code)

    def done(self, step: int, epochs: int, best: str, output_dir: Path, latest: str = "latest.pth",
             partial: tuple[int, int] | None = None) -> None:
        """`epochs`: the whole epochs trained; `partial`: (samples, of an epoch's) of the one under way, if any."""
        logs = f", TensorBoard logs in {self.log_dir}" if self.log_dir else ""
        rest = f" and {partial[0]} of the next one's {partial[1]} samples" if partial else ""
        self.info(f"done: {step} steps, {epochs} epoch(s){rest}, {best}; checkpoints in {output_dir} ({latest}){logs}",
                  "done", step=step, epochs=epochs)

    def start(self, step: int) -> None:
        if self.interactive:
            self._status = LiveStatus(self.console, self.total_steps, step)

    def stop(self) -> None:
        if self._status is not None:
            status, self._status = self._status, None
            self._safe.run(status.stop)

    def scalars(self, prefix: str, values: dict[str, float], step: int) -> None:
        for name, value in values.items():
            self.writer.add_scalar(f"{prefix}/{name}", value, step)

    def train_step(self, step: int, epoch: int, values: dict[str, float] | None, *, print_line: bool) -> None:
        """The live line on a terminal (every call); one plain line when print_line, for the scrollback or log."""
        if not self.enabled:
            return
        if self._status is not None:
            status = self._status
            self._safe.run(lambda: status.update(step, epoch, values))
        if print_line and values is not None:
            self.info(f"step {step}/{self.total_steps} epoch {epoch} loss {values['loss']:.4f} "
                      f"text {values['text_loss']:.4f} mel {values['mel_loss']:.4f} top1 {values['mel_top1']:.3f} "
                      f"lr {values['lr']:.2e} {speed_text(values['samples_per_s'])}",
                      "step", step=step, total=self.total_steps, epoch=epoch, **_plain(values))

    def flush(self) -> None:
        """Events up to now onto disk: called before each checkpoint, so a kill never loses curves
        that the checkpoint's resume will not log again."""
        self.writer.flush()

    def close(self) -> None:
        """End the status line and TensorBoard; again is a no-op (every exit of a run calls it)."""
        self.stop()
        self.writer.flush()
        self.writer.close()
        self.writer = NullWriter()
