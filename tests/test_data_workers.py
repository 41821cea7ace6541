"""Data-loader workers never outlive their parent, and a stop signal during setup ends a run at once.

Workers ignore the stop signals (the main process finishes its step and saves first), so a parent
killed outright must take them with it: the kernel does (PR_SET_PDEATHSIG), not torch's watchdog seconds
later. Setup (indexing, reading checkpoints, building the model) has nothing to save, so a SIGINT or
SIGTERM there ends the process within seconds with 130/143 and the run lock released.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from helpers import ROOT, start

from indextts_train.train.runlock import RunLock

WORKER_SCRIPT = textwrap.dedent("""
    import multiprocessing, time
    import torch
    from indextts_train.data.workers import StopSafeLoader, ignore_stop_signals_in_worker
    loader = StopSafeLoader(list(range(64)), batch_size=2, num_workers=2,
                            worker_init_fn=ignore_stop_signals_in_worker)
    batches = iter(loader)
    next(batches)
    print(" ".join(str(p.pid) for p in multiprocessing.active_children()), flush=True)
    time.sleep(120)
""")


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


@pytest.mark.slow  # starts a parent process and kills it
def test_workers_die_with_a_killed_parent() -> None:
    parent = subprocess.Popen([sys.executable, "-c", WORKER_SCRIPT], stdout=subprocess.PIPE, text=True, cwd=ROOT)
    try:
        workers = [int(pid) for pid in parent.stdout.readline().split()]
        assert len(workers) == 2 and all(alive(pid) for pid in workers)
        parent.kill()
        parent.wait()
        deadline = time.monotonic() + 2.0  # torch's own watchdog would take up to 5 s
        while any(alive(pid) for pid in workers) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not any(alive(pid) for pid in workers)
    finally:
        parent.kill()
        parent.wait()


def stopped(pid: int) -> bool:
    with open(f"/proc/{pid}/stat") as stat:
        return stat.read().rsplit(")", 1)[1].split()[0] == "T"


@pytest.mark.slow
@pytest.mark.parametrize(("signum", "code"), [(signal.SIGTERM, 143), (signal.SIGINT, 130)])
def test_a_stop_during_setup_ends_the_run_before_any_step(tiny_data, tmp_path: Path, signum: int, code: int) -> None:
    out = tmp_path / "run"
    proc = start([sys.executable, "-m", "indextts_train", "train", "--train-manifest", str(tiny_data["train"]),
                  "--config", str(tiny_data["config"]), "--base-checkpoint", str(tiny_data["base"]),
                  "--output-dir", str(out), "--max-steps", "3", "--batch-size", "2", "--num-workers", "0"],
                 env={"INDEXTTS_TRAIN_PAUSE_AT": "setup@0"})  # stops itself in setup, lock held
    try:
        deadline = time.monotonic() + 120
        while not stopped(proc.pid):
            assert proc.poll() is None and time.monotonic() < deadline
            time.sleep(0.05)
        os.kill(proc.pid, signum)
        os.kill(proc.pid, signal.SIGCONT)
        started = time.monotonic()
        output, _ = proc.communicate(timeout=60)
        assert time.monotonic() - started < 10
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == code, output[-2000:]
    assert "during setup, before the first step" in output and "Traceback" not in output
    assert "step 1" not in output
    # Nothing written, nothing half: a refused start takes back the folder it created (lock and log
    # included), so the output dir does not exist; had it existed before, only its lock would remain.
    assert not out.exists()
    out.mkdir()
    RunLock(out).acquire().release()  # nobody holds a lock on it
