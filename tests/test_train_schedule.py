"""A schedule that cannot learn (a warmup as long as the run, too few steps for the data) is said in
one warning line before the first step, naming the flags to pass; a schedule that can learn is not."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from indextts_train.cli import app
from indextts_train.train.hardware import HardwarePlan


def start(tiny_data: dict, out: Path, *extra: str) -> list[str]:
    args = ["train", "--train-manifest", str(tiny_data["train"]), "--config", str(tiny_data["config"]),
            "--base-checkpoint", str(tiny_data["base"]), "--output-dir", str(out), *extra]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    return result.output.splitlines()


def warnings_before_training(lines: list[str]) -> list[str]:
    first_step = next(i for i, line in enumerate(lines) if " step 1/" in line or " step 2/" in line)
    assert not any("warning: the learning rate" in line or "too few to learn" in line for line in lines[first_step:])
    return [line for line in lines[:first_step] if "warning: " in line]


@pytest.mark.slow
def test_a_warmup_as_long_as_the_run_is_said_before_training(tiny_data, tmp_path) -> None:
    lines = start(tiny_data, tmp_path / "run", "--warmup-steps", "1000", "--max-steps", "3", "--log-interval", "1")
    said = warnings_before_training(lines)
    assert len(said) == 1 and "--warmup-steps 1000 is not shorter than the run's 3 optimizer steps" in said[0]
    assert "climbs only to 9.0e-06 of its 3.0e-03 peak" in said[0]  # 3e-3 x 3 / 1000
    assert "pass --warmup-steps 1 (a tenth of the run), or more steps with --epochs / --max-steps" in said[0]
    assert said[0].split("warning: ", 1)[1] in (tmp_path / "run" / "train.log").read_text()
    last = next(line for line in reversed(lines) if " step 3/3 " in line)
    assert " lr 9.00e-06 " in last  # the LR step 3 took: the warning's "climbs only to"


def test_a_step_line_says_the_lr_its_step_took() -> None:
    """The scheduler holds the next step's LR once a step is done; the line (and TensorBoard) of a step say the
    one the optimizer used for it, through the warmup, the cosine and a changed peak on resume."""
    import torch

    from indextts_train.config.settings import TrainConfig
    from indextts_train.train.optim import OptimizerSet

    named = [("w", torch.nn.Parameter(torch.ones(2, 2)))]
    plan = HardwarePlan(device="cpu", device_name="cpu", precision="fp32", amp_dtype=None, use_grad_scaler=False,
                        tf32=False, micro_batch=2, grad_accumulation=1, effective_batch=2, world_size=1,
                        num_workers=0, memory_share=1.0, estimated_bytes=0, budget_bytes=0)
    train = TrainConfig(learning_rate=1e-2, warmup_steps=3)
    optim = OptimizerSet.build(named, train, plan, 8)
    taken = []
    for step in range(8):
        if step == 5:  # a resumed run with another peak: the groups' LR and the scheduler's base both change
            optim.apply_changed_settings({"learning_rate": 1e-2}, TrainConfig(learning_rate=2e-2), 8)
        taken.append(optim.optimizer.param_groups[0]["lr"])
        named[0][1].grad = torch.ones(2, 2)
        optim.optimizer.step()
        optim.scheduler.step()
        assert optim.last_step_lr() == taken[-1]
    assert taken[:3] == pytest.approx([1e-2 / 3, 2e-2 / 3, 1e-2], rel=1e-12)  # the first step: a third of the peak
    assert taken[5] == pytest.approx(2e-2 * optim.clock.factor(5), rel=1e-12)


@pytest.mark.slow
def test_too_few_steps_for_the_data_are_said_and_a_learning_schedule_is_not(tiny_data, tmp_path) -> None:
    # 24 samples at an effective batch of 8: 3 steps an epoch, 2 epochs.
    lines = start(tiny_data, tmp_path / "short", "--epochs", "2", "--warmup-steps", "1", "--log-interval", "1")
    said = warnings_before_training(lines)
    assert len(said) == 1 and "6 optimizer steps (2 epochs of 3 at an effective batch of 8) are too few" in said[0]
    assert "pass --epochs 34 (a smaller --effective-batch-size" in said[0]
    # Both at once (the defaults on a small corpus): one line with both remedies.
    lines = start(tiny_data, tmp_path / "both", "--epochs", "2", "--warmup-steps", "1000", "--log-interval", "1")
    said = warnings_before_training(lines)
    assert len(said) == 1 and "--warmup-steps 1000 is not shorter than the run's 6 optimizer steps" in said[0]
    assert "pass --warmup-steps 10 (a tenth of the run) and --epochs 34 (a smaller" in said[0]
    # The length asked for with --max-steps, a warmup shorter than it: nothing to say.
    lines = start(tiny_data, tmp_path / "capped", "--max-steps", "3", "--warmup-steps", "1", "--log-interval", "1")
    assert warnings_before_training(lines) == []
