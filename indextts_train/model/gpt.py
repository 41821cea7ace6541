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
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.utils.checkpoint import checkpoint

from indextts_train.config.constants import (
    LANG_ROWS,
    SPK_EMB_DIM,
)
from indextts_train.config.settings import ConditionModuleConfig, GPTConfig
from indextts_train.errors import UserError
from indextts_train.model.losses import CHUNK_LOGITS, chunked_head_ce


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


def check_supported(cfg: GPTConfig) -> None:
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


def text_positions(cfg: GPTConfig) -> int:
    return cfg.max_text_tokens + 2  # start + stop


def mel_positions(cfg: GPTConfig) -> int:
    return cfg.max_mel_tokens + 3  # start + stop + max_conditioning_inputs (1)


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
        check_supported(cfg)
        self.cfg = cfg
        dim = cfg.model_dim
        # Registration order = the official order of these keys in gpt.pth (official_shapes).
        if cfg.family.speaker_vector:
            self.spk_emb_proj = nn.Linear(SPK_EMB_DIM, dim)
        self.text_embedding = nn.Embedding(cfg.text_rows, dim)
        if cfg.family.language_rows:
            self.lang_embedding = nn.Embedding(LANG_ROWS, dim)
        self.mel_embedding = nn.Embedding(cfg.number_mel_codes, dim)
        self.gpt = GPT2Trunk(cfg, dropout, activation_checkpointing)
        self.mel_pos_embedding = PositionEmbedding(mel_positions(cfg), dim)
        self.text_pos_embedding = PositionEmbedding(text_positions(cfg), dim)
        self.final_norm = nn.LayerNorm(dim, eps=1e-5)
        self.text_head = nn.Linear(dim, cfg.text_rows)
        self.mel_head = nn.Linear(dim, cfg.number_mel_codes)
        if not cfg.family.speaker_vector:
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
        if cfg.family.language_rows:  # v2.5 rule 5: the language row on every text position, pads included
            text = text + self.lang_embedding(batch.lang_ids)[:, None, :]
        mel = self.mel_embedding(mel_inputs) + self.mel_pos_embedding.emb.weight[: mel_inputs.shape[1]]
        prefix = self.prefix(batch)
        hidden = self.gpt(torch.cat([prefix, text, mel], dim=1))  # (B, P+T+2+M+2, D), P = 34 or 3 rows
        hidden = self.final_norm(hidden[:, prefix.shape[1]:])
        text_width = text_inputs.shape[1]
        return hidden[:, :text_width], hidden[:, text_width:]

    def prefix(self, batch: Batch) -> Tensor:
        """The family's prefix rows (B, P, D): what precedes the text segment, in training and in generation."""
        return self._prefix_v25(batch) if self.cfg.family.speaker_vector else self._prefix(batch)

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
