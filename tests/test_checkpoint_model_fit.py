"""verify, export and repair judge a checkpoint's weights against its config by one rule (checkpoint/model_fit.py):
a file verify calls COMPLETE exports, and `repair --config` records no config of another family or layout."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import yaml
from test_checkpoint_files import MICRO_GPT, make_state, micro_weights
from typer.testing import CliRunner

from indextts_train.checkpoint.files import load_checkpoint, save_checkpoint
from indextts_train.checkpoint.verify import verify_checkpoint
from indextts_train.cli import app


def cli(*args: object):
    result = CliRunner().invoke(app, [str(a) for a in args])
    assert result.exception is None or isinstance(result.exception, SystemExit), result.exception
    return result


def _drop_buffer(state: dict) -> None:  # a tensor no optimizer holds, so only the layout check can miss it
    del state["model"]["conditioning_encoder.embed.pos_enc.pe"]


def _extra_key(state: dict) -> None:
    state["model"]["extra.weight"] = torch.zeros(3)


def _config_out_of_range(state: dict) -> None:
    state["config"]["gpt"] = {**state["config"]["gpt"], "model_dim": -5}


def _other_family_stated(state: dict) -> None:
    state["config"]["version"] = 2.5


@pytest.mark.parametrize("damage, reason", [
    (_drop_buffer, "1 missing: conditioning_encoder.embed.pos_enc.pe"),
    (_extra_key, "1 unexpected: extra.weight"),
    (_config_out_of_range, "config: gpt.model_dim must be in"),
    (_other_family_stated, "the checkpoint is IndexTTS2 (it has speed_emb.weight) but the config says version 2.5"),
])
def test_verify_refuses_what_export_refuses(tmp_path: Path, damage, reason) -> None:
    good = save_checkpoint(make_state(2), tmp_path / "run", 2, keep=3)
    assert verify_checkpoint(good).status == "COMPLETE"
    exported = cli("export", good, "-o", tmp_path / "good" / "gpt.pth")
    assert exported.exit_code == 0, exported.output  # the control: a COMPLETE file exports

    state = load_checkpoint(good)
    damage(state)
    path = tmp_path / "damaged.pth"
    torch.save(state, path)
    verdict = verify_checkpoint(path)
    assert (verdict.status, verdict.kind) == ("PARTIAL", "indextts-train"), verdict.reasons
    assert reason in verdict.reasons[0]
    refused = cli("export", path, "-o", tmp_path / "out" / "gpt.pth")
    assert refused.exit_code == 2 and "Traceback" not in refused.output
    assert len(refused.stderr.splitlines()) == 1 and not (tmp_path / "out").exists()


def _community(path: Path, config: dict) -> Path:
    """A community file (weights, step, epoch) of the GPT `config` describes."""
    from indextts_train.config.settings import config_from_dict
    from indextts_train.model.layout import official_shapes

    generator = torch.Generator().manual_seed(1)
    shapes = official_shapes(config_from_dict(config).gpt)
    torch.save({"model": {f"module.{k}": torch.randn(s, generator=generator) for k, s in shapes.items()},
                "step": 3, "epoch": 1}, path)
    return path


def _yaml(path: Path, config: dict) -> Path:
    path.write_text(yaml.safe_dump(config))
    return path


@pytest.mark.parametrize("weights, given, said", [
    ({"version": 2.5, "gpt": MICRO_GPT}, {"version": 2.0, "gpt": MICRO_GPT},
     "--config: the checkpoint is IndexTTS-2.5 (it has spk_emb_proj.weight) but the config says version 2.0"),
    ({"gpt": MICRO_GPT}, {"version": 2.5, "gpt": MICRO_GPT},
     "--config: the checkpoint is IndexTTS2 (it has speed_emb.weight) but the config says version 2.5"),
    ({"version": 2.5, "gpt": MICRO_GPT}, {"gpt": {**MICRO_GPT, "max_mel_tokens": 12}},  # states no family
     "--config: does not match the IndexTTS-2.5 GPT layout (the family of the weights' keys"),
])
def test_repair_refuses_a_config_of_other_weights(tmp_path: Path, weights, given, said) -> None:
    path = _community(tmp_path / "community.pth", weights)
    before = path.read_bytes()
    result = cli("repair", path, "--config", _yaml(tmp_path / "config.yaml", given), "-o", tmp_path / "out.pth")
    assert result.exit_code == 2 and result.stdout == "" and "Traceback" not in result.output
    (line,) = result.stderr.splitlines()
    assert line.startswith(f"error: cannot repair {path}: {said}"), line
    assert path.read_bytes() == before and sorted(p.name for p in tmp_path.iterdir()) == [
        "community.pth", "config.yaml"]


def test_repair_records_a_config_of_its_weights_and_the_file_exports(tmp_path: Path) -> None:
    config = {"version": 2.5, "gpt": MICRO_GPT, "train": {"seed": 99}}
    path = _community(tmp_path / "community.pth", config)
    out = tmp_path / "repaired.pth"
    result = cli("repair", path, "--config", _yaml(tmp_path / "config.yaml", config), "-o", out)
    assert result.exit_code == 0, result.output
    state = load_checkpoint(out)
    assert state["config"]["version"] == 2.5 and state["progress"]["sampler_seed"] == 99
    assert "config" not in state["repaired"]["unknown"]  # given, so not marked "not known"
    assert verify_checkpoint(out).status == "COMPLETE"
    exported = cli("export", out, "-o", tmp_path / "export" / "gpt.pth")
    assert exported.exit_code == 0, exported.output
    assert "IndexTTS-2.5 layout" in exported.stdout


def test_repair_replaces_a_stored_config_that_does_not_fit_with_the_one_given(tmp_path: Path) -> None:
    state = make_state(2)
    state["config"]["gpt"] = {**MICRO_GPT, "max_mel_tokens": 12}  # not the model of its weights
    path = tmp_path / "ours.pth"
    torch.save(state, path)
    assert verify_checkpoint(path).status == "PARTIAL"
    refused = cli("repair", path, "-o", tmp_path / "without.pth")
    assert refused.exit_code == 2 and "pass --config with the config.yaml it was trained with" in refused.stderr
    out = tmp_path / "repaired.pth"
    result = cli("repair", path, "--config", _yaml(tmp_path / "config.yaml", {"gpt": MICRO_GPT}), "-o", out)
    assert result.exit_code == 0, result.output
    assert "stored config replaced by --config (model: does not match" in result.stdout
    assert verify_checkpoint(out).status == "COMPLETE"
    assert load_checkpoint(out)["model"].keys() == micro_weights({}).keys()
