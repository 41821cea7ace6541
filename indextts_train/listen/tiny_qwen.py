"""A tiny random stand-in for IndexTTS2's emotion model (`qwen0.6bemo4-merge/`, a Qwen3 causal LM).

IndexTTS2's inference loads it with `AutoTokenizer` and `AutoModelForCausalLM` when the model is built
and runs it only for emotion-from-text, which listening never asks for; so the stand-in only has to load:
a Qwen3 of one thin layer and a word-level tokenizer of a few tokens.
"""

from __future__ import annotations

import json
from pathlib import Path

VOCAB = ["<unk>", "<|endoftext|>", "<|im_start|>", "<|im_end|>"] + [chr(c) for c in range(ord("a"), ord("z") + 1)]


def write_tiny_qwen(folder: Path, seed: int) -> Path:
    """config.json, model.safetensors, tokenizer.json and tokenizer_config.json in `folder`; returns it."""
    import torch
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import Qwen3Config, Qwen3ForCausalLM

    folder.mkdir(parents=True, exist_ok=True)
    config = Qwen3Config(vocab_size=len(VOCAB), hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                         num_attention_heads=2, num_key_value_heads=1, head_dim=8, max_position_embeddings=64,
                         eos_token_id=1, pad_token_id=1, bos_token_id=1, tie_word_embeddings=True)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = Qwen3ForCausalLM(config)
    model.save_pretrained(folder)
    tokenizer = Tokenizer(models.WordLevel({token: i for i, token in enumerate(VOCAB)}, unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.Split("", "isolated")
    tokenizer.save(str(folder / "tokenizer.json"))
    settings = {"tokenizer_class": "PreTrainedTokenizerFast", "eos_token": "<|endoftext|>",
                "pad_token": "<|endoftext|>", "unk_token": "<unk>", "model_max_length": 64}
    (folder / "tokenizer_config.json").write_text(json.dumps(settings, indent=2) + "\n", encoding="utf-8")
    return folder
