"""Resuming: which checkpoint, and how its saved state meets the settings of this run.

The loop in train.py stays about training; everything here decides what a checkpoint brings back
(optimizer moments by parameter name, the LR and decay a user changed, a grown vocabulary, an
OOM-reduced micro-batch, each rank's RNG) and says so.
"""

from __future__ import annotations

import dataclasses
import random
from pathlib import Path

import numpy as np
import torch

from indextts_train import checkpoint as ckpt_io
from indextts_train.distributed import DistInfo
from indextts_train.errors import UserError
from indextts_train.hardware import HardwarePlan
from indextts_train.logging import RunLogger
from indextts_train.vocab import VocabPlan, remap_optimizer_rows

TEXT_PARAMS = ("text_embedding.weight", "text_head.weight", "text_head.bias")


def report_changed_hparams(saved: dict, current: dict, log: RunLogger) -> None:
    """Say what differs from the checkpoint's run; warn where it changes the optimisation."""
    changed = {k: (saved.get(k), v) for k, v in current.items() if saved.get(k) != v}
    if not changed:
        return
    log.info("settings changed since the checkpoint:")
    for key, (old, new) in changed.items():
        log.info(f"  {key}: {old} -> {new}")
    if "effective_batch" in changed:
        log.warn("the effective batch changed: steps now consume a different number of samples; "
                 "training continues from the same sample")
    elif {"micro_batch", "grad_accumulation", "world_size"} & changed.keys():
        log.info("  same effective batch: training continues from the same sample")
    if "learning_rate" in changed:
        log.warn("the learning rate changed: the schedule continues with the new peak value")
    if "seed" in changed:
        log.warn("the seed changed: the data order keeps the checkpoint's seed so no sample is skipped "
                 "or repeated; dropout continues from the saved RNG")


def select_checkpoint(output_dir: Path, resume: str | None, log: RunLogger) -> tuple[dict | None, Path | None]:
    """Resolve --resume (None, "auto" or a path) into a loaded checkpoint, or None to start fresh."""
    if resume is None:
        existing = ckpt_io.list_checkpoints(output_dir) if output_dir.is_dir() else []
        if existing:
            raise UserError(f"{output_dir} already holds checkpoints ({existing[-1].name}); pass --resume auto "
                            "to continue that run, or choose another --output-dir")
        return None, None
    if resume == "auto":
        path, skipped = ckpt_io.find_resume_checkpoint(output_dir) if output_dir.is_dir() else (None, [])
        for bad, reason in skipped:
            log.warn(f"skipping {bad}: {reason} (left on disk)")
        if path is None:
            log.info(f"--resume auto: no complete checkpoint in {output_dir}; starting fresh")
            return None, None
    else:
        path = Path(resume)
        if not path.is_file():
            raise UserError(f"--resume {path}: no such checkpoint file; use --resume auto to pick the newest one")
        verdict = ckpt_io.verify_checkpoint(path)
        if verdict.status != "COMPLETE":
            hint = "; `indextts-train repair` can convert it" if verdict.status == "PARTIAL" else ""
            raise UserError(f"--resume {path}: {verdict.status}: {'; '.join(verdict.reasons)}{hint}")
    log.info(f"resuming from {path}")
    return ckpt_io.load_checkpoint(path, crc_checked=True), path  # verified just above


def remap_optimizer_state(state: dict, names: list[str], old_tokens: int, new_tokens: int) -> dict:
    """Optimizer state after vocab growth: resized tensors get remapped rows, the rest unchanged."""
    old, new = VocabPlan(old_tokens, old_tokens), VocabPlan(old_tokens, new_tokens)
    for position, name in enumerate(names):
        if name in TEXT_PARAMS and position in state["state"]:
            state["state"][position] = remap_optimizer_rows(state["state"][position], old, new)
    return state


def optimizer_state_for(ckpt: dict, names: list[str], optimizer: torch.optim.AdamW, path: Path) -> dict | None:
    """The saved optimizer state in this optimizer's parameter order (None: none is usable).

    Our own checkpoints match name for name. A repaired community checkpoint holds one group over
    every parameter in weight order, so its moments are moved to our groups by parameter name.
    """
    saved_names = ckpt["optimizer_param_names"]
    if names == saved_names:
        return ckpt["optimizer"]
    if not ckpt.get("repaired"):
        raise UserError(f"{path}: its optimizer was built for other parameters; resume with the config it was "
                        "trained with, or start a new --output-dir with it as --base-checkpoint")
    if ckpt["optimizer"] is None:
        return None
    position = {name: i for i, name in enumerate(saved_names)}
    saved_state = ckpt["optimizer"]["state"]
    state = optimizer.state_dict()
    state["state"] = {j: saved_state[position[name]] for j, name in enumerate(names)
                      if position.get(name) in saved_state}
    return state


def apply_changed_optimizer_settings(optimizer: torch.optim.AdamW, scheduler, saved: dict, train,
                                     total_steps: int) -> None:
    """Loading optimizer/scheduler state brings back the old LR and weight decay; new flags win.

    Untouched when nothing changed, so an ordinary resume stays bit-exact.
    """
    if saved.get("learning_rate") != train.learning_rate or saved.get("total_steps") != total_steps:
        scheduler.base_lrs = [train.learning_rate for _ in optimizer.param_groups]
        factor = scheduler.lr_lambdas[0](scheduler.last_epoch)  # the schedule of this run, at the saved step
        for group in optimizer.param_groups:
            group["lr"] = train.learning_rate * factor
    if saved.get("weight_decay") != train.weight_decay:
        optimizer.param_groups[0]["weight_decay"] = train.weight_decay


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


def restore_scaler(scaler: torch.amp.GradScaler, saved: dict | None, log: RunLogger) -> None:
    if scaler.is_enabled() and saved:
        scaler.load_state_dict(saved)
    elif scaler.is_enabled():
        log.warn("the checkpoint has no fp16 gradient-scaler state (it was trained without fp16); "
                 "starting a fresh scaler")
    elif saved:
        log.info("the checkpoint's fp16 gradient-scaler state is not needed in this precision; dropped")


def vocab_change_block(old_tokens: int, new_tokens: int, reset: bool, names: list[str]) -> str:
    lines = [f"vocabulary changed: {old_tokens} -> {new_tokens} text tokens "
             f"(text rows {old_tokens + 1} -> {new_tokens + 1})",
             f"  rows 0..{old_tokens - 1} kept; extra row moved {old_tokens} -> {new_tokens}; "
             f"{new_tokens - old_tokens} new rows initialised"]
    if reset:
        lines.append("  --on-vocab-change reset: optimizer, scheduler and scaler reset together; "
                     "step 0, warmup again, data from the start")
    else:
        lines.append(f"  optimizer state kept for {len(names) - len(TEXT_PARAMS)} tensors and remapped for "
                     f"{', '.join(TEXT_PARAMS)} (old rows keep their moments, new rows start at zero); "
                     "scheduler and scaler kept: training continues on its schedule")
    return "\n".join(lines)


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
        ckpt_io.restore_rng(states[dist_info.rank])
    else:
        seed_everything(seed + dist_info.rank + 7919 * ckpt["progress"]["step"])
    if len(states) != dist_info.world_size:
        log.warn(f"the checkpoint was written by {len(states)} process(es), this run has {dist_info.world_size}: "
                 "training continues from the same global sample with the same effective batch; "
                 "dropout streams of new ranks are freshly seeded")
