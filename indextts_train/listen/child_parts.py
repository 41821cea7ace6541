"""Seeded random s2mel.pth and BigVGAN for a stand-in model folder: `PYTHON child_parts.py FAMILY MODEL_DIR SEED`.

Run by the inference environment's interpreter, by file path (like child_infer.py: standard library,
the official package and its own dependencies only). The official inference builds these two models
from its own classes and the folder's config (config.yaml's `s2mel:` section, hf_cache/bigvgan/
config.json), so their random stand-ins are made by the same classes: the state dicts then have
exactly the keys and shapes the official loaders read, at whatever size the config asks for (tiny for
the tests, the released sizes for the benchmark). Nothing here is trained; the weights are noise.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path


def _save(obj, path: Path) -> None:
    import torch

    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    torch.save(obj, temporary)
    os.replace(temporary, path)


def _classes_v25():
    """(s2mel model factory, BigVGAN factory) of IndexTTS-2.5's official package."""
    from indextts25.s2mel.modules.bigvgan.bigvgan import BigVGAN
    from indextts25.s2mel.modules.bigvgan.env import AttrDict
    from indextts25.s2mel.modules.commons import MyModel

    return MyModel, lambda h: BigVGAN(AttrDict(h))


def _classes_v2():
    """(s2mel model factory, BigVGAN factory) of IndexTTS2's official package."""
    from indextts.s2mel.modules.bigvgan.bigvgan import BigVGAN
    from indextts.s2mel.modules.bigvgan.env import AttrDict
    from indextts.s2mel.modules.commons import MyModel

    # IndexTTS2 builds its s2mel with the GPT-latent projection (infer_v2: use_gpt_latent=True)
    return (lambda args: MyModel(args, use_gpt_latent=True)), (lambda h: BigVGAN(AttrDict(h), use_cuda_kernel=False))


# FAMILY (Family.key, which this process cannot import) -> the factories of its official package.
CLASSES = {"indextts2.5": _classes_v25, "indextts2": _classes_v2}


def write_parts(family: str, model_dir: Path, seed: int) -> None:
    import torch
    from omegaconf import OmegaConf

    config = OmegaConf.load(model_dir / "config.yaml")
    make_s2mel, make_vocoder = CLASSES[family]()
    torch.manual_seed(seed)
    s2mel = make_s2mel(config.s2mel)
    _save({"net": {name: module.state_dict() for name, module in s2mel.models.items()}},
          model_dir / str(config.s2mel_checkpoint))
    vocoder_dir = model_dir / "hf_cache" / "bigvgan"
    hparams = json.loads((vocoder_dir / "config.json").read_text(encoding="utf-8"))
    torch.manual_seed(seed + 1)
    _save({"generator": make_vocoder(hparams).state_dict()}, vocoder_dir / "bigvgan_generator.pt")


if __name__ == "__main__":
    write_parts(sys.argv[1], Path(sys.argv[2]), int(sys.argv[3]))
