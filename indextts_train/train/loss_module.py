"""The loss as a module's forward, the one thing DDP wraps."""

from __future__ import annotations

import torch
from torch import nn

from indextts_train.model.gpt import Batch, UnifiedVoiceGPT


class LossModule(nn.Module):
    """DDP only syncs gradients through `forward`, so the loss computation is the forward here.

    It owns the LoRA adapters too (when the scope has them), so DDP syncs their gradients.
    """

    def __init__(self, model: UnifiedVoiceGPT, adapters: nn.Module | None = None) -> None:
        super().__init__()
        self.model = model
        self.adapters = adapters

    def forward(self, batch: Batch) -> tuple[torch.Tensor, ...]:
        out = self.model.compute_losses(batch)
        return (out.text_loss, out.mel_loss, out.text_ce_sum, out.text_count, out.mel_ce_sum,
                out.mel_count, out.mel_correct)
