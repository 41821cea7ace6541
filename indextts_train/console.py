"""What the user sees: a rich progress bar on a terminal, plain lines elsewhere, TensorBoard always.

Runs live in tmux, `| tee`, nohup and CI logs, where a redrawing bar turns into garbage, so the bar
is only used when stdout is a terminal; otherwise every `log_interval` steps prints one line that
greps well. Only rank 0 talks; other ranks get a `RunLogger(enabled=False)`.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeRemainingColumn
from rich.table import Column


class NullWriter:
    """TensorBoard stand-in for ranks that do not write (torchtitan's no-op metrics writer)."""

    def add_scalar(self, tag: str, value: float, step: int) -> None:
        pass

    def flush(self) -> None:
        pass

    def close(self) -> None:
        pass


class RunLogger:
    def __init__(self, output_dir: Path | None, total_steps: int, *, enabled: bool = True,
                 tensorboard: bool = True) -> None:
        self.enabled = enabled
        self.interactive = enabled and sys.stdout.isatty()
        # One decision, ours: rich's own terminal detection can disagree (TERM unset, CI variables).
        self.console = Console(highlight=False, soft_wrap=True, force_terminal=self.interactive or None)
        self.total_steps = total_steps
        self.writer = NullWriter()
        self.log_dir: Path | None = None
        if enabled and tensorboard and output_dir is not None:
            from torch.utils.tensorboard import SummaryWriter

            # One folder per invocation: a resumed run appends its own event file and TensorBoard
            # joins them by step, so a restart never overwrites the earlier curves.
            self.log_dir = output_dir / "logs" / time.strftime("run_%Y%m%d-%H%M%S")
            self.writer = SummaryWriter(str(self.log_dir))
        self._progress: Progress | None = None
        self._task = None

    def info(self, message: str) -> None:
        if self.enabled:
            self.console.print(message, markup=False)

    def warn(self, message: str) -> None:
        if self.enabled:
            self.console.print(f"warning: {message}", markup=False, style="yellow")

    def start(self, step: int) -> None:
        if not self.interactive:
            return
        # Step, bar and ETA first: on a narrow terminal only the tail of the status gets cut.
        self._progress = Progress(
            TextColumn("step {task.completed}/{task.total}", table_column=Column(no_wrap=True)),
            BarColumn(bar_width=24), TimeRemainingColumn(),
            TextColumn("{task.fields[status]}", table_column=Column(no_wrap=True, overflow="ellipsis", ratio=1)),
            console=self.console, expand=True,
        )
        self._task = self._progress.add_task("train", total=self.total_steps, completed=step, status="")
        self._progress.start()

    def stop(self) -> None:
        if self._progress is not None:
            self._progress.stop()
            self._progress = None

    def scalars(self, prefix: str, values: dict[str, float], step: int) -> None:
        for name, value in values.items():
            self.writer.add_scalar(f"{prefix}/{name}", value, step)

    def train_step(self, step: int, epoch: int, values: dict[str, float], *, print_line: bool) -> None:
        """Progress bar every step on a terminal; one plain line every log_interval elsewhere."""
        if not self.enabled:
            return
        status = (f"epoch {epoch} loss {values['loss']:.4f} text {values['text_loss']:.4f} "
                  f"mel {values['mel_loss']:.4f} top1 {values['mel_top1']:.3f} lr {values['lr']:.2e} "
                  f"{values['samples_per_s']:.1f} samples/s")
        if self._progress is not None:
            self._progress.update(self._task, completed=step, status=status)
        elif print_line:
            self.info(f"step {step}/{self.total_steps} {status}")

    def close(self) -> None:
        self.stop()
        self.writer.flush()
        self.writer.close()
