"""UnifiedVoiceGPT against the reference: layout, losses, gradients, checkpoint loading."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch
from helpers import reference_batch

from indextts_train.config import GPTConfig, load_config
from indextts_train.errors import UserError
from indextts_train.layout import (
    full_state_dict,
    init_carried,
    load_base_checkpoint,
    official_shapes,
    split_state_dict,
    trained_keys,
)
from indextts_train.model import UnifiedVoiceGPT, aligned_sequences, masked_token_ce

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
def model(cfg: GPTConfig) -> UnifiedVoiceGPT:
    trained, _, _ = load_base_checkpoint(TINY / "gpt.pth", cfg)
    net = UnifiedVoiceGPT(cfg)
    net.load_state_dict(trained)
    return net.eval()


def test_full_state_dict_has_the_keys_and_shapes_of_tiny_gpt_pth(cfg, reference_sd):
    fresh = UnifiedVoiceGPT(cfg)
    state = full_state_dict(fresh, init_carried(cfg, torch.Generator().manual_seed(0)))
    assert list(state) == list(reference_sd)
    assert {k: v.shape for k, v in state.items()} == {k: v.shape for k, v in reference_sd.items()}
    assert all(v.dtype == torch.float32 and v.device.type == "cpu" for v in state.values())
    assert list(fresh.state_dict()) == trained_keys(cfg)
    assert len(trained_keys(cfg)) == 37


def test_load_then_full_state_dict_round_trips_bit_exactly(cfg, reference_sd):
    trained, carried, base_tokens = load_base_checkpoint(TINY / "gpt.pth", cfg)
    assert base_tokens == 100
    net = UnifiedVoiceGPT(cfg)
    net.load_state_dict(trained)
    state = full_state_dict(net, carried)
    assert all(torch.equal(state[k], reference_sd[k]) for k in reference_sd)
    state["speed_emb.weight"].add_(1.0)  # clones: editing the export must not touch the model
    assert torch.equal(net.speed_emb.weight, reference_sd["speed_emb.weight"])


def test_official_shapes_of_the_real_config_match_the_reference_json():
    real = json.loads((REF / "indextts2_gpt_keys.json").read_text())["indextts2"]
    shapes = official_shapes(GPTConfig())
    assert list(shapes) == [e["key"] for e in real["state_dict"]]
    assert shapes == {e["key"]: tuple(e["shape"]) for e in real["state_dict"]}
    assert len(shapes) == 665
    assert sum(math.prod(s) for s in shapes.values()) == 871_100_639
    assert trained_keys(GPTConfig()) == real["trained_with_precomputed_conditions"]["keys"]


def test_split_state_dict_separates_trained_from_carried(cfg, reference_sd):
    trained, carried = split_state_dict(reference_sd, cfg)
    assert list(trained) == trained_keys(cfg)
    assert len(carried) == len(reference_sd) - 37
    assert "conditioning_encoder.embed.pos_enc.pe" in carried and "emovec_layer.weight" in carried


def test_init_carried_is_plausible_and_deterministic(cfg, reference_sd):
    first = init_carried(cfg, torch.Generator().manual_seed(3))
    second = init_carried(cfg, torch.Generator().manual_seed(3))
    assert set(first) == set(reference_sd) - set(trained_keys(cfg))
    assert all(torch.equal(first[k], second[k]) for k in first)
    pe = "emo_conditioning_encoder.embed.pos_enc.pe"
    assert torch.equal(first[pe], reference_sd[pe])  # the fixed sinusoids, exactly
    assert torch.equal(first["perceiver_encoder.norm.gamma"], torch.ones(64))
    assert first["emovec_layer.weight"].abs().max() <= 1 / math.sqrt(1024)


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


def test_wrapped_checkpoint_with_fork_extras_loads(cfg, reference_sd, tmp_path):
    state = dict(reference_sd)
    state["gpt.wte.weight"] = torch.zeros(66, 64)  # post_init_gpt2_config aliases: dropped
    state["inference_model.lm_head.1.weight"] = torch.zeros(66, 64)
    lora = "gpt.h.0.attn.c_attn.lora_A.default.weight"
    state[lora] = torch.zeros(4, 64)  # LoRA adapters: dropped; the base layer is renamed back
    state["gpt.h.0.mlp.c_fc.base_layer.weight"] = state.pop("gpt.h.0.mlp.c_fc.weight")
    path = tmp_path / "wrapped.pth"
    torch.save({"model": state, "step": 3}, path)
    trained, carried, base_tokens = load_base_checkpoint(path, cfg)
    assert base_tokens == 100
    assert torch.equal(trained["gpt.h.0.mlp.c_fc.weight"], reference_sd["gpt.h.0.mlp.c_fc.weight"])
    assert set(trained) | set(carried) == set(reference_sd)


def test_load_errors_name_every_missing_unexpected_and_misshaped_key(cfg, reference_sd, tmp_path):
    block = "conditioning_encoder.encoders.1."
    state = {k: v for k, v in reference_sd.items() if not k.startswith(block)}  # 31 keys gone
    del state["final_norm.bias"]
    state["mystery.weight"] = torch.zeros(3)
    state["mel_head.bias"] = torch.zeros(67)
    path = tmp_path / "bad.pth"
    torch.save(state, path)
    with pytest.raises(UserError) as info:
        load_base_checkpoint(path, cfg)
    message = str(info.value)
    assert str(path) in message and "\n" not in message
    assert f"32 missing: {block}self_attn.pos_bias_u" in message
    assert "(+24 more)" in message  # the list is cut at 8 names, with a count
    assert "1 unexpected: mystery.weight" in message
    assert "1 mis-shaped: mel_head.bias [67] (expected [66])" in message


def test_load_error_lists_a_missing_final_key_by_name(cfg, reference_sd, tmp_path):
    state = dict(reference_sd)
    del state["speed_emb.weight"]
    path = tmp_path / "bad.pth"
    torch.save(state, path)
    with pytest.raises(UserError, match=r"1 missing: speed_emb\.weight"):
        load_base_checkpoint(path, cfg)


def test_text_rows_may_differ_from_the_config_but_must_agree(cfg, reference_sd, tmp_path):
    grown = torch.load(TINY / "ext150_text_params.pth", weights_only=True)
    state = {**reference_sd, **grown}
    path = tmp_path / "ext.pth"
    torch.save(state, path)
    trained, _, base_tokens = load_base_checkpoint(path, cfg)
    assert base_tokens == 150 and trained["text_head.bias"].shape == (151,)

    state["text_head.bias"] = reference_sd["text_head.bias"]
    torch.save(state, path)
    with pytest.raises(UserError, match="text rows disagree"):
        load_base_checkpoint(path, cfg)


@pytest.mark.parametrize("content", [b"not a checkpoint", None, "list"])
def test_unreadable_or_absent_checkpoint_is_a_user_error_naming_the_path(cfg, tmp_path, content):
    path = tmp_path / "gpt.pth"
    if content == "list":
        torch.save([torch.zeros(1)], path)
    elif content is not None:
        path.write_bytes(content)
    with pytest.raises(UserError, match=str(path)):
        load_base_checkpoint(path, cfg)


@pytest.mark.parametrize("prefix", ["module.", "_orig_mod.", "module._orig_mod."])
def test_ddp_and_compiled_prefixes_load_as_base_checkpoint(cfg, reference_sd, tmp_path, prefix):
    """The same key cleanup as `repair` (layout.clean_keys): wrapped weights are usable as --base-checkpoint."""
    path = tmp_path / "wrapped.pth"
    torch.save({f"{prefix}{k}": v for k, v in reference_sd.items()}, path)
    trained, carried, _ = load_base_checkpoint(path, cfg)
    assert {**trained, **carried}.keys() == reference_sd.keys()
    assert all(torch.equal(trained[k], reference_sd[k]) for k in trained)
