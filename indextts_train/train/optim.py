"""The optimizer set: AdamW, its LR schedule and the fp16 gradient scaler, restored or reset together.

Invariant 2 of the design: the three are one matched set. This module builds them, gives their
checkpoint part (`state_dict`), and loads it back through every case a resume meets: the same run,
a grown vocabulary (moments remapped by row), a repaired community checkpoint (moments matched by
parameter name, or none at all), and flags that changed the learning rate or weight decay.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from indextts_train.config.constants import TEXT_ROW_KEYS
from indextts_train.config.settings import TrainConfig
from indextts_train.errors import UserError
from indextts_train.text.vocab import VocabPlan, remap_optimizer_rows
from indextts_train.train.accel import adamw_options
from indextts_train.train.hardware import HardwarePlan
from indextts_train.ui.console import RunLogger


def schedule_factor(done: int, batch: int, warmup: int, total: int, min_ratio: float) -> float:
    """Linear warmup to 1, then cosine to min_ratio at `total`; every argument counted in samples.

    `done` samples were seen before the step, which takes `batch`. With a constant batch these are
    the step counts times the batch, and each quotient is the same rational number as in steps, so
    the factor is the same float: a run that never changes its batch keeps its schedule bit for bit.
    """
    if done < warmup:
        return (done + batch) / warmup
    progress = min(1.0, (done - warmup) / max(batch, total - warmup))
    return min_ratio + (1.0 - min_ratio) * 0.5 * (1.0 + math.cos(math.pi * progress))


def lr_factor(step: int, warmup_steps: int, total_steps: int, min_ratio: float) -> float:
    """The schedule in steps (a batch of 1 sample): the LambdaLR multiplier of a run at one batch size."""
    return schedule_factor(step, 1, warmup_steps, total_steps, min_ratio)


@dataclass
class LrClock:
    """Where the LR schedule is, in samples seen: the samples at `anchor_step` (the step a run started or
    resumed at), then `effective_batch` a step. A resume at another effective batch moves the anchor
    (train/restore.py), so the schedule follows the samples, not the step count."""

    effective_batch: int
    warmup_steps: int  # the flag; in samples at the current effective batch
    min_ratio: float
    total_samples: int  # where the cosine ends
    anchor_step: int = 0
    anchor_samples: int = 0

    def factor(self, step: int) -> float:
        batch = self.effective_batch
        done = self.anchor_samples + (step - self.anchor_step) * batch
        return schedule_factor(done, batch, self.warmup_steps * batch, self.total_samples, self.min_ratio)


def build_adamw(named: list[tuple[str, nn.Parameter]], train: TrainConfig) -> tuple[torch.optim.AdamW, list[str]]:
    """AdamW over `named` (the trainable tensors of the scope: frozen ones get no state); no weight
    decay on biases, norms and the speed embedding (1-D or tiny tensors).

    Returns the optimizer and the parameter names in optimizer order, which the checkpoint stores
    so optimizer state can be remapped by name when the vocabulary grows. Fused on CUDA (accel.py):
    the same state_dict format, so a checkpoint resumes across implementations.
    """
    decay, no_decay = [], []
    for name, param in named:
        (decay if param.dim() >= 2 and not name.startswith("speed_emb") else no_decay).append((name, param))
    groups = [
        {"params": [p for _, p in decay], "weight_decay": train.weight_decay},
        {"params": [p for _, p in no_decay], "weight_decay": 0.0},
    ]
    device = named[0][1].device
    optimizer = torch.optim.AdamW(groups, lr=train.learning_rate, betas=train.adam_betas, eps=train.adam_eps,
                                  **adamw_options(device))
    return optimizer, [n for n, _ in decay] + [n for n, _ in no_decay]


def remap_optimizer_state(state: dict, names: list[str], growth: VocabPlan) -> dict:
    """Optimizer state after vocab growth: resized tensors get remapped rows, the rest unchanged."""
    for position, name in enumerate(names):
        if name in TEXT_ROW_KEYS and position in state["state"]:
            state["state"][position] = remap_optimizer_rows(state["state"][position], growth)
    return state


@dataclass
class OptimizerSet:
    """AdamW + LambdaLR + GradScaler; in a checkpoint: optimizer, optimizer_param_names, scheduler, scaler."""

    optimizer: torch.optim.AdamW
    param_names: list[str]
    scheduler: torch.optim.lr_scheduler.LambdaLR
    scaler: torch.amp.GradScaler
    clock: LrClock  # the scheduler's multiplier reads it: setup re-anchors it on a resume

    @classmethod
    def build(cls, named: list[tuple[str, nn.Parameter]], train: TrainConfig, plan: HardwarePlan,
              total_steps: int) -> OptimizerSet:
        optimizer, names = build_adamw(named, train)
        batch = plan.effective_batch
        clock = LrClock(batch, train.warmup_steps, train.min_lr_ratio, total_steps * batch)
        scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, clock.factor)
        return cls(optimizer, names, scheduler, torch.amp.GradScaler("cuda", enabled=plan.use_grad_scaler),
                   clock)

    def state_dict(self) -> dict:
        return {"optimizer": self.optimizer.state_dict(), "optimizer_param_names": list(self.param_names),
                "scheduler": self.scheduler.state_dict(),
                "scaler": self.scaler.state_dict() if self.scaler.is_enabled() else None}

    def load_state_dict(self, state: dict, *, growth: VocabPlan | None = None, repaired: bool = False,
                        source: Path | str = "the checkpoint") -> None:
        """Load a saved set (this set's `state_dict`) into this one; `growth` (saved -> current text tokens)
        says how to remap grown rows. A `repaired` file's optimizer is matched by parameter name, and
        may hold none at all (`has_optimizer`): the optimizer and scheduler are then left as built."""
        opt_state = self._saved_state(state, source, repaired)
        if opt_state is not None:
            if growth is not None and growth.new_ids:
                opt_state = remap_optimizer_state(opt_state, self.param_names, growth)
            self.optimizer.load_state_dict(opt_state)
            self.scheduler.load_state_dict(state["scheduler"])
        if self.scaler.is_enabled() and state["scaler"]:
            self.scaler.load_state_dict(state["scaler"])

    def last_step_lr(self) -> float:
        """The LR the last step took (its param groups' `lr` then): the scheduler already holds the next
        step's, which a line or a TensorBoard point of that step would otherwise show (`step 4/4 ... lr`
        a value no step of a 4-step run used)."""
        scheduler = self.scheduler
        return scheduler.base_lrs[0] * scheduler.lr_lambdas[0](scheduler.last_epoch - 1)

    @staticmethod
    def has_optimizer(state: dict) -> bool:
        """Whether a saved set holds optimizer moments (a repair that could not match them stores None)."""
        return state["optimizer"] is not None

    def resume(self, state: dict, *, step: int, hparams: dict, repaired: bool, growth: VocabPlan,
               source: Path, train: TrainConfig, total_steps: int, log: RunLogger) -> None:
        """Load the checkpoint's set, saying what a resume at `step` with today's flags changes about it."""
        self.load_state_dict(state, growth=growth, repaired=repaired, source=source)
        if not self.has_optimizer(state):  # a repaired checkpoint whose optimizer could not be recovered
            log.warn(f"{source} has no usable optimizer state (repaired): optimizer, scheduler and scaler "
                     f"start fresh together at step {step}")
            self.scheduler.last_epoch = step
            self.apply_changed_settings({}, train, total_steps)
        else:
            self.apply_changed_settings(hparams, train, total_steps)
        self._say_scaler(state["scaler"], log)

    def _saved_state(self, saved: dict, source: Path | str, repaired: bool) -> dict | None:
        """The saved optimizer state in this optimizer's parameter order (None: none is usable).

        Our own checkpoints match name for name. A repaired community checkpoint holds one group over
        every parameter in weight order, so its moments are moved to our groups by parameter name.
        """
        saved_names, names = saved["optimizer_param_names"], self.param_names
        if names == saved_names:
            return saved["optimizer"]
        if not repaired:
            raise UserError(f"{source}: its optimizer was built for other parameters; resume with the config it "
                            "was trained with, or start a new --output-dir with it as --base-checkpoint")
        if saved["optimizer"] is None:
            return None
        position = {name: i for i, name in enumerate(saved_names)}
        saved_state = saved["optimizer"]["state"]
        state = self.optimizer.state_dict()
        state["state"] = {j: saved_state[position[name]] for j, name in enumerate(names)
                          if position.get(name) in saved_state}
        return state

    def apply_changed_settings(self, saved: dict, train: TrainConfig, total_steps: int) -> None:
        """Loading optimizer/scheduler state brings back the old LR and weight decay; new flags win.

        Untouched when nothing changed, so an ordinary resume stays bit-exact.
        """
        optimizer, scheduler = self.optimizer, self.scheduler
        # Any setting of the schedule: the saved groups hold the old schedule's LR for the next step.
        if (saved.get("learning_rate") != train.learning_rate or saved.get("total_steps") != total_steps
                or saved.get("effective_batch") != self.clock.effective_batch
                or saved.get("warmup_steps") != train.warmup_steps or saved.get("min_lr_ratio") != train.min_lr_ratio):
            scheduler.base_lrs = [train.learning_rate for _ in optimizer.param_groups]
            factor = scheduler.lr_lambdas[0](scheduler.last_epoch)  # the schedule of this run, at the saved step
            for group in optimizer.param_groups:
                group["lr"] = train.learning_rate * factor
        if saved.get("weight_decay") != train.weight_decay:
            optimizer.param_groups[0]["weight_decay"] = train.weight_decay
        # The loaded groups hold the old run's epsilon and betas too: the settings said changed take effect.
        if saved.get("adam_eps") != train.adam_eps or list(saved.get("adam_betas") or []) != list(train.adam_betas):
            for group in optimizer.param_groups:
                group["eps"], group["betas"] = train.adam_eps, tuple(train.adam_betas)

    def _say_scaler(self, saved: dict | None, log: RunLogger) -> None:
        if self.scaler.is_enabled() and not saved:
            log.warn("the checkpoint has no fp16 gradient-scaler state (it was trained without fp16); "
                     "starting a fresh scaler")
        elif not self.scaler.is_enabled() and saved:
            log.info("the checkpoint's fp16 gradient-scaler state is not needed in this precision; dropped")

    def vocab_change_block(self, growth: VocabPlan, *, reset: bool) -> str:
        old_tokens, new_tokens, at, added = growth.base_tokens, growth.tokens, growth.growth_at, len(growth.new_ids)
        moved = (f"rows {at}..{old_tokens} (special tokens and the extra row) moved up by {added}"
                 if at < old_tokens else f"extra row moved {old_tokens} -> {new_tokens}")
        lines = [f"vocabulary changed: {old_tokens} -> {new_tokens} text tokens "
                 f"(text rows {old_tokens + 1} -> {new_tokens + 1})",
                 f"  rows 0..{at - 1} kept; {moved}; {added} new rows initialised at {at}..{at + added - 1}"]
        if reset:
            lines.append("  --on-vocab-change reset: optimizer, scheduler and scaler reset together; "
                         "step 0, warmup again, data from the start")
        else:
            lines.append(f"  optimizer state kept for {len(self.param_names) - len(TEXT_ROW_KEYS)} tensors and "
                         f"remapped for {', '.join(TEXT_ROW_KEYS)} (old rows keep their moments, new rows start "
                         "at zero); scheduler and scaler kept: training continues on its schedule")
        return "\n".join(lines)
