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

A resume keeps the model and the scope it was trained in (`check_resume_fits`).
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Iterable
from pathlib import Path
from types import SimpleNamespace

import torch
from torch import nn

from indextts_train.config.family import family_of_keys
from indextts_train.config.scope_settings import SCOPE_KEYS, ScopeSettings, scope_settings
from indextts_train.config.settings import Config, GPTConfig, TrainConfig, changed_gpt_keys
from indextts_train.errors import UserError
from indextts_train.model.layout import official_shapes, trained_keys
from indextts_train.model.lora import LoraAdapters, adapted_layer_names, attach_lora

HEAD_PREFIXES = ("text_head.", "mel_head.")
PARTIAL_EXTRA_PREFIXES = ("gpt.ln_f.", "final_norm.")
ROW_FROZEN_PREFIXES = ("lang_embedding.", "spk_emb_proj.")  # IndexTTS-2.5: the row freezer decides
_BLOCK = re.compile(r"^gpt\.h\.(\d+)\.")



def check_resume_fits(saved_gpt: dict, saved_train: dict, config: Config, path: Path,
                      keys: Iterable[str] = ()) -> None:
    """A run resumes the model and the scope it was trained in, or is refused, naming both.

    Another scope would change which tensors the optimizer holds (and, for lora, the model itself): the
    supported way is export (merged) and a new run from it as --base-checkpoint. Another gpt: section
    (heads, say, which no tensor's shape shows) would go on training another model under the weights.
    The family first (`keys`: the checkpoint's weights'), which no gpt: key names: a config of the other
    family was refused only for a length limit it happens to differ in.
    """
    saved_family = family_of_keys(keys)
    if saved_family is not None and saved_family is not config.gpt.family:
        raise UserError(f"{path} holds an {saved_family.name} model, and --config {config.source} builds "
                        f"{config.gpt.family.name}: a run resumes the model it trained; pass the config it was "
                        "trained with (--from-run OUTPUT_DIR/run.yaml reruns its options)")
    defaults = dataclasses.asdict(TrainConfig())
    saved = scope_settings(SimpleNamespace(**{k: saved_train.get(k, defaults[k]) for k in SCOPE_KEYS}))
    current = scope_settings(config.train)
    if saved.to_dict() != current.to_dict():
        raise UserError(f"{path} was trained with --train-scope {saved.describe()}; this run asks for "
                        f"{current.describe()}; a scope cannot change on resume: resume with the checkpoint's "
                        "settings, or `indextts-train export` it (adapters merged) and start a new --output-dir "
                        "with the export as --base-checkpoint")
    changed = changed_gpt_keys(saved_gpt, config.gpt)
    if changed:
        raise UserError(f"--config {config.source} changes the model {path} was trained as "
                        f"({'; '.join(changed)}): a run resumes the model it trained; pass the config it was trained "
                        "with (--from-run OUTPUT_DIR/run.yaml reruns its options), or train the changed model in a "
                        "new --output-dir")


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
    settings.check_fits(model.cfg.layers)
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
    settings.check_fits(cfg.layers)
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
