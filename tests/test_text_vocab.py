"""Vocabulary growth, frozen rows, optimizer-state remapping and tokenizer facts."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import torch
from helpers import reference_batch

from indextts_train.checkpoint.base import load_base_checkpoint
from indextts_train.config.constants import TEXT_ROW_KEYS
from indextts_train.config.settings import GPTConfig, load_config
from indextts_train.errors import UserError
from indextts_train.files.bounded import MAX_TOKENIZER_BYTES
from indextts_train.model.gpt import UnifiedVoiceGPT
from indextts_train.text.vocab import (
    RowFreezer,
    VocabPlan,
    frozen_rows,
    growth_between_runs,
    remap_optimizer_rows,
    resize_text_rows,
    tokenizer_size,
)

TINY = Path(__file__).resolve().parent / "data" / "reference" / "tiny"
GROWN = VocabPlan(base_tokens=100, tokens=150)


@pytest.fixture(scope="module")
def cfg() -> GPTConfig:
    return load_config(TINY / "config.yaml").gpt


@pytest.fixture(scope="module")
def base(cfg) -> dict[str, torch.Tensor]:
    trained, _, base_tokens = load_base_checkpoint(TINY / "gpt.pth", cfg)
    assert base_tokens == 100
    return trained


def grown_model(cfg: GPTConfig, trained: dict[str, torch.Tensor], plan: VocabPlan) -> UnifiedVoiceGPT:
    model = UnifiedVoiceGPT(dataclasses.replace(cfg, number_text_tokens=plan.tokens))
    model.load_state_dict(trained)
    return model


def test_growth_keeps_base_rows_and_moves_the_extra_row_like_the_reference(base):
    resized = resize_text_rows(base, GROWN, torch.Generator().manual_seed(0))
    moved = torch.load(TINY / "ext150_text_params_extra_row_moved.pth", weights_only=True)
    for key in TEXT_ROW_KEYS:
        assert resized[key].shape[0] == 151
        assert torch.equal(resized[key][:100], base[key][:100])
        assert torch.equal(resized[key][150], base[key][100])
        assert torch.equal(resized[key][:100], moved[key][:100])
        assert torch.equal(resized[key][150], moved[key][150])
    assert resized["mel_head.weight"] is base["mel_head.weight"]  # everything else passes through


def test_new_rows_start_as_the_average_base_token(base):
    resized = resize_text_rows(base, GROWN, torch.Generator().manual_seed(0))
    for key in ("text_embedding.weight", "text_head.weight"):
        new, mean = resized[key][100:150], base[key][:100].mean(dim=0)
        assert (new - mean).abs().max() < 0.05 * base[key][:100].std()
        assert not torch.equal(new[0], new[1])  # the noise tells new tokens apart
    assert torch.equal(resized["text_head.bias"][100:150], base["text_head.bias"][:100].mean().expand(50))
    again = resize_text_rows(base, GROWN, torch.Generator().manual_seed(0))
    assert all(torch.equal(resized[k], again[k]) for k in TEXT_ROW_KEYS)


def test_same_size_plan_changes_nothing_and_freezes_nothing(base):
    plan = VocabPlan(base_tokens=100, tokens=100)
    resized = resize_text_rows(base, plan, torch.Generator().manual_seed(0))
    assert all(torch.equal(resized[k], base[k]) for k in TEXT_ROW_KEYS)
    assert frozen_rows(plan) is None
    assert frozen_rows(dataclasses.replace(GROWN, freeze_base=False)) is None
    assert frozen_rows(GROWN).tolist() == [*range(100), 150]


def test_extended_model_with_the_moved_row_params_gives_the_reference_losses(cfg, base):
    moved = torch.load(TINY / "ext150_text_params_extra_row_moved.pth", weights_only=True)
    model = grown_model(cfg, {**base, **moved}, GROWN).eval()
    with torch.no_grad():
        text_logits, _ = model(reference_batch())
        out = model.compute_losses(reference_batch())
    assert text_logits.shape == (3, 151, 14)
    assert out.text_loss.item() == pytest.approx(5.174856185913086, abs=1e-5)
    assert out.mel_loss.item() == pytest.approx(4.498324871063232, abs=1e-5)


def train_steps(model: UnifiedVoiceGPT, freezer: RowFreezer | None, steps: int = 4) -> None:
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.1)
    for _ in range(steps):
        out = model.compute_losses(reference_batch())
        (out.text_loss + out.mel_loss).backward()
        if freezer:
            freezer.mask_grads()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad()
        if freezer:
            freezer.restore()


def test_row_freezer_keeps_frozen_rows_bit_identical_under_adamw(cfg, base):
    model = grown_model(cfg, resize_text_rows(base, GROWN, torch.Generator().manual_seed(0)), GROWN).train()
    before = {k: v.detach().clone() for k, v in model.state_dict().items()}
    freezer = RowFreezer(model, GROWN)
    train_steps(model, freezer)
    rows = frozen_rows(GROWN)
    for key in TEXT_ROW_KEYS:
        after = model.get_parameter(key).detach()
        assert torch.equal(after[rows], before[key][rows]), key
    # New head rows are softmax classes on every position, so they learn even unseen in inputs.
    assert not torch.equal(model.text_head.weight[100:150], before["text_head.weight"][100:150])
    assert not torch.equal(model.text_head.bias[100:150], before["text_head.bias"][100:150])


def test_gradient_zeroing_hook_alone_lets_frozen_rows_drift(cfg, base):
    """The community freeze: hooks zero base-row grads, but AdamW weight decay still moves the rows."""
    model = grown_model(cfg, resize_text_rows(base, GROWN, torch.Generator().manual_seed(0)), GROWN).train()
    rows = frozen_rows(GROWN)
    before = model.text_embedding.weight.detach().clone()

    def zero_frozen(grad: torch.Tensor) -> torch.Tensor:
        grad = grad.clone()
        grad[rows] = 0
        return grad

    for key in TEXT_ROW_KEYS:
        model.get_parameter(key).register_hook(zero_frozen)
    train_steps(model, freezer=None)
    assert not torch.equal(model.text_embedding.weight.detach()[rows], before[rows])


def test_mask_grads_zeroes_frozen_rows_only(cfg, base):
    model = grown_model(cfg, resize_text_rows(base, GROWN, torch.Generator().manual_seed(0)), GROWN)
    model.compute_losses(reference_batch()).text_loss.backward()
    RowFreezer(model, GROWN).mask_grads()
    grad = model.text_head.weight.grad
    assert torch.count_nonzero(grad[frozen_rows(GROWN)]) == 0
    assert torch.count_nonzero(grad[100:150]) > 0


def test_row_freezer_does_nothing_when_nothing_is_frozen(cfg, base):
    plan = VocabPlan(base_tokens=100, tokens=100)
    model = grown_model(cfg, base, plan).train()
    before = model.text_embedding.weight.detach().clone()
    train_steps(model, RowFreezer(model, plan), steps=1)
    assert not torch.equal(model.text_embedding.weight.detach()[:100], before[:100])


def test_remap_optimizer_rows_keeps_moments_at_their_new_indices():
    old_plan = VocabPlan(base_tokens=10, tokens=12)
    param = torch.nn.Parameter(torch.randn(old_plan.rows, 4))
    optimizer = torch.optim.AdamW([param], lr=1e-2)
    for _ in range(2):
        param.grad = torch.randn_like(param)
        optimizer.step()
    old_state = optimizer.state[param]
    new_state = remap_optimizer_rows(old_state, growth_between_runs(12, 15, None))
    for name in ("exp_avg", "exp_avg_sq"):
        old, new = old_state[name], new_state[name]
        assert new.shape == (16, 4)
        assert torch.equal(new[:12], old[:12])
        assert torch.equal(new[15], old[12])  # the extra row's moments follow it
        assert torch.equal(new[12:15], torch.zeros(3, 4))
    assert torch.equal(new_state["step"], old_state["step"])
    with pytest.raises(UserError, match="shrink"):
        growth_between_runs(15, 12, None)


def test_plan_rules_round_trip_and_description():
    assert (GROWN.rows, GROWN.extra_row, GROWN.new_ids) == (151, 150, range(100, 150))
    assert VocabPlan.from_dict(GROWN.to_dict()) == GROWN
    text = GROWN.describe()
    assert "100 base tokens -> 150 tokens" in text and "50 new tokens" in text and "row 150" in text
    assert "nothing to freeze" in VocabPlan(100, 100).describe()
    with pytest.raises(UserError, match="shrinking"):
        VocabPlan(base_tokens=100, tokens=90)
    with pytest.raises(UserError, match="expected keys"):
        VocabPlan.from_dict({"base_tokens": 100, "tokens": 150})


def test_resize_rejects_tensors_that_do_not_match_the_plan(base):
    with pytest.raises(UserError, match="text_embedding.weight has 101 rows"):
        resize_text_rows(base, VocabPlan(base_tokens=120, tokens=150), torch.Generator())


def test_tokenizer_size_of_a_trained_sentencepiece_model(tmp_path):
    import sentencepiece as spm

    words = ("the quick brown fox jumps over a lazy dog while seven wizards hex bold jackdaws "
             "and my sphinx of black quartz judges vows").split()
    lines = [" ".join(words[i:] + words[:i]) for i in range(len(words))]
    prefix = tmp_path / "sp"
    spm.SentencePieceTrainer.train(sentence_iterator=iter(lines), model_prefix=str(prefix), vocab_size=60,
                                   model_type="bpe", minloglevel=2)
    assert tokenizer_size(f"{prefix}.model") == 60


def test_tokenizer_size_errors_name_the_file(tmp_path):
    garbage = tmp_path / "garbage.model"
    garbage.write_bytes(b"\x00 not a sentencepiece model")
    with pytest.raises(UserError, match=f"{garbage}: not a SentencePiece model"):
        tokenizer_size(garbage)
    with pytest.raises(UserError, match="tokenizer not found"):
        tokenizer_size(tmp_path / "missing.model")
    empty = tmp_path / "empty.model"  # loaded as a model of 0 pieces: every text id was "outside [0, 0)"
    empty.write_bytes(b"")
    with pytest.raises(UserError, match=f"{empty}: an empty file, not a SentencePiece model"):
        tokenizer_size(empty)
    (tmp_path / "garbage.vocab").write_text("<unk>\t0\n")  # sentencepiece's list of pieces beside its model
    with pytest.raises(UserError, match=f"writes beside its model; pass {garbage}$"):
        tokenizer_size(tmp_path / "garbage.vocab")
    big = tmp_path / "big.model"
    with open(big, "wb") as handle:  # sparse: the size alone is refused, sentencepiece never reads it
        handle.truncate(MAX_TOKENIZER_BYTES + 1)
    with pytest.raises(UserError, match=f"{big}: tokenizer of {MAX_TOKENIZER_BYTES + 1} bytes is larger than"):
        tokenizer_size(big)
