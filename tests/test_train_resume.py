"""Exact resume through the real CLI: runs are SIGKILLed at random moments and at chosen crash points
(inside a checkpoint write, inside gradient accumulation, across epochs), resumed with --resume auto,
and must end bit-identical (torch.equal) to an uninterrupted run: parameters, optimizer state,
scheduler, progress and loss history.
"""

from __future__ import annotations

import contextlib
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
import yaml
from helpers import start, wait_for_training

from indextts_train.checkpoint.files import load_checkpoint
from indextts_train.checkpoint.verify import verify_checkpoint
from indextts_train.errors import UserError
from indextts_train.train.loop import RunSettings, resolve_settings, train

pytestmark = pytest.mark.slow  # every test here trains a tiny run or starts the CLI: seconds each

ROOT = Path(__file__).resolve().parents[1]
MAX_STEPS = 72  # 24 samples / effective batch 4 = 6 steps an epoch: 12 epochs


@pytest.fixture(scope="module")
def grown(tiny_data, tmp_path_factory) -> Path:
    """Tiny config with 150 text tokens over a 100-token base: vocab growth and frozen rows in play."""
    data = yaml.safe_load((ROOT / "configs" / "tiny.yaml").read_text())
    data["gpt"]["number_text_tokens"] = 150
    path = tmp_path_factory.mktemp("cfg") / "grown.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def cli_args(data: dict, config: Path, out: Path, workers: int) -> list[str]:
    return [sys.executable, "-m", "indextts_train", "train",
            "--train-manifest", str(data["train"]), "--val-manifest", str(data["val"]),
            "--config", str(config), "--base-checkpoint", str(data["base"]), "--output-dir", str(out),
            "--resume", "auto", "--batch-size", "2", "--grad-accumulation", "2", "--effective-batch-size", "4",
            "--num-workers", str(workers), "--max-steps", str(MAX_STEPS), "--epochs", "100",
            "--learning-rate", "3e-3", "--warmup-steps", "4", "--weight-decay", "0.1", "--seed", "11",
            "--save-interval", "2", "--val-interval", "5", "--log-interval", "1", "--keep-checkpoints", "2"]


def finish(proc: subprocess.Popen) -> tuple[int, str]:
    """Exit code and output. Data workers orphaned by a SIGKILL of the main process are killed too,
    else they hold the output pipe open until their watchdog notices (seconds). The output of these
    runs is far below a pipe's buffer, so waiting before reading cannot block the child."""
    code = proc.wait(timeout=900)  # a 72-step run takes over 300 s on a loaded 2-core machine
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    return code, proc.stdout.read()


def run_to_end(args: list[str]) -> str:
    code, output = finish(start(args))
    assert code == 0, output
    return output


def assert_same_final_state(a: Path, b: Path) -> None:
    got, want = load_checkpoint(a / "latest.pth"), load_checkpoint(b / "latest.pth")
    assert got["progress"] == want["progress"]
    assert set(got["model"]) == set(want["model"])
    for key, tensor in want["model"].items():
        assert torch.equal(got["model"][key], tensor), f"parameter {key} differs"
    assert got["optimizer"]["param_groups"] == want["optimizer"]["param_groups"]
    assert got["optimizer"]["state"].keys() == want["optimizer"]["state"].keys()
    for index, slots in want["optimizer"]["state"].items():
        for slot, tensor in slots.items():
            assert torch.equal(got["optimizer"]["state"][index][slot], tensor), f"optimizer {index}.{slot} differs"
    assert got["scheduler"] == want["scheduler"]
    assert got["history"] == want["history"]  # every logged loss, bit for bit


@pytest.fixture(scope="module")
def uninterrupted(tiny_data, grown, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("uninterrupted")
    run_to_end(cli_args(tiny_data, grown, out, workers=0))
    return out


# Crash points, POINT@STEP: `accumulation` is after the first micro-batch's backward of that step;
# `save_partial` dies with half the checkpoint written, `save_tmp_written` before its rename,
# `save_before_latest` after the rename but before latest.pth moves, `save_before_rotate` before old
# files are removed. Step 12 ends epoch 2, so `accumulation@13` dies in the first step of an epoch.
CRASH_POINTS = ["accumulation@3", "save_partial@4", "save_tmp_written@6", "save_before_latest@8",
                "save_before_rotate@10", "accumulation@13"]


def test_sigkill_anywhere_then_resume_is_bit_identical(tiny_data, grown, uninterrupted, tmp_path) -> None:
    """Restarts alternate between --num-workers 0 and 2, so this also shows that the worker count
    does not change what a step sees (the reference ran with 0 workers)."""
    out = tmp_path / "killed"
    restarts = 0

    def args() -> list[str]:
        return cli_args(tiny_data, grown, out, workers=2 * (restarts % 2))

    for point in CRASH_POINTS:  # deterministic kills at the points that matter
        code, output = finish(start(args(), env={"INDEXTTS_TRAIN_CRASH_AT": point}))
        restarts += 1
        assert code == -signal.SIGKILL, f"{point} did not fire:\n{output}"
        if point.startswith(("save_partial", "save_tmp_written")):  # really killed inside the write
            assert list(out.glob(".model_step*.tmp*")), point
    rng = random.Random(1000)
    random_restarts = kills = 0
    # And at random moments: 10 restarts, each killed a random moment after its loop starts. The
    # count is of restarts, not kills: a fast machine may finish the run before the last ones.
    while random_restarts < 10:
        proc = start(args())
        restarts += 1
        random_restarts += 1
        if not wait_for_training(proc):
            break  # an earlier restart completed the run: nothing left to kill
        time.sleep(rng.uniform(0.0, 0.4))
        proc.kill()
        code, _ = finish(proc)
        kills += code == -signal.SIGKILL
    assert kills >= 1, "no random kill landed before the run finished; raise MAX_STEPS"
    output = run_to_end(args())
    assert "resuming from" in output
    assert not list(out.glob(".model_step*.tmp*")), "stale temp files are cleaned up by the next save"
    assert_same_final_state(out, uninterrupted)


def test_async_save_killed_in_flight_resumes_exactly(tiny_data, grown, uninterrupted, tmp_path) -> None:
    """--async-save: the crash points below fire inside the background writer thread while the loop
    trains on; then random kills. The end state equals the synchronous uninterrupted run's."""
    out = tmp_path / "async"
    args = [*cli_args(tiny_data, grown, out, workers=0), "--async-save"]
    for point in ("save_partial@4", "save_before_latest@8"):
        code, output = finish(start(args, env={"INDEXTTS_TRAIN_CRASH_AT": point}))
        assert code == -signal.SIGKILL, f"{point} did not fire:\n{output}"
    proc = start(args)  # and once from outside: with save_interval 2 a save is in flight half the time
    if wait_for_training(proc):
        time.sleep(0.3)
        proc.kill()
    finish(proc)
    output = run_to_end(args)
    assert "resuming from" in output
    assert_same_final_state(out, uninterrupted)


def test_compile_then_kill_resumes_bit_identically(tiny_data, grown, tmp_path) -> None:
    def args(out: Path) -> list[str]:
        values = [*cli_args(tiny_data, grown, out, workers=0), "--compile"]
        values[values.index("--max-steps") + 1] = "8"
        return values

    run_to_end(args(tmp_path / "whole"))
    code, output = finish(start(args(tmp_path / "killed"), env={"INDEXTTS_TRAIN_CRASH_AT": "accumulation@5"}))
    assert code == -signal.SIGKILL, output
    assert "resuming from" in run_to_end(args(tmp_path / "killed"))
    assert_same_final_state(tmp_path / "killed", tmp_path / "whole")


def interrupt(args: list[str], *signals: int, group: bool = False) -> tuple[int, str]:
    """Start a run, let it train a moment, then send `signals` to its main process or, like a
    terminal's Ctrl+C, to its whole process group (data workers included)."""
    proc = start(args)
    assert wait_for_training(proc)
    time.sleep(0.3)
    for signum in signals:
        (os.killpg if group else os.kill)(proc.pid, signum)
    return finish(proc)


def test_sigterm_saves_exits_143_and_resumes_exactly(tiny_data, grown, uninterrupted, tmp_path) -> None:
    out = tmp_path / "term"
    args = cli_args(tiny_data, grown, out, 2)
    code, output = interrupt(args, signal.SIGTERM)
    assert code == 143, output
    assert "saved" in output and "--resume auto" in output
    assert verify_checkpoint(out / "latest.pth").status == "COMPLETE"
    run_to_end(args)
    assert_same_final_state(out, uninterrupted)


def test_ctrl_c_saves_130_and_second_ctrl_c_exits_at_once(tiny_data, grown, uninterrupted, tmp_path) -> None:
    out = tmp_path / "int"
    args = cli_args(tiny_data, grown, out, 2)
    code, output = interrupt(args, signal.SIGINT, group=True)
    assert code == 130, output
    assert "saved" in output
    proc = start(args)
    assert wait_for_training(proc)
    os.killpg(proc.pid, signal.SIGINT)
    for line in proc.stdout:  # the first is acknowledged at once; the step and its save are still to come
        if line.startswith("Ctrl+C: stopping after this step"):
            break
    os.killpg(proc.pid, signal.SIGINT)  # the second exits at once, saying so in one line
    code, output = finish(proc)
    assert code == 130
    assert output.count("Ctrl+C again: exiting now without saving (exit 130)") == 1, output
    for path in [out / "latest.pth", *out.glob("model_step*.pth")]:
        assert verify_checkpoint(path).status == "COMPLETE", path
    run_to_end(args)
    assert_same_final_state(out, uninterrupted)


def test_corrupt_latest_is_skipped_and_left_on_disk(tiny_data, grown, tmp_path) -> None:
    out = tmp_path / "corrupt"
    args = cli_args(tiny_data, grown, out, 0)
    args[args.index("--max-steps") + 1] = "8"
    run_to_end(args)
    latest = out / "latest.pth"
    size = latest.stat().st_size
    with open(latest, "r+b") as handle:  # in place: latest.pth and the file it links to are both cut
        handle.truncate(size // 2)
    args[args.index("--max-steps") + 1] = "10"
    output = run_to_end(args)
    assert "skipping" in output and "latest.pth" in output
    assert "resuming from" in output and "model_step6.pth" in output
    assert (out / "model_step8.pth").exists()  # the damaged twin of the old latest.pth is left on disk
    assert load_checkpoint(out / "latest.pth")["progress"]["step"] == 10


def options(data: dict, config: Path, out: Path, **overrides) -> RunSettings:
    values = dict(train_manifests=[data["train"]], val_manifests=[data["val"]], output_dir=out, config=config,
                  base_checkpoint=data["base"], batch_size=2, grad_accumulation=2, effective_batch_size=4,
                  num_workers=0, max_steps=12, epochs=100, learning_rate=3e-3, warmup_steps=2, log_interval=1,
                  val_interval=6, save_interval=6, tensorboard=False, resume="auto", seed=5)
    values.update(overrides)
    return resolve_settings(**values)


def bigger_vocab(config: Path, tmp_path: Path, tokens: int) -> Path:
    data = yaml.safe_load(config.read_text())
    data["gpt"]["number_text_tokens"] = tokens
    path = tmp_path / f"vocab{tokens}.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


@pytest.mark.parametrize("mode", ["keep", "reset"])
def test_vocab_change_between_runs(tiny_data, grown, tmp_path, capsys, mode) -> None:
    out = tmp_path / "run"
    assert train(options(tiny_data, grown, out, max_steps=12)) == 0
    before = load_checkpoint(out / "latest.pth")
    first_run = {name: (out / name).read_bytes() for name in ("model_step6.pth", "model_step12.pth")}
    capsys.readouterr()
    assert train(options(tiny_data, bigger_vocab(grown, tmp_path, 170), out, max_steps=36,
                         on_vocab_change=mode, keep_checkpoints=1)) == 0
    printed = capsys.readouterr().out
    assert "vocabulary changed: 150 -> 170" in printed
    after = load_checkpoint(out / "latest.pth")
    emb = after["model"]["text_embedding.weight"]
    assert emb.shape[0] == 171
    base = torch.load(tiny_data["base"], weights_only=True)["text_embedding.weight"]
    assert torch.equal(emb[:100], base[:100]) and torch.equal(emb[170], base[100])  # frozen through both runs
    losses = [row[1] for row in after["history"]["train"]]
    assert sum(losses[-4:]) / 4 < sum(losses[:4]) / 4  # still learning after the change
    if mode == "keep":
        assert "optimizer state kept" in printed
        assert after["history"]["train"][:12] == before["history"]["train"]
        assert after["progress"]["step"] == 36
    else:
        assert "reset together" in printed
        assert after["history"]["train"][0][0] == 1 and len(after["history"]["train"]) == 36
        # The reset run is a new branch from step 0: the first run's files were set aside, not
        # overwritten by its model_step6/12 nor rotated away (issue 23).
        assert after["lineage"]["parent"] == before["lineage"]["branch"] and after["lineage"]["forks"] == []
        kept = out / "abandoned" / before["lineage"]["branch"]
        assert {name: (kept / name).read_bytes() for name in first_run} == first_run


def test_a_changed_sort_window_on_resume_says_the_order_keeps_the_checkpoints(tiny_data, grown, tmp_path,
                                                                              capsys) -> None:
    out = tmp_path / "run"
    assert train(options(tiny_data, grown, out, max_steps=6)) == 0
    saved = load_checkpoint(out / "latest.pth")["sampler"]["sort_window"]
    capsys.readouterr()
    assert train(options(tiny_data, grown, out, max_steps=7, sort_window=2)) == 0
    assert "the sort window changed: the data order keeps the checkpoint's" in capsys.readouterr().out
    assert load_checkpoint(out / "latest.pth")["sampler"]["sort_window"] == saved != 2


def test_a_changed_model_is_refused_on_resume(tiny_data, grown, tmp_path) -> None:
    """gpt.heads changes no tensor's shape, so the weights loaded, and the run went on training another
    model under them. Refused before any work, naming the key; the checkpoints stay as they were."""
    out = tmp_path / "run"
    assert train(options(tiny_data, grown, out, max_steps=6)) == 0
    data = yaml.safe_load(grown.read_text())
    data["gpt"]["heads"] *= 2
    changed = tmp_path / "heads.yaml"
    changed.write_text(yaml.safe_dump(data))
    before = {p.name: p.read_bytes() for p in out.glob("*.pth")}
    with pytest.raises(UserError, match=rf"--config {changed} changes the model .*latest.pth was trained as "
                                        rf"\(gpt.heads {data['gpt']['heads'] // 2} -> {data['gpt']['heads']}\)"):
        train(options(tiny_data, changed, out, max_steps=12))
    assert {p.name: p.read_bytes() for p in out.glob("*.pth")} == before
    assert train(options(tiny_data, bigger_vocab(grown, tmp_path, 170), out, max_steps=12)) == 0  # a grown
    # vocabulary is the tokenizer's change, which the vocabulary plan handles


def test_smaller_micro_batch_on_resume_continues_from_the_same_sample(tiny_data, grown, tmp_path, capsys) -> None:
    out = tmp_path / "run"
    assert train(options(tiny_data, grown, out, max_steps=7)) == 0  # stops mid-epoch (6 steps an epoch)
    before = load_checkpoint(out / "latest.pth")["progress"]
    capsys.readouterr()
    # The usual OOM fix: half the micro-batch, twice the accumulation; and a new learning rate.
    assert train(options(tiny_data, grown, out, max_steps=12, batch_size=1, grad_accumulation=4,
                         learning_rate=1e-3)) == 0
    printed = capsys.readouterr().out
    assert "micro_batch: 2 -> 1" in printed and "grad_accumulation: 2 -> 4" in printed
    assert "same effective batch: training continues from the same sample" in printed
    assert "resuming on another setup (micro-batch 2 -> 1, accumulation 2 -> 4): training continues" in printed
    assert "learning rate changed" in printed
    assert f"starting at step 7 (epoch {before['epoch']}, sample {before['samples_in_epoch']})" in printed
    after = load_checkpoint(out / "latest.pth")
    assert after["progress"]["samples_total"] == before["samples_total"] + 5 * 4
    assert after["scheduler"]["base_lrs"] == [1e-3, 1e-3]  # the new peak LR took effect


def test_a_resume_with_another_cpu_thread_count_says_it_rounds_differently(tiny_data, grown, tmp_path,
                                                                          capsys) -> None:
    """On the CPU the thread count splits every sum: the run continues, and says it is not bit for bit."""
    out, threads = tmp_path / "run", torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        assert train(options(tiny_data, grown, out, max_steps=2)) == 0
        assert "1 torch thread(s)" in capsys.readouterr().out
        torch.set_num_threads(3)
        assert train(options(tiny_data, grown, out, max_steps=4)) == 0
        assert "resuming on another setup (torch threads 1 -> 3): training continues from the same sample" \
            in capsys.readouterr().out
        assert train(options(tiny_data, grown, out, max_steps=6)) == 0
        assert "another setup" not in capsys.readouterr().out  # the same setup again: nothing to say
    finally:
        torch.set_num_threads(threads)


def test_changed_effective_batch_is_allowed_with_a_warning(tiny_data, grown, tmp_path, capsys) -> None:
    out = tmp_path / "run"
    assert train(options(tiny_data, grown, out, max_steps=6)) == 0
    capsys.readouterr()
    assert train(options(tiny_data, grown, out, max_steps=8, effective_batch_size=8, grad_accumulation=4)) == 0
    printed = capsys.readouterr().out
    assert "effective batch changed" in printed
    assert load_checkpoint(out / "latest.pth")["progress"]["samples_total"] == 6 * 4 + 2 * 8


@pytest.mark.slow
@pytest.mark.parametrize(("first", "then"), [((2, 2, 4), (2, 4, 8)), ((2, 4, 8), (2, 2, 4))],
                         ids=["larger", "smaller"])
def test_a_changed_effective_batch_keeps_the_epochs_and_the_schedule_in_samples(tiny_data, grown, tmp_path,
                                                                                 capsys, first, then) -> None:
    """2 epochs of 24 samples: stop after 32 samples (epoch 1, sample 8), resume at another effective batch.
    The run ends after exactly 48 samples, where the cosine schedule ends: no "nothing to do", no extra epoch."""
    out = tmp_path / "run"
    micro, accumulation, effective = first
    assert train(options(tiny_data, grown, out, batch_size=micro, grad_accumulation=accumulation,
                         effective_batch_size=effective, max_steps=32 // effective, epochs=2, min_lr_ratio=0.1)) == 0
    capsys.readouterr()
    micro, accumulation, effective = then
    assert train(options(tiny_data, grown, out, batch_size=micro, grad_accumulation=accumulation,
                         effective_batch_size=effective, max_steps=0, epochs=2, min_lr_ratio=0.1)) == 0
    printed = capsys.readouterr().out
    assert "nothing to do" not in printed
    after = load_checkpoint(out / "latest.pth")
    progress = after["progress"]
    assert (progress["epoch"], progress["samples_in_epoch"], progress["samples_total"]) == (1, 24, 48)
    assert progress["step"] == 32 // first[2] + 16 // effective
    assert after["optimizer"]["param_groups"][0]["lr"] == 3e-3 * 0.1  # the schedule's end, in samples
