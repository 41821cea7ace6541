"""What the generation check of each validation (--listen-lines, train/listen_check.py) costs, on this CPU.

Two sizes, random weights (seeded), fp32, `--threads` torch threads:
  - tiny: configs/tiny.yaml, the demo's size (4 lines, the default --listen-lines);
  - real: configs/indextts2.yaml's gpt: section (24 layers of 1280), the released IndexTTS2 GPT.
The check's time is the time of `generate_codes` (official beam sampling: 3 beams a line, all lines
batched) for `--lines` lines of `--text` text tokens. How long it runs depends on when the lines stop,
which random weights do not decide the way a trained model does, so it is measured in parts:
  - `prefill_s`: the lines' prompts through the trunk once;
  - `step_s_first`: one decoding step of every beam (head, sampling, beam bookkeeping, the cache moved
    to the chosen beams, the trunk), timed over `--steps` steps of a real generation (stop code
    disabled) right after the prompt;
  - how a step grows with the cached positions L: the cache move plus the trunk step on a cache of L
    random positions, at a few L, fitted by a line (`step_growth_s_per_position`); the same at the
    longest L with one beam a line instead of 3 (`cached_step_s_one_beam_at_longest`), what plain
    sampling would cost.
From these, seconds per validation for lines that stop at `--codes` codes (typical speech: the
padding benchmark's median is ~300 codes; beam search runs a few steps past the first stop, counted
here as 5%) and for lines that never stop (gpt.max_mel_tokens steps: an untrained model's worst case).
The training side: one optimizer step at the tiny demo size (micro-batch 4 x accumulation 2, the
tiny config's effective batch 8), and at the real size one forward + backward of one sample of the
same length (prompt, text, codes), times the real config's effective batch 64 (no optimizer step:
a lower bound); the share is check / (check + val_interval x step) at each config's val_interval.

    python benchmarks/bench_listen_check.py [--lines 4] [--text 60] [--codes 300] [--steps 8] [--threads 1]
        [--sizes tiny,real] [--repeats 5]

Seconds are the process's CPU seconds (CLOCK), each tiny figure the fastest of `--repeats` timings, the training
step's too.
Writes benchmarks/results/listen_check.json (the sizes measured; the others keep their figures) and prints it.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import time
from collections.abc import Callable
from pathlib import Path

import torch
from report import write_result

from indextts_train.config.settings import Config, load_config
from indextts_train.model.generation import KVCache, generate_codes, prompt_rows, trunk_step
from indextts_train.model.gpt import Batch, UnifiedVoiceGPT

ROOT = Path(__file__).resolve().parents[1]
RESULT = ROOT / "benchmarks" / "results" / "listen_check.json"
SIZES = {"tiny": ROOT / "configs" / "tiny.yaml", "real": ROOT / "configs" / "indextts2.yaml"}
# The process's CPU seconds: with one torch thread they are what the check takes on an idle core, while the
# wall time on the shared machine measured the other jobs as much (tiny figures varied 2x between runs)
CLOCK = time.process_time
LINGER = 1.05  # beam search goes on a little after the first stop code, until no running beam can win


def lines(config: Config, count: int, text: int, codes: int) -> Batch:
    cfg = config.gpt
    rng = torch.Generator().manual_seed(0)
    text = min(text, cfg.max_text_tokens)
    codes = min(codes, cfg.max_mel_tokens)
    return Batch(text_ids=torch.randint(2, cfg.number_text_tokens, (count, text), generator=rng),
                 codes=torch.randint(0, cfg.start_mel_token, (count, codes), generator=rng),
                 text_lengths=torch.full((count,), text), code_lengths=torch.full((count,), codes),
                 condition=torch.randn(count, 32, cfg.model_dim, generator=rng),
                 emo_vec=torch.randn(count, cfg.model_dim, generator=rng))


def fastest(run: Callable[[], object], repeats: int) -> float:
    """The least disturbed of `repeats` timings of run()."""
    times = []
    for _ in range(repeats):
        started = CLOCK()
        run()
        times.append(CLOCK() - started)
    return min(times)


@torch.no_grad()
def prefill_seconds(model: UnifiedVoiceGPT, batch: Batch, repeats: int) -> float:
    rows = prompt_rows(model, batch)
    return fastest(lambda: trunk_step(model, torch.stack(rows), KVCache(len(model.gpt.h)),
                                      torch.zeros(len(rows)).long()), repeats)


def first_step_seconds(model: UnifiedVoiceGPT, batch: Batch, steps: int, repeats: int) -> float:
    """Seconds per decoding step over the first `steps` (the stop code is disabled)."""
    def generate(count: int) -> Callable[[], object]:
        return lambda: generate_codes(model, batch, max_codes=count, generator=torch.Generator().manual_seed(1))

    return (fastest(generate(steps + 1), repeats) - fastest(generate(1), repeats)) / steps


@torch.no_grad()
def cached_step_seconds(model: UnifiedVoiceGPT, sequences: int, cached: int, repeats: int = 5) -> float:
    """The part of a step that grows with the cache: moving it to the chosen beams, then the trunk step."""
    cache, cfg = KVCache(len(model.gpt.h)), model.cfg
    for store in (cache.keys, cache.values):
        for i in range(len(store)):
            store[i] = torch.randn(sequences, cfg.heads, cached + KVCache.CHUNK, cfg.model_dim // cfg.heads)
    x, pad = torch.randn(sequences, 1, cfg.model_dim), torch.zeros(sequences).long()
    runs = []
    for _ in range(repeats):
        cache.length = cached
        started = CLOCK()
        cache.select(torch.randperm(sequences))
        trunk_step(model, x, cache, pad)
        runs.append(CLOCK() - started)
    return min(runs)  # the least disturbed by other jobs on the cores


def growth_per_position(model: UnifiedVoiceGPT, sequences: int, lengths: list[int]) -> tuple[dict, float]:
    """Measured cached-step seconds at each length and the least-squares slope (seconds per position)."""
    measured = {length: cached_step_seconds(model, sequences, length) for length in lengths}
    mean_l, mean_t = statistics.fmean(measured), statistics.fmean(measured.values())
    slope = (sum((length - mean_l) * (t - mean_t) for length, t in measured.items())
             / sum((length - mean_l) ** 2 for length in measured))
    return measured, max(slope, 0.0)


def check_seconds(prefill: float, first_step: float, slope: float, codes: int) -> float:
    """Prefill plus `codes` steps, the k-th one `k x slope` dearer than the first."""
    return prefill + codes * first_step + slope * codes * (codes - 1) / 2


def train_step_seconds(model: UnifiedVoiceGPT, config: Config, args: argparse.Namespace, real: bool) -> float:
    """Tiny: one optimizer step (4 x 2 samples). Real: forward + backward of one sample x 64."""
    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-5)
    batch = lines(config, 1 if real else 4, args.text, args.codes)

    def step() -> None:
        for _ in range(1 if real else 2):
            model.compute_losses(batch).mel_loss.backward()
        if not real:
            optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    if not real:
        step()  # the first one pays the allocations
    seconds = fastest(step, 1 if real else args.repeats)
    model.eval()
    return seconds * config.train.effective_batch_size if real else seconds


def measure(size: str, args: argparse.Namespace) -> dict:
    config = load_config(SIZES[size])
    cfg = config.gpt
    torch.manual_seed(0)
    model = UnifiedVoiceGPT(cfg, dropout=0.0).eval()
    with torch.no_grad():
        model.mel_head.bias[cfg.stop_mel_token] = -torch.inf  # never stops: every step is timed
    batch = lines(config, args.lines, args.text, args.codes)
    repeats = 1 if size == "real" else args.repeats
    prefill = prefill_seconds(model, batch, repeats)
    first_step = first_step_seconds(model, batch, args.steps, repeats)
    prompt = 34 + int(batch.text_lengths[0]) + 2
    reach = min(cfg.max_mel_tokens, 1000)  # a longer random cache would need 2 x 7 GB at the real size
    lengths = sorted({prompt, prompt + reach // 2, prompt + reach})
    measured, slope = growth_per_position(model, args.lines * 3, lengths)
    codes = min(cfg.max_mel_tokens, round(int(batch.code_lengths[0]) * LINGER))
    typical = check_seconds(prefill, first_step, slope, codes)
    never = check_seconds(prefill, first_step, slope, cfg.max_mel_tokens)
    train_step = train_step_seconds(model, config, args, real=size == "real")
    between = config.train.val_interval * train_step
    how = (f"forward+backward of 1 sample x effective batch {config.train.effective_batch_size}" if size == "real"
           else "optimizer step, micro-batch 4 x accumulation 2")
    return {"config": str(SIZES[size].relative_to(ROOT)), "lines": args.lines, "beams": 3,
            "text_tokens": int(batch.text_lengths[0]), "target_codes": int(batch.code_lengths[0]),
            "max_mel_tokens": cfg.max_mel_tokens, "prefill_s": prefill, "step_s_first": first_step,
            "cached_step_s_by_positions": {str(k): v for k, v in measured.items()},
            "step_growth_s_per_position": slope,
            "cached_step_s_one_beam_at_longest": cached_step_seconds(model, args.lines, lengths[-1]),
            "check_s_lines_stop": typical, "check_s_lines_never_stop": never,
            "train_step_s": train_step, "train_step_how": how, "val_interval": config.train.val_interval,
            "share_lines_stop": typical / (typical + between), "share_lines_never_stop": never / (never + between)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lines", type=int, default=4)
    parser.add_argument("--text", type=int, default=60)
    parser.add_argument("--codes", type=int, default=300)
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--sizes", default="tiny,real")
    parser.add_argument("--repeats", type=int, default=5, help="timings per figure at the tiny size (the fastest "
                                                               "is kept; the real size is timed once)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    # a size not measured this time keeps its earlier figures, with the date and torch they were taken with
    result = json.loads(RESULT.read_text(encoding="utf-8")) if RESULT.is_file() else {}
    for size in args.sizes.split(","):
        result[size] = {"date": time.strftime("%Y-%m-%d"), "torch": torch.__version__, "clock": "process CPU seconds",
                        **measure(size, args)}
    result.update(cpus=os.cpu_count(), threads=args.threads, machine=platform.machine())
    write_result(RESULT, result)


if __name__ == "__main__":
    main()
