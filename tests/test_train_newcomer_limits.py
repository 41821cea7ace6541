"""What a newcomer is told at the start: a --max-steps the epochs end the run before (and, once the run
is done, the flag that ended it), and a --resume PATH of another folder whose new branch sets the output
folder's own checkpoints aside at its first save."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from indextts_train.checkpoint.files import load_checkpoint
from indextts_train.train.loop import RunSettings, resolve_settings, train

pytestmark = pytest.mark.slow  # every test here trains tiny runs: seconds each


def options(data: dict, out: Path, **overrides) -> RunSettings:
    # 24 training samples at an effective batch of 4: 6 steps an epoch.
    values = dict(train_manifests=[data["train"]], val_manifests=[], output_dir=out, config=data["config"],
                  base_checkpoint=data["base"], batch_size=2, grad_accumulation=2, effective_batch_size=4,
                  num_workers=0, epochs=2, learning_rate=3e-3, warmup_steps=1, log_interval=2, save_interval=6,
                  tensorboard=False)
    values.update(overrides)
    return resolve_settings(**values)


def said(capsys) -> list[str]:
    return capsys.readouterr().out.splitlines()


def test_a_max_steps_past_the_epochs_is_said_and_the_advice_names_epochs(tiny_data, tmp_path, capsys) -> None:
    out = tmp_path / "run"
    assert train(options(tiny_data, out, max_steps=15)) == 0
    lines = said(capsys)
    first_step = next(i for i, line in enumerate(lines) if line.split(" ", 2)[-1].startswith("training "))
    capped = [line for line in lines[:first_step] if "--max-steps 15 is past the end of the epochs" in line]
    assert len(capped) == 1 and "warning: " in capped[0], lines
    assert "--epochs 2 allow 12 steps" in capped[0] and "pass --epochs 3 to reach step 15" in capped[0]
    assert load_checkpoint(out / "latest.pth")["progress"]["step"] == 12

    # A larger --max-steps alone cannot help: the advice names --epochs, with the value that reaches it.
    assert train(options(tiny_data, out, max_steps=15, resume="auto")) == 0
    (nothing,) = [line for line in said(capsys) if "nothing to do" in line]
    assert "already reached step 12 of 12: --epochs 2 end it, before --max-steps 15; pass --epochs 3" in nothing
    assert "pass a larger --max-steps" not in nothing

    # Following it trains on, to the step asked for.
    assert train(options(tiny_data, out, max_steps=15, epochs=3, resume="auto")) == 0
    assert not any("past the end of the epochs" in line for line in said(capsys))
    assert load_checkpoint(out / "latest.pth")["progress"]["step"] == 15

    # Now --max-steps ends the run: the advice names it.
    assert train(options(tiny_data, out, max_steps=15, epochs=3, resume="auto")) == 0
    (nothing,) = [line for line in said(capsys) if "nothing to do" in line]
    assert "--max-steps 15 ends it (its --epochs 3 end at step 18); pass a larger --max-steps" in nothing


def test_a_resume_of_another_folder_warns_that_the_output_folder_is_set_aside(tiny_data, tmp_path, capsys) -> None:
    run_a, run_b = tmp_path / "a", tmp_path / "b"
    assert train(options(tiny_data, run_a, max_steps=2)) == 0
    assert train(options(tiny_data, run_b, max_steps=6)) == 0  # model_step6.pth, latest.pth
    said(capsys)
    assert train(options(tiny_data, run_b, max_steps=4, resume=str(run_a / "latest.pth"))) == 0
    lines = said(capsys)
    first_step = next(i for i, line in enumerate(lines) if line.split(" ", 2)[-1].startswith("training "))
    warned = [line for line in lines[:first_step] if "is a checkpoint of another folder" in line]
    assert len(warned) == 1 and "warning: " in warned[0], lines
    assert f"({run_a})" in warned[0] and f"under {run_b / 'abandoned'}/" in warned[0]
    assert "pass --output-dir of a new folder to keep them in place" in warned[0]
    (moved,) = [line for line in lines if "of the abandoned branch moved to" in line]
    count = re.search(r"sets the (\d+) checkpoint\(s\) already there aside", warned[0])
    assert count and f": {count[1]} checkpoint(s) of the abandoned branch" in moved  # the count said is the count moved

    # A new folder has nothing to set aside: no warning.
    assert train(options(tiny_data, tmp_path / "c", max_steps=4, resume=str(run_a / "latest.pth"))) == 0
    assert not any("another folder" in line for line in said(capsys))
