"""The live status line: fits the terminal, drops the least useful fields first, ETA from step one."""

from __future__ import annotations

import pytest

from indextts_train.ui.progress import DROP_ORDER, EtaClock, format_duration, speed_text, status_line
from indextts_train.ui.text_log import unstamp

pytestmark = pytest.mark.slow  # every test here trains a tiny run or starts the CLI: seconds each

VALUES = {"loss": 2.2104, "text_loss": 3.9859, "mel_loss": 1.7723, "mel_top1": 0.629, "lr": 2.67e-3,
          "samples_per_s": 244.1}
LABELS = {"top1": "top1 0.629", "mel": "mel 1.7723", "text": "text 3.9859", "epoch": "ep 3", "bar": "[",
          "speed": "244.1 samples/s", "lr": "lr 2.67e-03", "loss": "loss 2.2104", "eta": "ETA 1:06:40"}


def line(width: int) -> str:
    return status_line(1234, 36000, epoch=3, eta_s=4000.4, values=VALUES, width=width)


@pytest.mark.parametrize("width", [200, 120, 100, 80, 60, 40, 20, 8])
def test_the_line_fits_and_keeps_the_most_useful_fields(width: int) -> None:
    text = line(width)
    assert len(text) <= width and text.startswith("step 1234/36000"[:width])
    shown = [name for name in DROP_ORDER if LABELS[name] in text]
    dropped = [name for name in DROP_ORDER if name not in shown]
    # whatever went is a prefix of DROP_ORDER: a field never goes while a less useful one stays
    assert dropped == list(DROP_ORDER[:len(dropped)])


def test_an_80_column_pane_shows_step_bar_eta_loss_lr_and_speed() -> None:
    text = line(80)
    for label in ("step 1234/36000", "[---", "ETA 1:06:40", "loss 2.2104", "lr 2.67e-03", "244.1 samples/s"):
        assert label in text, label
    assert "top1 0.629" in line(200)
    half = status_line(18000, 36000, epoch=3, eta_s=1.0, values=VALUES, width=200)
    assert "[" + "#" * 14 + "-" * 14 + "]" in half  # 28 cells, half filled


def test_eta_from_the_first_step_of_this_process() -> None:
    now = [100.0]
    clock = EtaClock(start_step=40, clock=lambda: now[0])  # a resume at step 40
    assert clock.eta(40, 100) is None
    now[0] = 102.0
    assert clock.eta(41, 100) == pytest.approx(2.0 * 59)
    assert status_line(41, 100, epoch=0, eta_s=clock.eta(41, 100), values=None, width=80).startswith(
        "step 41/100 [")
    assert "ETA 1:58" in status_line(41, 100, epoch=0, eta_s=118.0, values=None, width=80)
    assert (format_duration(59.6), format_duration(3725)) == ("1:00", "1:02:05")


def test_on_an_80_column_terminal_the_line_moves_every_step(tiny_data, tmp_path) -> None:
    """The real CLI on a pseudo-terminal 80 columns wide, as in a tmux pane."""
    import fcntl
    import os
    import re
    import struct
    import subprocess
    import sys
    import termios

    primary, secondary = os.openpty()
    fcntl.ioctl(secondary, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 80, 0, 0))
    env = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "LINES")} | {"TERM": "xterm-256color"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "indextts_train", "train", "--train-manifest", str(tiny_data["train"]), "--config",
         str(tiny_data["config"]), "--base-checkpoint", str(tiny_data["base"]), "--output-dir", str(tmp_path / "run"),
         "--batch-size", "2", "--effective-batch-size", "4", "--num-workers", "0", "--max-steps", "9",
         "--log-interval", "4", "--epochs", "10"], stdin=subprocess.DEVNULL, stdout=secondary, stderr=secondary,
        env=env)
    os.close(secondary)
    chunks = []
    while True:
        try:
            data = os.read(primary, 65536)
        except OSError:  # the terminal's other end closed: the run is over
            break
        if not data:
            break
        chunks.append(data)
    assert proc.wait(timeout=300) == 0
    os.close(primary)
    screen = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", b"".join(chunks).decode())  # cursor moves, colours
    drawn = [part.strip() for line in screen.split("\n") for part in line.split("\r") if part.strip()]
    live = [part for part in drawn if re.match(r"step \d+/9 \[[#-]+\] ETA ", part)]
    assert all(len(part) <= 80 for part in live), [part for part in live if len(part) > 80]
    moved = {int(part.split("/")[0].split()[1]) for part in live}
    assert {1, 2, 3, 5, 6, 7} <= moved  # every step between the log lines, not only at them
    first = next(part for part in live if part.startswith("step 1/9"))
    assert re.search(r"ETA \d+:\d\d ", first) and "loss " in first and "lr " in first  # from the first step
    scrollback = [part for part in map(unstamp, drawn) if re.match(r"step \d+/9 epoch ", part)]
    assert [part.split()[1] for part in scrollback] == ["4/9", "8/9", "9/9"]  # one line per log interval


def test_a_slow_step_reads_as_seconds_per_sample() -> None:
    assert speed_text(244.06) == "244.1 samples/s" and speed_text(1.0) == "1.0 samples/s"
    assert speed_text(1 / 83.8) == "83.8 s/sample"  # the real model on a CPU: not "0.0 samples/s"
    values = {"loss": 1.0, "text_loss": 1.0, "mel_loss": 1.0, "mel_top1": 0.5, "lr": 1e-3, "samples_per_s": 0.05}
    assert "20.0 s/sample" in status_line(4, 9, epoch=0, eta_s=None, values=values, width=200)
