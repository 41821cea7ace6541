"""Nothing is ever lost, case by case, through the real CLI.

What needs a process of its own runs as one: a SIGKILL mid-step, signals to the whole process group
(data workers included), torchrun, a second run while another process holds the output dir, a
closed stdout. Every other run calls the same CLI in this process (typer's CliRunner: the same
command, flags, messages and exit codes, without paying for a Python start each time). A full disk
or a read-only folder is a fault in the file calls of this process (helpers.FaultyFolder), so no
test needs privileges, and root cannot write through it.

Every case starts from copies of one uninterrupted 8-step run (`reference`), so the runs that
resume can be compared with it bit for bit (torch.equal).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import pytest
import torch
from helpers import FaultyFolder, community_state, start, wait_for_training
from typer.testing import CliRunner

from indextts_train.checkpoint.files import load_checkpoint
from indextts_train.checkpoint.verify import verify_checkpoint
from indextts_train.cli import app
from indextts_train.config.settings import TrainConfig
from indextts_train.data.sampling import ManifestSpec, epoch_order, sampler_spec
from indextts_train.files import faults
from indextts_train.train import preflight
from indextts_train.ui.text_log import unstamp

pytestmark = pytest.mark.slow  # every test here trains a tiny run or starts the CLI: seconds each

ROOT = Path(__file__).resolve().parents[1]
TINY_CONFIG = ROOT / "configs" / "tiny.yaml"
STEPS, SEED = 8, 7


def train_args(data: Path, out: Path, *extra: object, workers: int = 0, steps: int = STEPS) -> list[str]:
    """The reference run's flags (its manifest in `data`): 6 steps an epoch, a save every 2 steps."""
    return ["train", "--train-manifest", str(data / "train.jsonl"), "--config", str(TINY_CONFIG),
            "--base-checkpoint", str(data / "base_gpt.pth"), "--output-dir", str(out), "--resume", "auto",
            "--batch-size", "2", "--grad-accumulation", "2", "--effective-batch-size", "4",
            "--num-workers", str(workers), "--max-steps", str(steps), "--epochs", "100", "--learning-rate", "3e-3",
            "--warmup-steps", "2", "--seed", str(SEED), "--log-interval", "1", "--save-interval", "2",
            "--keep-checkpoints", "10", *map(str, extra)]


def command(args: list[str]) -> list[str]:
    """`indextts-train ARGS` as a process of its own."""
    return [sys.executable, "-m", "indextts_train", *args]


def cli(args: list[str]) -> tuple[int, str, str]:
    """The CLI in this process: exit code, stdout, stderr. A traceback fails the test with it."""
    result = CliRunner().invoke(app, args)
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        raise result.exception
    return result.exit_code, result.stdout, result.stderr


def run(args: list[str], env: dict | None = None) -> tuple[int, str, str]:
    """The CLI as a process of its own: exit code, stdout, stderr."""
    done = subprocess.run(command(args), capture_output=True, text=True, cwd=ROOT, timeout=300,
                          env={**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})})
    return done.returncode, done.stdout, done.stderr


def finish(proc: subprocess.Popen) -> tuple[int, str]:
    code = proc.wait(timeout=300)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)  # data workers a SIGKILL left behind
    return code, proc.stdout.read() if not proc.stdout.closed else ""


def snapshot(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in folder.iterdir() if p.suffix == ".pth"}


def assert_same_state(got_path: Path, want_path: Path) -> None:
    got, want = load_checkpoint(got_path), load_checkpoint(want_path)
    assert got["progress"] == want["progress"]
    for key, tensor in want["model"].items():
        assert torch.equal(got["model"][key], tensor), f"parameter {key} differs"
    for index, slots in want["optimizer"]["state"].items():
        for slot, tensor in slots.items():
            assert torch.equal(got["optimizer"]["state"][index][slot], tensor), f"optimizer {index}.{slot}"
    assert got["scheduler"] == want["scheduler"]
    assert got["history"] == want["history"]
    assert data_record(got) == data_record(want)


def data_record(state: dict) -> dict:
    """The checkpoint's data record, manifests by name (the runs compared may read copies of the data)."""
    record = json.loads(json.dumps(state["data"]))
    for entry in record["fingerprint"]["files"]:
        entry["path"] = Path(entry["path"]).name
    return record


@pytest.fixture(scope="module")
def data(tiny_data, tmp_path_factory) -> Path:
    """A private copy of the tiny dataset and base checkpoint (some cases edit the data)."""
    folder = tmp_path_factory.mktemp("lost_data") / "data"
    shutil.copytree(tiny_data["folder"], folder)
    return folder


@pytest.fixture(scope="module")
def reference(data, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("lost_reference") / "run"
    code, stdout, stderr = cli(train_args(data, out))
    assert code == 0, stdout + stderr
    return out


def run_at(reference: Path, step: int, dest: Path) -> Path:
    """The reference run's folder as it was right after the save at `step` (latest.pth linked to it)."""
    dest.mkdir(parents=True)
    for s in range(2, step + 1, 2):
        shutil.copy2(reference / f"model_step{s}.pth", dest / f"model_step{s}.pth")
    os.link(dest / f"model_step{step}.pth", dest / "latest.pth")
    return dest


def flip_byte(path: Path) -> None:
    """Damage tensor data in place (every hard link of the file sees it); the zip CRC catches it."""
    size = path.stat().st_size
    with open(path, "r+b") as handle:
        handle.seek(size // 2)
        byte = handle.read(1)
        handle.seek(size // 2)
        handle.write(bytes([byte[0] ^ 0xFF]))


# ----------------------------------------------------------------------------- 1. foreign, damaged, newer files


def test_resume_auto_refuses_when_nothing_resumes_and_changes_no_file(data, reference, tmp_path) -> None:
    out = tmp_path / "run"
    out.mkdir()
    torch.save(community_state(3), out / "model_step3.pth")  # what train_gpt_v2.py leaves: PARTIAL
    shutil.copy(out / "model_step3.pth", out / "latest.pth")
    newer = load_checkpoint(reference / "model_step4.pth")
    newer["format_version"] = 99
    torch.save(newer, out / "model_step4.pth")
    shutil.copy(reference / "model_step2.pth", out / "model_step2.pth")
    flip_byte(out / "model_step2.pth")
    before = snapshot(out)
    code, stdout, stderr = cli(train_args(data, out))
    assert code == 2, stdout + stderr
    lines = stderr.splitlines()
    assert lines[0] == (f"error: --resume auto: {out} holds checkpoints but none of them can resume this run, "
                        "so nothing was started and no file was changed:")
    by_file = {line.split(": ", 1)[0].strip(): line for line in lines[1:-1]}
    assert set(by_file) == {str(out / n) for n in ("latest.pth", "model_step2.pth", "model_step3.pth",
                                                   "model_step4.pth")}
    assert "PARTIAL" in by_file[str(out / "model_step3.pth")]
    assert f"`indextts-train repair {out / 'model_step3.pth'}`" in by_file[str(out / "model_step3.pth")]
    assert "written by a newer indextts-train" in by_file[str(out / "model_step4.pth")]
    assert "INCOMPLETE" in by_file[str(out / "model_step2.pth")] and "CRC" in by_file[str(out / "model_step2.pth")]
    assert lines[-1] == "  or start a new run with another --output-dir"
    assert snapshot(out) == before


def test_a_run_lock_that_is_a_link_to_a_users_file_is_refused_and_the_file_kept(data, tmp_path) -> None:
    """OUT/train.lock, a link to someone's notes: the claim truncated them and wrote its holder line in."""
    out = tmp_path / "run"
    out.mkdir()
    notes = tmp_path / "notes.txt"
    notes.write_text("precious\n")
    (out / "train.lock").symlink_to(notes)
    code, stdout, stderr = run(train_args(data, out))
    assert code == 2 and "Traceback" not in stderr, stdout + stderr
    assert stderr.strip().splitlines()[-1].startswith(f"error: {out / 'train.lock'}: is a link, not a file of this "
                                                     "program's own")
    assert notes.read_text() == "precious\n" and sorted(os.listdir(out)) == ["train.lock"]


def test_skipped_files_stay_byte_identical_while_the_run_goes_on(data, reference, tmp_path) -> None:
    """The newest checkpoint is damaged (latest.pth with it), a community file sits among ours: the run
    resumes from step 2, never writes model_step4.pth's name, rotates only its own files, and ends
    bit-identical to the uninterrupted run."""
    out = run_at(reference, 4, tmp_path / "run")
    flip_byte(out / "model_step4.pth")
    torch.save(community_state(1), out / "model_step1.pth")
    damaged, foreign = (out / "model_step4.pth").read_bytes(), (out / "model_step1.pth").read_bytes()
    code, stdout, stderr = cli(train_args(data, out, "--keep-checkpoints", "1"))
    assert code == 0, stdout + stderr
    assert f"resuming from {out / 'model_step2.pth'}" in stdout
    assert f"not saving step 4: {out / 'model_step4.pth'} is a file this run could not verify" in stdout
    assert (out / "model_step4.pth").read_bytes() == damaged
    assert (out / "model_step1.pth").read_bytes() == foreign
    assert sorted(p.name for p in out.glob("*.pth")) == ["latest.pth", "model_step1.pth", "model_step4.pth",
                                                         "model_step8.pth"]
    assert_same_state(out / "latest.pth", reference / "latest.pth")


def test_a_best_or_latest_name_that_is_not_ours_is_kept_and_never_claimed(data, reference, tmp_path) -> None:
    """The user's own best.pth (a bare gpt.pth copied in) and a latest.pth cut short stay byte for byte, and
    the run says so: no line claims it published them, the last one names the step files instead."""
    out = run_at(reference, 4, tmp_path / "run")
    (out / "latest.pth").unlink()  # a hard link of model_step4.pth: a file of its own now, cut short
    (out / "latest.pth").write_bytes((out / "model_step4.pth").read_bytes()[:1000])
    torch.save({"gpt.weight": torch.zeros(2)}, out / "best.pth")
    kept = {name: (out / name).read_bytes() for name in ("latest.pth", "best.pth")}
    code, stdout, stderr = cli(train_args(data, out))
    assert code == 0, stdout + stderr
    for name in kept:
        assert f"{out / name} is not a checkpoint this run can use: kept as it is, so this run publishes no {name}" \
            in stdout
    assert f"(model_step{STEPS}.pth; latest.pth there is not this run's)" in stdout
    fresh = tmp_path / "fresh"  # a new run with validation, in a folder holding the user's best.pth
    fresh.mkdir()
    shutil.copy(out / "best.pth", fresh / "best.pth")
    code, stdout, stderr = cli(train_args(data, fresh, "--val-manifest", data / "val.jsonl", "--val-interval", 2,
                                          steps=4))
    assert code == 0, stdout + stderr
    assert "kept as it is, so this run publishes no best.pth" in stdout
    assert ", best.pth" not in stdout  # no save line claims it
    assert re.search(r"the best is step \d \(loss [0-9.]+\): model_step\d.pth \(best.pth there is not this "
                     r"run's\); checkpoints in .* \(latest.pth\)", stdout), stdout
    assert (fresh / "best.pth").read_bytes() == kept["best.pth"]
    assert {name: (out / name).read_bytes() for name in kept} == kept


# ----------------------------------------------------------------------------- 2. divergence


@pytest.mark.parametrize("saving", ["--no-async-save", "--async-save"])
def test_a_diverging_run_stops_with_exit_3_and_keeps_the_last_good_checkpoint(data, reference, tmp_path,
                                                                              saving) -> None:
    out = run_at(reference, 4, tmp_path / "run")
    code, stdout, stderr = cli(train_args(data, out, "--learning-rate", "1e30", "--max-bad-steps", "3", saving,
                                          steps=40))
    assert code == 3, stdout + stderr
    assert "step 6: loss nan, gradient norm nan: not finite, so the weights were not updated" in stdout
    assert unstamp(stdout).strip().splitlines()[-1] == (
        f"stopped: the last 3 steps (6-8) all had a non-finite loss or gradient norm (the run diverged) and were "
        f"not saved; the last good checkpoint is {out / 'model_step4.pth'} (step 4): lower --learning-rate or "
        "check the data, then rerun with --resume auto (exit 3)")
    for path in out.glob("*.pth"):
        assert verify_checkpoint(path).status == "COMPLETE", path  # no file with a NaN was written
    assert load_checkpoint(out / "latest.pth")["progress"]["step"] == 4


# ----------------------------------------------------------------------------- 5. a bad sample mid-run


def load_lengths(folder: Path) -> np.ndarray:
    """text_len + code_len of each line: what the epoch order sorts by."""
    lines = [json.loads(line) for line in (folder / "train.jsonl").read_text().splitlines()]
    return np.array([line["target_text_len"] + line["target_code_len"] for line in lines])


def order_of(folder: Path, epoch: int) -> np.ndarray:
    """The line indices of `epoch` in the order the reference run's settings draw them (order rule 2)."""
    lengths = load_lengths(folder)
    spec = sampler_spec([ManifestSpec(folder / "train.jsonl")], [len(lengths)], seed=SEED,
                        sort_window=TrainConfig().sort_window, step_samples=4)
    return epoch_order(spec, lengths, epoch)


def break_sample_at(folder: Path, position: int) -> tuple[int, int]:
    """Give the sample at `position` of epoch 0's order a negative text id. Returns (line, its step)."""
    lines = (folder / "train.jsonl").read_text().splitlines()
    index = int(order_of(folder, 0)[position])
    path = folder / json.loads(lines[index])["target_text_ids_path"]
    ids = np.load(path)
    ids[1] = -3
    np.save(path, ids)
    return index + 1, position // 4 + 1


@pytest.mark.parametrize(("saving", "workers"), [("--no-async-save", 2), ("--async-save", 0)])
def test_a_bad_sample_at_step_k_leaves_a_checkpoint_at_step_k_minus_1(data, reference, tmp_path, saving,
                                                                      workers, monkeypatch) -> None:
    # The checks before training read the head of each manifest; this tiny one is all head, so they
    # step aside here to let the line stand for one deep in a big manifest, found only when loaded.
    monkeypatch.setattr(preflight, "check_manifest_sample", lambda *args, **kwargs: None)
    folder = tmp_path / "data"
    shutil.copytree(data, folder)
    line, step = break_sample_at(folder, 9)
    assert step == 3
    out = tmp_path / "run"
    code, stdout, stderr = cli(train_args(folder, out, "--save-interval", "100", saving, workers=workers))
    assert code == 2, stdout + stderr
    assert stderr == (f"error: {folder / 'train.jsonl'}:{line}: target_text_ids_path holds id -3, which is "
                      f"negative; re-create the array or drop the line; step 2, the last completed one, is saved in "
                      f"{out / 'model_step2.pth'}; fix or remove the line (`indextts-train check-data` lists every "
                      "bad line) or pass --skip-bad-lines, then rerun with --resume auto\n")
    assert_same_state(out / "model_step2.pth", reference / "model_step2.pth")


# ----------------------------------------------------------------------------- 2 + 5: exact after a kill


def test_skipped_steps_and_samples_change_nothing_and_resume_exactly_after_a_kill(data, tmp_path,
                                                                                  monkeypatch) -> None:
    """Steps 7 and 8 have a NaN loss (a fault placed there: a real divergence cannot be placed) and one
    sample fails to load (--skip-bad-lines). A run killed (SIGKILL) inside step 8 and resumed with
    other worker counts ends bit-identical to the run that was not killed."""
    folder = tmp_path / "data"
    shutil.copytree(data, folder)
    line, _ = break_sample_at(folder, 9)
    loads = 1 + int(line - 1 in order_of(folder, 1)[:8])  # steps 7-8 take 8 samples of epoch 1
    monkeypatch.setattr(faults, "_NAN_STEPS", {7, 8})  # INDEXTTS_TRAIN_NAN_AT=7,8 in this process
    whole, killed = tmp_path / "whole", tmp_path / "killed"
    code, stdout, stderr = cli(train_args(folder, whole, "--skip-bad-lines"))
    assert code == 0, stdout + stderr
    assert "2 step(s) had a non-finite loss or gradient norm and were skipped" in stdout
    assert f"skipped {loads} sample load(s) of 1 bad line(s) (--skip-bad-lines):\n  {folder / 'train.jsonl'}:{line}: " \
           in stdout
    six, eight = load_checkpoint(whole / "model_step6.pth"), load_checkpoint(whole / "model_step8.pth")
    for key, tensor in six["model"].items():  # steps 7 and 8 changed no weight and no moment
        assert torch.equal(eight["model"][key], tensor), key
    for index, slots in six["optimizer"]["state"].items():
        for slot, tensor in slots.items():
            assert torch.equal(eight["optimizer"]["state"][index][slot], tensor)
    assert eight["scheduler"]["last_epoch"] == 8  # the schedule still follows the step count
    assert eight["progress"]["bad_steps"] == 2 and eight["progress"]["bad_streak"] == 2
    assert eight["data"]["skipped_loads"] == loads

    env = {"INDEXTTS_TRAIN_NAN_AT": "7,8", "INDEXTTS_TRAIN_CRASH_AT": "accumulation@8"}
    code, _, stderr = run(train_args(folder, killed, "--skip-bad-lines"), env)
    assert code == -signal.SIGKILL, stderr
    assert load_checkpoint(killed / "latest.pth")["progress"]["step"] == 6
    code, stdout, stderr = cli(train_args(folder, killed, "--skip-bad-lines", workers=2))
    assert code == 0 and f"skipped {loads} sample load(s) of 1 bad line(s)" in stdout, stdout + stderr
    assert_same_state(killed / "latest.pth", whole / "latest.pth")


# ----------------------------------------------------------------------------- 3 + 4. signals, two runs, one output dir


def test_sigterm_to_the_group_saves_and_resumes_exactly_and_a_second_run_is_refused_meanwhile(
        data, reference, tmp_path) -> None:
    """SIGTERM to the whole process group, main process and its 2 data workers alike (what docker,
    Kubernetes, SLURM and systemd send): one save, exit 143, and the resumed run ends bit-identical to
    the uninterrupted one. While the first run trains, a second run on its output dir is refused."""
    out = tmp_path / "run"
    proc = start(command(train_args(data, out, "--save-interval", "100", workers=2)))
    try:
        assert wait_for_training(proc)
        os.kill(proc.pid, signal.SIGSTOP)  # it holds the lock while we try
        code, stdout, stderr = cli(train_args(data, out))
        assert code == 2, stdout + stderr
        assert stderr.startswith(f"error: {out} is in use by another training run (PID {proc.pid}, started ")
        assert stderr.count("\n") == 1
        os.kill(proc.pid, signal.SIGCONT)
        os.killpg(proc.pid, signal.SIGTERM)
        got, output = finish(proc)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
    assert got == 143, output
    assert "Traceback" not in output and output.count("saved ") == 1 and "(exit 143)" in output
    assert (out / "train.lock").read_text() == ""  # released: no PID left behind
    assert verify_checkpoint(out / "latest.pth").status == "COMPLETE"
    stopped = load_checkpoint(out / "latest.pth")["progress"]["step"]
    assert stopped < STEPS  # stopped mid-run
    assert_same_weights_where_both_saved(out / "latest.pth", reference, stopped)
    code, stdout, stderr = cli(train_args(data, out))  # with 0 workers: the batches do not depend on them
    assert code == 0 and "another setup" not in stdout, stdout + stderr  # bit for bit needs the same setup
    assert_same_state(out / "latest.pth", reference / "latest.pth")


def assert_same_weights_where_both_saved(stop_file: Path, reference: Path, step: int) -> None:
    """The stop's checkpoint has the uninterrupted run's weights and moments at that step (the reference
    saves every 2 steps): a difference after the resume is then the resume's, not the stopped run's."""
    if step % 2:
        return
    got, want = load_checkpoint(stop_file), load_checkpoint(reference / f"model_step{step}.pth")
    for key, tensor in want["model"].items():
        assert torch.equal(got["model"][key], tensor), f"at the stop (step {step}): parameter {key} differs"
    for index, slots in want["optimizer"]["state"].items():
        for slot, tensor in slots.items():
            assert torch.equal(got["optimizer"]["state"][index][slot], tensor), \
                f"at the stop (step {step}): optimizer {index}.{slot} differs"


def test_sighup_with_the_terminal_gone_saves_and_resumes_exactly(data, reference, tmp_path) -> None:
    """A closed terminal: SIGHUP to the group, and the output has nowhere to go (every print fails,
    Python's own flush at exit too, as after `train-gpt ... | tee log` with tee killed). The run
    still saves once and exits 129 (a traceback would be 1, a failed flush 120); the resumed run
    ends bit-identical."""
    out = tmp_path / "run"
    proc = start(command(train_args(data, out, "--save-interval", "100")))
    try:
        assert wait_for_training(proc)
        proc.stdout.close()
        os.killpg(proc.pid, signal.SIGHUP)
        assert proc.wait(timeout=300) == 129
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
    assert verify_checkpoint(out / "latest.pth").status == "COMPLETE"
    stopped = load_checkpoint(out / "latest.pth")["progress"]["step"]
    assert stopped < STEPS
    assert_same_weights_where_both_saved(out / "latest.pth", reference, stopped)
    code, stdout, stderr = cli(train_args(data, out))
    assert code == 0 and "another setup" not in stdout, stdout + stderr
    assert_same_state(out / "latest.pth", reference / "latest.pth")


def test_sigterm_to_torchrun_and_every_rank_saves_once(data, tmp_path) -> None:
    """SLURM's scancel and a container stop reach every process: the launcher, each rank, each worker.
    Each rank thus gets SIGTERM twice (directly and forwarded by torchrun): one stop, one save."""
    out = tmp_path / "run"
    launcher = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--master-port",
                str(29500 + os.getpid() % 1000), "-m", "indextts_train"]
    args = launcher + train_args(data, out, "--save-interval", "1000", "--grad-accumulation", "1", workers=2,
                                 steps=2000)
    proc = start(args)
    assert wait_for_training(proc)
    for pid in descendants(proc.pid):
        os.kill(pid, signal.SIGTERM)
    proc.send_signal(signal.SIGTERM)
    output, _ = proc.communicate(timeout=120)
    assert output.count("saved ") == 1, output
    assert output.count("(exit 143)") == 1  # rank 0 talks
    # The only traceback is the launcher's own report that it was signalled (README, Several GPUs).
    assert output.count("Traceback") == 1 and output.rstrip().endswith("got signal: 15"), output
    assert verify_checkpoint(out / "latest.pth").status == "COMPLETE"


def descendants(pid: int) -> list[int]:
    parents: dict[int, int] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError, IndexError):
                parents[int(entry.name)] = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
    found, frontier = [], [pid]
    while frontier:
        children = [child for child, parent in parents.items() if parent in frontier]
        found += children
        frontier = children
    return found


# ----------------------------------------------------------------------------- 6. I/O failures


def test_full_disk_under_tensorboard_does_not_stop_the_run(data, reference, tmp_path, monkeypatch) -> None:
    out = tmp_path / "run"
    logs = FaultyFolder(out / "logs", capacity=0).install(monkeypatch)  # full before the run starts
    thread_errors: list = []
    monkeypatch.setattr(threading, "excepthook", thread_errors.append)  # what Python would print on stderr
    code, stdout, stderr = cli(train_args(data, out))
    assert code == 0, stdout + stderr
    assert logs.failures > 0  # TensorBoard did try to write, and the disk refused
    assert thread_errors == [] and "Traceback" not in stderr  # its writer thread's error: no traceback
    warnings = [line for line in unstamp(stdout).splitlines()
                if line.startswith("warning: TensorBoard logging stopped")]
    assert len(warnings) == 1 and "no space left on device" in warnings[0], stdout
    assert_same_state(out / "latest.pth", reference / "latest.pth")


def test_full_disk_during_a_save_keeps_the_previous_checkpoint_and_exits_2(data, reference, tmp_path,
                                                                           monkeypatch) -> None:
    out = tmp_path / "run"
    size = (reference / "model_step2.pth").stat().st_size
    FaultyFolder(out, capacity=size * 3 // 2).install(monkeypatch)  # room for one checkpoint, not two
    code, stdout, stderr = cli(train_args(data, out, "--save-interval", "4"))
    assert code == 2, stdout + stderr
    assert stderr == (f"error: could not save checkpoint step 8 to {out}: disk full; the previous checkpoint "
                      "model_step4.pth is intact; free space or fix the directory, then rerun with --resume auto\n")
    assert sorted(p.name for p in out.iterdir() if p.is_file()) == ["events.jsonl", "latest.pth", "model_step4.pth",
                                                                     "run.yaml", "train.lock", "train.log"]  # no temp
    assert os.path.samefile(out / "latest.pth", out / "model_step4.pth")
    assert_same_state(out / "model_step4.pth", reference / "model_step4.pth")


def test_unusable_output_dirs_are_one_line_before_any_work(data, tmp_path, monkeypatch) -> None:
    (tmp_path / "file").write_text("mine")
    for out, message in ((tmp_path / "file", "is a file, not a folder"),
                         (tmp_path / "file" / "run", f"{tmp_path / 'file'} is a file, so no folder can be made")):
        code, stdout, stderr = cli(train_args(data, out))
        assert code == 2 and stderr.startswith(f"error: --output-dir {out}: {message}"), stderr
        assert stderr.count("\n") == 1 and "training" not in stdout
    (tmp_path / "ro").mkdir()
    FaultyFolder(tmp_path / "ro", read_only=True).install(monkeypatch)
    code, stdout, stderr = cli(train_args(data, tmp_path / "ro" / "run"))
    assert code == 2
    assert stderr == (f"error: --output-dir {tmp_path / 'ro' / 'run'}: cannot create the folder (Read-only file "
                      "system); check the path and its permissions\n")
    assert (tmp_path / "file").read_text() == "mine" and list((tmp_path / "ro").iterdir()) == []


# ----------------------------------------------------------------------------- 7. the data changed


def test_changed_data_is_refused_on_resume_unless_accepted(data, reference, tmp_path) -> None:
    folder = tmp_path / "data"
    shutil.copytree(data, folder)
    out = run_at(reference, 4, tmp_path / "run")
    manifest = folder / "train.jsonl"
    lines = manifest.read_text().splitlines(keepends=True)
    manifest.write_text("".join(lines + lines[:4]))
    before = snapshot(out)
    code, stdout, stderr = cli(train_args(folder, out))
    assert code == 2 and snapshot(out) == before
    assert stderr == (f"error: the training data changed since {out / 'latest.pth'} ({data / 'train.jsonl'} -> "
                      f"{manifest}: 24 -> 28 usable lines (added)): the stored position (sample 16 of epoch 0) "
                      "would point at other samples; restore the data, or pass --accept-data-change to continue on "
                      "the new data, or start a new --output-dir\n")
    code, stdout, stderr = cli(train_args(folder, out, "--accept-data-change"))
    assert code == 0, stdout + stderr
    assert "--accept-data-change: training continues at the same position (sample 16 of epoch 0)" in stdout
    assert "epoch: 28 of 28 samples" in stdout  # the run's order settings over the new lines
    state = load_checkpoint(out / "latest.pth")
    assert state["progress"]["step"] == STEPS and state["sampler"]["sources"][0]["lines"] == 28


def test_a_checkpoint_without_a_fingerprint_resumes_with_a_warning(data, reference, tmp_path) -> None:
    out = run_at(reference, 4, tmp_path / "run")
    old = torch.load(out / "model_step4.pth", weights_only=True)  # as stored, not migrated
    del old["data"]  # what a file written before data fingerprints holds
    os.unlink(out / "latest.pth")
    torch.save(old, out / "model_step4.pth")
    os.link(out / "model_step4.pth", out / "latest.pth")
    code, stdout, stderr = cli(train_args(data, out))
    assert code == 0, stdout + stderr
    assert "was written before data fingerprints existed" in stdout
    assert_same_state(out / "latest.pth", reference / "latest.pth")
