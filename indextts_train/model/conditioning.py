"""The GPT's own speaker and emotion encoders, run on the carried weights of a base gpt.pth.

Fine-tuning never trains these encoders (model/layout.py keeps them as carried tensors beside
model/gpt.py), but `prepare` needs their output:
- `condition` (IndexTTS2 only): `UnifiedVoice.get_conditioning`, a conformer over the layer-17
  w2v-BERT features followed by a perceiver resampler with 32 latents -> (32, model_dim);
- `emo_vec` (both families): `UnifiedVoice.get_emovec`, the emotion conformer, a perceiver with one
  1024-wide latent, then `emovec_layer` and `emo_layer` -> (model_dim,). IndexTTS-2.5 inference
  (`infer_v2_5.py`) computes its emotion vector with the same `get_emovec`/`merge_emovec` of the
  same `UnifiedVoice` class; only the speaker side differs (CAMPPlus instead of `condition`).

The forward passes are plain functions over the state dict (our own code; the structure follows
the official eval-mode forward: espnet-style conformer blocks with relative-position attention and
no rel-shift, a GLU convolution module, pre-norm; a perceiver whose latents attend to themselves and
the context; RMS norm). The feature width is read from the weights (1024 for the released models,
whatever the tiny test models use).

Lengths: official inference passes `feat.shape[-1]` (the feature width, 1024) as the length, not
the frame count. With every released model that masks the frames from 1024 on, and nothing when a
clip has at most 1024 frames (20.48 s). `official_lengths` applies that rule with the constant 1024
for every model, so tiny models of another width are not cut at their width.

Padded batches are NOT equal to single clips (reference README, section 5): the convolution
module's first 1x1 conv adds a bias on padded frames and the depthwise conv carries it into the
last valid frames. `prepare` therefore runs each clip alone, or batches clips of equal length.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator, Mapping
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

from indextts_train.config.settings import ConditionModuleConfig, GPTConfig
from indextts_train.errors import UserError
from indextts_train.model.layout import CONFORMER_INPUT_SIZE, PE_MAX_LEN, PERCEIVER_DEPTH, PERCEIVER_DIM_HEAD

LAYER_NORM_EPS = 1e-5
OFFICIAL_LENGTH = CONFORMER_INPUT_SIZE  # what `torch.tensor([feat.shape[-1]])` is in official inference
COND_PREFIXES = ("conditioning_encoder", "perceiver_encoder")
EMO_PREFIXES = ("emo_conditioning_encoder", "emo_perceiver_encoder")


@dataclass(frozen=True)
class Encoder:
    """One conformer + perceiver pair: names in gpt.pth and the sizes its forward needs."""

    conformer: str
    perceiver: str
    blocks: int
    heads: int  # conformer heads; the perceiver's own count comes from its to_q rows
    perceiver_heads: int


@contextlib.contextmanager
def full_float32() -> Iterator[None]:
    """No TF32 inside the block (the flags are restored after). cuDNN runs fp32 convolutions in TF32
    by default and training turns TF32 matmuls on; its ~1e-3 relative rounding is above the
    reference tolerance (1e-4) for prepared features."""
    saved = torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32
    torch.backends.cudnn.allow_tf32 = torch.backends.cuda.matmul.allow_tf32 = False
    try:
        yield
    finally:
        torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32 = saved


def official_lengths(frames: int, batch: int = 1) -> Tensor:
    """(B,) int64: the lengths official inference passes (the width 1024), as the frame mask sees them."""
    return torch.full((batch,), min(frames, OFFICIAL_LENGTH), dtype=torch.int64)


def _linear(x: Tensor, w: Mapping[str, Tensor], prefix: str) -> Tensor:
    return F.linear(x, w[f"{prefix}.weight"], w.get(f"{prefix}.bias"))


def _layer_norm(x: Tensor, w: Mapping[str, Tensor], prefix: str) -> Tensor:
    return F.layer_norm(x, x.shape[-1:], w[f"{prefix}.weight"], w[f"{prefix}.bias"], eps=LAYER_NORM_EPS)


def _rel_attention(x: Tensor, keep: Tensor, pos: Tensor, w: Mapping[str, Tensor], p: str, heads: int) -> Tensor:
    """Self-attention with learned position biases u and v; `keep` (B, T) masks padded keys."""
    batch, frames, dim = x.shape
    d_head = dim // heads
    q = _linear(x, w, f"{p}.linear_q").view(batch, frames, heads, d_head)
    k = _linear(x, w, f"{p}.linear_k").view(batch, frames, heads, d_head).transpose(1, 2)  # (B, H, T, d)
    v = _linear(x, w, f"{p}.linear_v").view(batch, frames, heads, d_head).transpose(1, 2)
    p_pos = F.linear(pos, w[f"{p}.linear_pos.weight"]).view(1, frames, heads, d_head).transpose(1, 2)
    content = (q + w[f"{p}.pos_bias_u"]).transpose(1, 2) @ k.transpose(-2, -1)  # (B, H, T, T)
    position = (q + w[f"{p}.pos_bias_v"]).transpose(1, 2) @ p_pos.transpose(-2, -1)
    scores = (content + position) / math.sqrt(d_head)
    masked = ~keep[:, None, None, :]  # (B, 1, 1, T)
    attn = torch.softmax(scores.masked_fill(masked, -math.inf), dim=-1).masked_fill(masked, 0.0)
    out = (attn @ v).transpose(1, 2).reshape(batch, frames, dim)
    return _linear(out, w, f"{p}.linear_out")


def _conv_module(x: Tensor, keep: Tensor, w: Mapping[str, Tensor], p: str) -> Tensor:
    """Pointwise conv + GLU, depthwise conv, LayerNorm + SiLU, pointwise conv; padded frames zeroed
    before and after (the bias of the first conv still reaches valid frames: the batch trap)."""
    h = x.transpose(1, 2).masked_fill(~keep[:, None, :], 0.0)  # (B, D, T)
    h = F.glu(F.conv1d(h, w[f"{p}.pointwise_conv1.weight"], w[f"{p}.pointwise_conv1.bias"]), dim=1)
    depthwise = w[f"{p}.depthwise_conv.weight"]  # (D, 1, K)
    h = F.conv1d(h, depthwise, w[f"{p}.depthwise_conv.bias"], padding=(depthwise.shape[-1] - 1) // 2,
                 groups=depthwise.shape[0])
    h = F.silu(_layer_norm(h.transpose(1, 2), w, f"{p}.norm")).transpose(1, 2)
    h = F.conv1d(h, w[f"{p}.pointwise_conv2.weight"], w[f"{p}.pointwise_conv2.bias"])
    return h.masked_fill(~keep[:, None, :], 0.0).transpose(1, 2)  # (B, T, D)


def _conformer_block(x: Tensor, keep: Tensor, pos: Tensor, w: Mapping[str, Tensor], p: str, heads: int) -> Tensor:
    """Pre-norm: attention, convolution and feed-forward residuals, then the block's final norm."""
    x = x + _rel_attention(_layer_norm(x, w, f"{p}.norm_mha"), keep, pos, w, f"{p}.self_attn", heads)
    x = x + _conv_module(_layer_norm(x, w, f"{p}.norm_conv"), keep, w, f"{p}.conv_module")
    hidden = F.silu(_linear(_layer_norm(x, w, f"{p}.norm_ff"), w, f"{p}.feed_forward.w_1"))
    x = x + _linear(hidden, w, f"{p}.feed_forward.w_2")
    return _layer_norm(x, w, f"{p}.norm_final")


def _conformer(feats: Tensor, lengths: Tensor, w: Mapping[str, Tensor], enc: Encoder) -> tuple[Tensor, Tensor]:
    """(B, T, W) features and (B,) lengths -> (B, T', D) states and the (B, T') frame mask, T' = (T - 1) // 2."""
    p = enc.conformer
    keep_in = torch.arange(feats.shape[1], device=feats.device)[None, :] < lengths[:, None]  # (B, T)
    # A 3x3 stride-2 conv over (time, feature), then the channels of each output frame flattened.
    h = F.relu(F.conv2d(feats[:, None], w[f"{p}.embed.conv.0.weight"], w[f"{p}.embed.conv.0.bias"], stride=2))
    batch, dim, frames, bins = h.shape
    h = _linear(h.transpose(1, 2).reshape(batch, frames, dim * bins), w, f"{p}.embed.out.0")  # (B, T', D)
    if frames >= PE_MAX_LEN:
        raise ValueError(f"{feats.shape[1]} feature frames are more than the conformer's {PE_MAX_LEN} positions hold")
    pos = w[f"{p}.embed.pos_enc.pe"][:, :frames]  # (1, T', D)
    h = h * math.sqrt(dim)
    keep = keep_in[:, 2::2]  # the frame the stride-2 conv's last tap sees decides
    for i in range(enc.blocks):
        h = _conformer_block(h, keep, pos, w, f"{p}.encoders.{i}", enc.heads)
    return _layer_norm(h, w, f"{p}.after_norm"), keep


def _cross_attention(latents: Tensor, context: Tensor, keep: Tensor, w: Mapping[str, Tensor], p: str,
                     heads: int) -> Tensor:
    """Latents attend to themselves and the context (B, N, dim); `keep` (B, L + N) masks padded frames."""
    batch, n_latents, _ = latents.shape
    q = F.linear(latents, w[f"{p}.to_q.weight"])
    k, v = F.linear(torch.cat([latents, context], dim=1), w[f"{p}.to_kv.weight"]).chunk(2, dim=-1)
    q, k, v = (t.unflatten(-1, (heads, PERCEIVER_DIM_HEAD)).transpose(1, 2) for t in (q, k, v))  # (B, H, *, 64)
    scores = (q @ k.transpose(-2, -1)) * PERCEIVER_DIM_HEAD ** -0.5
    scores = scores.masked_fill(~keep[:, None, None, :], -torch.finfo(scores.dtype).max)
    out = (torch.softmax(scores, dim=-1) @ v).transpose(1, 2).reshape(batch, n_latents, -1)
    return F.linear(out, w[f"{p}.to_out.weight"])


def _perceiver(context: Tensor, keep: Tensor, w: Mapping[str, Tensor], p: str, heads: int) -> Tensor:
    """(B, N, C) states and their (B, N) mask -> (B, L, dim): the latents after two attention +
    GEGLU feed-forward layers and an RMS norm."""
    if f"{p}.proj_context.weight" in w:  # absent when the context already has the latents' width
        context = _linear(context, w, f"{p}.proj_context")
    latents = w[f"{p}.latents"].expand(context.shape[0], -1, -1)  # (B, L, dim)
    keep = torch.cat([keep.new_ones(latents.shape[:2]), keep], dim=1)  # the latents are never masked
    for i in range(PERCEIVER_DEPTH):
        layer = f"{p}.layers.{i}"
        latents = latents + _cross_attention(latents, context, keep, w, f"{layer}.0", heads)
        value, gate = _linear(latents, w, f"{layer}.1.0").chunk(2, dim=-1)
        latents = latents + _linear(value * F.gelu(gate), w, f"{layer}.1.2")
    scale = math.sqrt(latents.shape[-1])
    return F.normalize(latents, dim=-1) * scale * w[f"{p}.norm.gamma"]


def _encoder(prefixes: tuple[str, str], module: ConditionModuleConfig, w: Mapping[str, Tensor]) -> Encoder:
    conformer, perceiver = prefixes
    perceiver_heads = w[f"{perceiver}.layers.0.0.to_q.weight"].shape[0] // PERCEIVER_DIM_HEAD
    return Encoder(conformer, perceiver, module.num_blocks, module.attention_heads, perceiver_heads)


def _input_bins(w: Mapping[str, Tensor], conformer: str) -> int:
    """Feature bins after the stride-2 conv, (W - 1) // 2, read from the first linear's columns."""
    out_weight = w[f"{conformer}.embed.out.0.weight"]  # (D, D * bins)
    return out_weight.shape[1] // out_weight.shape[0]


class ConditioningEncoders:
    """`condition` (IndexTTS2) and `emo_vec` (both families) from normalised layer-17 features."""

    def __init__(self, weights: dict[str, Tensor], cond: Encoder | None, emo: Encoder, device: torch.device) -> None:
        self.weights = weights
        self.cond = cond
        self.emo = emo
        self.device = device
        self.input_bins = _input_bins(weights, emo.conformer)
        # The widths W with (W - 1) // 2 == bins are 2 * bins + 1 and 2 * bins + 2; w2v-BERT's are even.
        self.width = 2 * self.input_bins + 2

    @classmethod
    def from_gpt(cls, carried: Mapping[str, Tensor], gpt_cfg: GPTConfig, device: torch.device) -> ConditioningEncoders:
        """The encoders of a base gpt.pth: `carried` as layout.load_base_checkpoint returns it."""
        prefixes = EMO_PREFIXES if gpt_cfg.family.speaker_vector else COND_PREFIXES + EMO_PREFIXES
        missing = [p for p in prefixes if not any(k.startswith(f"{p}.") for k in carried)]
        missing += [k for k in ("emovec_layer.weight", "emo_layer.weight") if k not in carried]
        if missing:
            raise UserError(f"the base gpt.pth has no {', '.join(missing)}: its speaker/emotion encoders are "
                            "needed to prepare features; pass the official gpt.pth of the model directory")
        keep = (*prefixes, "emovec_layer.", "emo_layer.")
        weights = {k: v.to(device, torch.float32) for k, v in carried.items() if k.startswith(keep)}
        emo = _encoder(EMO_PREFIXES, gpt_cfg.emo_condition_module, weights)
        cond = None if gpt_cfg.family.speaker_vector else _encoder(COND_PREFIXES, gpt_cfg.condition_module, weights)
        if cond is not None and _input_bins(weights, cond.conformer) != _input_bins(weights, emo.conformer):
            raise UserError("the base gpt.pth's conditioning and emotion encoders take features of different "
                            "widths; it is not a UnifiedVoice checkpoint")
        return cls(weights, cond, emo, torch.device(device))

    def require_width(self, width: int, source: str) -> None:
        """One line (UserError) when the features of `source` (the w2v-BERT model) will not fit these encoders."""
        if (width - 1) // 2 != self.input_bins:
            raise UserError(f"{source} gives {width}-wide features but the GPT's speaker/emotion encoders take "
                            f"{self.width}-wide ones; use the w2v-BERT model that belongs to this gpt.pth")

    def _inputs(self, feats: Tensor, lengths: Tensor | None) -> tuple[Tensor, Tensor]:
        if feats.dim() != 3 or (feats.shape[-1] - 1) // 2 != self.input_bins:
            raise ValueError(f"expected features (B, T, {self.width}), got {tuple(feats.shape)}")
        if feats.shape[1] < 3:
            raise ValueError(f"the conformer needs at least 3 feature frames, got {feats.shape[1]}")
        if lengths is None:
            lengths = official_lengths(feats.shape[1], feats.shape[0])
        return feats.to(self.device, torch.float32), lengths.to(self.device)

    @torch.inference_mode()
    def condition_batch(self, feats: Tensor, lengths: Tensor | None = None) -> Tensor:
        """(B, T, W) -> (B, 32, D) float32 on the CPU. Without `lengths`, the official rule. Equal to
        single clips only when every clip has T frames (see the module docstring)."""
        if self.cond is None:
            raise ValueError("IndexTTS-2.5 has no conditioning encoder: its speaker input is the CAMPPlus vector")
        feats, lengths = self._inputs(feats, lengths)
        with full_float32():
            states, keep = _conformer(feats, lengths, self.weights, self.cond)
            condition = _perceiver(states, keep, self.weights, self.cond.perceiver, self.cond.perceiver_heads)
        return condition.float().cpu()

    @torch.inference_mode()
    def emo_vec_batch(self, feats: Tensor, lengths: Tensor | None = None) -> Tensor:
        """(B, T, W) -> (B, D) float32 on the CPU; the same batching caveat as condition_batch."""
        feats, lengths = self._inputs(feats, lengths)
        with full_float32():
            states, keep = _conformer(feats, lengths, self.weights, self.emo)
            pooled = _perceiver(states, keep, self.weights, self.emo.perceiver, self.emo.perceiver_heads)[:, 0]
            emo = _linear(_linear(pooled, self.weights, "emovec_layer"), self.weights, "emo_layer")
        return emo.float().cpu()

    def condition(self, feat: Tensor) -> Tensor:
        """(T, W) features of one clip -> (32, D): `get_conditioning` as official inference calls it."""
        return self.condition_batch(feat[None])[0]

    def emo_vec(self, feat: Tensor) -> Tensor:
        """(T, W) features of one clip -> (D,): `get_emovec` as official inference calls it."""
        return self.emo_vec_batch(feat[None])[0]
