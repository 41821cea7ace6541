"""The UnifiedVoice GPT of both families (IndexTTS2, IndexTTS-2.5), as fine-tuned on precomputed features.

Only the tensors that fine-tuning trains are modules here, under their official `gpt.pth` names.
The speaker/emotion encoders (conformers, perceivers, emo layers) never get a gradient when the
conditioning and emotion vectors are precomputed, so they are *carried*: a plain dict
of CPU tensors loaded from the base checkpoint and written back unchanged on export. That keeps
~340M parameters out of GPU memory and out of the optimizer.

Sequence and loss rules follow the reference READMEs ("Exact definitions") to the letter. The
families differ only in the prefix and the text segment:
- IndexTTS2 (`tests/data/reference/README.md`): a 34-row prefix (32 conditioning rows + emo
  vector, then speed rows 1 and 0);
- IndexTTS-2.5 (`tests/data/reference/v2_5/README.md`): a 3-row prefix (spk_emb_proj of the
  192-d CAMPPlus vector + emo vector, then two zero rows), and the sample's `lang_embedding` row
  added to every text position (pads included), to nothing else.
Then text and mel segments with their own learned positions starting at 0, a causal GPT-2 trunk
with no padding mask, and token-level masked cross-entropy over all classes.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.utils.checkpoint import checkpoint

from indextts_train.config import FAMILY_NAMES, FAMILY_V2, FAMILY_V25, ConditionModuleConfig, GPTConfig
from indextts_train.constants import (
    CONDITION_LATENTS,
    LANG_ROWS,
    SPK_EMB_DIM,
    TEXT_ROW_KEYS,
    WRAPPER_PREFIXES,
)
from indextts_train.errors import UserError
from indextts_train.lora import merge_lora, record_spec
from indextts_train.losses import CHUNK_LOGITS, chunked_head_ce

# Sizes UnifiedVoice hard-codes rather than reading from the config.
CONFORMER_INPUT_SIZE = 1024
CONFORMER_KERNEL = 15
EMO_PERCEIVER_DIM = 1024
PERCEIVER_DIM_HEAD = 64
PERCEIVER_DEPTH = 2
PE_MAX_LEN = 5000
# The families' trained keys are disjoint where they differ (speed_emb vs spk_emb_proj/lang_embedding).
TRAINED_PREFIXES = (
    "spk_emb_proj.", "text_embedding.", "lang_embedding.", "mel_embedding.", "text_pos_embedding.",
    "mel_pos_embedding.", "gpt.", "final_norm.", "text_head.", "mel_head.", "speed_emb.",
)
# Keys only one family has: how a checkpoint tells which family it is.
FAMILY_MARKERS = {FAMILY_V2: ("speed_emb.weight", "perceiver_encoder.latents"),
                  FAMILY_V25: ("spk_emb_proj.weight", "lang_embedding.weight")}
_LIST_LIMIT = 8  # names shown per category in a key-mismatch error


@dataclass
class Batch:
    """One collated batch (reference rule 1). Lengths are the manifest's, not the array sizes.

    The speaker features are the family's: `condition` (IndexTTS2) or `spk_emb` + `lang_ids`
    (IndexTTS-2.5); the other family's fields are None.
    """

    text_ids: Tensor  # (B, T) int64, padded with 0
    codes: Tensor  # (B, M) int64, padded with 0
    text_lengths: Tensor  # (B,) int64
    code_lengths: Tensor  # (B,) int64
    condition: Tensor | None  # (B, 32, D) float32, IndexTTS2; None for IndexTTS-2.5
    emo_vec: Tensor  # (B, D) float32
    spk_emb: Tensor | None = None  # (B, 192) float32, IndexTTS-2.5
    lang_ids: Tensor | None = None  # (B,) int64, IndexTTS-2.5: the lang_embedding row

    def to(self, device: torch.device | str, non_blocking: bool = False) -> Batch:
        """`non_blocking` overlaps the copy with compute when the batch sits in pinned memory."""
        return Batch(**{f.name: None if getattr(self, f.name) is None
                        else getattr(self, f.name).to(device, non_blocking=non_blocking)
                        for f in dataclasses.fields(self)})

    def __len__(self) -> int:
        return self.text_ids.shape[0]


@dataclass
class LossOutput:
    """Token-level means plus the sums they come from, for exact aggregation over many batches.

    The `*_ce_sum` tensors keep their graph (the means are built from them); counts are int64.
    """

    text_loss: Tensor
    mel_loss: Tensor
    mel_top1: Tensor
    text_ce_sum: Tensor
    text_count: Tensor
    mel_ce_sum: Tensor
    mel_count: Tensor
    mel_correct: Tensor


# ---------------------------------------------------------------------------------------------
# GPT-2 trunk (HF GPT2Model semantics, HF Conv1D weight layout [in, out])


class Conv1D(nn.Module):
    """HF's transposed linear layer: weight is stored [in, out] so official weights load as is."""

    def __init__(self, n_in: int, n_out: int, std: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.empty(n_in, n_out).normal_(std=std))
        self.bias = nn.Parameter(torch.zeros(n_out))

    def forward(self, x: Tensor) -> Tensor:
        return torch.addmm(self.bias, x.reshape(-1, x.shape[-1]), self.weight).view(*x.shape[:-1], -1)


class Attention(nn.Module):
    def __init__(self, dim: int, heads: int, dropout: float, proj_std: float) -> None:
        super().__init__()
        self.heads = heads
        self.dropout = dropout
        self.c_attn = Conv1D(dim, 3 * dim, 0.02)
        self.c_proj = Conv1D(dim, dim, proj_std)
        self.resid_dropout = nn.Dropout(dropout)

    def forward(self, x: Tensor) -> Tensor:  # (B, S, D)
        B, S, D = x.shape
        q, k, v = (t.view(B, S, self.heads, -1).transpose(1, 2) for t in self.c_attn(x).split(D, dim=2))
        # Causal and nothing else: the reference passes no padding mask (README rule 6).
        y = F.scaled_dot_product_attention(
            q, k, v, dropout_p=self.dropout if self.training else 0.0, is_causal=True
        )  # (B, H, S, D/H)
        return self.resid_dropout(self.c_proj(y.transpose(1, 2).reshape(B, S, D)))


class MLP(nn.Module):
    def __init__(self, dim: int, dropout: float, proj_std: float) -> None:
        super().__init__()
        self.c_fc = Conv1D(dim, 4 * dim, 0.02)
        self.c_proj = Conv1D(4 * dim, dim, proj_std)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x: Tensor) -> Tensor:
        return self.dropout(self.c_proj(F.gelu(self.c_fc(x), approximate="tanh")))  # gelu_new


class Block(nn.Module):
    def __init__(self, dim: int, heads: int, dropout: float, layers: int) -> None:
        super().__init__()
        proj_std = 0.02 / math.sqrt(2 * layers)  # GPT-2's scaled init of residual projections
        self.ln_1 = nn.LayerNorm(dim, eps=1e-5)
        self.attn = Attention(dim, heads, dropout, proj_std)
        self.ln_2 = nn.LayerNorm(dim, eps=1e-5)
        self.mlp = MLP(dim, dropout, proj_std)

    def forward(self, x: Tensor) -> Tensor:
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class GPT2Trunk(nn.Module):
    """GPT2Model without wte/wpe: UnifiedVoice deletes wte and makes wpe return zeros."""

    def __init__(self, cfg: GPTConfig, dropout: float, activation_checkpointing: bool) -> None:
        super().__init__()
        self.drop = nn.Dropout(dropout)
        self.h = nn.ModuleList(Block(cfg.model_dim, cfg.heads, dropout, cfg.layers) for _ in range(cfg.layers))
        self.ln_f = nn.LayerNorm(cfg.model_dim, eps=1e-5)
        self.activation_checkpointing = activation_checkpointing

    def forward(self, x: Tensor) -> Tensor:  # (B, S, D)
        x = self.drop(x)
        for block in self.h:
            if self.activation_checkpointing and torch.is_grad_enabled():
                x = checkpoint(block, x, use_reentrant=False)
            else:
                x = block(x)
        return self.ln_f(x)


class PositionEmbedding(nn.Module):
    """Official LearnedPositionEmbeddings: the table lives under `.emb` in the state dict."""

    def __init__(self, rows: int, dim: int) -> None:
        super().__init__()
        self.emb = nn.Embedding(rows, dim)


# ---------------------------------------------------------------------------------------------
# Sequences and losses


def aligned_sequences(ids: Tensor, lengths: Tensor, start: int, stop: int) -> tuple[Tensor, Tensor]:
    """Reference rules 2-3: pad with `stop` past each length, then inputs=[start]+seq, targets=seq+[stop].

    ids (B, W) -> inputs (B, W+2), targets (B, W+2).
    """
    positions = torch.arange(ids.shape[1], device=ids.device)
    seq = ids.masked_fill(positions[None, :] >= lengths[:, None], stop)  # (B, W)
    seq = F.pad(seq, (0, 1), value=stop)  # (B, W+1)
    return F.pad(seq, (1, 0), value=start), F.pad(seq, (0, 1), value=stop)


def masked_token_ce(logits: Tensor, targets: Tensor, lengths: Tensor) -> tuple[Tensor, Tensor]:
    """Per-position CE over all classes and the rule-7 mask (j < length + 1).

    logits (B, C, L), targets (B, L) -> ce (B, L) float32 (zero where masked), mask (B, L) bool.
    """
    mask = _loss_mask(targets, lengths)
    ce = F.cross_entropy(logits.float(), targets, reduction="none")  # float32 even under autocast
    return ce * mask, mask


def _targets(batch: Batch, cfg: GPTConfig) -> tuple[Tensor, Tensor]:
    """text targets (B, T+2), mel targets (B, M+2) (rules 2-3)."""
    _, text_targets = aligned_sequences(batch.text_ids, batch.text_lengths, cfg.start_text_token,
                                        cfg.stop_text_token)
    _, mel_targets = aligned_sequences(batch.codes, batch.code_lengths, cfg.start_mel_token,
                                       cfg.stop_mel_token)
    return text_targets, mel_targets


def _loss_mask(targets: Tensor, lengths: Tensor) -> Tensor:
    """Rule 7: position j of a segment counts when j < length + 1. (B, L) bool."""
    positions = torch.arange(targets.shape[1], device=targets.device)
    return positions[None, :] < (lengths[:, None] + 1)


def losses_from_hidden(text_hidden: Tensor, mel_hidden: Tensor, text_head: nn.Linear, mel_head: nn.Linear,
                       batch: Batch, cfg: GPTConfig, chunk_logits: int = CHUNK_LOGITS) -> LossOutput:
    """Rules 7-8 from the heads' inputs, chunked (losses.py): equal to `losses_from_logits`."""
    text_targets, mel_targets = _targets(batch, cfg)
    text_mask, mel_mask = _loss_mask(text_targets, batch.text_lengths), _loss_mask(mel_targets, batch.code_lengths)
    text_ce_sum, _ = chunked_head_ce(text_hidden, text_head, text_targets, text_mask, chunk_logits)
    mel_ce_sum, mel_correct = chunked_head_ce(mel_hidden, mel_head, mel_targets, mel_mask, chunk_logits)
    return _loss_output(text_ce_sum, text_mask.sum(), mel_ce_sum, mel_mask.sum(), mel_correct)


def losses_from_logits(
    text_logits: Tensor, mel_logits: Tensor, batch: Batch, cfg: GPTConfig
) -> LossOutput:
    """Reference rules 7-8 on full logits: the plain definition the chunked loss is tested against."""
    text_targets, mel_targets = _targets(batch, cfg)
    text_ce, text_mask = masked_token_ce(text_logits, text_targets, batch.text_lengths)
    mel_ce, mel_mask = masked_token_ce(mel_logits, mel_targets, batch.code_lengths)
    with torch.no_grad():
        mel_correct = ((mel_logits.argmax(dim=1) == mel_targets) & mel_mask).sum()
    return _loss_output(text_ce.sum(), text_mask.sum(), mel_ce.sum(), mel_mask.sum(), mel_correct)


def _loss_output(text_ce_sum: Tensor, text_count: Tensor, mel_ce_sum: Tensor, mel_count: Tensor,
                 mel_correct: Tensor) -> LossOutput:
    return LossOutput(
        text_loss=text_ce_sum / text_count.clamp(min=1),
        mel_loss=mel_ce_sum / mel_count.clamp(min=1),
        mel_top1=mel_correct / mel_count.clamp(min=1),
        text_ce_sum=text_ce_sum,
        text_count=text_count,
        mel_ce_sum=mel_ce_sum,
        mel_count=mel_count,
        mel_correct=mel_correct,
    )


# ---------------------------------------------------------------------------------------------
# The model


class UnifiedVoiceGPT(nn.Module):
    """The trained part of UnifiedVoice; `state_dict()` keys are exactly `trained_keys(cfg)`."""

    def __init__(self, cfg: GPTConfig, dropout: float = 0.1, activation_checkpointing: bool = False) -> None:
        super().__init__()
        _check_supported(cfg)
        self.cfg = cfg
        dim = cfg.model_dim
        # Registration order = the official order of these keys in gpt.pth (official_shapes).
        if cfg.is_v25:
            self.spk_emb_proj = nn.Linear(SPK_EMB_DIM, dim)
        self.text_embedding = nn.Embedding(cfg.text_rows, dim)
        if cfg.is_v25:
            self.lang_embedding = nn.Embedding(LANG_ROWS, dim)
        self.mel_embedding = nn.Embedding(cfg.number_mel_codes, dim)
        self.gpt = GPT2Trunk(cfg, dropout, activation_checkpointing)
        self.mel_pos_embedding = PositionEmbedding(_mel_positions(cfg), dim)
        self.text_pos_embedding = PositionEmbedding(_text_positions(cfg), dim)
        self.final_norm = nn.LayerNorm(dim, eps=1e-5)
        self.text_head = nn.Linear(dim, cfg.text_rows)
        self.mel_head = nn.Linear(dim, cfg.number_mel_codes)
        if not cfg.is_v25:
            self.speed_emb = nn.Embedding(2, dim)
            nn.init.zeros_(self.speed_emb.weight)  # official: normal_(std=0)
        for table in (self.text_embedding, self.mel_embedding, self.text_pos_embedding.emb,
                      self.mel_pos_embedding.emb):
            nn.init.normal_(table.weight, std=0.02)

    def forward(self, batch: Batch) -> tuple[Tensor, Tensor]:
        """text_logits (B, N+1, T+2), mel_logits (B, number_mel_codes, M+2)."""
        text_hidden, mel_hidden = self.hidden_states(batch)
        text_logits = self.text_head(text_hidden).permute(0, 2, 1)  # (B, N+1, T+2)
        mel_logits = self.mel_head(mel_hidden).permute(0, 2, 1)  # (B, mel codes, M+2)
        return text_logits, mel_logits

    def compute_losses(self, batch: Batch) -> LossOutput:
        """Reference rules 7-8 through the chunked head loss: no full logits (see losses.py)."""
        return losses_from_hidden(*self.hidden_states(batch), self.text_head, self.mel_head, batch, self.cfg)

    def hidden_states(self, batch: Batch) -> tuple[Tensor, Tensor]:
        """The heads' inputs: text (B, T+2, D) and mel (B, M+2, D), after final_norm."""
        cfg = self.cfg
        text_inputs, _ = aligned_sequences(batch.text_ids, batch.text_lengths, cfg.start_text_token,
                                           cfg.stop_text_token)
        mel_inputs, _ = aligned_sequences(batch.codes, batch.code_lengths, cfg.start_mel_token,
                                          cfg.stop_mel_token)
        self._check_widths(text_inputs.shape[1], mel_inputs.shape[1])
        text = self.text_embedding(text_inputs) + self.text_pos_embedding.emb.weight[: text_inputs.shape[1]]
        if cfg.is_v25:  # v2.5 rule 5: the language row on every text position, pads included
            text = text + self.lang_embedding(batch.lang_ids)[:, None, :]
        mel = self.mel_embedding(mel_inputs) + self.mel_pos_embedding.emb.weight[: mel_inputs.shape[1]]
        prefix = self._prefix_v25(batch) if cfg.is_v25 else self._prefix(batch)
        hidden = self.gpt(torch.cat([prefix, text, mel], dim=1))  # (B, P+T+2+M+2, D), P = 34 or 3 rows
        hidden = self.final_norm(hidden[:, prefix.shape[1]:])
        text_width = text_inputs.shape[1]
        return hidden[:, :text_width], hidden[:, text_width:]

    def _prefix(self, batch: Batch) -> Tensor:
        """Rule 4: 32 rows of condition + emo_vec, then speed_emb rows 1 and 0; no positions."""
        conds = batch.condition + batch.emo_vec[:, None, :]  # (B, 32, D)
        speed = self.speed_emb.weight[[1, 0]].expand(len(batch), -1, -1)  # (B, 2, D)
        return torch.cat([conds.to(speed.dtype), speed], dim=1)  # (B, 34, D)

    def _prefix_v25(self, batch: Batch) -> Tensor:
        """v2.5 rule 4: spk_emb_proj(spk_emb) + emo_vec, then two all-zero rows (constants); no positions."""
        speaker = self.spk_emb_proj(batch.spk_emb) + batch.emo_vec.to(self.spk_emb_proj.weight.dtype)  # (B, D)
        zeros = speaker.new_zeros(len(batch), 2, speaker.shape[-1])  # (B, 2, D)
        return torch.cat([speaker[:, None, :], zeros], dim=1)  # (B, 3, D)

    def _check_widths(self, text_width: int, mel_width: int) -> None:
        """Position tables bound the padded widths; a too-long manifest line must not crash deep inside."""
        if text_width > self.text_pos_embedding.emb.num_embeddings:
            raise UserError(
                f"batch text width {text_width - 2} exceeds gpt.max_text_tokens {self.cfg.max_text_tokens}; "
                "filter long lines from the manifest (indextts-train check-data)"
            )
        if mel_width > self.mel_pos_embedding.emb.num_embeddings:
            raise UserError(
                f"batch code width {mel_width - 2} exceeds gpt.max_mel_tokens + 1 "
                f"({self.cfg.max_mel_tokens + 1}); filter long lines from the manifest (indextts-train check-data)"
            )


# ---------------------------------------------------------------------------------------------
# The official gpt.pth layout


def _check_supported(cfg: GPTConfig) -> None:
    """Options that would add or rename official keys, which this trainer does not implement."""
    if cfg.train_solo_embeddings or not cfg.use_mel_codes_as_input:
        raise UserError("gpt.train_solo_embeddings must be false and gpt.use_mel_codes_as_input true "
                        "(as in IndexTTS2's config.yaml)")
    for name in ("condition_module", "emo_condition_module"):
        module: ConditionModuleConfig = getattr(cfg, name)
        if module.input_layer != "conv2d2":
            raise UserError(f"gpt.{name}.input_layer {module.input_layer!r} is not supported; "
                            "IndexTTS2 uses 'conv2d2'")
        if module.output_size % module.attention_heads:
            raise UserError(f"gpt.{name}.output_size {module.output_size} is not divisible by "
                            f"attention_heads {module.attention_heads}")


def _text_positions(cfg: GPTConfig) -> int:
    return cfg.max_text_tokens + 2  # start + stop


def _mel_positions(cfg: GPTConfig) -> int:
    return cfg.max_mel_tokens + 3  # start + stop + max_conditioning_inputs (1)


def _linear(prefix: str, n_in: int, n_out: int, bias: bool = True) -> dict[str, tuple[int, ...]]:
    shapes = {f"{prefix}.weight": (n_out, n_in)}
    if bias:
        shapes[f"{prefix}.bias"] = (n_out,)
    return shapes


def _norm(prefix: str, dim: int) -> dict[str, tuple[int, ...]]:
    return {f"{prefix}.weight": (dim,), f"{prefix}.bias": (dim,)}


def _conformer_shapes(prefix: str, module: ConditionModuleConfig) -> dict[str, tuple[int, ...]]:
    """ConformerEncoder(input_size=1024, input_layer='conv2d2', kernel 15, no macaron)."""
    d, heads, units = module.output_size, module.attention_heads, module.linear_units
    shapes = {
        f"{prefix}.embed.conv.0.weight": (d, 1, 3, 3),
        f"{prefix}.embed.conv.0.bias": (d,),
        # Conv2d(stride 2, kernel 3) leaves (1024 - 1) // 2 frequency bins of d channels.
        **_linear(f"{prefix}.embed.out.0", d * ((CONFORMER_INPUT_SIZE - 1) // 2), d),
        f"{prefix}.embed.pos_enc.pe": (1, PE_MAX_LEN, d),
        **_norm(f"{prefix}.after_norm", d),
    }
    for i in range(module.num_blocks):
        b = f"{prefix}.encoders.{i}"
        shapes[f"{b}.self_attn.pos_bias_u"] = (heads, d // heads)
        shapes[f"{b}.self_attn.pos_bias_v"] = (heads, d // heads)
        for name in ("linear_q", "linear_k", "linear_v", "linear_out"):
            shapes.update(_linear(f"{b}.self_attn.{name}", d, d))
        shapes.update(_linear(f"{b}.self_attn.linear_pos", d, d, bias=False))
        shapes.update(_linear(f"{b}.feed_forward.w_1", d, units))
        shapes.update(_linear(f"{b}.feed_forward.w_2", units, d))
        conv = f"{b}.conv_module"
        shapes.update({f"{conv}.pointwise_conv1.weight": (2 * d, d, 1), f"{conv}.pointwise_conv1.bias": (2 * d,),
                       f"{conv}.depthwise_conv.weight": (d, 1, CONFORMER_KERNEL), f"{conv}.depthwise_conv.bias": (d,),
                       **_norm(f"{conv}.norm", d),
                       f"{conv}.pointwise_conv2.weight": (d, d, 1), f"{conv}.pointwise_conv2.bias": (d,)})
        for name in ("norm_ff", "norm_mha", "norm_conv", "norm_final"):
            shapes.update(_norm(f"{b}.{name}", d))
    return shapes


def _perceiver_shapes(
    prefix: str, dim: int, context: int, heads: int, mult: float, latents: int
) -> dict[str, tuple[int, ...]]:
    """PerceiverResampler(dim, dim_context, ff_mult, heads, num_latents), depth 2, dim_head 64."""
    inner = heads * PERCEIVER_DIM_HEAD
    ff = int(dim * mult * 2 / 3)  # perceiver.FeedForward's rule; mult may be a float
    shapes = {f"{prefix}.latents": (latents, dim)}
    if context != dim:  # otherwise proj_context is an Identity with no weights
        shapes.update(_linear(f"{prefix}.proj_context", context, dim))
    for i in range(PERCEIVER_DEPTH):
        layer = f"{prefix}.layers.{i}"
        shapes.update(_linear(f"{layer}.0.to_q", dim, inner, bias=False))
        shapes.update(_linear(f"{layer}.0.to_kv", dim, 2 * inner, bias=False))
        shapes.update(_linear(f"{layer}.0.to_out", inner, dim, bias=False))
        shapes.update(_linear(f"{layer}.1.0", dim, 2 * ff))  # GEGLU doubles the first projection
        shapes.update(_linear(f"{layer}.1.2", ff, dim))
    shapes[f"{prefix}.norm.gamma"] = (dim,)
    return shapes


def _trunk_shapes(cfg: GPTConfig) -> dict[str, tuple[int, ...]]:
    d = cfg.model_dim
    shapes: dict[str, tuple[int, ...]] = {}
    for i in range(cfg.layers):
        b = f"gpt.h.{i}"
        shapes.update({**_norm(f"{b}.ln_1", d),
                       f"{b}.attn.c_attn.weight": (d, 3 * d), f"{b}.attn.c_attn.bias": (3 * d,),
                       f"{b}.attn.c_proj.weight": (d, d), f"{b}.attn.c_proj.bias": (d,),
                       **_norm(f"{b}.ln_2", d),
                       f"{b}.mlp.c_fc.weight": (d, 4 * d), f"{b}.mlp.c_fc.bias": (4 * d,),
                       f"{b}.mlp.c_proj.weight": (4 * d, d), f"{b}.mlp.c_proj.bias": (d,)})
    shapes.update(_norm("gpt.ln_f", d))
    return shapes


def _emotion_shapes(cfg: GPTConfig) -> dict[str, tuple[int, ...]]:
    emo = cfg.emo_condition_module
    return {**_conformer_shapes("emo_conditioning_encoder", emo),
            **_perceiver_shapes("emo_perceiver_encoder", EMO_PERCEIVER_DIM, emo.output_size,
                                emo.attention_heads, emo.perceiver_mult, 1)}


def _tail_shapes(cfg: GPTConfig) -> dict[str, tuple[int, ...]]:
    """emo layers, mel table, trunk, positions, norm and heads: the same in both families."""
    d = cfg.model_dim
    return {
        **_linear("emo_layer", d, d),
        **_linear("emovec_layer", EMO_PERCEIVER_DIM, d),
        "mel_embedding.weight": (cfg.number_mel_codes, d),
        **_trunk_shapes(cfg),
        "mel_pos_embedding.emb.weight": (_mel_positions(cfg), d),
        "text_pos_embedding.emb.weight": (_text_positions(cfg), d),
        **_norm("final_norm", d),
        **_linear("text_head", d, cfg.text_rows),
        **_linear("mel_head", d, cfg.number_mel_codes),
    }


def official_shapes(cfg: GPTConfig) -> dict[str, tuple[int, ...]]:
    """Every key of the official gpt.pth of cfg's family (IndexTTS2, or IndexTTS-2.5's campplus
    mode), in release order, with shapes from `cfg`."""
    _check_supported(cfg)
    d, cond = cfg.model_dim, cfg.condition_module
    if cfg.is_v25:  # campplus registration order: spk_emb_proj first, lang_embedding after text_embedding
        return {**_linear("spk_emb_proj", SPK_EMB_DIM, d), **_emotion_shapes(cfg),
                "text_embedding.weight": (cfg.text_rows, d), "lang_embedding.weight": (LANG_ROWS, d),
                **_tail_shapes(cfg)}
    return {
        **_conformer_shapes("conditioning_encoder", cond),
        **_perceiver_shapes("perceiver_encoder", d, cond.output_size, cond.attention_heads,
                            cond.perceiver_mult, CONDITION_LATENTS),
        **_emotion_shapes(cfg),
        "text_embedding.weight": (cfg.text_rows, d),
        **_tail_shapes(cfg),
        "speed_emb.weight": (2, d),
    }


def _is_trained(key: str) -> bool:
    return key.startswith(TRAINED_PREFIXES)


def trained_keys(cfg: GPTConfig) -> list[str]:
    return [key for key in official_shapes(cfg) if _is_trained(key)]


def split_state_dict(state: Mapping[str, Tensor], cfg: GPTConfig) -> tuple[dict[str, Tensor], dict[str, Tensor]]:
    """(trained, carried): the module's tensors and everything else, each in the input's order."""
    trained = set(trained_keys(cfg))
    return ({k: v for k, v in state.items() if k in trained},
            {k: v for k, v in state.items() if k not in trained})


def full_state_dict(model: UnifiedVoiceGPT, carried: Mapping[str, Tensor]) -> dict[str, Tensor]:
    """The official gpt.pth layout: float32 CPU clones in release order."""
    own = model.state_dict()
    order = list(official_shapes(model.cfg))
    have = set(own) | set(carried)
    if have != set(order):
        missing, extra = sorted(set(order) - have), sorted(have - set(order))
        raise ValueError(f"cannot assemble gpt.pth: missing {_preview(missing)}; unexpected {_preview(extra)}")
    return {k: (own[k] if k in own else carried[k]).detach().to("cpu", torch.float32, copy=True) for k in order}


def _sinusoids(rows: int, dim: int) -> Tensor:
    """The conformer's fixed positional table (espnet PositionalEncoding), (1, rows, dim)."""
    position = torch.arange(rows, dtype=torch.float32)[:, None]
    freq = torch.exp(torch.arange(0, dim, 2, dtype=torch.float32) * -(math.log(10000.0) / dim))
    pe = torch.zeros(rows, dim)
    pe[:, 0::2] = torch.sin(position * freq)
    pe[:, 1::2] = torch.cos(position * freq)
    return pe[None]


def _plausible(key: str, shape: tuple[int, ...], generator: torch.Generator) -> Tensor:
    """A value like the official init would give: norms 1/0, latents N(0,1), weights U(±1/sqrt(fan_in))."""
    if key.endswith(".pe"):
        return _sinusoids(shape[1], shape[2])
    if key.endswith("norm.gamma") or (key.endswith(".weight") and len(shape) == 1):
        return torch.ones(shape)
    if key.endswith(".bias"):
        return torch.zeros(shape)
    if key.endswith(".latents"):
        return torch.randn(shape, generator=generator)
    bound = 1.0 / math.sqrt(math.prod(shape[1:]))
    return (torch.rand(shape, generator=generator) * 2 - 1) * bound


def init_carried(cfg: GPTConfig, generator: torch.Generator) -> dict[str, Tensor]:
    """Random stand-ins for the untrained encoder tensors (for demo base checkpoints)."""
    return {k: _plausible(k, shape, generator) for k, shape in official_shapes(cfg).items() if not _is_trained(k)}


def _preview(names: list[str]) -> str:
    shown = ", ".join(names[:_LIST_LIMIT])
    more = len(names) - _LIST_LIMIT
    return f"{shown} (+{more} more)" if more > 0 else shown


def _read_state(path: Path, merge_adapters: bool) -> dict[str, Tensor]:
    """torch.load without pickled code; accepts a plain state dict or {'model': state_dict}.

    A --train-scope lora checkpoint of ours keeps the frozen base in `model` and the adapters in
    `lora`; its weights are the two merged (unless `merge_adapters` is False: the caller hooks them).
    """
    from indextts_train.checkpoint import load_checkpoint  # safe load: CRC check, no pickled code

    obj = load_checkpoint(path)
    record = obj.get("lora") if isinstance(obj, Mapping) else None
    if isinstance(obj, Mapping) and isinstance(obj.get("model"), Mapping):
        obj = obj["model"]
        if merge_adapters and isinstance(record, Mapping):
            obj = merge_lora(obj, record["adapters"], record_spec(record))
    if not isinstance(obj, Mapping) or not obj:
        raise UserError(f"{path}: not a gpt.pth state dict (expected a mapping of key -> tensor)")
    not_tensors = [str(k) for k, v in obj.items() if not isinstance(v, Tensor)]
    if not_tensors:
        raise UserError(f"{path}: not a gpt.pth state dict; non-tensor entries: {_preview(not_tensors)}")
    return dict(obj)


@dataclass
class CleanedKeys:
    """Weights under the official gpt.pth names, and what was done to get there."""

    state: dict[str, Tensor]
    aliases: list[str]  # inference_model.* / gpt.wte.weight: duplicates of stored tensors, dropped
    lora: list[str]  # LoRA adapter tensors, dropped; callers that would lose training refuse them


def clean_keys(state: Mapping[str, Tensor]) -> CleanedKeys:
    """The one key cleanup for community, DDP and compiled weights (repair and --base-checkpoint).

    Strips `module.` / `_orig_mod.` wrappers, drops IndexTTS2's inference aliases and LoRA adapters,
    and renames LoRA base layers back (`.base_layer.`), as the community fork's build_model does.
    """
    for prefix in WRAPPER_PREFIXES:
        if state and all(k.startswith(prefix) for k in state):
            state = {k[len(prefix):]: v for k, v in state.items()}
    aliases = [k for k in state if k.startswith("inference_model.") or k == "gpt.wte.weight"]
    lora = [k for k in state if ".lora_" in k]
    dropped = set(aliases) | set(lora)
    out = {k.replace(".base_layer.", "."): v for k, v in state.items() if k not in dropped}
    if len(out) != len(state) - len(dropped):
        raise UserError("two weight keys map to the same official name after removing '.base_layer.'")
    return CleanedKeys(out, aliases, lora)


def family_of_keys(keys: Mapping[str, object]) -> str | None:
    """The family whose marker keys a state dict holds; None when it holds both or neither."""
    found = [family for family, markers in FAMILY_MARKERS.items() if any(k in keys for k in markers)]
    return found[0] if len(found) == 1 else None


def resolve_family(cfg: GPTConfig, state: Mapping[str, Tensor], source: Path | str) -> None:
    """Set cfg.family from a checkpoint's keys when the config does not state it; refuse a disagreement."""
    found = family_of_keys(clean_keys(state).state)
    if found is None:
        return  # the layout check names what is missing or mixed
    if cfg.family is None:
        cfg.family = found
    elif cfg.family != found:
        version = "2.5" if cfg.family == FAMILY_V25 else "2.0"
        raise UserError(
            f"{source}: the checkpoint is {FAMILY_NAMES[found]} (it has {FAMILY_MARKERS[found][0]}) but the config "
            f"says version {version} ({FAMILY_NAMES[cfg.family]}); pass the config.yaml that came with the checkpoint"
        )


def settle_family(cfg: GPTConfig, path: Path | None) -> None:
    """cfg.family from a checkpoint file's keys when the config does not state it (before anything is sized)."""
    if cfg.family is not None or path is None or not Path(path).is_file():
        return
    from indextts_train.checkpoint import load_checkpoint

    try:
        obj = load_checkpoint(Path(path), mmap=True)  # keys only; tensor data stays on disk
    except UserError:
        return  # load_base_checkpoint reports it in its own words
    weights = obj["model"] if isinstance(obj.get("model"), Mapping) else obj
    resolve_family(cfg, weights, path)


def _layout_problems(state: Mapping[str, Tensor], cfg: GPTConfig) -> list[str]:
    """Missing, unexpected and mis-shaped keys; text rows may differ from cfg but must agree."""
    expected = official_shapes(cfg)
    missing = [k for k in expected if k not in state]
    unexpected = [k for k in state if k not in expected]
    misshaped = []
    for key in (k for k in expected if k in state):
        shape, want = tuple(state[key].shape), expected[key]
        if key in TEXT_ROW_KEYS:
            shape, want = shape[1:], want[1:]  # only columns are fixed by the config
        if shape != want:
            misshaped.append(f"{key} {list(state[key].shape)} (expected {list(expected[key])})")
    rows = {k: state[k].shape[0] for k in TEXT_ROW_KEYS if k in state and state[k].dim() > 0}
    if len(set(rows.values())) > 1:
        misshaped.append("text rows disagree: " + ", ".join(f"{k} {n}" for k, n in rows.items()))
    problems = []
    for label, names in (("missing", missing), ("unexpected", unexpected), ("mis-shaped", misshaped)):
        if names:
            problems.append(f"{len(names)} {label}: {_preview(names)}")
    return problems


def load_base_checkpoint(
    path: str | Path, cfg: GPTConfig, *, merge_adapters: bool = True
) -> tuple[dict[str, Tensor], dict[str, Tensor], int]:
    """Read an official (or community / our own) gpt.pth and check it against `cfg`.

    Sets cfg.family from the checkpoint's keys when the config does not state it (and refuses a
    config whose `version:` names the other family).
    Returns (trained, carried, base_text_tokens), all float32 in release order; base_text_tokens is
    the checkpoint's text rows - 1, which may differ from cfg.number_text_tokens (vocab growth).
    """
    path = Path(path)
    state = clean_keys(_read_state(path, merge_adapters)).state
    resolve_family(cfg, state, path)
    problems = _layout_problems(state, cfg)
    if problems:
        raise UserError(
            f"{path}: does not match the {cfg.family_name} GPT layout of the config (model_dim {cfg.model_dim}, "
            f"layers {cfg.layers}): {'; '.join(problems)}; check that --config matches the checkpoint"
        )
    if cfg.family is None:
        cfg.family = FAMILY_V2
    ordered = {k: state[k].to(torch.float32).contiguous() for k in official_shapes(cfg)}
    base_text_tokens = ordered["text_embedding.weight"].shape[0] - 1
    if base_text_tokens <= max(cfg.start_text_token, cfg.stop_text_token):
        raise UserError(f"{path}: text_embedding.weight has only {base_text_tokens + 1} rows; "
                        "it cannot hold the start/stop text tokens")
    trained, carried = split_state_dict(ordered, cfg)
    return trained, carried, base_text_tokens
