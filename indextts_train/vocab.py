"""Extended text vocabulary: how the text rows grow, which rows stay frozen, and how to keep them so.

Text tables (`text_embedding.weight`, `text_head.weight`, `text_head.bias`) have N + 1 rows for a
tokenizer of N pieces: the official layout adds one extra row at index N that is never an input or
a target but is a softmax class (so it shapes `text_loss`). Growing N -> N' keeps base rows
0..N-1 at their indices and moves the extra row to the new last index N', so it keeps its meaning;
the fork instead turns old row N into an ordinary token and leaves the new extra row random.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import Tensor

from indextts_train.constants import TEXT_ROW_KEYS
from indextts_train.errors import UserError
from indextts_train.model import UnifiedVoiceGPT

NEW_ROW_NOISE = 0.01  # noise std of a new row, as a fraction of the base rows' per-column std


@dataclass
class VocabPlan:
    """Base vocabulary (from the checkpoint) -> tokenizer vocabulary, and whether base rows freeze."""

    base_tokens: int  # N: text rows of the base checkpoint - 1
    tokens: int  # N': tokenizer size
    freeze_base: bool = True

    def __post_init__(self) -> None:
        if not all(isinstance(n, int) and not isinstance(n, bool) for n in (self.base_tokens, self.tokens)):
            raise UserError(f"vocab plan: token counts must be integers, got {self.base_tokens!r}, {self.tokens!r}")
        if self.base_tokens < 1:
            raise UserError(f"vocab plan: base_tokens must be >= 1, got {self.base_tokens}")
        if self.tokens < self.base_tokens:
            raise UserError(
                f"the tokenizer has {self.tokens} pieces but the base checkpoint has {self.base_tokens} text "
                "tokens; shrinking the vocabulary would drop trained rows; use a tokenizer that extends the base one"
            )

    @property
    def rows(self) -> int:
        return self.tokens + 1

    @property
    def new_ids(self) -> range:
        return range(self.base_tokens, self.tokens)

    @property
    def extra_row(self) -> int:
        return self.tokens

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> VocabPlan:
        names = [f.name for f in dataclasses.fields(cls)]
        if not isinstance(data, dict) or set(data) != set(names):
            got = sorted(data) if isinstance(data, dict) else type(data).__name__
            raise UserError(f"vocab plan: expected keys {names}, got {got}")
        return cls(**data)

    def describe(self) -> str:
        head = f"text vocab: {self.base_tokens} base tokens -> {self.tokens} tokens, {self.rows} text rows"
        if not self.new_ids:
            return f"{head}\n  no new tokens: every row is trained (nothing to freeze)"
        state = "frozen" if self.freeze_base else "trained"
        return (
            f"{head}\n"
            f"  rows 0..{self.base_tokens - 1}: base tokens ({state})\n"
            f"  rows {self.new_ids.start}..{self.new_ids.stop - 1}: {len(self.new_ids)} new tokens (trained)\n"
            f"  row {self.extra_row}: extra row, moved from {self.base_tokens} ({state})"
        )


def tokenizer_size(path: str | Path) -> int:
    """Number of pieces of a SentencePiece model."""
    import sentencepiece as spm  # only needed here; keeps `import indextts_train.vocab` light

    path = Path(path)
    if not path.is_file():
        raise UserError(f"{path}: tokenizer not found; pass --tokenizer path/to/bpe.model")
    try:
        processor = spm.SentencePieceProcessor(model_file=str(path))
    except (RuntimeError, OSError) as exc:
        raise UserError(f"{path}: not a SentencePiece model ({exc})") from None
    return processor.get_piece_size()


def _move_rows(old: Tensor, old_tokens: int, new_tokens: int, fill: Tensor) -> Tensor:
    """Rows 0..old_tokens-1 stay, the extra row old_tokens -> new_tokens, rows between from `fill`.

    old (old_tokens+1, ...), fill (new_tokens-old_tokens, ...) -> (new_tokens+1, ...).
    """
    return torch.cat([old[:old_tokens], fill.to(old.dtype), old[old_tokens:old_tokens + 1]])


def _new_rows(base: Tensor, count: int, generator: torch.Generator) -> Tensor:
    """Mean of the base rows plus small Gaussian noise. base (N, D) -> (count, D)."""
    mean, std = base.mean(dim=0), base.std(dim=0, correction=0)
    noise = torch.randn((count, *base.shape[1:]), generator=generator).to(base)  # generator is CPU
    return mean + NEW_ROW_NOISE * std * noise


def resize_text_rows(
    trained: dict[str, Tensor], plan: VocabPlan, generator: torch.Generator
) -> dict[str, Tensor]:
    """Grow the three text tensors from plan.base_tokens + 1 to plan.rows rows.

    - rows 0..N-1 (base ids) are copied bit-for-bit to the same indices;
    - the extra row N moves to the new last index N' (it keeps its meaning there);
    - new rows N..N'-1: embedding and head weight = mean of the base rows + Gaussian noise with
      std 1% of the base rows' per-column std (from `generator`), so a new token starts as an
      "average" token rather than a random one; head bias = mean of the base biases, so new
      tokens get an average logit and do not take over the softmax at the start.
    Other tensors are passed through. N' == N returns equal tensors.
    """
    resized = dict(trained)
    n_base, n_new = plan.base_tokens, len(plan.new_ids)
    for key in TEXT_ROW_KEYS:
        old = trained[key]
        if old.shape[0] != n_base + 1:
            raise UserError(f"{key} has {old.shape[0]} rows but the vocab plan expects {n_base + 1} "
                            f"(base_tokens {n_base} + 1)")
        base = old[:n_base]
        if key == "text_head.bias":
            fill = base.mean().expand(n_new)
        else:
            fill = _new_rows(base, n_new, generator)
        resized[key] = _move_rows(old, n_base, plan.tokens, fill)
    return resized


def frozen_rows(plan: VocabPlan) -> Tensor | None:
    """Row indices kept bit-identical: base ids and the extra row, only when new tokens exist.

    With no new tokens (N' == N) there is nothing new to learn, so freezing would freeze the whole
    text vocabulary; instead nothing is frozen and the text rows train normally.
    """
    if not plan.freeze_base or not plan.new_ids:
        return None
    return torch.cat([torch.arange(plan.base_tokens), torch.tensor([plan.extra_row])])


class RowFreezer:
    """Keeps the frozen rows of the three text tensors bit-identical through optimizer steps.

    Zeroing their gradients is not enough: AdamW's decoupled weight decay scales every row, and
    momentum from earlier steps keeps moving them. So `mask_grads()` (after backward, before
    clipping) keeps them out of the update and the grad norm, and `restore()` (after the optimizer
    step) writes back the exact saved values.
    """

    def __init__(self, model: UnifiedVoiceGPT, plan: VocabPlan) -> None:
        self.rows = frozen_rows(plan)
        self.params = [model.get_parameter(key) for key in TEXT_ROW_KEYS]
        if self.params[0].shape[0] != plan.rows:
            raise ValueError(f"model has {self.params[0].shape[0]} text rows, the vocab plan {plan.rows}")
        self.saved: list[Tensor] = []
        if self.rows is not None:
            self.saved = [p.detach()[self.rows].clone() for p in self.params]

    def _follow_device(self) -> None:
        """The model may move (e.g. to the GPU) after the freezer is made; move once, not per step."""
        device = self.params[0].device
        if self.rows is not None and self.rows.device != device:
            self.rows = self.rows.to(device)
            self.saved = [s.to(device) for s in self.saved]

    def mask_grads(self) -> None:
        if self.rows is None:
            return
        self._follow_device()
        for param in self.params:
            if param.grad is not None:
                param.grad[self.rows] = 0

    @torch.no_grad()
    def restore(self) -> None:
        if self.rows is None:
            return
        self._follow_device()
        for param, saved in zip(self.params, self.saved, strict=True):
            param[self.rows] = saved.to(param.dtype)


def remap_optimizer_rows(old_state: dict, old_plan: VocabPlan, new_plan: VocabPlan) -> dict:
    """Carry one text tensor's AdamW state across a vocab growth.

    Row-shaped moments (exp_avg, exp_avg_sq, max_exp_avg_sq) keep each old row's values at its new
    index (the extra row moves old N' -> new N''); new rows start at zero. `step` is kept, so new
    rows see a bias correction already near 1: their first updates are slightly smaller than a
    fresh optimizer's, which is the cautious side for fresh rows.
    """
    old_tokens, new_tokens = old_plan.tokens, new_plan.tokens
    if new_tokens < old_tokens:
        raise UserError(f"cannot shrink the text vocabulary from {old_tokens} to {new_tokens} tokens")
    remapped = {}
    for name, value in old_state.items():
        if isinstance(value, Tensor) and value.dim() > 0 and value.shape[0] == old_plan.rows:
            fill = value.new_zeros((new_tokens - old_tokens, *value.shape[1:]))
            value = _move_rows(value, old_tokens, new_tokens, fill)
        remapped[name] = value
    return remapped
