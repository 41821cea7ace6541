"""`--train-scope full | partial | lora`: which tensors train, and everything else frozen bit-identically.

- full: every tensor of the model trains (the base text rows still follow the row freezer).
- partial: the last `partial_layers` trunk blocks, the trunk's closing `gpt.ln_f`, `final_norm`, the
  two heads and the text embedding when it has rows to learn.
- lora: low-rank adapters on the trunk (lora.py), the two heads and the text embedding when it has
  rows to learn; every base trunk weight frozen.

IndexTTS-2.5's `lang_embedding` and `spk_emb_proj` (small: 107 and 193 rows) stay trainable in
every scope and the row freezer decides what of them moves, as in full training: the rows of the
languages the data has (the rest bit-identical), and `spk_emb_proj` only with --train-speaker-proj.
So a new language learns its row under partial and lora too, and --train-speaker-proj may still
change on resume (the optimizer's parameter set does not depend on it).

"Rows to learn" means the vocabulary grew (new rows; the base rows stay frozen by the row freezer)
or the user unfroze the base vocabulary. Frozen tensors get `requires_grad=False`: no gradient, no
optimizer state, nothing AdamW's decay could move, so they stay bit-identical by construction. A
trainable tensor is trained whole (its optimizer state covers every row); the row freezer keeps the
base rows of the three text tensors as they were, for every scope.
"""

from __future__ import annotations

import dataclasses
import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import torch
from torch import nn

from indextts_train.config.settings import GPTConfig, TrainConfig
from indextts_train.errors import UserError
from indextts_train.model.layout import official_shapes, trained_keys
from indextts_train.model.lora import LoraAdapters, LoraSpec, adapted_layer_names, attach_lora, parse_targets

TRAIN_SCOPES = ("full", "partial", "lora")
HEAD_PREFIXES = ("text_head.", "mel_head.")
PARTIAL_EXTRA_PREFIXES = ("gpt.ln_f.", "final_norm.")
ROW_FROZEN_PREFIXES = ("lang_embedding.", "spk_emb_proj.")  # IndexTTS-2.5: the row freezer decides
_BLOCK = re.compile(r"^gpt\.h\.(\d+)\.")
SCOPE_KEYS = ("train_scope", "partial_layers", "lora_rank", "lora_alpha", "lora_dropout", "lora_targets")


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

    def check_fits(self, cfg: GPTConfig) -> None:
        if self.train_scope == "partial" and self.partial_layers > cfg.layers:
            raise UserError(f"train.partial_layers {self.partial_layers} is more than the model's "
                            f"{cfg.layers} trunk blocks (gpt.layers); use at most {cfg.layers}, or --train-scope full")

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
        return "full (every tensor)"


def scope_settings(train: Any) -> ScopeSettings:
    """The scope settings of a TrainConfig (its train_scope, partial_layers and lora_* fields)."""
    return ScopeSettings(train_scope=train.train_scope, partial_layers=train.partial_layers,
                         lora=LoraSpec(rank=train.lora_rank, alpha=train.lora_alpha, dropout=train.lora_dropout,
                                       targets=parse_targets(train.lora_targets)))


def check_resume_scope(saved_train: dict, current: ScopeSettings, path: Path) -> None:
    """Refuse a resume under another scope or other scope settings, naming both.

    Switching in place would change which tensors the optimizer holds (and, for lora, the model
    itself); the supported way is export (merged) and a new run from it as --base-checkpoint.
    """
    defaults = dataclasses.asdict(TrainConfig())
    saved = scope_settings(SimpleNamespace(**{k: saved_train.get(k, defaults[k]) for k in SCOPE_KEYS}))
    if saved.to_dict() == current.to_dict():
        return
    raise UserError(f"{path} was trained with --train-scope {saved.describe()}; this run asks for "
                    f"{current.describe()}; a scope cannot change on resume: resume with the checkpoint's "
                    "settings, or `indextts-train export` it (adapters merged) and start a new --output-dir "
                    "with the export as --base-checkpoint")


def text_rows_trainable(new_rows: bool, freeze_base: bool) -> bool:
    """Whether the text embedding trains in partial/lora: it does when it has rows to learn."""
    return new_rows or not freeze_base


def is_trainable(name: str, settings: ScopeSettings, layers: int, text_rows_train: bool) -> bool:
    """Whether the model parameter `name` (an official key) trains under `settings`."""
    if settings.train_scope == "full":
        return True
    if name.startswith(HEAD_PREFIXES + ROW_FROZEN_PREFIXES):
        return True
    if name == "text_embedding.weight":
        return text_rows_train
    if settings.train_scope == "partial":
        if name.startswith(PARTIAL_EXTRA_PREFIXES):
            return True
        block = _BLOCK.match(name)
        return block is not None and int(block.group(1)) >= layers - settings.partial_layers
    return False


def apply_scope(model: nn.Module, settings: ScopeSettings, *, text_rows_train: bool,
                generator: torch.Generator | None) -> LoraAdapters | None:
    """Freeze what the scope does not train; for lora, attach adapters (A drawn from `generator`).

    Returns the adapters (lora) or None. Call before building the optimizer.
    """
    settings.check_fits(model.cfg)
    layers = model.cfg.layers
    for name, param in model.named_parameters():
        param.requires_grad_(is_trainable(name, settings, layers, text_rows_train))
    if settings.train_scope != "lora":
        return None
    return attach_lora(model, settings.lora, generator)


def trainable_parameters(model: nn.Module, adapters: LoraAdapters | None) -> list[tuple[str, nn.Parameter]]:
    """(name, parameter) of everything that trains: the model's unfrozen tensors, then the adapters."""
    named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    if adapters is not None:
        named += list(adapters.named_parameters())
    return named


def scope_counts(cfg: GPTConfig, settings: ScopeSettings, *, text_rows_train: bool = True) -> dict[str, int]:
    """Parameter counts of `cfg` under `settings`, from the official shapes (no model, no memory).

    {"model": every parameter of the trained module, "trainable": what gets gradients and AdamW state
    (adapters included), "frozen": model parameters that do not train, "adapters": LoRA numbers}.
    """
    settings.check_fits(cfg)
    shapes = official_shapes(cfg)
    sizes = {key: math.prod(shapes[key]) for key in trained_keys(cfg)}
    frozen = sum(n for key, n in sizes.items() if not is_trainable(key, settings, cfg.layers, text_rows_train))
    adapters = 0
    if settings.train_scope == "lora":
        for layer in adapted_layer_names(cfg.layers, settings.lora):
            n_in, n_out = shapes[f"{layer}.weight"]  # Conv1D [in, out]
            adapters += settings.lora.rank * (n_in + n_out)
    total = sum(sizes.values())
    return {"model": total, "trainable": total - frozen + adapters, "frozen": frozen, "adapters": adapters}
