"""Peak memory of the heads' loss, plain (full logits) vs chunked, on the real IndexTTS2 shapes (CPU).

One forward + backward of the text and mel heads' cross-entropy (`losses_from_logits` on full logits
vs `losses_from_hidden`, chunked) from hidden states of `--micro-batch` samples of maximum length
(602 text + 1,817 mel positions, model_dim 1280, 12,001 text rows, 8,194 mel codes), float32 as on
the CPU. Each variant runs in a fresh process; its peak is the process's peak resident memory
(VmHWM, reset through /proc/self/clear_refs just before) minus what was resident before the loss
(the hidden states and the heads' weights), so the figure is what the loss itself adds.

    python benchmarks/bench_loss_memory.py [--micro-batch 8] [--repeats 1]

Writes benchmarks/results/loss_memory.json and prints it.
"""

from __future__ import annotations

import argparse
import json
import platform
import subprocess
import sys
import time
from pathlib import Path

import torch
from report import write_result

from indextts_train.config.settings import GPTConfig
from indextts_train.model.gpt import Batch, losses_from_hidden, losses_from_logits

RESULT = Path(__file__).resolve().parent / "results" / "loss_memory.json"
MIB = 2**20


def _status_kib(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise RuntimeError(f"/proc/self/status has no {field}")


def _inputs(cfg: GPTConfig, micro_batch: int) -> tuple:
    """Hidden states, heads and a batch of maximum-length samples (lengths = widths)."""
    torch.manual_seed(0)
    T, M, D = cfg.max_text_tokens, cfg.max_mel_tokens, cfg.model_dim
    batch = Batch(torch.randint(2, cfg.number_text_tokens, (micro_batch, T)),
                  torch.randint(0, cfg.number_mel_codes - 2, (micro_batch, M)),
                  torch.full((micro_batch,), T), torch.full((micro_batch,), M),
                  torch.zeros(micro_batch, 32, D), torch.zeros(micro_batch, D))
    text_head, mel_head = torch.nn.Linear(D, cfg.text_rows), torch.nn.Linear(D, cfg.number_mel_codes)
    text_hidden = torch.randn(micro_batch, T + 2, D, requires_grad=True)
    mel_hidden = torch.randn(micro_batch, M + 2, D, requires_grad=True)
    return text_hidden, mel_hidden, text_head, mel_head, batch


def measure_one(variant: str, micro_batch: int) -> dict:
    """In this process: one forward + backward of the loss; peak bytes it added, and seconds."""
    cfg = GPTConfig()
    text_hidden, mel_hidden, text_head, mel_head, batch = _inputs(cfg, micro_batch)
    for p in (*text_head.parameters(), *mel_head.parameters()):
        p.grad = torch.zeros_like(p)  # the optimizer's gradients exist already in training
    before = _status_kib("VmRSS")
    Path("/proc/self/clear_refs").write_text("5")  # reset VmHWM to the current RSS
    start = time.perf_counter()
    if variant == "plain":
        text_logits = text_head(text_hidden).permute(0, 2, 1)
        mel_logits = mel_head(mel_hidden).permute(0, 2, 1)
        out = losses_from_logits(text_logits, mel_logits, batch, cfg)
    else:
        out = losses_from_hidden(text_hidden, mel_hidden, text_head, mel_head, batch, cfg)
    (out.text_loss + out.mel_loss).backward()
    seconds = time.perf_counter() - start
    return {"peak_added_mib": round((_status_kib("VmHWM") - before) / 1024, 1), "seconds": round(seconds, 2),
            "mel_loss": out.mel_loss.item(), "text_loss": out.text_loss.item()}


def run_child(variant: str, micro_batch: int) -> dict:
    out = subprocess.run([sys.executable, __file__, "--child", variant, "--micro-batch", str(micro_batch)],
                         check=True, capture_output=True, text=True)
    return json.loads(out.stdout)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--micro-batch", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=1, help="runs per variant (the smallest peak is kept)")
    parser.add_argument("--child", choices=["plain", "chunked"], help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(measure_one(args.child, args.micro_batch)))
        return
    runs = {v: [run_child(v, args.micro_batch) for _ in range(args.repeats)] for v in ("plain", "chunked")}
    best = {v: min(r, key=lambda x: x["peak_added_mib"]) for v, r in runs.items()}
    cfg = GPTConfig()
    logits = args.micro_batch * ((cfg.max_text_tokens + 2) * cfg.text_rows
                                 + (cfg.max_mel_tokens + 2) * cfg.number_mel_codes)
    result = {
        "micro_batch": args.micro_batch,
        "positions": {"text": cfg.max_text_tokens + 2, "mel": cfg.max_mel_tokens + 2},
        "full_logits_fp32_mib": round(logits * 4 / MIB, 1),
        "plain": best["plain"], "chunked": best["chunked"],
        "peak_ratio_plain_over_chunked": round(best["plain"]["peak_added_mib"] / best["chunked"]["peak_added_mib"], 2),
        "loss_abs_diff": max(abs(best["plain"][k] - best["chunked"][k]) for k in ("mel_loss", "text_loss")),
        "torch": torch.__version__, "machine": f"{platform.machine()} {platform.system()}",
        "date": time.strftime("%Y-%m-%d %H:%M:%S"),
    }
    write_result(RESULT, result)


if __name__ == "__main__":
    main()
