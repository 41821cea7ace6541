"""Extended text vocabulary: how the text rows grow, which rows stay frozen, and how to keep them so.

Text tables (`text_embedding.weight`, `text_head.weight`, `text_head.bias`) have N + 1 rows for a
tokenizer of N pieces: the official layout adds one extra row at index N that is never an input or
a target but is a softmax class (so it shapes `text_loss`).

Growing by k new pieces inserts k rows at the growth point R: rows 0..R-1 stay, rows R..N move to
R+k..N+k, rows R..R+k-1 are new. A SentencePiece model appends its new pieces, so R = N and only
the extra row moves (to the new last index, keeping its meaning; the fork instead turns old row N
into an ordinary token). A tiktoken vocabulary (IndexTTS-2.5) numbers its special tokens after the
ranks, so R = the base's rank count and every special row moves up by k with its id
(`tests/data/reference/v2_5/vocab_growth.json`); stock 2.5 inference then reads each special's old row.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path

import torch
from torch import Tensor, nn

from indextts_train.config.constants import LANG_ROWS, TEXT_ROW_KEYS
from indextts_train.config.family import TIKTOKEN, Family, family_of_tokenizer
from indextts_train.config.settings import GPTConfig, TrainConfig
from indextts_train.errors import UserError
from indextts_train.files.bounded import MAX_TOKENIZER_BYTES, read_checked
from indextts_train.text.languages import borrow_notes
from indextts_train.text.spm_model import spm_from_bytes
from indextts_train.text.tiktoken_vocab import LANGUAGE_CODES, SPECIAL_TOKENS, tiktoken_from_bytes

NEW_ROW_NOISE = 0.01  # noise std of a new row, as a fraction of the base rows' per-column std


@dataclass
class VocabPlan:
    """Base vocabulary (from the checkpoint) -> tokenizer vocabulary, and whether base rows freeze."""

    base_tokens: int  # N: text rows of the base checkpoint - 1
    tokens: int  # N': tokenizer size
    freeze_base: bool = True
    # R: where new rows go in; rows R..N move up by N' - N. None = N (SentencePiece: append). Added
    # with IndexTTS-2.5: state.migrate gives older checkpoints None (theirs are SentencePiece plans),
    # as for a state.added_field (vocab_plan is one of state.COMPONENTS).
    insert_at: int | None = field(default=None, metadata={"filled_when_missing": True})

    def __post_init__(self) -> None:
        counts = (self.base_tokens, self.tokens, 0 if self.insert_at is None else self.insert_at)
        if not all(isinstance(n, int) and not isinstance(n, bool) for n in counts):
            raise UserError(f"vocab plan: token counts must be integers, got {self.base_tokens!r}, {self.tokens!r}, "
                            f"{self.insert_at!r}")
        if self.base_tokens < 1:
            raise UserError(f"vocab plan: base_tokens must be >= 1, got {self.base_tokens}")
        if self.tokens < self.base_tokens:
            raise UserError(
                f"the tokenizer has {self.tokens} pieces but the base checkpoint has {self.base_tokens} text "
                "tokens; shrinking the vocabulary would drop trained rows; use a tokenizer that extends the base one"
            )
        if not 0 < self.growth_at <= self.base_tokens:
            raise UserError(f"vocab plan: insert_at {self.insert_at} must be in 1..{self.base_tokens}")

    @property
    def growth_at(self) -> int:
        return self.base_tokens if self.insert_at is None else self.insert_at

    @property
    def rows(self) -> int:
        return self.tokens + 1

    @property
    def new_ids(self) -> range:
        return range(self.growth_at, self.growth_at + self.tokens - self.base_tokens)

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
        new, k, at = self.new_ids, len(self.new_ids), self.growth_at
        lines = [head, f"  rows 0..{at - 1}: base tokens ({state})",
                 f"  rows {new.start}..{new.stop - 1}: {k} new tokens (trained)"]
        if at < self.base_tokens:
            lines.append(f"  rows {at + k}..{self.base_tokens + k - 1}: special tokens, moved up by {k} with their "
                         f"ids ({state})")
        lines.append(f"  row {self.extra_row}: extra row, moved from {self.base_tokens} ({state})")
        return "\n".join(lines)


@dataclass(frozen=True)
class Tokenizer:
    """The run's tokenizer, read once: its family (by its suffix), its size and where it puts new pieces."""

    path: Path | None  # None: no --tokenizer; the config's number_text_tokens stands and ids go unchecked
    family: Family | None
    size: int  # text tokens: pieces of a SentencePiece model, or ranks + specials of a .tiktoken file

    def size_model(self, gpt: GPTConfig) -> None:
        """The model's text rows are this tokenizer's pieces (no file: the config's stand), settled before the
        hardware plan: the plan, the data's id checks and the weights then count the same rows. A config
        written for the base vocabulary under an extended tokenizer undercounted the plan's parameters."""
        gpt.number_text_tokens = self.size

    def growth_point(self, base_tokens: int) -> int | None:
        """VocabPlan.insert_at for a base of `base_tokens` text tokens (None: new rows are appended)."""
        return None if self.path is None else _growth_point(self.path, self.family, base_tokens)

    def growth_from(self, base_tokens: int, freeze_base: bool = True) -> VocabPlan:
        """The growth from `base_tokens` text rows (a base checkpoint's, a resumed one's) to this tokenizer's."""
        return VocabPlan(base_tokens=base_tokens, tokens=self.size, freeze_base=freeze_base,
                         insert_at=self.growth_point(base_tokens))

    def grow(self, state: dict[str, Tensor] | None, saved: dict | None, *, freeze_base: bool,
             seed: int) -> tuple[dict[str, Tensor] | None, VocabPlan, VocabPlan]:
        """`state`'s text rows grown to this tokenizer (new rows from `seed`, resize_text_rows).

        Returns (the grown state, the weights' plan, the growth since `saved`). A new run's plan is its
        growth from the base (or none for random init, `state` None); a resumed run keeps the base of
        its checkpoint's plan (`saved`, as VocabPlan.to_dict wrote it) and reports the growth since
        its checkpoint (none when the tokenizer is the same).
        """
        if state is None:
            return None, VocabPlan(self.size, self.size, freeze_base), VocabPlan(self.size, self.size)
        stored = state[TEXT_ROW_KEYS[0]].shape[0] - 1
        growth = self.growth_from(stored, freeze_base)
        if self.size != stored:
            state = resize_text_rows(state, growth, torch.Generator().manual_seed(seed))
        if saved is None:
            return state, growth, VocabPlan(self.size, self.size)
        saved = VocabPlan.from_dict(saved)
        # A repaired community plan does not say where new rows went; the tokenizer's kind does.
        insert_at = saved.insert_at if saved.insert_at is not None else self.growth_point(saved.base_tokens)
        return state, VocabPlan(saved.base_tokens, self.size, freeze_base, insert_at=insert_at), growth


def read_tokenizer(path: str | Path | None, gpt: GPTConfig | None = None,
                   model_source: str = "the config") -> Tokenizer:
    """A tokenizer file read once. With `gpt` (the model's config), one of another family than the model's
    (`model_source` says where that came from: the base checkpoint's keys or the config) is refused
    before the file is read, and no file (path None) leaves the config's number_text_tokens."""
    if path is None:
        return Tokenizer(None, None, gpt.number_text_tokens)
    path = Path(path)
    found, model = family_of_tokenizer(path), gpt and gpt.stated_family
    if model is not None and found is not model:
        wanted = f"{model.name}'s {model.tokenizer_label} ({model.tokenizer_name} or its extension)"
        raise UserError(f"--tokenizer {path}: an {found.name} {found.tokenizer_noun}, but {model_source} is "
                        f"{model.name}; pass {wanted}, or the checkpoint and config of the tokenizer's family")
    hint = f"pass an existing {found.tokenizer_label} file as --tokenizer"
    raw = read_checked(path, MAX_TOKENIZER_BYTES, "tokenizer", missing=hint)  # read once, parsed by its kind
    if found.tokenizer_kind == TIKTOKEN:
        return Tokenizer(path, found, tiktoken_from_bytes(path, raw).n_vocab)
    return Tokenizer(path, found, spm_from_bytes(path, raw, hint).get_piece_size())


def tokenizer_size(path: str | Path) -> int:
    """Number of text tokens: pieces of a SentencePiece model, or ranks + specials of a .tiktoken file."""
    return read_tokenizer(path).size


def _growth_point(path: str | Path, family: Family, base_tokens: int) -> int | None:
    """A tiktoken model's text rows are ranks then the 1,673 specials, so the base's ranks are
    base_tokens - 1673 whatever the new file holds; a SentencePiece model appends (None)."""
    if not family.specials_follow_ranks:
        return None
    base_ranks = base_tokens - len(SPECIAL_TOKENS)
    if base_ranks < 1:
        raise UserError(f"{path}: a tiktoken vocabulary has {len(SPECIAL_TOKENS)} special tokens after its ranks, "
                        f"but the base checkpoint has only {base_tokens} text tokens; use the SentencePiece "
                        "tokenizer of an IndexTTS2 checkpoint, or an IndexTTS-2.5 checkpoint")
    return base_ranks


def growth_point(path: str | Path | None, base_tokens: int) -> int | None:
    """VocabPlan.insert_at for a tokenizer file: the base's rank count for tiktoken, None (append) otherwise."""
    return None if path is None else _growth_point(path, family_of_tokenizer(path), base_tokens)


def _move_rows(old: Tensor, at: int, added: int, fill: Tensor) -> Tensor:
    """Rows 0..at-1 stay, rows at.. move up by `added`, the rows between come from `fill`.

    old (N+1, ...), fill (added, ...) -> (N+1+added, ...).
    """
    return torch.cat([old[:at], fill.to(old.dtype), old[at:]])


def _new_rows(base: Tensor, count: int, generator: torch.Generator) -> Tensor:
    """Mean of the base rows plus small Gaussian noise. base (N, D) -> (count, D)."""
    mean, std = base.mean(dim=0), base.std(dim=0, correction=0)
    noise = torch.randn((count, *base.shape[1:]), generator=generator).to(base)  # generator is CPU
    return mean + NEW_ROW_NOISE * std * noise


def resize_text_rows(
    trained: dict[str, Tensor], plan: VocabPlan, generator: torch.Generator
) -> dict[str, Tensor]:
    """Grow the three text tensors from plan.base_tokens + 1 to plan.rows rows.

    - rows 0..R-1 (base ids; R = plan.growth_at) are copied bit-for-bit to the same indices;
    - rows R..N (tiktoken specials, and the extra row N) move up by k = N' - N, keeping their meaning;
    - new rows R..R+k-1: embedding and head weight = mean of the base rows + Gaussian noise with
      std 1% of the base rows' per-column std (from `generator`), so a new token starts as an
      "average" token rather than a random one; head bias = mean of the base biases, so new
      tokens get an average logit and do not take over the softmax at the start.
    Other tensors are passed through. N' == N returns equal tensors.
    """
    resized = dict(trained)
    n_base, n_new, at = plan.base_tokens, len(plan.new_ids), plan.growth_at
    for key in TEXT_ROW_KEYS:
        old = trained[key]
        if old.shape[0] != n_base + 1:
            raise UserError(f"{key} has {old.shape[0]} rows but the vocab plan expects {n_base + 1} "
                            f"(base_tokens {n_base} + 1)")
        base = old[:at]
        if key == "text_head.bias":
            fill = base.mean().expand(n_new)
        else:
            fill = _new_rows(base, n_new, generator)
        resized[key] = _move_rows(old, at, n_new, fill)
    return resized


def frozen_rows(plan: VocabPlan) -> Tensor | None:
    """Row indices kept bit-identical: every row but the new ones, only when new tokens exist.

    With no new tokens (N' == N) there is nothing new to learn, so freezing would freeze the whole
    text vocabulary; instead nothing is frozen and the text rows train normally.
    """
    if not plan.freeze_base or not plan.new_ids:
        return None
    new = plan.new_ids
    return torch.cat([torch.arange(new.start), torch.arange(new.stop, plan.rows)])


def frozen_language_rows(trained_lang_ids: Iterable[int]) -> Tensor:
    """lang_embedding rows of the languages the training data does not have: kept bit-identical."""
    used = set(trained_lang_ids)
    return torch.tensor([row for row in range(LANG_ROWS) if row not in used], dtype=torch.int64)


class RowFreezer:
    """Keeps frozen rows bit-identical through optimizer steps.

    What is frozen: the text rows of `frozen_rows(plan)`; with IndexTTS-2.5 also the
    `lang_embedding` rows in `language_rows` and, when `freeze_speaker_proj`, all of `spk_emb_proj`.
    Zeroing their gradients is not enough: AdamW's decoupled weight decay scales every row, and
    momentum from earlier steps keeps moving them. So `mask_grads()` (after backward, before
    clipping) keeps them out of the update and the grad norm, and `restore()` (after the optimizer
    step) writes back the exact saved values. The optimizer's parameter set stays the same whatever
    is frozen, so a resume may change these choices.
    """

    def __init__(self, model: nn.Module, plan: VocabPlan, *, language_rows: Tensor | None = None,
                 freeze_speaker_proj: bool = False) -> None:
        text = model.get_parameter(TEXT_ROW_KEYS[0])
        if text.shape[0] != plan.rows:
            raise ValueError(f"model has {text.shape[0]} text rows, the vocab plan {plan.rows}")
        rows = frozen_rows(plan)
        # (parameter, frozen row indices or None for the whole tensor, saved values)
        self.targets: list[tuple[nn.Parameter, Tensor | None, Tensor]] = []
        if rows is not None:
            self.targets += [(model.get_parameter(key), rows, None) for key in TEXT_ROW_KEYS]
        if language_rows is not None and len(language_rows):
            self.targets.append((model.get_parameter("lang_embedding.weight"), language_rows, None))
        if freeze_speaker_proj:
            self.targets += [(model.get_parameter(f"spk_emb_proj.{name}"), None, None) for name in ("weight", "bias")]
        self.targets = [(p, r, (p.detach() if r is None else p.detach()[r]).clone()) for p, r, _ in self.targets]

    def _follow_device(self) -> None:
        """The model may move (e.g. to the GPU) after the freezer is made; move once, not per step."""
        if self.targets and self.targets[0][2].device != self.targets[0][0].device:
            self.targets = [(p, None if r is None else r.to(p.device), saved.to(p.device))
                            for p, r, saved in self.targets]

    def mask_grads(self) -> None:
        self._follow_device()
        for param, rows, _ in self.targets:
            if param.grad is not None:
                if rows is None:
                    param.grad.zero_()
                else:
                    param.grad[rows] = 0

    @torch.no_grad()
    def restore(self) -> None:
        self._follow_device()
        for param, rows, saved in self.targets:
            if rows is None:
                param.copy_(saved)
            else:
                param[rows] = saved.to(param.dtype)


def family_freezer(model: nn.Module, plan: VocabPlan, gpt: GPTConfig, train: TrainConfig,
                   lang_ids: Iterable[int], say: Callable[[str], None]) -> RowFreezer:
    """The run's RowFreezer; for IndexTTS-2.5 also the language rows the data does not train and,
    unless --train-speaker-proj, spk_emb_proj. `say` gets one line describing it."""
    if not gpt.family.language_rows:
        return RowFreezer(model, plan)
    used = sorted({int(i) for i in lang_ids})
    rows = frozen_language_rows(used)
    names = ", ".join(f"{LANGUAGE_CODES[i] if i < len(LANGUAGE_CODES) else i} ({i})" for i in used)
    speaker = "trained (--train-speaker-proj)" if train.train_speaker_proj else "frozen (default)"
    say(f"language rows trained: {names}; the other {len(rows)} lang_embedding rows frozen; "
        f"spk_emb_proj {speaker}")
    for note in borrow_notes(train.borrow_languages):
        say(note)
    return RowFreezer(model, plan, language_rows=rows, freeze_speaker_proj=not train.train_speaker_proj)


def growth_between_runs(saved_tokens: int, tokens: int, tokenizer: str | Path | None) -> VocabPlan:
    """The growth from a checkpoint's text rows to a larger tokenizer's (a vocabulary change on resume).

    New rows go where the tokenizer puts new pieces: at the end for SentencePiece, before the
    1,673 specials for tiktoken (after the ranks an earlier growth added), so every saved row,
    specials included, keeps its token.
    """
    return VocabPlan(base_tokens=saved_tokens, tokens=tokens, insert_at=growth_point(tokenizer, saved_tokens))


def remap_optimizer_rows(old_state: dict, growth: VocabPlan) -> dict:
    """Carry one text tensor's AdamW state across a vocab growth (`growth_between_runs`).

    Row-shaped moments (exp_avg, exp_avg_sq, max_exp_avg_sq) keep each old row's values at its new
    index (the rows after the growth point, the extra row included, move up); new rows start at
    zero. `step` is kept, so new rows see a bias correction already near 1: their first updates are
    slightly smaller than a fresh optimizer's, which is the cautious side for fresh rows.
    """
    old_rows, added = growth.base_tokens + 1, len(growth.new_ids)
    remapped = {}
    for name, value in old_state.items():
        if isinstance(value, Tensor) and value.dim() > 0 and value.shape[0] == old_rows:
            value = _move_rows(value, growth.growth_at, added, value.new_zeros((added, *value.shape[1:])))
        remapped[name] = value
    return remapped
