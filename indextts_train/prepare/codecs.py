"""Semantic codes from normalised w2v-BERT layer-17 features: the two codecs' quantize paths.

IndexTTS2 stores the MaskGCT `RepCodec` codes (50 Hz, one per feature frame); IndexTTS-2.5 its
`EnhancedCodec` codes (a stride-2 conv first: 25 Hz, ceil(T / 2) codes). Both are the same
ConvNeXt (Vocos) encoder and one factorised, L2-normalised vector quantiser (reference README
sections 4 and 6), implemented here on the weight tensors; the decoders are in the files but unused.

Padding is never masked inside these codecs (each conv reaches 3 frames to each side), so a clip
must be quantised alone, or in a batch of clips of exactly its length, to get the codes official
batch-size-1 inference gets. Weights load strictly: every expected key with its shape, no other key.
"""

from __future__ import annotations

import io
from abc import ABC, abstractmethod
from collections.abc import Mapping
from dataclasses import asdict, dataclass, fields
from pathlib import Path

import torch
import torch.nn.functional as F

from indextts_train.config.family import INDEXTTS2, INDEXTTS25, Family
from indextts_train.errors import UserError
from indextts_train.files.atomic import atomic_write_bytes
from indextts_train.files.numpy_pickle import load_weights_only
from indextts_train.model.conditioning import full_float32 as exact_float32  # TF32 off: see its docstring

LAYER_NORM_EPS = 1e-6  # Vocos backbone: every LayerNorm
SECTION = "semantic_codec"  # the config.yaml section both families describe their codec in
CODEC_MAX_SIZE = 1 << 16  # far above the official codec's sizes (at most 8192)
CODEC_MAX_LAYERS = 256  # the official Vocos backbone has 12


@dataclass(frozen=True)
class CodecConfig:
    """The `semantic_codec:` section; defaults are the official classes' constructor defaults."""

    codebook_size: int = 8192
    hidden_size: int = 1024
    codebook_dim: int = 8
    vocos_dim: int = 384
    vocos_intermediate_dim: int = 2048
    vocos_num_layers: int = 12
    num_quantizers: int = 1
    downsample_scale: int = 1


def codec_config(section: Mapping, downsample_scale: int, where: str) -> CodecConfig:
    """Validate a `semantic_codec:` section; `downsample_scale` is the family's default (1 or 2)."""
    if not isinstance(section, Mapping):
        raise UserError(f"{where}: the {SECTION} section must be a mapping of sizes")
    names = [f.name for f in fields(CodecConfig)]
    unknown = sorted(str(k) for k in section if k not in names)
    if unknown:
        raise UserError(f"{where}: {SECTION}.{unknown[0]} is not a codec setting; known: {', '.join(names)}")
    values = {"downsample_scale": downsample_scale, **section}
    for name, value in values.items():
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise UserError(f"{where}: {SECTION}.{name} must be a positive integer, not {value!r}")
        limit = CODEC_MAX_LAYERS if name.endswith("_layers") else CODEC_MAX_SIZE
        if value > limit:  # checked before anything is built: a typo is one line, not minutes of building
            raise UserError(f"{where}: {SECTION}.{name} is {value}, past {limit}; the official codec's is "
                            f"{getattr(CodecConfig(), name)}")
    cfg = CodecConfig(**values)
    if cfg.num_quantizers != 1:
        raise UserError(f"{where}: {SECTION}.num_quantizers is {cfg.num_quantizers}; the GPT reads one code stream (1)")
    if cfg.downsample_scale != downsample_scale:
        raise UserError(f"{where}: {SECTION}.downsample_scale is {cfg.downsample_scale}; this family's codec "
                        f"runs at {downsample_scale}")
    return cfg


def _backbone_shapes(prefix: str, cfg: CodecConfig) -> dict[str, tuple[int, ...]]:
    dim, hidden, inner = cfg.vocos_dim, cfg.hidden_size, cfg.vocos_intermediate_dim
    shapes = {f"{prefix}.0.embed.weight": (dim, hidden, 7), f"{prefix}.0.embed.bias": (dim,),
              f"{prefix}.0.norm.weight": (dim,), f"{prefix}.0.norm.bias": (dim,)}
    for i in range(cfg.vocos_num_layers):
        block = f"{prefix}.0.convnext.{i}"
        shapes.update({
            f"{block}.dwconv.weight": (dim, 1, 7), f"{block}.dwconv.bias": (dim,),
            f"{block}.norm.weight": (dim,), f"{block}.norm.bias": (dim,),
            f"{block}.pwconv1.weight": (inner, dim), f"{block}.pwconv1.bias": (inner,),
            f"{block}.pwconv2.weight": (dim, inner), f"{block}.pwconv2.bias": (dim,),
            f"{block}.gamma": (dim,),
        })
    shapes.update({f"{prefix}.0.final_layer_norm.weight": (dim,), f"{prefix}.0.final_layer_norm.bias": (dim,),
                   f"{prefix}.1.weight": (hidden, dim), f"{prefix}.1.bias": (hidden,)})
    return shapes


def codec_shapes(cfg: CodecConfig) -> dict[str, tuple[int, ...]]:
    """Every key and shape of the official codec's state dict (RepCodec / EnhancedCodec)."""
    hidden, code_dim = cfg.hidden_size, cfg.codebook_dim
    shapes: dict[str, tuple[int, ...]] = {}
    if cfg.downsample_scale > 1:
        shapes.update({"down.weight": (hidden, hidden, 3), "down.bias": (hidden,),
                       "up.weight": (hidden, hidden, 3), "up.bias": (hidden,)})
    shapes.update(_backbone_shapes("encoder", cfg))
    shapes.update(_backbone_shapes("decoder", cfg))
    quantizer = "quantizer.quantizers.0"
    shapes.update({
        f"{quantizer}.in_project.weight_g": (code_dim, 1, 1), f"{quantizer}.in_project.weight_v": (code_dim, hidden, 1),
        f"{quantizer}.in_project.bias": (code_dim,),
        f"{quantizer}.out_project.weight_g": (hidden, 1, 1), f"{quantizer}.out_project.weight_v": (hidden, code_dim, 1),
        f"{quantizer}.out_project.bias": (hidden,),
        f"{quantizer}.codebook.weight": (cfg.codebook_size, code_dim),
    })
    return shapes


def check_state(path: Path, found: Mapping[str, tuple[int, ...]], expected: Mapping[str, tuple[int, ...]],
                what: str) -> None:
    """One line naming the file and its first bad key when `found` is not exactly `expected`."""
    for key, shape in expected.items():
        if key not in found:
            raise UserError(f"{path}: key {key} is missing; not {what} of the configured size "
                            f"(check the file and the {SECTION}: section)")
        if tuple(found[key]) != tuple(shape):
            raise UserError(f"{path}: key {key} has shape {list(found[key])}, the {SECTION}: section expects "
                            f"{list(shape)}; not {what} of the configured size")
    for key in found:
        if key not in expected:
            raise UserError(f"{path}: unknown key {key}; not {what} (or not of the configured layout)")


def valid_code_count(n_valid_frames: int, frames_per_code: int) -> int:
    """Codes that belong to the first n valid 50 Hz frames: n at 50 Hz, ceil(n / 2) at 25 Hz."""
    return -(-n_valid_frames // frames_per_code)


class _Codec(ABC):
    """The quantize path of both official codecs, on plain tensors, without autograd."""

    frames_per_code = 1
    what = "a codec"

    @classmethod
    def load(cls, weights: Path, config: dict, device: torch.device) -> _Codec:
        """The codec of a release folder: its weights file and its config.yaml section."""
        cfg = codec_config(config, cls.frames_per_code, f"{SECTION} config")
        return cls(cls.read_weights(Path(weights), codec_shapes(cfg)), cfg, device)

    @classmethod
    @abstractmethod
    def read_weights(cls, path: Path, expected: Mapping[str, tuple[int, ...]]) -> dict[str, torch.Tensor]:
        """The weights file in this codec's official format, checked against `expected` shapes."""

    @staticmethod
    @abstractmethod
    def weights_bytes(state: dict[str, torch.Tensor]) -> bytes:
        """`state` in this codec's official file format."""

    def __init__(self, state: Mapping[str, torch.Tensor], cfg: CodecConfig, device: torch.device) -> None:
        self.cfg = cfg
        self.device = device
        self.weights = {k: v.to(device=device, dtype=torch.float32) for k, v in state.items()
                        if not k.startswith(("decoder.", "up.")) and "out_project" not in k}
        quantizer = "quantizer.quantizers.0"
        direction = self.weights[f"{quantizer}.in_project.weight_v"]  # (code_dim, H, 1)
        gain = self.weights[f"{quantizer}.in_project.weight_g"]  # (code_dim, 1, 1)
        # weight norm: each output channel's direction scaled to its gain
        self.in_project = (direction * (gain / direction.norm(dim=(1, 2), keepdim=True)))[:, :, 0]  # (code_dim, H)
        self.in_bias = self.weights[f"{quantizer}.in_project.bias"]
        self.codebook = F.normalize(self.weights[f"{quantizer}.codebook.weight"])  # (K, code_dim)

    def require_width(self, width: int, source: str) -> None:
        """One line, before any clip runs, when the features' width (w2v-BERT's) is not the codec's input."""
        if width != self.cfg.hidden_size:
            raise UserError(f"{source}: w2v-BERT features are {width} wide but the codec's {SECTION}.hidden_size "
                            f"is {self.cfg.hidden_size}; the codec and the w2v-BERT model do not belong together")

    def _backbone(self, x: torch.Tensor) -> torch.Tensor:
        """(B, H, T) -> (B, T, H): Vocos ConvNeXt encoder, then its Linear back to H."""
        w, dim = self.weights, self.cfg.vocos_dim
        x = F.conv1d(x, w["encoder.0.embed.weight"], w["encoder.0.embed.bias"], padding=3)  # (B, D, T)
        x = F.layer_norm(x.transpose(1, 2), (dim,), w["encoder.0.norm.weight"], w["encoder.0.norm.bias"],
                         LAYER_NORM_EPS).transpose(1, 2)
        for i in range(self.cfg.vocos_num_layers):
            p = f"encoder.0.convnext.{i}."
            y = F.conv1d(x, w[p + "dwconv.weight"], w[p + "dwconv.bias"], padding=3, groups=dim)  # (B, D, T)
            y = F.layer_norm(y.transpose(1, 2), (dim,), w[p + "norm.weight"], w[p + "norm.bias"], LAYER_NORM_EPS)
            y = F.linear(F.gelu(F.linear(y, w[p + "pwconv1.weight"], w[p + "pwconv1.bias"])),
                         w[p + "pwconv2.weight"], w[p + "pwconv2.bias"])  # (B, T, D)
            x = x + (w[p + "gamma"] * y).transpose(1, 2)
        x = F.layer_norm(x.transpose(1, 2), (dim,), w["encoder.0.final_layer_norm.weight"],
                         w["encoder.0.final_layer_norm.bias"], LAYER_NORM_EPS)  # (B, T, D)
        return F.linear(x, w["encoder.1.weight"], w["encoder.1.bias"])  # (B, T, H)

    def _front(self, x: torch.Tensor) -> torch.Tensor:
        """(B, T, H) -> (B, H, T') before the backbone; EnhancedCodec downsamples here."""
        return x.transpose(1, 2)

    def _nearest(self, x: torch.Tensor) -> torch.Tensor:
        """(B, T, H) -> (B, T) codebook index with the smallest L2-normalised distance (first on a tie)."""
        latents = F.normalize(F.linear(x, self.in_project, self.in_bias), dim=-1)  # (B, T, code_dim)
        # the official score, not a plain argmax of the dot product, so rounding matches it as closely
        distance = (latents.pow(2).sum(-1, keepdim=True) - 2 * latents @ self.codebook.t()
                    + self.codebook.pow(2).sum(-1))  # (B, T, K)
        return distance.argmin(dim=-1)

    def codes_batch(self, feats: torch.Tensor) -> torch.Tensor:
        """(B, T, H) -> (B, T') int64 on the CPU. Every row must be a whole clip of length T:
        padding a shorter clip changes its last codes (see the module docstring)."""
        if feats.dim() != 3 or feats.shape[-1] != self.cfg.hidden_size or feats.shape[1] == 0:
            raise ValueError(f"codec input must be (B, T>0, {self.cfg.hidden_size}), got {tuple(feats.shape)}")
        with torch.no_grad(), exact_float32():  # not inference_mode: callers may edit the codes in place
            x = feats.to(device=self.device, dtype=torch.float32)
            return self._nearest(self._backbone(self._front(x))).to("cpu", torch.int64)

    def codes(self, feat: torch.Tensor) -> torch.Tensor:
        """(T, H) features of one clip -> its codes, (T,) at 50 Hz or (ceil(T / 2),) at 25 Hz."""
        if feat.dim() != 2:
            raise ValueError(f"codes() takes one clip (T, H), got {tuple(feat.shape)}")
        return self.codes_batch(feat[None])[0]


class SemanticCodec(_Codec):
    """IndexTTS2: MaskGCT RepCodec (`semantic_codec/model.safetensors`), 50 Hz."""

    frames_per_code = 1
    what = "the MaskGCT semantic codec (semantic_codec/model.safetensors)"

    @classmethod
    def read_weights(cls, path: Path, expected: Mapping[str, tuple[int, ...]]) -> dict[str, torch.Tensor]:
        return _read_safetensors(path, expected, cls.what)

    @staticmethod
    def weights_bytes(state: dict[str, torch.Tensor]) -> bytes:
        from safetensors.torch import save

        return save(state)


class EnhancedCodec(_Codec):
    """IndexTTS-2.5: `codec.pth` ({"model": state_dict}), stride-2 conv + GELU first: 25 Hz."""

    frames_per_code = 2
    what = "an IndexTTS-2.5 codec.pth"

    @classmethod
    def read_weights(cls, path: Path, expected: Mapping[str, tuple[int, ...]]) -> dict[str, torch.Tensor]:
        return _read_codec_pth(path, expected, cls.what)

    @staticmethod
    def weights_bytes(state: dict[str, torch.Tensor]) -> bytes:
        buffer = io.BytesIO()
        torch.save({"model": state}, buffer)
        return buffer.getvalue()

    def _front(self, x: torch.Tensor) -> torch.Tensor:
        # quantize() keeps an odd last frame: its code sees the conv's zero padding, as official
        x = F.conv1d(x.transpose(1, 2), self.weights["down.weight"], self.weights["down.bias"], stride=2, padding=1)
        return F.gelu(x)  # (B, H, ceil(T / 2))


CODECS: dict[Family, type[_Codec]] = {INDEXTTS2: SemanticCodec, INDEXTTS25: EnhancedCodec}  # whose codes its GPT reads


def _read_safetensors(path: Path, expected: Mapping[str, tuple[int, ...]], what: str) -> dict[str, torch.Tensor]:
    from safetensors import safe_open

    if not path.is_file():
        raise UserError(f"{path}: no such file; expected {what}")
    try:
        with safe_open(str(path), framework="pt") as handle:
            found = {key: tuple(handle.get_slice(key).get_shape()) for key in handle.keys()}
            check_state(path, found, expected, what)
            return {key: handle.get_tensor(key) for key in expected}
    except UserError:
        raise
    except Exception as exc:  # SafetensorError, OSError: a truncated or foreign file
        raise UserError(f"{path}: not a readable safetensors file ({first_line(exc)}); expected {what}") from exc


def _read_codec_pth(path: Path, expected: Mapping[str, tuple[int, ...]], what: str) -> dict[str, torch.Tensor]:
    if not path.is_file():
        raise UserError(f"{path}: no such file; expected {what}")
    try:
        obj = load_weights_only(path)  # no pickled code from a downloaded file; inflation, elements, work bounded
    except Exception as exc:
        raise UserError(f"{path}: cannot be read as a weights-only torch file ({first_line(exc)}); "
                        f"expected {what}") from exc
    state = obj.get("model") if isinstance(obj, Mapping) else None
    if not isinstance(state, Mapping):
        raise UserError(f"{path}: has no 'model' state dict; expected {what} saved as {{'model': state_dict}}")
    bad = next((str(k) for k, v in state.items() if not isinstance(v, torch.Tensor)), None)
    if bad is not None:
        raise UserError(f"{path}: model entry {bad} is not a tensor; expected {what}")
    check_state(path, {k: tuple(v.shape) for k, v in state.items()}, expected, what)
    return dict(state)


def first_line(exc: BaseException) -> str:
    """An exception's message cut to its first line, for one-line errors."""
    return (str(exc).strip().splitlines() or [type(exc).__name__])[0]


TINY_SIZES = {"codebook_size": 64, "codebook_dim": 8, "vocos_dim": 16, "vocos_intermediate_dim": 24,
              "vocos_num_layers": 2}
REAL_SIZES = {name: getattr(CodecConfig(), name) for name in TINY_SIZES}  # the official classes' defaults


def _random_state(shapes: Mapping[str, tuple[int, ...]], seed: int) -> dict[str, torch.Tensor]:
    """Seeded weights that make a working (not degenerate) codec: fan-in scaled matrices, LayerNorms
    and gammas away from identity, so that a mistake in any term changes the codes."""
    generator = torch.Generator().manual_seed(seed)
    state = {}
    for key, shape in shapes.items():
        noise = torch.randn(shape, generator=generator, dtype=torch.float64)
        if len(shape) > 1 and not key.endswith("weight_g"):
            fan_in = shape[1] * (shape[2] if len(shape) > 2 else 1)
            value = noise / fan_in ** 0.5
        elif key.endswith(("norm.weight", "weight_g")):
            value = 1 + 0.1 * noise
        elif key.endswith("gamma"):
            value = 0.5 + 0.1 * noise
        else:
            value = 0.1 * noise
        state[key] = value.to(torch.float32).contiguous()
    return state


def write_tiny_codec(path: Path, family: Family, seed: int, hidden: int = 32, sizes: Mapping | None = None) -> dict:
    """Random tiny codec weights in the official file format of `family`'s codec; returns the config section.

    IndexTTS2: a safetensors file like MaskGCT's; IndexTTS-2.5: a torch file {"model": state_dict}
    like codec.pth. The same arguments give the same bytes; an existing file with other contents is
    never replaced. `sizes` (default TINY_SIZES; REAL_SIZES with hidden 1024 for the released codecs'
    shapes) sets everything but the hidden size.
    """
    codec = CODECS[family]
    section = {**(TINY_SIZES if sizes is None else sizes), "hidden_size": hidden}
    cfg = CodecConfig(**section, downsample_scale=codec.frames_per_code)
    write_new_bytes(Path(path), codec.weights_bytes(_random_state(codec_shapes(cfg), seed)))
    return {k: v for k, v in asdict(cfg).items() if k in section}


def write_new_bytes(path: Path, data: bytes) -> None:
    """Write `data` atomically, unless `path` already holds exactly these bytes; refuse other contents."""
    if path.exists():
        if path.is_file() and path.stat().st_size == len(data) and path.read_bytes() == data:
            return
        raise UserError(f"{path}: already exists with other contents; choose an empty folder for the tiny models")
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_bytes(path, data)
