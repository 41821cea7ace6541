"""How long and how much memory ManifestIndex.build takes on a 1,000,000-line paired manifest.

Only the manifest lines are generated (indexing never opens the .npy files). Peak memory is
reported two ways: tracemalloc (Python allocations during build) and the rise of the process's
max RSS (what the OS saw, including numpy buffers and the interpreter).

    python benchmarks/bench_index.py [--lines N]

Writes benchmarks/results/index.json and prints it.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import sys
import tempfile
import time
import tracemalloc
from pathlib import Path

from indextts_train.data.manifest import ManifestIndex

RESULTS = Path(__file__).resolve().parent / "results" / "index.json"
CHUNK_LINES = 10_000


def paired_line(i: int) -> str:
    """One line shaped like the community preprocessing's output (tiny/pairs.jsonl)."""
    target, prompt = f"tgt{i}", f"prm{(i * 7919) % 1_000_003}"
    return json.dumps({
        "id": f"{target}__{prompt}", "speaker": f"spk{i % 997}", "language": "am",
        "prompt_id": prompt, "prompt_audio_path": f"wavs/{prompt}.wav",
        "prompt_condition_path": f"condition/{prompt}.npy", "prompt_condition_len": 32,
        "prompt_emo_vec_path": f"emo_vec/{prompt}.npy", "prompt_duration": 2.0 + i % 50 / 10,
        "target_id": target, "target_audio_path": f"wavs/{target}.wav",
        "target_text": f"target sentence number {i}", "target_text_ids_path": f"text_ids/{target}.npy",
        "target_text_len": 5 + i % 300, "target_codes_path": f"codes/{target}.npy",
        "target_code_len": 20 + i % 1500, "target_emo_vec_path": f"emo_vec/{target}.npy",
    }, ensure_ascii=False)


def write_manifest(path: Path, lines: int) -> None:
    with open(path, "w", encoding="utf-8") as handle:
        for start in range(0, lines, CHUNK_LINES):
            stop = min(start + CHUNK_LINES, lines)
            handle.write("".join(paired_line(i) + "\n" for i in range(start, stop)))


def cpu_name() -> str:
    """The CPU's model name (Linux): the figures are of one machine."""
    try:
        lines = Path("/proc/cpuinfo").read_text().splitlines()
    except OSError:
        return platform.processor()
    return next((line.split(":", 1)[1].strip() for line in lines if line.startswith("model name")), "")


def maxrss_bytes() -> int:
    # ru_maxrss is KiB on Linux and bytes on macOS.
    scale = 1 if sys.platform == "darwin" else 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * scale


def measure(path: Path) -> dict:
    rss_before = maxrss_bytes()
    tracemalloc.start()
    start = time.perf_counter()
    index = ManifestIndex.build([path], max_text_tokens=600, max_mel_tokens=1815)
    seconds = time.perf_counter() - start
    _, traced_peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    rss_delta = maxrss_bytes() - rss_before
    # Timing without tracemalloc, which slows every allocation down.
    start = time.perf_counter()
    ManifestIndex.build([path], max_text_tokens=600, max_mel_tokens=1815)
    plain_seconds = time.perf_counter() - start
    array_bytes = sum(a.nbytes for a in (index.offsets, index.file_ids, index.line_numbers,
                                         index.text_lengths, index.code_lengths))
    return {
        "lines_indexed": len(index),
        "build_seconds": round(plain_seconds, 3),
        "code_files_mb": round(index.code_files.nbytes / 2**20, 1),  # the key of each line's codes file
        "build_seconds_under_tracemalloc": round(seconds, 3),
        "tracemalloc_peak_mb": round(traced_peak / 2**20, 1),
        "maxrss_delta_mb": round(rss_delta / 2**20, 1),
        "index_arrays_mb": round(array_bytes / 2**20, 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lines", type=int, default=1_000_000)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "train_pairs.jsonl"
        write_manifest(path, args.lines)
        result = {"lines": args.lines, "manifest_mb": round(path.stat().st_size / 2**20, 1), **measure(path),
                  "python": platform.python_version(), "machine": platform.machine(), "cpu": cpu_name(),
                  "cpu_count": os.cpu_count()}
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
