"""The model's weights of a run: fresh from a base gpt.pth (grown to the tokenizer) or resumed from a
checkpoint (grown when the tokenizer grew since), with the carried encoder tensors, the vocabulary
plan and, under --train-scope lora, the adapters. The checkpoint's `model` part, official layout.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from indextts_train.checkpoint.base import BaseCheckpoint
from indextts_train.checkpoint.resumed import Resumed
from indextts_train.config.scope_settings import scope_settings
from indextts_train.config.settings import Config, TrainConfig
from indextts_train.errors import UserError
from indextts_train.model.gpt import UnifiedVoiceGPT
from indextts_train.model.layout import (
    full_state_dict,
    init_carried,
    mismatch_summary,
    resolve_family,
    split_state_dict,
)
from indextts_train.model.lora import LoraAdapters, adapter_record, load_adapters
from indextts_train.model.scope import apply_scope, text_rows_trainable, trainable_parameters
from indextts_train.text.vocab import Tokenizer, VocabPlan, resize_text_rows
from indextts_train.ui.console import RunLogger

Autocast = Callable[[], contextlib.AbstractContextManager]


@dataclass
class Weights:
    """The model and the carried (untrained) encoder tensors: the checkpoint's `model`, official layout.

    Under --train-scope lora also the adapters (the checkpoint's `lora`); the model's own tensors
    are then the frozen base.
    """

    model: UnifiedVoiceGPT
    carried: dict[str, Tensor]
    vocab_plan: VocabPlan
    adapters: LoraAdapters | None = None

    def state_dict(self) -> dict[str, Tensor]:
        return full_state_dict(self.model, self.carried)

    def load_state_dict(self, state: dict[str, Tensor]) -> None:
        """The official layout back: the module's tensors into the model (strict), the others carried."""
        trained, self.carried = split_state_dict(state, self.model.cfg)
        self.model.load_state_dict(trained, strict=True)

    def adapter_record(self) -> dict | None:
        return adapter_record(self.adapters) if self.adapters is not None else None

    def trainable(self) -> list[tuple[str, nn.Parameter]]:
        """What the optimizer steps and clipping measures, in a fixed order."""
        return trainable_parameters(self.model, self.adapters)

    def apply_scope(self, train: TrainConfig, record: dict | None, source: str) -> None:
        """Freeze what the scope does not train; lora: new adapters (seeded) or the checkpoint's `record`."""
        plan = self.vocab_plan
        rows = text_rows_trainable(bool(plan.new_ids), plan.freeze_base)
        generator = torch.Generator().manual_seed(train.seed + 1) if record is None else None
        self.adapters = apply_scope(self.model, scope_settings(train), text_rows_train=rows, generator=generator)
        if self.adapters is not None and record is not None:
            load_adapters(self.adapters, record, source)

    def to(self, device: torch.device) -> None:
        self.model.to(device)
        if self.adapters is not None:
            self.adapters.to(device)


def _new_model(config: Config, trained: dict[str, Tensor] | None = None) -> UnifiedVoiceGPT:
    train = config.train
    model = UnifiedVoiceGPT(config.gpt, dropout=train.dropout, activation_checkpointing=train.activation_checkpointing)
    if trained is not None:
        model.load_state_dict(trained, strict=True)
    return model


def fresh_weights(config: Config, tokenizer: Tokenizer, base: BaseCheckpoint | None, log: RunLogger) -> Weights:
    """Model weights for a new run: the base checkpoint (the start's one read of it) grown to the
    tokenizer, or random init."""
    train, tokens = config.train, tokenizer.size
    generator = torch.Generator().manual_seed(train.seed)
    if base is None:
        log.warn("no --base-checkpoint: the GPT starts from random weights (fine for the demo, "
                 "not for fine-tuning)")
        config.gpt.number_text_tokens = tokens
        return Weights(_new_model(config), init_carried(config.gpt, generator),
                       VocabPlan(tokens, tokens, train.freeze_base_vocab))
    if base.ignored:
        log.warn(base.ignored)
    trained, carried = base.official_weights(config.gpt)
    plan = tokenizer.growth_from(base.text_tokens, train.freeze_base_vocab)
    if tokens != base.text_tokens:
        trained = resize_text_rows(trained, plan, generator)
    config.gpt.number_text_tokens = tokens
    return Weights(_new_model(config, trained), carried, plan)


def resumed_weights(resumed: Resumed, config: Config, tokenizer: Tokenizer) -> tuple[Weights, VocabPlan]:
    """The checkpoint's weights, text rows grown when the tokenizer grew; also that growth (saved -> now)."""
    train, path, state, tokens = config.train, resumed.path, resumed.model, tokenizer.size
    resolve_family(config.gpt, state, path)
    saved_tokens = state["text_embedding.weight"].shape[0] - 1
    if tokens < saved_tokens:
        raise UserError(f"the tokenizer has {tokens} pieces but the checkpoint {path} was trained with "
                        f"{saved_tokens}; a vocabulary can grow between runs, not shrink")
    growth = tokenizer.growth_from(saved_tokens)
    if tokens != saved_tokens:
        state = resize_text_rows(state, growth, torch.Generator().manual_seed(train.seed + tokens))
    config.gpt.number_text_tokens = tokens
    saved = resumed.vocab_plan
    # A repaired community plan does not say where new rows went; the tokenizer's kind does.
    insert_at = saved.insert_at if saved.insert_at is not None else tokenizer.growth_point(saved.base_tokens)
    weights = Weights(_new_model(config), {}, VocabPlan(saved.base_tokens, tokens, train.freeze_base_vocab,
                                                        insert_at=insert_at))
    try:
        weights.load_state_dict(state)
    except RuntimeError:
        trained = split_state_dict(state, config.gpt)[0]
        raise UserError(f"{path} does not fit --config {config.source}: {mismatch_summary(trained, config.gpt)}; "
                        "pass the config the checkpoint was trained with") from None
    return weights, growth


def run_weights(resumed: Resumed | None, config: Config, tokenizer: Tokenizer, log: RunLogger,
                base: BaseCheckpoint | None, device: torch.device) -> tuple[Weights, VocabPlan]:
    """The run's weights (the checkpoint's, or fresh from the base) in the train scope, on the device,
    and the vocabulary growth since; the model family is settled by them (a random-init model of an
    unstated family is IndexTTS2)."""
    if resumed is None:
        weights, growth = fresh_weights(config, tokenizer, base, log), VocabPlan(tokenizer.size, tokenizer.size)
    else:
        weights, growth = resumed_weights(resumed, config, tokenizer)
    config.gpt.stated_family = config.gpt.family
    weights.apply_scope(config.train, resumed.lora if resumed is not None else None, str(resumed and resumed.path))
    weights.to(device)
    return weights, growth
