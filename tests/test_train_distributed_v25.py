"""IndexTTS-2.5 under torchrun on CPU (gloo, 2 processes): the same run as one process, and a killed job
resumes bit-identically."""

from __future__ import annotations

import os
import random
import signal
import sys
import time
from pathlib import Path

import pytest
import torch
from helpers import start, wait_for_training
from test_train_distributed import children, final, run

pytestmark = pytest.mark.slow  # every test here trains a tiny run or starts the CLI: seconds each


def command(data: dict, out: Path, *, nproc: int, max_steps: int) -> list[str]:
    launcher = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(nproc),
                "--master-port", str(random.Random(str(out)).randint(20000, 40000)), "-m", "indextts_train"]
    return launcher + [
        "--train-manifest", str(data["train"]), "--config", str(data["config"]),
        "--base-checkpoint", str(data["base"]), "--tokenizer", str(data["tokenizer"]),
        "--output-dir", str(out), "--resume", "auto", "--batch-size", "2",
        "--grad-accumulation", str(2 // nproc), "--effective-batch-size", "4", "--num-workers", "0",
        "--max-steps", str(max_steps), "--epochs", "100", "--save-interval", "2", "--log-interval", "1",
        "--seed", "3"]


def test_two_process_25_run_killed_and_resumed_is_bit_identical(tiny25_data, tmp_path) -> None:
    reference = tmp_path / "reference"
    printed = run(command(tiny25_data, reference, nproc=2, max_steps=30))
    assert "effective batch 4 = 2 x 1 x 2" in printed and "language rows trained: en (0), am (75)" in printed
    out = tmp_path / "killed"
    args = command(tiny25_data, out, nproc=2, max_steps=30)
    rng = random.Random(7)
    for attempt in range(2):
        proc = start(args)
        assert wait_for_training(proc)
        time.sleep(rng.uniform(0.05, 0.3))
        if attempt == 0:  # one rank dies alone; the other fails on its next collective
            os.kill(children(proc.pid)[-1], signal.SIGKILL)
        else:  # the whole job dies
            for pid in [*children(proc.pid), proc.pid]:
                os.kill(pid, signal.SIGKILL)
        proc.communicate(timeout=120)
    run(args)
    got, want = final(out), final(reference)
    assert got["progress"] == want["progress"] and len(got["rng"]) == 2
    for key, tensor in want["model"].items():
        assert torch.equal(got["model"][key], tensor), key
    for index, slots in want["optimizer"]["state"].items():
        for slot, tensor in slots.items():
            assert torch.equal(got["optimizer"]["state"][index][slot], tensor), (index, slot)
