"""Exact resume on a GPU: the real CLI killed mid-run and resumed must end bit-identical to an
uninterrupted run, with the CUDA kernels, mixed precision and deterministic algorithms a GPU run uses.

The CPU suite proves exact resume at one torch thread; a GPU run adds what no CPU test can show:
cuBLAS/cuDNN kernels (some backward kernels add with atomics unless deterministic algorithms are
on), bf16/fp16 autocast, the fp16 GradScaler, CUDA RNG state in the checkpoint. Method:

1. `indextts-train demo W/demo --max-steps 30` on the GPU (the whole path: synthetic clips, the real
   `prepare`, training, export), timed; its data and extended tokenizer are reused below.
2. A deeper model than the demo's (`--layers`, `--heads`; random init, the demo's vocabulary and
   lengths; the width stays the demo's, which its prepared speaker conditions are made for),
   trained by `indextts-train train` for `--steps` optimizer steps
   (micro-batch 4 x 2 accumulation, a checkpoint every 5 steps, validation every 10):
   (a) uninterrupted; (b) the same command SIGKILLed (whole process group) as soon as it logs each
   step of `--kill-at`, then rerun unchanged (`--resume auto`) until it ends.
3. Every parameter and optimizer tensor of the two `latest.pth` compared with torch.equal, and the
   progress, scheduler and loss history compared for equality.

    python benchmarks/bench_gpu_resume.py [--family 2|2.5] [--work /tmp/gpu_resume] [--steps 40] [--kill-at 7,23]

Writes benchmarks/results/gpu_resume-<device>-<family>.json and prints it. Without CUDA it says so and exits 0
(`--allow-cpu` runs it on the CPU, as a check of the script itself).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import torch
import yaml

from indextts_train.checkpoint.files import load_checkpoint
from indextts_train.ui.text_log import unstamp

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
STEP_LINE = re.compile(r"^step (\d+)/")


def cli(*args: str) -> list[str]:
    return [sys.executable, "-m", "indextts_train", *args]


def start(args: list[str]) -> subprocess.Popen:
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    return subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env,
                            start_new_session=True)


def run_to_end(args: list[str]) -> tuple[float, list[str]]:
    began = time.perf_counter()
    proc = start(args)
    lines = list(proc.stdout)
    if proc.wait() != 0:
        raise SystemExit("".join(lines[-30:]) + f"\nfailed: {' '.join(args)}")
    return time.perf_counter() - began, lines


def run_killed_at(args: list[str], step: int) -> list[str]:
    """Run until the line of `step` arrives, then SIGKILL the whole process group."""
    proc, seen = start(args), []
    for line in proc.stdout:
        seen.append(line)
        match = STEP_LINE.match(unstamp(line))
        if match and int(match.group(1)) >= step:
            os.killpg(proc.pid, signal.SIGKILL)
            break
    proc.wait()
    return seen


def deep_config(demo: Path, out: Path, layers: int, heads: int) -> Path:
    data = yaml.safe_load((demo / "config.yaml").read_text())
    data["gpt"].update(layers=layers, heads=heads)
    out.write_text(yaml.safe_dump(data))
    return out


def compare(a: Path, b: Path) -> dict:
    got, want = load_checkpoint(a / "latest.pth"), load_checkpoint(b / "latest.pth")
    params = [k for k in want["model"] if not torch.equal(got["model"][k], want["model"][k])]
    slots = [f"{i}.{s}" for i, state in want["optimizer"]["state"].items() for s, t in state.items()
             if torch.is_tensor(t) and not torch.equal(got["optimizer"]["state"][i][s], t)]
    return {"parameters": len(want["model"]), "parameters_differing": params,
            "optimizer_tensors": sum(torch.is_tensor(t) for s in want["optimizer"]["state"].values()
                                     for t in s.values()),
            "optimizer_tensors_differing": slots,
            "progress_equal": got["progress"] == want["progress"],
            "scheduler_equal": got["scheduler"] == want["scheduler"],
            "history_equal": got["history"] == want["history"],
            "equal": not params and not slots and got["progress"] == want["progress"]
            and got["scheduler"] == want["scheduler"] and got["history"] == want["history"]}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--work", type=Path, default=Path("/tmp/gpu_resume"))
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--kill-at", default="7,23", help="steps after whose log line the run is killed")
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--family", default="2", help="the demo's family: 2 or 2.5")
    parser.add_argument("--allow-cpu", action="store_true")
    args = parser.parse_args()
    if not torch.cuda.is_available() and not args.allow_cpu:
        print("bench_gpu_resume: no CUDA device here, nothing measured (--allow-cpu checks the script)")
        return 0
    shutil.rmtree(args.work, ignore_errors=True)
    args.work.mkdir(parents=True)
    demo = args.work / "demo"
    demo_seconds, demo_lines = run_to_end(cli("demo", str(demo), "--max-steps", "30",
                                                          "--family", args.family))
    record = yaml.safe_load((demo / "run" / "run.yaml").read_text())["options"]
    config = deep_config(demo, args.work / "deep.yaml", args.layers, args.heads)

    def train(out: Path) -> list[str]:
        return cli("train", "--train-manifest", record["train_manifests"][0], "--val-manifest",
                   record["val_manifests"][0], "--tokenizer", record["tokenizer"], "--config", str(config),
                   "--output-dir", str(out), "--resume", "auto", "--max-steps", str(args.steps), "--epochs", "1000",
                   "--batch-size", "4", "--grad-accumulation", "2", "--effective-batch-size", "8",
                   "--num-workers", "2", "--learning-rate", "1e-3", "--warmup-steps", "4", "--seed", "11",
                   "--save-interval", "5", "--val-interval", "10", "--log-interval", "1", "--keep-checkpoints", "2")

    whole_seconds, whole_lines = run_to_end(train(args.work / "whole"))
    kills = [int(s) for s in args.kill_at.split(",") if s]
    for step in kills:
        run_killed_at(train(args.work / "killed"), step)
    _, resumed_lines = run_to_end(train(args.work / "killed"))
    plan = next((unstamp(line).strip() for line in whole_lines if "effective batch" in line), None)
    device = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu"
    result = {"device": device, "torch": torch.__version__, "family": args.family, "steps": args.steps,
              "killed_after_steps": kills,
              "model": {"layers": args.layers, "heads": args.heads},
              "plan_line": plan, "demo_seconds": round(demo_seconds, 1), "demo_last_lines": demo_lines[-4:],
              "uninterrupted_seconds": round(whole_seconds, 1), "resumed_last_lines": resumed_lines[-3:],
              "comparison": compare(args.work / "killed", args.work / "whole"),
              "date": time.strftime("%Y-%m-%d %H:%M:%S")}
    text = json.dumps(result, indent=2)
    print(text)
    if torch.cuda.is_available():
        RESULTS.mkdir(parents=True, exist_ok=True)
        name = re.sub(r"[^A-Za-z0-9]+", "-", f"{device} {args.family}").strip("-")
        path = RESULTS / f"gpu_resume-{name}.json"
        path.write_text(text + "\n")
        print(f"wrote {path}")
    return 0 if result["comparison"]["equal"] else 1


if __name__ == "__main__":
    sys.exit(main())
