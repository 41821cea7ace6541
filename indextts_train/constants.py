"""Facts of the IndexTTS2 GPT that several modules need (reference README, rules 1-4)."""

from __future__ import annotations

CONDITION_LATENTS = 32  # perceiver latents = rows of a precomputed `condition` [32, D]
PREFIX_LEN = CONDITION_LATENTS + 2  # plus the two speed-embedding rows: the 34-row prefix
TEXT_ROW_KEYS = ("text_embedding.weight", "text_head.weight", "text_head.bias")  # rows = tokens + 1
WRAPPER_PREFIXES = ("module.", "_orig_mod.")  # DistributedDataParallel, torch.compile
