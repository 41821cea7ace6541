"""Probe round 5 on listening: what a crafted lines file, a --checkpoints value, an inference program, a second
listen, a stray file in the run folder, a hand-made scores.jsonl and the --listen-* settings did, each held here.

The end-to-end tests run the real CLI on a tiny trained run with a stand-in IndexTTS2 inference package (a
module of the official name whose IndexTTS2 says a sine tone), a stand-in model folder and a tiny random ASR
model: what is tested is listen's own bookkeeping, not the official code's speech."""

from __future__ import annotations

import json
import os
import resource
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import soundfile
from helpers import ROOT, fake_inference_python, stand_in_inference_folder, train_tiny_run

from indextts_train.checkpoint.scores import RECORD_FORMAT, append_record, read_records, scores_path
from indextts_train.config.family import INDEXTTS2
from indextts_train.errors import UserError
from indextts_train.listen import page as page_module
from indextts_train.listen import synthesize as synthesize_module
from indextts_train.listen.choose import choose_checkpoints
from indextts_train.listen.lines import default_lines, read_lines_file
from indextts_train.listen.page import render_page
from indextts_train.listen.synthesize import resolve_inference_python
from indextts_train.train import listening
from indextts_train.train.listening import Listener, check_listen_settings, due_steps
from indextts_train.ui.run_record import write_run_record

# The stand-in of the official IndexTTS2 class: one second of a tone per line, after FAKE_LINE_S seconds, and
# once the file FAKE_HOLD names exists (a test's hand on when a listen goes on; at most 300 s).
FAKE_INDEXTTS2 = '''
import os, time, numpy as np
class IndexTTS2:
    def __init__(self, **kwargs):
        pass
    def infer(self, spk_audio_prompt, text, output_path=None, max_mel_tokens=0):
        time.sleep(float(os.environ.get("FAKE_LINE_S", "0")))
        hold, deadline = os.environ.get("FAKE_HOLD"), time.monotonic() + 300
        while hold and not os.path.exists(hold) and time.monotonic() < deadline:
            time.sleep(0.1)
        t = np.arange(16000) / 16000.0
        return 16000, (np.sin(2 * np.pi * 220 * t) * 8000).astype(np.int16)
'''

# What the child (child_infer.py) takes from omegaconf, which the official package brings along.
FAKE_OMEGACONF = '''
import yaml
class _Node(dict):
    def __getattr__(self, key):
        value = self[key]
        return _Node(value) if isinstance(value, dict) else value
class OmegaConf:
    @staticmethod
    def load(path):
        with open(path, encoding="utf-8") as handle:
            return _Node(yaml.safe_load(handle))
'''


def _prompt(folder: Path) -> Path:
    soundfile.write(folder / "prompt.wav", (np.sin(np.arange(16000) / 7.0) * 0.3).astype(np.float32), 16000)
    return folder / "prompt.wav"


def _lines(folder: Path, *objects: dict) -> Path:
    path = folder / "lines.jsonl"
    path.write_text("".join(json.dumps(obj) + "\n" for obj in objects), encoding="utf-8")
    return path


# ------------------------------------------------------------------ the lines file and --checkpoints


@pytest.mark.parametrize("key", ["text", "id", "language"])
def test_a_lone_surrogate_in_a_lines_file_is_one_line(tmp_path, key) -> None:
    """JSON's "\\ud800" is a lone surrogate, no text: the line was synthesized, and then its record (or, in an
    id, its file name) ended listen in UnicodeEncodeError's traceback."""
    _prompt(tmp_path)
    line = {"text": "hello there", "prompt_audio": "prompt.wav", "id": "a", "language": "en"}
    line[key] = f"{line[key]}\ud800"
    path = _lines(tmp_path, line)
    with pytest.raises(UserError, match=rf"^--lines {path} line 1: key '{key}' holds a lone surrogate"):
        read_lines_file(path)


def test_a_validation_line_with_a_lone_surrogate_is_no_candidate(tmp_path) -> None:
    """The default lines come from the run's validation manifests: such a line is passed over, as a bad line
    is, rather than heard and never recorded."""
    _prompt(tmp_path)
    manifest = tmp_path / "val.jsonl"
    manifest.write_text("".join(json.dumps({"id": uid, "prompt_audio_path": "prompt.wav", "target_text": text})
                                + "\n" for uid, text in (("bad", "hello \ud800"), ("good", "hello there"))))
    write_run_record(tmp_path, {"val_manifests": [str(manifest)]}, {}, {}, 0.0)
    assert [line.line_id for line in default_lines(tmp_path, seed=0)] == ["good"]


def test_a_record_with_a_lone_surrogate_is_kept_whole(tmp_path) -> None:
    """A path of bytes that are no UTF-8 reaches a record as a lone surrogate: appended escaped, it reads back as
    the same string, where the append ended listen in a traceback after the line was heard."""
    record = {"format": RECORD_FORMAT, "step": 2, "line_id": "a", "ok": True, "prompt_audio": "/data/caf\udce9/p.wav"}
    append_record(scores_path(tmp_path), record)
    assert read_records(scores_path(tmp_path)) == [record]


def test_a_prompt_that_is_a_fifo_or_a_folder_is_said_as_such(tmp_path) -> None:
    os.mkfifo(tmp_path / "fifo.wav")
    (tmp_path / "folder.wav").mkdir()
    for name, kind in (("fifo.wav", "a FIFO"), ("folder.wav", "a folder")):
        path = _lines(tmp_path, {"text": "hello", "prompt_audio": name})
        with pytest.raises(UserError, match=rf"prompt_audio {tmp_path / name} is {kind}.*, not an audio file"):
            read_lines_file(path)


def test_a_step_of_thousands_of_digits_is_one_line(tmp_path) -> None:
    """int() converts at most 4,300 digits: `--checkpoints step999...` ended in its ValueError's traceback."""
    for word in ("step" + "9" * 5000, "x" * 100_000):
        with pytest.raises(UserError, match=r"^--checkpoints '.{40}'\.\.\.: expected best, latest, stepN"):
            choose_checkpoints(tmp_path, word)


# ------------------------------------------------------------------ the inference program


@pytest.mark.slow  # starts the probe's process
def test_a_program_that_prints_without_end_is_read_in_bounded_memory(tmp_path, monkeypatch) -> None:
    """The probe kept all of its output: a program printing without end (`exec yes`) took gigabytes a minute
    until the probe's time limit."""
    monkeypatch.setattr(synthesize_module, "PROBE_TIMEOUT_S", 3)
    loud = tmp_path / "python"
    loud.write_text("#!/bin/sh\nexec yes\n")
    loud.chmod(0o755)
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux
    with pytest.raises(UserError, match=r"did not finish importing indextts.infer_v2 in 3 s \(is it a python\?\)"):
        resolve_inference_python(INDEXTTS2, loud)
    grown_mib = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) / 1024
    assert grown_mib < 4 * synthesize_module.KEPT_OUTPUT_BYTES / 2**20 + 64


@pytest.mark.slow  # starts the probe's process
def test_a_program_that_exits_0_without_being_a_python_is_refused(tmp_path) -> None:
    """An exit code 0 alone passed the probe (`--inference-python /bin/true`): every line then failed."""
    quiet = tmp_path / "python"
    quiet.write_text("#!/bin/sh\nexit 0\n")
    quiet.chmod(0o755)
    with pytest.raises(UserError, match=r"exited without running the import check \(is it a python\?\)"):
        resolve_inference_python(INDEXTTS2, quiet)


# ------------------------------------------------------------------ --listen-every


def test_due_steps_name_only_files_listen_can_hear(tmp_path) -> None:
    """`model_step².pth` (² is a digit to str.isdigit, not to int) ended training in a traceback; a FIFO or a
    folder under a step's name was named to every listener, which refused it, hearing none of the others."""
    (tmp_path / "model_step2.pth").write_bytes(b"ours")
    (tmp_path / "model_step².pth").write_bytes(b"someone's")
    os.mkfifo(tmp_path / "model_step4.pth")
    (tmp_path / "model_step6.pth").mkdir()
    (tmp_path / "model_step8.pth").symlink_to(tmp_path / "model_step2.pth")
    assert due_steps(tmp_path, 1, 2, last_step=8) == [2]


def test_a_waiting_step_that_rotation_removed_is_not_named(tmp_path, monkeypatch) -> None:
    """The next listener starts when the one before it ends, perhaps many saves after its steps were due: a
    file rotated away since made listen refuse the whole list, the files still there unheard."""
    started: list[list[str]] = []

    class Child:
        pid = 0

        def __init__(self, args, **kwargs) -> None:
            started.append(args)

        def wait(self) -> int:
            return 0

    monkeypatch.setattr(listening.subprocess, "Popen", Child)
    (tmp_path / "model_step4.pth").write_bytes(b"ours")
    listener = Listener(tmp_path, [], lambda line: None, lambda line: None)
    listener.hear([2, 4])  # model_step2.pth was rotated away before the child started
    assert started[0][started[0].index("--checkpoints") + 1] == "step4"
    listener.child = None
    listener.hear([2])  # nothing left to hear: no child
    assert len(started) == 1 and listener.child is None


@pytest.mark.parametrize(("settings", "refusal"), [
    ({"listen_device": "gpu"}, r"^--listen-device gpu: not a device the listener runs on"),
    ({"listen_device": "cuda:01"}, r"^--listen-device cuda:01: not a device"),
    ({"listen_inference_python": "/nonexistent/python"}, r"^--listen-inference-python /nonexistent/python: not an "
                                                         r"executable file"),
    ({"listen_asr_model": "/nonexistent/asr"}, r"^--listen-asr-model /nonexistent/asr: no such folder"),
    ({"listen_asr_model": "-"}, r"^--listen-asr-model -: no such folder, nor a Hugging Face id"),  # asked the hub
    ({"listen_asr_model": "am=en=zh"}, r"^--listen-asr-model am=en=zh: no such folder, nor a Hugging Face id"),
    ({"listen_asr_model": "my asr"}, r"^--listen-asr-model my asr: no such folder, nor a Hugging Face id"),
])
def test_listen_settings_are_checked_before_the_run(settings, refusal) -> None:
    """Each was taken, and every listener failed with it: said only in RUN/listen/listen.log once the trainer
    had ended (the check is for train/preflight.py to call before anything is made)."""
    train = SimpleNamespace(**{"listen_every": 1, "listen_device": "cpu", "listen_inference_python": "",
                               "listen_asr_model": "", **settings})
    with pytest.raises(UserError, match=refusal):
        check_listen_settings(train)
    check_listen_settings(SimpleNamespace(**{**vars(train), "listen_every": 0}))  # no listening: nothing to check


def test_good_listen_settings_pass(tmp_path) -> None:
    (tmp_path / "asr").mkdir()
    (tmp_path / "asr" / "config.json").write_text("{}")
    check_listen_settings(SimpleNamespace(listen_every=1, listen_device="auto", listen_inference_python=sys.executable,
                                         listen_asr_model=str(tmp_path / "asr")))
    check_listen_settings(SimpleNamespace(listen_every=1, listen_device="cpu", listen_inference_python="",
                                         listen_asr_model="openai/whisper-large-v3-turbo"))


# ------------------------------------------------------------------ the page


def test_the_page_bounds_its_alignment_work(tmp_path, monkeypatch) -> None:
    """Each transcript is aligned with its text to mark the errors, quadratic in their lengths: a crafted
    scores.jsonl of a few MB took about half an hour. Past the page's budget a transcript is shown unmarked."""
    budget = 3 * (200 + 1) * (201 + 1)  # three cells of a 200-character text and a 201-character transcript
    monkeypatch.setattr(page_module, "MAX_MARKED_CELLS", budget)
    aligned: list[int] = []
    real = page_module.alignment

    def counted(text: str, transcript: str):
        aligned.append((len(text) + 1) * (len(transcript) + 1))
        return real(text, transcript)

    monkeypatch.setattr(page_module, "alignment", counted)
    for number in range(10):
        append_record(scores_path(tmp_path), {"format": RECORD_FORMAT, "step": 2, "line_id": f"l{number}", "ok": True,
                                              "text": "ab" * 100, "transcript": f"{number}" + "ba" * 100, "cer": 1.0})
    page = render_page(tmp_path)
    assert sum(aligned) <= budget and len(aligned) == 3
    assert all(f"{number}{'ba' * 100}" in page for number in range(3, 10))  # unmarked, and shown


# ------------------------------------------------------------------ end to end


@pytest.fixture(scope="module")
def heard(tiny_data, tmp_path_factory) -> dict:
    """A tiny run, a stand-in model folder, the stand-in inference, a tiny ASR model and a lines file."""
    from indextts_train.prepare.tiny_asr import write_tiny_asr

    folder = tmp_path_factory.mktemp("round5")
    run = train_tiny_run(tiny_data, folder / "run", max_steps=2)
    model_dir = stand_in_inference_folder(folder / "model", tiny_data["config"])
    python = fake_inference_python(folder / "inference", "indextts.infer_v2", FAKE_INDEXTTS2)
    (folder / "inference" / "site" / "omegaconf.py").write_text(FAKE_OMEGACONF)  # the child reads config.yaml so
    _prompt(folder)
    lines = _lines(folder, *({"id": f"l{n}", "text": text, "prompt_audio": "prompt.wav", "language": "en"}
                             for n, text in enumerate(("Hello there.", "Good morning."))))
    return {"run": run, "folder": folder, "flags": ["--model-dir", str(model_dir), "--inference-python", str(python),
                                                    "--asr-model", str(write_tiny_asr(folder / "asr")), "--device",
                                                    "cpu", "--lines", str(lines), "--checkpoints", "latest"]}


def _listen(heard: dict, run: Path, line_s: float = 0.0, hold: Path | None = None) -> subprocess.Popen:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_HUB_CACHE": str(heard["folder"] / "hub"),
           "FAKE_LINE_S": str(line_s), "FAKE_HOLD": str(hold or "")}
    return subprocess.Popen([sys.executable, "-m", "indextts_train", "listen", str(run), *heard["flags"]], cwd=ROOT,
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


@pytest.mark.slow  # trains a tiny run and starts listen twice
def test_two_listens_at_once_hear_each_line_once(heard, tmp_path) -> None:
    """Each heard every pair the other was hearing: each WAV made twice, each record appended twice. Now the
    second says that it waits, and hears what is left: nothing. On a copy of the run no listen has heard yet
    (the module's other tests may have heard the module's run first)."""
    run = tmp_path / "run"
    shutil.copytree(heard["run"], run, ignore=shutil.ignore_patterns("listen"))
    hold = tmp_path / "go-on"  # the first hears its first line until the second is waiting: on a loaded machine
    first = _listen(heard, run, hold=hold)  # the second's start took longer than a timed first's whole work
    deadline = time.monotonic() + 300
    while not list(run.glob("listen/.model-*")) and time.monotonic() < deadline:
        time.sleep(0.2)  # the first is at work: its model folder is made
    second = _listen(heard, run)
    lines: list[str] = []
    reader = threading.Thread(target=lambda: [lines.append(line) for line in second.stdout], daemon=True)
    reader.start()
    while not any("is hearing" in line for line in lines) and second.poll() is None and time.monotonic() < deadline:
        time.sleep(0.2)  # the second is starting, then says that it waits
    hold.touch()
    said = [first.communicate(timeout=600)[0]]
    second.wait(timeout=600)
    reader.join(timeout=60)
    said.append("".join(lines))
    assert (first.returncode, second.returncode) == (0, 0), said
    assert "another `indextts-train listen` is hearing" in said[1]
    assert "already heard (2 lines); nothing to do" in said[1]
    records = read_records(scores_path(run))
    assert sorted(record["line_id"] for record in records) == ["l0", "l1"]
    assert "note: no CAMPPlus weights (campplus_cn_common.bin)" in said[0]  # said before its scores lacked it


@pytest.mark.slow  # hears the module's run (or finds it heard)
def test_pick_speaker_sim_says_the_checkpoints_were_heard_without_it(heard) -> None:
    """Heard without CAMPPlus weights, `export --pick speaker_sim` said to run listen first: that listen had
    nothing left to do, and the next pick said the same."""
    listened = _listen(heard, heard["run"])
    listened.communicate(timeout=600)
    out = heard["folder"] / "picked" / "gpt.pth"
    done = subprocess.run([sys.executable, "-m", "indextts_train", "export", str(heard["run"]), "--pick",
                           "speaker_sim", "-o", str(out)], capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert done.returncode == 2 and not out.exists()
    assert done.stderr.strip().endswith("were heard, but no speaker_sim was recorded for them (listen found no "
                                        "CAMPPlus weights, campplus_cn_common.bin, in the model folder's hf_cache/ "
                                        "nor the Hugging Face cache); pick by another score, or move "
                                        f"{heard['run'] / 'listen'} aside and hear them again"), done.stderr


def test_the_listen_lock_waits_for_the_holder(tmp_path) -> None:
    """Two descriptors of one folder, in two threads: the second waits, says so, and goes on once it is free."""
    from indextts_train.listen.lock import ListenLock

    first, second, said = ListenLock(tmp_path), ListenLock(tmp_path), []
    assert first.acquire(said.append) is False
    waited: list[bool] = []
    waiter = threading.Thread(target=lambda: waited.append(second.acquire(said.append)))
    waiter.start()
    deadline = time.monotonic() + 30
    while not said and time.monotonic() < deadline:
        time.sleep(0.05)
    assert waiter.is_alive() and said[0].startswith(f"another `indextts-train listen` is hearing {tmp_path}")
    first.release()
    waiter.join(timeout=30)
    assert waited == [True]
    second.release()


def test_a_board_that_cannot_open_says_listening_goes_on(tmp_path) -> None:
    """Listen's TensorBoard folder that cannot be made warned that "training goes on and checkpoints are still
    saved": listen trains nothing; its scores are in scores.jsonl and the page."""
    from indextts_train.listen.board import ListenBoard

    (tmp_path / "logs").write_text("a file where the folder goes")
    said: list[str] = []
    ListenBoard(tmp_path, said.append)
    assert len(said) == 1 and said[0].startswith("warning: TensorBoard logging stopped: could not open ")
    assert said[0].endswith("listening goes on, and scores.jsonl and index.html keep every score"), said


def test_a_half_written_wav_of_a_killed_child_is_removed_by_the_next_listen(tmp_path) -> None:
    """An inference child killed mid-line left RUN/listen/stepN/.LINE.PID.tmp.wav for good; the next listen that
    writes into that folder removes it (its writer is gone), and leaves one a live child is writing."""
    from indextts_train.listen.lines import Line
    from indextts_train.listen.run import _synthesis_lines

    gone = Path("/proc/sys/kernel/pid_max").read_text().strip()  # no process has it: every pid is below it
    folder = tmp_path / "listen" / "step4"
    folder.mkdir(parents=True)
    stale, live = folder / f".l0.{gone}.tmp.wav", folder / f".l1.{os.getpid()}.tmp.wav"
    for path in (stale, live, folder / "notes.tmp.wav"):
        path.write_bytes(b"RIFF")
    line = Line("l0", "Hello.", tmp_path / "prompt.wav", "en")
    assert [s.out_wav for s in _synthesis_lines(tmp_path / "listen", "step4", [line])] == [folder / "l0.wav"]
    assert not stale.exists() and live.exists() and (folder / "notes.tmp.wav").exists()
