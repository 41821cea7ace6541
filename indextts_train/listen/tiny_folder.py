"""Stand-in official model folders that the real inference packages load: tiny for the tests and the demo,
or at the released sizes for the benchmark. Every weight is seeded noise.

`prepare/tiny.py` writes what `prepare` reads (GPT, w2v-BERT, codec, CAMPPlus, tokenizer); inference
also reads the s2mel stage, BigVGAN, the emotion/speaker matrices (feat1.pt, feat2.pt) and, for
IndexTTS2, the Qwen emotion model. s2mel and BigVGAN are made by the official package's own classes in
the inference environment (`child_parts.py`), so their keys are the ones its loaders read. The official
classes fix two widths: w2v-BERT features are 1024 wide (both GPTs' conditioning encoders), and
IndexTTS2's GPT is 1280 wide (its s2mel projects the GPT latent from 1280); the stand-ins have those
widths and are thin everywhere else.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import torch
import yaml

from indextts_train.config.family import Family
from indextts_train.config.settings import load_config
from indextts_train.errors import UserError
from indextts_train.files.atomic import atomic_write, atomic_write_text
from indextts_train.files.bounded import load_yaml
from indextts_train.prepare.tiny import write_tiny_model_dir

CHILD_PARTS = Path(__file__).with_name("child_parts.py")
ROOT = Path(__file__).resolve().parents[2]
VOCODER_ID = "nvidia/bigvgan_v2_22khz_80band_256x"
QWEN_DIR = "qwen0.6bemo4-merge"
EMO_NUM_REAL = [3, 17, 2, 8, 4, 5, 10, 24]  # the released feat1/feat2 rows per emotion
EMO_NUM_TINY = [1] * 8
STYLE_DIM = 192  # CAMPPlus' embedding, fixed in both packages
# Fixed by the official classes: both GPTs' conditioning encoders read 1024-wide w2v-BERT features, and
# IndexTTS2's s2mel projects a 1280-wide GPT latent onto them (gpt_layer)
W2V_WIDTH = 1024
PARTS_TIMEOUT_S = 1800

MEL = {"sr": 22050, "spect_params": {"n_fft": 1024, "win_length": 1024, "hop_length": 256, "n_mels": 80,
                                     "fmin": 0, "fmax": "None"}}


def s2mel_section(in_channels: int, real_size: bool) -> dict:
    """config.yaml's `s2mel:` section: IndexTTS2's released one, or the same shape rules at a tiny size."""
    channels, hidden, heads, depth, layers = (512, 512, 8, 13, 8) if real_size else (32, 32, 2, 2, 2)
    codebook = 1024 if real_size else 16
    return {
        "preprocess_params": MEL, "dit_type": "DiT", "reg_loss_type": "l1", "style_encoder": {"dim": STYLE_DIM},
        "length_regulator": {"channels": channels, "is_discrete": False, "in_channels": in_channels,
                             "content_codebook_size": 2 * codebook, "sampling_ratios": [1, 1, 1, 1],
                             "vector_quantize": False, "n_codebooks": 1, "quantizer_dropout": 0.0,
                             "f0_condition": False, "n_f0_bins": 512},
        "DiT": {"hidden_dim": hidden, "num_heads": heads, "depth": depth, "class_dropout_prob": 0.1,
                "block_size": 8192, "in_channels": MEL["spect_params"]["n_mels"], "style_condition": True,
                "final_layer_type": "wavenet", "target": "mel", "content_dim": channels,
                "content_codebook_size": codebook, "content_type": "discrete", "f0_condition": False,
                "n_f0_bins": 512, "content_codebooks": 1, "is_causal": False, "long_skip_connection": True,
                "zero_prompt_speech_token": False, "time_as_token": False, "style_as_token": False,
                "uvit_skip_connection": True, "add_resblock_in_transformer": False},
        "wavenet": {"hidden_dim": hidden, "num_layers": layers, "kernel_size": 5, "dilation_rate": 1,
                    "p_dropout": 0.2, "style_condition": True},
    }


def bigvgan_config(real_size: bool) -> dict:
    """The generator fields of BigVGAN's config.json: the 22 kHz, 80-band, 256x release, or a thin one with the
    same hop (256 samples per mel frame)."""
    if real_size:
        shape = {"upsample_rates": [4, 4, 2, 2, 2, 2], "upsample_kernel_sizes": [8, 8, 4, 4, 4, 4],
                 "upsample_initial_channel": 1536, "resblock_kernel_sizes": [3, 7, 11],
                 "resblock_dilation_sizes": [[1, 3, 5], [1, 3, 5], [1, 3, 5]]}
    else:
        shape = {"upsample_rates": [8, 8, 4], "upsample_kernel_sizes": [16, 16, 8], "upsample_initial_channel": 32,
                 "resblock_kernel_sizes": [3], "resblock_dilation_sizes": [[1, 3, 5]]}
    return {"resblock": "1", **shape, "use_tanh_at_final": False, "use_bias_at_final": False,
            "activation": "snakebeta", "snake_logscale": True, "num_mels": MEL["spect_params"]["n_mels"],
            "n_fft": 1024, "hop_size": 256, "win_size": 1024, "sampling_rate": MEL["sr"], "fmin": 0, "fmax": None}


def _matrices(model_dir: Path, model_dim: int, emo_num: list[int], seed: int) -> None:
    """feat1.pt (speaker styles) and feat2.pt (emotion vectors): rows per emotion, read at load time."""
    generator = torch.Generator().manual_seed(seed)
    rows = sum(emo_num)
    spk, emo = torch.randn(rows, STYLE_DIM, generator=generator), torch.randn(rows, model_dim, generator=generator)
    atomic_write(model_dir / "feat1.pt", lambda handle: torch.save(spk, handle))
    atomic_write(model_dir / "feat2.pt", lambda handle: torch.save(emo, handle))


def _inference_config(raw: dict, family: Family, real_size: bool) -> dict:
    """config.yaml with the sections and file names the official inference reads besides `gpt:`."""
    raw["s2mel"] = s2mel_section(int(raw["semantic_codec"]["hidden_size"]), real_size)
    raw.update(gpt_checkpoint="gpt.pth", w2v_stat="wav2vec2bert_stats.pt", s2mel_checkpoint="s2mel.pth",
               emo_matrix="feat2.pt", spk_matrix="feat1.pt", emo_num=EMO_NUM_REAL if real_size else EMO_NUM_TINY)
    if family.hub_parts:
        raw["qwen_emo_path"] = f"{QWEN_DIR}/"
        raw["vocoder"] = {"type": "bigvgan", "name": VOCODER_ID}
        raw.setdefault("dataset", {})["bpe_model"] = family.tokenizer_name
    return raw


def add_inference_parts(model_dir: Path, *, inference_python: Path, seed: int = 0, real_size: bool = False) -> Path:
    """Complete a folder of `prepare.tiny.write_tiny_model_dir(inference=True)` into one the official inference
    loads: config sections, feat1/feat2, s2mel.pth and BigVGAN (by the official classes, under
    `inference_python`) and, for IndexTTS2, the emotion model. Returns model_dir."""
    config_path = model_dir / "config.yaml"
    family = load_config(config_path).gpt.family
    raw = _inference_config(load_yaml(config_path, "config"), family, real_size)
    atomic_write_text(config_path, yaml.safe_dump(raw, sort_keys=False))
    _matrices(model_dir, int(raw["gpt"]["model_dim"]), raw["emo_num"], seed + 3)
    vocoder = model_dir / "hf_cache" / "bigvgan"
    vocoder.mkdir(parents=True, exist_ok=True)
    atomic_write_text(vocoder / "config.json", json.dumps(bigvgan_config(real_size), indent=2) + "\n")
    _make_parts(inference_python, family, model_dir, seed + 4)
    if family.hub_parts:
        from indextts_train.listen.tiny_qwen import write_tiny_qwen

        write_tiny_qwen(model_dir / QWEN_DIR, seed + 5)
    return model_dir


def _make_parts(inference_python: Path, family: Family, model_dir: Path, seed: int) -> None:
    """s2mel.pth and BigVGAN by the official classes (child_parts.py), or one line: an environment that imports
    the package's API but not its s2mel / BigVGAN modules (or omegaconf) ended the demo in two tracebacks."""
    command = [str(inference_python), str(CHILD_PARTS), family.key, str(model_dir), str(seed)]
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=PARTS_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        why = f"it did not finish in {PARTS_TIMEOUT_S} s"
    except OSError as exc:
        why = f"it could not be started ({exc.strerror or type(exc).__name__})"
    else:
        if done.returncode == 0:
            return
        tail = [line.strip() for line in done.stderr.splitlines() if line.strip()]
        why = f"exit {done.returncode}: {tail[-1][:300] if tail else 'no output'}"
    raise UserError(f"{inference_python} could not make the s2mel and BigVGAN weights of {model_dir} with the "
                    f"official {family.name} classes ({why}); install {family.inference_package} whole into "
                    f"that environment (bash scripts/install_inference.sh {family.key} VENV), or use another one")


def tiny_gpt_config(family: Family, folder: Path) -> Path:
    """The GPT config of a family's stand-in inference folder (IndexTTS2's is widened to the 1280 its
    s2mel takes, one layer)."""
    if family.inference_gpt_width is None:
        return ROOT / family.tiny_config
    raw = load_yaml(ROOT / family.tiny_config, "config")
    raw["gpt"].update(model_dim=family.inference_gpt_width, heads=20, layers=1)
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "gpt_config_v2_inference.yaml"
    atomic_write_text(path, yaml.safe_dump(raw, sort_keys=False))
    return path


def write_tiny_inference_dir(model_dir: Path, family: Family, *, tokenizer: Path, inference_python: Path,
                             seed: int = 0, work: Path, gpt_config: Path | None = None) -> Path:
    """A whole tiny official-layout inference folder of `family` (the tokenizer: the tiny config's base
    vocabulary); `work` holds the generated GPT config. `gpt_config`: another GPT config of the inference
    widths instead (e.g. tiny_gpt_config's with fewer codes a line). Returns model_dir."""
    write_tiny_model_dir(model_dir, gpt_config=gpt_config or tiny_gpt_config(family, work), tokenizer=tokenizer,
                         seed=seed, width=W2V_WIDTH, inference=True)
    return add_inference_parts(model_dir, inference_python=inference_python, seed=seed)
