"""run_settings.py: one start's settings, resolved once from the flags, a recorded run and the config
file; every number's range is its field's metadata, and each way in refuses a value outside it."""

from __future__ import annotations

import copy
import dataclasses
import re
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from indextts_train.cli import app
from indextts_train.config.schema import field_types
from indextts_train.config.settings import RULES, TrainConfig, config_to_dict, load_config, setting_range
from indextts_train.errors import UserError
from indextts_train.ui.run_record import write_run_record
from indextts_train.ui.run_settings import resolve_settings
from indextts_train.webui import form as forms

ROOT = Path(__file__).resolve().parents[1]
TINY = ROOT / "configs" / "tiny.yaml"
TYPES = field_types(TrainConfig)
NUMBERS = [f.name for f in dataclasses.fields(TrainConfig) if TYPES[f.name] in (int, float)]
# The tiny config as its file and as a run record holds it: read once, each case changes a copy.
TINY_FILE = yaml.safe_load(TINY.read_text())
TINY_RECORD = config_to_dict(load_config(TINY))


def outside(name: str) -> list[int | float]:
    """Values just outside the field's range, as its metadata states it."""
    rule, most = setting_range(name)
    values = [0 if rule == ">0" else -1]
    if rule in ("[0,1)", "[0,1]"):
        values.append(1 if rule == "[0,1)" else 2)
    elif most is not None:
        values.append(most + 1 if TYPES[name] is int else most * 2)
    return values


def test_every_number_has_its_range_on_its_field() -> None:
    assert len(NUMBERS) >= 25  # the schema's numbers, not an empty list
    for name in NUMBERS:
        rule, _ = setting_range(name)
        assert rule in RULES, name


@pytest.mark.parametrize("name", NUMBERS)
def test_each_way_in_refuses_a_number_outside_its_fields_range(tmp_path, name) -> None:
    flag = "--" + name.replace("_", "-")
    for value in outside(name):
        said = f"train.{name} ({flag}) must be"
        data = copy.deepcopy(TINY_FILE)
        data["train"][name] = value
        (tmp_path / "bad.yaml").write_text(yaml.safe_dump(data))
        with pytest.raises(UserError, match=re.escape(said)):  # the config file
            load_config(tmp_path / "bad.yaml")
        record = copy.deepcopy(TINY_RECORD)
        record["train"][name] = value
        write_run_record(tmp_path, {"train_manifests": ["t.jsonl"], "output_dir": "out", "config": str(TINY)},
                         record, {}, 0.0)
        with pytest.raises(UserError, match=re.escape(said)):  # a recorded run
            resolve_settings(from_run=tmp_path / "run.yaml")
        with pytest.raises(UserError, match=re.escape(said)):  # the web page's form
            forms.number_text(name, value)


@pytest.mark.slow  # one train-gpt command line per number (~15 s)
def test_the_flags_refuse_a_number_outside_its_fields_range(tmp_path) -> None:
    for name in NUMBERS:
        flag = "--" + name.replace("_", "-")
        for value in outside(name):
            result = CliRunner().invoke(app, ["train", "--train-manifest=t.jsonl", f"--output-dir={tmp_path / 'out'}",
                                              f"--config={TINY}", f"{flag}={value}"])
            assert result.exit_code == 2, result.output
            typed = TYPES[name](value)  # as the flag's type reads it (0 -> 0.0 for a float)
            assert result.output == f"error: train.{name} ({flag}) must be {_said(name, typed)}\n"
    assert not (tmp_path / "out").exists()


def _said(name: str, value: float) -> str:
    """What the range in the field's metadata says of `value`."""
    rule, most = setting_range(name)
    text, ok = RULES[rule]
    return f"{text}, got {value!r}" if not ok(value) else f"at most {most:,}, got {value:,}"


def test_a_recorded_run_is_resolved_under_the_flags_given_beside_it(tmp_path) -> None:
    first = resolve_settings(train_manifests=[f"{tmp_path / 'a.jsonl'}::en@0.5", str(tmp_path / "b.jsonl")],
                             output_dir=tmp_path / "out", config=TINY, epochs=7, amp=False, train_scope="lora")
    assert [(s.path.name, s.lang, s.weight) for s in first.train_manifests] == [("a.jsonl", "en", 0.5),
                                                                                 ("b.jsonl", None, None)]
    assert first.config.train.amp is False and first.config.train.epochs == 7
    write_run_record(tmp_path, {"train_manifests": [f"{tmp_path / 'a.jsonl'}::en@0.5"], "output_dir": "out",
                                "config": str(TINY)}, config_to_dict(first.config), {}, 0.0)
    again = resolve_settings(from_run=tmp_path / "run.yaml", epochs=9, seed=None, typed={"epochs"})
    assert again.config.train.epochs == 9  # typed beside --from-run: wins
    assert (again.config.train.amp, again.config.train.train_scope) == (False, "lora")  # recorded
    assert again.train_manifests[0].lang == "en" and again.output_dir == Path.cwd() / "out"
    with pytest.raises(UserError, match="--train-manifest is required"):
        resolve_settings(output_dir=tmp_path)
    with pytest.raises(UserError, match="--val-manifest .*a weight has no meaning here"):  # parsed here, once
        resolve_settings(train_manifests=["a.jsonl"], val_manifests=["v.jsonl@0.5"], output_dir=tmp_path, config=TINY)
    with pytest.raises(dataclasses.FrozenInstanceError):
        first.config_note = "changed"


NEEDS = {f.name: f.metadata["needs"] for f in dataclasses.fields(TrainConfig) if f.metadata.get("needs")}


def test_the_settings_read_only_in_one_mode_say_which_on_their_field() -> None:
    assert set(NEEDS) == {"partial_layers", "lora_rank", "lora_alpha", "lora_dropout", "lora_targets",
                          "listen_device", "listen_asr_model", "listen_inference_python"}
    fields = {f.name: f for f in dataclasses.fields(TrainConfig)}
    for name, (key, wanted) in NEEDS.items():
        assert key in fields and (wanted is None or wanted in fields[key].metadata["choices"]), name
        assert fields[name].metadata["help"].startswith(f"--{key.replace('_', '-')}"), name  # its help says it too


def test_a_typed_setting_of_a_mode_the_run_is_not_in_is_refused(tmp_path) -> None:
    """--lora-rank without --train-scope lora trained the whole model (the flag changed nothing): one line."""
    base = {"train_manifests": ["t.jsonl"], "output_dir": tmp_path / "out", "config": TINY}
    cases = [({"lora_rank": 8}, "--lora-rank is read under --train-scope lora only, and this run has "
                                "--train-scope full: the flag would change nothing; add --train-scope lora, or "
                                "leave --lora-rank out"),
             ({"partial_layers": 2, "train_scope": "lora"}, "--partial-layers is read under --train-scope partial "
                                                            "only, and this run has --train-scope lora"),
             ({"listen_device": "cuda:1"}, "--listen-device is read under --listen-every K (K > 0) only, and this run "
                                           "has --listen-every 0")]
    for given, said in cases:
        with pytest.raises(UserError, match=re.escape(said)):
            resolve_settings(**base, **given)
    assert resolve_settings(**base, lora_rank=8, train_scope="lora").config.train.lora_rank == 8
    assert resolve_settings(**base, listen_device="cuda:1", listen_every=2).config.train.listen_device == "cuda:1"
    # what a config file or a recorded run holds is not typed: a full run's file may keep its lora settings
    data = copy.deepcopy(TINY_FILE)
    data["train"].update(lora_rank=8, partial_layers=2, listen_device="cuda:1")
    (tmp_path / "kept.yaml").write_text(yaml.safe_dump(data))
    kept = resolve_settings(**{**base, "config": tmp_path / "kept.yaml"})
    assert (kept.config.train.train_scope, kept.config.train.lora_rank) == ("full", 8)
    inputs = {"train_manifests": ["t.jsonl"], "output_dir": "out", "config": str(tmp_path / "kept.yaml")}
    write_run_record(tmp_path, inputs, config_to_dict(kept.config), {}, 0.0)
    assert resolve_settings(from_run=tmp_path / "run.yaml", epochs=3, typed={"epochs"}).config.train.lora_rank == 8
    with pytest.raises(UserError, match="--lora-alpha is read under --train-scope lora only"):
        resolve_settings(from_run=tmp_path / "run.yaml", lora_alpha=4.0, typed={"lora_alpha"})
    result = CliRunner().invoke(app, ["train", "--train-manifest=t.jsonl", f"--output-dir={tmp_path / 'cli'}",
                                      f"--config={TINY}", "--lora-rank", "8"])
    assert result.exit_code == 2 and result.output.startswith("error: --lora-rank is read under") and \
        result.output.count("\n") == 1, result.output
    assert not (tmp_path / "cli").exists()


def test_what_only_a_resume_reads_is_refused_for_a_new_run(tmp_path) -> None:
    """--accept-data-change and --on-vocab-change reset, typed without --resume: accepted, and nothing read them."""
    base = dict(train_manifests=["t.jsonl"], output_dir=tmp_path / "run")
    for name, value, flag in (("accept_data_change", True, "--accept-data-change"),
                              ("on_vocab_change", "reset", "--on-vocab-change")):
        with pytest.raises(UserError, match=rf"^{flag} is read when a run resumes, and this start has no --resume"):
            resolve_settings(**base, **{name: value})
        assert getattr(resolve_settings(**base, **{name: value}, resume="auto"), name) == value
    assert resolve_settings(**base, on_vocab_change="keep").on_vocab_change == "keep"  # the default, typed


def test_a_model_folder_given_for_a_file_is_said_with_its_flag_and_nothing_else(tmp_path, capsys) -> None:
    """`--config MODELS` said "MODELS is a folder" without the flag; `--base-checkpoint MODELS` (no --config) was
    preceded by a line on why MODELS/../config.yaml was not taken as the folder's config."""
    models = tmp_path / "models"
    models.mkdir()
    (models / "config.yaml").write_text("gpt: {}\n")
    (tmp_path / "config.yaml").write_text("gpt: {}\ngpt_checkpoint: gpt.pth\n")
    with pytest.raises(UserError, match=rf"^--config {re.escape(str(models))} is a folder; pass the config file in "
                                        rf"it \(e\.g\. {re.escape(str(models / 'config.yaml'))}\)$"):
        resolve_settings(train_manifests=["t.jsonl"], output_dir=tmp_path / "run", config=models)
    settings = resolve_settings(train_manifests=["t.jsonl"], output_dir=tmp_path / "run", base_checkpoint=models)
    assert settings.config_note is None


def test_a_bundled_config_named_as_the_docs_write_it_is_found_from_any_folder(tmp_path, monkeypatch) -> None:
    """`train-gpt --config configs/tiny.yaml` outside the checkout: the check of the flag's file ran before the
    config's reader, which finds the bundled one (`hardware` and `check-data` did), and refused it."""
    monkeypatch.chdir(tmp_path)
    settings = resolve_settings(train_manifests=[str(tmp_path / "train.jsonl")], output_dir=tmp_path / "run",
                                config=Path("configs/tiny.yaml"))
    assert settings.inputs.config == Path("configs/tiny.yaml") and settings.config.source == str(TINY)
    with pytest.raises(UserError, match=r"--config configs/none\.yaml: config not found"):
        resolve_settings(train_manifests=[str(tmp_path / "train.jsonl")], output_dir=tmp_path / "run",
                         config=Path("configs/none.yaml"))
