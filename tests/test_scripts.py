"""The shell recipes users copy: the same command line starts a run, then resumes it."""

from __future__ import annotations

import os
import subprocess
import sys
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
