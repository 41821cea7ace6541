"""scope.py and lora.py: what each --train-scope trains, frozen tensors bit-identical, LoRA merge."""

from __future__ import annotations

import math
import re

import pytest
import torch

from indextts_train.config.constants import SPK_EMB_DIM
from indextts_train.config.family import INDEXTTS2, INDEXTTS25
from indextts_train.config.scope_settings import LORA_TARGETS, LoraSpec, ScopeSettings, parse_targets, scope_settings
from indextts_train.config.settings import GPTConfig, config_from_dict
from indextts_train.errors import UserError
from indextts_train.model.gpt import Batch, UnifiedVoiceGPT
from indextts_train.model.layout import official_shapes, trained_keys
from indextts_train.model.lora import adapted_layer_names, adapter_file, apply_adapter_file, merge_lora
from indextts_train.model.scope import apply_scope, scope_counts, trainable_parameters
from indextts_train.text.vocab import RowFreezer, VocabPlan

BASE_TOKENS, TOKENS = 16, 20  # the vocabulary grew by 4 rows


FAMILIES = [INDEXTTS2, INDEXTTS25]


def _cfg(layers: int = 3, family: str = INDEXTTS2) -> GPTConfig:
    return GPTConfig(model_dim=32, heads=4, layers=layers, max_text_tokens=12, max_mel_tokens=16,
                     number_text_tokens=TOKENS, number_mel_codes=18, start_mel_token=16, stop_mel_token=17,
                     stated_family=family)


def _batch(seed: int, size: int = 3, family: str = INDEXTTS2) -> Batch:
    g = torch.Generator().manual_seed(seed)
    v25 = family == INDEXTTS25  # speaker vector and language rows instead of the 32-row condition
    return Batch(text_ids=torch.randint(2, TOKENS, (size, 10), generator=g),
                 codes=torch.randint(0, 16, (size, 14), generator=g),
                 text_lengths=torch.tensor([10, 7, 4][:size]), code_lengths=torch.tensor([14, 9, 12][:size]),
                 condition=None if v25 else torch.randn(size, 32, 32, generator=g),
                 emo_vec=torch.randn(size, 32, generator=g),
                 spk_emb=torch.randn(size, SPK_EMB_DIM, generator=g) if v25 else None,
                 lang_ids=torch.tensor([0, 75, 0][:size]) if v25 else None)


def _model(seed: int = 0, dropout: float = 0.0, layers: int = 3, family: str = INDEXTTS2) -> UnifiedVoiceGPT:
    torch.manual_seed(seed)
    return UnifiedVoiceGPT(_cfg(layers, family), dropout=dropout)


def _settings(scope: str, **lora) -> ScopeSettings:
    return ScopeSettings(train_scope=scope, partial_layers=1, lora=LoraSpec(**lora))


def _train(model, adapters, steps: int, plan: VocabPlan | None = None) -> torch.optim.AdamW:
    """AdamW (weight decay on) over the trainable tensors only, the row freezer on, a few steps."""
    optimizer = torch.optim.AdamW([p for _, p in trainable_parameters(model, adapters)], lr=1e-2,
                                  weight_decay=0.1)
    freezer = RowFreezer(model, plan or VocabPlan(BASE_TOKENS, TOKENS))
    model.train()
    for step in range(steps):
        out = model.compute_losses(_batch(step, family=model.cfg.family))
        (out.text_loss + out.mel_loss).backward()
        freezer.mask_grads()
        optimizer.step()
        freezer.restore()
        optimizer.zero_grad(set_to_none=True)
    return optimizer


# ---- which tensors train ------------------------------------------------------------------------


def test_partial_trains_the_last_blocks_norms_heads_and_text_rows():
    model = _model()
    assert apply_scope(model, _settings("partial"), text_rows_train=True, generator=None) is None
    trainable = {n for n, p in model.named_parameters() if p.requires_grad}
    last = {n for n in trained_keys(model.cfg) if n.startswith("gpt.h.2.")}
    assert len(last) == 12
    assert trainable == last | {"gpt.ln_f.weight", "gpt.ln_f.bias", "final_norm.weight", "final_norm.bias",
                                "text_head.weight", "text_head.bias", "mel_head.weight", "mel_head.bias",
                                "text_embedding.weight"}


def test_lora_trains_adapters_heads_and_text_rows_only():
    model = _model()
    adapters = apply_scope(model, _settings("lora"), text_rows_train=True, generator=torch.Generator())
    names = [n for n, _ in trainable_parameters(model, adapters)]
    assert names[:5] == ["text_embedding.weight", "text_head.weight", "text_head.bias", "mel_head.weight",
                         "mel_head.bias"]
    layers = adapted_layer_names(3, LoraSpec())
    assert names[5:] == [f"{layer}.{m}" for layer in layers for m in ("lora_A", "lora_B")]
    assert len(layers) == 3 * len(LORA_TARGETS)


@pytest.mark.parametrize("scope", ["partial", "lora"])
def test_25_language_rows_and_speaker_projection_stay_with_the_row_freezer(scope):
    """IndexTTS-2.5: lang_embedding and spk_emb_proj train in every scope; the row freezer (not the
    scope) keeps the other languages' rows and, without --train-speaker-proj, spk_emb_proj as they were."""
    model = _model(family=INDEXTTS25)
    adapters = apply_scope(model, _settings(scope), text_rows_train=True, generator=torch.Generator())
    trainable = {n for n, _ in trainable_parameters(model, adapters)}
    assert {"spk_emb_proj.weight", "spk_emb_proj.bias", "lang_embedding.weight"} <= trainable
    v2 = _model()
    v2_adapters = apply_scope(v2, _settings(scope), text_rows_train=True, generator=torch.Generator())
    shared = {n for n, _ in trainable_parameters(v2, v2_adapters)}
    assert trainable - shared == {"spk_emb_proj.weight", "spk_emb_proj.bias", "lang_embedding.weight"}


def test_without_rows_to_learn_the_text_embedding_freezes():
    model = _model()
    apply_scope(model, _settings("lora"), text_rows_train=False, generator=torch.Generator())
    assert not model.text_embedding.weight.requires_grad
    assert model.text_head.weight.requires_grad  # the heads always train


def test_full_trains_everything():
    model = _model()
    assert apply_scope(model, _settings("full"), text_rows_train=False, generator=None) is None
    assert all(p.requires_grad for p in model.parameters())
    # What the run's line says full trains: the official keys besides the model's are the encoders, carried
    trained = {key.split(".")[0] for key in trained_keys(model.cfg)}
    untrained = {key.split(".")[0] for key in official_shapes(model.cfg)} - trained
    assert untrained and all(name.endswith("_encoder") or name.startswith("emo") for name in untrained), untrained
    said = "full (every tensor but the conditioning and emotion encoders, carried as they are)"
    assert _settings("full").describe() == said


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("scope", ["full", "partial", "lora"])
@pytest.mark.parametrize("rows", [True, False])
def test_counts_from_shapes_equal_the_built_model(scope, rows, family):
    model = _model(family=family)
    adapters = apply_scope(model, _settings(scope), text_rows_train=rows, generator=None)
    counts = scope_counts(model.cfg, _settings(scope), text_rows_train=rows)
    assert counts["model"] == sum(p.numel() for p in model.parameters())
    assert counts["trainable"] == sum(p.numel() for _, p in trainable_parameters(model, adapters))
    assert counts["adapters"] == (sum(p.numel() for p in adapters.parameters()) if adapters else 0)


def test_real_config_lora_adapter_count_follows_the_layer_shapes():
    cfg = GPTConfig()  # the real IndexTTS2 sizes
    D, r = cfg.model_dim, 16
    per_block = r * ((D + 3 * D) + (D + D) + (D + 4 * D) + (4 * D + D))  # qkv, attn out, mlp in, mlp out
    counts = scope_counts(cfg, ScopeSettings("lora"))
    assert counts["adapters"] == cfg.layers * per_block
    heads_and_rows = sum(math.prod(official_shapes(cfg)[k]) for k in
                         ("text_embedding.weight", "text_head.weight", "text_head.bias", "mel_head.weight",
                          "mel_head.bias"))
    assert counts["trainable"] == counts["adapters"] + heads_and_rows


# ---- frozen stays frozen ------------------------------------------------------------------------


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("scope", ["full", "partial", "lora"])
def test_frozen_tensors_and_base_rows_stay_bit_identical_and_get_no_optimizer_state(scope, family):
    model = _model(dropout=0.1, family=family)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    adapters = apply_scope(model, _settings(scope, dropout=0.1), text_rows_train=True,
                           generator=torch.Generator().manual_seed(1))
    optimizer = _train(model, adapters, steps=3)
    after = model.state_dict()
    trainable = {n for n, _ in trainable_parameters(model, adapters)}
    for key, value in before.items():
        if key not in trainable:
            assert torch.equal(after[key], value), key
            assert model.get_parameter(key).grad is None
    for key in ("text_embedding.weight", "text_head.weight", "text_head.bias"):  # base rows + extra row
        assert torch.equal(after[key][:BASE_TOKENS], before[key][:BASE_TOKENS])
        assert torch.equal(after[key][TOKENS], before[key][TOKENS])
    assert not torch.equal(after["mel_head.weight"], before["mel_head.weight"])  # training did happen
    stateful = {id(p) for p in optimizer.state}
    assert stateful == {id(p) for _, p in trainable_parameters(model, adapters)}


def test_lora_starts_equal_to_the_base_model():
    base, adapted = _model(), _model()
    adapters = apply_scope(adapted, _settings("lora"), text_rows_train=True,
                           generator=torch.Generator().manual_seed(3))
    batch = _batch(7)
    for a, b in zip(base.eval()(batch), adapted.eval()(batch), strict=True):
        assert torch.equal(a, b)
    # The equality is the zero init of B, not adapters left off the forward path: any non-zero B
    # changes the output.
    with torch.no_grad():
        for name, param in adapters.named_parameters():
            if name.endswith("lora_B"):
                param.fill_(1e-3)
    assert not torch.equal(base(batch)[1], adapted(batch)[1])


def test_lora_dropout_follows_the_model_mode():
    model = _model()
    adapters = apply_scope(model, _settings("lora", dropout=0.5), text_rows_train=True,
                           generator=torch.Generator().manual_seed(3))
    _train(model, adapters, steps=1)  # B != 0, so the adapters change the output
    batch = _batch(5)
    model.eval()
    assert torch.equal(model(batch)[1], model(batch)[1])
    model.train()
    assert not torch.equal(model(batch)[1], model(batch)[1])


def test_lora_gradients_equal_with_activation_checkpointing():
    grads = []
    for ckpt in (False, True):
        model = _model(dropout=0.1)
        model.gpt.activation_checkpointing = ckpt
        adapters = apply_scope(model, _settings("lora", dropout=0.1), text_rows_train=True,
                               generator=torch.Generator().manual_seed(3))
        with torch.no_grad():
            for p in adapters.parameters():
                p.normal_(std=0.1, generator=torch.Generator().manual_seed(p.numel()))
        torch.manual_seed(11)
        out = model.train().compute_losses(_batch(1))
        (out.text_loss + out.mel_loss).backward()
        grads.append([p.grad.clone() for p in adapters.parameters()])
    assert all(torch.equal(a, b) for a, b in zip(*grads, strict=True))


# ---- merge --------------------------------------------------------------------------------------


@pytest.mark.parametrize("family", FAMILIES)
def test_merged_weights_give_the_adapter_models_logits(family):
    model = _model(dropout=0.1, family=family)
    adapters = apply_scope(model, _settings("lora", rank=4, alpha=8.0, dropout=0.1), text_rows_train=True,
                           generator=torch.Generator().manual_seed(2))
    _train(model, adapters, steps=4)
    merged = merge_lora(model.state_dict(), adapters.state_dict(), adapters.spec)
    assert list(merged) == trained_keys(model.cfg)  # plain official keys, same order
    plain = UnifiedVoiceGPT(model.cfg, dropout=0.0)
    plain.load_state_dict(merged, strict=True)
    batch = _batch(9, family=family)
    for got, want in zip(plain.eval()(batch), model.eval()(batch), strict=True):
        torch.testing.assert_close(got, want, rtol=0, atol=1e-5)
    adapters.detach_hooks()  # the adapted model without its adapters: the base trunk, which differs
    assert not torch.allclose(model(batch)[1], plain(batch)[1], atol=1e-5)


def test_adapter_file_applies_to_its_base_only():
    model = _model()
    base_state = {k: v.clone() for k, v in model.state_dict().items()}
    adapters = apply_scope(model, _settings("lora"), text_rows_train=True, generator=torch.Generator())
    _train(model, adapters, steps=2)
    state = model.state_dict()
    tensors = {n: state[n] for n, _ in trainable_parameters(model, None)}
    payload = adapter_file(adapters.state_dict(), adapters.spec, state, tensors, {"family": "indextts2"})
    applied = apply_adapter_file(base_state, payload, "lora.pth")
    want = merge_lora(state, adapters.state_dict(), adapters.spec)
    assert all(torch.equal(applied[k], want[k]) for k in want)
    other = {**base_state, "gpt.h.0.attn.c_attn.weight": base_state["gpt.h.0.attn.c_attn.weight"] + 1}
    with pytest.raises(UserError, match="lora.pth: the adapters were trained on other base weights"):
        apply_adapter_file(other, payload, "lora.pth")


def test_merge_refuses_adapters_that_do_not_fit():
    model = _model()
    adapters = apply_scope(model, _settings("lora", rank=2), text_rows_train=True, generator=torch.Generator())
    state = adapters.state_dict()
    with pytest.raises(UserError, match="rank 4"):
        merge_lora(model.state_dict(), state, LoraSpec(rank=4))
    del state["gpt.h.1.mlp.c_fc.lora_B"]
    with pytest.raises(UserError, match="unpaired adapter keys"):
        merge_lora(model.state_dict(), state, LoraSpec(rank=2))


# ---- settings -----------------------------------------------------------------------------------


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"train_scope": "half"}, "train.train_scope 'half': choose one of full, partial, lora"),
    ({"partial_layers": 0}, "train.partial_layers must be an integer >= 1"),
])
def test_bad_scope_settings_name_the_key(kwargs, message):
    with pytest.raises(UserError, match=message):
        ScopeSettings(**kwargs)


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"rank": 0}, "train.lora_rank must be an integer >= 1"),
    ({"alpha": 0.0}, "train.lora_alpha must be > 0"),
    ({"dropout": 1.0}, r"train.lora_dropout must be in \[0, 1\)"),
    ({"targets": ("qkv", "ffn")}, r"train.lora_targets \(--lora-targets\) qkv,ffn: choose one or more of qkv"),
    ({"targets": ()}, r"train.lora_targets \(--lora-targets\) \(empty\)"),
])
def test_bad_lora_settings_name_the_key(kwargs, message):
    with pytest.raises(UserError, match=message):
        LoraSpec(**kwargs)


def test_partial_layers_beyond_the_model_is_refused():
    with pytest.raises(UserError, match="train.partial_layers 5 is more than the model's 3 trunk blocks"):
        apply_scope(_model(), ScopeSettings("partial", partial_layers=5), text_rows_train=True, generator=None)


def test_targets_parse_from_a_flag_or_a_config_value():
    assert parse_targets("qkv, mlp_out") == ("qkv", "mlp_out")
    assert parse_targets("attn_out") == ("attn_out",)


@pytest.mark.parametrize(("train", "message"), [
    ({"train_scope": "half"}, "train.train_scope 'half'"),
    ({"train_scope": "lora", "lora_targets": "qkv,ffn"}, "train.lora_targets (--lora-targets) qkv,ffn"),
    ({"lora_rank": 0}, "train.lora_rank (--lora-rank) must be > 0, got 0"),
    ({"lora_rank": "8"}, "train.lora_rank: expected int"),
    ({"partial_layers": -1}, "train.partial_layers (--partial-layers) must be > 0, got -1"),
    ({"lora_alpha": float("nan")}, "train.lora_alpha (--lora-alpha) must be a finite number, got nan"),
    ({"lora_dropout": 1.0}, "train.lora_dropout (--lora-dropout) must be in [0, 1), got 1.0"),
])
def test_config_train_section_checks_the_scope_keys(train, message):
    with pytest.raises(UserError, match=re.escape(message)):
        config_from_dict({"gpt": {}, "train": train}, "my.yaml")


def test_config_scope_keys_become_settings():
    train = config_from_dict({"gpt": {}, "train": {"train_scope": "lora", "lora_rank": 8, "lora_alpha": 8,
                                                     "lora_targets": "qkv, mlp_in"}}).train
    assert scope_settings(train) == ScopeSettings("lora", 4, LoraSpec(8, 8.0, 0.0, ("qkv", "mlp_in")))


def test_a_checkpoint_of_the_other_family_is_named_by_its_family_on_resume(tmp_path) -> None:
    """An IndexTTS-2.5 run resumed with an IndexTTS2 config was refused for `gpt.max_mel_tokens 90 -> 60`, a
    length limit the two happen to differ in, and the family went unsaid."""
    from pathlib import Path

    from indextts_train.config.settings import config_to_dict, load_config
    from indextts_train.model.scope import check_resume_fits

    root = Path(__file__).resolve().parents[1] / "configs"
    v2, v25 = load_config(root / "tiny.yaml"), load_config(root / "tiny_v25.yaml")
    saved = config_to_dict(v25)
    keys = official_shapes(v25.gpt).keys()
    with pytest.raises(UserError, match=r"^ck.pth holds an IndexTTS-2.5 model, and --config .*tiny.yaml builds "
                                        r"IndexTTS2: a run resumes the model it trained"):
        check_resume_fits(saved["gpt"], saved["train"], v2, Path("ck.pth"), keys)
    check_resume_fits(saved["gpt"], saved["train"], v25, Path("ck.pth"), keys)  # its own config: it fits
