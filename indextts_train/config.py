"""YAML <-> dataclasses.

The YAML format is IndexTTS2's own `checkpoints/config.yaml`: we read its `gpt:` section and ignore
the other sections (dataset, s2mel, vocoder, ...), so users can pass the file they already have.
Our own optional `train:` section holds training defaults; CLI flags override it. Unknown keys in
`gpt:` or `train:` are rejected with the key's name, because a typo silently ignored costs GPU hours.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from indextts_train.errors import UserError


@dataclass
class ConditionModuleConfig:
    """Conformer + perceiver that make the 32 conditioning latents (not trained here; carried)."""

    output_size: int = 512
    linear_units: int = 2048
    attention_heads: int = 8
    num_blocks: int = 6
    input_layer: str = "conv2d2"
    perceiver_mult: float = 2  # may be a float: the reference uses int(dim * mult * 2 / 3)


@dataclass
class GPTConfig:
    """The `gpt:` section of IndexTTS2's config.yaml; defaults are the real IndexTTS2 sizes."""

    model_dim: int = 1280
    max_mel_tokens: int = 1815
    max_text_tokens: int = 600
    heads: int = 20
    use_mel_codes_as_input: bool = True
    mel_length_compression: int = 1024
    layers: int = 24
    number_text_tokens: int = 12000
    number_mel_codes: int = 8194
    start_mel_token: int = 8192
    stop_mel_token: int = 8193
    start_text_token: int = 0
    stop_text_token: int = 1
    train_solo_embeddings: bool = False
    condition_type: str = "conformer_perceiver"
    condition_module: ConditionModuleConfig = field(default_factory=ConditionModuleConfig)
    emo_condition_module: ConditionModuleConfig = field(
        default_factory=lambda: ConditionModuleConfig(
            output_size=512, linear_units=1024, attention_heads=4, num_blocks=4
        )
    )

    def __post_init__(self) -> None:
        if self.model_dim % self.heads:
            raise UserError(f"gpt.model_dim {self.model_dim} is not divisible by gpt.heads {self.heads}")
        if self.condition_type != "conformer_perceiver":
            raise UserError(
                f"gpt.condition_type {self.condition_type!r} is not supported; "
                "IndexTTS2 uses 'conformer_perceiver'"
            )
        if not (0 <= self.start_mel_token < self.number_mel_codes and 0 <= self.stop_mel_token < self.number_mel_codes):
            raise UserError("gpt.start_mel_token/stop_mel_token must be < gpt.number_mel_codes")

    @property
    def text_rows(self) -> int:
        """Rows of text_embedding/text_head: the tokenizer size plus the official extra row."""
        return self.number_text_tokens + 1


@dataclass
class TrainConfig:
    """Our own `train:` section: defaults for the loop. 0 means "auto" where the CLI says so."""

    batch_size: int = 0  # micro-batch per device; 0 = auto (hardware.py)
    grad_accumulation: int = 0  # 0 = auto: reach effective_batch_size
    effective_batch_size: int = 64  # samples per optimizer step, the same on every GPU
    num_workers: int = 0  # 0 = auto from the CPU count
    learning_rate: float = 2e-5
    weight_decay: float = 0.01
    adam_betas: tuple[float, float] = (0.9, 0.999)
    adam_eps: float = 1e-8
    warmup_steps: int = 1000
    min_lr_ratio: float = 0.0  # cosine decays to learning_rate * min_lr_ratio
    epochs: int = 10
    max_steps: int = 0  # 0 = run the full --epochs; otherwise stop at this optimizer step
    grad_clip: float = 1.0
    text_loss_weight: float = 0.2
    mel_loss_weight: float = 0.8
    dropout: float = 0.1  # GPT-2 resid/embd/attn dropout, as the official trunk
    activation_checkpointing: bool = False
    freeze_base_vocab: bool = True
    log_interval: int = 10
    val_interval: int = 500
    save_interval: int = 1000
    keep_checkpoints: int = 3
    seed: int = 1234
    sort_window: int = 512  # samples sorted by length together, so batches pad little

    def __post_init__(self) -> None:
        self.adam_betas = tuple(self.adam_betas)  # YAML gives a list
        for name in ("learning_rate", "effective_batch_size", "keep_checkpoints", "sort_window"):
            if getattr(self, name) <= 0:
                raise UserError(f"train.{name} must be > 0, got {getattr(self, name)}")
        for name in ("batch_size", "grad_accumulation", "num_workers", "warmup_steps", "max_steps",
                     "weight_decay", "epochs"):
            if getattr(self, name) < 0:
                raise UserError(f"train.{name} must be >= 0, got {getattr(self, name)}")
        if not 0.0 <= self.dropout < 1.0:
            raise UserError(f"train.dropout must be in [0, 1), got {self.dropout}")


@dataclass
class Config:
    gpt: GPTConfig = field(default_factory=GPTConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    source: str = ""  # the file it came from, for messages


def _build(cls: type, data: Any, where: str) -> Any:
    """Build dataclass `cls` from a mapping, rejecting unknown keys by name."""
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise UserError(f"{where}: expected a mapping, got {type(data).__name__}")
    fields = {f.name: f for f in dataclasses.fields(cls)}
    unknown = sorted(set(data) - set(fields))
    if unknown:
        raise UserError(f"{where}: unknown key(s) {', '.join(unknown)}; known keys: {', '.join(fields)}")
    kwargs = {}
    for name, value in data.items():
        if name in ("condition_module", "emo_condition_module"):
            value = _build(ConditionModuleConfig, value, f"{where}.{name}")
        kwargs[name] = value
    try:
        return cls(**kwargs)
    except UserError as exc:
        raise UserError(f"{where}: {exc}") from None
    except (TypeError, ValueError) as exc:
        raise UserError(f"{where}: {exc}") from None


def config_from_dict(data: dict, source: str = "<dict>") -> Config:
    if "gpt" not in data:
        raise UserError(f"{source}: no 'gpt:' section; pass IndexTTS2's checkpoints/config.yaml or configs/*.yaml")
    gpt = _build(GPTConfig, data["gpt"], f"{source}: gpt")
    train = _build(TrainConfig, data.get("train"), f"{source}: train")
    return Config(gpt=gpt, train=train, source=source)


def load_config(path: str | Path) -> Config:
    path = Path(path)
    if not path.is_file():
        raise UserError(f"{path}: config file not found; pass --config configs/indextts2.yaml or your config.yaml")
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        line = f" line {mark.line + 1}" if mark else ""
        raise UserError(f"{path}{line}: not valid YAML ({getattr(exc, 'problem', exc)})") from None
    if not isinstance(data, dict):
        raise UserError(f"{path}: expected a YAML mapping with a 'gpt:' section")
    return config_from_dict(data, str(path))


def gpt_to_dict(gpt: GPTConfig) -> dict:
    """The `gpt:` section as IndexTTS2 writes it (plain types, for YAML and checkpoints)."""
    return dataclasses.asdict(gpt)


def config_to_dict(config: Config) -> dict:
    train = dataclasses.asdict(config.train)
    train["adam_betas"] = list(train["adam_betas"])
    return {"gpt": gpt_to_dict(config.gpt), "train": train}


def gpt_from_dict(data: dict) -> GPTConfig:
    return _build(GPTConfig, data, "gpt")
