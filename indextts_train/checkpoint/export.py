"""`indextts-train export`: the gpt.pth IndexTTS2 / IndexTTS-2.5 inference loads, plus a matching config.yaml.

IndexTTS2's release loader calls `load_state_dict(strict=True)` on `UnifiedVoice(**cfg.gpt)`, so the
file must hold exactly the official keys in their shapes, and the shipped config must say
`number_text_tokens = text rows - 1` or the extended rows do not fit. IndexTTS-2.5's loader is not
strict: a misnamed tensor would load silently as random weights, so the file holds exactly the 2.5
key set of `layout.official_shapes`. Stock 2.5 inference reads its vocabulary from
`<model_dir>/multilingual_zh_ja_yue_char_del.tiktoken`, so a grown `.tiktoken` is written beside the
export under that name. A --train-scope lora checkpoint is exported with its adapters merged into
the plain weights (layout.load_base_checkpoint); `adapters_out` also writes the adapters alone, with
what they apply to.
"""

from __future__ import annotations

import os
from pathlib import Path

import torch
import yaml

from indextts_train.checkpoint.files import BEST, LATEST, config_for, load_verified
from indextts_train.config.settings import Config, config_from_dict, gpt_to_dict, version_of_family
from indextts_train.data.manifest_v25 import borrow_notes
from indextts_train.errors import UserError
from indextts_train.files.atomic import atomic_write, atomic_write_bytes, atomic_write_text
from indextts_train.model.layout import load_base_checkpoint, official_shapes, trained_keys
from indextts_train.model.lora import adapter_file, record_spec
from indextts_train.model.scope import is_trainable, scope_settings, text_rows_trainable
from indextts_train.text.tiktoken_vocab import TiktokenVocab, is_tiktoken, read_tiktoken
from indextts_train.text.vocab import VocabPlan

DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}
TIKTOKEN_NAME = "multilingual_zh_ja_yue_char_del.tiktoken"  # the name stock 2.5 inference opens


def export_source(checkpoint: Path, pick: str | None) -> Path:
    """The file to export: `checkpoint` itself, or in a run folder best.pth or latest.pth (`pick`).

    A folder without `pick` gives best.pth, or latest.pth when the run had no validation (no best.pth).
    """
    if not checkpoint.is_dir():
        if pick is not None:
            raise UserError(f"--pick {pick} chooses best.pth or latest.pth inside a run folder, but {checkpoint} "
                            "is a file; drop --pick, or pass the run's --output-dir")
        return checkpoint
    names = {"best": [BEST], "latest": [LATEST], None: [BEST, LATEST]}[pick]
    found = next((checkpoint / name for name in names if (checkpoint / name).is_file()), None)
    if found is None:
        raise UserError(f"{checkpoint}: no {' or '.join(names)} in this folder; pass a checkpoint file "
                        "(`indextts-train checkpoints DIR` lists them)")
    return found


def provenance(state: dict) -> str:
    """'step N, val loss X' for one of our checkpoints (`state`: what load_verified read), '' for other files."""
    progress, history = state.get("progress"), state.get("history")
    if not isinstance(progress, dict) or not isinstance(progress.get("step"), int):
        return ""
    step = progress["step"]
    rows = history.get("val", []) if isinstance(history, dict) else []
    loss = next((row[1] for row in reversed(rows) if row and row[0] == step), None)
    return f"step {step}" + (f", val loss {loss:.4f}" if loss is not None else "")


def export_checkpoint(checkpoint: Path, output: Path, *, config_out: Path | None = None,
                      base_config: Path | None = None, tokenizer_name: str = "bpe.model",
                      dtype: str = "float32", tokenizer: Path | None = None,
                      adapters_out: Path | None = None) -> dict:
    """Write `output` (official key order, dtype asked for) and optionally `config_out`, `adapters_out`.

    `tokenizer`, a .tiktoken file, is checked against the exported text rows and copied beside
    `output` as TIKTOKEN_NAME (IndexTTS-2.5). Notes (borrowed language rows) go into the summary and
    as comments into `config_out`.
    """
    if dtype not in DTYPES:
        raise UserError(f"--dtype {dtype}: choose one of {', '.join(DTYPES)}")
    vocab_copy = output.parent / TIKTOKEN_NAME if tokenizer is not None and is_tiktoken(tokenizer) else None
    _check_targets(checkpoint, base_config, output, config_out, vocab_copy)
    if adapters_out is not None:
        _check_targets(checkpoint, base_config, adapters_out, None)
        if adapters_out.resolve() in {p.resolve() for p in (output, config_out, vocab_copy) if p is not None}:
            raise UserError(f"{adapters_out}: --adapters-out must be its own file, not -o or --config-out")
    # The one read of the checkpoint (several GB): missing/damaged/unsafe/unusable files are refused in
    # the checkpoint module's own words, and everything below uses what it read.
    loaded = load_verified(checkpoint)
    if adapters_out is not None:
        payload = _adapter_payload(checkpoint, loaded)  # refused before anything is written
    config = config_for(checkpoint, base_config, loaded=loaded)
    trained, carried, tokens = load_base_checkpoint(checkpoint, config.gpt, loaded=loaded)
    config.gpt.number_text_tokens = tokens
    vocab = _checked_vocabulary(tokenizer, tokens, config) if vocab_copy is not None else None
    hparams = loaded.get("hparams") if isinstance(loaded.get("hparams"), dict) else {}  # borrowed language rows
    notes = borrow_notes(hparams.get("borrow_languages"))
    merged = {**carried, **trained}
    state = {key: merged[key].to(DTYPES[dtype]) if merged[key].is_floating_point() else merged[key]
             for key in official_shapes(config.gpt)}
    output.parent.mkdir(parents=True, exist_ok=True)
    try:
        atomic_write(output, lambda handle: torch.save(state, handle))
        if vocab is not None and not (vocab_copy.exists() and os.path.samefile(vocab_copy, tokenizer)):
            atomic_write_bytes(vocab_copy, vocab.raw)
    except OSError as exc:
        raise UserError(f"could not write {output}: {exc.strerror or exc}") from None
    if config_out is not None:
        _write_config(config, config_out, base_config, output.name, tokenizer_name, notes)
    if adapters_out is not None:
        try:
            atomic_write(adapters_out, lambda handle: torch.save(payload, handle))
        except OSError as exc:
            raise UserError(f"could not write {adapters_out}: {exc.strerror or exc}") from None
    return {"tensors": len(state), "text_rows": tokens + 1, "dtype": dtype, "family": config.gpt.family_name,
            "numel": sum(t.numel() for t in state.values()), "tokenizer": vocab_copy, "notes": notes,
            "provenance": provenance(loaded)}


def _adapter_payload(checkpoint: Path, loaded: object) -> dict:
    """The adapters-only file of a --train-scope lora checkpoint: adapters, the other tensors the run
    trained (heads, text rows) and the fingerprint of the base weights they apply to."""
    record = loaded.get("lora") if isinstance(loaded, dict) else None
    if not isinstance(record, dict):
        raise UserError(f"{checkpoint}: has no LoRA adapters (not a --train-scope lora checkpoint); "
                        "drop --adapters-out")
    config = config_from_dict(loaded["config"], f"{checkpoint} (stored config)")
    plan = VocabPlan.from_dict(loaded["vocab_plan"])
    rows = text_rows_trainable(bool(plan.new_ids), plan.freeze_base)
    settings = scope_settings(config.train)
    model = loaded["model"]
    tensors = {k: model[k] for k in trained_keys(config.gpt) if is_trainable(k, settings, config.gpt.layers, rows)}
    applies_to = {"family": config.gpt.family, "model_dim": config.gpt.model_dim, "layers": config.gpt.layers,
                  "text_rows": plan.rows, "base_text_rows": plan.base_tokens + 1, "checkpoint": checkpoint.name}
    return adapter_file(record["adapters"], record_spec(record), model, tensors, applies_to)


def _checked_vocabulary(tokenizer: Path, tokens: int, config: Config) -> TiktokenVocab:
    """The .tiktoken to ship: it must be of a 2.5 model and give exactly the exported text rows - 1."""
    if not config.gpt.is_v25:
        raise UserError(f"--tokenizer {tokenizer}: a .tiktoken vocabulary is IndexTTS-2.5's, but the checkpoint is "
                        f"{config.gpt.family_name}; pass its SentencePiece model name with --tokenizer-name")
    vocab = read_tiktoken(tokenizer)
    if vocab.n_vocab != tokens:
        raise UserError(f"--tokenizer {tokenizer}: {vocab.n_ranks} ranks + specials = {vocab.n_vocab} tokens, but the "
                        f"checkpoint has {tokens} (number_text_tokens); pass the .tiktoken it was trained with")
    return vocab


def _check_targets(checkpoint: Path, base_config: Path | None, output: Path, config_out: Path | None,
                   vocab_copy: Path | None = None) -> None:
    """Refuse outputs that are an input, or each other.

    samefile, not path equality: a run's model_step{N}.pth is a hard link of latest.pth, and
    replacing it would silently drop a training checkpoint.
    """
    inputs = [path for path in (checkpoint, base_config) if path is not None and path.exists()]
    for target in (output, config_out, vocab_copy):
        if target is not None and target.exists() and any(os.path.samefile(target, p) for p in inputs):
            raise UserError(f"{target}: refusing to overwrite an input file; choose another output path")
    if config_out is not None and config_out.resolve() == output.resolve():
        raise UserError(f"{config_out}: --config-out and -o are the same file; give the config its own path")


def _write_config(config: Config, config_out: Path, base_config: Path | None, gpt_name: str,
                  tokenizer_name: str, notes: list[str]) -> None:
    """Keep every section of the user's config; replace only what the fine-tune changed."""
    data = yaml.safe_load(base_config.read_text(encoding="utf-8")) if base_config else {}
    data.pop("train", None)
    data["version"] = version_of_family(config.gpt.family)
    data["gpt"] = gpt_to_dict(config.gpt)
    data["gpt_checkpoint"] = gpt_name
    if not config.gpt.is_v25:  # 2.5 reads its vocabulary from the fixed TIKTOKEN_NAME, not from here
        data.setdefault("dataset", {})
        data["dataset"]["bpe_model"] = tokenizer_name
    config_out.parent.mkdir(parents=True, exist_ok=True)
    header = "".join(f"# indextts-train: {note}\n" for note in notes)  # YAML comments: loaders ignore them
    atomic_write_text(config_out, header + yaml.safe_dump(data, sort_keys=False, allow_unicode=True))
