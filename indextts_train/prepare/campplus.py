"""IndexTTS-2.5's speaker vector: the Kaldi fbank and the CAMPPlus speaker encoder, in our own torch code.

The 2.5 inference computes `CAMPPlus(fbank - fbank.mean(0))` on the speaker-path 16 kHz waveform
and stores the raw 192 values (the GPT's `spk_emb_proj` maps them). The rules are those of
`tests/data/reference/prepare/README.md`, section 7:
- fbank: Kaldi defaults as `torchaudio.compliance.kaldi.fbank(num_mel_bins=80, dither=0)` applies
  them (torchaudio is not a dependency: its wheels are locked to one torch version);
- CAMPPlus: the eval-mode forward of the official class, run here as plain functions over the state
  dict, whose key names and shapes are those of `campplus_cn_common.bin`. The network's sizes
  (channels, growth rate, bottleneck, embedding) are read from the weights; the depth, kernels,
  dilations and strides are fixed by the class.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor

from indextts_train.errors import UserError
from indextts_train.files.numpy_pickle import load_weights_only
from indextts_train.model.conditioning import full_float32

# Kaldi fbank settings (the torchaudio defaults that matter, at 16 kHz).
SAMPLE_RATE = 16_000
FRAME_LENGTH = 400  # 25 ms
FRAME_SHIFT = 160  # 10 ms
FFT_SIZE = 512  # the frame length rounded up to a power of two
MEL_BINS = 80
LOW_HZ = 20.0  # the top edge is the Nyquist frequency
PREEMPHASIS = 0.97
POVEY_EXPONENT = 0.85  # Kaldi's "povey" window: a symmetric Hann window to this power
LOG_FLOOR = torch.finfo(torch.float32).eps  # 1.1920928955078125e-07

# What the CAMPPlus class fixes rather than reading from its arguments.
HEAD_STAGES = 2  # residual stages, each of two blocks; the first block of a stage strides the mel axis
HEAD_BLOCKS = 2
MEL_AFTER_HEAD = 10  # 80 mel bins after three stride-2 convolutions
TDNN_KERNEL = 5
TDNN_STRIDE = 2
DENSE_LAYERS = (12, 24, 16)
DENSE_DILATIONS = (1, 2, 2)
DENSE_KERNEL = 3
CAM_SEGMENT = 100  # context-aware masking averages over segments of this many frames
BN_EPS = 1e-5
# Statistics pooling takes an unbiased std over TDNN frames, which needs two of them: three fbank
# frames, i.e. 720 samples. Shorter input would give NaN (the official code does not check).
MIN_FBANK_FRAMES = 3
MIN_SAMPLES = FRAME_LENGTH + (MIN_FBANK_FRAMES - 1) * FRAME_SHIFT
MAX_WEIGHTS_BYTES = 1 << 30  # campplus_cn_common.bin is 28 MB; a larger file is not a speaker encoder


def _mel(hz: Tensor | float) -> Tensor | float:
    """Kaldi's mel scale."""
    if isinstance(hz, Tensor):
        return 1127.0 * torch.log1p(hz / 700.0)
    return 1127.0 * math.log(1.0 + hz / 700.0)


def _mel_banks() -> Tensor:
    """(80, 257) triangular filters, equally spaced in mel from 20 Hz to 8 kHz; float32 as torchaudio
    builds them, with a zero weight for the Nyquist bin."""
    low, high = _mel(LOW_HZ), _mel(SAMPLE_RATE / 2)
    step = (high - low) / (MEL_BINS + 1)
    edge = torch.arange(MEL_BINS, dtype=torch.float32)[:, None]  # (80, 1)
    left, center, right = low + edge * step, low + (edge + 1.0) * step, low + (edge + 2.0) * step
    bin_mel = _mel(SAMPLE_RATE / FFT_SIZE * torch.arange(FFT_SIZE // 2, dtype=torch.float32))[None]  # (1, 256)
    rising = (bin_mel - left) / (center - left)
    falling = (right - bin_mel) / (right - center)
    banks = torch.clamp(torch.minimum(rising, falling), min=0.0)  # (80, 256)
    return F.pad(banks, (0, 1))


def kaldi_fbank(wave16k: np.ndarray) -> Tensor:
    """(T, 80) float32 log mel energies of a 16 kHz waveform in [-1, 1], T = 1 + (N - 400) // 160.

    Per frame: DC offset removed, pre-emphasis 0.97 (the first sample is its own predecessor), Povey
    window, 512-point power spectrum, Kaldi mel filters, natural log floored at float32 eps.
    A waveform shorter than one frame gives (0, 80), as torchaudio does.
    """
    wave = torch.from_numpy(np.ascontiguousarray(wave16k, dtype=np.float32))
    if wave.dim() != 1:
        raise ValueError(f"kaldi_fbank expects a 1-D waveform, got shape {tuple(wave.shape)}")
    if wave.numel() < FRAME_LENGTH:
        return torch.zeros(0, MEL_BINS)
    frames = wave.unfold(0, FRAME_LENGTH, FRAME_SHIFT)  # (T, 400)
    frames = frames - frames.mean(dim=1, keepdim=True)
    previous = torch.cat([frames[:, :1], frames[:, :-1]], dim=1)
    frames = frames - PREEMPHASIS * previous
    window = torch.hann_window(FRAME_LENGTH, periodic=False, dtype=torch.float32).pow(POVEY_EXPONENT)
    power = torch.fft.rfft(frames * window, n=FFT_SIZE).abs().pow(2.0)  # (T, 257)
    energies = power @ _mel_banks().T  # (T, 80)
    return torch.clamp(energies, min=LOG_FLOOR).log()


@dataclass(frozen=True)
class CampPlusSizes:
    """The sizes CAMPPlus takes as arguments (tiny: 32, 8, 4, 4, 192; campplus_cn_common: 32, 128, 32, 128, 192)."""

    head_channels: int
    init_channels: int
    growth_rate: int
    bottleneck: int  # bn_size * growth_rate
    embedding_size: int

    def dense_channels(self) -> list[int]:
        """Channels entering each dense block; a transition layer halves what the block grew to."""
        channels, entering = self.init_channels, []
        for layers in DENSE_LAYERS:
            entering.append(channels)
            channels = (channels + layers * self.growth_rate) // 2
        return [*entering, channels]  # the last entry: channels after the last transition


def _bn(prefix: str, channels: int, affine: bool = True) -> dict[str, tuple[int, ...]]:
    shapes = {f"{prefix}.weight": (channels,), f"{prefix}.bias": (channels,)} if affine else {}
    return {**shapes, f"{prefix}.running_mean": (channels,), f"{prefix}.running_var": (channels,),
            f"{prefix}.num_batches_tracked": ()}


def _head_shapes(c: int) -> dict[str, tuple[int, ...]]:
    shapes = {"head.conv1.weight": (c, 1, 3, 3), **_bn("head.bn1", c)}
    for stage in range(1, HEAD_STAGES + 1):
        for block in range(HEAD_BLOCKS):
            p = f"head.layer{stage}.{block}"
            shapes.update({f"{p}.conv1.weight": (c, c, 3, 3), **_bn(f"{p}.bn1", c),
                           f"{p}.conv2.weight": (c, c, 3, 3), **_bn(f"{p}.bn2", c)})
            if block == 0:  # the strided block projects its input to add it
                shapes.update({f"{p}.shortcut.0.weight": (c, c, 1, 1), **_bn(f"{p}.shortcut.1", c)})
    return {**shapes, "head.conv2.weight": (c, c, 3, 3), **_bn("head.bn2", c)}


def campplus_shapes(sizes: CampPlusSizes) -> dict[str, tuple[int, ...]]:
    """Every key and shape of the CAMPPlus state dict of these sizes, in the official order."""
    g, bottleneck, half = sizes.growth_rate, sizes.bottleneck, sizes.bottleneck // 2
    shapes = _head_shapes(sizes.head_channels)
    shapes.update({"xvector.tdnn.linear.weight": (sizes.init_channels, sizes.head_channels * MEL_AFTER_HEAD,
                                                  TDNN_KERNEL),
                   **_bn("xvector.tdnn.nonlinear.batchnorm", sizes.init_channels)})
    channels = sizes.dense_channels()
    for i, layers in enumerate(DENSE_LAYERS):
        for j in range(layers):
            p, width = f"xvector.block{i + 1}.tdnnd{j + 1}", channels[i] + j * g
            shapes.update({**_bn(f"{p}.nonlinear1.batchnorm", width),
                           f"{p}.linear1.weight": (bottleneck, width, 1),
                           **_bn(f"{p}.nonlinear2.batchnorm", bottleneck),
                           f"{p}.cam_layer.linear_local.weight": (g, bottleneck, DENSE_KERNEL),
                           f"{p}.cam_layer.linear1.weight": (half, bottleneck, 1),
                           f"{p}.cam_layer.linear1.bias": (half,),
                           f"{p}.cam_layer.linear2.weight": (g, half, 1),
                           f"{p}.cam_layer.linear2.bias": (g,)})
        grown = channels[i] + layers * g
        shapes.update({**_bn(f"xvector.transit{i + 1}.nonlinear.batchnorm", grown),
                       f"xvector.transit{i + 1}.linear.weight": (grown // 2, grown, 1)})
    final = channels[-1]
    return {**shapes, **_bn("xvector.out_nonlinear.batchnorm", final),
            "xvector.dense.linear.weight": (sizes.embedding_size, 2 * final, 1),
            **_bn("xvector.dense.nonlinear.batchnorm", sizes.embedding_size, affine=False)}


_SIZE_KEYS = {  # size -> (key, dim) that holds it
    "head_channels": ("head.conv1.weight", 0),
    "init_channels": ("xvector.tdnn.linear.weight", 0),
    "growth_rate": ("xvector.block1.tdnnd1.cam_layer.linear_local.weight", 0),
    "bottleneck": ("xvector.block1.tdnnd1.linear1.weight", 0),
    "embedding_size": ("xvector.dense.linear.weight", 0),
}


def sizes_of(state: Mapping[str, Tensor], source: Path | str) -> CampPlusSizes:
    """The CAMPPlus sizes a state dict was built with; one line naming the file when it is not one."""
    found = {}
    for name, (key, dim) in _SIZE_KEYS.items():
        tensor = state.get(key)
        if not isinstance(tensor, Tensor) or tensor.dim() <= dim:
            raise UserError(f"{source}: not a CAMPPlus state dict (no tensor {key}); pass the "
                            "campplus_cn_common.bin of the IndexTTS-2.5 model directory with --campplus")
        found[name] = int(tensor.shape[dim])
    return CampPlusSizes(**found)


def _check_layout(state: Mapping[str, Tensor], source: Path | str) -> CampPlusSizes:
    """Strict load: the keys and shapes are exactly those of CAMPPlus at the sizes the weights have."""
    sizes = sizes_of(state, source)
    expected = campplus_shapes(sizes)
    missing = [k for k in expected if k not in state]
    unexpected = [k for k in state if k not in expected]
    misshaped = [f"{k} {list(state[k].shape)} (expected {list(expected[k])})"
                 for k in expected if k in state and tuple(state[k].shape) != expected[k]]
    problems = [f"{len(names)} {label}: {', '.join(names[:4])}{' ...' if len(names) > 4 else ''}"
                for label, names in (("missing", missing), ("unexpected", unexpected), ("mis-shaped", misshaped))
                if names]
    if problems:
        raise UserError(f"{source}: not the CAMPPlus layout IndexTTS-2.5 loads ({'; '.join(problems)}); "
                        "pass the campplus_cn_common.bin of the model directory with --campplus")
    return sizes


def read_state_dict(path: Path, what: str) -> dict[str, Tensor]:
    """A plain state dict saved with torch.save, read without running pickled code; one line when it is not."""
    path = Path(path)
    if not path.is_file():
        raise UserError(f"{path}: no such file ({what})")
    if path.stat().st_size > MAX_WEIGHTS_BYTES:
        raise UserError(f"{path}: {path.stat().st_size} bytes is too large for the {what}; check the path")
    try:
        state = load_weights_only(path)  # no pickled code; inflation, elements and work bounded
    except Exception as exc:  # any unreadable file is the user's to replace: say why, no traceback
        reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise UserError(f"{path}: cannot read the {what} ({reason}); download it again") from None
    if not isinstance(state, Mapping) or not all(isinstance(v, Tensor) for v in state.values()):
        raise UserError(f"{path}: not a plain state dict of tensors ({what})")
    return dict(state)


def _norm(x: Tensor, w: Mapping[str, Tensor], prefix: str, relu: bool = True) -> Tensor:
    """Eval-mode BatchNorm (running statistics) over dim 1, then ReLU unless told otherwise."""
    x = F.batch_norm(x, w[f"{prefix}.running_mean"], w[f"{prefix}.running_var"], w.get(f"{prefix}.weight"),
                     w.get(f"{prefix}.bias"), training=False, eps=BN_EPS)
    return F.relu(x) if relu else x


def _head(x: Tensor, w: Mapping[str, Tensor]) -> Tensor:
    """(B, 80, T) -> (B, C * 10, T): 2-D residual convolutions that stride only along the mel axis."""
    x = _norm(F.conv2d(x[:, None], w["head.conv1.weight"], padding=1), w, "head.bn1")  # (B, C, 80, T)
    for stage in range(1, HEAD_STAGES + 1):
        for block in range(HEAD_BLOCKS):
            p = f"head.layer{stage}.{block}"
            stride = (2, 1) if block == 0 else (1, 1)
            out = _norm(F.conv2d(x, w[f"{p}.conv1.weight"], stride=stride, padding=1), w, f"{p}.bn1")
            out = _norm(F.conv2d(out, w[f"{p}.conv2.weight"], padding=1), w, f"{p}.bn2", relu=False)
            skip = x
            if block == 0:
                skip = _norm(F.conv2d(x, w[f"{p}.shortcut.0.weight"], stride=stride), w, f"{p}.shortcut.1",
                             relu=False)
            x = F.relu(out + skip)
    x = _norm(F.conv2d(x, w["head.conv2.weight"], stride=(2, 1), padding=1), w, "head.bn2")  # (B, C, 10, T)
    return x.flatten(1, 2)


def _segment_means(x: Tensor) -> Tensor:
    """(B, C, T) -> (B, C, T): each frame gets the mean of its segment of 100 frames; a last partial
    segment is averaged over its own length."""
    frames = x.shape[-1]
    segments = -(-frames // CAM_SEGMENT)
    sums = F.pad(x, (0, segments * CAM_SEGMENT - frames)).unflatten(-1, (segments, CAM_SEGMENT)).sum(-1)
    counts = torch.clamp(frames - CAM_SEGMENT * torch.arange(segments, device=x.device), max=CAM_SEGMENT)
    return (sums / counts).repeat_interleave(CAM_SEGMENT, dim=-1)[..., :frames]


def _dense_layer(x: Tensor, w: Mapping[str, Tensor], p: str, dilation: int) -> Tensor:
    """(B, C, T) -> (B, growth, T): bottleneck, dilated conv, and context-aware masking (a gate from
    the utterance mean plus the segment means)."""
    h = F.conv1d(_norm(x, w, f"{p}.nonlinear1.batchnorm"), w[f"{p}.linear1.weight"])
    h = _norm(h, w, f"{p}.nonlinear2.batchnorm")  # (B, bottleneck, T)
    local = F.conv1d(h, w[f"{p}.cam_layer.linear_local.weight"], padding=dilation * (DENSE_KERNEL - 1) // 2,
                     dilation=dilation)
    context = h.mean(-1, keepdim=True) + _segment_means(h)
    hidden = F.relu(F.conv1d(context, w[f"{p}.cam_layer.linear1.weight"], w[f"{p}.cam_layer.linear1.bias"]))
    gate = torch.sigmoid(F.conv1d(hidden, w[f"{p}.cam_layer.linear2.weight"], w[f"{p}.cam_layer.linear2.bias"]))
    return local * gate


def _xvector(x: Tensor, w: Mapping[str, Tensor]) -> Tensor:
    """(B, C * 10, T) -> (B, embedding): TDNN, three dense blocks with transitions, statistics pooling."""
    x = F.conv1d(x, w["xvector.tdnn.linear.weight"], stride=TDNN_STRIDE, padding=(TDNN_KERNEL - 1) // 2)
    x = _norm(x, w, "xvector.tdnn.nonlinear.batchnorm")  # (B, init, (T - 1) // 2 + 1)
    for i, (layers, dilation) in enumerate(zip(DENSE_LAYERS, DENSE_DILATIONS, strict=True)):
        for j in range(layers):
            x = torch.cat([x, _dense_layer(x, w, f"xvector.block{i + 1}.tdnnd{j + 1}", dilation)], dim=1)
        x = F.conv1d(_norm(x, w, f"xvector.transit{i + 1}.nonlinear.batchnorm"),
                     w[f"xvector.transit{i + 1}.linear.weight"])
    x = _norm(x, w, "xvector.out_nonlinear.batchnorm")
    stats = torch.cat([x.mean(-1), x.std(-1, correction=1)], dim=-1)  # (B, 2C)
    embedding = F.conv1d(stats[..., None], w["xvector.dense.linear.weight"])[..., 0]
    return _norm(embedding, w, "xvector.dense.nonlinear.batchnorm", relu=False)


class CampPlus:
    """The CAMPPlus speaker encoder (eval mode) on one device."""

    def __init__(self, weights: dict[str, Tensor], sizes: CampPlusSizes, device: torch.device) -> None:
        self.weights = weights
        self.sizes = sizes
        self.device = device

    @classmethod
    def load(cls, path: Path, device: torch.device) -> CampPlus:
        """A plain state dict (`campplus_cn_common.bin` or write_tiny_campplus's), loaded strictly."""
        state = read_state_dict(path, "CAMPPlus weights")
        sizes = _check_layout(state, path)
        weights = {k: v.to(device, torch.float32) for k, v in state.items() if not k.endswith("num_batches_tracked")}
        return cls(weights, sizes, torch.device(device))

    @torch.inference_mode()
    def speaker_vector_of_fbank(self, fbank: Tensor) -> np.ndarray:
        """(192,) float32 from one utterance's fbank (T, 80) before mean subtraction."""
        if fbank.dim() != 2 or fbank.shape[1] != MEL_BINS or fbank.shape[0] < MIN_FBANK_FRAMES:
            raise ValueError(f"CAMPPlus needs an fbank of at least {MIN_FBANK_FRAMES} frames x {MEL_BINS} bins "
                             f"(a waveform of at least {MIN_SAMPLES} samples); got {tuple(fbank.shape)}")
        feat = fbank.to(self.device, torch.float32)
        feat = feat - feat.mean(dim=0, keepdim=True)  # per-utterance mean of each bin, as 2.5 inference
        with full_float32():
            embedding = _xvector(_head(feat.T[None], self.weights), self.weights)  # (1, 192)
        return embedding[0].float().cpu().numpy()

    def speaker_vector(self, wave16k: np.ndarray) -> np.ndarray:
        """(192,) float32: CAMPPlus(fbank - fbank.mean(0)) of a 16 kHz speaker-path waveform."""
        return self.speaker_vector_of_fbank(kaldi_fbank(wave16k))


TINY_SIZES = CampPlusSizes(head_channels=32, init_channels=8, growth_rate=4, bottleneck=4, embedding_size=192)
REAL_SIZES = CampPlusSizes(head_channels=32, init_channels=128, growth_rate=32, bottleneck=128, embedding_size=192)


def write_tiny_campplus(path: Path, seed: int, sizes: CampPlusSizes = TINY_SIZES) -> None:
    """Seeded random CAMPPlus weights at the reference's tiny size (or `sizes`: REAL_SIZES is
    campplus_cn_common.bin's), in the official layout (a plain state dict). Non-trivial BatchNorm
    statistics, so a wrong normalisation shows in tests."""
    generator = torch.Generator().manual_seed(seed)
    state: dict[str, Tensor] = {}
    for key, shape in campplus_shapes(sizes).items():
        if key.endswith("num_batches_tracked"):
            state[key] = torch.tensor(0, dtype=torch.int64)
        elif key.endswith("running_var"):
            state[key] = 0.5 + 1.5 * torch.rand(shape, generator=generator)
        elif key.endswith(("running_mean", ".bias")):
            state[key] = 0.2 * torch.randn(shape, generator=generator)
        elif len(shape) == 1:  # BatchNorm scale
            state[key] = 1.0 + 0.1 * torch.randn(shape, generator=generator)
        else:  # He initialisation keeps activations in range through the deep dense blocks
            state[key] = torch.randn(shape, generator=generator) * math.sqrt(2.0 / math.prod(shape[1:]))
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save(state, path)
