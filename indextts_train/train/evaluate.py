"""Losses of a model on a manifest: used for validation in the loop and by `indextts-train evaluate`."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path

import torch

from indextts_train.checkpoint.base import load_base_checkpoint
from indextts_train.checkpoint.files import config_for, load_checkpoint
from indextts_train.config.run_inputs import config_beside
from indextts_train.config.settings import DEFAULT_CONFIG, Config
from indextts_train.data.manifest import (
    ManifestDataset,
    ManifestIndex,
    make_loader,
    refuse_given_twice,
    sequential_batches,
)
from indextts_train.distributed import DistInfo, sum_across_ranks
from indextts_train.model.gpt import Batch, UnifiedVoiceGPT
from indextts_train.model.lora import attach_lora, load_adapters, record_spec

SUM_NAMES = ("text_ce", "text_count", "mel_ce", "mel_count", "mel_correct", "samples")


@torch.no_grad()
def loss_sums(model: UnifiedVoiceGPT, loader: Iterable[Batch], device: torch.device,
              autocast: Callable | None = None) -> list[float]:
    """[text_ce, text_count, mel_ce, mel_count, mel_correct, samples] summed over `loader` (eval mode).

    Sums, not means, so losses of several groups can be added up into a total (validation.py).
    """
    was_training = model.training
    model.eval()
    # Summed on the device in float64 (the same additions as Python floats) and read once at the end:
    # a read per batch would wait for the GPU at every batch.
    sums = torch.zeros(len(SUM_NAMES) - 1, dtype=torch.float64, device=device)
    samples = 0
    for batch in loader:
        with autocast() if autocast else contextlib.nullcontext():
            out = model.compute_losses(batch.to(device))
        sums += torch.stack([out.text_ce_sum.double(), out.text_count.double(), out.mel_ce_sum.double(),
                             out.mel_count.double(), out.mel_correct.double()])
        samples += len(batch)
    model.train(was_training)
    return [*sums.tolist(), float(samples)]


def losses_from_sums(sums: Sequence[float], config: Config) -> dict:
    """Token-weighted losses: CE summed over counted tokens, then divided.

    The community trainer averages per-batch losses weighted by batch size, so its number moves
    with the batch size; summing token CE first does not.
    """
    text_ce, text_n, mel_ce, mel_n, mel_ok, samples = sums
    text_loss = text_ce / max(text_n, 1.0)
    mel_loss = mel_ce / max(mel_n, 1.0)
    return {"text_loss": text_loss, "mel_loss": mel_loss, "mel_top1": mel_ok / max(mel_n, 1.0),
            "loss": config.train.loss(text_loss, mel_loss),
            "samples": int(samples)}


def evaluate(model: UnifiedVoiceGPT, loader: Iterable[Batch], config: Config, device: torch.device,
             dist_info: DistInfo | None = None, autocast: Callable | None = None) -> dict:
    """Token-weighted losses over a whole manifest (summed over ranks under DDP)."""
    sums = loss_sums(model, loader, device, autocast)
    if dist_info is not None and dist_info.enabled:
        sums = sum_across_ranks(sums, dist_info, device)
    return losses_from_sums(sums, config)


def evaluate_checkpoint(checkpoint: Path, manifests: Sequence[Path], config_path: Path | None = None, *,
                        batch_size: int = 8, loaded: dict | None = None) -> dict:
    """Evaluate any checkpoint (ours, community, gpt.pth) on manifests, batches in manifest order.

    Without `config_path`, the config stored in the checkpoint (ours), else the official config.yaml beside a
    bare gpt.pth (the one train-gpt takes for it as --base-checkpoint), else configs/indextts2.yaml.
    The file is read once: `loaded` when the caller has read it already (the CLI's load_verified).
    """
    refuse_given_twice(manifests, "--manifest")
    if loaded is None:
        loaded = load_checkpoint(checkpoint, mmap=True)  # tensor data stays on disk until the model copies it
    fallback = config_beside(checkpoint)[0] or DEFAULT_CONFIG  # a model folder's gpt.pth is sized by its config
    config = config_for(checkpoint, config_path, fallback=fallback, loaded=loaded)
    # A --train-scope lora checkpoint runs as it trained: the frozen base with the adapters hooked in.
    record = loaded.get("lora")
    trained, _carried, tokens = load_base_checkpoint(checkpoint, config.gpt, merge_adapters=False, loaded=loaded)
    config.gpt.number_text_tokens = tokens  # the checkpoint's rows decide, minus the extra row
    model = UnifiedVoiceGPT(config.gpt, dropout=0.0)
    model.load_state_dict(trained, strict=True)
    if isinstance(record, dict):
        load_adapters(attach_lora(model, record_spec(record), None), record, str(checkpoint))
    index = ManifestIndex.build(manifests, max_text_tokens=config.gpt.max_text_tokens,
                                max_mel_tokens=config.gpt.max_mel_tokens, family=config.gpt.family)
    dataset = ManifestDataset(index, model_dim=config.gpt.model_dim, text_vocab=tokens,
                              mel_codes=config.gpt.number_mel_codes,
                              text_source=(f"the {tokens} text tokens of {checkpoint}", "evaluate a checkpoint "
                                           "trained with the tokenizer the data was made with"),
                              mel_specials=(config.gpt.start_mel_token, config.gpt.stop_mel_token))
    loader = make_loader(dataset, sequential_batches(range(len(index)), batch_size), num_workers=0)
    result = evaluate(model, loader, config, torch.device("cpu"))
    result.update(checkpoint=str(checkpoint), text_tokens=tokens, batch_size=batch_size)
    return result

