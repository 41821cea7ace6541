"""Validation per language: groups, losses per group, the base-model baseline and the forgetting limit.

A validation line's group (`ManifestIndex.group_lines`) is the `::lang` of its `--val-manifest`, else
its manifest's `language` (or `target_language`) field, else the manifest's file name without
`.jsonl` — so several manifests without languages are reported per manifest. With one group there
is only the total.

Each group is evaluated on its own, in manifest order, in batches of the validation batch size:
exactly the batches `indextts-train evaluate --batch-size B` makes on that group's lines alone, so
the two agree bit for bit. The total adds the groups' token sums (token-weighted, like evaluate).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import numpy as np
import torch

from indextts_train.config.settings import Config
from indextts_train.data.manifest import ManifestDataset, make_loader, sequential_batches
from indextts_train.distributed import DistInfo, sum_across_ranks
from indextts_train.errors import UserError
from indextts_train.model.gpt import UnifiedVoiceGPT
from indextts_train.train.evaluate import SUM_NAMES, loss_sums, losses_from_sums
from indextts_train.train.listen_check import describe_generation, generation_scalars


def evaluate_groups(model: UnifiedVoiceGPT, dataset: ManifestDataset, groups: dict[str, np.ndarray], *,
                    batch_size: int, config: Config, device: torch.device, num_workers: int = 0,
                    dist_info: DistInfo | None = None, autocast: Callable | None = None) -> dict:
    """{"total": losses, "groups": {name: losses}} — groups only when there are two or more.

    Under DDP each rank takes every world_size-th line of each group; the sums are added over ranks.
    """
    rank, world = (dist_info.rank, dist_info.world_size) if dist_info is not None else (0, 1)
    sums = {}
    for name, lines in groups.items():
        batches = sequential_batches(lines[rank::world].tolist(), batch_size)
        loader = make_loader(dataset, batches, num_workers, device.type == "cuda")
        sums[name] = loss_sums(model, loader, device, autocast)
    if dist_info is not None and dist_info.enabled:  # one all-reduce for every group
        flat = sum_across_ranks([v for name in sums for v in sums[name]], dist_info, device)
        width = len(SUM_NAMES)
        sums = {name: flat[k * width:(k + 1) * width] for k, name in enumerate(sums)}
    total = [sum(values) for values in zip(*sums.values(), strict=True)]
    result = {"total": losses_from_sums(total, config), "groups": {}}
    if len(groups) > 1:
        result["groups"] = {name: losses_from_sums(values, config) for name, values in sums.items()}
    return result


# ---------------------------------------------------------------------------------------------
# Against the base model


def losses_of(result: dict, group: str | None) -> dict | None:
    """The losses of one group (None: the total) in an evaluate_groups result, or None if absent."""
    return result["total"] if group is None else result["groups"].get(group)


def change_vs_base(value: float, base: float) -> float:
    """Relative change in percent (+ = worse for a loss)."""
    return 100.0 * (value - base) / base if base else math.inf


def forgetting_breaches(result: dict, baseline: dict, limits: dict[str | None, float]) -> list[str]:
    """One phrase per group whose loss rose more than its limit above the base model's."""
    checked = {}
    for group, limit in limits.items():
        names = (list(result["groups"]) or [None]) if group is None else [group]
        checked.update({name: limit for name in names})
    breaches = []
    for name, limit in checked.items():
        now, base = losses_of(result, name), losses_of(baseline, name)
        if now is None or base is None:
            continue
        change = change_vs_base(now["loss"], base["loss"])
        if change > limit:
            breaches.append(f"{name or 'total'} loss {now['loss']:.4f} is {change:+.1f}% over the base model's "
                            f"{base['loss']:.4f} (limit {limit:g}%)")
    return breaches


def check_limit_groups(limits: dict[str | None, float], groups: Sequence[str]) -> None:
    unknown = [name for name in limits if name is not None and name not in groups]
    if unknown:
        raise UserError(f"--forgetting-limit names {unknown[0]!r}, which is not a validation group "
                        f"(groups: {', '.join(groups) or 'none; pass --val-manifest PATH::lang'})")


def describe(step: int, result: dict, baseline: dict | None, note: str = "") -> str:
    """The plain log line of one validation, with each group's change against the base model."""
    total = result["total"]
    line = (f"val step {step}{note}: loss {total['loss']:.4f} text {total['text_loss']:.4f} "
            f"mel {total['mel_loss']:.4f} top1 {total['mel_top1']:.3f}")
    if baseline is not None and step > 0:
        line += f" ({change_vs_base(total['loss'], baseline['total']['loss']):+.1f}% vs base)"
    parts = []
    for name, losses in result["groups"].items():
        base = losses_of(baseline, name) if baseline is not None else None
        versus = f" ({change_vs_base(losses['loss'], base['loss']):+.1f}%)" if base and step > 0 else ""
        parts.append(f"{name} {losses['loss']:.4f}{versus}")
    line += " | " + " ".join(parts) if parts else ""
    return line + (describe_generation(result["generation"]) if "generation" in result else "")


def scalars(result: dict) -> dict[str, float]:
    """TensorBoard scalars under `val/`: the total as before, each group as `<group>/<key>`."""
    values = {k: v for k, v in result["total"].items() if k != "samples"}
    for name, losses in result["groups"].items():
        values.update({f"{name}/{k}": v for k, v in losses.items() if k != "samples"})
    if "generation" in result:
        values.update(generation_scalars(result["generation"]))
    return values
