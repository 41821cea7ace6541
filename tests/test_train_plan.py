"""plan_for: the run, the `hardware` command and the web page make the same planner call on the same
settings, so the plan the page or the command shows is the plan the run picks (a LoRA run included)."""

from __future__ import annotations

import contextlib
import io
import json
import re

import pytest
import torch
import yaml
from helpers import run_cli
from typer.testing import CliRunner

from indextts_train.cli import app, run_app
from indextts_train.train.hardware import HardwarePlan
from indextts_train.webui import form as forms
from indextts_train.webui.roots import Roots


def page_plan(tiny_data: dict, tmp_path, extra: str) -> str:
    """The page's "Hardware plan" button for the form a user fills for this run."""
    from indextts_train.webui.server import PageServer

    server = PageServer(Roots([tiny_data["folder"], tmp_path, tiny_data["config"].parent]))
    numbers = forms.defaults_for(str(tiny_data["config"]))  # the page starts at the config's values
    values = [str(tiny_data["train"]), "", "", str(tiny_data["config"]), str(tiny_data["base"]),
              str(tmp_path / "run"), *[numbers[name] for name in forms.MAIN_FIELDS], "auto", extra]
    return server.hardware(*values)


@pytest.mark.slow  # a real run and the page (~20 s)
def test_the_page_the_hardware_command_and_the_run_pick_one_plan(tiny_data, tmp_path) -> None:
    out = tmp_path / "run"
    trained = run_cli("train", "--train-manifest", tiny_data["train"], "--output-dir", out, "--config",
                      tiny_data["config"], "--base-checkpoint", tiny_data["base"], "--train-scope", "lora",
                      "--max-steps", 1, "--save-interval", 1)
    assert trained.returncode == 0, trained.stderr
    ran = yaml.safe_load((out / "run.yaml").read_text())["hardware"]
    command = CliRunner().invoke(app, ["hardware", f"--config={tiny_data['config']}", "--train-scope=lora", "--json"])
    assert command.exit_code == 0, command.output
    shown = json.loads(command.output)
    assert {**shown, "cpu_threads": 0} == {**ran, "cpu_threads": 0}  # threads: each process's own torch
    here = HardwarePlan.from_dict({**ran, "cpu_threads": torch.get_num_threads()})
    assert page_plan(tiny_data, tmp_path, "--train-scope=lora") == here.describe()
    # The scope reaches the plan: a full run's differs, on the page as in the command.
    full = json.loads(CliRunner().invoke(app, ["hardware", f"--config={tiny_data['config']}", "--json"]).output)
    assert full["estimated_bytes"] > ran["estimated_bytes"]
    assert page_plan(tiny_data, tmp_path, "") == HardwarePlan.from_dict(
        {**full, "cpu_threads": torch.get_num_threads()}).describe()


@pytest.mark.slow  # a real run and the page (~20 s)
def test_the_plan_counts_the_rows_of_the_runs_tokenizer(tiny25_data, tmp_path) -> None:
    """The tokenizer was extended and the config still says the base's text rows (as a config kept from the base
    model does): the run trains the tokenizer's rows, so its plan, the command's and the page's count them."""
    out, tokenizer = tmp_path / "run", tiny25_data["tokenizer"]
    base_rows = yaml.safe_load(tiny25_data["config"].read_text())["gpt"]["number_text_tokens"]
    trained = run_cli("train", "--train-manifest", tiny25_data["train"], "--output-dir", out, "--config",
                      tiny25_data["config"], "--base-checkpoint", tiny25_data["base"], "--tokenizer", tokenizer,
                      "--max-steps", 1, "--save-interval", 1)
    assert trained.returncode == 0, trained.stderr
    log = (out / "train.log").read_text()
    planned = int(re.search(r"([\d,]+) trained parameters", log)[1].replace(",", ""))
    trainable = int(re.search(r"([\d,]+) trainable parameters", log)[1].replace(",", ""))
    assert planned == trainable  # full scope: every tensor of the model the run built
    ran = yaml.safe_load((out / "run.yaml").read_text())["hardware"]
    command = CliRunner().invoke(app, ["hardware", f"--config={tiny25_data['config']}", f"--tokenizer={tokenizer}",
                                       "--json"])
    assert command.exit_code == 0, command.output
    assert {**json.loads(command.output), "cpu_threads": 0} == {**ran, "cpu_threads": 0}
    without = json.loads(CliRunner().invoke(app, ["hardware", f"--config={tiny25_data['config']}", "--json"]).output)
    assert without["estimated_bytes"] < ran["estimated_bytes"]  # the config's rows alone: fewer than the run's
    assert yaml.safe_load((out / "run.yaml").read_text())["config"]["gpt"]["number_text_tokens"] > base_rows

    from indextts_train.webui.server import PageServer

    server = PageServer(Roots([tiny25_data["folder"], tmp_path, tiny25_data["config"].parent]))
    numbers = forms.defaults_for(str(tiny25_data["config"]))
    values = [str(tiny25_data["train"]), "", str(tokenizer), str(tiny25_data["config"]), str(tiny25_data["base"]),
              str(out), *[numbers[name] for name in forms.MAIN_FIELDS], "auto", ""]
    here = HardwarePlan.from_dict({**ran, "cpu_threads": torch.get_num_threads()})
    assert server.hardware(*values) == here.describe()
    values[2] = str(tiny25_data["folder"] / "no-such.tiktoken")
    assert server.hardware(*values).startswith("error: ")


def test_the_hardware_command_refuses_what_train_refuses_naming_its_flags(tiny25_data) -> None:
    """A scope not one of the three names the flag, not the config key; a tokenizer of the other family than
    the model planned (IndexTTS2 for a config that states none, as a run without a base builds) is one line."""
    err = io.StringIO()
    with contextlib.redirect_stderr(err):  # the entry point as users run it: Click's refusals as one line
        assert run_app(app, ["hardware", "--train-scope=x"]) == 2
    assert err.getvalue() == "error: --train-scope: 'x' is not one of full, partial, lora (see --help)\n"
    other = CliRunner().invoke(app, ["hardware", f"--tokenizer={tiny25_data['tokenizer']}"])
    assert other.exit_code == 2, other.output
    assert f"--tokenizer {tiny25_data['tokenizer']}: an IndexTTS-2.5" in other.output and "is IndexTTS2" in other.output
    same = CliRunner().invoke(app, ["hardware", f"--config={tiny25_data['config']}",
                                    f"--tokenizer={tiny25_data['tokenizer']}"])
    assert same.exit_code == 0, same.output
