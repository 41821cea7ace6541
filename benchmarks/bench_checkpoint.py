"""What the crash-safe save costs: save_checkpoint vs torch.save + fsync of the same state.

The baseline is the least any durable save must do: torch.save to a file, then fsync it (without
the fsync the bytes may still be only in the page cache when the machine dies). save_checkpoint
adds a validation walk, the temp name and rename, fsync of the directory, the latest.pth hard link
and rotation (deleting the oldest file). A plain torch.save without fsync is timed too, for
reference only. verify_checkpoint (what --resume auto runs) is timed as well: it reads the whole
file once to check every zip member's CRC-32.

    python benchmarks/bench_checkpoint.py [--mb 200] [--repeats 5] [--dir /some/disk]

Writes benchmarks/results/checkpoint.json and prints it.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import torch
from report import write_result

from indextts_train.checkpoint import files as ckpt
from indextts_train.checkpoint.rng import capture_rng
from indextts_train.checkpoint.state import DataRecord, History, Lineage, Progress
from indextts_train.checkpoint.verify import verify_checkpoint

RESULT = Path(__file__).resolve().parent / "results" / "checkpoint.json"
TENSOR_NUMEL = 2**20  # 4 MiB float32 tensors


def build_state(total_mb: int) -> dict:
    """Model + AdamW moments (exp_avg, exp_avg_sq) of about `total_mb` MiB in float32."""
    tensors = max(1, total_mb // 12)  # each tensor: 4 MiB of weights + 8 MiB of moments
    params = [torch.nn.Parameter(torch.randn(TENSOR_NUMEL)) for _ in range(tensors)]
    optimizer = torch.optim.AdamW(params, lr=1e-4)
    for p in params:
        p.grad = torch.randn_like(p)
    optimizer.step()  # creates the moments
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: 1.0)
    names = [f"gpt.h.{i}.mlp.c_fc.weight" for i in range(tensors)]
    return {
        "format": ckpt.FORMAT, "format_version": ckpt.FORMAT_VERSION,
        "model": {n: p.detach() for n, p in zip(names, params, strict=True)},
        "optimizer": optimizer.state_dict(), "optimizer_param_names": names,
        "scheduler": scheduler.state_dict(), "scaler": None,
        "progress": Progress(sampler_seed=1, micro_batch=1, grad_accumulation=1).state_dict(),
        "rng": [capture_rng()], "history": History().state_dict(), "data": DataRecord().state_dict(),
        "lineage": Lineage().state_dict(),
        "hparams": {}, "config": {}, "vocab_plan": {"base_tokens": 1, "tokens": 1, "freeze_base": True},
    }


def torch_save_fsync(state: dict, path: Path) -> None:
    torch.save(state, path)
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def timed(run: Callable[..., object], *args: object) -> float:
    os.sync()  # start clean: no dirty pages of an earlier write for this one's fsync to flush
    start = time.perf_counter()
    run(*args)
    return time.perf_counter() - start


def measure(total_mb: int, repeats: int, directory: Path) -> dict:
    state = build_state(total_mb)

    def atomic_save(i: int) -> None:
        state["progress"]["step"] = i + 1
        ckpt.save_checkpoint(state, directory, i + 1, keep=2)

    # Interleaved, so all see the same background load of the machine; each overwrites (and so
    # frees) a file of the same size, as rotation does. On a shared machine the minimum is the
    # figure that reflects the work done; the median is reported too.
    times: dict[str, list[float]] = {"no_fsync": [], "fsync": [], "save_checkpoint": []}
    for i in range(repeats):
        times["no_fsync"].append(timed(torch.save, state, directory / "plain.pth"))
        times["fsync"].append(timed(torch_save_fsync, state, directory / "synced.pth"))
        times["save_checkpoint"].append(timed(atomic_save, i))
    best = {k: min(v) for k, v in times.items()}
    median = {k: statistics.median(v) for k, v in times.items()}
    verify = statistics.median(timed(verify_checkpoint, directory / "latest.pth") for _ in range(repeats))
    return {
        "file_mb": round((directory / "latest.pth").stat().st_size / 2**20, 1),
        "repeats": repeats,
        "min_s": {k: round(v, 4) for k, v in best.items()},
        "median_s": {k: round(v, 4) for k, v in median.items()},
        "save_ratio_min": round(best["save_checkpoint"] / best["fsync"], 3),
        "save_ratio_median": round(median["save_checkpoint"] / median["fsync"], 3),
        "verify_checkpoint_s": round(verify, 4),
        "load_average": [round(x, 2) for x in os.getloadavg()],
        "torch": torch.__version__,
        "machine": f"{platform.machine()} {platform.system()}",
        "disk": str(directory.parent),
        "date": time.strftime("%Y-%m-%d %H:%M:%S"),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mb", type=int, default=200, help="state size in MiB (weights + 2 moments)")
    parser.add_argument("--repeats", type=int, default=9)
    parser.add_argument("--dir", type=Path, default=None, help="where to write (default: a temp folder)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
        result = measure(args.mb, args.repeats, Path(tmp))
    write_result(RESULT, result)


if __name__ == "__main__":
    main()
