"""The newcomer's wrong turns, round 5: another trainer's flags, a flag typed without its value, a word no
argument takes, a command named as other tools name it, `--version`, a GPU named as a rental listing names it,
and the shell recipes given their arguments in the wrong order. Each is one `error:` line that says what to
type instead, exit 2, and nothing started."""

from __future__ import annotations

import contextlib
import io
import os
import subprocess
import sys
from pathlib import Path

import pytest

from indextts_train import __main__ as entry_point
from indextts_train.cli import app, run_app
from indextts_train.errors import UserError
from indextts_train.train.device import KNOWN_GPUS
from indextts_train.train.hardware import plan_device

ROOT = Path(__file__).resolve().parents[1]
TRAIN = ["train", "--train-manifest", "t.jsonl", "--output-dir", "run"]


def refused(*args: str) -> str:
    """The one line `indextts-train ARGS` answers with; it must be a refusal (exit 2) of one line."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = run_app(app, list(args))
    lines = err.getvalue().splitlines()
    assert code == 2 and len(lines) == 1 and lines[0].startswith("error: "), (code, err.getvalue())
    assert out.getvalue() == "" and "Traceback" not in err.getvalue()
    return lines[0]


@pytest.mark.parametrize("args, said", [
    # spelling alone answered these with flags that do something else (--listen-device, --accept-data-change,
    # --listen-every / --keep-every, --listen-asr-model), or with nothing
    ([*TRAIN, "--device", "cuda"], "CUDA_VISIBLE_DEVICES=1"),
    ([*TRAIN, "--gpus", "2"], "torchrun --nproc-per-node N -m indextts_train"),
    ([*TRAIN, "--num_gpus", "2"], "torchrun --nproc-per-node N"),
    ([*TRAIN, "--data", "x"], "no such flag --data; did you mean --train-manifest?"),
    ([*TRAIN, "--save-every", "100"], "no such flag --save-every; did you mean --save-interval?"),
    ([*TRAIN, "--eval_steps", "100"], "no such flag --eval_steps; did you mean --val-interval?"),
    ([*TRAIN, "--log-every", "10"], "did you mean --log-interval?"),
    ([*TRAIN, "--model", "checkpoints"], "no such flag --model; did you mean --base-checkpoint?"),
    ([*TRAIN, "--fp16"], "no such flag --fp16; did you mean --amp?"),
    ([*TRAIN, "--lora"], "did you mean --train-scope lora?"),
    ([*TRAIN, "--wandb"], "tensorboard --logdir OUTPUT_DIR/logs"),
    # the same word means the flag the command has
    (["prepare", "clips", "--model", "checkpoints", "--out", "f"], "no such flag --model; did you mean --model-dir?"),
    (["evaluate", "--model", "x.pth", "--manifest", "v.jsonl"], "did you mean --checkpoint?"),
    (["export", "run", "--out", "gpt.pth"], "no such flag --out; did you mean --output?"),
    (["hardware", "--gpu", "T4"], "no such flag --gpu; did you mean --assume?"),
])
def test_another_trainers_flag_names_the_one_that_does_it_here(args, said) -> None:
    assert said in refused(*args)


@pytest.mark.parametrize("args, said", [
    # click: "Option '--resume' requires an argument"
    (["train", "--resume"], "--resume needs a value: 'auto': newest checkpoint in --output-dir that verifies"),
    (["prepare", "clips", "--model-dir", "m", "--out"], "--out needs a value: output folder"),
    # click took the next flag as the value and left its value over ("Got unexpected extra argument(s) (5)")
    (["train", "--resume", "--max-steps", "5"], "--resume took the flag --max-steps as its value, leaving '5'"),
    # a manifest or a corpus typed without its flag
    (["train", "data/am/train.jsonl"], "train takes flags only; pass a manifest as --train-manifest "
                                       "data/am/train.jsonl (audio clips or a corpus go to `indextts-train prepare`"),
    ([*TRAIN, "--amp", "true"], "--amp takes no value ('true' is left over): --amp / --no-amp alone"),
    ([*TRAIN, "--skip-bad-lines=yes"], "--skip-bad-lines takes no value: --skip-bad-lines / --no-skip-bad-lines "
                                       "alone turns it on / off"),
    (["hardware", "--assume", "RTX", "4090"], "a value holding a space needs quotes, --assume 'RTX 4090'"),
    (["hardware", "rtx4090"], "hardware takes flags only; for a named GPU pass --assume 'rtx4090'"),
    ([*TRAIN, "--val-manifest", "a.jsonl", "b.jsonl"], "repeat the flag for each: --val-manifest a.jsonl "
                                                       "--val-manifest b.jsonl"),
    (["verify", "a.pth", "b.pth"], "unexpected argument 'b.pth': verify takes one CHECKPOINT"),
    (["webui", "x"], "unexpected argument 'x': webui takes flags only"),
])
def test_a_flag_without_its_value_or_a_word_without_a_flag_is_said_as_such(args, said) -> None:
    assert said in refused(*args)


@pytest.mark.parametrize("typed, said", [
    ("finetune", "No such command 'finetune'. Did you mean 'train'?"),
    ("resume", "Did you mean 'train'? (the same train command again, with --resume auto, continues a run)"),
    ("infer", "Did you mean 'listen'?"),
    ("tts", "Did you mean 'listen'?"),
    ("help", "Did you mean '--help'?"),
    ("trian", "No such command 'trian'. Did you mean 'train'?"),  # click's spelling guess is kept
])
def test_a_command_named_as_other_tools_name_it(typed, said) -> None:
    assert said in refused(typed)


def test_version_is_answered_without_loading_the_commands(monkeypatch, capsys) -> None:
    for typed in ("--version", "-V"):
        monkeypatch.setattr(sys, "argv", ["indextts-train", typed])
        with pytest.raises(SystemExit) as stop:
            entry_point.main()
        assert stop.value.code == 0
        out = capsys.readouterr().out
        assert out.startswith("indextts-train ") and "torch " in out, out


@pytest.mark.slow
def test_the_module_alone_lists_the_commands() -> None:
    """`python -m indextts_train` with nothing after it answered as train-gpt: "--train-manifest is required"."""
    proc = subprocess.run([sys.executable, "-m", "indextts_train"], capture_output=True, text=True, timeout=120,
                          cwd=ROOT)
    assert proc.returncode == 2 and "Commands:" in proc.stderr and "--train-manifest" not in proc.stderr, proc.stderr


# ----------------------------------------------------------------------------- hardware --assume


@pytest.mark.parametrize("typed, key", [("h100 sxm", "H100-80GB"), ("H100 SXM5 80GB", "H100-80GB"),
                                        ("A100 PCIe 80GB", "A100-80GB"), ("a100-sxm4-40gb", "A100-40GB"),
                                        ("rtx4090", "RTX-4090"), ("T4", "T4")])
def test_a_gpu_named_as_a_rental_listing_names_it(typed, key) -> None:
    assert plan_device(typed).name == KNOWN_GPUS[key].name


@pytest.mark.parametrize("typed, said", [
    ("24GB", "--assume '24GB' gives the memory alone; add the compute capability: 24GB@8.9"),
    ("80", "80GB@8.9"),
    ("cpu", "leave --assume out"),
    ("H100 NVL", "unknown GPU 'H100 NVL'"),  # 94 GB: not the table's 80 GB card
])
def test_a_gpu_the_table_cannot_plan_says_what_to_give(typed, said) -> None:
    with pytest.raises(UserError) as refusal:
        plan_device(typed)
    assert said in str(refusal.value)


def test_hardware_help_names_every_known_gpu() -> None:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        run_app(app, ["hardware", "--help"])
    text = " ".join(out.getvalue().split())
    missing = [key for key in KNOWN_GPUS if key not in text]
    assert not missing, missing


# ----------------------------------------------------------------------------- the shell recipes


def fake_trainer(tmp_path: Path) -> dict[str, str]:
    """PATH whose train-gpt records its arguments and refuses them as the real one refuses a missing file."""
    fake = tmp_path / "bin" / "train-gpt"
    fake.parent.mkdir(exist_ok=True)
    fake.write_text('#!/usr/bin/env bash\necho "train-gpt $*" >> "$CALLS"\n'
                    'echo "error: --train-manifest nowhere.jsonl: manifest not found" >&2\nexit 2\n')
    fake.chmod(0o755)
    return {**os.environ, "PATH": f"{fake.parent}{os.pathsep}{os.environ['PATH']}",
            "CALLS": str(tmp_path / "calls"), "RETRY_DELAY": "0"}


@pytest.mark.slow
@pytest.mark.parametrize("script, args, said", [
    ("smart_start.sh", [], "error: OUTPUT_DIR is missing; usage: scripts/smart_start.sh OUTPUT_DIR"),
    ("smart_start.sh", ["--train-manifest", "t.jsonl"], "the first argument is the run folder, not a flag"),
    ("smart_start.sh", ["run", "--output-dir", "elsewhere"], "leave --output-dir out"),
    ("smart_start.sh", ["run", "--resume", "run/model_step4.pth"], "leave --resume out"),
    ("tmux_train.sh", [], "error: SESSION is missing"),
    ("tmux_train.sh", ["am"], "error: OUTPUT_DIR is missing"),
    ("tmux_train.sh", ["am", "--output-dir", "runs/am"], "the second argument is the run folder, not a flag"),
    ("tmux_train.sh", ["my.run", "run"], "use letters, digits, - or _ (e.g. my_run)"),
    ("tmux_train.sh", ["am", "run", "--resume=latest"], "leave --resume out"),
])
def test_a_recipe_given_its_arguments_wrong_says_so_before_starting(tmp_path, script, args, said) -> None:
    env = fake_trainer(tmp_path)
    proc = subprocess.run(["bash", str(ROOT / "scripts" / script), *args], capture_output=True, text=True,
                          env=env, cwd=tmp_path, timeout=60)
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1 and said in proc.stderr, proc.stderr
    assert not (tmp_path / "calls").exists() and not (tmp_path / "run").exists()


@pytest.mark.slow
def test_tmux_recipe_says_when_the_run_ends_before_its_first_step(tmp_path) -> None:
    """It said "started in tmux session ..." and exit 0 while the pane showed the refusal nobody watched."""
    env = fake_trainer(tmp_path)
    session = f"indextts-newcomer-{os.getpid()}"
    try:
        proc = subprocess.run(["bash", str(ROOT / "scripts" / "tmux_train.sh"), session, str(tmp_path / "run"),
                               "--train-manifest", "nowhere.jsonl"], capture_output=True, text=True, env=env,
                              timeout=120)
        assert proc.returncode == 2 and "started in tmux session" not in proc.stdout, proc.stdout + proc.stderr
        assert proc.stderr.startswith("error: --train-manifest nowhere.jsonl: manifest not found (tmux session "
                                      f"{session}; its output: "), proc.stderr
    finally:
        subprocess.run(["tmux", "kill-session", "-t", f"={session}"], capture_output=True)


@pytest.mark.slow
@pytest.mark.parametrize("args, passed", [
    # a relative OUT_DIR is the caller's folder's (it landed in the checkout), and the flags after it reach the
    # demo (`--family 2.5` was dropped: the IndexTTS2 demo ran)
    (["mine", "--family", "2.5"], ["{cwd}/mine", "--family", "2.5"]),
    (["--family", "2.5"], ["runs/demo", "--family", "2.5"]),
    ([], ["runs/demo"]),
])
def test_demo_script_passes_the_folder_and_flags_as_given(tmp_path, args, passed) -> None:
    """A fake Python stands in for install.sh's and the demo's: it records what it was asked to run."""
    fake = tmp_path / "python"
    fake.write_text('#!/usr/bin/env bash\necho "$*" >> "$CALLS"\n')
    fake.chmod(0o755)
    calls = tmp_path / "calls"
    env = {**os.environ, "PYTHON": str(fake), "CALLS": str(calls)}
    proc = subprocess.run(["bash", str(ROOT / "scripts" / "demo.sh"), *args], capture_output=True, text=True,
                          env=env, cwd=tmp_path, timeout=60)
    assert proc.returncode == 0, proc.stderr
    demo = calls.read_text().splitlines()[-1]
    assert demo == " ".join(["-m indextts_train demo", *(p.format(cwd=tmp_path) for p in passed)]), demo


@pytest.mark.slow
def test_demo_script_refuses_an_empty_folder_name(tmp_path) -> None:
    env = {**os.environ, "PYTHON": "false"}  # neither install nor the demo may run
    proc = subprocess.run(["bash", str(ROOT / "scripts" / "demo.sh"), ""], capture_output=True, text=True, env=env,
                          cwd=tmp_path, timeout=60)
    assert proc.returncode == 2 and proc.stderr.startswith("error: OUT_DIR is empty"), proc.stderr
