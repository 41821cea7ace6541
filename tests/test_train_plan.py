"""plan_for: the run, the `hardware` command and the web page make the same planner call on the same
settings, so the plan the page or the command shows is the plan the run picks (a LoRA run included)."""

from __future__ import annotations

import json

import pytest
import torch
import yaml
from helpers import run_cli
from typer.testing import CliRunner

from indextts_train.cli import app
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
