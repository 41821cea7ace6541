"""torchrun ranks for prepare: who am I, and the two collective calls the pipeline needs.

Launched by torchrun, every process has RANK / WORLD_SIZE / LOCAL_RANK; a plain run is world size 1,
where nothing here touches torch.distributed. (The trainer has its own helpers a layer above; prepare
sits below it, so it keeps these few lines itself.)
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch
import torch.distributed as dist


@dataclass(frozen=True)
class RankInfo:
    rank: int = 0
    world_size: int = 1
    local_rank: int = 0

    @property
    def enabled(self) -> bool:
        return self.world_size > 1

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def start_ranks() -> RankInfo:
    """This process's rank; joins the process group (NCCL on GPUs, gloo on CPUs) under torchrun."""
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    if world_size <= 1:
        return RankInfo()
    rank = int(os.environ["RANK"])
    local_rank = int(os.environ.get("LOCAL_RANK", rank))
    if torch.cuda.is_available():
        torch.cuda.set_device(local_rank)
    dist.init_process_group(backend="nccl" if torch.cuda.is_available() else "gloo")
    return RankInfo(rank=rank, world_size=world_size, local_rank=local_rank)


def stop_ranks(info: RankInfo) -> None:
    if info.enabled and dist.is_initialized():
        dist.destroy_process_group()


def broadcast_from_main(value: str | None, info: RankInfo) -> str | None:
    """Rank 0's value on every rank (a setup error, so all ranks stop with the same line)."""
    if not info.enabled:
        return value
    box = [value]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def wait_for_all(info: RankInfo) -> None:
    if info.enabled:
        dist.barrier()
