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
from indextts_train.config.family import Family
from indextts_train.config.settings import load_config
from indextts_train.errors import UserError
from indextts_train.files.bounded import load_yaml

MARKER = ".indextts-train-listen-folder"

# What the official inference reads from the model folder's config.yaml besides `gpt:` (tiny_folder.py writes
# the same for its stand-ins): keys, and the files in the folder that some of them name; IndexTTS2's loader
# also its emotion model folder and vocoder (Family.hub_parts). Checked before any work: a folder holding a
# config.yaml and a gpt.pth alone (a download cut short, a stand-in) would fail only once a checkpoint loads.
INFERENCE_KEYS = ("s2mel", "semantic_codec", "w2v_stat", "s2mel_checkpoint", "emo_matrix", "spk_matrix", "emo_num")
INFERENCE_FILES = ("w2v_stat", "s2mel_checkpoint", "emo_matrix", "spk_matrix")
HUB_KEYS = ("qwen_emo_path", "vocoder")


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


def inference_gaps(model_dir: Path, family: Family) -> list[str]:
    """What the official inference of `family` would miss in `model_dir`: keys of config.yaml, files it names."""
    raw = load_yaml(model_dir / "config.yaml", "config")
    keys = [key for key in (*INFERENCE_KEYS, *(HUB_KEYS if family.hub_parts else ())) if key not in raw]
    gaps = [f"config.yaml has no {', '.join(keys)}"] if keys else []
    named = [(key, str(raw[key])) for key in INFERENCE_FILES if isinstance(raw.get(key), str)]
    gaps += [f"no {name} (its {key})" for key, name in named if not (model_dir / name).is_file()]
    qwen = raw.get("qwen_emo_path") if family.hub_parts else None
    if isinstance(qwen, str) and not (model_dir / qwen).is_dir():
        gaps.append(f"no {qwen} (its qwen_emo_path)")
    return gaps


def check_inference_folder(model_dir: Path, family: Family) -> None:
    """One line, before any work, when `model_dir` lacks what the official inference loads."""
    gaps = inference_gaps(model_dir, family)
    if gaps:
        more = f" (+{len(gaps) - 4} more)" if len(gaps) > 4 else ""
        raise UserError(f"model folder {model_dir}: not a whole {family.name} release for the official inference: "
                        f"{'; '.join(gaps[:4])}{more}; pass --model-dir with the release's model folder "
                        "(checkpoints/) as downloaded")


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
