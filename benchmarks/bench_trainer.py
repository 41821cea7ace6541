"""Trainer overhead: samples/s of `train-gpt` (a real subprocess) vs a bare PyTorch loop, same batches.

Method. Each side runs in its own fresh process and is timed over the same steady-state window,
optimizer steps WARMUP+1..STEPS: from the arrival of the line it prints after step WARMUP to
that of the line after step STEPS (the trainer's own "step N/STEPS" log lines, every
--log-interval steps; the bare loop prints exactly those two lines). That cancels process start,
imports, indexing, model building, the first (slow) steps and the trainer's final save, which
comes after its last log line. What stays in the trainer's window is what it adds per step:
the dataset's id-range check, the metric .item() calls, the row freezer, the scheduler, log
lines, TensorBoard, and (in the saving run only) periodic checkpoints. Besides wall time, the
process's CPU time (/proc/PID/stat) is read at the same two moments: on a machine shared with
other jobs it moves less than wall time, so the CPU-time ratio is reported as a cross-check.
With --rounds N the three runs (trainer, bare, trainer saving) are interleaved N times and
medians reported.

The bare loop: the same config and base gpt.pth, AdamW, the same micro-batch and accumulation,
the same ResumableBatchSampler order (epoch by epoch) through a DataLoader with collate;
compute_losses, backward, clip, step. No validation (no --val-manifest is given to the trainer
either), no checkpoints, no scheduler, no logging. CPU, fp32, data loaded in the main process on
both sides (the trainer's --num-workers 0 means auto; the run stops unless its plan line says 0
workers), torch's default thread count.

    python benchmarks/bench_trainer.py [--steps 120] [--warmup 20] [--samples 400] [--save-interval 50] [--rounds 2]

Writes benchmarks/results/trainer.json and prints it.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch
import yaml
from report import write_result

from indextts_train.checkpoint.base import load_base_checkpoint
from indextts_train.config.settings import load_config
from indextts_train.data.manifest import ManifestDataset, ManifestIndex, collate
from indextts_train.data.sampling import ORDER_RULE, ResumableBatchSampler, SamplerSpec, Source, epoch_order
from indextts_train.demo import make_base_checkpoint
from indextts_train.model.gpt import UnifiedVoiceGPT

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from tests.conftest import write_dataset  # noqa: E402  (the test suite's synthetic paired manifest)

RESULT = ROOT / "benchmarks" / "results" / "trainer.json"
TINY_CONFIG = ROOT / "configs" / "tiny.yaml"
SIZES = {"model_dim": 256, "layers": 4, "heads": 4}  # bigger than tiny so compute dominates a bit
MICRO_BATCH, ACCUMULATION = 4, 2
LOG_INTERVAL = 10
MAX_TEXT, MAX_CODES = 24, 48  # per sample; within tiny's max_text_tokens 40 / max_mel_tokens 60


def write_config(path: Path) -> None:
    """tiny.yaml at SIZES, with the batch layout both loops use."""
    data = yaml.safe_load(TINY_CONFIG.read_text(encoding="utf-8"))
    data["gpt"].update(SIZES)
    data["train"].update(batch_size=MICRO_BATCH, grad_accumulation=ACCUMULATION,
                         effective_batch_size=MICRO_BATCH * ACCUMULATION, num_workers=0,
                         log_interval=LOG_INTERVAL, epochs=1000)
    path.write_text(yaml.safe_dump(data, sort_keys=False), encoding="utf-8")


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of a live process, all threads (Linux /proc; 10 ms ticks)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def run_timed(command: list[str], marks: dict[str, str]) -> tuple[dict[str, tuple[float, float]], list, float]:
    """Run a command; for each mark, (wall, cpu) seconds when the first line starting with it arrived.

    Also returns every output line with its arrival time, and the whole process's wall time.
    """
    arrivals: dict[str, tuple[float, float]] = {}
    stamped: list[tuple[float, str]] = []
    start = time.perf_counter()
    with subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=ROOT,
                          env={**os.environ, "PYTHONUNBUFFERED": "1"}) as proc:
        for line in proc.stdout:
            now = time.perf_counter() - start
            stamped.append((now, line))
            for name, prefix in marks.items():
                if line.startswith(prefix) and name not in arrivals:
                    arrivals[name] = (now, cpu_seconds(proc.pid))
    process_seconds = time.perf_counter() - start
    if proc.returncode != 0 or len(arrivals) != len(marks):
        tail = "".join(line for _, line in stamped[-20:])
        raise RuntimeError(f"{' '.join(command[:4])} exited {proc.returncode}, saw {sorted(arrivals)}:\n{tail}")
    return arrivals, stamped, process_seconds


def save_seconds(stamped: list[tuple[float, str]], steps: int) -> list[float]:
    """Each checkpoint's cost: from the step's log line to the trainer's "saved ..." line after it."""
    costs, step_line_at = [], None
    for at, line in stamped:
        if line.startswith("step ") and f"/{steps} " in line:
            step_line_at = at
        elif line.startswith("saved ") and step_line_at is not None:
            costs.append(round(at - step_line_at, 3))
    return costs


def rates(wall: float, cpu: float, samples: int) -> dict:
    return {"window_seconds": round(wall, 3), "window_cpu_seconds": round(cpu, 2),
            "samples_per_s": round(samples / wall, 2), "samples_per_cpu_s": round(samples / cpu, 2)}


def run_trainer(work: Path, name: str, steps: int, warmup: int, save_interval: int) -> dict:
    """One `python -m indextts_train` run, timed between its step-`warmup` and step-`steps` log lines."""
    command = [sys.executable, "-m", "indextts_train", "--train-manifest", str(work / "data" / "train.jsonl"),
               "--output-dir", str(work / name), "--config", str(work / "config.yaml"),
               "--base-checkpoint", str(work / "base_gpt.pth"), "--max-steps", str(steps),
               "--num-workers", "0", "--save-interval", str(save_interval),
               "--log-interval", str(LOG_INTERVAL)]
    marks = {"training": "training ", "first": f"step {warmup}/{steps} ", "last": f"step {steps}/{steps} "}
    at, stamped, process_seconds = run_timed(command, marks)
    plan = next((line for _, line in stamped if " data worker(s)" in line), "")
    if not plan.rstrip().endswith(", 0 data worker(s)"):
        # --num-workers 0 means "auto" to the trainer; the comparison needs main-process loading on both sides.
        raise RuntimeError(f"the trainer did not load data in the main process: {plan.strip()!r}")
    return {
        "save_interval": save_interval,
        # A save follows its step's log line: the one at `warmup` falls inside the window, the final one after it.
        "checkpoints_in_window": sum(1 for s in range(warmup, steps) if s % save_interval == 0),
        "save_seconds_each": save_seconds(stamped, steps),
        **rates(at["last"][0] - at["first"][0], at["last"][1] - at["first"][1],
                (steps - warmup) * MICRO_BATCH * ACCUMULATION),
        "startup_seconds": round(at["training"][0], 3),
        "process_seconds": round(process_seconds, 3),
    }


def epoch_batches(dataset: ManifestDataset, seed: int, sort_window: int):
    """Micro-batches in the trainer's order: epoch 0, 1, ... each via sampling.epoch_order."""
    spec = SamplerSpec(ORDER_RULE, seed, sort_window, MICRO_BATCH * ACCUMULATION, (Source("train", len(dataset)),))
    epoch = 0
    while True:
        sampler = ResumableBatchSampler(epoch_order(spec, dataset.index.total_lengths, epoch), micro_batch=MICRO_BATCH)
        loader = torch.utils.data.DataLoader(dataset, batch_sampler=sampler, collate_fn=collate, num_workers=0)
        yield from loader  # whole optimizer steps: the epoch order is cut to them
        epoch += 1


def bare_loop(work: Path, steps: int, warmup: int) -> None:
    """The plain loop. Prints one line after step `warmup` and one after step `steps`, nothing else."""
    config = load_config(work / "config.yaml")
    train = config.train
    torch.manual_seed(train.seed)
    trained, _, _ = load_base_checkpoint(work / "base_gpt.pth", config.gpt)
    model = UnifiedVoiceGPT(config.gpt, dropout=train.dropout)
    model.load_state_dict(trained, strict=True)
    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=train.learning_rate, weight_decay=train.weight_decay)
    index = ManifestIndex.build([work / "data" / "train.jsonl"], max_text_tokens=config.gpt.max_text_tokens,
                                max_mel_tokens=config.gpt.max_mel_tokens)
    batches = epoch_batches(ManifestDataset(index, model_dim=config.gpt.model_dim), train.seed, train.sort_window)
    for step in range(1, steps + 1):
        for _ in range(ACCUMULATION):
            out = model.compute_losses(next(batches))
            loss = train.text_loss_weight * out.text_loss + train.mel_loss_weight * out.mel_loss
            (loss / ACCUMULATION).backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), train.grad_clip)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        if step in (warmup, steps):
            print(f"bare step {step}", flush=True)


def run_bare(work: Path, steps: int, warmup: int) -> dict:
    """bare_loop in its own process, timed exactly as the trainer is."""
    command = [sys.executable, __file__, "--bare-worker", str(work), "--steps", str(steps), "--warmup", str(warmup)]
    at, _, process_seconds = run_timed(command, {"first": f"bare step {warmup}\n", "last": f"bare step {steps}\n"})
    return {**rates(at["last"][0] - at["first"][0], at["last"][1] - at["first"][1],
                    (steps - warmup) * MICRO_BATCH * ACCUMULATION),
            "process_seconds": round(process_seconds, 3)}


def median_rate(runs: list[dict], key: str) -> float:
    return round(statistics.median(run[key] for run in runs), 2)


def measure(work: Path, steps: int, warmup: int, samples: int, save_interval: int, rounds: int) -> dict:
    write_config(work / "config.yaml")
    write_dataset(work / "data", samples, seed=1, dim=SIZES["model_dim"], max_text=MAX_TEXT, max_codes=MAX_CODES)
    make_base_checkpoint(work / "config.yaml", work / "base_gpt.pth")
    load_before = os.getloadavg()
    trainer, bare, saving = [], [], []
    # Interleaved rounds, so the load of a shared machine falls on all three alike.
    for r in range(rounds):
        trainer.append(run_trainer(work, f"run{r}_no_save", steps, warmup, save_interval=100 * steps))
        bare.append(run_bare(work, steps, warmup))
        saving.append(run_trainer(work, f"run{r}_saving", steps, warmup, save_interval=save_interval))
    load_after = os.getloadavg()
    params = sum(p.numel() for p in UnifiedVoiceGPT(load_config(work / "config.yaml").gpt).parameters())
    summary = {name: {"samples_per_s": median_rate(runs, "samples_per_s"),
                      "samples_per_cpu_s": median_rate(runs, "samples_per_cpu_s")}
               for name, runs in (("bare", bare), ("trainer", trainer), ("trainer_saving", saving))}

    def ratio(name: str, key: str) -> float:
        return round(summary["bare"][key] / summary[name][key], 3)

    return {
        "method": f"steady-state window, steps {warmup + 1}..{steps}, each side in its own process: timed by "
                  f"the arrival of the line after step {warmup} and after step {steps} (wall) and the process's "
                  f"CPU time at those moments (cpu); median over {rounds} interleaved round(s)",
        "config": {**SIZES, "trained_parameters": params, "micro_batch": MICRO_BATCH,
                   "grad_accumulation": ACCUMULATION, "samples": samples, "max_text": MAX_TEXT,
                   "max_codes": MAX_CODES, "num_workers": 0, "precision": "fp32", "device": "cpu",
                   "log_interval": LOG_INTERVAL, "save_interval_saving_run": save_interval},
        "steps": steps,
        "window_steps": steps - warmup,
        "rounds": rounds,
        "bare_samples_per_s": summary["bare"]["samples_per_s"],
        "trainer_samples_per_s": summary["trainer"]["samples_per_s"],
        "ratio_bare_over_trainer": ratio("trainer", "samples_per_s"),
        "trainer_saving_samples_per_s": summary["trainer_saving"]["samples_per_s"],
        "ratio_bare_over_trainer_saving": ratio("trainer_saving", "samples_per_s"),
        "cpu_time_ratio_bare_over_trainer": ratio("trainer", "samples_per_cpu_s"),
        "cpu_time_ratio_bare_over_trainer_saving": ratio("trainer_saving", "samples_per_cpu_s"),
        "runs": {"bare": bare, "trainer": trainer, "trainer_saving": saving},
        "load_average_before": [round(x, 2) for x in load_before],
        "load_average_after": [round(x, 2) for x in load_after],
        "torch_threads": torch.get_num_threads(),
        **machine_info(),
    }


def machine_info() -> dict:
    """What a result needs to be compared only with results from the same machine."""
    return {"cpu_count": os.cpu_count(), "torch": torch.__version__, "python": platform.python_version(),
            "machine": f"{platform.machine()} {platform.system()}", "date": time.strftime("%Y-%m-%d %H:%M:%S")}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=120, help="optimizer steps per run")
    parser.add_argument("--warmup", type=int, default=20, help="steps before the timed window (a log step)")
    parser.add_argument("--samples", type=int, default=400, help="synthetic training samples")
    parser.add_argument("--save-interval", type=int, default=50, help="checkpoint interval of the saving trainer run")
    parser.add_argument("--rounds", type=int, default=2, help="interleaved rounds of the three runs; medians reported")
    parser.add_argument("--bare-worker", type=Path, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.bare_worker is not None:
        bare_loop(args.bare_worker, args.steps, args.warmup)
        return
    if any(n % LOG_INTERVAL for n in (args.warmup, args.steps, args.save_interval)) or not 0 < args.warmup < args.steps:
        # Timing marks and save costs are read off log lines, which come every LOG_INTERVAL steps.
        parser.error(f"--warmup, --steps and --save-interval must be multiples of {LOG_INTERVAL}, "
                     "with 0 < warmup < steps")
    with tempfile.TemporaryDirectory() as tmp:
        result = measure(Path(tmp), args.steps, args.warmup, args.samples, args.save_interval, args.rounds)
    write_result(RESULT, result)


if __name__ == "__main__":
    main()
