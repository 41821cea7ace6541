"""torchrun data parallel on CPU (gloo, 2 processes) through the real launcher and CLI."""

from __future__ import annotations

import contextlib
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
import yaml
from helpers import start, wait_for_training

from indextts_train.checkpoint.files import load_checkpoint

pytestmark = pytest.mark.slow  # every test here trains a tiny run or starts the CLI: seconds each

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def configs(tmp_path_factory) -> dict[str, Path]:
    """The tiny config with and without dropout (dropout masks differ per rank by design)."""
    folder = tmp_path_factory.mktemp("ddp_cfg")
    out = {}
    for name, dropout in (("no_dropout", 0.0), ("dropout", 0.1)):
        data = yaml.safe_load((ROOT / "configs" / "tiny.yaml").read_text())
        data["train"]["dropout"] = dropout
        out[name] = folder / f"{name}.yaml"
        out[name].write_text(yaml.safe_dump(data))
    return out


def command(data: dict, config: Path, out: Path, *, nproc: int, max_steps: int) -> list[str]:
    launcher = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(nproc),
                "--master-port", str(random.Random(str(out)).randint(20000, 40000)), "-m", "indextts_train"]
    return launcher + [
        "--train-manifest", str(data["train"]), "--config", str(config), "--base-checkpoint", str(data["base"]),
        "--output-dir", str(out), "--resume", "auto", "--batch-size", "2",
        "--grad-accumulation", str(2 // nproc), "--effective-batch-size", "4", "--num-workers", "0",
        "--max-steps", str(max_steps), "--epochs", "100", "--save-interval", "2", "--log-interval", "1",
        "--seed", "3"]


def run(args: list[str]) -> str:
    result = subprocess.run(args, capture_output=True, text=True, cwd=ROOT, timeout=300,
                            env={**os.environ, "PYTHONUNBUFFERED": "1"})
    assert result.returncode == 0, result.stdout + result.stderr
    return result.stdout + result.stderr


def final(out: Path) -> dict:
    return load_checkpoint(out / "latest.pth")


def test_two_processes_equal_one_process_and_resume_with_one(tiny_data, configs, tmp_path) -> None:
    run(command(tiny_data, configs["no_dropout"], tmp_path / "one", nproc=1, max_steps=8))
    printed = run(command(tiny_data, configs["no_dropout"], tmp_path / "two", nproc=2, max_steps=8))
    assert "effective batch 4 = 2 x 1 x 2" in printed
    one, two = final(tmp_path / "one"), final(tmp_path / "two")
    assert one["progress"]["samples_total"] == two["progress"]["samples_total"] == 32
    for key, tensor in one["model"].items():
        torch.testing.assert_close(two["model"][key], tensor, rtol=1e-4, atol=1e-5, msg=key)
    assert len(two["rng"]) == 2  # every rank's RNG is in the checkpoint

    # The same 2-process checkpoint, resumed by 1 process: same global sample, same effective batch.
    printed = run(command(tiny_data, configs["no_dropout"], tmp_path / "two", nproc=1, max_steps=12))
    assert "written by 2 process(es), this run has 1" in printed
    before = two["progress"]
    assert f"starting at step 8 (epoch {before['epoch']}, sample {before['samples_in_epoch']})" in printed
    after = final(tmp_path / "two")["progress"]
    assert (after["step"], after["world_size"], after["samples_total"]) == (12, 1, 48)


def children(pid: int) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[1]) == pid:
                found.append(int(entry.name))
    return found


# The killed run's length: each of its 3 attempts is killed at most 0.3 s after its loop starts (about 3 steps of
# the 2-process tiny run on the 2-core VM), so 60 steps (10 epochs) leave the rest of the run to the resume even on
# a machine several times faster; 120 steps only doubled the reference and the final runs (test_train_distributed_v25
# kills 2 attempts of a 30-step run)
KILLED_STEPS = 60


def test_two_process_run_killed_and_resumed_is_bit_identical(tiny_data, configs, tmp_path) -> None:
    reference = tmp_path / "reference"
    run(command(tiny_data, configs["dropout"], reference, nproc=2, max_steps=KILLED_STEPS))
    out = tmp_path / "killed"
    args = command(tiny_data, configs["dropout"], out, nproc=2, max_steps=KILLED_STEPS)
    rng = random.Random(5)
    for attempt in range(3):
        proc = start(args)
        assert wait_for_training(proc)
        time.sleep(rng.uniform(0.05, 0.3))
        if attempt == 0:  # one rank dies alone; the other fails on its next collective
            os.kill(children(proc.pid)[-1], signal.SIGKILL)
        else:  # the whole job dies (preemption); torchrun puts each rank in its own session
            for pid in [*children(proc.pid), proc.pid]:
                with contextlib.suppress(ProcessLookupError):  # a child may have exited since it was listed
                    os.kill(pid, signal.SIGKILL)
        rest, _ = proc.communicate(timeout=120)
        assert "done: " not in rest, f"attempt {attempt} finished the run before its kill: raise KILLED_STEPS"
    run(args)
    got, want = final(out), final(reference)
    assert got["progress"] == want["progress"]
    for key, tensor in want["model"].items():
        assert torch.equal(got["model"][key], tensor), key
    for index, slots in want["optimizer"]["state"].items():
        for slot, tensor in slots.items():
            assert torch.equal(got["optimizer"]["state"][index][slot], tensor), (index, slot)


def test_sigterm_to_the_launcher_saves_once_and_every_rank_exits_143(tiny_data, configs, tmp_path) -> None:
    out = tmp_path / "run"
    args = command(tiny_data, configs["dropout"], out, nproc=2, max_steps=2000)
    args[args.index("--save-interval") + 1] = "1000"
    proc = start(args)
    assert wait_for_training(proc)
    time.sleep(1.0)
    ranks = children(proc.pid)
    proc.send_signal(signal.SIGTERM)  # torchrun forwards it to every rank
    output, _ = proc.communicate(timeout=120)
    assert output.count("saved ") == 1, output
    assert "stopped by signal" in output and "exit 143" in output
    assert len(ranks) == 2
    step = final(out)["progress"]["step"]
    assert 0 < step < 1000 and len(list(out.glob("model_step*.pth"))) == 1


def test_a_bad_sample_found_mid_run_ends_every_rank_with_its_line_and_one_save(tiny_data, configs, tmp_path) -> None:
    """Every step saved (--save-interval 1), then a sample's codes are damaged mid-run: both ranks stop at the same
    step, the line names the bad file, and the step is saved once. Rank 1 did not know that rank 0 had saved the
    step, so it saved it again alone: it waited in a collective rank 0 never entered."""
    data = tmp_path / "data"
    shutil.copytree(tiny_data["folder"], data, ignore=shutil.ignore_patterns("*.pth"))
    out = tmp_path / "run"
    args = command({**tiny_data, "train": data / "train.jsonl"}, configs["no_dropout"], out, nproc=2, max_steps=2000)
    args[args.index("--save-interval") + 1] = "1"
    proc = start(args)
    assert wait_for_training(proc)
    time.sleep(1.0)
    victim = data / "train5_codes.npy"
    victim.write_bytes(b"not an array")  # read again each epoch (6 steps): met within the next few steps
    output, _ = proc.communicate(timeout=240)
    assert proc.returncode != 0
    lines = [line for line in output.splitlines() if line.startswith("error: ")]
    assert len(lines) == 2 and any(str(victim) in line for line in lines), output[-3000:]  # one line a rank
    saved = {re.search(r"step (\d+), the last completed one, is saved in (\S+);", line).groups() for line in lines}
    (step, path), = saved  # the same step on both ranks, saved once
    assert Path(path) == out / f"model_step{step}.pth" and Path(path).is_file(), lines
    assert "another process of this torchrun job stopped" not in output, output[-3000:]


def test_an_early_stop_by_listen_scores_ends_every_process(tiny_data, configs, tmp_path) -> None:
    """--best-metric listen/cer --early-stop-patience: only rank 0 reads the scores listen recorded, so only its
    patience moved; it ended the run, rank 1 trained on alone, and the job failed (exit 1)."""
    import json

    from indextts_train.checkpoint.scores import RECORD_FORMAT

    out = tmp_path / "run"
    (out / "listen").mkdir(parents=True)
    with (out / "listen" / "scores.jsonl").open("w") as scores:  # heard earlier: every checkpoint worse than step 2
        for step in range(2, 13, 2):
            scores.write(json.dumps({"format": RECORD_FORMAT, "step": step, "line_id": "a", "ok": True,
                                     "cer": 0.1 * step, "speaker_sim": None}) + "\n")
    args = command(tiny_data, configs["no_dropout"], out, nproc=2, max_steps=12)
    printed = run([*args, "--val-manifest", str(tiny_data["val"]), "--val-interval", "2",
                   "--best-metric", "listen/cer", "--early-stop-patience", "1"])
    assert "early stop at step 6: 1 heard checkpoint(s) without a better listen/cer; best.pth is step 2" in printed
    assert "rank 0 ended the run" not in printed  # rank 0 says why; the others end with it, silently
    assert final(out)["progress"]["step"] == 6
