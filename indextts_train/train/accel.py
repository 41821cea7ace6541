"""Speed options that change how the model runs, never what it computes or what a checkpoint holds.

- `compile_blocks`: torch.compile each GPT-2 block in place (`nn.Module.compile`), as torchtitan
  does. The blocks are identical code, so one compiled graph serves all of them; state_dict keys
  stay the official ones (no `_orig_mod.` prefix), so checkpoints and export do not change.
- `adamw_options`: the fused AdamW kernel on CUDA (one launch for all tensors). Its state_dict has
  the same keys, shapes and dtypes as the default implementation's, so a run may resume across
  implementations (the `step` counters are moved to the right device by `load_state_dict`).
"""

from __future__ import annotations

import torch
from torch import nn


def compile_blocks(trunk_blocks: nn.ModuleList) -> None:
    """torch.compile every block of the trunk in place; keys and parameters are untouched.

    dynamic=True: one kernel set for every sequence length from the first call. Left to decide by
    itself, torch.compile specializes on the first shapes it meets and turns dynamic later, so a
    resumed run (which meets the shapes in another order) could run other kernels, with other float
    rounding, than the uninterrupted one; past its recompile limit it would even fall back to eager.
    """
    for block in trunk_blocks:
        block.compile(dynamic=True)


def adamw_options(device: torch.device) -> dict:
    """Keyword arguments for torch.optim.AdamW on `device`: fused on CUDA, the default elsewhere."""
    return {"fused": True} if device.type == "cuda" else {}
