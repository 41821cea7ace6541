"""The training loop in-process on the tiny config: learning, frozen rows, OOM retry, logs, bad input."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import yaml

from indextts_train.checkpoint.files import load_checkpoint
from indextts_train.errors import UserError
from indextts_train.model.gpt import UnifiedVoiceGPT
from indextts_train.train import loop as train_mod
from indextts_train.train.loop import RunSettings, lr_factor, resolve_settings, train
from indextts_train.ui.text_log import unstamp

pytestmark = pytest.mark.slow  # every test here trains a tiny run or starts the CLI: seconds each

TEXT_KEYS = ("text_embedding.weight", "text_head.weight", "text_head.bias")


def options(data: dict, out: Path, **overrides) -> RunSettings:
    values = dict(train_manifests=[data["train"]], val_manifests=[data["val"]], output_dir=out,
                  config=data["config"], base_checkpoint=data["base"], batch_size=2, grad_accumulation=2,
                  effective_batch_size=4, num_workers=0, max_steps=12, epochs=100, learning_rate=3e-3,
                  warmup_steps=2, log_interval=2, val_interval=6, save_interval=6, tensorboard=False)
    values.update(overrides)
    if not values["val_manifests"]:
        del values["val_interval"]  # read at validations only: named without them, it is refused
    return resolve_settings(**values)


def grown_config(tmp_path: Path, tokens: int = 150) -> Path:
    """The tiny config with a larger text vocabulary, as if the tokenizer had been extended."""
    data = yaml.safe_load(Path(train_mod.__file__).resolve().parents[2].joinpath("configs/tiny.yaml").read_text())
    data["gpt"]["number_text_tokens"] = tokens
    path = tmp_path / "grown.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def test_lr_schedule_warms_up_then_decays() -> None:
    factors = [lr_factor(s, 4, 20, 0.1) for s in range(25)]
    assert factors[:4] == [0.25, 0.5, 0.75, 1.0]
    assert all(a >= b for a, b in zip(factors[3:-1], factors[4:], strict=True))
    assert factors[20] == pytest.approx(0.1) and factors[24] == pytest.approx(0.1)


def test_loss_falls_and_checkpoints_are_written(tiny_data, tmp_path) -> None:
    out = tmp_path / "run"
    assert train(options(tiny_data, out, max_steps=40, save_interval=20, val_interval=20)) == 0
    state = load_checkpoint(out / "latest.pth")
    losses = [row[1] for row in state["history"]["train"]]
    assert len(losses) == 20
    assert sum(losses[-3:]) / 3 < 0.75 * sum(losses[:3]) / 3, losses
    val = state["history"]["val"]
    assert [row[0] for row in val] == [20, 40] and val[-1][1] < val[0][1]
    assert state["history"]["best_val_loss"] == min(row[1] for row in val)
    assert state["progress"]["step"] == 40
    assert sorted(p.name for p in out.glob("model_step*.pth")) == ["model_step20.pth", "model_step40.pth"]


def test_base_rows_stay_bit_identical_with_weight_decay(tiny_data, tmp_path) -> None:
    base = torch.load(tiny_data["base"], weights_only=True)
    out = tmp_path / "run"
    assert train(options(tiny_data, out, config=grown_config(tmp_path), weight_decay=0.5)) == 0
    model = load_checkpoint(out / "latest.pth")["model"]
    for key in TEXT_KEYS:
        assert model[key].shape[0] == 151
        assert torch.equal(model[key][:100], base[key][:100]), key  # base ids, bit for bit
        assert torch.equal(model[key][150], base[key][100]), key  # the extra row, moved to the end
    assert not torch.equal(model["gpt.h.0.attn.c_attn.weight"], base["gpt.h.0.attn.c_attn.weight"])


def test_unfreeze_flag_trains_base_rows(tiny_data, tmp_path) -> None:
    base = torch.load(tiny_data["base"], weights_only=True)
    out = tmp_path / "run"
    assert train(options(tiny_data, out, config=grown_config(tmp_path), freeze_base_vocab=False, max_steps=4)) == 0
    model = load_checkpoint(out / "latest.pth")["model"]
    assert not torch.equal(model["text_embedding.weight"][:100], base["text_embedding.weight"][:100])


def test_oom_halves_micro_batch_and_retries_the_same_samples(tiny_data, tmp_path, monkeypatch, capsys) -> None:
    reference_out = tmp_path / "reference"
    # No validation: its baseline before step 1 would meet the OOM first (and halve it the same way).
    assert train(options(tiny_data, reference_out, batch_size=2, grad_accumulation=4, effective_batch_size=8,
                         max_steps=4, dropout=0.0, val_manifests=[])) == 0

    original = UnifiedVoiceGPT.compute_losses

    def flaky(self, batch):
        if len(batch) > 2:  # a micro-batch of 4 "does not fit"
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
        return original(self, batch)

    monkeypatch.setattr(UnifiedVoiceGPT, "compute_losses", flaky)
    out = tmp_path / "oom"
    # Auto micro-batch on CPU picks 8: it "runs out of memory" at 8, then at 4, and trains at 2 x 4.
    assert train(options(tiny_data, out, batch_size=0, grad_accumulation=0, effective_batch_size=8,
                         max_steps=4, dropout=0.0, val_manifests=[])) == 0
    printed = capsys.readouterr().out
    assert "micro-batch 4 x accumulation 2" in printed and "micro-batch 2 x accumulation 4" in printed
    got, want = load_checkpoint(out / "latest.pth"), load_checkpoint(reference_out / "latest.pth")
    assert (got["hardware"]["micro_batch"], got["hardware"]["grad_accumulation"]) == (2, 4)
    assert got["progress"]["samples_total"] == want["progress"]["samples_total"] == 32
    for key, tensor in want["model"].items():  # the same samples, none lost or repeated
        assert torch.equal(got["model"][key], tensor), key

    # Remembered: the resumed run starts at the micro-batch that fit, without another OOM.
    assert train(options(tiny_data, out, batch_size=0, grad_accumulation=0, effective_batch_size=8,
                         max_steps=6, dropout=0.0, resume="auto", val_manifests=[])) == 0
    printed = capsys.readouterr().out
    assert "ran out of memory above micro-batch 2" in printed and "CUDA out of memory" not in printed


def test_plain_log_lines_and_tensorboard_scalars(tiny_data, tmp_path, capsys) -> None:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    out = tmp_path / "run"
    assert train(options(tiny_data, out, tensorboard=True, max_steps=6, log_interval=2)) == 0
    printed = capsys.readouterr().out
    steps = [line.split()[1] for line in unstamp(printed).splitlines() if line.startswith("step ")]
    assert steps == ["2/6", "4/6", "6/6"]
    assert "samples/s" in printed and "done: 6 steps" in printed
    (run_dir,) = (out / "logs").iterdir()
    events = EventAccumulator(str(run_dir))
    events.Reload()
    tags = set(events.Tags()["scalars"])
    for name in ("text_loss", "mel_loss", "mel_top1"):
        assert f"train/{name}" in tags and f"val/{name}" in tags
    assert {"train/lr", "train/grad_norm", "train/samples_per_s"} <= tags
    assert [e.step for e in events.Scalars("train/mel_loss")] == [2, 4, 6]


def test_existing_checkpoints_without_resume_are_not_overwritten(tiny_data, tmp_path) -> None:
    out = tmp_path / "run"
    assert train(options(tiny_data, out, max_steps=6)) == 0
    before = (out / "latest.pth").read_bytes()
    with pytest.raises(UserError, match="already holds checkpoints .*; pass --resume auto"):
        train(options(tiny_data, out, max_steps=12))
    assert (out / "latest.pth").read_bytes() == before


def test_resume_auto_on_finished_run_does_nothing(tiny_data, tmp_path, capsys) -> None:
    out = tmp_path / "run"
    assert train(options(tiny_data, out, max_steps=6)) == 0
    assert train(options(tiny_data, out, max_steps=6, resume="auto")) == 0
    assert (f"nothing to do: the run in {out} already reached step 6 of 6: --max-steps 6 ends it (its --epochs 100 "
            "end at step 600); pass a larger --max-steps to train on") in capsys.readouterr().out  # what to do, too


def test_out_of_vocabulary_ids_name_the_manifest_line(tiny_data, tmp_path) -> None:
    small = grown_config(tmp_path, tokens=100)
    text = small.read_text().replace("number_text_tokens: 100", "number_text_tokens: 50")
    small.write_text(text)
    message = r"train\.jsonl:\d+: target_text_ids_path holds id \d+, outside \[0, 50\) .*; pass the .*--tokenizer"
    with pytest.raises(UserError, match=message):
        train(options(tiny_data, tmp_path / "run", config=small, base_checkpoint=None, max_steps=2, val_manifests=[]))


@pytest.mark.parametrize("family", ["IndexTTS2", "IndexTTS-2.5"])
def test_status_line_on_a_terminal_and_one_plain_line_per_interval(request, tmp_path, capsys, monkeypatch,
                                                                    family) -> None:
    import re
    import sys

    monkeypatch.setattr(sys.stdout, "isatty", lambda: True)
    monkeypatch.setenv("COLUMNS", "80")
    if family == "IndexTTS2":
        run = options(request.getfixturevalue("tiny_data"), tmp_path / "run", max_steps=6, log_interval=2)
    else:
        data = request.getfixturevalue("tiny25_data")
        run = options(data, tmp_path / "run", max_steps=6, log_interval=2, tokenizer=data["tokenizer"])
    assert train(run) == 0
    screen = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", capsys.readouterr().out)  # drop cursor moves and colours
    drawn = [part for line in screen.split("\n") for part in line.split("\r") if part.strip()]
    live = [part for part in drawn if re.match(r"step \d+/6 \[[#-]+\] ETA ", part)]
    assert live and all(len(part) <= 80 for part in live)
    for step in (2, 4, 6):  # the scrollback keeps exactly one plain line per log interval
        assert len([part for part in map(unstamp, drawn) if part.startswith(f"step {step}/6 epoch 0 loss ")]) == 1


def test_signals_only_set_a_flag_and_map_to_exit_codes() -> None:
    import os
    import signal

    from indextts_train.train.loop import SignalFlag

    for signum, code in ((signal.SIGINT, 130), (signal.SIGTERM, 143), (signal.SIGHUP, 129)):
        before = signal.getsignal(signum)
        flag = SignalFlag()
        os.kill(os.getpid(), signum)  # handled: the process keeps running until the step boundary
        assert flag.exit_code == code
        flag.uninstall()
        assert signal.getsignal(signum) == before


# ---- the loop's loose ends (issue 23) --------------------------------------------------------------


@pytest.mark.slow
def test_oom_at_micro_batch_1_saves_the_steps_since_the_last_checkpoint(tiny_data, tmp_path, monkeypatch) -> None:
    original, calls = UnifiedVoiceGPT.compute_losses, []

    def full_after_step_3(self, batch):
        calls.append(1)
        if len(calls) > 3 * 4:  # 4 micro-batches a step: step 4 "does not fit", even at micro-batch 1
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
        return original(self, batch)

    monkeypatch.setattr(UnifiedVoiceGPT, "compute_losses", full_after_step_3)
    out = tmp_path / "run"
    with pytest.raises(UserError) as raised:
        train(options(tiny_data, out, batch_size=1, grad_accumulation=4, val_manifests=[], save_interval=6))
    message = str(raised.value)
    assert "out of memory at micro-batch 1" in message and "step 3, the last completed one, is saved" in message
    assert load_checkpoint(out / "latest.pth")["progress"]["step"] == 3


class RecordingWriter:
    def __init__(self) -> None:
        self.closed = False

    def add_scalar(self, tag: str, value: float, step: int) -> None:
        pass

    def flush(self) -> None:
        pass

    def close(self) -> None:
        self.closed = True


@pytest.mark.slow
def test_an_error_exit_closes_tensorboard_and_the_status_line(tiny_data, tmp_path, monkeypatch) -> None:
    from indextts_train.ui import console

    writers: list[RecordingWriter] = []
    monkeypatch.setattr(console, "open_tensorboard", lambda *args, **kwargs: writers.append(RecordingWriter())
                        or writers[-1])
    stopped: list[int] = []
    monkeypatch.setattr(console.RunLogger, "stop", lambda self: stopped.append(1))
    original = train_mod.optimizer_step

    def broken_at_step_3(run, state, step_batches, step, *rest):
        if step == 3:
            raise RuntimeError("a bug")
        return original(run, state, step_batches, step, *rest)

    monkeypatch.setattr(train_mod, "optimizer_step", broken_at_step_3)
    with pytest.raises(RuntimeError, match="a bug"):
        train(options(tiny_data, tmp_path / "run", tensorboard=True, val_manifests=[]))
    assert len(writers) == 1 and writers[0].closed
    assert stopped  # RunLogger.close stops the live status line


@pytest.mark.slow
def test_a_save_deferred_by_a_streak_survives_a_stop_inside_it(tiny_data, tmp_path, monkeypatch) -> None:
    import os
    import signal

    from indextts_train.files import faults

    monkeypatch.setattr(faults, "_NAN_STEPS", {4})  # step 4 is skipped: its periodic save waits for step 5
    settings = dict(val_manifests=[], save_interval=2, max_steps=6, log_interval=1, keep_checkpoints=10)
    whole = tmp_path / "whole"
    assert train(options(tiny_data, whole, **settings)) == 0
    original = train_mod.crash_point

    def stop_at_step_4(name: str, step: int) -> None:
        if (name, step) == ("step_logged", 4):
            os.kill(os.getpid(), signal.SIGTERM)  # the loop's own handler: finish the step, save, exit 143
        original(name, step)

    monkeypatch.setattr(train_mod, "crash_point", stop_at_step_4)
    stopped = tmp_path / "stopped"
    assert train(options(tiny_data, stopped, **settings)) == 143
    monkeypatch.setattr(train_mod, "crash_point", original)
    assert train(options(tiny_data, stopped, resume="auto", **settings)) == 0
    assert (whole / "model_step5.pth").is_file() and (stopped / "model_step5.pth").is_file()
    got, want = load_checkpoint(stopped / "latest.pth"), load_checkpoint(whole / "latest.pth")
    assert got["progress"] == want["progress"]
    for key, tensor in want["model"].items():
        assert torch.equal(got["model"][key], tensor), key


def test_the_window_mean_leaves_out_an_overflowed_gradient_norm() -> None:
    from types import SimpleNamespace

    from indextts_train.train import window

    history = SimpleNamespace(pending=[torch.tensor([1.0, 1.0, 1.0, 0.5, 2.0]),
                                       torch.tensor([3.0, 3.0, 3.0, 0.5, float("inf")])])
    optim = SimpleNamespace(last_step_lr=lambda: 1e-3)
    values = window.window_values(history, SimpleNamespace(samples_total=8), optim, (0.0, 0))
    assert values["loss"] == 2.0 and values["grad_norm"] == 2.0
