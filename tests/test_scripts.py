"""The shell recipes users copy: the same command line starts a run, then resumes it."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


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


def test_tmux_recipe_runs_the_same_command_in_a_detached_session(tiny_data, tmp_path) -> None:
    out = tmp_path / "run"
    session = f"indextts-test-{os.getpid()}"
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
    flags = ["--train-manifest", str(tiny_data["train"]), "--config", str(tiny_data["config"]),
             "--base-checkpoint", str(tiny_data["base"]), "--batch-size", "2", "--effective-batch-size", "4",
             "--max-steps", "2"]
    try:
        started = subprocess.run(["bash", str(ROOT / "scripts" / "tmux_train.sh"), session, str(out), *flags],
                                 capture_output=True, text=True, env=env, timeout=60)
        assert started.returncode == 0 and f"tmux attach -t {session}" in started.stdout, started.stderr
        log = out / "train.log"
        deadline = time.monotonic() + 120
        while "training finished" not in (log.read_text() if log.exists() else ""):
            assert time.monotonic() < deadline, log.read_text() if log.exists() else "no log"
            time.sleep(0.5)
        assert "starting fresh" in log.read_text() and (out / "latest.pth").exists()
    finally:
        subprocess.run(["tmux", "kill-session", "-t", session], capture_output=True)
