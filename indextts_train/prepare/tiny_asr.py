"""A tiny random speech recogniser in the transformers layout, so `listen` runs whole offline (tests, demo).

A wav2vec2 CTC model of a few thousand weights with its feature extractor and a character
vocabulary: `pipeline("automatic-speech-recognition", model=FOLDER)` loads it like any hub model.
It transcribes noise as noise; its scores mean nothing (the listen page says so).
"""

from __future__ import annotations

import json
from pathlib import Path

ALPHABET = "abcdefghijklmnopqrstuvwxyz'"


def write_tiny_asr(folder: Path, seed: int = 0) -> Path:
    """Write the model (seeded) into `folder`; returns `folder`."""
    import torch
    import transformers
    from transformers import (
        Wav2Vec2Config,
        Wav2Vec2CTCTokenizer,
        Wav2Vec2FeatureExtractor,
        Wav2Vec2ForCTC,
        Wav2Vec2Processor,
    )

    transformers.utils.logging.disable_progress_bar()  # a few KB: no progress bars on the console
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    vocab = {"<pad>": 0, "<unk>": 1, "|": 2} | {ch: i + 3 for i, ch in enumerate(ALPHABET)}
    vocab_path = folder / "vocab.json"
    vocab_path.write_text(json.dumps(vocab), encoding="utf-8")
    tokenizer = Wav2Vec2CTCTokenizer(str(vocab_path), unk_token="<unk>", pad_token="<pad>", word_delimiter_token="|")
    features = Wav2Vec2FeatureExtractor(feature_size=1, sampling_rate=16_000, padding_value=0.0, do_normalize=True,
                                        return_attention_mask=False)
    config = Wav2Vec2Config(vocab_size=len(vocab), hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                            intermediate_size=32, conv_dim=(8, 8), conv_stride=(5, 4), conv_kernel=(10, 8),
                            num_conv_pos_embeddings=8, num_conv_pos_embedding_groups=2, pad_token_id=0,
                            feat_extract_norm="group")
    torch.manual_seed(seed)
    Wav2Vec2ForCTC(config).save_pretrained(folder)
    Wav2Vec2Processor(feature_extractor=features, tokenizer=tokenizer).save_pretrained(folder)
    return folder
