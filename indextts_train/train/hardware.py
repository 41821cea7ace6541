"""Precision, micro-batch, gradient accumulation and data workers, chosen from the device itself.

Users rent whatever GPU is free. Nothing here keys on marketing sizes ("80 GB"): an A100 80GB reports
79.15 GiB, so a `>= 80 GiB` branch never fires. Instead the micro-batch comes from an estimate of
this config's memory at its longest sequence, compared with a stated share of the memory the device
reports, and gradient accumulation makes up the rest so that the effective batch (samples per
optimizer step) is the one asked for on every GPU.

The device it plans for is device.py's (found, or assumed by name); the memory estimate it compares
with the device is memory.py's.
"""

from __future__ import annotations

import dataclasses
import math
import os
import re
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from indextts_train.config.scope_settings import ScopeSettings
from indextts_train.config.settings import GPTConfig, setting_range
from indextts_train.errors import UserError
from indextts_train.train.device import KNOWN_GPUS, DeviceInfo, assume_device, detect_device, system_memory
from indextts_train.train.memory import (
    CUDA_RESERVE_BYTES,
    FULL_SCOPE,
    GIB,
    WEIGHT_BYTES_PER_PARAM,
    ParamCounts,
    activation_bytes_per_sample,
    max_sequence_positions,
    memory_estimator,
    param_counts,
    state_bytes_per_trainable,
)

CPU_MICRO_BATCH_CAP = 8  # RAM is rarely the limit on CPU; small batches keep a step short
MAX_AUTO_WORKERS = 8  # more loader processes than this only add RAM; the loader is light
DEFAULT_MEMORY_SHARE = 0.85
AMP_DTYPES = {"bf16": "bfloat16", "fp16": "float16", "fp32": None}


# ---------------------------------------------------------------------------------------------
# The plan


@dataclass
class HardwarePlan:
    """What the trainer runs with, and one sentence per choice saying why."""

    device: str  # "cuda" | "cpu"
    device_name: str
    precision: str  # "bf16" | "fp16" | "fp32"
    amp_dtype: str | None  # "bfloat16" | "float16" | None
    use_grad_scaler: bool
    tf32: bool
    micro_batch: int
    grad_accumulation: int
    effective_batch: int  # micro_batch * grad_accumulation * world_size
    world_size: int
    num_workers: int
    memory_share: float
    estimated_bytes: int
    budget_bytes: int
    reasons: list[str] = field(default_factory=list)
    # torch's intra-op threads. On the CPU they set how every sum is split, so another count rounds
    # differently (a resume stays exact in data and batch, not bit for bit). 0: not recorded (older).
    cpu_threads: int = 0

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> HardwarePlan:
        names = [f.name for f in dataclasses.fields(cls)]
        unknown = sorted(set(data) - set(names))
        optional = {f.name for f in dataclasses.fields(cls) if f.default is not dataclasses.MISSING}
        missing = [name for name in names if name not in data and name not in optional]
        if unknown or missing:
            raise UserError(f"hardware plan: unknown key(s) {unknown}, missing key(s) {missing}; "
                            "the checkpoint was written by another version")
        return cls(**{**data, "reasons": list(data["reasons"])})

    def describe(self) -> str:
        head = (f"{self.device_name} ({self.device}): {self.precision}, micro-batch {self.micro_batch} x "
                f"accumulation {self.grad_accumulation} x {self.world_size} process(es) = effective batch "
                f"{self.effective_batch}, {self.num_workers} data worker(s)")
        if self.device == "cpu" and self.cpu_threads:
            head += f", {self.cpu_threads} torch thread(s)"
        return "\n".join([head, *(f"  - {reason}" for reason in self.reasons)])


def _gib(n: int) -> str:
    return f"{n / GIB:.2f} GiB"


def _cc(device: DeviceInfo) -> str:
    return f"{device.capability[0]}.{device.capability[1]}"


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def _choose_precision(device: DeviceInfo, amp: bool | None) -> tuple[str, str]:
    if device.kind == "cpu":
        if amp:
            return "fp32", ("--amp ignored: CPU trains in fp32 (CPU autocast is slow on most CPUs and "
                            "would give up bit-exact resume).")
        return "fp32", "fp32: CPU trains in full precision."
    if amp is False:
        return "fp32", "fp32: --no-amp asked for full precision (no autocast, no GradScaler)."
    cc = _cc(device)
    if device.bf16:
        return "bf16", f"bf16 autocast: compute capability {cc} has bfloat16, so no GradScaler is needed."
    return "fp16", (f"fp16 autocast with a GradScaler: compute capability {cc} has no native bfloat16 "
                    "(needs 8.0), and fp16 gradients need loss scaling not to underflow.")


def _tf32(device: DeviceInfo) -> tuple[bool, str]:
    if device.kind == "cuda" and device.capability >= (8, 0):
        return True, ("TF32 matmuls on: Ampere or newer (compute capability >= 8.0) runs fp32 matmuls "
                      "on tensor cores.")
    return False, "TF32 off: it needs an Ampere or newer GPU (compute capability >= 8.0)."


def _per_rank_batch(effective_batch: int, world_size: int) -> tuple[int, list[str]]:
    """Samples each process contributes per optimizer step."""
    if effective_batch % world_size == 0:
        return effective_batch // world_size, []
    per_rank = math.ceil(effective_batch / world_size)
    return per_rank, [f"Effective batch {effective_batch} does not split over {world_size} processes; "
                      f"using {per_rank} per process ({per_rank * world_size} per step)."]


def _auto_gpu_micro_batch(per_rank: int, estimate: Callable[[int], int], budget: int) -> tuple[int, str]:
    """Largest divisor of the per-process batch whose estimate fits the budget; 1 when none does."""
    divisors = _divisors(per_rank)
    fitting = [d for d in divisors if estimate(d) <= budget]
    if not fitting:
        return 1, "Micro-batch 1: even one sample of maximum length is over the budget."
    micro = fitting[-1]
    larger = [d for d in divisors if d > micro]
    if not larger:
        return micro, f"Micro-batch {micro}: the whole per-process batch {per_rank} fits."
    return micro, (f"Micro-batch {micro}: the largest divisor of the per-process batch {per_rank} that fits; "
                   f"the next one, {larger[0]}, would need {_gib(estimate(larger[0]))}.")


def _choose_batches(device: DeviceInfo, per_rank: int, batch_size: int, grad_accumulation: int,
                    estimate: Callable[[int], int], budget: int) -> tuple[int, int, str]:
    """(micro_batch, grad_accumulation, why). Explicit values win; 0 means choose."""
    if batch_size and grad_accumulation:
        return batch_size, grad_accumulation, "Micro-batch and accumulation as given."
    if batch_size:
        accum = max(1, math.ceil(per_rank / batch_size))
        return batch_size, accum, (f"Micro-batch {batch_size} as given; accumulation {accum} to reach "
                                   "the batch.")
    if grad_accumulation:
        micro = max(1, per_rank // grad_accumulation)
        return micro, grad_accumulation, (f"Accumulation {grad_accumulation} as given; micro-batch {micro} "
                                          "= per-process batch / accumulation.")
    if device.kind == "cpu":
        micro = max(d for d in _divisors(per_rank) if d <= CPU_MICRO_BATCH_CAP)
        return micro, per_rank // micro, (f"Micro-batch {micro}: on CPU the largest divisor of the "
                                          f"per-process batch {per_rank} up to {CPU_MICRO_BATCH_CAP}, "
                                          "to keep a step short.")
    micro, why = _auto_gpu_micro_batch(per_rank, estimate, budget)
    return micro, per_rank // micro, why


def _batch_sentence(micro: int, accum: int, world_size: int, effective: int, asked: int) -> str:
    product = f"{micro} x {accum} accumulation x {world_size} process(es) = effective batch {effective}"
    if effective == asked:
        return f"Gradient accumulation {accum}: {product}, as asked (the same on any GPU)."
    return f"Effective batch is NOT the one asked for: {product}, asked {asked}."


def _params_phrase(counts: ParamCounts, scope: ScopeSettings, world_size: int) -> str:
    state = "gradients and AdamW state" + (", DDP buckets" if world_size > 1 else "")
    extra = state_bytes_per_trainable(world_size)
    if scope.train_scope == "full":
        return f"{counts.model:,} trained parameters at {WEIGHT_BYTES_PER_PARAM + extra} bytes for weights, {state}"
    adapters = f" ({counts.adapters:,} of them LoRA adapters)" if counts.adapters else ""
    return (f"train scope {scope.describe()}: {counts.model + counts.adapters:,} parameters at "
            f"{WEIGHT_BYTES_PER_PARAM} bytes for weights, of which {counts.trainable:,} trainable{adapters} "
            f"at {extra} more for {state}")


def _memory_sentence(device: DeviceInfo, cfg: GPTConfig, micro: int, estimate: int, budget: int,
                     share: float, precision: str, activation_checkpointing: bool, world_size: int,
                     scope: ScopeSettings) -> str:
    ckpt = "on" if activation_checkpointing else "off"
    act = 4 if precision == "fp32" else 2
    per_sample = activation_bytes_per_sample(cfg, act, activation_checkpointing, scope)
    text = (f"Memory budget {_gib(budget)} = {share:g} of {_gib(device.total_memory)}; estimate for "
            f"micro-batch {micro} at the longest sample ({max_sequence_positions(cfg)} positions), "
            f"activation checkpointing {ckpt}: {_gib(estimate)} "
            f"({_params_phrase(param_counts(cfg, scope), scope, world_size)}, a "
            f"{_gib(CUDA_RESERVE_BYTES)} reserve, {_gib(per_sample)} per sample).")
    if estimate <= budget:
        return text
    advice = ("set train.activation_checkpointing: true" if not activation_checkpointing
              else "lower the micro-batch or gpt.max_mel_tokens, or use a GPU with more memory")
    return f"{text} OVER the budget: it may run out of memory; {advice}."


def _choose_workers(cpu_count: int, world_size: int, requested: int, kind: str) -> tuple[int, str]:
    if requested > cpu_count:  # each worker is a process with its own copy of the loader: never more than cores
        return cpu_count, (f"warning: --num-workers {requested} is more than the {cpu_count} CPU core(s); "
                           f"lowered to {cpu_count} data worker(s).")
    if requested:
        return requested, f"{requested} data worker(s) as given."
    if kind == "cpu":
        # Training on the CPU, the model's own threads use every core: a loader process would only
        # take cores from the compute (bench_trainer on 2 cores: 17% slower with 1 worker), so load in
        # the main process.
        return 0, "0 data workers: training on the CPU, whose cores the model's threads already use."
    # Assumes every process shares this machine's cores: never oversubscribes, at worst leaves
    # cores idle on a multi-node run.
    cores = max(1, cpu_count // world_size)
    workers = min(MAX_AUTO_WORKERS, cores - 1)
    return workers, (f"{workers} data worker(s): {cores} CPU core(s) per process, one left for the main "
                     f"process, at most {MAX_AUTO_WORKERS}.")


def _check_inputs(effective_batch: int, batch_size: int, grad_accumulation: int, num_workers: int,
                  world_size: int, memory_share: float) -> None:
    largest = setting_range("effective_batch_size")[1]  # the schema's bound; the planner is also called without it
    if not 1 <= effective_batch <= largest:
        raise UserError(f"train.effective_batch_size (--effective-batch-size) must be in 1..{largest:,}, "
                        f"got {effective_batch:,}")
    for flag, value in (("--batch-size", batch_size), ("--grad-accumulation", grad_accumulation),
                        ("--num-workers", num_workers)):
        if value < 0:
            raise UserError(f"{flag} must be >= 0 (0 = auto), got {value}")
    if world_size < 1:
        raise UserError(f"WORLD_SIZE must be >= 1, got {world_size}")
    if not 0.0 < memory_share <= 1.0:
        raise UserError(f"memory share must be in (0, 1], got {memory_share}")


# A GPU's reported memory and compute capability as far as any plan can mean them: `--assume 0GiB@8.9` or
# `99999999999GiB@0.0` describe no GPU, and a plan for one would read as advice (to shrink the model, say).
MAX_GPU_BYTES = 64 << 40
LEAST_CAPABILITY = (3, 0)  # the oldest CUDA architecture any torch build ran on


def _check_device(device: DeviceInfo) -> None:
    if device.kind != "cuda":
        return
    if not 0 < device.total_memory <= MAX_GPU_BYTES or tuple(device.capability) < LEAST_CAPABILITY:
        raise UserError(f"{device.name}: not a GPU a plan can be made for (memory above 0 and at most "
                        f"{MAX_GPU_BYTES >> 30:,} GiB, compute capability {LEAST_CAPABILITY[0]}.0 or newer); "
                        "give it as torch reports it, e.g. --assume 24GiB@8.9")


def _check_model_fits(device: DeviceInfo, gpt_cfg: GPTConfig, scope: ScopeSettings, world_size: int) -> None:
    """Refuse, before anything is built, a model whose weights alone exceed this machine's memory (it
    is built in host RAM first) or whose weights, gradients and AdamW state exceed the device's."""
    counts = param_counts(gpt_cfg, scope)
    weights = WEIGHT_BYTES_PER_PARAM * (counts.model + counts.adapters)
    sizes = (f"gpt.layers {gpt_cfg.layers}, gpt.model_dim {gpt_cfg.model_dim}, "
             f"gpt.number_text_tokens {gpt_cfg.number_text_tokens}")
    host = device.total_memory if device.kind == "cpu" else (0 if device.cpu_count_assumed else system_memory())
    if host and weights > host:
        raise UserError(f"the config's model has {counts.model:,} parameters: {_gib(weights)} of fp32 weights, more "
                        f"than this machine's {_gib(host)} of memory; check the config's sizes ({sizes})")
    needed = weights + counts.trainable * state_bytes_per_trainable(world_size)
    if device.kind == "cuda" and needed > device.total_memory:
        raise UserError(f"the config's model needs {_gib(needed)} for weights, gradients and AdamW state alone, more "
                        f"than the {_gib(device.total_memory)} of {device.name}; check the config's sizes ({sizes}) "
                        "or train a smaller scope (--train-scope partial/lora)")


# Words of a card's name that say its form factor or memory kind, not which card it is (`H100 SXM`, `A100 PCIe
# 80GB`, `H100 SXM5 80GB HBM3`): the plan rests on memory and compute capability, which they leave as the table
# has them. `NVL` stays: an H100 NVL has 94 GB, not the table's 80.
_FORM_WORDS = re.compile(r"(?<![a-z0-9])(sxm\d?|pcie|hbm\d?e?)(?![a-z0-9])", re.IGNORECASE)
_MEMORY_ALONE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(gib|gb|g)?\s*$", re.IGNORECASE)


def plan_device(assume: str | None) -> DeviceInfo:
    """The device `hardware` plans for: this machine's, or the GPU `--assume` names as users type it (device.py
    reads the table's names; here also the form-factor words of rental listings, and what a bare size lacks)."""
    if assume is None:
        return detect_device()
    try:
        return assume_device(assume)
    except UserError as unknown:
        plain = _FORM_WORDS.sub(" ", assume)
        if plain.strip() and plain != assume:
            try:
                return assume_device(plain)
            except UserError:
                pass
        memory = _MEMORY_ALONE.match(assume)
        if memory:  # `24GB`: the card's memory, but the plan also needs what its tensor cores can do
            size = f"{memory.group(1)}{memory.group(2) or 'GB'}"
            raise UserError(f"--assume {assume!r} gives the memory alone; add the compute capability: {size}@8.9 "
                            "(RTX 4090, L4, L40S), @8.6 (RTX 3090, A6000, A10G), @8.0 (A100), @9.0 (H100), @7.5 "
                            "(T4), @7.0 (V100)") from None
        if assume.strip().lower() == "cpu":
            raise UserError("--assume names a GPU; for this machine's own plan (its CPU) leave --assume out") from None
        raise unknown from None


def choose_plan(device: DeviceInfo, gpt_cfg: GPTConfig, *, effective_batch: int, batch_size: int = 0,
                grad_accumulation: int = 0, num_workers: int = 0, amp: bool | None = None,
                activation_checkpointing: bool = False, world_size: int = 1,
                memory_share: float = DEFAULT_MEMORY_SHARE, scope: ScopeSettings = FULL_SCOPE) -> HardwarePlan:
    """What to run with on `device`. 0 for batch_size/grad_accumulation/num_workers means auto.

    `scope` (--train-scope) decides which tensors carry gradients and AdamW state in the estimate.
    """
    _check_inputs(effective_batch, batch_size, grad_accumulation, num_workers, world_size, memory_share)
    _check_device(device)
    _check_model_fits(device, gpt_cfg, scope, world_size)
    cc = f", compute capability {_cc(device)}" if device.kind == "cuda" else ""
    assumed = (" (assumed: a typical rented single-GPU box; the data workers follow the real count when "
               "training)") if device.cpu_count_assumed else ""
    reasons = [f"Device {device.name}: {_gib(device.total_memory)} reported{cc}, "
               f"{device.cpu_count} CPU core(s){assumed}."]
    precision, why = _choose_precision(device, amp)
    reasons.append(why)
    tf32, why = _tf32(device)
    reasons.append(why)

    budget = int(memory_share * device.total_memory)

    estimate = memory_estimator(gpt_cfg, precision=precision, activation_checkpointing=activation_checkpointing,
                                world_size=world_size, scope=scope)

    per_rank, notes = _per_rank_batch(effective_batch, world_size)
    reasons += notes
    micro, accum, why = _choose_batches(device, per_rank, batch_size, grad_accumulation, estimate, budget)
    reasons.append(why)
    effective = micro * accum * world_size
    reasons.append(_batch_sentence(micro, accum, world_size, effective, effective_batch))
    estimated = estimate(micro)
    reasons.append(_memory_sentence(device, gpt_cfg, micro, estimated, budget, memory_share, precision,
                                    activation_checkpointing, world_size, scope))
    workers, why = _choose_workers(device.cpu_count, world_size, num_workers, device.kind)
    reasons.append(why)
    return HardwarePlan(
        device=device.kind, device_name=device.name, precision=precision, amp_dtype=AMP_DTYPES[precision],
        use_grad_scaler=precision == "fp16", tf32=tf32, micro_batch=micro, grad_accumulation=accum,
        effective_batch=effective, world_size=world_size, num_workers=workers, memory_share=memory_share,
        estimated_bytes=estimated, budget_bytes=budget, reasons=reasons, cpu_threads=torch.get_num_threads(),
    )


# ---------------------------------------------------------------------------------------------
# Out of memory


CUBLAS_WORKSPACE = ":4096:8"  # cuBLAS's documented workspace setting for reproducible results


def prepare_exact_resume_env(environ: dict | None = None) -> None:
    """Before CUDA initialises: cuBLAS reads CUBLAS_WORKSPACE_CONFIG once, when it makes its first handle,
    and without it deterministic algorithms refuse cuBLAS matmuls. A value the user set is kept."""
    (os.environ if environ is None else environ).setdefault("CUBLAS_WORKSPACE_CONFIG", CUBLAS_WORKSPACE)


def deterministic_needed(plan: HardwarePlan) -> bool:
    """Exact resume is promised on every device; on CUDA only deterministic kernels keep it (atomics in
    some backward kernels add in a different order each run). The CPU's kernels are deterministic."""
    return plan.device == "cuda"


def apply_determinism(plan: HardwarePlan) -> bool:
    """Ask torch for deterministic algorithms where `plan` needs them; returns whether it did."""
    if not deterministic_needed(plan):
        return False
    prepare_exact_resume_env()  # a no-op when train() set it before CUDA started, as it does
    torch.use_deterministic_algorithms(True)
    torch.backends.cudnn.deterministic = True
    torch.backends.cudnn.benchmark = False
    return True


def is_oom_error(exc: BaseException) -> bool:
    """True for a device out-of-memory error (the typed one, or an older RuntimeError saying so)."""
    if isinstance(exc, torch.cuda.OutOfMemoryError):
        return True
    return isinstance(exc, RuntimeError) and "out of memory" in str(exc).lower()


def halve_for_oom(plan: HardwarePlan, error: BaseException | None = None) -> HardwarePlan:
    """The same plan at (at most) half the micro-batch, with the same effective batch.

    The new micro-batch is the largest divisor of the per-process batch that is <= micro/2, so the
    accumulation stays an integer. `estimated_bytes` is left as it was: the error just showed that
    the estimate was too low for this machine, and the reasons say so. At micro-batch 1 there is
    nothing left to halve: raises UserError (chained to `error` when given).
    """
    if plan.micro_batch <= 1:
        cause = f" ({str(error).splitlines()[0]})" if error is not None and str(error) else ""
        raise UserError(f"out of memory at micro-batch 1 on {plan.device_name}{cause}; set "
                        "train.activation_checkpointing: true if it is off, lower gpt.max_mel_tokens, "
                        "or use a GPU with more memory") from error
    per_rank = plan.micro_batch * plan.grad_accumulation
    micro = max(d for d in _divisors(per_rank) if d <= plan.micro_batch // 2)
    reason = (f"Out of memory at micro-batch {plan.micro_batch} (estimated {_gib(plan.estimated_bytes)}, "
              f"too low for this machine): now micro-batch {micro} x accumulation {per_rank // micro}, "
              f"effective batch still {plan.effective_batch}.")
    return dataclasses.replace(plan, micro_batch=micro, grad_accumulation=per_rank // micro,
                               reasons=[*plan.reasons, reason])


# ---------------------------------------------------------------------------------------------
# The docs table


TABLE_SCOPES = (ScopeSettings("full"), ScopeSettings("partial"), ScopeSettings("lora"))


def gpu_table(gpt_cfg: GPTConfig, *, effective_batch: int = 64) -> str:
    """Markdown: what auto mode picks on each KNOWN_GPUS entry, activation checkpointing off and on,
    for each --train-scope at its default settings (partial: last 4 blocks; lora: rank 16, all targets)."""
    rows = [
        "| GPU | reports | precision | activation checkpointing | full: micro-batch x accumulation "
        "| partial | lora | estimate full / partial / lora, budget |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for key, device in KNOWN_GPUS.items():
        for ckpt in (False, True):
            plans = [choose_plan(device, gpt_cfg, effective_batch=effective_batch, activation_checkpointing=ckpt,
                                 scope=scope) for scope in TABLE_SCOPES]
            cells = [f"{p.micro_batch} x {p.grad_accumulation}" + (" (over)" if p.estimated_bytes > p.budget_bytes
                                                                    else "") for p in plans]
            estimates = " / ".join(f"{p.estimated_bytes / GIB:.1f}" for p in plans)
            plan = plans[0]
            rows.append(
                f"| {key} | {device.total_memory / GIB:.2f} GiB, cc {_cc(device)} "
                f"| {plan.precision}{' + GradScaler' if plan.use_grad_scaler else ''} "
                f"| {'on' if ckpt else 'off'} | {' | '.join(cells)} "
                f"| {estimates}, {plan.budget_bytes / GIB:.1f} GiB |"
            )
    return "\n".join(rows) + "\n"
