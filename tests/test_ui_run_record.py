"""A run folder that explains itself: run.yaml, from which `train-gpt --from-run` reruns the run to the
same weights (train.log: test_ui_text_log.py)."""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path

import pytest
import torch
import yaml
from typer.testing import CliRunner

from indextts_train.cli import app
from indextts_train.errors import UserError
from indextts_train.ui.run_record import RECORD_FORMAT, read_record, recorded_options, write_run_record


def test_a_run_yaml_that_is_not_ours_is_never_replaced(tmp_path) -> None:
    (tmp_path / "run.yaml").write_text("my: own notes\n")
    assert write_run_record(tmp_path, {}, {}, {}, 0.0) is None
    assert (tmp_path / "run.yaml").read_text() == "my: own notes\n" and read_record(tmp_path / "run.yaml") is None
    result = CliRunner().invoke(app, ["train", "--from-run", str(tmp_path / "run.yaml")])
    assert result.exit_code == 2 and "not a run record of this trainer" in result.output
    result = CliRunner().invoke(app, ["train", "--from-run", str(tmp_path / "missing.yaml")])
    assert result.exit_code == 2 and result.output.count("\n") == 1 and "no such file" in result.output
    result = CliRunner().invoke(app, ["train", "--from-run", str(tmp_path)])  # the run folder, not its run.yaml
    assert result.exit_code == 2 and f"--from-run {tmp_path} is a folder; pass the run.yaml in it" in result.output
    result = CliRunner().invoke(app, ["train", "--output-dir", str(tmp_path / "x")])
    assert result.exit_code == 2 and "--train-manifest is required" in result.output



def test_a_run_into_a_folder_with_someone_elses_run_yaml_says_it_keeps_it(tiny_data, tmp_path) -> None:
    out = tmp_path / "run"
    out.mkdir()
    (out / "run.yaml").write_text("my: own notes\n")
    result = CliRunner().invoke(app, ["train", "--train-manifest", str(tiny_data["train"]), "--config",
                                      str(tiny_data["config"]), "--output-dir", str(out), "--max-steps", "1"])
    assert result.exit_code == 0, result.output
    assert (f"warning: {out / 'run.yaml'} is not a run record of ours: kept as it is, so this start is recorded in "
            "train.log only (--from-run cannot rerun it)") in result.output
    assert (out / "run.yaml").read_text() == "my: own notes\n" and (out / "latest.pth").is_file()


@pytest.mark.slow
def test_rerun_from_run_yaml_gives_the_same_weights_bit_for_bit(tiny_data, tmp_path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)  # relative paths in the command resolve from here, and run.yaml says so
    first = Path("runs") / "first"
    args = ["train", "--train-manifest", str(tiny_data["train"]), "--val-manifest", str(tiny_data["val"]),
            "--config", str(tiny_data["config"]), "--base-checkpoint", str(tiny_data["base"]),
            "--output-dir", str(first), "--max-steps", "3", "--learning-rate", "3e-3", "--seed", "7",
            "--resume", "auto"]
    monkeypatch.setattr(sys, "argv", ["train-gpt", *args[1:]])
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    record = yaml.safe_load((first / "run.yaml").read_text())
    assert record["format"] == RECORD_FORMAT and record["command_line"].startswith("train-gpt --train-manifest")
    assert record["cwd"] == str(tmp_path) and record["options"]["output_dir"] == str(first)
    assert record["config"]["train"]["learning_rate"] == 3e-3 and record["config"]["train"]["seed"] == 7
    assert record["config"]["gpt"]["model_dim"] > 0 and record["hardware"]["micro_batch"] >= 1
    assert record["versions"]["torch"] == torch.__version__
    log = (first / "train.log").read_text()
    assert log.startswith("=== start ") and re.search(r"^\d\d:\d\d:\d\d \+0:\d\d:\d\d step 3/3 ", log, re.M)
    assert recorded_options(first / "run.yaml")["output_dir"] == tmp_path / first

    monkeypatch.chdir(tmp_path.parent)  # from elsewhere: the recorded folder resolves the relative paths
    again = tmp_path / "again"
    result = CliRunner().invoke(app, ["train", "--from-run", str(tmp_path / first / "run.yaml"),
                                      "--output-dir", str(again)])
    assert result.exit_code == 0, result.output
    reference = torch.load(tmp_path / first / "latest.pth", weights_only=True)
    rerun = torch.load(again / "latest.pth", weights_only=True)
    assert list(reference["model"]) == list(rerun["model"])
    assert all(torch.equal(reference["model"][k], rerun["model"][k]) for k in reference["model"])
    assert rerun["hparams"] == reference["hparams"]

    monkeypatch.chdir(tmp_path)
    result = CliRunner().invoke(app, args)  # the same command again: nothing to do, one more start in the log
    assert result.exit_code == 0 and "nothing to do" in result.output
    assert (tmp_path / first / "train.log").read_text().count("=== start ") == 2


def test_a_recorded_resume_path_is_taken_from_the_folder_the_run_was_started_in(tmp_path) -> None:
    """Like every other recorded path: a relative `--resume RUN/model_step3.pth` rerun from another folder
    named a file that was not there ("checkpoint not found; use --resume auto")."""
    record = {"format": RECORD_FORMAT, "cwd": str(tmp_path / "start"), "config": {"train": {}},
              "options": {"train_manifests": ["t.jsonl"], "output_dir": "run", "resume": "base/model_step3.pth"}}
    (tmp_path / "run.yaml").write_text(yaml.safe_dump(record))
    options = recorded_options(tmp_path / "run.yaml")
    assert options["resume"] == str(tmp_path / "start" / "base" / "model_step3.pth")
    record["options"]["resume"] = "auto"
    (tmp_path / "run.yaml").write_text(yaml.safe_dump(record))
    assert recorded_options(tmp_path / "run.yaml")["resume"] == "auto"


def test_a_hand_edited_record_that_gives_a_key_twice_is_refused(tmp_path) -> None:
    """`seed: 1234` then `seed: 99` in one mapping trained seed 99 without a word."""
    record = {"format": RECORD_FORMAT, "cwd": str(tmp_path), "config": {"train": {"seed": 1234}},
              "options": {"train_manifests": ["t.jsonl"], "output_dir": "run"}}
    text = yaml.safe_dump(record).replace("    seed: 1234\n", "    seed: 1234\n    seed: 99\n")
    (tmp_path / "run.yaml").write_text(text)
    with pytest.raises(UserError, match=r"^--from-run .*run.yaml line \d+: key 'seed' is given twice"):
        recorded_options(tmp_path / "run.yaml")


def test_a_fifo_given_as_the_record_is_said_as_such(tmp_path) -> None:
    os.mkfifo(tmp_path / "run.yaml")
    with pytest.raises(UserError, match=r"run.yaml: is a FIFO \(named pipe\), not a file; pass OUTPUT_DIR/run.yaml"):
        recorded_options(tmp_path / "run.yaml")
