"""Resume cost at a late position in the epoch vs an early one: it should not grow with the position.

The trainer resumes by slicing the epoch order at `samples_in_epoch` (no replay of the samples
before it), so resuming at sample 190,000 of a 200,000-sample epoch should cost what resuming at
sample 8 does. Method: a 200,000-line paired manifest (every line points at one of a few real
.npy sets: the index and the sampler only see the lines), a 2-step run of the tiny config for a
real checkpoint, then two copies of it whose progress says samples_in_epoch = EARLY or LATE
(re-saved whole with torch.save, so the zip CRCs match, and checked COMPLETE by
verify_checkpoint). Each is resumed with `python -m indextts_train --resume PATH --max-steps 3`
(one optimizer step) in a fresh process; timed from process start to the arrival of its
"step 3/3" log line (the first optimizer step after resume), and the whole process too. The two
positions alternate, REPEATS times each; medians reported.

    python benchmarks/bench_resume.py [--lines 200000] [--early 8] [--late 190000] [--repeats 3]

Writes benchmarks/results/resume.json and prints it.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import sys
import tempfile
from pathlib import Path

import torch
from report import write_result

from indextts_train.checkpoint.verify import verify_checkpoint
from indextts_train.demo import make_base_checkpoint

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from benchmarks.bench_trainer import machine_info, run_timed  # noqa: E402  (same line-arrival timing)
from tests.conftest import write_dataset  # noqa: E402  (the test suite's synthetic paired manifest)

RESULT = ROOT / "benchmarks" / "results" / "resume.json"
TINY_CONFIG = ROOT / "configs" / "tiny.yaml"
ARRAY_SETS = 8  # distinct .npy sets the manifest lines cycle through
CHUNK_LINES = 10_000


def write_big_manifest(folder: Path, lines: int) -> Path:
    """`lines` manifest lines with unique ids, cycling over ARRAY_SETS real samples' arrays."""
    small = write_dataset(folder, ARRAY_SETS, seed=1, name="arrays.jsonl")
    samples = [json.loads(line) for line in small.read_text(encoding="utf-8").splitlines()]
    path = folder / "train.jsonl"
    with open(path, "w", encoding="utf-8") as handle:
        for start in range(0, lines, CHUNK_LINES):
            chunk = (json.dumps({**samples[i % ARRAY_SETS], "id": f"line{i}"})
                     for i in range(start, min(start + CHUNK_LINES, lines)))
            handle.write("\n".join(chunk) + "\n")
    return path


def train_command(manifest: Path, output_dir: Path, max_steps: int, *extra: str) -> list[str]:
    return [sys.executable, "-m", "indextts_train", "--train-manifest", str(manifest), "--output-dir",
            str(output_dir), "--config", str(TINY_CONFIG), "--max-steps", str(max_steps), "--num-workers", "0",
            "--log-interval", "1", *extra]


def craft_checkpoint(source: Path, dest: Path, samples_in_epoch: int) -> None:
    """A copy of `source` whose data position is `samples_in_epoch`, re-saved whole so its CRCs are right."""
    state = torch.load(source, map_location="cpu", weights_only=True)
    consumed = state["progress"]["samples_in_epoch"]
    state["progress"]["samples_in_epoch"] = samples_in_epoch
    state["progress"]["samples_total"] += samples_in_epoch - consumed
    torch.save(state, dest)
    verdict = verify_checkpoint(dest)
    if verdict.status != "COMPLETE":
        raise RuntimeError(f"crafted {dest} is {verdict.status}: {verdict.reasons}")


def time_resume(manifest: Path, checkpoint: Path, output_dir: Path, step: int, position: int) -> dict:
    """One resume of `checkpoint` (at `step`) for one more optimizer step, in a fresh process."""
    command = train_command(manifest, output_dir, step + 1, "--resume", str(checkpoint))
    marks = {"training": "training ", "first_step": f"step {step + 1}/{step + 1} "}
    at, stamped, process_seconds = run_timed(command, marks)
    start_line = next(line for _, line in stamped if line.startswith("training "))
    started = re.search(r"starting at step (\d+) \(epoch (\d+), sample (\d+)\)", start_line)
    if not started or (int(started[1]), int(started[3])) != (step, position):
        raise RuntimeError(f"resume did not start at step {step}, sample {position}: {start_line.strip()}")
    return {"to_training_line_s": round(at["training"][0], 3), "to_first_step_s": round(at["first_step"][0], 3),
            "process_s": round(process_seconds, 3)}


def measure(work: Path, lines: int, positions: dict[str, int], repeats: int) -> dict:
    manifest = write_big_manifest(work / "data", lines)
    base = work / "base_gpt.pth"
    make_base_checkpoint(TINY_CONFIG, base)
    first = work / "first"
    run_timed(train_command(manifest, first, 2, "--base-checkpoint", str(base)), {"done": "done: "})
    source = first / "model_step2.pth"
    step = torch.load(source, map_location="cpu", weights_only=True)["progress"]["step"]
    for name, position in positions.items():
        craft_checkpoint(source, work / f"{name}.pth", position)
    runs: dict[str, list[dict]] = {name: [] for name in positions}
    for i in range(repeats):  # alternating, so a shared machine's load falls on both alike
        for name, position in positions.items():
            runs[name].append(time_resume(manifest, work / f"{name}.pth", work / f"out_{name}_{i}", step, position))
    medians = {name: {key: round(statistics.median(r[key] for r in rs), 3) for key in rs[0]}
               for name, rs in runs.items()}
    early, late = positions
    return {
        "method": "fresh `python -m indextts_train --resume CKPT --max-steps step+1` process per run; "
                  "to_first_step_s = process start to the arrival of the first post-resume step's log line; "
                  f"median of {repeats}, positions alternating",
        "manifest_lines": lines,
        "config": "configs/tiny.yaml (effective batch 8 = 4 x 2), num_workers 0, CPU fp32",
        "checkpoint_step": step,
        "positions": positions,
        "early_to_first_step_s": medians[early]["to_first_step_s"],
        "late_to_first_step_s": medians[late]["to_first_step_s"],
        "ratio_late_over_early": round(medians[late]["to_first_step_s"] / medians[early]["to_first_step_s"], 3),
        "medians": medians,
        "runs": runs,
        "load_average_after": [round(x, 2) for x in os.getloadavg()],
        **machine_info(),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lines", type=int, default=200_000)
    parser.add_argument("--early", type=int, default=8, help="samples_in_epoch of the early checkpoint")
    parser.add_argument("--late", type=int, default=190_000, help="samples_in_epoch of the late checkpoint")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    # The epoch holds lines // 8 whole steps of 8 samples; a resume must leave room for one more step.
    if not 0 <= args.early < args.late <= (args.lines // 8 - 1) * 8:
        parser.error("need 0 <= --early < --late <= --lines - 8 (rounded down to whole steps of 8)")
    with tempfile.TemporaryDirectory() as tmp:
        result = measure(Path(tmp), args.lines, {"early": args.early, "late": args.late}, args.repeats)
    write_result(RESULT, result)


if __name__ == "__main__":
    main()
