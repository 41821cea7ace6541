"""The shell recipes users copy: the same command line starts a run, then resumes it."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # every test here trains a tiny run or starts the CLI: seconds each

ROOT = Path(__file__).resolve().parents[1]


def checkout_env(tmp_path: Path) -> dict[str, str]:
    """PATH whose `train-gpt` is this checkout's trainer (the installed one may be another checkout's)."""
    shim = tmp_path / "checkout-bin" / "train-gpt"
    shim.parent.mkdir(exist_ok=True)
    shim.write_text(f'#!/bin/sh\nexec {sys.executable} -m indextts_train train "$@"\n')
    shim.chmod(0o755)
    path = os.pathsep.join([str(shim.parent), str(Path(sys.executable).parent), os.environ["PATH"]])
    return {**os.environ, "PATH": path, "PYTHONPATH": str(ROOT)}


def test_smart_start_starts_then_resumes(tiny_data, tmp_path) -> None:
    out = tmp_path / "run"
    flags = ["--train-manifest", str(tiny_data["train"]), "--config", str(tiny_data["config"]),
             "--base-checkpoint", str(tiny_data["base"]), "--batch-size", "2", "--effective-batch-size", "4",
             "--log-interval", "2"]
    # train-gpt is installed beside this Python (a venv's bin may not be on PATH).
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}

    def smart_start(max_steps: int) -> str:
        result = subprocess.run(["bash", str(ROOT / "scripts" / "smart_start.sh"), str(out), *flags,
                                 "--max-steps", str(max_steps)], capture_output=True, text=True, env=env,
                                timeout=300)
        assert result.returncode == 0, result.stdout + result.stderr
        return result.stdout

    first = smart_start(2)
    assert "no checkpoint" in first and "starting fresh" in first and "training finished" in first
    second = smart_start(4)
    assert "checkpoints found" in second and "resuming from" in second and "starting at step 2" in second


def test_smart_start_retries_a_crash_but_not_bad_input_or_a_stop(tiny_data, tmp_path) -> None:
    """A fake train-gpt first on PATH replays exit codes: a crash (1) is retried with the same command,
    bad input (2) and a signal stop (130) end the script with that code."""
    fake = tmp_path / "bin" / "train-gpt"
    fake.parent.mkdir()
    codes = tmp_path / "codes"
    fake.write_text('#!/usr/bin/env bash\necho "train-gpt $*" >> "$CALLS"\n'
                    'code=$(head -n1 "$CODES"); sed -i 1d "$CODES"; exit "$code"\n')
    fake.chmod(0o755)
    env = {**os.environ, "PATH": f"{fake.parent}{os.pathsep}{os.environ['PATH']}", "RETRY_DELAY": "0",
           "CODES": str(codes), "CALLS": str(tmp_path / "calls")}
    for replay, want, said in [("1\n0\n", 0, "exit 1 (crash or OOM kill); resuming in 0 s"),
                               ("2\n", 2, "stopped with exit 2; not retrying"),
                               ("130\n", 130, "stopped with exit 130; not retrying")]:
        codes.write_text(replay)
        (tmp_path / "calls").write_text("")
        result = subprocess.run(["bash", str(ROOT / "scripts" / "smart_start.sh"), str(tmp_path / "run"), "--x", "1"],
                                capture_output=True, text=True, env=env, timeout=60)
        assert result.returncode == want and said in result.stdout, result.stdout + result.stderr
        calls = (tmp_path / "calls").read_text().splitlines()
        assert calls == [f"train-gpt --output-dir {tmp_path / 'run'} --resume auto --x 1"] * len(replay.split())


def test_tmux_recipe_runs_the_same_command_in_a_detached_session(tiny_data, tmp_path) -> None:
    """From a checkout and into a run folder whose paths hold a space (the scripts' own path was unquoted)."""
    out = tmp_path / "my run"
    scripts = tmp_path / "my checkout" / "scripts"
    scripts.mkdir(parents=True)
    for name in ("tmux_train.sh", "smart_start.sh"):
        shutil.copy(ROOT / "scripts" / name, scripts / name)
    session = f"indextts-test-{os.getpid()}"
    env = checkout_env(tmp_path)
    flags = ["--train-manifest", str(tiny_data["train"]), "--config", str(tiny_data["config"]),
             "--base-checkpoint", str(tiny_data["base"]), "--batch-size", "2", "--effective-batch-size", "4",
             "--max-steps", "2"]
    try:
        started = subprocess.run(["bash", str(scripts / "tmux_train.sh"), session, str(out), *flags],
                                 capture_output=True, text=True, env=env, timeout=60)
        assert started.returncode == 0 and f"tmux attach -t {session}" in started.stdout, started.stderr
        log = out / "console.log"  # the pane's output; the trainer keeps its own train.log
        deadline = time.monotonic() + 120
        while "training finished" not in (log.read_text() if log.exists() else ""):
            assert time.monotonic() < deadline, log.read_text() if log.exists() else "no log"
            time.sleep(0.5)
        assert "starting fresh" in log.read_text() and (out / "latest.pth").exists()
        trained = (out / "train.log").read_text()
        assert trained.count("=== start ") == 1
        assert re.search(r"^\d\d:\d\d:\d\d \+0:\d\d:\d\d done: 2 steps", trained, re.M)
    finally:
        subprocess.run(["tmux", "kill-session", "-t", session], capture_output=True)


def _wait_for(path: Path, text: str, timeout: float = 120) -> str:
    deadline = time.monotonic() + timeout
    while text not in (content := path.read_text() if path.exists() else ""):
        assert time.monotonic() < deadline, f"{text!r} not in {path}:\n{content}"
        time.sleep(0.3)
    return content


def _pane_dead(session: str) -> bool:
    panes = subprocess.run(["tmux", "list-panes", "-t", f"={session}", "-F", "#{pane_dead}"],
                           capture_output=True, text=True)
    return panes.stdout.strip() == "1"


def test_tmux_ctrl_c_saves_into_the_log_and_running_again_resumes(tiny_data, tmp_path) -> None:
    out = tmp_path / "run"
    session = f"indextts-ctrlc-{os.getpid()}"
    env = checkout_env(tmp_path)
    flags = ["--train-manifest", str(tiny_data["train"]), "--config", str(tiny_data["config"]),
             "--base-checkpoint", str(tiny_data["base"]), "--batch-size", "2", "--effective-batch-size", "4",
             "--log-interval", "1", "--epochs", "100", "--max-steps", "400"]
    script = ["bash", str(ROOT / "scripts" / "tmux_train.sh"), session, str(out), *flags]
    log = out / "console.log"
    try:
        started = subprocess.run(script, capture_output=True, text=True, env=env, timeout=60)
        assert started.returncode == 0 and "started in tmux session" in started.stdout, started.stderr
        _wait_for(log, "step 2/400")  # the signal handler is installed once steps run
        subprocess.run(["tmux", "send-keys", "-t", f"={session}:", "C-c"], check=True)
        stopped = _wait_for(log, "[smart_start] stopped with exit 130")
        assert "saved " in stopped and "stopped by signal after step" in stopped
        deadline = time.monotonic() + 30
        while not _pane_dead(session):  # the run is over, so the session no longer counts as running
            assert time.monotonic() < deadline
            time.sleep(0.3)
        step = int(stopped.split("stopped by signal after step ")[1].split(";")[0])

        again = subprocess.run(script, capture_output=True, text=True, env=env, timeout=60)
        assert again.returncode == 0 and "has ended; starting it again" in again.stdout, again.stdout
        resumed = _wait_for(log, f"starting at step {step}")
        assert "resuming from" in resumed.split("stopped by signal")[1]
        subprocess.run(["tmux", "send-keys", "-t", f"={session}:", "C-c"], check=True)
        deadline = time.monotonic() + 60
        while log.read_text().count("[smart_start] stopped with exit 130") < 2:  # stopped, not killed
            assert time.monotonic() < deadline, log.read_text()
            time.sleep(0.3)
    finally:
        subprocess.run(["tmux", "kill-session", "-t", f"={session}"], capture_output=True)
