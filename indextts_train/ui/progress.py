"""The live status line of a run on a terminal: it moves every step and fits the pane.

Runs are watched in 80-column tmux panes, so the line is built for the terminal's width: the
fields a user needs to judge a run (step, ETA, loss, learning rate, speed) stay, the others go first
(`DROP_ORDER`), and the bar takes whatever width is left. The ETA comes from this process's own
steps, so it is there after the first step of a start or a resume.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from rich.console import Console
from rich.live import Live
from rich.text import Text

# Least useful first: the split losses and top-1 are in the scrollback lines and TensorBoard.
DROP_ORDER = ("top1", "mel", "text", "epoch", "bar", "speed", "lr", "loss", "eta")
BAR_MIN, BAR_MAX = 10, 30


def format_duration(seconds: float) -> str:
    """1:02:03 from an hour on, else 4:05."""
    minutes, secs = divmod(int(round(seconds)), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}:{minutes:02d}:{secs:02d}" if hours else f"{minutes}:{secs:02d}"


def speed_text(samples_per_s: float) -> str:
    """`244.1 samples/s`; below one sample a second (the real model on a CPU) `37.2 s/sample`, which
    stays readable where `0.0 samples/s` would say nothing."""
    if samples_per_s >= 1 or samples_per_s <= 0:
        return f"{samples_per_s:.1f} samples/s"
    return f"{1 / samples_per_s:.1f} s/sample"


def _fields(step: int, total: int, epoch: int, eta_s: float | None, values: dict | None) -> dict[str, str]:
    """Every field in display order; a value not known yet (no loss before the first step) is left out."""
    fields = {"step": f"step {step}/{total}", "bar": "", "eta": f"ETA {format_duration(eta_s)}" if eta_s is not None
              else "ETA --:--", "epoch": f"ep {epoch}"}
    if values:
        fields |= {"loss": f"loss {values['loss']:.4f}", "text": f"text {values['text_loss']:.4f}",
                   "mel": f"mel {values['mel_loss']:.4f}", "top1": f"top1 {values['mel_top1']:.3f}",
                   "lr": f"lr {values['lr']:.2e}"}
        if values.get("samples_per_s") is not None:
            fields["speed"] = speed_text(values["samples_per_s"])
    return fields


def _bar(step: int, total: int, width: int) -> str:
    filled = min(width, width * step // max(total, 1))
    return "[" + "#" * filled + "-" * (width - filled) + "]"


def status_line(step: int, total: int, *, epoch: int, eta_s: float | None, values: dict | None, width: int) -> str:
    """One line of at most `width` characters; fields in DROP_ORDER go until the rest fits."""
    fields = _fields(step, total, epoch, eta_s, values)
    for name in (None, *DROP_ORDER):
        fields.pop(name, None)
        fixed = [text for key, text in fields.items() if key != "bar"]
        room = width - len(" ".join(fixed)) - 1  # the bar's own separating space
        if "bar" in fields and room >= BAR_MIN + 2:
            fields["bar"] = _bar(step, total, min(BAR_MAX, room) - 2)
            return " ".join(text for text in fields.values())
        if "bar" not in fields and len(" ".join(fixed)) <= width:
            return " ".join(fixed)
    return fields["step"][:width]


class EtaClock:
    """Time per step over this process's steps so far (a resume starts its own clock)."""

    def __init__(self, start_step: int, clock: Callable[[], float] = time.perf_counter) -> None:
        self.start_step, self.clock = start_step, clock
        self.start_time = clock()

    def eta(self, step: int, total: int) -> float | None:
        done = step - self.start_step
        if done <= 0:
            return None
        return (self.clock() - self.start_time) / done * max(total - step, 0)


class LiveStatus:
    """The status line redrawn in place every step; plain lines printed meanwhile scroll above it.

    No refresh thread (auto_refresh off): the line changes exactly when a step ends.
    """

    def __init__(self, console: Console, total: int, start_step: int) -> None:
        self.console, self.total = console, total
        self.clock = EtaClock(start_step)
        self._live = Live(console=console, auto_refresh=False, transient=True)
        self._live.start()

    def update(self, step: int, epoch: int, values: dict | None) -> None:
        line = status_line(step, self.total, epoch=epoch, eta_s=self.clock.eta(step, self.total), values=values,
                           width=self.console.width)
        self._live.update(Text(line, no_wrap=True, overflow="crop"), refresh=True)

    def stop(self) -> None:
        self._live.stop()
