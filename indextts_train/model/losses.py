"""The heads' cross-entropy in chunks of positions: the full logits never exist, forward or backward.

For the real config the mel head alone makes 8,194 logits per position; at micro-batch 16 and the
longest samples that is 16 x 1,817 x 8,194 float32 values (0.95 GB), and cross-entropy keeps its
log-softmax and later its gradient as large again. That memory, not the trunk, decided the
micro-batch on 16-24 GB cards.

`chunked_head_ce` computes the same masked sum of per-position cross-entropies (and the top-1 hit
count) from the head's *input* (B, L, D) instead: positions go through the head CHUNK_LOGITS
logits at a time, and the backward recomputes each chunk's logits and turns them straight into the
gradients of the hidden states, the weight and the bias. Peak memory for the logits is then one
chunk (~100 MiB), whatever the micro-batch; the price is one extra head matmul per position in the
backward (about 1% of a step's FLOPs for the real config).

Numerics follow the plain path (`model.losses_from_logits`): the head runs in autocast's dtype when
autocast is on (float32 otherwise), cross-entropy in float32, and the backward scales the
softmax-minus-one-hot by the incoming gradient *before* casting it for the matmuls, as autograd
does, so fp16 loss scaling keeps small gradients. Results equal the plain path's up to float32
summation order (tests/test_model_losses.py).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

CHUNK_LOGITS = 2**23  # logits per chunk: 32 MiB in float32; rows per chunk = CHUNK_LOGITS // classes


def _chunk_logits(hidden: Tensor, weight: Tensor, bias: Tensor) -> Tensor:
    """(n, D) -> (n, C) float32 logits; the matmul in weight's dtype (autocast's, or float32)."""
    return F.linear(hidden.to(weight.dtype), weight, bias).float()


class _ChunkedHeadCE(torch.autograd.Function):
    """sum over masked rows of CE(hidden @ W.T + b, target), and the top-1 hits; see module doc."""

    @staticmethod
    def forward(ctx, hidden: Tensor, weight: Tensor, bias: Tensor, targets: Tensor, mask: Tensor,
                rows: int, dtype: torch.dtype) -> tuple[Tensor, Tensor]:
        # hidden (N, D) float32, targets (N,) int64, mask (N,) bool
        ce_sum = hidden.new_zeros((), dtype=torch.float32)
        correct = torch.zeros((), dtype=torch.int64, device=hidden.device)
        w, b = weight.to(dtype), bias.to(dtype)  # cast once, not per chunk
        for start in range(0, hidden.shape[0], rows):
            part = slice(start, start + rows)
            logits = _chunk_logits(hidden[part], w, b)  # (n, C)
            ce = F.cross_entropy(logits, targets[part], reduction="none")  # (n,)
            ce_sum += (ce * mask[part]).sum()
            correct += ((logits.argmax(dim=1) == targets[part]) & mask[part]).sum()
        ctx.save_for_backward(hidden, weight, bias, targets, mask)
        ctx.rows, ctx.dtype = rows, dtype
        ctx.mark_non_differentiable(correct)
        return ce_sum, correct

    @staticmethod
    def backward(ctx, grad_ce: Tensor, _grad_correct: Tensor) -> tuple:
        hidden, weight, bias, targets, mask = ctx.saved_tensors
        rows, dtype = ctx.rows, ctx.dtype
        grad_hidden = torch.empty_like(hidden)  # (N, D)
        grad_weight = torch.zeros_like(weight, dtype=torch.float32)  # (C, D)
        grad_bias = torch.zeros_like(bias, dtype=torch.float32)  # (C,)
        scale = mask.to(torch.float32) * grad_ce  # (N,): d(ce_sum)/d(ce) per row
        w, b = weight.to(dtype), bias.to(dtype)
        for start in range(0, hidden.shape[0], rows):
            part = slice(start, start + rows)
            h = hidden[part].to(dtype)
            grad_logits = _chunk_logits(h, w, b).softmax(dim=1)  # (n, C)
            grad_logits[torch.arange(len(h), device=h.device), targets[part]] -= 1.0
            grad_logits *= scale[part, None]  # softmax - one-hot, times the incoming gradient
            grad_bias += grad_logits.sum(dim=0)
            g = grad_logits.to(dtype)
            grad_hidden[part] = g @ w
            if g.dtype == grad_weight.dtype:
                grad_weight.addmm_(g.t(), h)  # in place: no (C, D) temporary
            else:
                grad_weight += g.t() @ h
        return (grad_hidden, grad_weight.to(weight.dtype), grad_bias.to(bias.dtype),
                None, None, None, None)


def _compute_dtype(device: torch.device) -> torch.dtype:
    """The dtype a Linear would run in here: autocast's when it is on, else float32."""
    if torch.is_autocast_enabled(device.type):
        return torch.get_autocast_dtype(device.type)
    return torch.float32


def chunked_head_ce(hidden: Tensor, head: nn.Linear, targets: Tensor, mask: Tensor,
                    chunk_logits: int = CHUNK_LOGITS) -> tuple[Tensor, Tensor]:
    """Masked CE sum and top-1 hits of `head` over `hidden`, CHUNK_LOGITS logits at a time.

    hidden (B, L, D), targets (B, L) int64, mask (B, L) bool -> (ce_sum float32 scalar with a
    gradient to hidden, head.weight and head.bias; correct int64 scalar).
    """
    rows = max(1, chunk_logits // head.out_features)
    flat = hidden.reshape(-1, hidden.shape[-1]).float()  # (B*L, D)
    dtype = _compute_dtype(hidden.device)
    with torch.autocast(hidden.device.type, enabled=False):  # casts are explicit inside
        return _ChunkedHeadCE.apply(flat, head.weight, head.bias, targets.reshape(-1), mask.reshape(-1),
                                    rows, dtype)
