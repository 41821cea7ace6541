"""Padding share of an epoch: padded trunk positions / all trunk positions, for the trainer's sampler.

A batch is padded to its longest text and its longest code sequence (the model adds the 34 prefix
rows of IndexTTS2 and start/stop to each segment), so a sample of text t and codes c in a batch of
widths (T, M) costs 34 + (T + 2) + (M + 2) positions of which (T - t) + (M - c) are padding. The
lengths are synthetic but shaped like speech data: text 10-300 tokens (log-normal, median ~60),
codes about 5.2 per text token with a +-25% spread (a speaking rate), clipped to 50-1500. Batches
come from the trainer's data order (`sampling.epoch_order`, rule 2: shuffle, sort by text_len +
code_len within windows of whole steps of the effective batch, shuffle the steps) cut by
`ResumableBatchSampler` exactly as `steps.micro_batches` does, for several micro-batches and sort
windows at the default effective batch; the default sort window is the config's. Rule 2 sorts at
least within each step, so an unsorted order (a plain permutation) is reported for reference.

    python benchmarks/bench_padding.py [--samples 100000] [--seed 0]

Writes benchmarks/results/padding.json and prints a table. Rerun it after changing the sampler.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import numpy as np
from report import write_result

from indextts_train.config.constants import PREFIX_LEN
from indextts_train.config.settings import TrainConfig
from indextts_train.data.sampling import ORDER_RULE, ResumableBatchSampler, SamplerSpec, Source, epoch_order

RESULT = Path(__file__).resolve().parent / "results" / "padding.json"
MICRO_BATCHES = (4, 8, 16, 32, 64)
SORT_WINDOWS = (64, 512, 4096)  # rule 2 rounds a window down to whole steps, at least one step
UNSORTED = 0  # the sort_window value of the reference rows: a plain permutation, no sorting


def synthetic_lengths(samples: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """(text_len, code_len) int arrays shaped like a speech corpus (see the module docstring)."""
    rng = np.random.default_rng(seed)
    text = np.clip(np.round(rng.lognormal(np.log(60), 0.7, samples)), 10, 300).astype(np.int64)
    rate = rng.uniform(0.75, 1.25, samples) * 5.2  # codes per text token
    codes = np.clip(np.round(text * rate), 50, 1500).astype(np.int64)
    return text, codes


def trainer_order(text: np.ndarray, codes: np.ndarray, sort_window: int, effective_batch: int,
                  seed: int) -> np.ndarray:
    """Epoch 0 of a new run on one manifest, as the trainer orders it (UNSORTED: a plain permutation)."""
    if sort_window == UNSORTED:
        return np.random.default_rng(seed).permutation(len(text))
    spec = SamplerSpec(ORDER_RULE, seed, sort_window, effective_batch, (Source("synthetic", len(text)),))
    return epoch_order(spec, text + codes, 0)


def padding_share(text: np.ndarray, codes: np.ndarray, micro_batch: int, sort_window: int, effective_batch: int,
                  seed: int) -> dict:
    sampler = ResumableBatchSampler(trainer_order(text, codes, sort_window, effective_batch, seed),
                                    micro_batch=micro_batch)
    batches = np.array(list(sampler))  # (steps, micro_batch)
    t, c = text[batches], codes[batches]  # (steps, micro_batch)
    t_width, c_width = t.max(axis=1, keepdims=True), c.max(axis=1, keepdims=True)
    total = batches.size * PREFIX_LEN + ((t_width + 2) + (c_width + 2)).sum() * micro_batch
    padded = (t_width - t).sum() + (c_width - c).sum()
    return {"micro_batch": micro_batch, "sort_window": sort_window,
            "padding_share": round(float(padded / total), 4),
            "text_padding_share": round(float((t_width - t).sum() / ((t_width + 2).sum() * micro_batch)), 4),
            "code_padding_share": round(float((c_width - c).sum() / ((c_width + 2).sum() * micro_batch)), 4)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=100_000)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    text, codes = synthetic_lengths(args.samples, args.seed)
    default_window, effective = TrainConfig().sort_window, TrainConfig().effective_batch_size
    rows = [padding_share(text, codes, m, w, effective, args.seed)
            for w in (UNSORTED, *SORT_WINDOWS) for m in MICRO_BATCHES]
    result = {
        "samples": args.samples, "order_rule": ORDER_RULE, "effective_batch": effective,
        "default_sort_window": default_window, "unsorted_sort_window": UNSORTED,
        "lengths": {"text_min_median_max": [int(text.min()), int(np.median(text)), int(text.max())],
                    "codes_min_median_max": [int(codes.min()), int(np.median(codes)), int(codes.max())]},
        "default": [r for r in rows if r["sort_window"] == default_window],
        "all": rows, "date": time.strftime("%Y-%m-%d %H:%M:%S"),
    }
    write_result(RESULT, result, echo=False)
    print(f"{'sort_window':>11} {'micro_batch':>11} {'padding':>8} {'text':>6} {'codes':>6}")
    for r in rows:
        print(f"{r['sort_window']:>11} {r['micro_batch']:>11} {r['padding_share']:>8.1%} "
              f"{r['text_padding_share']:>6.1%} {r['code_padding_share']:>6.1%}")


if __name__ == "__main__":
    main()
