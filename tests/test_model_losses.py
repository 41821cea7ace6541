"""The chunked head loss equals the plain full-logits loss: values, top-1 and every gradient, on the
reference case of each family (IndexTTS2 and IndexTTS-2.5)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from helpers import reference_batch
from test_model_gpt_v25 import v25_batch

from indextts_train.config.settings import load_config
from indextts_train.model.gpt import Batch, UnifiedVoiceGPT, losses_from_hidden, losses_from_logits
from indextts_train.model.layout import load_base_checkpoint
from indextts_train.model.losses import chunked_head_ce

REF = Path(__file__).resolve().parent / "data" / "reference"
CASES = {"indextts2": (REF / "tiny", reference_batch), "indextts2.5": (REF / "v2_5" / "tiny", v25_batch)}
FIELDS = ("text_loss", "mel_loss", "mel_top1", "text_ce_sum", "text_count", "mel_ce_sum", "mel_count",
          "mel_correct")


def _reference_model(case: str = "indextts2") -> UnifiedVoiceGPT:
    folder = CASES[case][0]
    cfg = load_config(folder / "config.yaml").gpt
    trained, _, _ = load_base_checkpoint(folder / "gpt.pth", cfg)
    model = UnifiedVoiceGPT(cfg)
    model.load_state_dict(trained)
    return model.eval()


def _losses_and_grads(model: UnifiedVoiceGPT, batch: Batch, chunk_logits: int | None) -> tuple[dict, dict]:
    """Losses and parameter gradients of 0.2 text + 0.8 mel, plain (None) or chunked."""
    model.zero_grad(set_to_none=True)
    text_hidden, mel_hidden = model.hidden_states(batch)
    if chunk_logits is None:
        text_logits = model.text_head(text_hidden).permute(0, 2, 1)
        mel_logits = model.mel_head(mel_hidden).permute(0, 2, 1)
        out = losses_from_logits(text_logits, mel_logits, batch, model.cfg)
    else:
        out = losses_from_hidden(text_hidden, mel_hidden, model.text_head, model.mel_head, batch, model.cfg,
                                 chunk_logits)
    (0.2 * out.text_loss + 0.8 * out.mel_loss).backward()
    return ({f: getattr(out, f).detach() for f in FIELDS},
            {k: p.grad.clone() for k, p in model.named_parameters() if p.grad is not None})


@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("chunk_logits", [1, 5 * 101, 7 * 101, 10**9])  # 1 row, ragged chunks, one chunk
def test_chunked_equals_plain_on_the_reference_case(case, chunk_logits):
    model, batch = _reference_model(case), CASES[case][1]()
    plain_losses, plain_grads = _losses_and_grads(model, batch, None)
    losses, grads = _losses_and_grads(model, batch, chunk_logits)
    for name in ("text_count", "mel_count", "mel_correct"):
        assert torch.equal(losses[name], plain_losses[name]), name
    for name in ("text_loss", "mel_loss", "mel_top1", "text_ce_sum", "mel_ce_sum"):
        torch.testing.assert_close(losses[name], plain_losses[name], rtol=1e-6, atol=1e-6)
    assert list(grads) == list(plain_grads)  # the same tensors get a gradient
    for key in grads:
        torch.testing.assert_close(grads[key], plain_grads[key], rtol=1e-5, atol=1e-7, msg=key)


@pytest.mark.parametrize("case", list(CASES))
def test_the_model_trains_through_the_chunked_loss(case):
    """compute_losses goes through losses_from_hidden for both families, so the reference checks in
    test_model_gpt.py and test_model_gpt_v25.py hold for it."""
    model, batch = _reference_model(case), CASES[case][1]()
    out = model.compute_losses(batch)
    plain, _ = _losses_and_grads(model, batch, None)
    torch.testing.assert_close(out.mel_loss.detach(), plain["mel_loss"], rtol=1e-6, atol=1e-6)
    assert out.mel_loss.grad_fn is not None


def test_masked_rows_get_no_gradient_and_do_not_count():
    torch.manual_seed(0)
    head = torch.nn.Linear(8, 11)
    hidden = torch.randn(2, 5, 8, requires_grad=True)
    targets = torch.randint(0, 11, (2, 5))
    mask = torch.tensor([[True] * 5, [True, True, False, False, False]])
    ce_sum, correct = chunked_head_ce(hidden, head, targets, mask, chunk_logits=3 * 11)
    ce_sum.backward()
    assert torch.equal(hidden.grad[1, 2:], torch.zeros(3, 8))
    plain = torch.nn.functional.cross_entropy(head(hidden[mask]), targets[mask], reduction="sum")
    torch.testing.assert_close(ce_sum, plain)
    assert correct.item() == (head(hidden[mask]).argmax(1) == targets[mask]).sum().item()


def test_under_autocast_the_head_runs_in_the_autocast_dtype():
    """bf16 autocast on CPU: the chunked loss matches the plain path to bf16 precision, not fp32."""
    torch.manual_seed(0)
    head = torch.nn.Linear(16, 40)
    hidden = torch.randn(3, 7, 16)
    targets = torch.randint(0, 40, (3, 7))
    mask = torch.ones(3, 7, dtype=torch.bool)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        chunked, _ = chunked_head_ce(hidden, head, targets, mask, chunk_logits=4 * 40)
        plain = torch.nn.functional.cross_entropy(head(hidden).float().reshape(-1, 40), targets.reshape(-1),
                                                  reduction="sum")
    fp32 = torch.nn.functional.cross_entropy(head(hidden).reshape(-1, 40), targets.reshape(-1), reduction="sum")
    torch.testing.assert_close(chunked, plain, rtol=1e-5, atol=1e-5)
    assert not torch.equal(chunked, fp32)  # the bf16 matmul really happened
