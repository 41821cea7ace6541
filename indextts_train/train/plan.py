"""The plan of a run from its settings: the one planner call that the run (setup), the `hardware`
command and the web page all make, so that what they show is what the run picks.

Every input of the plan is a `train:` setting (batch sizes, workers, mixed precision, activation
checkpointing, train scope) or a `gpt:` size, the text rows as the run's tokenizer sets them
(text/vocab.Tokenizer.size_model); only the device and the number of processes come from where it runs.
"""

from __future__ import annotations

import os
from pathlib import Path

import torch

from indextts_train.config.scope_settings import scope_settings
from indextts_train.config.settings import Config, load_config
from indextts_train.distributed import DistInfo
from indextts_train.text.vocab import read_tokenizer
from indextts_train.train.device import DeviceInfo, detect_device
from indextts_train.train.hardware import HardwarePlan, apply_determinism, choose_plan, plan_device


def plan_for(config: Config, device: DeviceInfo, world_size: int = 1) -> HardwarePlan:
    """What a run of `config` (its gpt: sizes and train: settings in effect) picks on `device`."""
    train = config.train
    return choose_plan(device, config.gpt, effective_batch=train.effective_batch_size, batch_size=train.batch_size,
                       grad_accumulation=train.grad_accumulation, num_workers=train.num_workers, amp=train.amp,
                       activation_checkpointing=train.activation_checkpointing, world_size=world_size,
                       scope=scope_settings(train))


def command_plan(config: Path, assume: str | None, flags: dict, tokenizer: Path | None) -> HardwarePlan:
    """The `hardware` command's plan: `config` under train's flags (`flags`, None: not given), its text rows
    the tokenizer's, on this machine or the GPU `assume` names."""
    cfg = load_config(config)
    cfg.override({name: value for name, value in flags.items() if value is not None})  # as train's flags
    # The model planned is the config's family (IndexTTS2 when it states none): a tokenizer of the other is refused.
    cfg.gpt.stated_family = cfg.gpt.family
    read_tokenizer(tokenizer, cfg.gpt, f"--config {config}").size_model(cfg.gpt)
    return plan_for(cfg, plan_device(assume))


def run_plan(config: Config, dist: DistInfo) -> tuple[HardwarePlan, torch.device]:
    """The plan of this process's run on the device it finds, put in effect (TF32, deterministic
    algorithms), and the torch device it runs on."""
    device_info = detect_device(dist.local_rank)
    plan = plan_for(config, device_info, dist.world_size)
    if plan.tf32:
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
    if apply_determinism(plan):
        plan.reasons.append("Deterministic CUDA algorithms (CUBLAS_WORKSPACE_CONFIG="
                            f"{os.environ['CUBLAS_WORKSPACE_CONFIG']}): a resumed run stays bit-identical.")
    return plan, torch.device(f"cuda:{dist.local_rank}" if device_info.kind == "cuda" else "cpu")
