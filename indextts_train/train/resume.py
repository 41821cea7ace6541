"""Resuming: which checkpoint, and how its saved state meets the settings of this run.

Which checkpoint `--resume` means, what changed since it was written (settings, an OOM-reduced
micro-batch, the number of ranks) and each rank's RNG stream; the optimizer set restores itself
(optim.py).
"""

from __future__ import annotations

import dataclasses
import random
from pathlib import Path

import numpy as np
import torch

from indextts_train.checkpoint import files as ckpt_io
from indextts_train.checkpoint.lineage import resume_order
from indextts_train.checkpoint.rng import restore_rng
from indextts_train.distributed import DistInfo
from indextts_train.errors import UserError
from indextts_train.train.hardware import HardwarePlan
from indextts_train.ui.console import RunLogger


def report_changed_hparams(saved: dict, current: dict, log: RunLogger) -> None:
    """Say what differs from the checkpoint's run; warn where it changes the optimisation."""
    # Only keys the checkpoint recorded: an older file knows fewer settings, which is not a change.
    changed = {k: (saved[k], v) for k, v in current.items() if k in saved and saved[k] != v}
    if not changed:
        return
    log.notice("settings changed since the checkpoint:")
    for key, (old, new) in changed.items():
        log.notice(f"  {key}: {old} -> {new}")
    if "effective_batch" in changed:
        log.warn("the effective batch changed: steps now consume a different number of samples; training "
                 "continues from the same sample, and the epochs and the learning-rate schedule follow the "
                 "samples seen (--max-steps still counts steps)")
    elif {"micro_batch", "grad_accumulation", "world_size"} & changed.keys():
        log.notice("  same effective batch: training continues from the same sample")
    if "learning_rate" in changed:
        log.warn("the learning rate changed: the schedule continues with the new peak value")
    if "seed" in changed:
        log.warn("the seed changed: the data order keeps the checkpoint's seed so no sample is skipped "
                 "or repeated; dropout continues from the saved RNG")


def _what_to_do(path: Path, reason: str) -> str:
    if "format_version" in reason and "newer" in reason:
        return "written by a newer indextts-train: resume it with that version"
    if "PARTIAL:" in reason:
        return f"convert it with `indextts-train repair {path}` (a .bak backup is kept), then rerun"
    return "it cannot be used; keep it, or remove it yourself if you do not need it"


def refuse_fresh_start(output_dir: Path, skipped: list[tuple[Path, str]]) -> UserError:
    """--resume auto found checkpoints but none resumes: starting fresh would rotate them away."""
    lines = [f"--resume auto: {output_dir} holds checkpoints but none of them can resume this run, so nothing "
             "was started and no file was changed:"]
    for path, reason in skipped:
        short = reason if len(reason) <= 200 else reason[:200] + "..."
        lines.append(f"  {path}: {short}; {_what_to_do(path, reason)}")
    lines.append("  or start a new run with another --output-dir")
    return UserError("\n".join(lines))


def check_no_earlier_run(output_dir: Path, resume: str | None) -> None:
    """A new run (no --resume) never starts over the checkpoints of another one in the same folder."""
    existing = ckpt_io.list_checkpoints(output_dir) if resume is None else []
    if existing:
        raise UserError(f"{output_dir} already holds checkpoints ({existing[-1].name}); pass --resume auto "
                        "to continue that run, or choose another --output-dir")


def select_checkpoint(output_dir: Path, resume: str | None,
                      log: RunLogger) -> tuple[dict | None, Path | None, frozenset[str]]:
    """Resolve --resume (None, "auto" or a path) into a loaded checkpoint, or None to start fresh.

    Also returns the file names in `output_dir` that this run must never replace or delete.
    """
    if resume is None:
        check_no_earlier_run(output_dir, resume)
        return None, None, frozenset()
    skipped: list[tuple[Path, str]] = []
    if resume == "auto":
        # Newest branch first (lineage.py): a rollback's branch wins over the higher steps it abandoned.
        path, skipped = ckpt_io.find_resume_checkpoint(resume_order(output_dir))
        if path is None and skipped:
            raise refuse_fresh_start(output_dir, skipped)
        for bad, reason in skipped:
            log.warn(f"skipping {bad}: {reason} (left on disk, never overwritten or deleted by this run)")
        if path is None:
            log.notice(f"--resume auto: no checkpoint in {output_dir}; starting fresh")
            return None, None, frozenset()
    else:
        path = Path(resume)
        if not path.is_file():
            raise UserError(f"--resume {path}: no such checkpoint file; use --resume auto to pick the newest one")
        verdict = ckpt_io.verify_checkpoint(path)
        if verdict.status != "COMPLETE":
            # A community file's reasons already say to repair it, and repair cannot turn bare weights
            # into a run: only our own partial files get the hint here.
            ours = verdict.status == "PARTIAL" and verdict.kind == "indextts-train"
            hint = "; `indextts-train repair` can convert it" if ours else ""
            raise UserError(f"--resume {path}: {verdict.status}: {'; '.join(verdict.reasons)}{hint}")
    protected = untouchable_names(output_dir, [bad for bad, _ in skipped], path)
    log.notice(f"resuming from {path}")
    return ckpt_io.load_checkpoint(path, crc_checked=True), path, protected  # verified just above


def remembered_oom_plan(plan: HardwarePlan, saved: dict, log: RunLogger) -> HardwarePlan:
    """Start at the micro-batch an earlier run on this GPU fell back to after an OOM, not above it."""
    same_setup = (saved.get("device_name") == plan.device_name and saved.get("world_size") == plan.world_size
                  and saved.get("effective_batch") == plan.effective_batch)
    hit_oom = any(reason.startswith("Out of memory") for reason in saved.get("reasons", []))
    if not (same_setup and hit_oom and saved["micro_batch"] < plan.micro_batch):
        return plan
    log.info(f"an earlier run on this {plan.device_name} ran out of memory above micro-batch "
             f"{saved['micro_batch']}: starting at micro-batch {saved['micro_batch']} x accumulation "
             f"{saved['grad_accumulation']}")
    return dataclasses.replace(plan, micro_batch=saved["micro_batch"], grad_accumulation=saved["grad_accumulation"],
                               reasons=[*plan.reasons, *(r for r in saved["reasons"] if r.startswith("Out of memory"))])


# What decides the floating-point rounding of a step besides the data and the weights.
ARITHMETIC = (("device_name", "device"), ("precision", "precision"), ("tf32", "TF32"), ("world_size", "processes"),
              ("micro_batch", "micro-batch"), ("grad_accumulation", "accumulation"))


def note_changed_arithmetic(plan: HardwarePlan, saved: dict, log: RunLogger) -> None:
    """Say so when the run resumes on a setup that rounds differently from the one that saved it.

    The run goes on from the same sample with the same effective batch, but "exactly as if it had
    never stopped" is bit for bit only on the same device, precision, batch split and, on the CPU,
    the same thread count (another count sums in another order).
    """
    changes = [f"{label} {saved[key]} -> {getattr(plan, key)}" for key, label in ARITHMETIC
               if key in saved and saved[key] != getattr(plan, key)]
    if plan.device == "cpu" and saved.get("device") == "cpu" and saved.get("cpu_threads") \
            and saved["cpu_threads"] != plan.cpu_threads:
        changes.append(f"torch threads {saved['cpu_threads']} -> {plan.cpu_threads}")
    if changes:
        log.warn(f"resuming on another setup ({', '.join(changes)}): training continues from the same sample "
                 "with the same effective batch, but rounds differently, so the weights will not match bit for "
                 "bit a run that never stopped (they follow the same course)")


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def restore_rng_for_rank(ckpt: dict | None, dist_info: DistInfo, seed: int, log: RunLogger) -> None:
    """Each rank continues its own saved RNG stream; a rank the checkpoint did not have starts a new one."""
    if ckpt is None:
        seed_everything(seed + dist_info.rank)
        return
    states = ckpt["rng"]
    if dist_info.rank < len(states):
        restore_rng(states[dist_info.rank])
    else:
        seed_everything(seed + dist_info.rank + 7919 * ckpt["progress"]["step"])
    if len(states) != dist_info.world_size:
        log.warn(f"the checkpoint was written by {len(states)} process(es), this run has {dist_info.world_size}: "
                 "training continues from the same global sample with the same effective batch; "
                 "dropout streams of new ranks are freshly seeded")


def _written_by_us(path: Path) -> bool:
    """Cheap: the file loads (tensor data left on disk, no CRC pass) and says it is our format."""
    try:
        obj = ckpt_io.read_unchecked(path)
    except ckpt_io.CheckpointError:
        return False
    return isinstance(obj, dict) and obj.get("format") == ckpt_io.FORMAT


def untouchable_names(output_dir: Path, skipped: list[Path], verified: Path | None) -> frozenset[str]:
    """Names in `output_dir` that no save or rotation of this run may replace or delete.

    Those `--resume` skipped (they failed to load or verify) and every other checkpoint-named file that
    is not ours (a community or foreign file placed there, best.pth included). `verified` is the one
    being resumed.
    """
    names = {path.name for path in skipped}
    best = output_dir / ckpt_io.BEST
    for path in [*ckpt_io.list_checkpoints(output_dir), *([best] if best.is_file() else [])]:
        if path.name not in names and not ckpt_io.same_file(path, verified) and not _written_by_us(path):
            names.add(path.name)
    return frozenset(names)
