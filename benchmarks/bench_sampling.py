"""Data order and mixing: what each rule draws, and what computing an epoch's order costs.

- issue 10's case: 20 samples, effective batch 8 (16 a step-rounded epoch), 10 epochs: how often each
  sample is drawn under rule 1 (before) and rule 2 (now);
- replay: 85,000 lines of a new language + a 200,000-line manifest @0.15, effective batch 64, 10
  epochs: each epoch's share, and how much of the replay manifest has been drawn and how often;
- padding: mean padded positions per step (max length in the step x step size / real lengths);
- time to compute one epoch's order for 1,000,000 lines, each rule (median of `--repeats`).

Writes benchmarks/results/sampling.json and prints it.
"""

from __future__ import annotations

import argparse
import json
import time
from collections import Counter
from pathlib import Path

import numpy as np
from bench_trainer import machine_info

from indextts_train.data.sampling import LEGACY_RULE, ORDER_RULE, SamplerSpec, Source, epoch_counts, epoch_order

RESULTS = Path(__file__).resolve().parent / "results"


def draws(spec: SamplerSpec, lengths: np.ndarray, epochs: int) -> Counter:
    return Counter(np.concatenate([epoch_order(spec, lengths, e) for e in range(epochs)]).tolist())


def issue_10_case() -> dict:
    lengths = np.arange(1, 21)  # sample i has length i + 1: the longest are the last
    out = {}
    for rule in (LEGACY_RULE, ORDER_RULE):
        spec = SamplerSpec(rule, 1234, 512, 8, (Source("a", 20),))
        counts = draws(spec, lengths, 10)
        out[f"rule_{rule}"] = {"draws_per_sample": [counts.get(i, 0) for i in range(20)],
                               "never_drawn": [i for i in range(20) if counts.get(i, 0) == 0]}
    return out


def replay_case(epochs: int) -> dict:
    new, old = 85_000, 200_000
    spec = SamplerSpec(ORDER_RULE, 1234, 512, 64, (Source("am", new), Source("zh_en", old, 0.15)))
    lengths = np.random.default_rng(0).integers(20, 600, new + old)
    per_epoch, seen = [], Counter()
    for epoch in range(epochs):
        order = epoch_order(spec, lengths, epoch)
        replay = order[order >= new]
        seen.update(replay.tolist())
        per_epoch.append({"samples": len(order), "replay_share": round(len(replay) / len(order), 6),
                          "replay_lines_drawn_so_far": len(seen), "max_draws_of_a_replay_line": max(seen.values())})
    return {"epoch_counts": epoch_counts(spec).tolist(), "per_epoch": per_epoch}


def padding(rule: int, lines: int = 100_000, step: int = 64) -> float:
    lengths = np.random.default_rng(1).integers(20, 600, lines)
    spec = SamplerSpec(rule, 1234, 512, step, (Source("a", lines),))
    steps = lengths[epoch_order(spec, lengths, 0)].reshape(-1, step)
    return round(float((steps.max(axis=1) * step).sum() / steps.sum()), 4)


def order_seconds(rule: int, lines: int, repeats: int) -> float:
    lengths = np.random.default_rng(2).integers(20, 600, lines)
    spec = SamplerSpec(rule, 1234, 512, 64, (Source("a", lines),))
    times = []
    for epoch in range(repeats):
        start = time.perf_counter()
        epoch_order(spec, lengths, epoch)
        times.append(time.perf_counter() - start)
    return round(float(np.median(times)), 4)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lines", type=int, default=1_000_000)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--epochs", type=int, default=10)
    args = parser.parse_args()
    result = {
        "issue_10_20_samples_batch_8_10_epochs": issue_10_case(),
        "replay_85k_plus_200k_at_0.15_batch_64": replay_case(args.epochs),
        "padded_over_real_positions_batch_64": {f"rule_{r}": padding(r) for r in (LEGACY_RULE, ORDER_RULE)},
        f"epoch_order_seconds_{args.lines}_lines": {f"rule_{r}": order_seconds(r, args.lines, args.repeats)
                                                   for r in (LEGACY_RULE, ORDER_RULE)},
        "machine": machine_info(),
    }
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "sampling.json").write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
