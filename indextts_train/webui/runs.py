"""Runs started from the page: the train-gpt child process, found again after a reload or a restart.

The page never trains in its own process. It starts the same command a user would type, as a child
in its own session (`start_new_session`), so closing the browser, reloading the page or stopping
the web server with Ctrl+C leaves the run alone, and Stop can signal the child's whole process group
(data workers included) the way Ctrl+C in a terminal does. The child's output goes to
`OUTPUT_DIR/train.log`, the file the tmux recipe tees into, so both kinds of runs are watched alike.

A run is found again from the output dir: first among the children this server started (their exit
code is known), then through the run lock the trainer holds on `OUTPUT_DIR/train.lock`
(`runlock.holder_pid`: the PID of the process holding it right now): a run started in a terminal or
tmux, or by this page before the web server was restarted, shows as running with its PID, and Stop
signals it. No module here imports Gradio.
"""

from __future__ import annotations

import errno
import fcntl
import os
import shlex
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO

from indextts_train.errors import UserError
from indextts_train.train.runlock import LOCK_NAME, holder_pid  # noqa: F401 (LOCK_NAME: where the lock lives)
from indextts_train.ui.text_log import LOG_NAME
from indextts_train.webui.guards import AUTH_ENV
from indextts_train.webui.roots import Roots, open_regular, shown

HEADER = "=== indextts-train webui"  # starts the line written before each run's own output
CLAIM_S = 600.0  # seconds a page's claim on a folder may wait for its run to take train.lock (setup: seconds)
NOT_READ = "train.log not read: "  # what read_log gives instead of a log it refuses


@dataclass
class Launch:
    """One invocation of the trainer in an output dir, started here or found through its lock."""

    argv: list[str]
    output_dir: Path
    pid: int
    started: float
    log_offset: int  # this invocation's output starts here in train.log
    process: subprocess.Popen | None = None  # None: not our child (found through the lock)
    exit_code: int | None = None
    steps_seen: list[tuple[float, int]] = field(default_factory=list)  # (time, step) for the ETA
    claim: Claim | None = None  # the page's claim on the folder until the run holds train.lock

    def running(self) -> bool:
        if self.process is not None:
            self.exit_code = self.process.poll()  # also reaps the child
            if self.exit_code is not None and self.claim is not None:
                self.claim.release()  # ended before taking train.lock: the folder is free again at once
            return self.exit_code is None
        return holder_pid(self.output_dir) == self.pid


def let_runs_take_ctrl_c() -> None:
    """Call in the main thread before any run starts. A page started in the background by a script (`webui &` in
    a script, a notebook's `!nohup ... &`) ignores SIGINT, and its runs inherited that (an ignored signal stays
    ignored across exec): Stop in a run's first seconds, before the trainer's own handler, was lost while the page
    said it was sent. A Python handler that does nothing keeps the page as it was told, and a started program gets
    the default back."""
    if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        signal.signal(signal.SIGINT, lambda *_: None)


def run_environment() -> dict[str, str]:
    """A run's environment: the page's, less its password (a run has no use for it, and a listen child or a
    crash report would carry it on), with Python's output unbuffered (the log box shows lines as they come)."""
    return {**{k: v for k, v in os.environ.items() if k != AUTH_ENV}, "PYTHONUNBUFFERED": "1"}


def shell_line(argv: list[str]) -> str:
    """argv as one line a shell reads back into the same argv."""
    return shlex.join(argv)


def running_command(launch: Launch) -> str:
    """The command line Watch shows for a launch: the page's own, or that of a train run of its folder. A lock
    names any PID its writer chose: the command line of another program (another user's, with its secrets)
    is not shown."""
    if launch.process is None and not is_train_run_of(launch.pid, launch.output_dir):
        return (f"(PID {launch.pid}, named by {LOCK_NAME}, is not a train run of this folder: its command line is "
                "not shown)")
    return shown(shell_line(launch.argv))


def train_command(flags: list[str]) -> list[str]:
    """`train-gpt FLAGS` through this interpreter, so it runs wherever the page runs (venv, conda)."""
    return [sys.executable, "-m", "indextts_train", "train", *flags]


def cli_command(args: list[str]) -> list[str]:
    """Any other `indextts-train` command, through this interpreter."""
    return [sys.executable, "-m", "indextts_train", *args]


def _cmdline_of(pid: int) -> list[str]:
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return []
    return [part.decode(errors="replace") for part in raw.split(b"\0") if part]


def _process_cwd(pid: int) -> Path | None:
    try:
        return Path(os.readlink(f"/proc/{pid}/cwd"))
    except OSError:
        return None


def _output_dir_arg(argv: list[str]) -> str | None:
    """The last --output-dir value of an argv (the one the trainer uses), or None."""
    found = None
    for i, arg in enumerate(argv):
        flag, equals, inline = arg.partition("=")
        if flag == "--output-dir":
            found = inline if equals else (argv[i + 1] if i + 1 < len(argv) else None)
    return found


def _is_train_command(argv: list[str]) -> bool:
    """`train-gpt ...`, `trainers/train_gpt_v2.py ...`, `indextts-train train ...`, or `python [-u] -m
    indextts_train [train] --flags ...` (the module trains when its first argument is a flag)."""
    names = [os.path.basename(arg) for arg in argv[:5]]  # the interpreter and its own options come first
    if any(name in ("train-gpt", "train_gpt_v2.py") for name in names):
        return True
    entry = next((i for i, name in enumerate(names) if name in ("indextts-train", "indextts_train")), None)
    if entry is None:
        return False
    after = argv[entry + 1] if entry + 1 < len(argv) else ""
    return after == "train" or (names[entry] == "indextts_train" and after.startswith("--"))


def is_train_run_of(pid: int, output_dir: Path) -> bool:
    """Whether process `pid` is owned by this user and its command line (from /proc) is a train run
    whose --output-dir, resolved from that process's folder, is `output_dir`."""
    try:
        if os.stat(f"/proc/{pid}").st_uid != os.getuid():
            return False
    except OSError:
        return False
    argv = _cmdline_of(pid)
    value, cwd = _output_dir_arg(argv), _process_cwd(pid)
    if not _is_train_command(argv) or value is None or cwd is None:
        return False
    return os.path.realpath(cwd / os.path.expanduser(value)) == os.path.realpath(output_dir)  # no RuntimeError


class RunRegistry:
    """The runs this server knows, by output dir. Gradio calls handlers from several threads."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._launches: dict[Path, Launch] = {}
        # Held from the look for a running run to the new one's registration: Start and Resume are two
        # events Gradio runs at once, and both found the folder free and started a run each into it.
        self._starting = threading.Lock()

    def find(self, output_dir: Path) -> Launch | None:
        """Our own launch in this dir while it runs, else a live run holding its lock (one started in a terminal
        after ours ended: it was not seen, and Start started a second run into the folder), else our ended one."""
        output_dir = Path(output_dir).resolve()
        with self._lock:
            launch = self._launches.get(output_dir)
            if launch is not None and launch.running():
                return launch
            # A lock that is a symlink is not this run's (and may lead outside the page's folders).
            pid = None if (output_dir / LOCK_NAME).is_symlink() else holder_pid(output_dir)
            if pid is None or pid < 0:  # free, or a run is starting: the next look names it
                return launch
            if launch is None or launch.pid != pid:
                launch = Launch(_cmdline_of(pid), output_dir, pid, time.time(), 0)
                self._launches[output_dir] = launch
            return launch

    def start(self, argv: list[str], output_dir: Path) -> Launch:
        """Start argv as a child in its own session, its output appended to OUTPUT_DIR/train.log.

        `output_dir` is the folder as the page checked it (resolved): it is made and opened one part at a
        time without following a symlink, and train.log is opened in that open folder, so a part swapped for
        a link to elsewhere after the check is refused, never written through."""
        path = Path(os.path.abspath(output_dir))
        output_dir = Path(output_dir).resolve()
        with self._starting:
            self._refuse_busy(output_dir)
            with _open_log(path) as log:
                claim = Claim.take(log, output_dir)
                try:
                    self._refuse_busy(output_dir)  # a run another page started before our claim, now holding its lock
                    offset, process = _spawn(argv, log, output_dir)
                except BaseException:
                    claim.release()
                    raise
            launch = Launch(argv, output_dir, process.pid, time.time(), offset, process, claim=claim)
            claim.hold_until_locked(process, output_dir)
            with self._lock:
                self._launches[output_dir] = launch
        return launch

    def _refuse_busy(self, output_dir: Path) -> None:
        current = self.find(output_dir)
        if current is not None and current.running():
            raise UserError(f"a run (PID {current.pid}) is already training in {output_dir}; stop it first")
        if not (output_dir / LOCK_NAME).is_symlink() and holder_pid(output_dir) == -1:
            raise UserError(f"a run is starting in {output_dir} (it holds {LOCK_NAME}); watch it, or stop it first")

    def stop(self, output_dir: Path) -> str:
        """SIGINT to the run's process group: it finishes the step, saves, and exits 130. Returns whom it
        signalled (the group, or the run's PID alone when the run shares the page's group).

        Only a child this server started, or a process whose own command line is a train run of this
        very output dir, owned by this user: the lock file's PID alone proves nothing (anyone who can
        write the folder can forge it).
        """
        launch = self.find(output_dir)
        if launch is None or not launch.running():
            raise UserError(f"no run is training in {Path(output_dir).resolve()}")
        if launch.process is None and not is_train_run_of(launch.pid, launch.output_dir):
            raise UserError(f"{launch.output_dir / LOCK_NAME} names PID {launch.pid}, which is not a train-gpt run "
                            "of this output dir owned by you; it was not signalled")
        whom = f"the process group of PID {launch.pid}"
        try:
            group = os.getpgid(launch.pid)
            if group == os.getpgrp():  # a run started beside the page, in its group (a script's `&`): not the page
                whom = f"PID {launch.pid} (it shares this page's process group, which is not signalled)"
                os.kill(launch.pid, signal.SIGINT)
            else:
                os.killpg(group, signal.SIGINT)
        except ProcessLookupError:
            pass  # ended in between: its exit code says how
        return whom


class Claim:
    """The page's exclusive flock on a second descriptor of OUTPUT_DIR/train.log, from its look for a running run
    until its child holds train.lock (or ended): two pages on one folder both found it free in the instant before
    the trainer took its lock, and each started a run into it. train.log is the page's own file, which no one
    else locks; the folder is listen's lock, and train.lock the trainer's. Released on close; the child does not
    inherit it (close-on-exec)."""

    def __init__(self, fd: int | None) -> None:
        self._fd = fd
        self._lock = threading.Lock()

    @classmethod
    def take(cls, log: BinaryIO, output_dir: Path) -> Claim:
        try:  # the same file reopened: another open file description, so the child's stdout holds no lock
            fd = os.open(f"/proc/self/fd/{log.fileno()}", os.O_RDONLY | os.O_CLOEXEC)
        except OSError:
            return cls(None)  # no /proc: unclaimed (the trainer's lock refuses the later run, once started)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            os.close(fd)
            if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN):
                raise UserError(f"a run is starting in {output_dir} from another page (it holds {LOG_NAME}); "
                                "watch it, or stop it first") from None
            return cls(None)  # a file system without flock: unclaimed, as above
        return cls(fd)

    def hold_until_locked(self, process: subprocess.Popen, folder: Path) -> None:
        """Release the claim, in a thread of its own, once `process` holds `folder`'s train.lock, ends, or CLAIM_S
        passed (a run refused in setup never takes it)."""
        if self._fd is None:
            return
        deadline = time.monotonic() + CLAIM_S

        def wait() -> None:
            while process.poll() is None and holder_pid(folder) is None and time.monotonic() < deadline:
                time.sleep(0.1)
            self.release()

        threading.Thread(target=wait, name="webui-claim", daemon=True).start()

    def release(self) -> None:
        with self._lock:
            fd, self._fd = self._fd, None
        if fd is not None:
            os.close(fd)


def _spawn(argv: list[str], log: BinaryIO, output_dir: Path) -> tuple[int, subprocess.Popen]:
    """(where its output starts in train.log, the child): argv started after a header line naming it."""
    offset = log.seek(0, os.SEEK_END)
    log.write(f"{HEADER} {time.strftime('%Y-%m-%d %H:%M:%S')}: {shlex.join(argv)}\n".encode())
    log.flush()
    try:
        return offset, subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                        start_new_session=True, env=run_environment())
    except OSError as exc:  # E2BIG: a command line past the system's limit, ENOMEM, ...
        raise UserError(f"the run could not be started ({exc.strerror}); nothing runs in {output_dir}") from None


_DIRECTORY = os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC | getattr(os, "O_PATH", os.O_RDONLY)


def _open_folder(path: Path) -> int:
    """A descriptor of the folder `path` (absolute), each missing part made, reached one part at a time
    from / without following a symbolic link (O_NOFOLLOW on every part, not only the last)."""
    fd = os.open("/", _DIRECTORY)
    try:
        for part in path.parts[1:]:
            try:
                child = os.open(part, _DIRECTORY, dir_fd=fd)
            except FileNotFoundError:
                os.mkdir(part, dir_fd=fd)
                child = os.open(part, _DIRECTORY, dir_fd=fd)
            os.close(fd)
            fd = child
    except BaseException:
        os.close(fd)
        raise
    return fd


def _open_log(output_dir: Path) -> BinaryIO:
    """OUTPUT_DIR/train.log opened to append, in the folder opened by _open_folder: only a regular file of
    its own (roots.open_regular: never through a symlink, never a FIFO, never a file with other hard links)."""
    path = output_dir / LOG_NAME
    try:
        folder = _open_folder(output_dir)
    except OSError as exc:
        found = next((part for part in (output_dir, *output_dir.parents) if os.path.lexists(part)), output_dir)
        if exc.errno == errno.ENOTDIR and not os.path.islink(found) and not os.path.isdir(found):
            raise UserError(f"--output-dir {output_dir}: {found} is a file, not a folder; give a folder for the run "
                            "(made when missing)") from None
        if exc.errno in (errno.ENOTDIR, errno.ELOOP):
            raise UserError(f"--output-dir {output_dir}: a part of it is a symbolic link or a file, not a folder "
                            "(made so since the page checked it?); nothing was written there") from None
        raise UserError(f"--output-dir {output_dir}: cannot write there ({exc.strerror})") from None
    try:
        return open_regular(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, single_link=True, dir_fd=folder)
    except OSError as exc:
        raise UserError(f"--output-dir {output_dir}: cannot write there ({exc.strerror})") from None
    finally:
        os.close(folder)


def read_log(launch: Launch | None, output_dir: Path, *, limit: int = 256 * 1024, roots: Roots | None = None) -> str:
    """This invocation's part of train.log (from the last header for a run found through its lock).

    A long run's log grows without end; past `limit` bytes only its head (the plan, the resume
    report, early warnings) and its tail (progress) are read. A train.log that is a symlink or not
    a regular file is not read, nor (`roots`) one that lies outside them once open (a folder of its
    path swapped for a link after the page checked it); the text says so.
    """
    path = Path(output_dir) / LOG_NAME
    start = launch.log_offset if launch is not None and launch.process is not None else 0
    try:
        with open_regular(path) as handle:
            if roots is not None and not roots.holds_open(handle.fileno()):
                raise UserError(f"{path}: lies outside the folders this page may touch once opened (a folder of its "
                                "path made a symbolic link since the page checked it?)")
            end = handle.seek(0, os.SEEK_END)
            handle.seek(start)
            if end - start <= limit:
                text = handle.read().decode(errors="replace")
            else:
                head = handle.read(limit // 4).decode(errors="replace")
                handle.seek(end - 3 * limit // 4)
                tail = handle.read().decode(errors="replace")
                text = f"{head}\n[... {end - start - limit} bytes of log not shown ...]\n{tail}"
    except UserError as exc:
        return f"{NOT_READ}{exc}"
    except OSError:
        return ""
    if start == 0:
        last_header = text.rfind(f"\n{HEADER}")
        text = text[last_header + 1:] if last_header >= 0 else text
    return text
