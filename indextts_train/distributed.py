"""torchrun ranks, reduced to the few calls training and `prepare` need (one module both use).

Launched by `torchrun`, every process gets RANK / WORLD_SIZE / LOCAL_RANK in its environment; a plain
`train-gpt` run has none and is world size 1, where every helper here is a cheap no-op.

torch is imported by the calls that use it, not by the module: the CLI checks its settings against
`launched_processes` before any command runs, and its help and flag refusals should not wait seconds
for torch to load.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from indextts_train.errors import UserError

if TYPE_CHECKING:
    import torch


@dataclass
class DistInfo:
    rank: int = 0
    world_size: int = 1
    local_rank: int = 0

    @property
    def enabled(self) -> bool:
        return self.world_size > 1

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def launched_processes() -> int:
    """How many processes torchrun started to train together (1 without torchrun), known before the group
    is set up: the settings are checked against it at the edge (ui/run_settings.py)."""
    text = os.environ.get("WORLD_SIZE", "1")
    if not text.strip().isdecimal() or int(text) < 1:  # isdecimal: what int() reads ('²' is a digit, not that)
        raise UserError(f"WORLD_SIZE={text!r} in the environment is not a number of processes; unset it, or start "
                        "several processes with torchrun (it sets WORLD_SIZE, RANK and the address of rank 0)")
    world_size = int(text)
    missing = [name for name in ("RANK", "MASTER_ADDR", "MASTER_PORT") if world_size > 1 and name not in os.environ]
    if missing:
        raise UserError(f"WORLD_SIZE={world_size} is set but {', '.join(missing)} is not: this process was not started "
                        "by torchrun; unset WORLD_SIZE for one process, or start them with torchrun --nproc-per-node N")
    # What torchrun sets, checked as WORLD_SIZE is: a RANK of 'abc' was a ValueError traceback, and one past
    # the last rank waited for peers that never come
    for name, most in (("RANK", world_size - 1), ("LOCAL_RANK", None), ("MASTER_PORT", 65_535)):
        text = os.environ.get(name, "0") if world_size > 1 else "0"
        if not text.strip().isdecimal() or (most is not None and int(text) > most):
            what = ("a port" if name == "MASTER_PORT" else "a rank") + (f" of 0..{most}" if most is not None else "")
            raise UserError(f"{name}={text!r} in the environment is not {what}; start the processes with torchrun, "
                            "which sets it, or unset WORLD_SIZE for one process")
    return world_size


def setup_distributed() -> DistInfo:
    world_size = launched_processes()
    if world_size <= 1:
        return DistInfo()
    import torch
    import torch.distributed as dist

    rank = int(os.environ["RANK"])
    local_rank = int(os.environ.get("LOCAL_RANK", rank))
    if torch.cuda.is_available():
        torch.cuda.set_device(local_rank)
        backend = "nccl"
    else:
        backend = "gloo"
    dist.init_process_group(backend=backend)
    return DistInfo(rank=rank, world_size=world_size, local_rank=local_rank)


# Rank 0 posts each refusal it prints here, in the job's key-value store (torchrun's, which outlives rank 0);
# a later restart of the job (torchrun --max-restarts) posts under its own key.
REFUSAL_KEY = "indextts-train/refusal"
SAME_REFUSAL_WAIT_S = 5.0


def said_by_main(line: str, info: DistInfo, wait_s: float = SAME_REFUSAL_WAIT_S) -> bool:
    """Whether rank 0 prints this same refusal line, so that this rank need not: the ranks check the same
    inputs and would print the same line N times. Rank 0 posts its line and prints it (False); another rank
    waits up to `wait_s` for rank 0's line (they refuse at about the same time) and prints its own when
    rank 0 said nothing or something else (a file missing on this node only). No collective: the other
    ranks may be anywhere in their own steps."""
    if not info.enabled:
        return False
    from datetime import timedelta

    import torch.distributed as dist

    key = f"{REFUSAL_KEY}/{os.environ.get('TORCHELASTIC_RESTART_COUNT', '0')}"
    try:
        store = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), is_master=False,
                              timeout=timedelta(seconds=wait_s))
        if info.is_main:
            store.set(key, line)
            return False
        deadline = time.monotonic() + wait_s
        while not store.check([key]):  # polled: a store.wait that times out prints c10d warnings
            if time.monotonic() > deadline:
                return False
            time.sleep(0.05)
        return store.get(key).decode("utf-8", "replace") == line
    except Exception:  # no store to reach (rank 0 hosted it and is gone), or no line in time: say ours
        return False


def teardown_distributed(info: DistInfo) -> None:
    import torch.distributed as dist

    if info.enabled and dist.is_initialized():
        dist.destroy_process_group()


PEER_LOST = ("another process of this torchrun job stopped (its own message, if any, is above; a rank "
             "killed by a signal says nothing); the checkpoints on disk are intact: rerun the same command "
             "with --resume auto to continue")


@contextlib.contextmanager
def _collective() -> Iterator[None]:
    """A collective whose peer is gone (it refused, crashed or was killed; gloo: "Connection closed by
    peer") ends this rank with one line instead of a traceback from every surviving rank."""
    try:
        yield
    except RuntimeError as exc:  # torch.distributed.DistError and gloo's plain RuntimeError
        # what torch said stays in the line: a collective can also fail for a cause of its own (NCCL, memory)
        said = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:200]
        raise UserError(f"{PEER_LOST} (torch.distributed: {said})") from exc


@contextlib.contextmanager
def ddp_collectives(info: DistInfo) -> Iterator[None]:
    """Around the training loop: DDP's own collectives, which it runs inside forward and backward (the
    gradient all-reduce of the last micro-batch), are not ours to wrap one by one, and a peer lost there
    ends this rank with the same one line as `_collective`. Only torch.distributed's errors and gloo's
    transport errors are taken for that: anything else raised in the loop passes unchanged."""
    if not info.enabled:
        yield
        return
    import torch.distributed as dist

    try:
        yield
    except RuntimeError as exc:
        if not isinstance(exc, dist.DistError) and "gloo" not in str(exc).split(" ", 1)[0]:
            raise
        with _collective():
            raise


def any_rank(flag: bool, info: DistInfo, device: torch.device) -> bool:
    """True when the flag is set on any rank, so every rank stops at the same optimizer step."""
    if not info.enabled:
        return flag
    import torch
    import torch.distributed as dist

    value = torch.tensor([1.0 if flag else 0.0], device=device)
    with _collective():
        dist.all_reduce(value, op=dist.ReduceOp.MAX)
    return bool(value.item() > 0)


def sum_across_ranks(values: list[float], info: DistInfo, device: torch.device) -> list[float]:
    if not info.enabled:
        return values
    import torch
    import torch.distributed as dist

    tensor = torch.tensor(values, dtype=torch.float64, device=device)
    with _collective():
        dist.all_reduce(tensor, op=dist.ReduceOp.SUM)
    return tensor.tolist()


def all_reduce_sum(tensor: torch.Tensor, info: DistInfo) -> torch.Tensor:
    """`tensor` summed over ranks, on the device and without a host sync (in place; returned)."""
    if info.enabled:
        import torch.distributed as dist

        with _collective():
            dist.all_reduce(tensor, op=dist.ReduceOp.SUM)
    return tensor


def gather_to_main(obj: Any, info: DistInfo) -> list[Any]:
    """Every rank's object, in rank order, on every rank (rank 0 writes the checkpoint)."""
    if not info.enabled:
        return [obj]
    import torch.distributed as dist

    gathered: list[Any] = [None] * info.world_size
    with _collective():
        dist.all_gather_object(gathered, obj)
    return gathered


def barrier(info: DistInfo) -> None:
    if info.enabled:
        import torch.distributed as dist

        with _collective():
            dist.barrier()


def broadcast_from_main(value: str | None, info: DistInfo) -> str | None:
    """Rank 0's value on every rank (a setup error, so that all ranks stop with the same line)."""
    if not info.enabled:
        return value
    import torch.distributed as dist

    box = [value]
    with _collective():
        dist.broadcast_object_list(box, src=0)
    return box[0]
