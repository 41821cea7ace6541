"""Are this machine's CPU kernels reproducible from one process to the next, at a given thread count?

Exact resume compares runs of different processes bit for bit, so it needs every fresh process to
compute the same float bits from the same inputs. This starts `--processes` fresh Python processes
(two at a time, as a busy machine runs them), each computing a few seeded tensor ops (a matmul, sums,
a conv1d, a layer norm, a log-softmax, GELU, `exp().sum(1)`), and counts the distinct results per op.
Run it once per thread count:

    PYTHONPATH=. python benchmarks/bench_reproducibility.py --threads 2 --processes 400
    PYTHONPATH=. python benchmarks/bench_reproducibility.py --threads 1 --processes 400

Writes `results/reproducibility-<threads>t.json`: per op, how many processes gave each result.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

from report import write_result

ROOT = Path(__file__).resolve().parents[1]

PROBE = """
import hashlib, json, torch
torch.manual_seed(0)
a = torch.randn(257, 300); w = torch.randn(300, 129); x = torch.randn(100000)
parts = {"matmul": a @ w, "sum": x.sum().reshape(1),
         "conv1d": torch.nn.functional.conv1d(torch.randn(2, 16, 200), torch.randn(32, 16, 5)),
         "layer_norm": torch.nn.functional.layer_norm(torch.randn(64, 96), (96,)),
         "log_softmax": torch.log_softmax(torch.randn(64, 1000), -1), "gelu": torch.nn.functional.gelu(a),
         "exp_sum": a.exp().sum(1)}
print(json.dumps({n: hashlib.sha256(p.contiguous().numpy().tobytes()).hexdigest()[:12] for n, p in parts.items()}))
"""


def run_pair(threads: int) -> list[dict]:
    env = {**os.environ, "OMP_NUM_THREADS": str(threads)}
    procs = [subprocess.Popen([sys.executable, "-c", PROBE], stdout=subprocess.PIPE, text=True, env=env)
             for _ in range(2)]
    return [json.loads(proc.communicate()[0]) for proc in procs]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--processes", type=int, default=400)
    parser.add_argument("--result", type=Path, default=None)
    args = parser.parse_args()
    start = time.perf_counter()
    results = [r for _ in range(max(1, args.processes // 2)) for r in run_pair(args.threads)]
    per_op = {op: dict(Counter(r[op] for r in results).most_common()) for op in results[0]}
    write_result(args.result or ROOT / "benchmarks" / "results" / f"reproducibility-{args.threads}t.json", {
        "threads": args.threads, "processes": len(results), "cpu_count": os.cpu_count(),
        "date": time.strftime("%Y-%m-%d %H:%M"), "seconds": round(time.perf_counter() - start, 1),
        "processes_with_other_bits": sum(any(r[op] != max(per_op[op], key=per_op[op].get) for op in r)
                                         for r in results),
        "results_per_op": per_op,
    })


if __name__ == "__main__":
    main()
