"""config.py: IndexTTS2's own config.yaml is accepted as users have it; typos are refused by name."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from indextts_train.config import config_to_dict, load_config
from indextts_train.errors import UserError

ROOT = Path(__file__).resolve().parents[1]
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


@pytest.mark.parametrize(("section", "key"), [("gpt", "model_dimm"), ("train", "learning_rat")])
def test_unknown_keys_are_refused_by_name(tmp_path, section, key) -> None:
    data = yaml.safe_load((ROOT / "configs" / "tiny.yaml").read_text())
    data[section][key] = 1
    with pytest.raises(UserError, match=rf"{section}: unknown key\(s\) {key}"):
        load_config(write(tmp_path, data))


def test_bad_files_give_one_clear_line(tmp_path) -> None:
    with pytest.raises(UserError, match="config file not found"):
        load_config(tmp_path / "missing.yaml")
    broken = tmp_path / "broken.yaml"
    broken.write_text("gpt:\n  model_dim: [1,\n")
    with pytest.raises(UserError, match=r"broken\.yaml line \d+: not valid YAML"):
        load_config(broken)
    with pytest.raises(UserError, match="no 'gpt:' section"):
        load_config(write(tmp_path, {"train": {}}))
    with pytest.raises(UserError, match="not divisible"):
        load_config(write(tmp_path, {"gpt": {"model_dim": 65, "heads": 4}}))
    with pytest.raises(UserError, match="train.learning_rate must be > 0"):
        load_config(write(tmp_path, {"gpt": {}, "train": {"learning_rate": 0}}))
