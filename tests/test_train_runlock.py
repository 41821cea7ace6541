"""The run lock (runlock.py): a correct acquire never fails because someone asks who holds it, and a
failed lock write leaks no descriptor."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import threading
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


def _within(call, seconds: float, fifo: Path):
    """`call()` in a thread; still blocked after `seconds` fails the test (the FIFO is then opened for
    writing, which frees a reader waiting on it, so the suite goes on)."""
    result: list = []

    def calling() -> None:
        try:
            result.append((call(), None))
        except BaseException as exc:  # raised again below, in the test's thread
            result.append((None, exc))

    worker = threading.Thread(target=calling, daemon=True)
    worker.start()
    worker.join(seconds)
    if worker.is_alive():
        while worker.is_alive():
            with contextlib.suppress(OSError):
                os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
            worker.join(0.1)
        pytest.fail(f"blocked on the FIFO {fifo}")
    value, error = result[0]
    if error is not None:
        raise error
    return value


def test_a_lock_file_that_is_not_the_runs_own_is_refused_and_left_as_it_was(tmp_path) -> None:
    """A link in the lock's place had its target truncated and written with the holder line; a FIFO
    hung holder_pid (the page's watch) for good."""
    victim = tmp_path / "notes.txt"
    victim.write_text("precious\n")
    linked, fifo, hard = tmp_path / "linked", tmp_path / "fifo", tmp_path / "hard"
    for folder in (linked, fifo, hard):
        folder.mkdir()
    (linked / runlock.LOCK_NAME).symlink_to(victim)
    os.mkfifo(fifo / runlock.LOCK_NAME)
    os.link(victim, hard / runlock.LOCK_NAME)
    kinds = ((linked, "is a link"), (fifo, "is not a regular file"), (hard, "is a file with another hard link"))
    for folder, kind in kinds:
        assert _within(lambda folder=folder: holder_pid(folder), 10, fifo / runlock.LOCK_NAME) is None
        with pytest.raises(UserError, match=f"{folder / runlock.LOCK_NAME}: {kind}.*move this one out"):
            _within(lambda folder=folder: RunLock(folder).acquire(), 10, fifo / runlock.LOCK_NAME)
    assert victim.read_text() == "precious\n" and (fifo / runlock.LOCK_NAME).is_fifo()
    assert (linked / runlock.LOCK_NAME).is_symlink()


def test_the_write_probe_never_touches_a_file_already_there(tmp_path, monkeypatch) -> None:
    """The probe had a predictable name (.write-test-PID): a file of that name was written, then removed."""
    theirs = tmp_path / f".write-test-{os.getpid()}"
    theirs.write_text("theirs\n")
    assert runlock.preflight_output_dir(tmp_path) == tmp_path
    assert theirs.read_text() == "theirs\n" and sorted(p.name for p in tmp_path.iterdir()) == [theirs.name]
