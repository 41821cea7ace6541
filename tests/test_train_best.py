"""Issue 13 through the CLI: best.pth, milestones, per-language validation against the base model,
weighted mixing with kill + resume, early stopping, the forgetting limit, export of best/latest."""

from __future__ import annotations

import contextlib
import json
import math
import os
import signal
import sys
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import write_dataset
from helpers import start
from typer.testing import CliRunner

from indextts_train.checkpoint.files import load_checkpoint
from indextts_train.cli import app
from indextts_train.data.sampling import SamplerSpec, epoch_order
from indextts_train.train.best import BestTracker, verdict
from indextts_train.ui.text_log import unstamp

pytestmark = pytest.mark.slow  # every test here trains a tiny run or starts the CLI: seconds each

ROOT = Path(__file__).resolve().parents[1]
LOSSES = ("loss", "text_loss", "mel_loss", "mel_top1")


@pytest.fixture(scope="module")
def langs(tiny_data, tmp_path_factory) -> dict:
    """am: the new language (24 lines); zh: replay data (16 lines); a validation manifest of each."""
    folder = tmp_path_factory.mktemp("langs")
    return {"am": write_dataset(folder, 24, seed=21, name="am.jsonl"),
            "zh": write_dataset(folder, 16, seed=22, name="zh.jsonl"),
            "val_am": write_dataset(folder, 6, seed=23, name="val_am.jsonl"),
            "val_zh": write_dataset(folder, 4, seed=24, name="val_zh.jsonl"),
            "base": tiny_data["base"], "config": tiny_data["config"], "folder": folder}


def train_args(langs: dict, out: Path, *extra: str) -> list[str]:
    return ["train", "--train-manifest", f"{langs['am']}::am", "--train-manifest", f"{langs['zh']}::zh@0.25",
            "--val-manifest", f"{langs['val_am']}::am", "--val-manifest", f"{langs['val_zh']}::zh",
            "--config", str(langs["config"]), "--base-checkpoint", str(langs["base"]), "--output-dir", str(out),
            "--resume", "auto", "--batch-size", "2", "--grad-accumulation", "2", "--effective-batch-size", "4",
            "--num-workers", "0", "--epochs", "100", "--learning-rate", "3e-3", "--warmup-steps", "2",
            "--log-interval", "2", "--val-interval", "2", "--keep-checkpoints", "1", *extra]


def cli(*args: object):
    result = CliRunner().invoke(app, [str(a) for a in args])
    assert result.exception is None or isinstance(result.exception, SystemExit), result.exception
    return result


def run_until(args: list[str], marker: str | None) -> tuple[int | None, str]:
    """The real CLI; SIGKILLed (its whole group) as soon as a line contains `marker`."""
    proc = start([sys.executable, "-m", "indextts_train", *args])
    seen = []
    for line in proc.stdout:
        seen.append(line)
        if marker is not None and marker in line:
            os.killpg(proc.pid, signal.SIGKILL)
            break
    code = proc.wait(timeout=300)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    return (None if marker is not None and code == -signal.SIGKILL else code), "".join(seen)


def assert_same_state(a: dict, b: dict) -> None:
    assert a["model"].keys() == b["model"].keys()
    step = a["progress"]["step"]
    differ = [k for k in a["model"] if not torch.equal(a["model"][k], b["model"][k])]
    assert not differ, f"at step {step}: {len(differ)} weights differ, first {differ[:3]}"
    for index, state in a["optimizer"]["state"].items():
        for name, value in state.items():
            assert torch.equal(value, b["optimizer"]["state"][index][name]), (index, name)
    assert a["progress"] == b["progress"] and a["history"] == b["history"] and a["sampler"] == b["sampler"]


@pytest.fixture(scope="module")
def mixed_run(langs, tmp_path_factory) -> dict:
    """One uninterrupted run and one SIGKILLed twice (inside the run, once right at a new best)."""
    args = ["--max-steps", "12", "--save-interval", "4", "--keep-every", "4"]
    plain = tmp_path_factory.mktemp("plain") / "run"
    code, log = run_until(train_args(langs, plain, *args), None)
    assert code == 0, log
    killed = tmp_path_factory.mktemp("killed") / "run"
    kills = 0
    for marker in ("val step 6:", "step 10/12", None):
        code, output = run_until(train_args(langs, killed, *args), marker)
        kills += code is None
        assert "another setup" not in output, output  # bit for bit needs the same setup
    assert code == 0 and kills == 2
    return {"plain": plain, "killed": killed, "log": log}


def test_mixing_resumes_bit_identically_and_keeps_best_and_milestones(mixed_run) -> None:
    plain, killed = mixed_run["plain"], mixed_run["killed"]
    for step in (4, 8, 10, 12):  # step by step: the first step whose weights differ is where a resume went wrong
        name = f"model_step{step}.pth"
        assert_same_state(load_checkpoint(plain / name), load_checkpoint(killed / name))
    for name in ("latest.pth", "best.pth"):
        assert_same_state(load_checkpoint(plain / name), load_checkpoint(killed / name))
    state = load_checkpoint(killed / "latest.pth")
    val = state["history"]["val"]
    best_step = min(val, key=lambda row: row[1])[0]
    assert [row[0] for row in val] == [2, 4, 6, 8, 10, 12]
    assert load_checkpoint(killed / "best.pth")["progress"]["step"] == best_step
    # --keep-checkpoints 1: the newest checkpoint that is not a milestone survives rotation (milestones, every
    # 4 steps, do not count toward it), besides the milestones and best.pth.
    assert sorted(p.name for p in killed.glob("model_step*.pth")) == ["model_step10.pth", "model_step12.pth",
                                                                      "model_step4.pth", "model_step8.pth"]
    rows = json.loads(cli("checkpoints", killed, "--json").stdout)
    assert {row["step"] for row in rows if row["milestone"]} == {4, 8, 12}
    assert [row["step"] for row in rows if row["best"]] == [best_step]
    assert [row["step"] for row in rows if row["latest"]] == [12]


def test_weighted_mixing_draws_each_share(mixed_run) -> None:
    """The order recorded in the checkpoint: am (24 lines) once an epoch, zh (16 lines) 25% of it."""
    state = load_checkpoint(mixed_run["killed"] / "latest.pth")
    spec = SamplerSpec.from_state_dict(state["sampler"])
    assert spec.rule == 2 and [(s.lang, s.weight) for s in spec.sources] == [("am", None), ("zh", 0.25)]
    lengths = np.ones(40, dtype=np.int64)
    orders = [epoch_order(spec, lengths, epoch) for epoch in range(8)]
    assert all((np.sum(o < 24), np.sum(o >= 24)) == (24, 8) for o in orders)  # 24 + 8 = 32 = 8 steps of 4
    drawn = np.concatenate(orders)
    assert Counter(drawn[drawn >= 24].tolist()) == {i: 4 for i in range(24, 40)}  # 8 epochs x 8 = 4 passes of zh
    assert "zh.jsonl [zh] (@0.25): 8 (25.0%), 0.50 of its 16 lines per epoch" in mixed_run["log"]


def test_per_language_validation_and_base_baseline_equal_evaluate(mixed_run, langs) -> None:
    history = load_checkpoint(mixed_run["killed"] / "latest.pth")["history"]
    last = history["val_groups"][-1]
    assert last["step"] == 12 and set(last["groups"]) == {"am", "zh"}
    for lang in ("am", "zh"):
        alone = json.loads(cli("evaluate", "--checkpoint", mixed_run["killed"] / "latest.pth", "--manifest",
                               langs[f"val_{lang}"], "--batch-size", 2, "--json").stdout)
        assert {k: alone[k] for k in LOSSES} == {k: last["groups"][lang][k] for k in LOSSES}
        base = json.loads(cli("evaluate", "--checkpoint", langs["base"], "--config", langs["config"], "--manifest",
                              langs[f"val_{lang}"], "--batch-size", 2, "--json").stdout)
        assert {k: base[k] for k in LOSSES} == {k: history["baseline"]["groups"][lang][k] for k in LOSSES}
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(next((mixed_run["plain"] / "logs").iterdir())))
    events.Reload()
    assert {f"val/{lang}/{key}" for lang in ("am", "zh") for key in LOSSES} <= set(events.Tags()["scalars"])
    assert [e.step for e in events.Scalars("val/zh/loss")] == [0, 2, 4, 6, 8, 10, 12]
    log = mixed_run["log"]
    assert "val step 0 (before training): loss" in log
    line = next(line for line in unstamp(log).splitlines() if line.startswith("val step 12:"))
    am = last["groups"]["am"]["loss"]
    change = 100 * (am - history["baseline"]["groups"]["am"]["loss"]) / history["baseline"]["groups"]["am"]["loss"]
    assert f"| am {am:.4f} ({change:+.1f}%)" in line and "vs base)" in line


@pytest.mark.parametrize("save_mode", [[], ["--async-save"]], ids=["sync", "async"])
def test_early_stopping_ends_with_best_and_export_says_which_step(langs, tmp_path, save_mode) -> None:
    """With --async-save too: best.pth is published by the background writer, and the early stop
    waits for the last save before it reports."""
    out = tmp_path / "run"
    # A learning rate far below float32 resolution: the weights never change, so no validation improves.
    args = train_args(langs, out, "--learning-rate", "1e-30", "--early-stop-patience", "2", "--max-steps", "40",
                      "--save-interval", "100", *save_mode)
    result = cli(*args)
    assert result.exit_code == 0, result.output
    assert "early stop at step 6: 2 validation(s) without a better loss; best.pth is step 2" in result.output
    assert load_checkpoint(out / "best.pth")["progress"]["step"] == 2
    assert load_checkpoint(out / "latest.pth")["progress"]["step"] == 6
    assert not (out / "model_step2.pth").exists()  # rotated away; best.pth keeps it
    again = cli(*args)
    assert again.exit_code == 0 and "nothing to do" in again.output and "early stop at step 6" in again.output
    exported = cli("export", out, "-o", tmp_path / "gpt.pth")
    assert exported.exit_code == 0 and f"exported {out / 'best.pth'} (step 2, val loss" in exported.output
    latest = cli("export", out, "--pick", "latest", "-o", tmp_path / "gpt.pth", "--force")
    assert f"exported {out / 'latest.pth'} (step 6, val loss" in latest.output


def disjoint_language(folder: Path) -> dict:
    """new: text ids 2..59 (train and val); old: ids 60..99, never trained, so learning new makes old worse."""
    data = {"new": write_dataset(folder, 24, seed=31, text_vocab=60, name="new.jsonl"),
            "val_new": write_dataset(folder, 6, seed=33, text_vocab=60, name="val_new.jsonl"),
            "old": write_dataset(folder, 6, seed=32, text_vocab=40, name="old.jsonl")}
    for line in data["old"].read_text().splitlines():
        path = folder / json.loads(line)["target_text_ids_path"]
        np.save(path, (np.load(path) + 58).astype(np.int32))
    return data


def test_forgetting_limit_stops_and_names_the_best_checkpoint_within_it(langs, tmp_path) -> None:
    out, data = tmp_path / "run", disjoint_language(tmp_path / "data")
    result = cli("train", "--train-manifest", data["new"], "--val-manifest", f"{data['val_new']}::new",
                 "--val-manifest", f"{data['old']}::old", "--config", langs["config"], "--base-checkpoint",
                 langs["base"], "--output-dir", out, "--batch-size", 4, "--grad-accumulation", 1,
                 "--effective-batch-size", 4, "--num-workers", 0, "--learning-rate", 1e-2, "--warmup-steps", 1,
                 "--max-steps", 40, "--val-interval", 2, "--save-interval", 100, "--keep-checkpoints", 1,
                 "--forgetting-limit", "old=5")
    assert result.exit_code == 0, result.output
    stop = next(line for line in unstamp(result.output).splitlines() if line.startswith("forgetting limit reached"))
    assert "old loss" in stop and "(limit 5%)" in stop
    history = load_checkpoint(out / "latest.pth")["history"]
    base = history["baseline"]["groups"]["old"]["loss"]
    assert history["val_groups"][-1]["groups"]["old"]["loss"] > base * 1.05  # the run stopped at the breach
    within = [g["step"] for g in history["val_groups"] if g["groups"]["old"]["loss"] <= base * 1.05]
    if within:
        best = min(within, key=lambda step: next(row[1] for row in history["val"] if row[0] == step))
        assert f"best.pth is step {best} (loss" in stop
        assert load_checkpoint(out / "best.pth")["progress"]["step"] == best
    else:
        assert "there is no best.pth" in stop and not (out / "best.pth").exists()


def test_bad_flags_are_one_line(langs, tmp_path) -> None:
    cases = {("--train-manifest", f"{langs['zh']}@0.5::zh"): "the language goes before the weight",
             ("--best-metric", "de/loss"): "--best-metric de/loss",
             ("--forgetting-limit", "de=5"): "'de', which is not a validation group",
             ("--keep-every", "-1"): "keep_every"}
    for extra, words in cases.items():
        result = cli(*train_args(langs, tmp_path / "x", *extra))
        assert result.exit_code == 2 and words in result.stderr, result.output
        assert len(result.stderr.strip().splitlines()) == 1


def test_a_validation_that_diverged_is_never_best() -> None:
    """A NaN loss (a run driven to divergence: --learning-rate 1e9) compared as no worse than nothing, so
    best.pth named the broken model; it now counts as a validation without a new best."""
    tracker = BestTracker("loss")
    assert not tracker.update(math.nan, 3) and not tracker.update(math.inf, 4)
    assert (tracker.step, tracker.stale) == (None, 2) and "no validation qualified" in tracker.describe()
    assert tracker.update(3.5, 5) and not tracker.update(math.nan, 6)
    assert (tracker.step, tracker.value, tracker.stale) == (5, 3.5, 1)


def test_a_listen_metric_is_said_as_heard_checkpoints_not_validations() -> None:
    """--best-metric listen/...: the tracker counts heard checkpoints, and its scores arrive from listen after the
    saves, so the end of a run may come before any (or the best) was heard: said so, with what ranks them all."""
    tracker = BestTracker("listen/cer")
    assert tracker.describe() == ("no checkpoint was heard before this point, so there is no best.pth; "
                                  "`export --pick cer` ranks the checkpoints heard after it too")
    tracker.update(0.3, 2)
    tracker.update(0.4, 4)
    assert tracker.describe().startswith("best.pth is step 2 (listen/cer 0.3000; the best heard so far: ")
    ended = verdict(tracker, {}, 4, baseline=None, limits={}, patience=1)
    assert ended.startswith("early stop at step 4: 1 heard checkpoint(s) without a better listen/cer; ")
    loss = BestTracker("loss")
    loss.update(1.0, 2)
    loss.update(2.0, 4)
    assert verdict(loss, {}, 4, baseline=None, limits={}, patience=1) == (
        "early stop at step 4: 1 validation(s) without a better loss; best.pth is step 2 (loss 1.0000)")
