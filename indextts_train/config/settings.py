"""YAML <-> dataclasses.

The YAML format is IndexTTS2's own `checkpoints/config.yaml`: we read its `gpt:` section and ignore
the other sections (dataset, s2mel, vocoder, ...), so users can pass the file they already have.
Our own optional `train:` section holds training defaults; CLI flags override it. Unknown keys in
`gpt:` or `train:` are rejected with the key's name, because a typo silently ignored costs GPU hours.
"""

from __future__ import annotations

import copy
import dataclasses
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from indextts_train.config.family import INDEXTTS2, Family, family_of_version
from indextts_train.config.metric_names import LISTEN_METRICS, LOSS_KEYS, parse_forgetting_limit
from indextts_train.config.schema import build
from indextts_train.config.scope_settings import scope_settings
from indextts_train.config.yaml_keys import load_config_yaml
from indextts_train.errors import UserError
from indextts_train.files.bounded import check_file


def bounded(default: int, low: int, high: int) -> Any:
    """A model size with its inclusive range: far beyond the real models (IndexTTS2: 24 layers of 1280,
    12000 text tokens), yet small enough that a typo (`layers: 100000000`) is named at once instead
    of reaching the memory estimate or the allocator."""
    return field(default=default, metadata={"range": (low, high)})


def check_bounded(sizes: Any, prefix: str) -> None:
    """Every `bounded` field of the dataclass `sizes` within its range, named `prefix` + field."""
    for f in dataclasses.fields(sizes):
        low, high = f.metadata.get("range", (None, None))
        if low is not None and not low <= getattr(sizes, f.name) <= high:
            raise UserError(f"{prefix}{f.name} must be in {low}..{high:,}, got {getattr(sizes, f.name)!r}")


@dataclass
class ConditionModuleConfig:
    """Conformer + perceiver that make the 32 conditioning latents (not trained here; carried)."""

    output_size: int = bounded(512, 1, 65_536)
    linear_units: int = bounded(2048, 1, 65_536)
    attention_heads: int = bounded(8, 1, 65_536)
    num_blocks: int = bounded(6, 1, 65_536)
    input_layer: str = "conv2d2"
    perceiver_mult: float = 2  # may be a float: the reference uses int(dim * mult * 2 / 3)

    def __post_init__(self) -> None:
        check_bounded(self, "gpt condition module: ")
        if not (math.isfinite(self.perceiver_mult) and 0 < self.perceiver_mult <= 64):
            raise UserError(f"gpt condition module: perceiver_mult must be in (0, 64], got {self.perceiver_mult!r}")


@dataclass
class GPTConfig:
    """The `gpt:` section of IndexTTS2's config.yaml; defaults are the real IndexTTS2 sizes."""

    model_dim: int = bounded(1280, 1, 65_536)
    max_mel_tokens: int = bounded(1815, 1, 1_000_000)
    max_text_tokens: int = bounded(600, 1, 1_000_000)
    heads: int = bounded(20, 1, 1024)
    use_mel_codes_as_input: bool = True
    mel_length_compression: int = bounded(1024, 1, 1_000_000)
    layers: int = bounded(24, 1, 1024)
    number_text_tokens: int = bounded(12000, 1, 10_000_000)
    number_mel_codes: int = bounded(8194, 1, 1_000_000)
    start_mel_token: int = bounded(8192, 0, 999_999)
    stop_mel_token: int = bounded(8193, 0, 999_999)
    start_text_token: int = bounded(0, 0, 9_999_999)
    stop_text_token: int = bounded(1, 0, 9_999_999)
    train_solo_embeddings: bool = False
    condition_type: str = "conformer_perceiver"
    condition_module: ConditionModuleConfig = field(default_factory=ConditionModuleConfig)
    emo_condition_module: ConditionModuleConfig = field(
        default_factory=lambda: ConditionModuleConfig(
            output_size=512, linear_units=1024, attention_heads=4, num_blocks=4
        )
    )
    # Not part of the `gpt:` section (official inference passes that section to UnifiedVoice as
    # keyword arguments): it comes from the top-level `version:`; None = not stated, the base
    # checkpoint's keys decide (train/weights.py). `family` reads it.
    stated_family: Family | None = field(default=None, metadata={"config_key": False})  # no key of the file's

    def __post_init__(self) -> None:
        check_bounded(self, "gpt.")
        if self.model_dim % self.heads:
            raise UserError(f"gpt.model_dim {self.model_dim} is not divisible by gpt.heads {self.heads}")
        if self.condition_type != "conformer_perceiver":
            raise UserError(
                f"gpt.condition_type {self.condition_type!r} is not supported; "
                "IndexTTS2 uses 'conformer_perceiver'"
            )
        if not (0 <= self.start_mel_token < self.number_mel_codes and 0 <= self.stop_mel_token < self.number_mel_codes):
            raise UserError("gpt.start_mel_token/stop_mel_token must be < gpt.number_mel_codes")
        for kind in ("mel", "text"):  # one id for both would end every sequence where it starts
            if (stop := getattr(self, f"stop_{kind}_token")) == getattr(self, f"start_{kind}_token"):
                raise UserError(f"gpt.start_{kind}_token and gpt.stop_{kind}_token are both {stop}; they must "
                                "differ, as in the model's config.yaml")

    @property
    def family(self) -> Family:
        """The model family: the stated one, IndexTTS2 where nothing states it (as official inference reads it)."""
        return self.stated_family or INDEXTTS2

    @property
    def text_rows(self) -> int:
        """Rows of text_embedding/text_head: the tokenizer size plus the official extra row."""
        return self.number_text_tokens + 1


# The allowed ranges of numbers (a field's `rule`); nan and inf are refused everywhere. An epochs of 0 or
# a grad_clip of -1 is a typo, never a request. Upper ends (`most`) are far beyond any real run, so a typo
# is one line; the seed's is a 64-bit unsigned integer (what torch and numpy accept). --num-workers has
# none (above the CPU count it is lowered, with a warning: hardware.py), nor has --learning-rate (any
# finite rate is a valid if diverging request; tests use 1e30).
RULES = {">0": ("> 0", lambda v: v > 0), ">=0": (">= 0", lambda v: v >= 0),
         "[0,1)": ("in [0, 1)", lambda v: 0 <= v < 1), "[0,1]": ("in [0, 1]", lambda v: 0 <= v <= 1)}
# Each rule as the help shows it, with the value as x (the notation of the other commands' ranges); an upper
# end (`most`) follows as `<=MOST`.
SHOWN_RULES = {">0": "0<x", ">=0": "0<=x", "[0,1)": "0<=x<1", "[0,1]": "0<=x<=1"}


def range_text(rule: str, most: float | None = None) -> str:
    """What `_check_range` lets through, as the help shows it: `0<x<=65,536`, `0<=x`, `0<=x<1`; the upper end
    written as the refusal writes it."""
    return SHOWN_RULES[rule] + ("" if most is None else f"<={most:,}")


def option(default: Any, help: str, *, flag: str | None = None, rule: str | None = None,
           most: float | None = None, names: str | None = None, needs: tuple[str, str | None] | None = None,
           family_needs: str | None = None) -> Any:
    """A `train:` field that is also a `train-gpt` flag: the CLI, overrides and hparams derive from it.

    `flag` gives community flag names where they differ from the field name ("--a/--no-a" for bools).
    A number has its allowed range here (`rule`, one of RULES, and the inclusive upper end `most`), read
    by every check of it: the config file, the flags, `--from-run` and the web page.
    `names`: what a text value names outside the run, which the web page keeps inside its roots: "program"
    (a program the run starts; its last part may be a link, as a venv's bin/python is) or "model" (a model
    it loads: a folder, or a hub id).
    `needs`: (setting, value) under which this one is read at all (value None: any but 0); typed without it,
    the flag would change nothing. `family_needs`: the model family's capability (a Family property)
    without which the setting is not read (config/unread_settings.py says both).
    """
    shown = f"{help} [range: {range_text(rule, most)}]" if rule else help  # what the check lets through
    return field(default=default, metadata={"help": shown, "flag": flag, "rule": rule, "most": most, "names": names,
                                            "needs": needs, "family_needs": family_needs})


@dataclass
class TrainConfig:
    """Our own `train:` section: defaults for the loop. Each field is also a `train-gpt` flag."""

    batch_size: int = option(0, "Micro-batch per GPU; 0 = auto from GPU memory.", rule=">=0", most=65_536)
    grad_accumulation: int = option(0, "Micro-batches per optimizer step; 0 = auto to reach the effective batch.",
                                    rule=">=0", most=65_536)
    effective_batch_size: int = option(64, "Samples per optimizer step (micro x accumulation x GPUs), "
                                           "the same on every GPU.", rule=">0", most=1 << 24)
    num_workers: int = option(0, "Data-loading workers; 0 = auto from the CPU count.", rule=">=0")
    learning_rate: float = option(2e-5, "Peak AdamW learning rate.", rule=">0")
    weight_decay: float = option(0.01, "AdamW decoupled weight decay (not on biases/norms; never on frozen rows).",
                                 rule=">=0", most=100.0)
    adam_betas: tuple[float, float] = field(default=(0.9, 0.999), metadata={"help": "AdamW betas.", "cli": False})
    adam_eps: float = option(1e-8, "AdamW epsilon.", rule=">0", most=1.0)
    warmup_steps: int = option(1000, "Linear warmup steps before cosine decay.", rule=">=0", most=1 << 40)
    min_lr_ratio: float = option(0.0, "Cosine decays to learning_rate x this.", rule="[0,1]")
    epochs: int = option(10, "Epochs to train.", rule=">0", most=1_000_000)
    max_steps: int = option(0, "Stop at this optimizer step (0 = run all --epochs).", rule=">=0", most=1 << 40)
    grad_clip: float = option(1.0, "Gradient-norm clipping.", rule=">0", most=1e9)
    text_loss_weight: float = option(0.2, "Weight of the text cross-entropy.", rule=">=0", most=1e6)
    mel_loss_weight: float = option(0.8, "Weight of the semantic-code cross-entropy.", rule=">=0", most=1e6)
    dropout: float = option(0.1, "GPT-2 residual/embedding/attention dropout, as the official trunk.", rule="[0,1)")
    amp: bool | None = option(None, "Force mixed precision on/off (omitted: bf16 where supported, fp16+scaler "
                                    "otherwise, fp32 on CPU).", flag="--amp/--no-amp")
    activation_checkpointing: bool = option(False, "Recompute activations to save GPU memory.",
                                            flag="--grad-checkpointing/--no-grad-checkpointing")
    freeze_base_vocab: bool = option(True, "Keep the base-vocabulary rows of the text embedding/head frozen.",
                                     flag="--freeze-base-vocab/--unfreeze-base-vocab")
    log_interval: int = option(10, "Steps between log lines / TensorBoard points.", rule=">0", most=1 << 40)
    val_interval: int = option(500, "Steps between validations (also run at the end).", rule=">0", most=1 << 40)
    save_interval: int = option(1000, "Steps between checkpoints (also at the end and on Ctrl+C).",
                                rule=">0", most=1 << 40)
    keep_checkpoints: int = option(3, "How many model_step{N}.pth to keep (best.pth and milestones aside).",
                                   rule=">0", most=1_000_000)
    keep_every: int = option(0, "Milestones: also keep every checkpoint whose step is a multiple of N (0 = none).",
                             rule=">=0", most=1 << 40)
    best_metric: str = option("loss", "Validation metric that picks best.pth: loss (the weighted total), "
                                      "text_loss, mel_loss, or LANG/loss for one language; or listen/cer, "
                                      "listen/speaker_sim: what --listen-every heard.")
    early_stop_patience: int = option(0, "Stop after K validations in a row without a new best.pth "
                                         "(0 = never); exits 0.", rule=">=0", most=1_000_000)
    forgetting_limit: str = option("", "Stop when a validation language's loss rises more than PCT% above "
                                       "the base model's: '5' (every language) or 'zh=5,en=5'.")
    seed: int = option(1234, "Seed for init, data order and dropout.", rule=">=0", most=2**64 - 1)
    listen_every: int = option(0, "Hear every K-th saved checkpoint (and the last) with `indextts-train listen` in a "
                                  "separate process while training goes on (0 = never); see docs/listen.md.",
                               rule=">=0", most=1 << 40)
    listen_device: str = option("cpu", "--listen-every: where the listener synthesizes and scores (cpu, cuda:1, ...).",
                                needs=("listen_every", None))
    listen_asr_model: str = option("", "--listen-every: the listener's --asr-model (default: listen's).",
                                   names="model", needs=("listen_every", None))
    listen_inference_python: str = option("", "--listen-every: the listener's --inference-python (default: this "
                                              "Python).", names="program", needs=("listen_every", None))
    listen_lines: int = option(4, "At every validation the GPT generates speech codes (no audio) for this many "
                                  "validation lines per language: share that stops, length vs target, "
                                  "repetition. 0 = off.", rule=">=0", most=1024)
    # IndexTTS-2.5 only. spk_emb_proj stays frozen by default: as IndexTTS2's speaker encoders, the
    # speaker path is not fine-tuned, so voices the data does not have keep cloning as before.
    train_speaker_proj: bool = option(False, "IndexTTS-2.5: train spk_emb_proj (default: frozen, bit-identical).",
                                      family_needs="speaker_vector",
                                      flag="--train-speaker-proj/--freeze-speaker-proj")
    borrow_languages: list[str] = field(default_factory=list, metadata={
        "help": "IndexTTS-2.5: NEW=CODE lets language NEW (no tag of its own) train the unused row and tag of "
                "CODE; repeatable.", "flag": "--borrow-language", "metavar": "NEW=CODE",
        "family_needs": "language_rows"})
    # 4096 = 64 steps of the usual effective batch 64: each step then spans 1/64 of a window's lengths,
    # so even one micro-batch per step pads about 7% (benchmarks/bench_padding.py); 512 padded 22%.
    sort_window: int = option(4096, "Samples sorted by length together, so batches pad little.",
                              rule=">0", most=1 << 24)
    compile: bool = option(False, "torch.compile each GPT block: faster steps on a GPU after a minute of "
                                  "compiling; results equal to eager within float rounding.",
                           flag="--compile/--no-compile")
    async_save: bool = option(False, "Write checkpoints in a background thread from a CPU snapshot taken at "
                                     "the step boundary, so training goes on while the file is written.",
                              flag="--async-save/--no-async-save")
    max_bad_steps: int = option(20, "Stop (exit 3) after this many steps in a row with a non-finite loss or "
                                    "gradient norm; each is skipped, weights untouched.", rule=">0", most=1_000_000)
    train_scope: str = field(default="full", metadata={
        "help": "What trains: full (everything), partial (last --partial-layers trunk blocks, final norms, heads, "
                "new text rows) or lora (adapters on the trunk, heads, new text rows). Fixed for a run.",
        "flag": None, "choices": ("full", "partial", "lora")})
    partial_layers: int = option(4, "--train-scope partial: how many of the last trunk blocks train.",
                                 rule=">0", most=1024, needs=("train_scope", "partial"))
    lora_rank: int = option(16, "--train-scope lora: rank of each adapter.", rule=">0", most=65_536,
                            needs=("train_scope", "lora"))
    lora_alpha: float = option(32.0, "--train-scope lora: adapter scale = alpha / rank.", rule=">0", most=1e9,
                               needs=("train_scope", "lora"))
    lora_dropout: float = option(0.0, "--train-scope lora: dropout on each adapter's input.", rule="[0,1)",
                                 needs=("train_scope", "lora"))
    lora_targets: str = option("qkv,attn_out,mlp_in,mlp_out",
                               "--train-scope lora: adapted layers of every trunk block, comma-separated: "
                               "qkv, attn_out, mlp_in, mlp_out.", needs=("train_scope", "lora"))

    def __post_init__(self) -> None:
        self.adam_betas = tuple(self.adam_betas)  # YAML gives a list
        for f in dataclasses.fields(self):
            if f.metadata.get("rule"):
                check_setting(f.name, getattr(self, f.name))
        if len(self.adam_betas) != 2:
            raise UserError(f"train.adam_betas must be two numbers in [0, 1), got {list(self.adam_betas)}")
        for beta in self.adam_betas:
            _check_range("train.adam_betas", beta, "[0,1)")
        if self.text_loss_weight == 0 and self.mel_loss_weight == 0:
            raise UserError("train.text_loss_weight and train.mel_loss_weight (--text-loss-weight, "
                            "--mel-loss-weight) are both 0: nothing would be learned; set at least one > 0")
        self._check_best_settings()
        scope_settings(self)  # names the bad train_scope / partial_layers / lora_* key

    def _check_best_settings(self) -> None:
        if self.best_metric.rpartition("/")[2] not in LOSS_KEYS and self.best_metric not in LISTEN_METRICS:
            raise UserError(f"train.best_metric (--best-metric) {self.best_metric!r}: expected "
                            f"{', '.join(LOSS_KEYS)}, LANG/loss for one validation language, or "
                            f"{' or '.join(LISTEN_METRICS)} (with --listen-every)")
        if self.forgetting_limit:
            parse_forgetting_limit(self.forgetting_limit)

    def loss(self, text_loss: Any, mel_loss: Any) -> Any:
        """The weighted total that is optimised, logged and compared (the one place it is computed)."""
        return self.text_loss_weight * text_loss + self.mel_loss_weight * mel_loss


_TRAIN_FIELDS = {f.name: f for f in dataclasses.fields(TrainConfig)}


def setting_range(name: str) -> tuple[str | None, float | None]:
    """The `train:` setting's rule and upper end, from its field (None, None: not a number)."""
    meta = _TRAIN_FIELDS[name].metadata
    return meta.get("rule"), meta.get("most")


def check_setting(name: str, value: Any) -> None:
    """A `train:` number against its field's range: one line naming the config key and the flag."""
    rule, most = setting_range(name)
    _check_range(f"train.{name} (--{name.replace('_', '-')})", value, rule, most)


def _check_range(where: str, value: Any, rule: str, most: float | None = None) -> None:
    text, ok = RULES[rule]
    # an int is finite however long (math.isfinite raised OverflowError on one of 400 digits)
    if not isinstance(value, (int, float)) or isinstance(value, bool) or (isinstance(value, float)
                                                                           and not math.isfinite(value)):
        raise UserError(f"{where} must be a finite number, got {value!r}")
    huge = _huge(value)
    if not ok(value):
        raise UserError(f"{where} must be {text}, got {huge or repr(value)}")
    if most is not None and value > most:
        raise UserError(f"{where} must be at most {most:,}, got {huge or f'{value:,}'}")


def _huge(value: float) -> str | None:
    """A number too long to read in a line (`1` and 400 zeros typed), said by its size; None for the others."""
    if abs(value) < 10**30:
        return None
    if isinstance(value, float):
        return f"{value:g}"
    return f"{'a negative' if value < 0 else 'a'} number of {len(str(abs(value)))} digits"


def train_flags() -> list[dataclasses.Field]:
    """The `train:` fields that are `train-gpt` flags."""
    return [f for f in dataclasses.fields(TrainConfig) if f.metadata.get("cli", True)]


@dataclass
class Config:
    gpt: GPTConfig = field(default_factory=GPTConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    source: str = ""  # the file it came from, for messages
    # IndexTTS2's own sections (dataset, s2mel, ...) as read: unused for training, but stored in the
    # checkpoint so that an export without --config still writes a config.yaml inference can load.
    sections: dict = field(default_factory=dict)

    def override(self, values: dict[str, Any]) -> None:
        """Flags beat the config's train: section; the dataclass re-validates the result by name."""
        merged = {**dataclasses.asdict(self.train), **values}
        self.train = build(TrainConfig, merged, "train")


# Top-level sections of IndexTTS2's checkpoints/config.yaml that we do not read but accept, so the
# file users already have works; anything else (a typo like `trian:`) is refused. `version` is read:
# it names the model family.
OFFICIAL_SECTIONS = ("dataset", "semantic_codec", "s2mel", "gpt_checkpoint", "w2v_stat", "s2mel_checkpoint",
                     "emo_matrix", "spk_matrix", "emo_num", "qwen_emo_path", "vocoder")
OUR_SECTIONS = ("gpt", "train", "version")


def config_from_dict(data: dict, source: str = "<dict>") -> Config:
    if "gpt" not in data:
        run_record = "options" in data and "argv" in data  # a run's run.yaml: what --from-run reads
        raise UserError(f"{source}: no 'gpt:' section; pass the model's checkpoints/config.yaml or one of "
                        f"{BUNDLED_CONFIGS}/*.yaml" + ("; a run's run.yaml reruns its options with --from-run"
                                                      if run_record else ""))
    unknown = [str(k) for k in data if k not in OUR_SECTIONS + OFFICIAL_SECTIONS]
    if unknown:
        raise UserError(f"{source}: unknown top-level key(s) {', '.join(unknown)}; ours are "
                        f"{', '.join(OUR_SECTIONS)} (IndexTTS2's own sections are accepted too)")
    if isinstance(data["gpt"], dict) and "family" in data["gpt"]:
        raise UserError(f"{source}: gpt.family is not a key of the gpt: section; write the model family as a "
                        "top-level `version: 2.5` (or 2.0), as the official config.yaml does")
    gpt = build(GPTConfig, data["gpt"], f"{source}: gpt")
    gpt.stated_family = family_of_version(data.get("version"), f"{source}: version")
    train = build(TrainConfig, data.get("train"), f"{source}: train")
    sections = {k: data[k] for k in OFFICIAL_SECTIONS if k in data and _is_plain(data[k])}
    return Config(gpt=gpt, train=train, source=source, sections=sections)


def _is_plain(value: Any, depth: int = 0) -> bool:
    """Whether `value` is plain YAML data a weights-only checkpoint can hold (no dates, not too deep)."""
    if depth > 16:
        return False
    if isinstance(value, dict):
        return all(isinstance(k, str) and _is_plain(v, depth + 1) for k, v in value.items())
    if isinstance(value, list):
        return all(_is_plain(v, depth + 1) for v in value)
    return type(value) in (str, int, float, bool, type(None))


BUNDLED_CONFIGS = Path(__file__).resolve().parents[2] / "configs"  # this checkout's, not the working directory's


def config_path(path: str | Path) -> Path:
    """`configs/NAME.yaml` as the docs write it, found from any folder: the bundled file when no such path is
    here; any other path as given."""
    path = Path(path)
    if not path.exists() and path.parent == Path("configs") and (BUNDLED_CONFIGS / path.name).is_file():
        return BUNDLED_CONFIGS / path.name
    return path


def load_config(path: str | Path) -> Config:
    path = config_path(path)
    shipped = ", ".join(sorted(p.name for p in BUNDLED_CONFIGS.glob("*.yaml")))
    check_file(path, "config", missing=f"pass your model's config.yaml or one of the bundled configs in "
                                       f"{BUNDLED_CONFIGS} ({shipped})")
    try:
        data = load_config_yaml(path)  # safe and bounded: size, nesting, anchors expanded; no key given twice
    except OSError as exc:
        raise UserError(f"{path}: cannot read the config ({exc.strerror})") from None
    if not isinstance(data, dict):
        raise UserError(f"{path}: expected a YAML mapping with a 'gpt:' section")
    return config_from_dict(data, str(path))


def gpt_to_dict(gpt: GPTConfig) -> dict:
    """The `gpt:` section as IndexTTS2 writes it (plain types, for YAML and checkpoints)."""
    data = dataclasses.asdict(gpt)
    del data["stated_family"]  # top-level `version:`, see GPTConfig.stated_family
    return data


def _flat(section: dict, prefix: str = "gpt.") -> dict:
    out: dict = {}
    for key, value in section.items():
        out |= _flat(value, f"{prefix}{key}.") if isinstance(value, dict) else {f"{prefix}{key}": value}
    return out


def changed_gpt_keys(saved: dict, gpt: GPTConfig) -> list[str]:
    """`key saved -> now` for each gpt: key that differs from a checkpoint's stored section. Only keys it
    stored are compared (an older file knows fewer), and number_text_tokens follows the tokenizer (its
    growth is the vocabulary plan's to handle)."""
    old, now = _flat(saved), _flat(gpt_to_dict(gpt))
    return [f"{key} {old[key]} -> {now[key]}" for key in now
            if key in old and key != "gpt.number_text_tokens" and old[key] != now[key]]


def config_to_dict(config: Config) -> dict:
    train = dataclasses.asdict(config.train)
    train["adam_betas"] = list(train["adam_betas"])
    out = {**copy.deepcopy(config.sections), "gpt": gpt_to_dict(config.gpt), "train": train}
    if config.gpt.stated_family is not None:
        out["version"] = config.gpt.stated_family.version
    return out


def gpt_from_dict(data: dict) -> GPTConfig:
    return build(GPTConfig, data, "gpt")


# The real IndexTTS2 sizes, from this checkout (not the working directory).
DEFAULT_CONFIG = BUNDLED_CONFIGS / "indextts2.yaml"
