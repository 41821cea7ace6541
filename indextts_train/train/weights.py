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
from indextts_train.config.settings import Config
from indextts_train.errors import UserError
from indextts_train.model.gpt import UnifiedVoiceGPT
from indextts_train.model.layout import full_state_dict, init_carried, load_official
from indextts_train.model.lora import LoraAdapters, adapter_record, load_adapters
from indextts_train.model.scope import apply_scope, text_rows_trainable, trainable_parameters
from indextts_train.text.vocab import Tokenizer, VocabPlan
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
    trainable: list[tuple[str, nn.Parameter]]  # what the optimizer steps and clipping measures, in a fixed
    # order (model/scope.trainable_parameters), on the run's device
    adapters: LoraAdapters | None = None

    def state_dict(self) -> dict[str, Tensor]:
        return full_state_dict(self.model, self.carried)

    def load_state_dict(self, state: dict[str, Tensor]) -> None:
        """The official layout back: the module's tensors into the model (strict), the others carried."""
        self.carried = load_official(self.model, state)

    def adapter_record(self) -> dict | None:
        return adapter_record(self.adapters) if self.adapters is not None else None


@dataclass(frozen=True)
class _Start:
    """The official-layout tensors a run's weights start from, before the text rows grow."""

    state: dict[str, Tensor] | None  # None: random init
    saved: dict | None  # a resumed checkpoint's plan as saved (None: a new run)
    seed: int  # of the new text rows' values
    where: str | None  # the refusal's head when the tensors do not fit the config's model (None: no tensors)


def _fresh_start(config: Config, base: BaseCheckpoint | None, log: RunLogger) -> _Start:
    """A new run: the base checkpoint (the start's one read of it), or random init."""
    if base is None:
        log.warn("no --base-checkpoint: the GPT starts from random weights (fine for the demo, "
                 "not for fine-tuning)")
        return _Start(None, None, config.train.seed, None)
    if base.ignored:
        log.warn(base.ignored)
    return _Start(base.official_state(config.gpt), None, config.train.seed, f"{base.path}")


def _resumed_start(resumed: Resumed, config: Config, tokens: int) -> _Start:
    """A resumed run: the checkpoint's tensors (their family against the config's was checked with the rest of
    the saved model, model/scope.check_resume_fits); a vocabulary only grows."""
    path, state = resumed.path, resumed.model
    saved_tokens = state["text_embedding.weight"].shape[0] - 1
    if tokens < saved_tokens:
        raise UserError(f"the tokenizer has {tokens} pieces but the checkpoint {path} was trained with "
                        f"{saved_tokens}; a vocabulary can grow between runs, not shrink")
    return _Start(state, resumed.vocab_plan, config.train.seed + tokens,
                  f"{path} does not fit --config {config.source}")


def run_weights(resumed: Resumed | None, config: Config, tokenizer: Tokenizer, log: RunLogger,
                base: BaseCheckpoint | None, device: torch.device) -> tuple[Weights, VocabPlan]:
    """The run's weights (the checkpoint's, or fresh from the base) in the train scope, on the device,
    and the vocabulary growth since; the model family is settled by them (a random-init model of an
    unstated family is IndexTTS2).

    One pass, each owner once: the tensors to start from, their text rows grown to the tokenizer
    (text/vocab.py), the model built and filled (model/layout.py), the scope applied (model/scope.py)."""
    train = config.train
    start = _fresh_start(config, base, log) if resumed is None else _resumed_start(resumed, config, tokenizer.size)
    state, plan, growth = tokenizer.grow(start.state, start.saved, freeze_base=train.freeze_base_vocab,
                                         seed=start.seed)
    config.gpt.stated_family = config.gpt.family
    model = UnifiedVoiceGPT(config.gpt, dropout=train.dropout, activation_checkpointing=train.activation_checkpointing)
    carried = (init_carried(config.gpt, torch.Generator().manual_seed(start.seed)) if state is None
               else load_official(model, state, start.where))
    record = resumed.lora if resumed is not None else None
    rows_train = text_rows_trainable(bool(plan.new_ids), plan.freeze_base)
    generator = torch.Generator().manual_seed(train.seed + 1) if record is None else None  # new adapters
    adapters = apply_scope(model, scope_settings(train), text_rows_train=rows_train, generator=generator)
    model.to(device)
    if adapters is not None:
        adapters.to(device)
    trainable = trainable_parameters(model, adapters)  # on the device: what the optimizer holds
    if adapters is not None and record is not None:
        load_adapters(adapters, record, str(resumed.path))
    return Weights(model, carried, plan, trainable, adapters), growth
