"""Data-loader worker processes that survive a stop signal, and that never outlive the run.

A stop (Ctrl+C, or SIGTERM/SIGHUP from docker, Kubernetes, SLURM, systemd) often reaches every
process of the job at once. The main process turns it into "finish the step, save, exit"; the
workers must simply keep serving until then.
"""

from __future__ import annotations

import multiprocessing
import signal

from torch.utils.data import DataLoader

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


def ignore_stop_signals_in_worker(worker_id: int) -> None:
    # Ctrl+C, and SIGTERM/SIGHUP from docker, Kubernetes, SLURM or systemd, reach the whole process
    # group. Workers must survive them so the main process can finish its optimizer step, save and
    # exit with the signal's code (torch's own worker handler dies on a SIGTERM not sent by the
    # parent, and the main process then fails with "DataLoader worker ... exited unexpectedly").
    for signum in STOP_SIGNALS:
        signal.signal(signum, signal.SIG_IGN)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, STOP_SIGNALS)


class StopSafeLoader(DataLoader):
    """Workers start with the stop signals blocked, so none can die in the instant between fork and
    `ignore_stop_signals_in_worker`; the main process gets a signal that came meanwhile right after."""

    def _get_iterator(self):  # noqa: ANN202 (DataLoader's own private hook)
        if not self.num_workers:
            return super()._get_iterator()
        previous = signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)
        try:
            return super()._get_iterator()
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, previous)


def reap_workers() -> None:
    """Kill and join the data workers still alive when a run ends on an exception.

    They ignore SIGTERM (above), and Python's exit joins its daemon children after sending them
    exactly that: a worker of a loader that an exception kept alive would hang the exit forever.
    """
    for child in multiprocessing.active_children():
        if child.daemon:
            child.kill()
            child.join()
