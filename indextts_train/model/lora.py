"""Low-rank adapters (LoRA) on the GPT-2 trunk's Conv1D layers, and folding them back into weights.

Why our own ~150 lines and not `peft`: peft is not among this project's dependencies and it is
built around `transformers` models (PreTrainedModel configs, `fan_in_fan_out` detection by class,
its own save format); UnifiedVoiceGPT is a plain `nn.Module` whose state dict must stay exactly the
official `gpt.pth` key set. So the adapters live in their own module (`LoraAdapters`) and reach the
trunk through forward hooks: the model's state dict, its key checks, the row freezer and everything
else that reads it are unchanged, and the adapters have their own state dict, keyed like peft's
(`gpt.h.0.attn.c_attn.lora_A`), which checkpoints store next to the model.

One adapter on a Conv1D layer `y = x W + b` (W stored [in, out]) adds
    scale * (dropout(x) @ A^T) @ B^T,   A (r, in), B (out, r), scale = alpha / r,
with A uniform in +-1/sqrt(in) (kaiming, as peft) and B = 0, so the adapted model starts equal to
the base. Merging folds it into W' = W + scale * A^T B^T, the plain layer inference loads.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Mapping
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.utils.hooks import RemovableHandle

from indextts_train.errors import UserError

# --train-scope lora targets -> the Conv1D layer they adapt in every trunk block.
LORA_TARGETS = {"qkv": "attn.c_attn", "attn_out": "attn.c_proj", "mlp_in": "mlp.c_fc", "mlp_out": "mlp.c_proj"}
ADAPTER_SUFFIXES = (".lora_A", ".lora_B")


@dataclass(frozen=True)
class LoraSpec:
    """Shape of the adapters: rank, alpha, dropout and which Conv1D layers of each block."""

    rank: int = 16
    alpha: float = 32.0
    # 0: a dropout before every adapter keeps a mask over each adapted input, ~0.5 GiB per sample of
    # maximum length on the real config without activation checkpointing, and the trunk's own
    # dropout (train.dropout, 0.1) already sits on the same paths.
    dropout: float = 0.0
    targets: tuple[str, ...] = tuple(LORA_TARGETS)

    def __post_init__(self) -> None:
        if isinstance(self.rank, bool) or not isinstance(self.rank, int) or self.rank < 1:
            raise UserError(f"train.lora_rank must be an integer >= 1, got {self.rank!r}")
        if not self.alpha > 0:
            raise UserError(f"train.lora_alpha must be > 0, got {self.alpha!r}")
        if not 0.0 <= self.dropout < 1.0:
            raise UserError(f"train.lora_dropout must be in [0, 1), got {self.dropout!r}")
        unknown = [t for t in self.targets if t not in LORA_TARGETS]
        if unknown or not self.targets or len(set(self.targets)) != len(self.targets):
            raise UserError(f"train.lora_targets {','.join(self.targets) or '(empty)'}: choose one or more of "
                            f"{', '.join(LORA_TARGETS)} (comma-separated), each once")

    @property
    def scale(self) -> float:
        return self.alpha / self.rank


def parse_targets(value: str) -> tuple[str, ...]:
    """`qkv, attn_out` (flag or config) -> ('qkv', 'attn_out'); LoraSpec checks the names."""
    return tuple(item.strip() for item in value.split(",") if item.strip())


class LoraLinear(nn.Module):
    """The low-rank update of one Conv1D layer; `forward(x)` is the delta added to its output."""

    def __init__(self, n_in: int, n_out: int, spec: LoraSpec, device: torch.device | None = None) -> None:
        super().__init__()
        self.lora_A = nn.Parameter(torch.zeros(spec.rank, n_in, device=device))
        self.lora_B = nn.Parameter(torch.zeros(n_out, spec.rank, device=device))
        self.scale = spec.scale
        self.dropout = spec.dropout

    def reset(self, generator: torch.Generator) -> None:
        """A ~ U(+-1/sqrt(in)) from `generator` (not the global RNG, which resume restores); B = 0."""
        bound = 1.0 / math.sqrt(self.lora_A.shape[1])
        values = (torch.rand(self.lora_A.shape, generator=generator) * 2 - 1) * bound
        with torch.no_grad():
            self.lora_A.copy_(values)
            self.lora_B.zero_()

    def forward(self, x: Tensor, training: bool) -> Tensor:  # (..., in) -> (..., out)
        """`training` is the adapted layer's mode, so `model.eval()` alone turns the dropout off."""
        if self.dropout > 0:
            x = F.dropout(x, self.dropout, training=training)
        return (x @ self.lora_A.T) @ self.lora_B.T * self.scale

    def delta_weight(self) -> Tensor:
        """The update in Conv1D layout [in, out], float32."""
        return (self.lora_A.detach().float().T @ self.lora_B.detach().float().T) * self.scale


def _container(root: nn.Module, path: list[str]) -> nn.Module:
    """The nested plain module at `path` under `root`, made on the way, so names mirror the trunk's."""
    node = root
    for part in path:
        if not hasattr(node, part):
            node.add_module(part, nn.Module())
        node = getattr(node, part)
    return node


class LoraAdapters(nn.Module):
    """Every adapter of a model; `state_dict()` keys are `<layer>.lora_A` / `<layer>.lora_B`.

    Made by `attach_lora`, which hooks each adapted layer. Its parameters are the ones that train
    (with the heads and new text rows); the base layers it adapts stay frozen.
    """

    def __init__(self, spec: LoraSpec, blocks: int) -> None:
        super().__init__()
        self.spec = spec
        self.blocks = blocks  # trunk blocks of the adapted model
        self.layers: dict[str, LoraLinear] = {}  # official layer name -> adapter
        self._handles: list[RemovableHandle] = []

    def add(self, name: str, layer: nn.Module, adapter: LoraLinear) -> None:
        *path, leaf = name.split(".")
        _container(self, path).add_module(leaf, adapter)
        self.layers[name] = adapter

        def hook(module: nn.Module, args: tuple, output: Tensor) -> Tensor:
            return output + adapter(args[0], module.training).to(output.dtype)

        self._handles.append(layer.register_forward_hook(hook))

    def detach_hooks(self) -> None:
        """Stop adding the adapters to the model's layers (the model is the base model again)."""
        for handle in self._handles:
            handle.remove()
        self._handles.clear()


def adapted_layer_names(layers: int, spec: LoraSpec) -> list[str]:
    """Official names of the adapted Conv1D layers, block by block: `gpt.h.{i}.attn.c_attn`, ..."""
    return [f"gpt.h.{i}.{LORA_TARGETS[target]}" for i in range(layers) for target in spec.targets]


def attach_lora(model: nn.Module, spec: LoraSpec, generator: torch.Generator | None) -> LoraAdapters:
    """Adapters on every targeted trunk layer of `model`, hooked in, starting at delta 0.

    `generator` draws the A matrices; None leaves them zero (to be loaded from a checkpoint).
    The model's own parameters are not touched: freezing them is the scope's decision.
    """
    adapters = LoraAdapters(spec, len(model.gpt.h))
    for name in adapted_layer_names(adapters.blocks, spec):
        layer = model.get_submodule(name)
        n_in, n_out = layer.weight.shape  # Conv1D: [in, out]
        adapter = LoraLinear(n_in, n_out, spec, device=layer.weight.device)
        if generator is not None:
            adapter.reset(generator)
        adapters.add(name, layer, adapter)
    return adapters


def adapter_names(state: Mapping[str, Tensor]) -> list[str]:
    """Layer names that `state` (an adapter state dict) holds both matrices for."""
    return [key[: -len(".lora_A")] for key in state if key.endswith(".lora_A") and
            key[: -len(".lora_A")] + ".lora_B" in state]


def merge_lora(weights: Mapping[str, Tensor], adapters: Mapping[str, Tensor], spec: LoraSpec) -> dict[str, Tensor]:
    """`weights` with every adapter folded in: W' = W + scale * A^T B^T (float32); other keys as given.

    `weights` are official keys (`gpt.h.0.attn.c_attn.weight` [in, out]); `adapters` is a
    `LoraAdapters` state dict. A key of one that the other lacks is an error, never skipped.
    """
    names = adapter_names(adapters)
    stray = sorted(set(adapters) - {f"{n}{s}" for n in names for s in ADAPTER_SUFFIXES})
    missing = [f"{n}.weight" for n in names if f"{n}.weight" not in weights]
    if stray or missing:
        raise UserError(f"cannot merge the adapters: unpaired adapter keys {stray[:4]}, "
                        f"adapted weights missing {missing[:4]}")
    merged = dict(weights)
    for name in names:
        a, b = adapters[f"{name}.lora_A"].float(), adapters[f"{name}.lora_B"].float()  # (r, in), (out, r)
        base = weights[f"{name}.weight"]  # (in, out)
        if a.shape[0] != spec.rank or a.shape[1] != base.shape[0] or b.shape[0] != base.shape[1]:
            raise UserError(f"cannot merge the adapter of {name}: A {list(a.shape)}, B {list(b.shape)} do not "
                            f"fit weight {list(base.shape)} at rank {spec.rank}")
        merged[f"{name}.weight"] = (base.float() + (a.T @ b.T) * spec.scale).to(base.dtype)
    return merged


# ---------------------------------------------------------------------------------------------
# In a checkpoint: `lora` = {rank, alpha, dropout, targets, adapters}, so a merge never depends on a
# config passed later


def adapter_record(adapters: LoraAdapters) -> dict:
    """The checkpoint's `lora` entry: the spec and float32 CPU copies of the adapters."""
    spec = adapters.spec
    return {"rank": spec.rank, "alpha": spec.alpha, "dropout": spec.dropout, "targets": list(spec.targets),
            "adapters": {k: v.detach().to("cpu", torch.float32, copy=True) for k, v in adapters.state_dict().items()}}


def record_spec(record: dict) -> LoraSpec:
    return LoraSpec(rank=record["rank"], alpha=record["alpha"], dropout=record["dropout"],
                    targets=tuple(record["targets"]))


def record_problem(record: object, layers: object) -> str | None:
    """Why a checkpoint's `lora` entry cannot rebuild the adapters of a `layers`-block model, or None."""
    if not isinstance(record, dict) or not isinstance(record.get("adapters"), dict):
        return "lora: expected {rank, alpha, dropout, targets, adapters}"
    if not isinstance(layers, int):
        return "lora: the stored config has no gpt.layers to check the adapters against"
    try:
        spec = record_spec(record)
    except (KeyError, TypeError, UserError) as exc:
        return f"lora: bad adapter settings ({exc})"
    want = {f"{layer}{suffix}" for layer in adapted_layer_names(layers, spec) for suffix in ADAPTER_SUFFIXES}
    got = record["adapters"]
    if set(got) != want or not all(isinstance(v, Tensor) and v.dtype == torch.float32 for v in got.values()):
        return f"lora: adapters do not match rank {spec.rank} on {','.join(spec.targets)} of {layers} blocks"
    return None


def load_adapters(adapters: LoraAdapters, record: dict, source: str) -> None:
    """Put a checkpoint's adapters into `adapters` (same spec, same layers), exactly."""
    problem = record_problem(record, adapters.blocks)
    if problem is None and record_spec(record) != adapters.spec:
        problem = f"lora: saved settings {record_spec(record)} differ from the run's {adapters.spec}"
    if problem:
        raise UserError(f"{source}: {problem}")
    with torch.no_grad():
        for name, param in adapters.named_parameters():
            param.copy_(record["adapters"][name])


# ---------------------------------------------------------------------------------------------
# The adapters-only file


ADAPTER_FILE_FORMAT = "indextts-train-lora"
ADAPTER_FILE_VERSION = 1


def base_fingerprint(weights: Mapping[str, Tensor], layers: list[str]) -> str:
    """sha256 of the adapted base weights (float32 bytes, in `layers` order).

    Training freezes them bit-identically, so the fingerprint taken from a checkpoint equals the one
    of the base gpt.pth it started from: an adapter file can say exactly which weights it applies to.
    """
    digest = hashlib.sha256()
    for layer in layers:
        weight = weights[f"{layer}.weight"].detach().to("cpu", torch.float32).contiguous()
        digest.update(layer.encode())
        digest.update(weight.numpy().tobytes())
    return digest.hexdigest()


def adapter_file(adapters: Mapping[str, Tensor], spec: LoraSpec, base_weights: Mapping[str, Tensor],
                 tensors: Mapping[str, Tensor], applies_to: dict) -> dict:
    """What `export --adapters-out` writes: the adapters, the other tensors the run trained (heads,
    text rows: an adapter alone would not reproduce the fine-tune) and what they apply to."""
    layers = adapter_names(adapters)
    return {
        "format": ADAPTER_FILE_FORMAT, "format_version": ADAPTER_FILE_VERSION,
        "lora": {"rank": spec.rank, "alpha": spec.alpha, "scale": spec.scale, "dropout": spec.dropout,
                 "targets": list(spec.targets), "layers": layers,
                 "rule": "W' = W + scale * lora_A^T @ lora_B^T, W stored [in, out] (GPT-2 Conv1D)"},
        "applies_to": {**applies_to, "base_weights_sha256": base_fingerprint(base_weights, layers)},
        "adapters": {k: v.detach().to("cpu", torch.float32, copy=True) for k, v in adapters.items()},
        "tensors": {k: v.detach().to("cpu", torch.float32, copy=True) for k, v in tensors.items()},
    }


def apply_adapter_file(gpt_state: Mapping[str, Tensor], payload: dict, source: str) -> dict[str, Tensor]:
    """A base gpt.pth state with an adapter file applied: adapters merged, trained tensors replaced.

    Refuses (UserError naming `source`) a base whose adapted weights are not the ones trained on.
    """
    if not isinstance(payload, dict) or payload.get("format") != ADAPTER_FILE_FORMAT:
        raise UserError(f"{source}: not an indextts-train adapter file")
    info = payload["lora"]
    spec = LoraSpec(info["rank"], info["alpha"], info["dropout"], tuple(info["targets"]))
    want = payload["applies_to"]["base_weights_sha256"]
    missing = [f"{layer}.weight" for layer in info["layers"] if f"{layer}.weight" not in gpt_state]
    if missing:
        raise UserError(f"{source}: the base checkpoint lacks {missing[0]}; it is for another model layout")
    if base_fingerprint(gpt_state, info["layers"]) != want:
        raise UserError(f"{source}: the adapters were trained on other base weights (sha256 {want[:12]}...); "
                        "apply them to the gpt.pth the run started from")
    merged = merge_lora(gpt_state, payload["adapters"], spec)
    for key, value in payload["tensors"].items():
        if key not in merged:
            raise UserError(f"{source}: tensor {key} is not in the base checkpoint")
        merged[key] = value.to(merged[key].dtype)
    return merged
