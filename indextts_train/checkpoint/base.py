"""Reading a base `gpt.pth` (official, community or our own checkpoint) into the model's two parts.

It reads through the checkpoint loader (no pickled code, CRC-checked when ours) and checks the keys
against the official layout of the config's family (model/layout.py). A start reads it once into a
`BaseCheckpoint` (read_base) that settles the family, carries the verdict of the checks and gives the
weights; the commands that use one file's weights call load_base_checkpoint.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import Tensor

from indextts_train.checkpoint.files import load_checkpoint
from indextts_train.checkpoint.kinds import ignored_by_base_checkpoint
from indextts_train.checkpoint.model_fit import fit_problem
from indextts_train.config.family import Family, family_of_keys
from indextts_train.config.settings import GPTConfig
from indextts_train.errors import UserError
from indextts_train.model.layout import clean_keys, official_shapes, preview_names, split_state_dict
from indextts_train.model.lora import merge_lora, record_spec


def _read_state(path: Path, merge_adapters: bool, loaded: object | None = None) -> dict[str, Tensor]:
    """torch.load without pickled code; accepts a plain state dict or {'model': state_dict}.

    `loaded` is what the checkpoint module's loader returned when the caller has read `path` already.
    A --train-scope lora checkpoint of ours keeps the frozen base in `model` and the adapters in
    `lora`; its weights are the two merged (unless `merge_adapters` is False: the caller hooks them).
    """
    obj = load_checkpoint(path) if loaded is None else loaded
    record = obj.get("lora") if isinstance(obj, Mapping) else None
    if isinstance(obj, Mapping) and isinstance(obj.get("model"), Mapping):
        obj = obj["model"]
        if merge_adapters and isinstance(record, Mapping):
            obj = merge_lora(obj, record["adapters"], record_spec(record))
    if not isinstance(obj, Mapping) or not obj:
        raise UserError(f"{path}: not a gpt.pth state dict (expected a mapping of key -> tensor)")
    not_tensors = [str(k) for k, v in obj.items() if not isinstance(v, Tensor)]
    if not_tensors:
        raise UserError(f"{path}: not a gpt.pth state dict; non-tensor entries: {preview_names(not_tensors)}")
    return dict(obj)


@dataclass(frozen=True)
class BaseCheckpoint:
    """A base gpt.pth read once for a whole start (mmap: tensor data stays on disk until used; one CRC
    pass): the family of the config, the checks before training and the fresh weights all use this.

    Judged against the config when read; what is wrong (`problem`) is said among the checks before
    training, in their order (a missing manifest or an earlier run in the output folder first).
    """

    path: Path
    state: dict[str, Tensor]  # official names; a --train-scope lora checkpoint's adapters merged in
    family: Family | None  # what its keys show; None: no marker key (the layout check names what is missing)
    ignored: str | None  # what a training checkpoint given as the base leaves out; said when its weights are used
    problem: UserError | None  # why it cannot serve the config: unreadable, not weights, another family or layout

    @property
    def text_tokens(self) -> int:
        """Its text rows - 1, which may differ from the config's number_text_tokens (vocab growth)."""
        return self.state["text_embedding.weight"].shape[0] - 1

    def official_state(self, cfg: GPTConfig) -> dict[str, Tensor]:
        """Its tensors float32, in release order (its `problem`, rows for the start/stop text tokens included,
        was None against `cfg`)."""
        return {k: self.state[k].to(torch.float32).contiguous() for k in official_shapes(cfg)}


def _fit_problem(path: Path, state: dict[str, Tensor], cfg: GPTConfig) -> UserError | None:
    """Another family, keys, shapes or too few text rows than `cfg` describes, in one line (None: it fits);
    judged as `verify` judges a checkpoint against its stored config (model_fit.py)."""
    problem = fit_problem(state, cfg, str(path), "; the expected keys come from the config's gpt: section: pass "
                          "the config.yaml that came with the checkpoint as --config")
    return UserError(problem) if problem is not None else None


def _read(path: Path, cfg: GPTConfig, loaded: object | None, merge_adapters: bool) -> BaseCheckpoint:
    """Read `path` (or take `loaded`, the loader's read of it), clean its keys, settle cfg's family from
    them when the config states none, and judge it against cfg. Raises only when it cannot be read."""
    loaded = load_checkpoint(path, mmap=True) if loaded is None else loaded
    raw = _read_state(path, merge_adapters, loaded)
    state = clean_keys(raw).state
    problem = _fit_problem(path, state, cfg)  # settles cfg's family from the keys when the config states none
    return BaseCheckpoint(path, state, family_of_keys(state), ignored_by_base_checkpoint(path, loaded), problem)


def read_base(path: Path | None, cfg: GPTConfig) -> BaseCheckpoint | None:
    """The start's one read of --base-checkpoint; settles cfg's family from its keys when the config
    states none (before anything is sized). None without one, or when the path is no file (the checks
    of the paths say so). A file that cannot be read keeps the reason as its `problem`."""
    if path is None or not Path(path).is_file():
        return None
    try:
        return _read(Path(path), cfg, None, merge_adapters=True)
    except UserError as exc:
        return BaseCheckpoint(Path(path), {}, None, None, exc)


def load_base_checkpoint(
    path: str | Path, cfg: GPTConfig, *, merge_adapters: bool = True, loaded: object | None = None
) -> tuple[dict[str, Tensor], dict[str, Tensor], int]:
    """Read an official (or community / our own) gpt.pth and check it against `cfg`: for commands that
    use one file's weights (export, evaluate).

    `loaded`: the file as `checkpoint.load_verified` / `load_checkpoint` returned it, when the
    caller has read it already (`path` then only names it in messages).

    Sets cfg.family from the checkpoint's keys when the config does not state it (and refuses a
    config whose `version:` names the other family).
    Returns (trained, carried, base_text_tokens), all float32 in release order; base_text_tokens is
    the checkpoint's text rows - 1, which may differ from cfg.number_text_tokens (vocab growth).
    """
    base = _read(Path(path), cfg, loaded, merge_adapters)
    if base.problem is not None:
        raise base.problem
    cfg.stated_family = cfg.family  # neither the config nor the keys say: IndexTTS2
    trained, carried = split_state_dict(base.official_state(cfg), cfg)
    return trained, carried, base.text_tokens
