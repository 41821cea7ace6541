"""How much GPU memory a step takes: the estimate hardware.py sizes the micro-batch with.

Memory model (bytes; P trained parameters, D model_dim, H heads, n layers, S positions, a = 2 bytes
per activation under bf16/fp16 autocast and 4 in fp32). It follows `model/gpt.py`: an fp32 residual
stream, LayerNorm in fp32 (autocast runs it in fp32), SDPA attention (flash or memory-efficient kernels,
so no S x S matrix is kept), fused tanh-GELU, bool dropout masks.

IndexTTS-2.5 is the same sum with its own P (spk_emb_proj and lang_embedding instead of speed_emb,
60,510 text rows) and a 3-row prefix instead of 34 rows.

- fixed: 4 P for the fp32 weights of every tensor on the GPU, 12 T for the T *trainable* ones (fp32
  grad + AdamW exp_avg + exp_avg_sq; `--train-scope` decides T: all of P for full, less for
  partial/lora, whose LoRA adapters add their own 4 bytes each), 4 T more for DDP's gradient buckets
  when world_size > 1, and a 1 GiB reserve for the CUDA context, cuBLAS workspaces and the
  allocator's slack. Only the trained module lives on the GPU; the conditioning encoders stay on CPU.
- one block, per position: 8D (two fp32 LayerNorm inputs) + 2D (two dropout masks)
  + aD * (2 matmul inputs + 3 qkv + 1 attention output + 1 merged heads + 4 c_fc output
  + 4 GELU output) + 4H (attention log-sum-exp) = 10D + 15aD + 4H.
- per sample: S * (n blocks + 1 block of gradients while its backward runs + 17D outside the
  blocks: embeddings, embedding dropout mask, ln_f and final_norm inputs, the heads' fp32 input
  that the chunked loss keeps). With activation checkpointing only each block's fp32 input (4D) is
  kept, plus one block recomputed.
- the heads' loss (`losses.py`) never holds the full logits: one chunk of CHUNK_LOGITS logits at a
  time, each costing a (head output) + 4 (fp32 copy) + 4 (log-softmax or softmax) + 4 (its
  gradient), plus one head's weight in the autocast dtype, its (C, D) gradient temporary in that
  dtype and in fp32 (2a + 4 bytes per weight). None of it grows with the micro-batch.
- LoRA, per position and adapted layer: the rank-r product x A^T kept for B's gradient (a r), and
  a bool dropout mask over the layer's input when lora_dropout > 0. The adapted layer's own input
  is saved for A's gradient instead of the frozen weight's, so it is not counted twice.
- Frozen tensors save nothing for their own gradient, but the gradient still crosses every block
  to reach the adapters and the new text rows, so the block terms above stay as they are for
  partial and lora: an upper bound there (partial without new text rows saves about half).
- peak = fixed + max(micro_batch * per_sample + the loss's chunk + autocast's half copies of the
  weights (2 P), AdamW's one temporary over the trainable tensors in `step()` (4 T)): activations
  are gone before the step.

The model is for CUDA. On CPU it only informs (the CPU micro-batch is a fixed cap): CPU dropout
keeps float masks and CPU SDPA with dropout falls back to the S x S math path.
tests/test_train_hardware.py checks the saved-activation terms against what model.py really saves.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from indextts_train.config.constants import LANG_ROWS, PREFIX_LEN, PREFIX_LEN_V25, SPK_EMB_DIM
from indextts_train.config.scope_settings import ScopeSettings
from indextts_train.config.settings import GPTConfig
from indextts_train.model.losses import CHUNK_LOGITS
from indextts_train.model.scope import scope_counts

GIB = 1024**3
CUDA_RESERVE_BYTES = 1 * GIB
WEIGHT_BYTES_PER_PARAM = 4  # fp32 weight, trainable or frozen
TRAINED_STATE_BYTES_PER_PARAM = 12  # fp32 grad, two fp32 AdamW moments: trainable tensors only
DDP_BUCKET_BYTES_PER_PARAM = 4  # DDP's flat gradient buckets duplicate the fp32 grads
AUTOCAST_COPY_BYTES_PER_PARAM = 2  # autocast keeps a half copy of each weight a matmul saved
OPTIMIZER_STEP_BYTES_PER_PARAM = 4  # foreach AdamW builds sqrt(exp_avg_sq) over what it steps
CE_BYTES_PER_LOGIT = 12  # fp32 copy + log-softmax + its gradient (plus the head's output)
PRECISIONS = ("bf16", "fp16", "fp32")


def max_sequence_positions(cfg: GPTConfig) -> int:
    """Trunk positions at the longest sample: prefix + [start]+text+[stop] + [start]+codes+[stop]."""
    prefix = PREFIX_LEN_V25 if cfg.family.speaker_vector else PREFIX_LEN
    return prefix + (cfg.max_text_tokens + 2) + (cfg.max_mel_tokens + 2)


def trained_parameter_count(cfg: GPTConfig) -> int:
    """Parameters that get a gradient when training on precomputed conditions (all on the GPU)."""
    D = cfg.model_dim
    text = 2 * cfg.text_rows * D + cfg.text_rows  # text_embedding, text_head weight + bias
    mel = 2 * cfg.number_mel_codes * D + cfg.number_mel_codes  # mel_embedding, mel_head
    positions = (cfg.max_text_tokens + 2) * D + (cfg.max_mel_tokens + 3) * D
    blocks = cfg.layers * (12 * D * D + 13 * D)  # qkv, proj, fc, proj weights+biases, 2 LayerNorms
    norms = 2 * D + 2 * D  # gpt.ln_f and final_norm
    if cfg.family.speaker_vector:  # spk_emb_proj and lang_embedding instead of speed_emb
        return text + mel + positions + blocks + norms + (SPK_EMB_DIM + 1) * D + LANG_ROWS * D
    return text + mel + positions + blocks + norms + 2 * D


def _block_bytes_per_position(cfg: GPTConfig, act: int) -> int:
    """Saved activations of one GPT-2 block per position (see the module docstring)."""
    D = cfg.model_dim
    return 10 * D + 15 * act * D + 4 * cfg.heads


@dataclass(frozen=True)
class ParamCounts:
    """What the memory model needs to know about the parameters under a `--train-scope`."""

    model: int  # every parameter of the trained module (on the GPU, fp32)
    trainable: int  # what gets gradients and AdamW state, adapters included
    adapters: int  # LoRA numbers (extra weights beyond `model`)


FULL_SCOPE = ScopeSettings()


def param_counts(cfg: GPTConfig, scope: ScopeSettings = FULL_SCOPE) -> ParamCounts:
    """Counts for `scope`; partial/lora assume the text embedding trains (new rows, the usual case)."""
    if scope.train_scope == "full":
        params = trained_parameter_count(cfg)
        return ParamCounts(params, params, 0)
    counts = scope_counts(cfg, scope, text_rows_train=True)
    return ParamCounts(counts["model"], counts["trainable"], counts["adapters"])


def _lora_bytes_per_position(cfg: GPTConfig, act: int, scope: ScopeSettings) -> int:
    """Saved for backward by the adapters of one block, per position (see the module docstring)."""
    if scope.train_scope != "lora":
        return 0
    D, spec = cfg.model_dim, scope.lora
    inputs = {"qkv": D, "attn_out": D, "mlp_in": D, "mlp_out": 4 * D}
    mask = sum(inputs[t] for t in spec.targets) if spec.dropout > 0 else 0
    return len(spec.targets) * act * spec.rank + mask


def activation_bytes_per_sample(cfg: GPTConfig, act: int, activation_checkpointing: bool,
                                 scope: ScopeSettings = FULL_SCOPE) -> int:
    D = cfg.model_dim
    block = _block_bytes_per_position(cfg, act) + _lora_bytes_per_position(cfg, act, scope)
    if activation_checkpointing:
        kept = cfg.layers * 4 * D + block  # every block's fp32 input + the one being recomputed
    else:
        kept = cfg.layers * block
    outside = 17 * D  # embeddings, dropout mask, ln_f / final_norm inputs, the heads' fp32 input
    per_position = kept + block + outside  # + one block's gradients while its backward runs
    return max_sequence_positions(cfg) * per_position


def loss_working_bytes(cfg: GPTConfig, act: int) -> int:
    """The chunked loss's working set: one chunk of logits and one head's weight temporaries."""
    head_rows = max(cfg.text_rows, cfg.number_mel_codes)
    return CHUNK_LOGITS * (act + CE_BYTES_PER_LOGIT) + head_rows * cfg.model_dim * (2 * act + 4)


def state_bytes_per_trainable(world_size: int) -> int:
    return TRAINED_STATE_BYTES_PER_PARAM + (DDP_BUCKET_BYTES_PER_PARAM if world_size > 1 else 0)


def _fixed_bytes(counts: ParamCounts, world_size: int) -> int:
    weights = WEIGHT_BYTES_PER_PARAM * (counts.model + counts.adapters)
    return weights + counts.trainable * state_bytes_per_trainable(world_size) + CUDA_RESERVE_BYTES


def memory_estimator(cfg: GPTConfig, *, precision: str, activation_checkpointing: bool, world_size: int = 1,
                     scope: ScopeSettings = FULL_SCOPE) -> Callable[[int], int]:
    """`estimate_memory` as a function of the micro-batch alone. What depends only on the model (its
    parameter counts, summed over every official shape) is worked out once, not once per candidate
    micro-batch the planner tries."""
    if precision not in PRECISIONS:
        raise ValueError(f"precision must be one of {PRECISIONS}, got {precision!r}")
    act = 4 if precision == "fp32" else 2
    counts = param_counts(cfg, scope)
    copies = 0 if precision == "fp32" else AUTOCAST_COPY_BYTES_PER_PARAM * (counts.model + counts.adapters)
    per_sample = activation_bytes_per_sample(cfg, act, activation_checkpointing, scope)
    loss = loss_working_bytes(cfg, act)
    step = OPTIMIZER_STEP_BYTES_PER_PARAM * counts.trainable
    fixed = _fixed_bytes(counts, world_size)

    def estimate(micro_batch: int) -> int:
        backward = micro_batch * per_sample + loss + copies
        return fixed + max(backward, step)

    return estimate


def estimate_memory(cfg: GPTConfig, micro_batch: int, *, precision: str, activation_checkpointing: bool,
                    world_size: int = 1, scope: ScopeSettings = FULL_SCOPE) -> int:
    """Peak device bytes of one training step at `micro_batch` samples of maximum length."""
    return memory_estimator(cfg, precision=precision, activation_checkpointing=activation_checkpointing,
                            world_size=world_size, scope=scope)(micro_batch)
