"""w2v-BERT 2.0 layer-17 features, normalised with the model directory's statistics (`get_emb`).

transformers' `SeamlessM4TFeatureExtractor` and `Wav2Vec2BertModel` do the work, as in official
inference; this module adds what a training pipeline needs on top (reference README sections 2, 3):

- one padded forward for many clips, cut back to exactly the frames each clip gets alone (the
  model masks padding, so valid frames agree with the single-clip call to ~1.4e-5);
- only the first 17 conformer layers are kept (`hidden_states[17]` is their output), so the last
  seven of the real 24 are never run;
- the weights are checked against the model's layout before loading: a missing, misshapen or
  unknown key is one line naming the file and the key (from_pretrained would only log a warning
  and leave random weights in place).

transformers and safetensors belong to the optional `[prepare]` extra, so they are imported where used.
"""

from __future__ import annotations

import io
import json
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import torch

from indextts_train.errors import UserError
from indextts_train.files.bounded import parse_json, read_bounded
from indextts_train.files.numpy_pickle import load_weights_only
from indextts_train.prepare.audio import W2V_RATE, AudioError
from indextts_train.prepare.codecs import check_state, exact_float32, first_line, write_new_bytes

if TYPE_CHECKING:  # transformers is an optional extra: imported where used
    from transformers import SeamlessM4TFeatureExtractor

LAYER = 17  # IndexTTS2 get_emb: hidden_states[17], the output of the 17th conformer layer
STATS_FILE = "wav2vec2bert_stats.pt"
# facebook/w2v-bert-2.0 preprocessor_config.json (reference features/preprocessor_config.json); used
# when the model folder has none, e.g. a folder holding only config.json and model.safetensors.
EXTRACTOR_CONFIG = {
    "feature_extractor_type": "SeamlessM4TFeatureExtractor", "feature_size": 80, "num_mel_bins": 80,
    "padding_side": "right", "padding_value": 1, "processor_class": "Wav2Vec2BertProcessor",
    "return_attention_mask": True, "sampling_rate": 16000, "stride": 2,
}
FBANK_WINDOW, FBANK_HOP = 400, 160  # Kaldi frames of the extractor: 25 ms every 10 ms at 16 kHz
MIN_SAMPLES = FBANK_WINDOW + FBANK_HOP  # two fbank frames: one joined frame with a valid mask


def w2vbert_frames(n_samples: int) -> tuple[int, int]:
    """(frames, valid frames) of one 16 kHz clip alone: fbank frames joined in pairs, a joined
    frame valid when its second half is real (so an odd fbank count leaves a masked last frame)."""
    fbank = 1 + (n_samples - FBANK_WINDOW) // FBANK_HOP if n_samples >= FBANK_WINDOW else 0
    return (fbank + 1) // 2, fbank // 2


@dataclass
class FeatureBatch:
    """The extractor's output for a list of clips, padded as its own padded call pads."""

    values: torch.Tensor  # (B, T, 160) float32: padding rows hold the extractor's padding_value
    mask: torch.Tensor  # (B, T) int32: 1 on valid joined frames
    frames: list[int]  # per clip: joined frames of the single-clip call (the masked half frame included)


def _read_stats(path: Path, width: int) -> tuple[torch.Tensor, torch.Tensor]:
    if not path.is_file():
        raise UserError(f"{path}: no such file; expected the w2v-BERT statistics ({STATS_FILE})")
    try:
        stats = load_weights_only(path)  # no pickled code; inflation, elements and work bounded
    except Exception as exc:
        raise UserError(f"{path}: cannot be read as a weights-only torch file ({first_line(exc)}); "
                        f"expected {STATS_FILE}") from exc
    for key in ("mean", "var"):
        value = stats.get(key) if isinstance(stats, dict) else None
        if not isinstance(value, torch.Tensor) or tuple(value.shape) != (width,):
            raise UserError(f"{path}: needs a float tensor '{key}' of shape [{width}] (the w2v-BERT width); "
                            f"is this the {STATS_FILE} of this model?")
    mean, var = stats["mean"].float(), stats["var"].float()
    if not torch.isfinite(mean).all() or not (var > 0).all():
        raise UserError(f"{path}: 'var' must be positive and 'mean' finite")
    return mean, torch.sqrt(var)


def _weight_files(model_dir: Path) -> list[Path]:
    single = model_dir / "model.safetensors"
    if single.is_file():
        return [single]
    index = model_dir / "model.safetensors.index.json"
    if index.is_file():
        try:
            shards = sorted(set(parse_json(read_bounded(index, 16 << 20, "safetensors index"), str(index))
                                ["weight_map"].values()))
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
            raise UserError(f"{index}: not a safetensors index ({first_line(exc)})") from exc
        return [model_dir / name for name in shards]
    raise UserError(f"{model_dir}: no model.safetensors; expected the Hugging Face folder of facebook/w2v-bert-2.0")


def _read_weights(model_dir: Path, expected: dict[str, tuple[int, ...]], needed: set[str]) -> dict[str, torch.Tensor]:
    """The `needed` tensors of the folder's safetensors file(s), after a strict check of every key and shape."""
    from safetensors import safe_open

    files = _weight_files(model_dir)
    shapes: dict[str, tuple[int, ...]] = {}
    state: dict[str, torch.Tensor] = {}
    for reading in (False, True):  # all headers are checked before any tensor is read
        if reading:
            check_state(files[0] if len(files) == 1 else model_dir, shapes, expected,
                        "a Wav2Vec2BertModel of config.json")
        for path in files:
            try:
                with safe_open(str(path), framework="pt") as handle:
                    for key in handle.keys():
                        if not reading:
                            shapes[key] = tuple(handle.get_slice(key).get_shape())
                        elif key in needed:
                            state[key] = handle.get_tensor(key)
            except Exception as exc:  # SafetensorError, OSError: a truncated or foreign file
                raise UserError(f"{path}: not a readable safetensors file ({first_line(exc)}); "
                                "expected w2v-BERT weights") from exc
    return state


# Upper ends of a w2v-BERT config.json's sizes, checked before anything is built: far above the
# released model (24 layers, width 1024, 16 heads, 4096 inner), so that a hostile or mistyped config
# (100,000 layers) is one line, not minutes of building; any other integer is bounded by CONFIG_INT_MAX.
CONFIG_MAX = {"num_hidden_layers": 128, "hidden_size": 8192, "num_attention_heads": 256, "intermediate_size": 65536,
              "output_hidden_size": 8192, "feature_projection_input_dim": 8192, "num_adapter_layers": 64}
CONFIG_INT_MAX = 1 << 20


def check_config_sizes(model_dir: Path) -> None:
    """One line naming config.json and the key when a size is past CONFIG_MAX (or CONFIG_INT_MAX)."""
    path = model_dir / "config.json"
    try:
        config = parse_json(read_bounded(path, 1 << 20, "w2v-BERT config.json"), str(path))
    except ValueError:
        return  # not JSON: nothing can be built from it, and building it says so (_build_model)
    for key, value in config.items() if isinstance(config, dict) else ():
        values = value if isinstance(value, list) else [value]
        limit = CONFIG_MAX.get(key, CONFIG_INT_MAX)
        odd = next((v for v in values if type(v) is int and abs(v) > limit), None)
        if odd is not None:
            raise UserError(f"{path}: {key} is {odd}, past {limit} (the released w2v-BERT: 24 layers, width "
                            "1024); is this the facebook/w2v-bert-2.0 config.json?")


def _build_model(model_dir: Path) -> torch.nn.Module:
    from transformers import Wav2Vec2BertConfig, Wav2Vec2BertModel

    check_config_sizes(model_dir)
    try:
        config = Wav2Vec2BertConfig.from_pretrained(str(model_dir), local_files_only=True)
    except Exception as exc:
        raise UserError(f"{model_dir}: no readable w2v-BERT config.json ({first_line(exc)})") from exc
    if config.num_hidden_layers < LAYER:
        raise UserError(f"{model_dir}/config.json: num_hidden_layers is {config.num_hidden_layers}; "
                        f"layer {LAYER} features need at least {LAYER}")
    with torch.device("meta"):  # no random init: every tensor comes from the file
        model = Wav2Vec2BertModel(config)
    expected = {k: tuple(v.shape) for k, v in model.state_dict().items()}
    model.encoder.layers = model.encoder.layers[:LAYER]  # later layers never reach layer 17: not even read
    model.load_state_dict(_read_weights(model_dir, expected, set(model.state_dict())), strict=True, assign=True)
    return model.eval()


def _build_extractor(model_dir: Path) -> SeamlessM4TFeatureExtractor:
    from transformers import SeamlessM4TFeatureExtractor

    if (model_dir / "preprocessor_config.json").is_file():
        try:
            return SeamlessM4TFeatureExtractor.from_pretrained(str(model_dir), local_files_only=True)
        except Exception as exc:
            raise UserError(f"{model_dir}/preprocessor_config.json: unreadable ({first_line(exc)})") from exc
    settings = {k: v for k, v in EXTRACTOR_CONFIG.items() if k not in ("feature_extractor_type", "processor_class")}
    return SeamlessM4TFeatureExtractor(**settings)


class W2vBert:
    """The w2v-BERT feature extractor and model, and the statistics that normalise layer 17."""

    def __init__(self, model: torch.nn.Module, extractor: SeamlessM4TFeatureExtractor, mean: torch.Tensor,
                 std: torch.Tensor, device: torch.device, dtype: torch.dtype) -> None:
        self.model = model.to(device=device, dtype=dtype)
        self.extractor = extractor
        self.mean, self.std = mean.to(device), std.to(device)
        self.device, self.dtype = device, dtype
        self.width = int(mean.shape[0])

    @classmethod
    def load(cls, model_dir: Path, stats: Path, device: torch.device, dtype: torch.dtype = torch.float32) -> W2vBert:
        """`model_dir`: the Hugging Face folder (config.json, model.safetensors, preprocessor_config.json
        when present); `stats`: the model directory's wav2vec2bert_stats.pt ({"mean", "var"}).

        `dtype` other than float32 is outside the l17 tolerance (1e-4): bfloat16 moved the tiny
        model's features by 0.30 on the CPU. Keep float32 unless a measurement says otherwise.
        """
        model_dir = Path(model_dir)
        model = _build_model(model_dir)
        mean, std = _read_stats(Path(stats), int(model.config.hidden_size))
        return cls(model, _build_extractor(model_dir), mean, std, device, dtype)

    def input_features(self, waves: list[np.ndarray]) -> FeatureBatch:
        """The extractor on each clip alone, padded to one batch exactly as its padded call pads."""
        singles = []
        for index, wave in enumerate(waves):
            if wave.ndim != 1 or wave.shape[0] < MIN_SAMPLES:
                raise AudioError(f"clip {index}: {wave.shape[-1] if wave.ndim else 0} samples at 16 kHz is too "
                                 f"short for w2v-BERT (needs {MIN_SAMPLES}, one valid frame)")
            out = self.extractor(np.asarray(wave, dtype=np.float32), sampling_rate=W2V_RATE, return_tensors="np",
                                 return_attention_mask=True)
            singles.append((out["input_features"][0], out["attention_mask"][0]))  # (T, 160), (T,)
        frames = [values.shape[0] for values, _ in singles]
        longest = max(frames)  # ceil(fbank / 2) of the longest clip: the padded call's length
        values = np.full((len(singles), longest, singles[0][0].shape[1]), self.extractor.padding_value, np.float32)
        mask = np.zeros((len(singles), longest), dtype=np.int32)
        for row, (clip_values, clip_mask) in enumerate(singles):
            values[row, : clip_values.shape[0]] = clip_values
            mask[row, : clip_mask.shape[0]] = clip_mask
        return FeatureBatch(torch.from_numpy(values), torch.from_numpy(mask), frames)

    def layer17(self, waves: list[np.ndarray]) -> list[tuple[torch.Tensor, int]]:
        """One padded forward over `waves` (16 kHz float32); per clip its normalised layer-17
        features on the frames the single-clip call has, (T, H) float32 on the CPU, and n_valid."""
        if not waves:
            return []
        batch = self.input_features(waves)
        with torch.no_grad(), exact_float32():  # not inference_mode: the features go on to other models
            values = batch.values.to(self.device, self.dtype)  # (B, T, 160)
            mask = batch.mask.to(self.device)  # (B, T)
            hidden, _ = self.model.feature_projection(values)  # (B, T, H)
            hidden = self.model.encoder(hidden, attention_mask=mask).last_hidden_state  # (B, T, H) after layer 17
            normalised = ((hidden.float() - self.mean) / self.std).cpu()
        n_valid = batch.mask.sum(dim=1).tolist()
        return [(normalised[row, :frames].clone(), int(n_valid[row])) for row, frames in enumerate(batch.frames)]


@dataclass(frozen=True)
class W2vBertSizes:
    """The sizes of a written w2v-BERT; `perturb` scales the noise added to every weight after init."""

    layers: int
    heads: int
    intermediate: int | None  # None: the hidden size
    perturb: float


# 18 layers as the oracle: layer 17 is then not the last hidden state, so a wrong index shows
TINY_SIZES = W2vBertSizes(layers=LAYER + 1, heads=2, intermediate=None, perturb=0.1)
# facebook/w2v-bert-2.0 (hidden 1024): 24 layers, 16 heads, intermediate 4096; transformers' own init,
# unperturbed (noise of 0.1 on 1024-wide matrices would blow the activations up)
REAL_SIZES = W2vBertSizes(layers=24, heads=16, intermediate=4096, perturb=0.0)
REAL_WIDTH = 1024


def _perturbed_model(hidden: int, seed: int, sizes: W2vBertSizes = TINY_SIZES) -> torch.nn.Module:
    from transformers import Wav2Vec2BertConfig, Wav2Vec2BertModel

    config = Wav2Vec2BertConfig(hidden_size=hidden, num_hidden_layers=sizes.layers, num_attention_heads=sizes.heads,
                                intermediate_size=sizes.intermediate or hidden, output_hidden_size=hidden,
                                conv_depthwise_kernel_size=31)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = Wav2Vec2BertModel(config)
    if not sizes.perturb:
        return model
    generator = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():  # without this, LayerNorms are identities and many mistakes would not show
        for _, parameter in model.named_parameters():
            parameter.add_(sizes.perturb * torch.randn(parameter.shape, generator=generator))
    return model


def write_tiny_w2vbert(out_dir: Path, seed: int, hidden: int = 32, sizes: W2vBertSizes = TINY_SIZES) -> None:
    """A tiny random w2v-BERT in the Hugging Face layout (config.json, model.safetensors,
    preprocessor_config.json) plus wav2vec2bert_stats.pt, all in `out_dir`. Seeded: the same
    arguments give the same bytes; an existing file with other contents is never replaced.
    `sizes=REAL_SIZES` with `hidden=REAL_WIDTH`: the real model's shapes (2.3 GB of random weights)."""
    from safetensors.torch import save

    if hidden < 2 or hidden % 2:
        raise ValueError(f"hidden must be an even number >= 2 (two attention heads), not {hidden}")
    if hidden % sizes.heads:
        raise ValueError(f"hidden {hidden} is not a multiple of {sizes.heads} attention heads")
    out_dir = Path(out_dir)
    model = _perturbed_model(hidden, seed, sizes)
    weights = save({k: v.contiguous() for k, v in model.state_dict().items()}, metadata={"format": "pt"})
    generator = torch.Generator().manual_seed(seed + 2)
    stats = {"mean": 0.5 * torch.randn(hidden, generator=generator),
             "var": 0.05 + 2 * torch.rand(hidden, generator=generator)}
    buffer = io.BytesIO()
    torch.save(stats, buffer)
    write_new_bytes(out_dir / "config.json", model.config.to_json_string().encode("utf-8"))
    write_new_bytes(out_dir / "model.safetensors", weights)
    write_new_bytes(out_dir / "preprocessor_config.json", (json.dumps(EXTRACTOR_CONFIG, indent=2) + "\n").encode())
    write_new_bytes(out_dir / STATS_FILE, buffer.getvalue())
