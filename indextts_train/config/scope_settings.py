"""The train-scope settings (`train_scope`, `partial_layers`, `lora_*`): what they may be, checked by name.

They live in the config layer because TrainConfig checks them when it is built; what a scope does to
a model (which tensors train, the adapters) is model/scope.py's and model/lora.py's.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from indextts_train.errors import UserError

TRAIN_SCOPES = ("full", "partial", "lora")
SCOPE_KEYS = ("train_scope", "partial_layers", "lora_rank", "lora_alpha", "lora_dropout", "lora_targets")
# --train-scope lora targets -> the Conv1D layer they adapt in every trunk block.
LORA_TARGETS = {"qkv": "attn.c_attn", "attn_out": "attn.c_proj", "mlp_in": "mlp.c_fc", "mlp_out": "mlp.c_proj"}


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
            raise UserError(f"train.lora_targets (--lora-targets) {','.join(self.targets) or '(empty)'}: choose one "
                            f"or more of {', '.join(LORA_TARGETS)} (comma-separated), each once")

    @property
    def scale(self) -> float:
        return self.alpha / self.rank


def parse_targets(value: str) -> tuple[str, ...]:
    """`qkv, attn_out` (flag or config) -> ('qkv', 'attn_out'); LoraSpec checks the names."""
    return tuple(item.strip() for item in value.split(",") if item.strip())


@dataclass(frozen=True)
class ScopeSettings:
    """The scope and its settings, named as the config's `train:` keys."""

    train_scope: str = "full"
    partial_layers: int = 4
    lora: LoraSpec = field(default_factory=LoraSpec)

    def __post_init__(self) -> None:
        if self.train_scope not in TRAIN_SCOPES:
            raise UserError(f"train.train_scope {self.train_scope!r}: choose one of {', '.join(TRAIN_SCOPES)}")
        if isinstance(self.partial_layers, bool) or not isinstance(self.partial_layers, int) \
                or self.partial_layers < 1:
            raise UserError(f"train.partial_layers must be an integer >= 1, got {self.partial_layers!r}")

    def check_fits(self, layers: int) -> None:
        """Refuse a partial scope deeper than the model's `layers` trunk blocks (gpt.layers)."""
        if self.train_scope == "partial" and self.partial_layers > layers:
            raise UserError(f"train.partial_layers {self.partial_layers} is more than the model's "
                            f"{layers} trunk blocks (gpt.layers); use at most {layers}, or --train-scope full")

    def to_dict(self) -> dict:
        """What a checkpoint records (plain types): only the settings that shape this scope."""
        out: dict = {"train_scope": self.train_scope}
        if self.train_scope == "partial":
            out["partial_layers"] = self.partial_layers
        if self.train_scope == "lora":
            spec = self.lora
            out.update(lora_rank=spec.rank, lora_alpha=spec.alpha, lora_dropout=spec.dropout,
                       lora_targets=list(spec.targets))
        return out

    def describe(self) -> str:
        if self.train_scope == "partial":
            return f"partial (last {self.partial_layers} trunk block(s), final norms, heads, text rows)"
        if self.train_scope == "lora":
            spec = self.lora
            return (f"lora (rank {spec.rank}, alpha {spec.alpha:g}, dropout {spec.dropout:g}, "
                    f"targets {','.join(spec.targets)}; heads, text rows)")
        return "full (every tensor but the conditioning and emotion encoders, carried as they are)"

def scope_settings(train: Any) -> ScopeSettings:
    """The scope settings of a TrainConfig (its train_scope, partial_layers and lora_* fields)."""
    return ScopeSettings(train_scope=train.train_scope, partial_layers=train.partial_layers,
                         lora=LoraSpec(rank=train.lora_rank, alpha=train.lora_alpha, dropout=train.lora_dropout,
                                       targets=parse_targets(train.lora_targets)))
