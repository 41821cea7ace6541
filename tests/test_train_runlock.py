"""The run lock (runlock.py): a correct acquire never fails because someone asks who holds it, and a
failed lock write leaks no descriptor."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from indextts_train.errors import UserError
from indextts_train.train import runlock
from indextts_train.train.runlock import RunLock, holder_pid

ROOT = Path(__file__).resolve().parents[1]
PROBE = "import sys\nfrom indextts_train.train.runlock import holder_pid\nwhile True:\n    holder_pid(sys.argv[1])\n"


@pytest.mark.slow
def test_acquire_never_fails_while_another_process_probes_the_holder(tmp_path) -> None:
    RunLock(tmp_path).acquire().release()  # the lock file exists: the probe has something to open
    probe = subprocess.Popen([sys.executable, "-c", PROBE, str(tmp_path)], cwd=ROOT)
    try:
        time.sleep(0.5)  # the probe's interpreter has started and is asking
        failures, tries, deadline = 0, 0, time.monotonic() + 3.0
        while tries < 20_000 and time.monotonic() < deadline:  # bounded: a few seconds at most
            tries += 1
            try:
                RunLock(tmp_path).acquire().release()
            except UserError:
                failures += 1
        assert probe.poll() is None, "the probe died: the test proved nothing"
    finally:
        probe.kill()
        probe.wait()
    assert tries > 500 and failures == 0, f"{failures} of {tries} correct acquires failed"


def test_holder_pid_sees_a_holder_and_takes_no_lock(tmp_path) -> None:
    assert holder_pid(tmp_path) is None
    with RunLock(tmp_path):
        assert holder_pid(tmp_path) == os.getpid()
        assert holder_pid(tmp_path) == os.getpid()
    assert holder_pid(tmp_path) is None


def open_descriptors() -> int:
    return len(os.listdir("/proc/self/fd"))


def test_a_failed_lock_write_leaks_no_descriptor_and_no_lock(tmp_path, monkeypatch) -> None:
    def full_disk(fd: int, data: bytes) -> int:
        raise OSError(28, "No space left on device")

    before = open_descriptors()
    monkeypatch.setattr(runlock.os, "write", full_disk)
    with pytest.raises(UserError, match="no space left on device"):
        RunLock(tmp_path).acquire()
    monkeypatch.undo()
    assert open_descriptors() == before
    assert holder_pid(tmp_path) is None
    RunLock(tmp_path).acquire().release()  # the lock was not left held
