"""The official gpt.pth layout (layout.py): keys and shapes, trained vs carried, loading a base."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch

from indextts_train.checkpoint.base import load_base_checkpoint
from indextts_train.config.settings import GPTConfig
from indextts_train.errors import UserError
from indextts_train.model.gpt import UnifiedVoiceGPT
from indextts_train.model.layout import full_state_dict, init_carried, official_shapes, split_state_dict, trained_keys

REF = Path(__file__).resolve().parent / "data" / "reference"
TINY = REF / "tiny"


def test_full_state_dict_has_the_keys_and_shapes_of_tiny_gpt_pth(tiny_reference_cfg, tiny_reference_sd):
    fresh = UnifiedVoiceGPT(tiny_reference_cfg)
    state = full_state_dict(fresh, init_carried(tiny_reference_cfg, torch.Generator().manual_seed(0)))
    assert list(state) == list(tiny_reference_sd)
    assert {k: v.shape for k, v in state.items()} == {k: v.shape for k, v in tiny_reference_sd.items()}
    assert all(v.dtype == torch.float32 and v.device.type == "cpu" for v in state.values())
    assert list(fresh.state_dict()) == trained_keys(tiny_reference_cfg)
    assert len(trained_keys(tiny_reference_cfg)) == 37


def test_load_then_full_state_dict_round_trips_bit_exactly(tiny_reference_cfg, tiny_reference_sd):
    trained, carried, base_tokens = load_base_checkpoint(TINY / "gpt.pth", tiny_reference_cfg)
    assert base_tokens == 100
    net = UnifiedVoiceGPT(tiny_reference_cfg)
    net.load_state_dict(trained)
    state = full_state_dict(net, carried)
    assert all(torch.equal(state[k], tiny_reference_sd[k]) for k in tiny_reference_sd)
    state["speed_emb.weight"].add_(1.0)  # clones: editing the export must not touch the model
    assert torch.equal(net.speed_emb.weight, tiny_reference_sd["speed_emb.weight"])


def test_official_shapes_of_the_real_config_match_the_reference_json():
    real = json.loads((REF / "indextts2_gpt_keys.json").read_text())["indextts2"]
    shapes = official_shapes(GPTConfig())
    assert list(shapes) == [e["key"] for e in real["state_dict"]]
    assert shapes == {e["key"]: tuple(e["shape"]) for e in real["state_dict"]}
    assert len(shapes) == 665
    assert sum(math.prod(s) for s in shapes.values()) == 871_100_639
    assert trained_keys(GPTConfig()) == real["trained_with_precomputed_conditions"]["keys"]


def test_split_state_dict_separates_trained_from_carried(tiny_reference_cfg, tiny_reference_sd):
    trained, carried = split_state_dict(tiny_reference_sd, tiny_reference_cfg)
    assert list(trained) == trained_keys(tiny_reference_cfg)
    assert len(carried) == len(tiny_reference_sd) - 37
    assert "conditioning_encoder.embed.pos_enc.pe" in carried and "emovec_layer.weight" in carried


def test_init_carried_is_plausible_and_deterministic(tiny_reference_cfg, tiny_reference_sd):
    first = init_carried(tiny_reference_cfg, torch.Generator().manual_seed(3))
    second = init_carried(tiny_reference_cfg, torch.Generator().manual_seed(3))
    assert set(first) == set(tiny_reference_sd) - set(trained_keys(tiny_reference_cfg))
    assert all(torch.equal(first[k], second[k]) for k in first)
    pe = "emo_conditioning_encoder.embed.pos_enc.pe"
    assert torch.equal(first[pe], tiny_reference_sd[pe])  # the fixed sinusoids, exactly
    assert torch.equal(first["perceiver_encoder.norm.gamma"], torch.ones(64))
    assert first["emovec_layer.weight"].abs().max() <= 1 / math.sqrt(1024)


def test_wrapped_checkpoint_with_fork_extras_loads(tiny_reference_cfg, tiny_reference_sd, tmp_path):
    state = dict(tiny_reference_sd)
    state["gpt.wte.weight"] = torch.zeros(66, 64)  # post_init_gpt2_config aliases: dropped
    state["inference_model.lm_head.1.weight"] = torch.zeros(66, 64)
    lora = "gpt.h.0.attn.c_attn.lora_A.default.weight"
    state[lora] = torch.zeros(4, 64)  # LoRA adapters: dropped; the base layer is renamed back
    state["gpt.h.0.mlp.c_fc.base_layer.weight"] = state.pop("gpt.h.0.mlp.c_fc.weight")
    path = tmp_path / "wrapped.pth"
    torch.save({"model": state, "step": 3}, path)
    trained, carried, base_tokens = load_base_checkpoint(path, tiny_reference_cfg)
    assert base_tokens == 100
    assert torch.equal(trained["gpt.h.0.mlp.c_fc.weight"], tiny_reference_sd["gpt.h.0.mlp.c_fc.weight"])
    assert set(trained) | set(carried) == set(tiny_reference_sd)


def test_load_errors_name_every_missing_unexpected_and_misshaped_key(tiny_reference_cfg, tiny_reference_sd, tmp_path):
    block = "conditioning_encoder.encoders.1."
    state = {k: v for k, v in tiny_reference_sd.items() if not k.startswith(block)}  # 31 keys gone
    del state["final_norm.bias"]
    state["mystery.weight"] = torch.zeros(3)
    state["mel_head.bias"] = torch.zeros(67)
    path = tmp_path / "bad.pth"
    torch.save(state, path)
    with pytest.raises(UserError) as info:
        load_base_checkpoint(path, tiny_reference_cfg)
    message = str(info.value)
    assert str(path) in message and "\n" not in message
    assert f"32 missing: {block}self_attn.pos_bias_u" in message
    assert "(+29 more)" in message  # the list is cut at 3 names, with a count
    assert "1 unexpected: mystery.weight" in message
    assert "1 mis-shaped: mel_head.bias [67] (expected [66])" in message


def test_load_error_lists_a_missing_final_key_by_name(tiny_reference_cfg, tiny_reference_sd, tmp_path):
    state = dict(tiny_reference_sd)
    del state["speed_emb.weight"]
    path = tmp_path / "bad.pth"
    torch.save(state, path)
    with pytest.raises(UserError, match=r"1 missing: speed_emb\.weight"):
        load_base_checkpoint(path, tiny_reference_cfg)


def test_text_rows_may_differ_from_the_config_but_must_agree(tiny_reference_cfg, tiny_reference_sd, tmp_path):
    grown = torch.load(TINY / "ext150_text_params.pth", weights_only=True)
    state = {**tiny_reference_sd, **grown}
    path = tmp_path / "ext.pth"
    torch.save(state, path)
    trained, _, base_tokens = load_base_checkpoint(path, tiny_reference_cfg)
    assert base_tokens == 150 and trained["text_head.bias"].shape == (151,)

    state["text_head.bias"] = tiny_reference_sd["text_head.bias"]
    torch.save(state, path)
    with pytest.raises(UserError, match="text rows disagree"):
        load_base_checkpoint(path, tiny_reference_cfg)


@pytest.mark.parametrize("content", [b"not a checkpoint", None, "list"])
def test_unreadable_or_absent_checkpoint_is_a_user_error_naming_the_path(tiny_reference_cfg, tmp_path, content):
    path = tmp_path / "gpt.pth"
    if content == "list":
        torch.save([torch.zeros(1)], path)
    elif content is not None:
        path.write_bytes(content)
    with pytest.raises(UserError, match=str(path)):
        load_base_checkpoint(path, tiny_reference_cfg)


@pytest.mark.parametrize("prefix", ["module.", "_orig_mod.", "module._orig_mod."])
def test_ddp_and_compiled_prefixes_load_as_base_checkpoint(tiny_reference_cfg, tiny_reference_sd, tmp_path, prefix):
    """The same key cleanup as `repair` (layout.clean_keys): wrapped weights are usable as --base-checkpoint."""
    path = tmp_path / "wrapped.pth"
    torch.save({f"{prefix}{k}": v for k, v in tiny_reference_sd.items()}, path)
    trained, carried, _ = load_base_checkpoint(path, tiny_reference_cfg)
    assert {**trained, **carried}.keys() == tiny_reference_sd.keys()
    assert all(torch.equal(trained[k], tiny_reference_sd[k]) for k in trained)


def test_encoder_input_width_may_differ_from_1024_but_must_be_whole_bins(tiny_reference_cfg, tiny_reference_sd,
                                                                         tmp_path):
    """Tiny w2v-BERT widths (32: 15 bins) load; columns that are not d x bins are refused."""
    key = "conditioning_encoder.embed.out.0.weight"
    d = tiny_reference_sd[key].shape[0]
    state = {**tiny_reference_sd, key: torch.zeros(d, d * 15),
             f"emo_{key}": torch.zeros(tiny_reference_sd[f"emo_{key}"].shape[0],
                                       tiny_reference_sd[f"emo_{key}"].shape[0] * 15)}
    path = tmp_path / "narrow.pth"
    torch.save(state, path)
    _, carried, _ = load_base_checkpoint(path, tiny_reference_cfg)
    assert carried[key].shape == (d, d * 15)
    state[key] = torch.zeros(d, d * 15 + 1)
    torch.save(state, path)
    with pytest.raises(UserError, match="mis-shaped: conditioning_encoder.embed.out.0.weight"):
        load_base_checkpoint(path, tiny_reference_cfg)
