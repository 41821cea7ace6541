"""Data-loader worker processes that survive a stop signal, and that never outlive the run (nor their parent).

A stop (Ctrl+C, or SIGTERM/SIGHUP from docker, Kubernetes, SLURM, systemd) often reaches every
process of the job at once. The main process turns it into "finish the step, save, exit"; the
workers must simply keep serving until then.
"""

from __future__ import annotations

import ctypes
import multiprocessing
import os
import signal
import sys
from collections.abc import Iterable, Iterator

from torch.utils.data import DataLoader

from indextts_train.errors import LoaderDied, UserError

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
PR_SET_PDEATHSIG = 1  # <linux/prctl.h>


def ignore_stop_signals_in_worker(worker_id: int) -> None:
    # Ctrl+C, and SIGTERM/SIGHUP from docker, Kubernetes, SLURM or systemd, reach the whole process
    # group. Workers must survive them so the main process can finish its optimizer step, save and
    # exit with the signal's code (torch's own worker handler dies on a SIGTERM not sent by the
    # parent, and the main process then fails with "DataLoader worker ... exited unexpectedly").
    for signum in STOP_SIGNALS:
        signal.signal(signum, signal.SIG_IGN)
    die_with_parent()
    signal.pthread_sigmask(signal.SIG_UNBLOCK, STOP_SIGNALS)


def die_with_parent() -> None:
    """Have the kernel SIGKILL this worker the moment its parent dies (Linux prctl PR_SET_PDEATHSIG).

    A worker ignores the stop signals (above), so a parent killed with SIGKILL, or dead of out of memory,
    would otherwise leave it serving nobody until torch's watchdog notices (seconds, and never when it
    is blocked). A parent already gone before the prctl is caught by comparing the parent PID.
    """
    parent = multiprocessing.parent_process()
    if not sys.platform.startswith("linux") or parent is None:
        return
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) != 0:
        return  # not allowed here (a sandbox): torch's watchdog remains
    if os.getppid() != parent.pid:
        os._exit(1)


class StopSafeLoader(DataLoader):
    """Workers start with the stop signals blocked, so none can die in the instant between fork and
    `ignore_stop_signals_in_worker`; the main process gets a signal that came meanwhile right after.

    A worker that dies (the out-of-memory killer's SIGKILL, most often) is said as a UserError from the
    next batch asked for (`_SaysDeadWorkers`), which the training loop answers by saving the last completed
    step. torch's own SIGCHLD handler raises its RuntimeError wherever the main process happens to be (in
    the middle of an optimizer step, say), so it is put back to the handler it replaced: the loader's own
    liveness check (every 5 s while it waits for a batch) finds the dead worker instead.
    """

    def _get_iterator(self):  # noqa: ANN202 (DataLoader's own private hook)
        if not self.num_workers:
            return super()._get_iterator()
        previous = signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)
        sigchld = signal.getsignal(signal.SIGCHLD)
        try:
            iterator = super()._get_iterator()
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, previous)
        if sigchld is not None and signal.getsignal(signal.SIGCHLD) is not sigchld:  # torch set its handler
            signal.signal(signal.SIGCHLD, sigchld)  # torch sets it once a process: it stays ours
        return _SaysDeadWorkers(iterator)


class _SaysDeadWorkers:
    """A loader iterator whose dead worker is one UserError line naming it, not torch's traceback."""

    def __init__(self, iterator: Iterator) -> None:
        self.iterator = iterator

    def __iter__(self) -> _SaysDeadWorkers:
        return self

    def __len__(self) -> int:
        return len(self.iterator)

    def __getattr__(self, name: str) -> object:  # what DataLoader asks of its iterator (_reset, ...)
        return getattr(self.iterator, name)

    def __next__(self) -> object:
        try:
            return next(self.iterator)
        except (StopIteration, UserError):
            raise
        except Exception as exc:  # a dead worker shows as RuntimeError, or as the broken pipe it left
            dead = dead_workers(getattr(self.iterator, "_workers", ()))
            if not dead:
                raise
            raise LoaderDied(f"data-loader worker {dead} ended while loading samples (a SIGKILL is most often the "
                            "system's out-of-memory killer); pass a lower --num-workers, or give the run more "
                            "memory") from exc


def dead_workers(workers: Iterable[multiprocessing.Process]) -> str:
    """'pid N (killed by SIGKILL)' for each worker that is no longer alive; '' when all are."""
    said = []
    for worker in workers:
        worker.join(timeout=0.5)  # a worker killed a moment ago may not be reaped yet
        if worker.exitcode is None:
            continue
        code = worker.exitcode
        how = f"killed by {signal.Signals(-code).name}" if code < 0 and -code in signal.valid_signals() \
            else f"exit code {code}"
        said.append(f"pid {worker.pid} ({how})")
    return ", ".join(said)


def reap_workers() -> None:
    """Kill and join the data workers still alive when a run ends on an exception.

    They ignore SIGTERM (above), and Python's exit joins its daemon children after sending them
    exactly that: a worker of a loader that an exception kept alive would hang the exit forever.
    """
    for child in multiprocessing.active_children():
        if child.daemon:
            child.kill()
            child.join()
