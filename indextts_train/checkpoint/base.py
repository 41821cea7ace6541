"""Reading a base `gpt.pth` (official, community or our own checkpoint) into the model's two parts.

It reads through the checkpoint loader (no pickled code, CRC-checked when ours) and checks the keys
against the official layout of the config's family (model/layout.py).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import torch
from torch import Tensor

from indextts_train.checkpoint.files import load_checkpoint
from indextts_train.config.settings import GPTConfig
from indextts_train.errors import UserError
from indextts_train.model.layout import (
    clean_keys,
    layout_problems,
    official_shapes,
    preview_names,
    resolve_family,
    split_state_dict,
)
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


def read_base(path: Path | None) -> object | None:
    """The base checkpoint read once for a whole start (mmap: tensor data stays on disk until used; one
    CRC pass): its family, its layout check and its weights all come from this. None when there is no
    file to read, or it cannot be read: the checks before training then name the problem."""
    if path is None or not Path(path).is_file():
        return None
    try:
        return load_checkpoint(Path(path), mmap=True)
    except UserError:
        return None


def settle_family(cfg: GPTConfig, loaded: object | None, path: Path | None) -> None:
    """cfg.family from the base checkpoint's keys when the config does not state it (before anything is sized)."""
    if cfg.stated_family is not None or not isinstance(loaded, Mapping):
        return
    weights = loaded["model"] if isinstance(loaded.get("model"), Mapping) else loaded
    resolve_family(cfg, weights, path)


def check_base_layout(path: Path, cfg: GPTConfig, *, merge_adapters: bool = True,
                      loaded: object | None = None) -> dict[str, Tensor]:
    """The checkpoint's weights under official names, refused in one line when their keys and shapes
    are not the ones `cfg` describes (also sets cfg.family from the keys when the config does not say)."""
    raw = _read_state(path, merge_adapters, loaded)
    state = clean_keys(raw).state
    resolve_family(cfg, state, path)
    problems = layout_problems(state, cfg)
    if problems:
        raise UserError(
            f"{path}: does not match the {cfg.family.name} GPT layout of the config (model_dim "
            f"{cfg.model_dim}, layers {cfg.layers}): {'; '.join(problems)}; the expected keys come from the config's "
            "gpt: section: pass the config.yaml that came with the checkpoint as --config"
        )
    return state


def load_base_checkpoint(
    path: str | Path, cfg: GPTConfig, *, merge_adapters: bool = True, loaded: object | None = None
) -> tuple[dict[str, Tensor], dict[str, Tensor], int]:
    """Read an official (or community / our own) gpt.pth and check it against `cfg`.

    `loaded`: the file as `checkpoint.load_verified` / `load_checkpoint` returned it, when the
    caller has read it already (`path` then only names it in messages).

    Sets cfg.family from the checkpoint's keys when the config does not state it (and refuses a
    config whose `version:` names the other family).
    Returns (trained, carried, base_text_tokens), all float32 in release order; base_text_tokens is
    the checkpoint's text rows - 1, which may differ from cfg.number_text_tokens (vocab growth).
    """
    path = Path(path)
    state = check_base_layout(path, cfg, merge_adapters=merge_adapters, loaded=loaded)
    cfg.stated_family = cfg.family  # neither the config nor the keys say: IndexTTS2
    ordered = {k: state[k].to(torch.float32).contiguous() for k in official_shapes(cfg)}
    base_text_tokens = ordered["text_embedding.weight"].shape[0] - 1
    if base_text_tokens <= max(cfg.start_text_token, cfg.stop_text_token):
        raise UserError(f"{path}: text_embedding.weight has only {base_text_tokens + 1} rows; "
                        "it cannot hold the start/stop text tokens")
    trained, carried = split_state_dict(ordered, cfg)
    return trained, carried, base_text_tokens
