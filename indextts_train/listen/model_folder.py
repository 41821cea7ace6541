"""The official model folder a checkpoint is heard through: the user's model folder with the three files a
fine-tune changes (gpt.pth, config.yaml, the tokenizer) replaced by the checkpoint's export.

Everything else (s2mel.pth, codec.pth, feat1/feat2, hf_cache/, the emotion model, several GB) is linked,
not copied. The folder is ours alone: it carries a marker file, and only a folder with that marker is
ever removed (a rerun starts it afresh, since a killed run may have left it half made).
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from indextts_train.checkpoint.export import export_checkpoint
from indextts_train.config.settings import load_config
from indextts_train.errors import UserError
from indextts_train.files.bounded import load_yaml

MARKER = ".indextts-train-listen-folder"


def replaced_names(model_dir: Path) -> tuple[str, str, str]:
    """(gpt file, config file, tokenizer file) of the model folder: what the export writes instead."""
    config_path = model_dir / "config.yaml"
    raw = load_yaml(config_path, "config")
    family = load_config(config_path).gpt.family
    dataset = raw.get("dataset") if isinstance(raw.get("dataset"), dict) else {}
    tokenizer = family.tokenizer_name if family.tokenizer_name_fixed else \
        str(dataset.get("bpe_model") or family.tokenizer_name)
    return str(raw.get("gpt_checkpoint") or "gpt.pth"), "config.yaml", tokenizer


def _clear(folder: Path) -> None:
    if not folder.exists() and not folder.is_symlink():
        return
    if folder.is_symlink() or not (folder / MARKER).is_file():  # a link is never ours, whatever it points at
        raise UserError(f"{folder} exists and was not made by indextts-train listen; move it away or choose "
                        "another run folder")
    shutil.rmtree(folder)  # links are removed, never followed


def _check_model_dir(model_dir: Path) -> None:
    if not (model_dir / "config.yaml").is_file():
        raise UserError(f"--model-dir {model_dir}: no config.yaml; pass the official IndexTTS model folder "
                        "(checkpoints/) the run was trained from")


def make_model_folder(checkpoint: Path, model_dir: Path, folder: Path, *, tokenizer: Path | None) -> Path:
    """Make `folder`: links to every entry of `model_dir` but the three replaced files, plus the export of
    `checkpoint` (LoRA merged, grown vocabulary, `tokenizer` the run's) under the official names.
    Returns `folder`. An old folder of ours there is removed first."""
    _check_model_dir(model_dir)
    gpt_name, config_name, tokenizer_name = replaced_names(model_dir)
    _clear(folder)
    folder.mkdir(parents=True)
    (folder / MARKER).write_text("made by indextts-train listen; removed and remade on every use\n",
                                 encoding="utf-8")
    skip = {gpt_name, config_name, tokenizer_name, MARKER}
    for entry in sorted(model_dir.iterdir()):
        if entry.name not in skip:
            os.symlink(entry.resolve(), folder / entry.name, target_is_directory=entry.is_dir())
    if tokenizer is None and (model_dir / tokenizer_name).is_file():
        tokenizer = model_dir / tokenizer_name  # the base vocabulary, when the run did not grow it
    export_checkpoint(checkpoint, folder / gpt_name, config_out=folder / config_name,
                      base_config=model_dir / config_name, tokenizer_name=tokenizer_name, tokenizer=tokenizer)
    return folder
