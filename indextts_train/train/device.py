"""The device a run plans for: the one found (`detect_device`), a known GPU by the name users type
(`--assume RTX4090`, `rtx 4090`, `NVIDIA GeForce RTX 4090` and `4090` all name the RTX-4090 of the
table), or any GPU described by its memory and compute capability (`--assume 24GiB@8.9`).
"""

from __future__ import annotations

import dataclasses
import difflib
import os
import re
from dataclasses import dataclass

import torch

from indextts_train.errors import UserError

_VENDOR_WORDS = re.compile(r"\b(nvidia|geforce|tesla|quadro)\b")


def normal_gpu_name(name: str) -> str:
    """Lower case without spaces, dashes, underscores and vendor words: `RTX_4090` -> `rtx4090`."""
    return re.sub(r"[\s_-]+", "", _VENDOR_WORDS.sub(" ", name.strip().lower()))


def known_gpu_key(name: str, known: dict[str, str]) -> tuple[str | None, list[str]]:
    """The key of `known` (table key -> the card's name as torch reports it) that `name` means, else None
    and the closest keys: the normal form equal to a key's or a card name's, else part of exactly one
    key's ("4090", "H100"); several such keys ("A100") are the answer's closest ones."""
    query = normal_gpu_name(name)
    forms = {normal_gpu_name(key): key for key in known} | {normal_gpu_name(card): key for key, card in known.items()}
    if query in forms:
        return forms[query], []
    order = list(known)
    containing = sorted({key for form, key in forms.items() if query and query in form}, key=order.index)
    if len(containing) == 1:
        return containing[0], []
    close = difflib.get_close_matches(query, list(forms), n=3, cutoff=0.5)
    return None, containing or list(dict.fromkeys(forms[form] for form in close))


@dataclass
class DeviceInfo:
    """A description of the device to plan for: the one found (`detect_device`) or an assumed one."""

    kind: str  # "cuda" | "cpu"
    name: str  # "NVIDIA A100-SXM4-80GB", "cpu"
    total_memory: int  # bytes, as the driver reports it (below the marketing size)
    capability: tuple[int, int]  # CUDA compute capability; (0, 0) on CPU
    bf16: bool  # native bfloat16 tensor cores (compute capability >= 8.0)
    cpu_count: int  # cores this process may use
    cpu_count_assumed: bool = False  # a named GPU's typical box, not a count read from a machine


# Totals are what cudaGetDeviceProperties (and so torch) reports, as printed by CUDA's deviceQuery
# on these cards; all sit below the size on the box. `cpu_count` is a typical rented single-GPU
# box; `assume_device(name, cpu_count=...)` replaces it.
KNOWN_GPUS: dict[str, DeviceInfo] = {
    "A100-80GB": DeviceInfo("cuda", "NVIDIA A100-SXM4-80GB", 84_987_740_160, (8, 0), True, 8),
    "A100-40GB": DeviceInfo("cuda", "NVIDIA A100-SXM4-40GB", 42_298_834_944, (8, 0), True, 8),
    "H100-80GB": DeviceInfo("cuda", "NVIDIA H100 80GB HBM3", 85_045_477_376, (9, 0), True, 8),
    # as torch reported it on the H200 our benchmarks ran on (benchmarks/results/gpu-NVIDIA-H200.json: 139.8 GiB,
    # rounded there to 0.1 GiB, well inside the plan's margin), with that box's 16 cores
    "H200": DeviceInfo("cuda", "NVIDIA H200", round(139.8 * 2**30), (9, 0), True, 16),
    "L4": DeviceInfo("cuda", "NVIDIA L4", 23_612_293_120, (8, 9), True, 8),
    "V100-16GB": DeviceInfo("cuda", "Tesla V100-SXM2-16GB", 16_945_512_448, (7, 0), False, 8),
    "V100-32GB": DeviceInfo("cuda", "Tesla V100-SXM2-32GB", 34_089_730_048, (7, 0), False, 8),
    "T4": DeviceInfo("cuda", "Tesla T4", 15_843_721_216, (7, 5), False, 8),
    # The cards most fine-tuning runs on. Their totals are nvidia-smi's (MiB x 2^20), a little above
    # what torch reports; the plan aims at 0.85 of it, so the difference stays inside the margin.
    "RTX-4090": DeviceInfo("cuda", "NVIDIA GeForce RTX 4090", 24_564 * 2**20, (8, 9), True, 8),
    "RTX-3090": DeviceInfo("cuda", "NVIDIA GeForce RTX 3090", 24_576 * 2**20, (8, 6), True, 8),
    "A10G": DeviceInfo("cuda", "NVIDIA A10G", 23_028 * 2**20, (8, 6), True, 8),
    "L40S": DeviceInfo("cuda", "NVIDIA L40S", 46_068 * 2**20, (8, 9), True, 8),
    "RTX-A6000": DeviceInfo("cuda", "NVIDIA RTX A6000", 49_140 * 2**20, (8, 6), True, 8),
}

# `--assume 24GiB@8.9`: any GPU, by what the plan is made of (reported memory, compute capability).
_SPEC = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(GiB|GB)\s*@\s*(?:cc\s*)?(\d+)\.(\d)\s*$", re.IGNORECASE)


def device_from_spec(spec: str) -> DeviceInfo | None:
    """A GPU described by memory and compute capability (`24GiB@8.9`, `48GB@8.6`); None if not such a spec."""
    match = _SPEC.match(spec)
    if match is None:
        return None
    amount, unit, major, minor = match.groups()
    # capped: a size of hundreds of digits is an infinite float, which int() refused with an OverflowError;
    # past the cap, _check_device (hardware.py) says it is no GPU a plan can be made for
    total = int(min(float(amount) * (2**30 if unit.lower() == "gib" else 10**9), 2.0**80))
    capability = (int(major), int(minor))
    return DeviceInfo("cuda", f"GPU with {amount} {unit}, compute capability {major}.{minor}", total,
                      capability, capability >= (8, 0), 8)


def assume_device(name: str, cpu_count: int | None = None) -> DeviceInfo:
    """The KNOWN_GPUS entry for `name` (case, spaces, dashes and vendor words ignored) or a `MEM@CC` spec, for
    `--assume` and the docs table. The plan depends only on the memory and compute capability."""
    key, closest = known_gpu_key(name, {key: gpu.name for key, gpu in KNOWN_GPUS.items()})
    found = KNOWN_GPUS[key] if key is not None else device_from_spec(name)
    if found is None:
        nearest = f"closest: {', '.join(closest)}; " if closest else ""
        raise UserError(f"--assume: unknown GPU {name!r}; {nearest}known: {', '.join(KNOWN_GPUS)}; or describe it "
                        "as MEMORY@CAPABILITY, e.g. 24GiB@8.9 (memory as torch reports it, compute capability)")
    device = dataclasses.replace(found, cpu_count_assumed=cpu_count is None)
    if cpu_count is not None:
        device.cpu_count = cpu_count
    return device


def _usable_cpu_count() -> int:
    """Cores this process may run on (a container or `taskset` may allow fewer than the machine has)."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


def system_memory() -> int:
    """This machine's RAM in bytes (0 where the system does not say)."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (AttributeError, ValueError, OSError):
        return 0


def detect_device(local_rank: int = 0) -> DeviceInfo:
    """The CUDA device `local_rank` when CUDA is available, else this machine's CPU."""
    cpu_count = _usable_cpu_count()
    if not torch.cuda.is_available():
        return DeviceInfo("cpu", "cpu", system_memory(), (0, 0), False, cpu_count)
    visible = torch.cuda.device_count()
    if not 0 <= local_rank < visible:
        raise UserError(f"LOCAL_RANK {local_rank} but {visible} CUDA device(s) are visible; "
                        "check CUDA_VISIBLE_DEVICES and --nproc-per-node")
    props = torch.cuda.get_device_properties(local_rank)
    capability = (props.major, props.minor)
    # Not torch.cuda.is_bf16_supported(): by default it also says True where bf16 is only emulated
    # (a V100), which runs far slower than fp16 there.
    return DeviceInfo("cuda", props.name, props.total_memory, capability, capability >= (8, 0), cpu_count)
