"""The generation check of every validation (train/listen_check.py): its numbers, its lines, and that
it changes nothing training computes."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import write_dataset
from helpers import start

from indextts_train.checkpoint.base import load_base_checkpoint
from indextts_train.checkpoint.files import load_checkpoint
from indextts_train.config.settings import load_config
from indextts_train.data.manifest import ManifestDataset, ManifestIndex
from indextts_train.model.generation import GeneratedLine
from indextts_train.model.gpt import UnifiedVoiceGPT
from indextts_train.train.listen_check import (
    GenerationCheck,
    choose_lines,
    describe_generation,
    generation_scalars,
    generation_seed,
    repetition,
    summarize,
    worst_ratio,
)
from indextts_train.train.validation import describe, scalars


def test_repetition_is_the_share_of_4_grams_seen_before():
    assert repetition(list(range(10))) == 0.0  # every 4-gram new
    assert repetition([1, 2, 3, 4] * 3) == 5 / 9  # 9 four-grams, the last 5 repeat the first 4
    assert repetition([7] * 10) == 6 / 7  # one code looped: all but the first 4-gram repeat
    assert repetition([1, 2, 3]) == 0.0  # shorter than one 4-gram
    assert repetition([1, 2, 1, 2, 1], n=2) == 2 / 4


def test_length_ratios_median_and_worst_either_way():
    assert worst_ratio([0.9, 1.2, 2.5, 0.5]) == 2.5
    assert worst_ratio([0.3, 2.0, 1.0]) == 0.3  # x0.3 is further from 1 than x2
    assert worst_ratio([1.5, 0.0]) == 0.0  # no code at all
    lines = [GeneratedLine([5] * 10, True), GeneratedLine([1, 2, 3, 4, 5], True),
             GeneratedLine(list(range(30)), False)]
    numbers = summarize(lines, [[0] * 10, [0] * 10, list(range(10))])
    assert numbers == {"stopped": 2 / 3, "length_ratio": 1.0, "length_ratio_worst": 3.0,
                       "repetition": (6 / 7 + 0 + 0) / 3, "lines": 3, "target_repetition": (6 / 7 + 6 / 7 + 0) / 3}


def test_lines_are_a_seeded_choice_per_language_that_no_other_language_moves():
    groups = {"am": np.arange(0, 50), "zh": np.arange(50, 53)}
    chosen = choose_lines(groups, 4, seed=7)
    assert len(chosen["am"]) == 4 and set(chosen["am"]) <= set(range(50))
    assert chosen["zh"].tolist() == [50, 51, 52]  # fewer lines than asked: all of them
    assert chosen["am"].tolist() == choose_lines({"am": np.arange(0, 50)}, 4, seed=7)["am"].tolist()
    assert chosen["am"].tolist() != choose_lines(groups, 4, seed=8)["am"].tolist()
    assert generation_seed(7, 100) == generation_seed(7, 100) != generation_seed(7, 101)


def test_the_numbers_go_to_the_validation_line_and_tensorboard():
    numbers = {"stopped": 0.75, "length_ratio": 0.97, "length_ratio_worst": 1.62, "repetition": 0.031, "lines": 4,
               "target_repetition": 0.01}
    losses = {"loss": 3.0, "text_loss": 3.0, "mel_loss": 3.0, "mel_top1": 0.5, "samples": 8}
    result = {"total": losses, "groups": {"am": losses, "zh": losses},
              "generation": {"total": numbers, "groups": {"am": numbers, "zh": numbers}}}
    line = describe(10, result, None)
    assert line.endswith(" | gen: stop 3/4 len x0.97 (worst x1.62) rep 0.03 | gen am: stop 3/4 len x0.97 "
                         "(worst x1.62) rep 0.03 | gen zh: stop 3/4 len x0.97 (worst x1.62) rep 0.03")
    assert describe_generation(result["generation"]) in line
    values = scalars(result)
    assert values["gen/stopped"] == 0.75 and values["zh/gen/length_ratio_worst"] == 1.62
    assert set(generation_scalars(result["generation"])) == {f"{where}gen/{key}" for where in ("", "am/", "zh/")
                                                             for key in ("stopped", "length_ratio",
                                                                         "length_ratio_worst", "repetition")}


@pytest.mark.slow
def test_the_check_keeps_the_model_mode_weights_and_global_random_state(tiny_data, tmp_path):
    config = load_config(tiny_data["config"])
    trained, _, _ = load_base_checkpoint(tiny_data["base"], config.gpt)
    model = UnifiedVoiceGPT(config.gpt)
    model.load_state_dict(trained)
    model.train()
    manifests = [write_dataset(tmp_path, 6, seed=21, name="am.jsonl"), write_dataset(tmp_path, 3, seed=22,
                                                                                      name="zh.jsonl")]
    dataset = ManifestDataset(ManifestIndex.build(manifests))
    check = GenerationCheck.build(dataset, {"am": np.arange(6), "zh": np.arange(6, 9)}, count=2, seed=3,
                                  max_codes=config.gpt.max_mel_tokens)
    assert GenerationCheck.build(dataset, {"am": np.arange(6)}, count=0, seed=3, max_codes=9) is None
    before = {k: v.clone() for k, v in model.state_dict().items()}
    rng = torch.get_rng_state()
    first = check.run(model, 5, torch.device("cpu"))
    assert model.training and torch.equal(torch.get_rng_state(), rng)
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    assert first["groups"]["am"]["lines"] == 2 and first["total"]["lines"] == 4
    assert check.run(model, 5, torch.device("cpu")) == first  # the same step: the same draws
    assert "4 validation line(s) of 2 language(s) took 1.5s" in check.cost_line(1.5)


def train_args(data: dict, out: Path, *extra: str) -> list[str]:
    return [sys.executable, "-m", "indextts_train", "train",
            "--train-manifest", str(data["train"]), "--val-manifest", str(data["val"]),
            "--config", str(data["config"]), "--base-checkpoint", str(data["base"]), "--output-dir", str(out),
            "--batch-size", "2", "--grad-accumulation", "2", "--effective-batch-size", "4", "--max-steps", "12",
            "--epochs", "100", "--learning-rate", "3e-3", "--warmup-steps", "4", "--seed", "11",
            "--save-interval", "6", "--val-interval", "4", "--log-interval", "4", *extra]


@pytest.mark.slow
def test_a_run_with_the_check_ends_bit_identical_to_one_without(tiny_data, tmp_path):
    """Through the CLI: --listen-lines 0 against the default (dropout on, so any draw from the training
    RNG, or a model left in eval mode, would change the weights)."""
    outputs = {}
    for name, extra in (("off", ("--listen-lines", "0")), ("on", ())):
        proc = start(train_args(tiny_data, tmp_path / name, *extra))
        outputs[name] = proc.communicate(timeout=600)[0]
        assert proc.returncode == 0, outputs[name]
    on, off = load_checkpoint(tmp_path / "on" / "latest.pth"), load_checkpoint(tmp_path / "off" / "latest.pth")
    for key, tensor in off["model"].items():
        assert torch.equal(on["model"][key], tensor), f"parameter {key} differs"
    for index, slots in off["optimizer"]["state"].items():
        for slot, tensor in slots.items():
            assert torch.equal(on["optimizer"]["state"][index][slot], tensor), f"optimizer {index}.{slot} differs"
    assert (on["progress"], on["scheduler"]) == (off["progress"], off["scheduler"])
    assert (on["history"]["train"], on["history"]["val"]) == (off["history"]["train"], off["history"]["val"])
    assert [entry["step"] for entry in on["history"]["generation"]] == [0, 4, 8, 12]
    assert off["history"]["generation"] == []
    assert (on["history"]["baseline"], on["history"]["last_val"]) == (off["history"]["baseline"],
                                                                     off["history"]["last_val"])
    assert outputs["on"].count("generation check: 4 validation line(s) of 1 language(s) took") == 1
    assert outputs["on"].count("| gen: stop ") == 4 and "| gen:" not in outputs["off"]
