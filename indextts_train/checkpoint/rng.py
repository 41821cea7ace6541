"""The RNG part of a checkpoint: every random stream of a process (Python, NumPy, torch CPU, each CUDA
device), captured as plain, weights_only-safe values, checked, and put back.

Restoring these is what makes dropout after a resume draw the same masks as an uninterrupted run.
"""

from __future__ import annotations

import random
from typing import Any

import numpy as np
import torch

from indextts_train.config.schema import is_int
from indextts_train.errors import CheckpointError

_PYTHON_RNG_WORDS = 625  # random.getstate(): 624 Mersenne Twister words + position
_NUMPY_RNG_WORDS = 624


def _plain_python_rng(state: tuple) -> list:
    version, words, gauss_next = state
    return [version, list(words), gauss_next]


def _plain_numpy_rng(state: tuple) -> dict:
    # numpy arrays and scalars are not weights_only-safe: store plain ints and floats.
    name, words, pos, has_gauss, cached = state
    return {"bit_generator": str(name), "key": [int(w) for w in words], "pos": int(pos),
            "has_gauss": int(has_gauss), "cached_gaussian": float(cached)}


def capture_rng() -> dict:
    """This process's RNG states (python, numpy global, torch CPU, every CUDA device), weights_only-safe."""
    cuda = torch.cuda.get_rng_state_all() if torch.cuda.is_available() else []
    return {"python": _plain_python_rng(random.getstate()),
            "numpy": _plain_numpy_rng(np.random.get_state(legacy=True)),
            "torch_cpu": torch.get_rng_state(), "cuda": list(cuda)}


def seeded_rng(seed: int) -> dict:
    """RNG states as `capture_rng()` would return right after seeding with `seed`; globals untouched."""
    return {"python": _plain_python_rng(random.Random(seed).getstate()),
            "numpy": _plain_numpy_rng(np.random.RandomState(seed % 2**32).get_state(legacy=True)),
            "torch_cpu": torch.Generator().manual_seed(seed).get_state(), "cuda": []}


def rng_problem(state: Any) -> str | None:
    """Why `state` is not a capture_rng() dict, or None."""
    if not isinstance(state, dict):
        return f"expected a dict, got {type(state).__name__}"
    missing = [k for k in ("python", "numpy", "torch_cpu", "cuda") if k not in state]
    if missing:
        return f"missing {', '.join(missing)}"
    py = state["python"]
    if not (isinstance(py, (list, tuple)) and len(py) == 3 and isinstance(py[1], (list, tuple))
            and len(py[1]) == _PYTHON_RNG_WORDS and all(is_int(w) for w in py[1])):
        return "python: not a random.getstate() triple"
    np_state = state["numpy"]
    if not (isinstance(np_state, dict) and np_state.get("bit_generator") == "MT19937"
            and isinstance(np_state.get("key"), list) and len(np_state["key"]) == _NUMPY_RNG_WORDS
            and is_int(np_state.get("pos")) and is_int(np_state.get("has_gauss"))
            and isinstance(np_state.get("cached_gaussian"), float)):
        return "numpy: not an MT19937 state"
    tensors = [state["torch_cpu"], *state["cuda"]] if isinstance(state["cuda"], list) else None
    if tensors is None or not all(isinstance(t, torch.Tensor) and t.dtype == torch.uint8 for t in tensors):
        return "torch_cpu/cuda: expected uint8 tensors (cuda: a list of them)"
    return None


def restore_rng(state: dict) -> None:
    """Put back a `capture_rng()` state. CUDA devices beyond those saved (or present) are left alone."""
    problem = rng_problem(state)
    if problem:
        raise CheckpointError(f"checkpoint RNG state is malformed ({problem}); repair the checkpoint")
    version, words, gauss_next = state["python"]
    random.setstate((version, tuple(words), gauss_next))
    np_state = state["numpy"]
    np.random.set_state((np_state["bit_generator"], np.asarray(np_state["key"], dtype=np.uint32),
                         np_state["pos"], np_state["has_gauss"], np_state["cached_gaussian"]))
    torch.set_rng_state(state["torch_cpu"])
    devices = torch.cuda.device_count() if torch.cuda.is_available() else 0
    for device, cuda_state in enumerate(state["cuda"][:devices]):
        torch.cuda.set_rng_state(cuda_state, device)


class ProcessRng:
    """This process's RNG streams as a checkpoint part (one per rank in the checkpoint's `rng` list)."""

    def state_dict(self) -> dict:
        return capture_rng()

    def load_state_dict(self, state: dict) -> None:
        restore_rng(state)
