"""What exact resume costs on a GPU: training steps with and without deterministic algorithms.

On CUDA the trainer asks for deterministic algorithms (hardware.apply_determinism: cuDNN deterministic,
`torch.use_deterministic_algorithms(True)`, `CUBLAS_WORKSPACE_CONFIG=:4096:8` set before CUDA starts),
because some backward kernels add with atomics in a varying order and a resumed run would drift.
This times optimizer steps of the real IndexTTS2 config (bf16 autocast where the card has it) on
synthetic batches, in two fresh processes (the setting is process-wide): default kernels vs
deterministic ones, and checks that two deterministic runs give the same weights.

    python benchmarks/bench_determinism.py [--steps 20] [--warmup 5] [--micro-batch 8]

Without CUDA it says so and exits 0. Writes benchmarks/results/determinism-<device>.json.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import torch
from report import write_result

from indextts_train.config.settings import load_config
from indextts_train.model.gpt import Batch, UnifiedVoiceGPT

ROOT = Path(__file__).resolve().parents[1]


def _batch(cfg, micro: int, generator: torch.Generator, device: torch.device) -> Batch:
    T, M, D = 64, 400, cfg.model_dim
    return Batch(torch.randint(2, cfg.number_text_tokens, (micro, T), generator=generator).to(device),
                 torch.randint(0, cfg.number_mel_codes - 2, (micro, M), generator=generator).to(device),
                 torch.full((micro,), T, device=device), torch.full((micro,), M, device=device),
                 torch.randn(micro, 32, D, generator=generator).to(device),
                 torch.randn(micro, D, generator=generator).to(device))


def child(deterministic: bool, steps: int, warmup: int, micro: int) -> dict:
    """One process: the timing of `steps` optimizer steps after `warmup`, and a checksum of the weights."""
    if deterministic:
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
        torch.use_deterministic_algorithms(True)
        torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark = True, False
    device = torch.device("cuda")
    cfg = load_config(ROOT / "configs" / "indextts2.yaml").gpt
    torch.manual_seed(0)
    model = UnifiedVoiceGPT(cfg).to(device).train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-5)
    generator = torch.Generator().manual_seed(0)
    dtype = torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
    times = []
    for step in range(warmup + steps):
        batch = _batch(cfg, micro, generator, device)
        torch.cuda.synchronize()
        began = time.perf_counter()
        with torch.autocast("cuda", dtype=dtype):
            out = model.compute_losses(batch)
        (0.2 * out.text_loss + 0.8 * out.mel_loss).float().backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        torch.cuda.synchronize()
        if step >= warmup:
            times.append(time.perf_counter() - began)
    checksum = float(sum(p.detach().double().sum() for p in model.parameters()))
    return {"step_s_median": sorted(times)[len(times) // 2], "step_s": times, "checksum": checksum}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--micro-batch", type=int, default=8)
    parser.add_argument("--child", choices=["default", "deterministic"])
    args = parser.parse_args()
    if args.child:
        print(json.dumps(child(args.child == "deterministic", args.steps, args.warmup, args.micro_batch)))
        return
    if not torch.cuda.is_available():
        print("bench_determinism: no CUDA device here; the cost of deterministic algorithms is a GPU question")
        return
    runs = {}
    for mode in ("default", "deterministic", "deterministic"):
        done = subprocess.run([sys.executable, __file__, "--child", mode, "--steps", str(args.steps), "--warmup",
                               str(args.warmup), "--micro-batch", str(args.micro_batch)],
                              capture_output=True, text=True, cwd=ROOT, check=True)
        runs.setdefault(mode, []).append(json.loads(done.stdout.strip().splitlines()[-1]))
    default, deterministic = runs["default"][0], runs["deterministic"][0]
    name = torch.cuda.get_device_name(0)
    write_result(ROOT / "benchmarks" / "results" / f"determinism-{name.replace(' ', '_')}.json", {
        "device": name, "torch": torch.__version__, "micro_batch": args.micro_batch, "steps": args.steps,
        "default_step_s": default["step_s_median"], "deterministic_step_s": deterministic["step_s_median"],
        "slowdown": deterministic["step_s_median"] / default["step_s_median"],
        "deterministic_runs_identical": runs["deterministic"][0]["checksum"] == runs["deterministic"][1]["checksum"],
        "date": time.strftime("%Y-%m-%d")})


if __name__ == "__main__":
    main()
