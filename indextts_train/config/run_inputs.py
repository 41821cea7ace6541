"""The run's inputs besides the `train:` settings (paths, resume, modes: `TrainOptions`, what train-gpt takes
as flags and the page as fields), and which config file they imply when --config is not given: the official
config.yaml beside --base-checkpoint, else the bundled full-size one (`config_choice`).

The `train:` settings and the model's `gpt:` section are config/settings.py's; ui/run_settings.py resolves
both into the one RunSettings a start uses.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from indextts_train.config.settings import DEFAULT_CONFIG, config_path
from indextts_train.errors import UserError
from indextts_train.files.bounded import load_yaml


def run_option(default: Any = dataclasses.MISSING, help: str = "", *, flag: str | None = None,
               factory: Any = dataclasses.MISSING, choices: tuple[str, ...] | None = None,
               cli: bool = True) -> Any:
    """A `train-gpt` input that is not a `train:` setting (paths, resume, modes)."""
    return field(default=default, default_factory=factory,
                 metadata={"help": help, "flag": flag, "choices": choices, "cli": cli})


@dataclass(frozen=True)
class TrainOptions:
    """The inputs `train-gpt` accepts besides the `train:` settings (TrainConfig), as given; the start
    resolves both into one RunSettings (ui/run_settings.py)."""

    train_manifests: list[str] = run_option(help="Training manifest JSONL; repeat to mix datasets: "
                                                 "PATH[::lang][@weight], the weight a share of each epoch "
                                                 "(@0.15 = 15%).", flag="--train-manifest")
    output_dir: Path = run_option(help="Where checkpoints (model_step{N}.pth, latest.pth) and logs/ go.")
    config: Path | None = run_option(None, "IndexTTS2 / IndexTTS-2.5 config.yaml (its gpt: section) or "
                                           "configs/*.yaml. Omitted: the config.yaml beside --base-checkpoint when "
                                           "that folder is an official model folder, else configs/indextts2.yaml.")
    val_manifests: list[str] = run_option(help="Validation manifest JSONL; repeatable. PATH::lang: losses "
                                               "per language.", factory=list,
                                          flag="--val-manifest")
    tokenizer: Path | None = run_option(None, "SentencePiece .model (IndexTTS2) or .tiktoken (IndexTTS-2.5); its size "
                                              "sets the text vocabulary. Omit when number_text_tokens is right.")
    base_checkpoint: Path | None = run_option(None, "IndexTTS2 / IndexTTS-2.5 gpt.pth to fine-tune from (rows grown to "
                                                    "the tokenizer). Omit for random init.")
    resume: str | None = run_option(None, "'auto': newest checkpoint in --output-dir that verifies (fresh start "
                                          "if none); or a checkpoint path. Omit for a new run.")
    on_vocab_change: str = run_option("keep", "When the tokenizer grew since the checkpoint: 'keep' optimizer state "
                                              "(remapped rows) or 'reset' optimizer+scheduler+scaler to step 0.",
                                      choices=("keep", "reset"))
    skip_bad_lines: bool = run_option(False, "Skip bad manifest lines (counted) instead of stopping at the first, "
                                             "and samples that fail to load mid-run (listed at the end).")
    accept_data_change: bool = run_option(False, "Resume although the training data changed since the checkpoint "
                                                 "(continues at the same sample position in the new data's order).")
    from_run: Path | None = run_option(None, "Rerun a recorded run: OUTPUT_DIR/run.yaml of an earlier start gives "
                                             "every option and train: setting; flags given beside it win. Omit to take "
                                             "everything from the flags.")
    tensorboard: bool = run_option(True, "Write TensorBoard logs.", cli=False)

    def __post_init__(self) -> None:
        if self.on_vocab_change not in ("keep", "reset"):
            raise UserError(f"--on-vocab-change {self.on_vocab_change!r}: choose keep or reset")


def config_choice(config: Path | None, base_checkpoint: Path | None) -> tuple[Path, str | None]:
    """--config, else the official config.yaml beside --base-checkpoint, else ours; and the line that
    says which was taken when the user did not choose."""
    if config is not None:
        return config_path(config), None
    beside, why_not = config_beside(base_checkpoint)
    if beside is not None:
        return beside, f"--config not given: using {beside}, the config.yaml of --base-checkpoint's model folder"
    if base_checkpoint is None or Path(base_checkpoint).is_dir():  # a folder is refused as one, without this line
        return DEFAULT_CONFIG, None
    return DEFAULT_CONFIG, (f"--config not given: using {DEFAULT_CONFIG} (the full-size IndexTTS2){why_not}; "
                            "pass --config for another size")


OFFICIAL_CONFIG_BYTES = 1024 * 1024  # the official config.yaml is about 2 KiB


def config_beside(checkpoint: Path | None) -> tuple[Path | None, str]:
    """The config.yaml in the same folder as `checkpoint` when the folder has the official layout (a gpt:
    section, `gpt_checkpoint` naming this very file); else None and, when one is there, why it was not
    taken (a clause for the line that says which config the run uses)."""
    candidate = Path(checkpoint).parent / "config.yaml" if checkpoint is not None else None
    try:
        if candidate is None or not candidate.is_file():
            return None, ""
        if candidate.stat().st_size > OFFICIAL_CONFIG_BYTES:
            return None, f", not {candidate}: larger than an official config.yaml"
        data = load_yaml(candidate, "config")
    except (OSError, UserError):
        return None, f", not {candidate}: not readable as a YAML config"
    if not isinstance(data, dict) or not isinstance(data.get("gpt"), dict):
        return None, f", not {candidate}: it has no gpt: section"
    if str(data.get("gpt_checkpoint", "")) != Path(checkpoint).name:
        return None, (f", not {candidate}: its gpt_checkpoint is not {Path(checkpoint).name!r}, so it is not "
                      "taken as that checkpoint's official config")
    return candidate, ""
