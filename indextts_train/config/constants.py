"""Facts of the IndexTTS2 GPT that several modules need (reference README, rules 1-4)."""

from __future__ import annotations

CONDITION_LATENTS = 32  # perceiver latents = rows of a precomputed `condition` [32, D]
PREFIX_LEN = CONDITION_LATENTS + 2  # plus the two speed-embedding rows: the 34-row prefix
# IndexTTS-2.5 (tests/data/reference/v2_5/README.md, rules 4-5)
PREFIX_LEN_V25 = 3  # spk_emb_proj(speaker vector) + emo vector, then two zero rows
SPK_EMB_DIM = 192  # the CAMPPlus speaker vector
LANG_ROWS = 107  # lang_embedding rows: len(LANGUAGE_DICT) + 1, whatever the config says
TEXT_ROW_KEYS = ("text_embedding.weight", "text_head.weight", "text_head.bias")  # rows = tokens + 1
WRAPPER_PREFIXES = ("module.", "_orig_mod.")  # DistributedDataParallel, torch.compile
