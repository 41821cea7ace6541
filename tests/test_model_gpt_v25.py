"""IndexTTS-2.5 (campplus UnifiedVoice) against its reference: layout, losses, gradients, vocab growth."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch
from helpers import reference_model
from torch.nn.utils.rnn import pad_sequence

from indextts_train.checkpoint.base import load_base_checkpoint
from indextts_train.config.family import INDEXTTS2, INDEXTTS25
from indextts_train.config.settings import GPTConfig, load_config
from indextts_train.errors import UserError
from indextts_train.model.gpt import Batch, UnifiedVoiceGPT
from indextts_train.model.layout import full_state_dict, init_carried, official_shapes, trained_keys

REF = Path(__file__).resolve().parent / "data" / "reference"
V25 = REF / "v2_5"
TINY = V25 / "tiny"
EXPECTED = json.loads((TINY / "expected.json").read_text())


def v25_batch(lines: list[dict] | None = None, ids_key: str = "target_text_ids_path",
              remap: dict[int, int] | None = None) -> Batch:
    """Collate tiny/pairs.jsonl the reference way (v2.5 rule 1)."""
    if lines is None:
        lines = [json.loads(line) for line in (TINY / "pairs.jsonl").read_text().splitlines()]

    def load(line: dict, key: str) -> torch.Tensor:
        return torch.from_numpy(np.load(TINY / line[key]))

    texts = [load(x, ids_key).long() for x in lines]
    if remap is not None:
        texts = [t.apply_(lambda i: remap.get(i, i)) for t in texts]
    return Batch(
        text_ids=pad_sequence(texts, batch_first=True),
        codes=pad_sequence([load(x, "target_codes_path").long() for x in lines], batch_first=True),
        text_lengths=torch.tensor([x["target_text_len"] for x in lines]),
        code_lengths=torch.tensor([x["target_code_len"] for x in lines]),
        condition=None,
        emo_vec=torch.stack([load(x, "prompt_emo_vec_path") for x in lines]),
        spk_emb=torch.stack([load(x, "prompt_spk_emb_path") for x in lines]),
        lang_ids=torch.tensor([x["lang_id"] for x in lines]),
    )


@pytest.fixture(scope="module")
def cfg() -> GPTConfig:
    return load_config(TINY / "config.yaml").gpt


@pytest.fixture()
def model() -> UnifiedVoiceGPT:
    return reference_model(TINY)


def test_the_config_version_selects_the_family(cfg):
    assert cfg.family is INDEXTTS25 and cfg.stated_family is INDEXTTS25
    assert load_config(REF / "tiny" / "config.yaml").gpt.family is INDEXTTS2


def test_real_config_keys_shapes_and_totals_equal_the_reference_json():
    real = json.loads((V25 / "indextts25_gpt_keys.json").read_text())["indextts25"]
    cfg = GPTConfig(number_text_tokens=60509, stated_family=INDEXTTS25)
    shapes = official_shapes(cfg)
    assert list(shapes) == [e["key"] for e in real["state_dict"]]
    assert shapes == {e["key"]: tuple(e["shape"]) for e in real["state_dict"]}
    assert len(shapes) == real["totals"]["state_dict_tensor_count"] == 456
    assert sum(math.prod(s) for s in shapes.values()) == real["totals"]["state_dict_numel"] == 814_849_460
    assert trained_keys(cfg) == real["trained_in_training_path"]["keys"]
    with torch.device("meta"):
        net = UnifiedVoiceGPT(cfg)
    assert list(net.state_dict()) == trained_keys(cfg)
    assert sum(p.numel() for p in net.parameters()) == real["trained_in_training_path"]["numel"]


def test_load_then_full_state_dict_round_trips_bit_exactly(cfg):
    reference = torch.load(TINY / "gpt.pth", weights_only=True)
    trained, carried, base_tokens = load_base_checkpoint(TINY / "gpt.pth", cfg)
    assert base_tokens == 120 and len(trained) == 39 and len(carried) == 60
    net = UnifiedVoiceGPT(cfg)
    net.load_state_dict(trained)
    state = full_state_dict(net, carried)
    assert list(state) == list(reference)
    assert all(torch.equal(state[k], reference[k]) for k in reference)
    fresh = full_state_dict(UnifiedVoiceGPT(cfg), init_carried(cfg, torch.Generator().manual_seed(0)))
    assert {k: v.shape for k, v in fresh.items()} == {k: v.shape for k, v in reference.items()}


def test_the_checkpoint_decides_the_family_when_the_config_does_not_say(tmp_path):
    text = (TINY / "config.yaml").read_text().replace("version: 2.5", "")
    (tmp_path / "config.yaml").write_text(text)
    cfg = load_config(tmp_path / "config.yaml").gpt
    assert cfg.stated_family is None and cfg.family is INDEXTTS2  # unstated reads as IndexTTS2 ...
    load_base_checkpoint(TINY / "gpt.pth", cfg)
    assert cfg.stated_family is INDEXTTS25  # ... until the checkpoint's keys say


@pytest.mark.parametrize("config, checkpoint, message", [
    (REF / "tiny" / "config.yaml", TINY / "gpt.pth", "is IndexTTS-2.5 (it has spk_emb_proj.weight) but the config "
                                                     "says version 2.0"),
    (TINY / "config.yaml", REF / "tiny" / "gpt.pth", "is IndexTTS2 (it has speed_emb.weight) but the config says "
                                                     "version 2.5"),
])
def test_config_and_checkpoint_of_different_families_are_refused(config, checkpoint, message):
    with pytest.raises(UserError, match=message.replace("(", r"\(").replace(")", r"\)")):
        load_base_checkpoint(checkpoint, load_config(config).gpt)


def test_a_misnamed_key_fails_the_strict_layout_check(cfg, tmp_path):
    state = torch.load(TINY / "gpt.pth", weights_only=True)
    state["lang_embeddings.weight"] = state.pop("lang_embedding.weight")
    torch.save(state, tmp_path / "gpt.pth")
    with pytest.raises(UserError, match="1 missing: lang_embedding.weight; 1 unexpected: lang_embeddings.weight"):
        load_base_checkpoint(tmp_path / "gpt.pth", load_config(TINY / "config.yaml").gpt)


def test_eval_losses_top1_and_internals_match_the_reference(model):
    batch = v25_batch()
    with torch.no_grad():
        text_logits, mel_logits = model(batch)
        out = model.compute_losses(batch)
    ref, internals = EXPECTED["eval"], EXPECTED["internals"]
    assert [list(text_logits.shape), list(mel_logits.shape)] == [ref["text_logits_shape"], ref["mel_logits_shape"]]
    assert out.text_loss.item() == pytest.approx(ref["text_loss"], abs=1e-5)
    assert out.mel_loss.item() == pytest.approx(ref["mel_loss"], abs=1e-5)
    assert out.mel_top1.item() == pytest.approx(ref["mel_top1"], abs=1e-6)
    total = 0.2 * out.text_loss + 0.8 * out.mel_loss
    assert total.item() == pytest.approx(ref["total_loss"], abs=1e-5)
    assert text_logits[0, :8, 0].tolist() == pytest.approx(internals["text_logits_first_position_sample0"],
                                                             abs=1e-5)
    assert mel_logits.double().sum().item() == pytest.approx(internals["mel_logits_sum"], abs=1e-3)


def test_each_example_alone_matches_the_unbatched_reference(model):
    lines = [json.loads(line) for line in (TINY / "pairs.jsonl").read_text().splitlines()]
    for line, ref in zip(lines, EXPECTED["unbatched_eval"], strict=True):
        with torch.no_grad():
            out = model.compute_losses(v25_batch([line]))
        assert out.text_loss.item() == pytest.approx(ref["text_loss"], abs=1e-5)
        assert out.mel_loss.item() == pytest.approx(ref["mel_loss"], abs=1e-5)


def test_the_language_row_is_what_moves_the_losses(model):
    """Control: with lang_embedding zeroed the losses are the reference's `lang_embedding_omitted`."""
    with torch.no_grad():
        model.lang_embedding.weight.zero_()
        out = model.compute_losses(v25_batch())
    ref = EXPECTED["variants"]["lang_embedding_omitted"]
    assert out.text_loss.item() == pytest.approx(ref["text_loss"], abs=1e-5)
    assert out.mel_loss.item() == pytest.approx(ref["mel_loss"], abs=1e-5)
    assert abs(out.mel_loss.item() - EXPECTED["eval"]["mel_loss"]) > 0.05


def test_eval_gradients_match_the_reference(model):
    out = model.compute_losses(v25_batch())
    (0.2 * out.text_loss + 0.8 * out.mel_loss).backward()
    ref = EXPECTED["eval_gradients"]
    assert [k for k, p in model.named_parameters() if p.grad is not None] == ref["keys_with_grad"]
    for key, param in model.named_parameters():
        assert param.grad.double().norm().item() == pytest.approx(ref["grad_l2_norm"][key], rel=1e-5), key
    lang_rows = model.lang_embedding.weight.grad.abs().sum(dim=1).nonzero().flatten().tolist()
    assert lang_rows == ref["lang_embedding_rows_with_nonzero_grad"]
    text_rows = model.text_embedding.weight.grad.abs().sum(dim=1).nonzero().flatten().tolist()
    assert text_rows == ref["text_embedding_rows_with_nonzero_grad"]


def test_the_grown_vocabulary_case_equals_its_expected_losses(cfg):
    grown = EXPECTED["extended_vocab"]
    state = torch.load(TINY / "gpt.pth", weights_only=True)
    state.update(torch.load(TINY / "ext_text_params.pth", weights_only=True))
    big = GPTConfig(**{**vars(cfg), "number_text_tokens": grown["to_number_text_tokens"]})
    net = UnifiedVoiceGPT(big)
    net.load_state_dict({k: state[k] for k in trained_keys(big)})
    batch = v25_batch(remap={i: i + 10 for i in range(100, 120)})
    assert [t[:n].tolist() for t, n in zip(batch.text_ids, batch.text_lengths, strict=True)] == \
        grown["remapped_text_ids"]
    with torch.no_grad():
        text_logits, _ = net.eval()(batch)
        out = net.compute_losses(batch)
    assert out.text_loss.item() == pytest.approx(grown["eval"]["text_loss"], abs=1e-5)
    assert out.mel_loss.item() == pytest.approx(grown["eval"]["mel_loss"], abs=1e-5)
    assert out.mel_top1.item() == pytest.approx(grown["eval"]["mel_top1"], abs=1e-6)
    assert torch.equal(text_logits[:, 100:110], torch.zeros_like(text_logits[:, 100:110]))
