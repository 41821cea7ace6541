"""Tiny official-layout model folders and synthetic clips: the demo and the tests run the real pipeline on them.

`write_tiny_model_dir` lays out what `prepare --model-dir` reads, as the releases do: config.yaml
(with its `semantic_codec:` section and `version`), gpt.pth, wav2vec2bert_stats.pt, the tokenizer,
hf_cache/w2v-bert-2.0/, and the codec (MaskGCT safetensors under hf_cache/semantic_codec/ for
IndexTTS2; codec.pth for 2.5) and, for 2.5, hf_cache/campplus_cn_common.bin. All weights are seeded
random tensors; the GPT's conditioning encoders take the tiny w2v-BERT's width. With `real_size`
every file has the released shapes instead (w2v-BERT 2.0, the codec of the `semantic_codec:` defaults,
CAMPPlus; the GPT is the config's own): a benchmark's stand-in for the real folder, ~4-5 GB on disk.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import torch
import yaml

from indextts_train.config.settings import load_config
from indextts_train.files.atomic import atomic_write, atomic_write_bytes, atomic_write_text
from indextts_train.files.bounded import load_yaml
from indextts_train.model.gpt import UnifiedVoiceGPT
from indextts_train.model.layout import CONFORMER_INPUT_KEY, full_state_dict, init_carried
from indextts_train.prepare import campplus, codecs, w2vbert
from indextts_train.prepare.campplus import write_tiny_campplus
from indextts_train.prepare.codecs import write_tiny_codec
from indextts_train.prepare.models import CAMPPLUS_HUB
from indextts_train.prepare.w2vbert import write_tiny_w2vbert

TINY_W2V_WIDTH = 32
WIDE_W2V = 256  # above this, the tiny w2v-BERT's noise and feed-forward width would blow it up
CLIP_RATE = 16_000


def write_tiny_gpt(config_path: Path, path: Path, width: int, seed: int) -> None:
    """A random gpt.pth of the config whose conditioning front-ends take `width`-wide features."""
    gpt = load_config(config_path).gpt
    torch.manual_seed(seed)
    generator = torch.Generator().manual_seed(seed)
    carried = init_carried(gpt, generator)
    for key, value in list(carried.items()):
        if key.endswith(CONFORMER_INPUT_KEY):  # (d, d x bins): bins = (width - 1) // 2
            d = value.shape[0]
            carried[key] = torch.randn(d, d * ((width - 1) // 2), generator=generator) / (d * width) ** 0.5
    state = full_state_dict(UnifiedVoiceGPT(gpt), carried)
    atomic_write(path, lambda handle: torch.save(state, handle))


def _w2v_sizes(width: int, real_size: bool, inference: bool) -> w2vbert.W2vBertSizes:
    if real_size:
        return w2vbert.REAL_SIZES
    if inference and width > WIDE_W2V:  # the official inference needs 1024: keep it to a few hundred MB
        return w2vbert.W2vBertSizes(layers=w2vbert.TINY_SIZES.layers, heads=2, intermediate=8, perturb=0.0)
    return w2vbert.TINY_SIZES


def write_tiny_model_dir(model_dir: Path, *, gpt_config: Path, tokenizer: Path, seed: int = 0,
                         width: int = TINY_W2V_WIDTH, real_size: bool = False, inference: bool = False) -> Path:
    """The official layout of the config's family, every weight random and seeded; returns model_dir.

    `width`: the w2v-BERT hidden size, which the codec and the GPT's encoders then take. `real_size`:
    w2v-BERT, codec and CAMPPlus at the released sizes (width 1024; `width` is then not used).
    `inference`: also what the official inference code builds at fixed sizes: CAMPPlus at its released
    size for both families, and a wide w2v-BERT with narrow feed-forwards (listen/tiny_folder.py adds
    the rest)."""
    if real_size:
        width = w2vbert.REAL_WIDTH
    model_dir.mkdir(parents=True, exist_ok=True)
    raw = load_yaml(gpt_config, "config")
    family = load_config(gpt_config).gpt.family
    hf_cache = model_dir / "hf_cache"
    write_tiny_w2vbert(hf_cache / "w2v-bert-2.0", seed, hidden=width, sizes=_w2v_sizes(width, real_size, inference))
    campplus_sizes = campplus.REAL_SIZES if real_size or inference else campplus.TINY_SIZES
    codec_sizes = codecs.REAL_SIZES if real_size else codecs.TINY_SIZES
    stats = hf_cache / "w2v-bert-2.0" / "wav2vec2bert_stats.pt"
    if stats.is_file():  # the official folder keeps the statistics beside gpt.pth
        shutil.move(stats, model_dir / "wav2vec2bert_stats.pt")
    raw["semantic_codec"] = write_tiny_codec(model_dir / family.codec_file, family, seed + 1, width, codec_sizes)
    if family.speaker_vector or inference:  # IndexTTS2's inference loads CAMPPlus too; its prepare does not
        write_tiny_campplus(hf_cache / CAMPPLUS_HUB.filename, seed + 2, campplus_sizes)
    raw["version"] = family.version
    raw.pop("train", None)  # the official config has no train: section
    # The keys by which an official folder names its files: with them `train-gpt` takes this config.yaml
    # for --config when --base-checkpoint is this folder's gpt.pth, as it does for a released folder.
    raw["dataset"] = {"bpe_model": family.tokenizer_name}
    raw["gpt_checkpoint"] = "gpt.pth"
    raw["w2v_stat"] = "wav2vec2bert_stats.pt"
    config_path = model_dir / "config.yaml"
    atomic_write_text(config_path, yaml.safe_dump(raw, sort_keys=False))
    atomic_write_bytes(model_dir / family.tokenizer_name, tokenizer.read_bytes())
    write_tiny_gpt(config_path, model_dir / "gpt.pth", width, seed)
    return model_dir


def write_synthetic_clips(folder: Path, texts: list[tuple[str, str | None]], *, speakers: int, seed: int,
                          seconds: tuple[float, float]) -> Path:
    """One 16 kHz clip per text (three tones with a slow envelope plus noise; a pitch per speaker), seeded;
    returns the corpus JSONL (`audio`, `text`, `speaker`, `language`, `id`)."""
    import soundfile

    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    pitches = rng.uniform(110.0, 260.0, size=speakers)
    lines = []
    for i, (text, language) in enumerate(texts):
        speaker = i % speakers
        n = int(rng.uniform(*seconds) * CLIP_RATE)
        t = np.arange(n) / CLIP_RATE
        tones = sum(np.sin(2 * np.pi * pitches[speaker] * k * t + rng.uniform(0, 6.3)) / k for k in (1, 2, 3))
        envelope = 0.5 - 0.5 * np.cos(2 * np.pi * t / t[-1])
        wave = 0.3 * envelope * tones / 1.84 + 0.01 * rng.standard_normal(n)
        name = f"utt{i:04d}"
        soundfile.write(folder / f"{name}.wav", wave.astype(np.float32), CLIP_RATE, subtype="PCM_16")
        line = {"id": name, "audio": f"{name}.wav", "text": text, "speaker": f"spk{speaker}"}
        if language is not None:
            line["language"] = language
        lines.append(json.dumps(line, ensure_ascii=False))
    corpus = folder / "corpus.jsonl"
    atomic_write_text(corpus, "\n".join(lines) + "\n")
    return corpus

