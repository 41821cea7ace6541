"""UnifiedVoiceGPT against the reference: layout, losses, gradients, checkpoint loading."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from helpers import reference_batch, reference_model

from indextts_train.config.settings import GPTConfig, load_config
from indextts_train.errors import UserError
from indextts_train.model.gpt import UnifiedVoiceGPT, aligned_sequences, masked_token_ce

REF = Path(__file__).resolve().parent / "data" / "reference"
TINY = REF / "tiny"


@pytest.fixture(scope="module")
def cfg() -> GPTConfig:
    return load_config(TINY / "config.yaml").gpt


@pytest.fixture(scope="module")
def expected() -> dict:
    return json.loads((TINY / "expected.json").read_text())


@pytest.fixture(scope="module")
def reference_sd() -> dict[str, torch.Tensor]:
    return torch.load(TINY / "gpt.pth", weights_only=True)


@pytest.fixture()
def model() -> UnifiedVoiceGPT:
    return reference_model(TINY)


def test_fresh_init_follows_the_official_rules(cfg):
    torch.manual_seed(0)
    net = UnifiedVoiceGPT(cfg)
    assert torch.equal(net.speed_emb.weight, torch.zeros(2, 64))
    assert abs(net.mel_embedding.weight.std().item() - 0.02) < 0.003
    assert torch.equal(net.gpt.h[0].attn.c_attn.bias, torch.zeros(192))
    assert net.gpt.h[1].mlp.c_proj.weight.std() < net.gpt.h[1].mlp.c_fc.weight.std()  # scaled residual init


def test_aligned_inputs_targets_and_masks_match_the_reference(cfg, expected):
    batch = reference_batch()
    internals = expected["internals"]
    text_in, text_tgt = aligned_sequences(batch.text_ids, batch.text_lengths, 0, 1)
    mel_in, mel_tgt = aligned_sequences(batch.codes, batch.code_lengths, 64, 65)
    assert text_in.tolist() == internals["text_inputs"] and text_tgt.tolist() == internals["text_targets"]
    assert mel_in.tolist() == internals["mel_inputs"] and mel_tgt.tolist() == internals["mel_targets"]
    _, text_mask = masked_token_ce(torch.zeros(3, 101, 14), text_tgt, batch.text_lengths)
    _, mel_mask = masked_token_ce(torch.zeros(3, 66, 24), mel_tgt, batch.code_lengths)
    assert text_mask.int().tolist() == internals["text_mask"]
    assert mel_mask.int().tolist() == internals["mel_mask"]


def test_eval_losses_logits_and_per_sample_sums_match_the_reference(model, expected):
    batch = reference_batch()
    with torch.no_grad():
        text_logits, mel_logits = model(batch)
        out = model.compute_losses(batch)
    ref = expected["eval"]
    assert list(text_logits.shape) == ref["text_logits_shape"]
    assert list(mel_logits.shape) == ref["mel_logits_shape"]
    assert out.text_loss.item() == pytest.approx(ref["text_loss"], abs=1e-5)
    assert out.mel_loss.item() == pytest.approx(ref["mel_loss"], abs=1e-5)
    assert out.mel_top1.item() == pytest.approx(ref["mel_top1"], abs=1e-6)
    internals = expected["internals"]
    assert text_logits.double().sum().item() == pytest.approx(internals["text_logits_sum"], abs=1e-3)
    assert mel_logits.double().sum().item() == pytest.approx(internals["mel_logits_sum"], abs=1e-3)
    first = text_logits[0, :8, 0].tolist()
    assert first == pytest.approx(internals["text_logits_first_position_sample0"], abs=1e-5)

    _, text_tgt = aligned_sequences(batch.text_ids, batch.text_lengths, 0, 1)
    _, mel_tgt = aligned_sequences(batch.codes, batch.code_lengths, 64, 65)
    text_ce, text_mask = masked_token_ce(text_logits, text_tgt, batch.text_lengths)
    mel_ce, mel_mask = masked_token_ce(mel_logits, mel_tgt, batch.code_lengths)
    hits = (mel_logits.argmax(1) == mel_tgt) & mel_mask
    for b, sample in enumerate(internals["per_sample"]):
        assert text_ce[b].sum().item() == pytest.approx(sample["text_ce_sum"], abs=1e-4)
        assert mel_ce[b].sum().item() == pytest.approx(sample["mel_ce_sum"], abs=1e-4)
        assert text_mask[b].sum().item() == sample["text_valid"]
        assert mel_mask[b].sum().item() == sample["mel_valid"]
        assert hits[b].sum().item() == sample["mel_top1_correct"]
    # The sums aggregate exactly: they are what the means are made of.
    assert out.text_count.item() == sum(s["text_valid"] for s in internals["per_sample"])
    assert out.mel_correct.item() == 3 and out.mel_count.item() == 49
    assert (out.text_ce_sum / out.text_count).item() == pytest.approx(out.text_loss.item(), rel=1e-7)


def test_each_example_alone_matches_the_unbatched_reference(model, expected):
    lines = [json.loads(line) for line in (TINY / "pairs.jsonl").read_text().splitlines()]
    for line, ref in zip(lines, expected["unbatched_eval"], strict=True):
        with torch.no_grad():
            out = model.compute_losses(reference_batch([line]))
        assert out.text_loss.item() == pytest.approx(ref["text_loss"], abs=1e-5)
        assert out.mel_loss.item() == pytest.approx(ref["mel_loss"], abs=1e-5)
        assert out.mel_top1.item() == pytest.approx(ref["mel_top1"], abs=1e-6)


def test_eval_gradients_match_the_reference(model, expected):
    out = model.compute_losses(reference_batch())
    (0.2 * out.text_loss + 0.8 * out.mel_loss).backward()
    ref = expected["eval_gradients"]
    with_grad = [k for k, p in model.named_parameters() if p.grad is not None]
    assert with_grad == ref["keys_with_grad"]
    for key, param in model.named_parameters():
        assert param.grad.norm().item() == pytest.approx(ref["grad_l2_norm"][key], rel=1e-4), key


def test_activation_checkpointing_gives_the_same_losses_and_gradients(cfg, model):
    plain = model.train()
    checkpointed = UnifiedVoiceGPT(cfg, activation_checkpointing=True).train()
    checkpointed.load_state_dict(plain.state_dict())
    results = []
    for net in (plain, checkpointed):
        torch.manual_seed(7)  # same dropout masks: checkpoint replays the RNG on recompute
        out = net.compute_losses(reference_batch())
        (out.text_loss + out.mel_loss).backward()
        results.append((out.mel_loss.item(), [p.grad.clone() for p in net.parameters()]))
    assert results[0][0] == pytest.approx(results[1][0], abs=1e-6)
    for a, b in zip(results[0][1], results[1][1], strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-7)


def test_train_mode_is_stochastic_and_eval_mode_deterministic(model):
    batch = reference_batch()
    with torch.no_grad():
        eval_losses = {model.compute_losses(batch).mel_loss.item() for _ in range(2)}
        model.train()
        train_losses = {model.compute_losses(batch).mel_loss.item() for _ in range(2)}
    assert len(eval_losses) == 1
    assert len(train_losses) == 2


def test_batch_to_and_len():
    batch = reference_batch()
    moved = batch.to("cpu")
    assert len(moved) == 3 and moved.condition.shape == (3, 32, 64)
    assert torch.equal(moved.codes, batch.codes)


def test_too_wide_batch_is_a_user_error(model):
    batch = reference_batch()
    batch.text_ids = torch.full((3, 41), 5)
    with pytest.raises(UserError, match="max_text_tokens 40"):
        model(batch)
