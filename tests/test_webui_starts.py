"""How the page starts runs when more than one thing starts them: two page servers on one folder, and a page
that was itself started in the background (SIGINT ignored), whose runs must still stop on Stop."""

from __future__ import annotations

import fcntl
import os
import signal
import sys
import time

import pytest

from indextts_train.errors import UserError
from indextts_train.webui.runs import LOCK_NAME, RunRegistry, let_runs_take_ctrl_c, read_log

# A run still in its setup: it has not taken train.lock yet (the trainer imports torch first: seconds).
SETTING_UP = "import time; print('setting up', flush=True); time.sleep(60)"
# A run that takes train.lock as the trainer does (flock, then its PID), then trains.
LOCKING = ("import fcntl, os, sys, time\n"
           "fd = os.open(os.path.join(sys.argv[1], 'train.lock'), os.O_RDWR | os.O_CREAT)\n"
           "fcntl.flock(fd, fcntl.LOCK_EX)\n"
           "os.write(fd, f'pid={os.getpid()} started=2026-01-01T00:00:00Z\\n'.encode())\n"
           "print('locked', flush=True)\n"
           "time.sleep(60)\n")


def _wait(condition, what: str, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def _end(launch) -> None:
    if launch.process.poll() is None:
        os.killpg(launch.pid, signal.SIGKILL)
    launch.process.wait(timeout=30)


@pytest.mark.slow  # starts processes
def test_two_pages_on_one_folder_start_one_run_between_them(tmp_path) -> None:
    """Each page found the folder free in the instant before the trainer took train.lock, and each started a run
    into it (the second was then refused by the trainer, while its page said it had started). The first page's
    claim holds until its run holds the lock, so the second page refuses in one line and starts nothing."""
    out = tmp_path / "run"
    first, second = RunRegistry(), RunRegistry()  # two web servers on the same --root
    launch = first.start([sys.executable, "-c", SETTING_UP], out)
    try:
        with pytest.raises(UserError, match="a run is starting in .* from another page"):
            second.start([sys.executable, "-c", "print('second run')"], out)
        assert "second run" not in read_log(None, out)
    finally:
        _end(launch)
    assert not launch.running()  # ended before it took the lock: the claim is given back at once
    later = second.start([sys.executable, "-c", LOCKING, str(out)], out)
    try:
        _wait(lambda: "locked" in read_log(later, out), "the run to take its lock")
        _wait(lambda: _claim_free(out), "the claim to be given back once the run holds its lock")
        with pytest.raises(UserError, match=f"PID {later.pid}"):  # now the trainer's lock says it, to any page
            first.start([sys.executable, "-c", "print('third run')"], out)
    finally:
        _end(later)


def _claim_free(out) -> bool:
    with open(out / "train.log", "rb") as log:
        try:
            fcntl.flock(log, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return False
        return True


@pytest.mark.slow  # starts a process
def test_runs_of_a_page_started_in_the_background_take_ctrl_c(tmp_path) -> None:
    """A page started by a script in the background ignores SIGINT, and its runs inherited that: Stop in a run's
    first seconds was lost (the page said it was sent, the run trained on to its end)."""
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)  # as `indextts-train webui &` in a script starts it
    try:
        let_runs_take_ctrl_c()  # what serve() does before it serves
        out = tmp_path / "run"
        launch = RunRegistry().start([sys.executable, "-c", "import signal\n"
                                      "print('ignored' if signal.getsignal(signal.SIGINT) is signal.SIG_IGN "
                                      "else 'default', flush=True)"], out)
        launch.process.wait(timeout=30)
        assert read_log(launch, out).splitlines()[-1] == "default"
        os.kill(os.getpid(), signal.SIGINT)  # the page itself still ignores it, as it was told
    finally:
        signal.signal(signal.SIGINT, previous)
    assert LOCK_NAME not in os.listdir(out)
