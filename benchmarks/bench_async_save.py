"""How much training time --async-save hides: a training loop that checkpoints synchronously vs in
the background vs not at all.

In one process: a UnifiedVoiceGPT of model_dim 512 x 8 layers (tiny.yaml otherwise; ~34M trained
parameters, a ~384 MiB checkpoint with the AdamW moments), trained with AdamW on synthetic batches
for `--steps` optimizer steps; every `--save-interval` steps it saves a checkpoint of the trainer's
layout with `save_checkpoint`, either inline (sync) or through the trainer's CPU snapshot +
background thread (async). Modes are interleaved `--rounds` times; medians reported.

    python benchmarks/bench_async_save.py [--steps 24] [--save-interval 6] [--rounds 2]

`hidden_share` = (sync loop time - async loop time) / (sync loop time - no-save loop time): the share
of the save's cost the background write takes off the loop. `stall_s` is the time the loop itself
spent in each save call (async: the snapshot and starting the thread). Writes
benchmarks/results/async_save.json.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import tempfile
import time
from pathlib import Path

import torch
from report import write_result

from indextts_train.checkpoint import files as ckpt
from indextts_train.checkpoint.async_save import BackgroundSaver, cpu_snapshot
from indextts_train.checkpoint.state import DataRecord, History, Progress
from indextts_train.config.settings import load_config
from indextts_train.model.gpt import Batch, UnifiedVoiceGPT

ROOT = Path(__file__).resolve().parents[1]
RESULT = ROOT / "benchmarks" / "results" / "async_save.json"
SIZES = {"model_dim": 512, "layers": 8, "heads": 8, "number_text_tokens": 4000, "number_mel_codes": 4098,
         "start_mel_token": 4096, "stop_mel_token": 4097}


def _batch(cfg, generator: torch.Generator) -> Batch:
    B, T, M, D = 4, 24, 48, cfg.model_dim
    return Batch(torch.randint(2, cfg.number_text_tokens, (B, T), generator=generator),
                 torch.randint(0, cfg.number_mel_codes - 2, (B, M), generator=generator),
                 torch.full((B,), T), torch.full((B,), M), torch.randn(B, 32, D, generator=generator),
                 torch.randn(B, D, generator=generator))


def _state(model: UnifiedVoiceGPT, optimizer: torch.optim.AdamW, step: int) -> dict:
    """A checkpoint dict of the trainer's format (fresh CPU copies of the weights, live optimizer state)."""
    names = [n for n, _ in model.named_parameters()]
    return {"format": ckpt.FORMAT, "format_version": ckpt.FORMAT_VERSION,
            "model": {k: v.detach().to("cpu", copy=True) for k, v in model.state_dict().items()},
            "optimizer": optimizer.state_dict(), "optimizer_param_names": names,
            "scheduler": {"last_epoch": step}, "scaler": None,
            "progress": Progress(step=step, sampler_seed=1, micro_batch=4, grad_accumulation=1).state_dict(),
            "rng": [ckpt.capture_rng()],
            "history": History().state_dict(), "data": DataRecord().state_dict(),  # every part of the format
            "hparams": {}, "config": {}, "vocab_plan": {"base_tokens": 1, "tokens": 1, "freeze_base": True}}


def run(mode: str, steps: int, save_interval: int, directory: Path) -> dict:
    cfg = load_config(ROOT / "configs" / "tiny.yaml").gpt
    for key, value in SIZES.items():
        setattr(cfg, key, value)
    torch.manual_seed(0)
    model = UnifiedVoiceGPT(cfg).train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    generator = torch.Generator().manual_seed(0)
    saver, stalls = BackgroundSaver(), []
    start = time.perf_counter()
    for step in range(1, steps + 1):
        out = model.compute_losses(_batch(cfg, generator))
        (0.2 * out.text_loss + 0.8 * out.mel_loss).backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        if mode != "none" and step % save_interval == 0:
            began = time.perf_counter()
            state = _state(model, optimizer, step)
            if mode == "sync":
                ckpt.save_checkpoint(state, directory / mode, step, keep=2)
            else:
                snapshot = cpu_snapshot(state)
                saver.start(lambda s=snapshot, n=step: ckpt.save_checkpoint(s, directory / mode, n, keep=2))
            stalls.append(time.perf_counter() - began)
    loop = time.perf_counter() - start
    saver.wait()  # the last background save, after the loop (as the trainer's end of run)
    size = (directory / mode / "latest.pth").stat().st_size if mode != "none" else 0
    return {"loop_s": loop, "stall_s": stalls, "checkpoint_mib": round(size / 2**20, 1),
            "params": sum(p.numel() for p in model.parameters())}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=24)
    parser.add_argument("--save-interval", type=int, default=6)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    results: dict[str, list[dict]] = {"none": [], "sync": [], "async": []}
    with tempfile.TemporaryDirectory() as tmp:
        for _ in range(args.rounds):
            for mode in results:
                results[mode].append(run(mode, args.steps, args.save_interval, Path(tmp)))
    loop = {m: statistics.median(r["loop_s"] for r in runs) for m, runs in results.items()}
    stall = {m: statistics.median(s for r in runs for s in r["stall_s"]) for m, runs in results.items() if m != "none"}
    result = {
        "steps": args.steps, "save_interval": args.save_interval, "rounds": args.rounds,
        "trained_parameters": results["none"][0]["params"], "checkpoint_mib": results["sync"][0]["checkpoint_mib"],
        "loop_s": {m: round(v, 2) for m, v in loop.items()},
        "stall_per_save_s": {m: round(v, 3) for m, v in stall.items()},
        "hidden_share": round((loop["sync"] - loop["async"]) / max(loop["sync"] - loop["none"], 1e-9), 3),
        "load_average": [round(x, 2) for x in os.getloadavg()], "cpu_count": os.cpu_count(),
        "torch": torch.__version__, "machine": f"{platform.machine()} {platform.system()}",
        "date": time.strftime("%Y-%m-%d %H:%M:%S"),
    }
    write_result(RESULT, result)


if __name__ == "__main__":
    main()
