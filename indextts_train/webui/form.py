"""The page's form, turned into train-gpt flags: what the user sees is exactly what runs.

Hyperparameter fields are fields of the config's `train:` section (the schema the CLI's flags come
from) and start at the config's values, i.e. the defaults the CLI would apply. Every field shown
becomes a flag, so the command line on the page can be pasted into a terminal or tmux unchanged.
Every value is passed as `--flag=VALUE` with its path resolved inside the page's roots (roots.py):
what the command line shows is what was checked, and no value can be read as a flag.
No module here imports Gradio.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from pathlib import Path

from indextts_train.config.settings import Config, TrainConfig, check_setting, load_config
from indextts_train.config.unread_settings import VALIDATION_SETTINGS, batch_unread
from indextts_train.errors import UserError
from indextts_train.text.vocab import read_tokenizer
from indextts_train.webui.roots import Roots
from indextts_train.webui.runs import train_command
from indextts_train.webui.trainflags import checked_value, flag_settings, other_flags

# The main knobs, in the order the page shows them; everything else goes in "other flags".
MAIN_FIELDS = (
    "epochs", "max_steps", "effective_batch_size", "batch_size", "grad_accumulation", "num_workers",
    "learning_rate", "weight_decay", "warmup_steps", "grad_clip", "text_loss_weight", "mel_loss_weight",
    "log_interval", "val_interval", "save_interval", "keep_checkpoints", "seed",
)
AMP_CHOICES = ("auto", "on", "off")
MAX_MANIFESTS = 1000  # lines a manifests box takes (see lines_of)
MAX_BOX = 256 * 1024  # characters a manifests box takes
_FIELDS = {f.name: f for f in dataclasses.fields(TrainConfig)}


@dataclass
class RunForm:
    """The Set-up panel's values, as typed."""

    train_manifests: str  # one per line; a line may carry the CLI's ::lang / @weight suffixes
    output_dir: str
    config: str
    val_manifests: str = ""
    tokenizer: str = ""
    base_checkpoint: str = ""
    hparams: dict[str, float | int | None] = field(default_factory=dict)
    amp: str = "auto"
    extra: str = ""  # any other train-gpt flags, shell-quoted


def flag_name(name: str) -> str:
    """The train-gpt flag of a train: field (the schema may name it, e.g. the community's spelling)."""
    named = _FIELDS[name].metadata.get("flag") if name in _FIELDS else None
    return named.split("/")[0] if named else "--" + name.replace("_", "-")  # "--on/--off": the first


def defaults_for(config: str) -> dict[str, float | int]:
    """The config's train: values for the main fields: what train-gpt uses when a flag is absent."""
    train = load_config(Path(config).expanduser()).train
    return {name: getattr(train, name) for name in MAIN_FIELDS}


def form_config(form: RunForm, roots: Roots) -> Config:
    """The config the form's run would use: the config file's train: section under the form's numbers,
    mixed precision and other flags, each checked against its field's range, as the run checks them; its
    text rows the tokenizer's, as the run settles them."""
    config = load_config(roots.inside(form.config, "Config"))
    if form.tokenizer.strip():
        tokenizer = read_tokenizer(roots.inside(form.tokenizer, "Tokenizer"), config.gpt, f"Config {form.config}")
        tokenizer.size_model(config.gpt)
    values = {name: _number(name, value) for name, value in form.hparams.items() if value is not None}
    if form.amp != "auto":
        values["amp"] = form.amp == "on"
    config.override({**values, **flag_settings(other_flags(form.extra, roots, OWN_FIELDS))})
    return config


def _number(name: str, value: float | int) -> float | int:
    text = number_text(name, value)
    return int(text) if "int" in str(_FIELDS[name].type) else float(text)


def lines_of(text: str, what: str = "Manifests") -> list[str]:
    """The box's non-empty lines, at most MAX_MANIFESTS in MAX_BOX characters: each is a path checked on every
    keystroke (100,000 lines took 8 s), and all go on one command line (past ~2 MiB it cannot start: E2BIG)."""
    text = text or ""
    if len(text) > MAX_BOX:
        raise UserError(f"{what}: {len(text):,} characters; give at most {MAX_BOX:,} (merge manifests into "
                        "fewer files)")
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    if len(lines) > MAX_MANIFESTS:
        raise UserError(f"{what}: {len(lines):,} lines; give at most {MAX_MANIFESTS:,} manifests (merge them into "
                        "fewer files)")
    return lines


def number_text(name: str, value: float | int) -> str:
    """A number field as its flag's value: finite, whole where the setting counts things."""
    if isinstance(value, int) and value.bit_length() > 1000:
        # A JSON integer has no size limit; past a float's range every check below raised OverflowError.
        raise UserError(f"{flag_name(name)}: a number of {value.bit_length()} bits is beyond any setting's range; "
                        "give a smaller one")
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise UserError(f"{flag_name(name)} must be a finite number, got {value!r}")
    if "int" in str(_FIELDS[name].type):
        if float(value) != int(value):
            raise UserError(f"{flag_name(name)} must be a whole number, got {value}")
        value = int(value)
    check_setting(name, value)  # the field's range, as the run would refuse it
    return str(value) if isinstance(value, int) else repr(float(value))


# Fields the form has a box for: typed again in "Other flags", one would silently win.
OWN_FIELDS = {"train_manifests", "val_manifests", "config", "tokenizer", "base_checkpoint", "output_dir", "amp",
              "resume", *MAIN_FIELDS}


def flags(form: RunForm, roots: Roots, resume: str | None = None) -> list[str]:
    """train-gpt flags for the form, each `--flag=VALUE` with its path resolved inside the roots;
    `resume` adds --resume ('auto' or a checkpoint path)."""
    manifests = lines_of(form.train_manifests, "Training manifests")
    if not manifests:
        raise UserError("Training manifests: give at least one manifest JSONL path")
    if not form.output_dir.strip():
        raise UserError("Output dir: say where the run's checkpoints and logs go")
    if not form.config.strip():
        raise UserError("Config: give a config.yaml (configs/indextts2.yaml for the real sizes)")
    out = [f"--train-manifest={roots.manifest(path, 'Training manifests')}" for path in manifests]
    out += [f"--val-manifest={roots.manifest(path, 'Validation manifests')}"
            for path in lines_of(form.val_manifests, "Validation manifests")]
    out.append(f"--config={roots.inside(form.config, 'Config')}")
    for name, label in (("tokenizer", "Tokenizer"), ("base_checkpoint", "Base checkpoint")):
        value = getattr(form, name).strip()
        if value:
            out.append(f"{flag_name(name)}={roots.inside(value, label)}")
    out.append(f"--output-dir={roots.inside(form.output_dir, 'Output dir')}")
    out += _number_flags(form)
    if form.amp not in AMP_CHOICES:
        raise UserError(f"Mixed precision: choose one of {', '.join(AMP_CHOICES)}, got {form.amp!r}")
    out += {"on": ["--amp"], "off": ["--no-amp"], "auto": []}[form.amp]
    out += other_flags(form.extra, roots, OWN_FIELDS)
    if resume:
        out.append(f"--resume={checked_value('--resume', resume, roots, 'Resume from')}")
    return out


def _number_flags(form: RunForm) -> list[str]:
    """The main fields' flags. Without validation manifests the validation fields are left out (the run
    refuses them typed, as they would change nothing); a batch the run would not train with is refused
    here, as the run refuses it (one process: the page starts no torchrun)."""
    validates = bool(lines_of(form.val_manifests))
    given = {name: form.hparams.get(name) for name in MAIN_FIELDS if form.hparams.get(name) is not None
             and (validates or name not in VALIDATION_SETTINGS)}
    texts = {name: number_text(name, value) for name, value in given.items()}
    batch = {name: int(texts[name]) for name in ("batch_size", "grad_accumulation", "effective_batch_size")
             if name in texts}
    problem = batch_unread(TrainConfig(**batch), frozenset(batch), world_size=1)
    if problem is not None:
        raise UserError(problem)
    return [f"{flag_name(name)}={text}" for name, text in texts.items()]


def command(form: RunForm, roots: Roots, resume: str | None = None) -> list[str]:
    """The whole argv the page runs."""
    return train_command(flags(form, roots, resume))
