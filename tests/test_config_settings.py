"""config/settings.py: IndexTTS2's own config.yaml is accepted as users have it; typos are refused by name."""

from __future__ import annotations

import dataclasses
import datetime
import math
import re
from pathlib import Path

import pytest
import yaml

from indextts_train.config.family import INDEXTTS2
from indextts_train.config.settings import (
    BUNDLED_CONFIGS,
    OFFICIAL_SECTIONS,
    ConditionModuleConfig,
    GPTConfig,
    TrainConfig,
    check_setting,
    config_to_dict,
    load_config,
    train_flags,
)
from indextts_train.errors import UserError
from indextts_train.ui.run_settings import resolve_settings

ROOT = Path(__file__).resolve().parents[1]
TINY = ROOT / "configs" / "tiny.yaml"
REFERENCE_CONFIG = ROOT / "tests" / "data" / "reference" / "tiny" / "config.yaml"


def write(tmp_path: Path, data: dict) -> Path:
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def test_official_config_format_loads_with_float_perceiver_mult_and_other_sections(tmp_path) -> None:
    data = yaml.safe_load(REFERENCE_CONFIG.read_text())
    data["s2mel"] = {"anything": 1}  # IndexTTS2 sections we do not read are ignored
    data["dataset"] = {"bpe_model": "bpe.model"}
    config = load_config(write(tmp_path, data))
    assert config.gpt.emo_condition_module.perceiver_mult == 0.02
    assert config.gpt.text_rows == 101  # tokenizer size + the official extra row
    assert config.train.text_loss_weight == 0.2 and config.train.mel_loss_weight == 0.8


def test_shipped_configs_match_the_reference_sizes() -> None:
    real, tiny = load_config(ROOT / "configs" / "indextts2.yaml"), load_config(ROOT / "configs" / "tiny.yaml")
    assert (real.gpt.model_dim, real.gpt.layers, real.gpt.heads, real.gpt.number_text_tokens) == (1280, 24, 20, 12000)
    assert config_to_dict(tiny)["gpt"] == yaml.safe_load(REFERENCE_CONFIG.read_text())["gpt"]


@pytest.mark.parametrize(("section", "key", "meant"), [("gpt", "model_dimm", "model_dim"),
                                                        ("train", "learning_rat", "learning_rate"),
                                                        ("train", "lr", "learning_rate or lora_rank or min_lr_ratio"),
                                                        ("train", "zzz", None)])
def test_unknown_keys_are_refused_by_name(tmp_path, section, key, meant) -> None:
    data = yaml.safe_load((ROOT / "configs" / "tiny.yaml").read_text())
    data[section][key] = 1
    guess = rf" \(did you mean {meant}\?\)" if meant else ""
    with pytest.raises(UserError, match=rf"{section}: unknown key\(s\) {key}{guess}; known keys: "):
        load_config(write(tmp_path, data))


def test_bad_files_give_one_clear_line(tmp_path) -> None:
    with pytest.raises(UserError, match="config not found"):
        load_config(tmp_path / "missing.yaml")
    broken = tmp_path / "broken.yaml"
    broken.write_text("gpt:\n  model_dim: [1,\n")
    with pytest.raises(UserError, match=r"broken\.yaml line \d+: not valid YAML"):
        load_config(broken)
    with pytest.raises(UserError, match="no 'gpt:' section") as refused:
        load_config(write(tmp_path, {"train": {}}))
    assert f"{BUNDLED_CONFIGS}/*.yaml" in str(refused.value) and "--from-run" not in str(refused.value)  # a path
    # the user has, not `configs/` of no folder of theirs; a run's run.yaml given as --config points to --from-run
    with pytest.raises(UserError, match="; a run's run.yaml reruns its options with --from-run$"):
        load_config(write(tmp_path, {"command_line": "train-gpt ...", "argv": [], "options": {}}))
    with pytest.raises(UserError, match="not divisible"):
        load_config(write(tmp_path, {"gpt": {"model_dim": 65, "heads": 4}}))
    with pytest.raises(UserError, match=r"train\.learning_rate \(--learning-rate\) must be > 0"):
        load_config(write(tmp_path, {"gpt": {}, "train": {"learning_rate": 0}}))


def test_misspelled_section_is_refused_and_official_sections_are_kept(tmp_path) -> None:
    data = yaml.safe_load((ROOT / "configs" / "tiny.yaml").read_text())
    data["trian"] = data.pop("train")
    with pytest.raises(UserError, match=r"unknown top-level key\(s\) trian; ours are gpt, train, version"):
        load_config(write(tmp_path, data))
    official = yaml.safe_load(REFERENCE_CONFIG.read_text())
    official.update(OFFICIAL := dict.fromkeys(OFFICIAL_SECTIONS, {}))  # every IndexTTS2 section we do not read
    assert set(OFFICIAL) >= {"dataset", "s2mel", "vocoder"}
    assert load_config(write(tmp_path, official)).gpt.stated_family is INDEXTTS2  # its `version: 2.0`
    official["version"] = {}
    with pytest.raises(UserError, match=r"version \{\} is not a known model family"):
        load_config(write(tmp_path, official))


@pytest.mark.parametrize(("section", "key", "value", "expected"), [
    ("train", "epochs", "twenty", r"train\.epochs: expected int, got 'twenty'"),
    ("train", "learning_rate", "fast", r"train\.learning_rate: expected float, got 'fast'"),
    ("train", "freeze_base_vocab", "yes", r"train\.freeze_base_vocab: expected bool, got 'yes'"),
    ("gpt", "layers", 2.5, r"gpt\.layers: expected int, got 2\.5"),
])
def test_wrong_types_name_the_key_and_the_expected_type(tmp_path, section, key, value, expected) -> None:
    data = yaml.safe_load((ROOT / "configs" / "tiny.yaml").read_text())
    data[section][key] = value
    with pytest.raises(UserError, match=expected) as info:
        load_config(write(tmp_path, data))
    assert "\n" not in str(info.value)


def test_flags_override_the_train_section_and_are_revalidated() -> None:
    settings = resolve_settings(train_manifests=["t.jsonl"], output_dir=Path("out"),
                                config=ROOT / "configs" / "tiny.yaml", epochs=3, learning_rate=None)
    config = settings.config  # None: not given, the config decides
    assert config.train.epochs == 3 and config.train.learning_rate == 3e-3
    assert config.source == str(ROOT / "configs" / "tiny.yaml") and settings.config_note is None
    with pytest.raises(TypeError, match="unknown option"):
        resolve_settings(train_manifests=["t.jsonl"], output_dir=Path("out"), epoch=3)
    with pytest.raises(UserError, match=r"--log-interval\) must be > 0"):
        resolve_settings(train_manifests=["t.jsonl"], output_dir=Path("out"), config=ROOT / "configs" / "tiny.yaml",
                         log_interval=0)


@pytest.mark.parametrize(("section", "key", "value", "says"), [
    ("gpt", "layers", 100_000_000, "gpt.layers must be in 1..1,024, got 100000000"),
    ("gpt", "model_dim", 10**12, "gpt.model_dim must be in 1..65,536"),
    ("gpt", "number_text_tokens", 2**40, "gpt.number_text_tokens must be in 1..10,000,000"),
    ("gpt", "stop_mel_token", -1, "gpt.stop_mel_token must be in 0..999,999"),
    ("train", "seed", 10**20, "train.seed (--seed) must be at most 18,446,744,073,709,551,615"),
    ("train", "epochs", 10**9, "train.epochs (--epochs) must be at most 1,000,000"),
    ("train", "batch_size", 10**7, "train.batch_size (--batch-size) must be at most 65,536"),
])
def test_every_number_has_a_range(tmp_path: Path, section: str, key: str, value: int, says: str) -> None:
    data = yaml.safe_load(TINY.read_text())
    data.setdefault(section, {})[key] = value
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(data))
    with pytest.raises(UserError, match=re.escape(says)) as refused:
        load_config(path)
    assert "\n" not in str(refused.value)


@pytest.mark.parametrize(("section", "key", "says"), [
    ("train", "batch_size", "train.batch_size (--batch-size) must be at most 65,536, got a number of 401 digits"),
    ("train", "max_steps", "train.max_steps (--max-steps) must be >= 0, got a negative number of 401 digits"),
    ("train", "learning_rate", "train.learning_rate: 401 digits is beyond any number a setting takes"),
    ("condition_module", "perceiver_mult", "gpt.condition_module.perceiver_mult: 401 digits is beyond"),
])
def test_a_number_of_hundreds_of_digits_is_one_short_line(tmp_path: Path, section: str, key: str, says: str) -> None:
    """`1` and 400 zeros: math.isfinite and float() raised OverflowError (a traceback), and a refusal that
    printed the number was a line of 500 characters."""
    data = yaml.safe_load(TINY.read_text())
    where = data["gpt"].setdefault(section, {}) if section == "condition_module" else data.setdefault(section, {})
    where[key] = -(10**400) if key == "max_steps" else 10**400
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(data))
    with pytest.raises(UserError, match=re.escape(says)) as refused:
        load_config(path)
    assert len(str(refused.value)) < 200


def test_the_largest_seed_is_accepted() -> None:
    assert TrainConfig(seed=2**64 - 1).seed == 2**64 - 1


def test_official_sections_are_kept_and_stored_with_the_config(tmp_path: Path) -> None:
    data = yaml.safe_load(TINY.read_text())
    data.update({"s2mel": {"sr": 22050}, "vocoder": {"type": "bigvgan"}, "emo_num": [3, 4],
                 "w2v_stat": datetime.date(2026, 1, 1)})  # a date cannot go into a weights-only checkpoint
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(data))
    stored = config_to_dict(load_config(path))
    assert stored["s2mel"] == {"sr": 22050} and stored["vocoder"] == {"type": "bigvgan"} and stored["emo_num"] == [3, 4]
    assert "w2v_stat" not in stored


@pytest.mark.parametrize(("section", "cls"), [("gpt", GPTConfig), ("condition_module", ConditionModuleConfig)])
def test_every_model_size_has_its_range_on_its_field(tmp_path, section, cls) -> None:
    """Each whole number of the gpt: section is refused just outside the range its field states."""
    sizes = [f for f in dataclasses.fields(cls) if f.type in ("int", int)]
    assert len(sizes) >= 4
    for f in sizes:
        low, high = f.metadata["range"]
        for value in (low - 1, high + 1):
            data = yaml.safe_load(TINY.read_text())
            (data["gpt"] if section == "gpt" else data["gpt"]["condition_module"])[f.name] = value
            with pytest.raises(UserError, match=f"{f.name} must be in {low}..{high:,}, got {value}"):
                load_config(write(tmp_path, data))



HELP_RANGE = re.compile(r"\[range: (?P<low>[\d.]+)(?P<low_op><=?)x(?:(?P<high_op><=?)(?P<high>[\d,.]+))?\]")


def _beside(value: float, whole: bool) -> list[float]:
    """`value` and the nearest number of its kind on either side."""
    if whole:
        return [value - 1, value, value + 1]
    return [math.nextafter(value, -math.inf), value, math.nextafter(value, math.inf)]


def _checked(name: str, value: float) -> bool:
    try:
        check_setting(name, value)
    except UserError:
        return False
    return True


def test_the_help_of_every_number_flag_says_exactly_the_range_its_check_enforces() -> None:
    """`train-gpt --help` as rendered, read flag by flag: each number's range, probed at its ends (and one step
    past them) against the check of the config file, the flags, --from-run and the page (check_setting)."""
    import typer

    from indextts_train.cli import app

    command = typer.main.get_command(app).commands["train"]
    context = command.make_context("train", [], resilient_parsing=True)
    helps = {param.name: param.get_help_record(context)[1] for param in command.params}
    types = {f.name: f.type for f in dataclasses.fields(TrainConfig)}
    ruled = [f.name for f in train_flags() if f.metadata.get("rule")]
    assert set(ruled) == {f.name for f in train_flags() if types[f.name] in ("int", "float")}  # every number
    for name in ruled:
        shown = HELP_RANGE.findall(helps[name])
        assert len(shown) == 1, (name, helps[name])
        low_text, low_op, high_op, high_text = shown[0]
        whole = types[name] == "int"
        low = int(low_text) if whole else float(low_text)
        high = (int if whole else float)(high_text.replace(",", "")) if high_text else None
        probes = _beside(low, whole) + (_beside(high, whole) if high is not None else [10**9])
        for value in probes:
            said = (value > low if low_op == "<" else value >= low) and (
                high is None or (value < high if high_op == "<" else value <= high))
            assert _checked(name, value) == said, (name, value, helps[name])
