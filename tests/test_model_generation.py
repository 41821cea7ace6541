"""Codes generated the way official inference generates them (model/generation.py), on tiny models."""

from __future__ import annotations

import pytest
import torch

from indextts_train.config.settings import load_config
from indextts_train.model.generation import (
    KVCache,
    SamplingSettings,
    generate_codes,
    processed_scores,
    prompt_rows,
    trunk_step,
)
from indextts_train.model.gpt import Batch, UnifiedVoiceGPT
from indextts_train.train.listen_check import summarize

CONFIGS = {"indextts2": "configs/tiny.yaml", "indextts2.5": "configs/tiny_v25.yaml"}


def tiny_model(family: str, seed: int = 0) -> UnifiedVoiceGPT:
    torch.manual_seed(seed)
    return UnifiedVoiceGPT(load_config(CONFIGS[family]).gpt, dropout=0.0).eval()


def lines(model: UnifiedVoiceGPT, text_lengths: list[int], codes: torch.Tensor, seed: int = 1) -> Batch:
    """A batch of random prompts and texts (ids 2..) with the given codes for every line."""
    cfg, count = model.cfg, len(text_lengths)
    rng = torch.Generator().manual_seed(seed)
    common = dict(text_ids=torch.randint(2, 90, (count, max(text_lengths)), generator=rng),
                  codes=codes.repeat(count, 1), text_lengths=torch.tensor(text_lengths),
                  code_lengths=torch.full((count,), codes.shape[0]),
                  emo_vec=torch.randn(count, cfg.model_dim, generator=rng))
    if cfg.family.speaker_vector:
        return Batch(**common, condition=None, spk_emb=torch.randn(count, 192, generator=rng),
                     lang_ids=torch.tensor([1, 2, 1][:count]))
    return Batch(**common, condition=torch.randn(count, 32, cfg.model_dim, generator=rng))


@pytest.mark.parametrize("family", CONFIGS)
def test_the_prompt_ends_where_training_predicts_the_first_code(family):
    """The prefill's last position (the start code) sees what training's first mel position sees."""
    model = tiny_model(family)
    batch = lines(model, [7], torch.tensor([3, 4, 5]))
    _, mel_hidden = model.hidden_states(batch)
    hidden = trunk_step(model, prompt_rows(model, batch)[0][None], KVCache(len(model.gpt.h)), torch.zeros(1).long())
    torch.testing.assert_close(hidden[0], mel_hidden[0, 0])


def test_cached_steps_and_left_padding_equal_one_full_pass():
    model = tiny_model("indextts2")
    torch.manual_seed(5)
    x = torch.randn(1, 12, model.cfg.model_dim)
    whole = trunk_step(model, x, KVCache(2), torch.zeros(1).long())
    cache = KVCache(2)
    cache.CHUNK = 3  # the cache grows several times on the way
    trunk_step(model, x[:, :5], cache, torch.zeros(1).long())
    for i in range(5, 12):
        stepped = trunk_step(model, x[:, i:i + 1], cache, torch.zeros(1).long())
    torch.testing.assert_close(stepped, whole)
    padded = torch.cat([torch.zeros(1, 4, x.shape[2]), x], dim=1)  # 4 pad rows before the same sequence
    both = trunk_step(model, torch.cat([padded, torch.cat([x, x[:, :4]], 1)]), KVCache(2), torch.tensor([4, 0]))
    torch.testing.assert_close(both[0], whole[0])


def test_penalty_temperature_top_k_and_top_p_follow_the_official_order():
    logits = torch.log(torch.tensor([[0.5, 0.2, 0.15, 0.1, 0.05]]))
    seen = torch.tensor([[True, False, False, False, False]])
    plain = processed_scores(logits, torch.zeros_like(seen), SamplingSettings(top_k=3, top_p=1.0))
    assert torch.isinf(plain[0, 3:]).all() and torch.isfinite(plain[0, :3]).all()  # top-3
    torch.testing.assert_close(plain[0, :3], logits[0, :3] / 0.8)  # log-probabilities / temperature
    penalised = processed_scores(logits, seen, SamplingSettings(top_k=5, top_p=0.5))
    # code 0's log-prob x10 falls below the others; top-p 0.5 then keeps codes 1 and 2 (at least 2)
    assert torch.isfinite(penalised[0]).tolist() == [False, True, True, False, False]


def test_same_generator_seed_same_codes_and_no_global_random_number_drawn():
    model = tiny_model("indextts2.5")
    batch = lines(model, [4, 6], torch.tensor([3, 4]))
    state = torch.get_rng_state()
    first = generate_codes(model, batch, max_codes=15, generator=torch.Generator().manual_seed(7))
    again = generate_codes(model, batch, max_codes=15, generator=torch.Generator().manual_seed(7))
    assert torch.equal(torch.get_rng_state(), state)
    assert [line.codes for line in first] == [line.codes for line in again]
    assert all(len(line.codes) <= 15 for line in first)


@pytest.mark.parametrize("family", CONFIGS)
def test_a_model_whose_stop_code_is_disabled_is_reported_as_never_stopping(family):
    model = tiny_model(family)
    with torch.no_grad():
        model.mel_head.bias[model.cfg.stop_mel_token] = -torch.inf
    target = torch.tensor([3, 4, 5, 6])
    generated = generate_codes(model, lines(model, [5, 3, 6], target), max_codes=12,
                               generator=torch.Generator().manual_seed(0))
    assert [(line.stopped, len(line.codes)) for line in generated] == [(False, 12)] * 3
    numbers = summarize(generated, [target.tolist()] * 3)
    assert numbers["stopped"] == 0.0 and numbers["length_ratio"] == 3.0


@pytest.mark.slow
@pytest.mark.parametrize("family", CONFIGS)
def test_a_model_trained_to_stop_stops(family):
    """Trained on six codes then the stop code, it stops, near the target's length (official inference
    places each generated code one position later than training, so an overfit tiny model may drop one)."""
    model = tiny_model(family).train()
    target = torch.tensor([3, 9, 17, 5, 30, 12])
    batch = lines(model, [6, 5, 4], target)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.0)
    for _ in range(50):
        optimizer.zero_grad()
        model.compute_losses(batch).mel_loss.backward()
        optimizer.step()
    generated = generate_codes(model.eval(), batch, max_codes=model.cfg.max_mel_tokens,
                               generator=torch.Generator().manual_seed(0))
    numbers = summarize(generated, [target.tolist()] * 3)
    assert numbers["stopped"] == 1.0, generated
    assert 0.6 <= numbers["length_ratio_worst"] <= 1.4, generated
