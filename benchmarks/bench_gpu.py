"""GPU training throughput, MFU and peak memory of the real IndexTTS2 GPT, against hardware.py's estimate.

On whatever CUDA device it finds (device 0): the real config (configs/indextts2.yaml sizes, random
weights, nothing downloaded), samples of maximum length (600 text tokens, 1,815 codes: 2,453 trunk
positions, the case hardware.py's estimate is for), the precision auto mode picks (bf16 from
compute capability 8.0, else fp16 with a GradScaler), TF32 on where supported, fused AdamW.
For activation checkpointing off and on, it takes the micro-batch auto mode picks for effective
batch 64 and its neighbours (half, double), and at the auto micro-batch also the plain full-logits
loss and torch.compile of the blocks. Each configuration: `--warmup` steps, then `--steps` timed
optimizer steps (micro-batch x 1 accumulation; forward, backward, clip, AdamW step).

Reported per configuration: tokens/s (trunk positions per second), samples/s, MFU = model FLOPs per
second / the device's dense bf16 (or fp16) tensor-core peak, peak memory allocated and reserved vs
hardware.py's estimate, or "oom". Model FLOPs: 3 x forward matmul FLOPs (trunk 24 D^2 per position
per layer, causal attention 2 S D per position per layer, the text head on text positions, the mel
head on mel positions); the recompute of activation checkpointing and of the chunked loss's
backward is not counted (so MFU falls when checkpointing is on, by design of the metric).

    python benchmarks/bench_gpu.py [--steps 10] [--warmup 3] [--no-compile | --only-compiled]

Writes benchmarks/results/gpu-<device>.json and prints it. Without CUDA it says so and exits 0.
`--cpu-smoke` runs every code path on a tiny config on the CPU (a check of the script itself; it
writes nothing).
"""

from __future__ import annotations

import argparse
import json
import platform
import re
import sys
import time
from pathlib import Path

import torch

from indextts_train.config.settings import GPTConfig, load_config
from indextts_train.model.gpt import Batch, UnifiedVoiceGPT, losses_from_logits
from indextts_train.train.accel import adamw_options, compile_blocks
from indextts_train.train.device import detect_device
from indextts_train.train.hardware import choose_plan, is_oom_error
from indextts_train.train.memory import estimate_memory

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
EFFECTIVE_BATCH = 64
GIB = 1024**3
# Dense (no sparsity) tensor-core peaks in TFLOP/s, bf16 (fp16 where the card has no bf16), from
# the vendors' datasheets. Matched against the device name, first match wins.
PEAK_TFLOPS = (
    (r"H200", 989.0), (r"H100.*(SXM|HBM3)", 989.0), (r"H100.*NVL", 835.0), (r"H100", 756.0),
    (r"GH200", 989.0), (r"B200", 2250.0), (r"A100", 312.0), (r"A800", 312.0), (r"L40S", 362.0),
    (r"L40", 181.0), (r"L4\b", 121.0), (r"A10G", 70.0), (r"A10\b", 125.0), (r"RTX 4090", 165.0),
    (r"RTX A6000", 155.0), (r"V100", 125.0), (r"T4\b", 65.0),
)


def peak_tflops(name: str) -> float | None:
    return next((peak for pattern, peak in PEAK_TFLOPS if re.search(pattern, name)), None)


def model_flops_per_sample(cfg: GPTConfig) -> float:
    """Training FLOPs of one maximum-length sample: 3 x the forward's matmul FLOPs."""
    text, mel = cfg.max_text_tokens + 2, cfg.max_mel_tokens + 2
    S, D = 34 + text + mel, cfg.model_dim
    trunk = cfg.layers * (2 * 12 * D * D * S + 2 * S * S * D)  # 12 D^2 MACs per position; causal QK^T + AV
    heads = 2 * D * (text * cfg.text_rows + mel * cfg.number_mel_codes)
    return 3.0 * (trunk + heads)


def max_length_batch(cfg: GPTConfig, micro_batch: int, device: torch.device) -> Batch:
    T, M, D = cfg.max_text_tokens, cfg.max_mel_tokens, cfg.model_dim
    return Batch(torch.randint(2, cfg.number_text_tokens, (micro_batch, T)),
                 torch.randint(0, cfg.number_mel_codes - 2, (micro_batch, M)),
                 torch.full((micro_batch,), T), torch.full((micro_batch,), M),
                 torch.randn(micro_batch, 32, D), torch.randn(micro_batch, D)).to(device)


def run_config(cfg: GPTConfig, device: torch.device, precision: str, micro_batch: int, *, checkpointing: bool,
               chunked: bool, compiled: bool, steps: int, warmup: int) -> dict:
    """Train `warmup + steps` optimizer steps; time the last `steps`."""
    torch.manual_seed(0)
    model = UnifiedVoiceGPT(cfg, dropout=0.1, activation_checkpointing=checkpointing).to(device).train()
    if compiled:
        compile_blocks(model.gpt.h)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-5, **adamw_options(device))
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(precision)
    scaler = torch.amp.GradScaler(device.type, enabled=precision == "fp16")
    batch = max_length_batch(cfg, micro_batch, device)

    def step() -> None:
        with torch.autocast(device.type, dtype=dtype or torch.float32, enabled=dtype is not None):
            out = model.compute_losses(batch) if chunked else losses_from_logits(*model(batch), batch, cfg)
            loss = 0.2 * out.text_loss + 0.8 * out.mel_loss
        scaler.scale(loss).backward()
        scaler.unscale_(optimizer)
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        scaler.step(optimizer)
        scaler.update()
        optimizer.zero_grad(set_to_none=True)

    for _ in range(warmup):
        step()
    _sync(device)
    start = time.perf_counter()
    for _ in range(steps):
        step()
    _sync(device)
    return {"seconds_per_step": (time.perf_counter() - start) / steps}


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def measure(cfg: GPTConfig, device: torch.device, precision: str, micro_batch: int, peak: float | None,
            **options) -> dict:
    row = {"micro_batch": micro_batch, **{k: v for k, v in options.items() if k not in ("steps", "warmup")}}
    row["estimate_gib"] = round(estimate_memory(cfg, micro_batch, precision=precision,
                                                activation_checkpointing=options["checkpointing"]) / GIB, 2)
    if device.type == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)
    try:
        timing = run_config(cfg, device, precision, micro_batch, **options)
    except Exception as exc:  # an OOM is a result here; anything else is a bug and propagates
        if not is_oom_error(exc):
            raise
        return {**row, "oom": True}
    finally:
        if device.type == "cuda":
            torch.cuda.synchronize(device)
    seconds = timing["seconds_per_step"]
    positions = 34 + cfg.max_text_tokens + 2 + cfg.max_mel_tokens + 2
    flops = model_flops_per_sample(cfg) * micro_batch / seconds
    row.update(oom=False, seconds_per_step=round(seconds, 4),
               tokens_per_s=round(positions * micro_batch / seconds), samples_per_s=round(micro_batch / seconds, 2),
               model_tflops=round(flops / 1e12, 1), mfu=round(flops / (peak * 1e12), 3) if peak else None)
    if device.type == "cuda":
        row["peak_allocated_gib"] = round(torch.cuda.max_memory_allocated(device) / GIB, 2)
        row["peak_reserved_gib"] = round(torch.cuda.max_memory_reserved(device) / GIB, 2)
        row["estimate_over_allocated"] = round(row["estimate_gib"] / row["peak_allocated_gib"], 2)
    return row


def configurations(auto: dict[bool, int], compile_too: bool) -> list[dict]:
    """(checkpointing, micro_batch, chunked, compiled) rows: neighbours of auto, then the variants."""
    rows = []
    for checkpointing, micro in auto.items():
        for m in sorted({max(1, micro // 2), micro, micro * 2}):
            rows.append({"checkpointing": checkpointing, "micro_batch": m, "chunked": True, "compiled": False})
        rows.append({"checkpointing": checkpointing, "micro_batch": micro, "chunked": False, "compiled": False})
        if compile_too:
            rows.append({"checkpointing": checkpointing, "micro_batch": micro, "chunked": True, "compiled": True})
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--no-compile", action="store_true", help="skip the torch.compile rows")
    parser.add_argument("--only-compiled", action="store_true", help="only the torch.compile rows (at auto)")
    parser.add_argument("--cpu-smoke", action="store_true", help="run the code paths on a tiny CPU config")
    args = parser.parse_args()
    if args.cpu_smoke:
        cfg, device = load_config(ROOT / "configs" / "tiny.yaml").gpt, torch.device("cpu")
    elif not torch.cuda.is_available():
        print("bench_gpu: no CUDA device here, nothing measured (run it on a GPU machine; "
              "--cpu-smoke checks the script on the CPU)")
        return 0
    else:
        cfg, device = load_config(ROOT / "configs" / "indextts2.yaml").gpt, torch.device("cuda:0")
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
    info = detect_device(0)
    plans = {ckpt: choose_plan(info, cfg, effective_batch=EFFECTIVE_BATCH, activation_checkpointing=ckpt)
             for ckpt in (False, True)}
    precision = plans[False].precision
    auto = {ckpt: plan.micro_batch if device.type == "cuda" else 2 for ckpt, plan in plans.items()}
    peak = peak_tflops(info.name) if device.type == "cuda" else None
    rows = []
    chosen = [row for row in configurations(auto, compile_too=not args.no_compile)
              if row["compiled"] or not args.only_compiled]
    for row in chosen:
        micro = row.pop("micro_batch")
        rows.append(measure(cfg, device, precision, micro, peak, **row, steps=args.steps, warmup=args.warmup))
        print(json.dumps(rows[-1]), flush=True)
    result = {"device": info.name, "total_memory_gib": round(info.total_memory / GIB, 2),
              "capability": list(info.capability), "precision": precision, "peak_tflops": peak,
              "auto_micro_batch": {"checkpointing_off": auto[False], "checkpointing_on": auto[True]},
              "positions_per_sample": 34 + cfg.max_text_tokens + 2 + cfg.max_mel_tokens + 2,
              "steps": args.steps, "warmup": args.warmup, "rows": rows, "torch": torch.__version__,
              "machine": platform.node(), "date": time.strftime("%Y-%m-%d %H:%M:%S")}
    if device.type == "cuda":
        name = re.sub(r"[^A-Za-z0-9]+", "-", info.name).strip("-")
        path = RESULTS / f"gpu-{name}{'-compiled' if args.only_compiled else ''}.json"
        RESULTS.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(result, indent=2) + "\n")
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
