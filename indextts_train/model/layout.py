"""The official `gpt.pth` layout: its keys and shapes, trained vs carried tensors, and loading it.

model.py holds only what trains; this module knows the whole file as IndexTTS inference loads it:
every official key and shape for a config, which family a set of keys is, the key cleanup for
community/DDP/compiled weights, and the checks that turn a wrong base checkpoint into one line.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

import torch
from torch import Tensor

from indextts_train.config.constants import (
    CONDITION_LATENTS,
    LANG_ROWS,
    SPK_EMB_DIM,
    TEXT_ROW_KEYS,
    WRAPPER_PREFIXES,
)
from indextts_train.config.settings import ConditionModuleConfig, GPTConfig
from indextts_train.errors import UserError
from indextts_train.model.gpt import UnifiedVoiceGPT, check_supported, mel_positions, text_positions

# Sizes UnifiedVoice hard-codes rather than reading from the config.
CONFORMER_INPUT_SIZE = 1024
CONFORMER_KERNEL = 15
EMO_PERCEIVER_DIM = 1024
CONFORMER_INPUT_KEY = "embed.out.0.weight"  # (d, d x (width - 1) // 2): the only shape the input width sets
PERCEIVER_DIM_HEAD = 64
PERCEIVER_DEPTH = 2
PE_MAX_LEN = 5000
# The families' trained keys are disjoint where they differ (speed_emb vs spk_emb_proj/lang_embedding).
TRAINED_PREFIXES = (
    "spk_emb_proj.", "text_embedding.", "lang_embedding.", "mel_embedding.", "text_pos_embedding.",
    "mel_pos_embedding.", "gpt.", "final_norm.", "text_head.", "mel_head.", "speed_emb.",
)
_LIST_LIMIT = 3  # names shown per category in a key-mismatch error









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
        "mel_pos_embedding.emb.weight": (mel_positions(cfg), d),
        "text_pos_embedding.emb.weight": (text_positions(cfg), d),
        **_norm("final_norm", d),
        **_linear("text_head", d, cfg.text_rows),
        **_linear("mel_head", d, cfg.number_mel_codes),
    }


def official_shapes(cfg: GPTConfig) -> dict[str, tuple[int, ...]]:
    """Every key of the official gpt.pth of cfg's family (IndexTTS2, or IndexTTS-2.5's campplus
    mode), in release order, with shapes from `cfg`."""
    check_supported(cfg)
    d, cond = cfg.model_dim, cfg.condition_module
    if cfg.family.speaker_vector:  # campplus order: spk_emb_proj first, lang_embedding after text_embedding
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
        raise ValueError(f"cannot assemble gpt.pth: missing {preview_names(missing)}; "
                         f"unexpected {preview_names(extra)}")
    return {k: (own[k] if k in own else carried[k]).detach().to("cpu", torch.float32, copy=True) for k in order}


def load_official(model: UnifiedVoiceGPT, state: Mapping[str, Tensor], where: str | None = None) -> dict[str, Tensor]:
    """The reverse of full_state_dict: the model's tensors of `state` into `model` (strict); returns the
    others (carried). `where` heads the one-line refusal when they do not fit (None: torch's error)."""
    trained, carried = split_state_dict(state, model.cfg)
    try:
        model.load_state_dict(trained, strict=True)
    except RuntimeError:
        if where is None:
            raise
        raise UserError(f"{where}: {mismatch_summary(trained, model.cfg)}; pass the config the checkpoint was "
                        "trained with") from None
    return carried


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


def preview_names(names: list[str]) -> str:
    shown = ", ".join(names[:_LIST_LIMIT])
    more = len(names) - _LIST_LIMIT
    return f"{shown} (+{more} more)" if more > 0 else shown


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


def mismatch_summary(saved: Mapping[str, Tensor], cfg: GPTConfig) -> str:
    """How the trained tensors `saved` differ from what `cfg` builds: counts and one example of each kind
    (torch's own message lists every tensor, pages of it for another model size)."""
    shapes = official_shapes(cfg)
    expected = {key: shapes[key] for key in trained_keys(cfg)}
    differ = [k for k in expected if k in saved and tuple(saved[k].shape) != expected[k]]
    missing = [k for k in expected if k not in saved]
    unexpected = [k for k in saved if k not in expected]
    parts = []
    if differ:
        key = differ[0]
        parts.append(f"{len(differ)} of {len(expected)} tensors differ in shape (e.g. {key} is "
                     f"{list(saved[key].shape)} in the checkpoint, {list(expected[key])} for the config)")
    if missing:
        parts.append(f"{len(missing)} missing (e.g. {missing[0]})")
    if unexpected:
        parts.append(f"{len(unexpected)} unexpected (e.g. {unexpected[0]})")
    return "; ".join(parts) or "its tensors do not load into the model the config builds"


def layout_problems(state: Mapping[str, Tensor], cfg: GPTConfig) -> list[str]:
    """Missing, unexpected and mis-shaped keys; text rows may differ from cfg but must agree."""
    expected = official_shapes(cfg)
    missing = [k for k in expected if k not in state]
    unexpected = [k for k in state if k not in expected]
    misshaped = []
    for key in (k for k in expected if k in state):
        shape, want = tuple(state[key].shape), expected[key]
        if key in TEXT_ROW_KEYS:
            shape, want = shape[1:], want[1:]  # only columns are fixed by the config
        elif key.endswith(CONFORMER_INPUT_KEY) and len(shape) == 2 and shape[1] % max(shape[0], 1) == 0:
            # The encoders' input width is the w2v-BERT width (1024 in the releases); tiny test models
            # use a smaller one, which the conformer front-end's columns (d x bins) record.
            shape, want = shape[:1], want[:1]
        if shape != want:
            misshaped.append(f"{key} {list(state[key].shape)} (expected {list(expected[key])})")
    rows = {k: state[k].shape[0] for k in TEXT_ROW_KEYS if k in state and state[k].dim() > 0}
    if len(set(rows.values())) > 1:
        misshaped.append("text rows disagree: " + ", ".join(f"{k} {n}" for k, n in rows.items()))
    problems = []
    for label, names in (("missing", missing), ("unexpected", unexpected), ("mis-shaped", misshaped)):
        if names:
            problems.append(f"{len(names)} {label}: {preview_names(names)}")
    return problems
