"""Synthesis with the real official inference packages, each in its own environment, on tiny random folders.

Run by scripts/test_listen.sh (a lane of scripts/test.sh), which makes or reuses the two environments
and names their interpreters in INDEXTTS_TEST_PYTHON_V25 and INDEXTTS_TEST_PYTHON_V2; the main run
does not collect this file (conftest.py). Offline: HF_HUB_OFFLINE=1, and an empty Hugging Face home,
so every file the official code loads must come from the folder.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import time
import wave
from pathlib import Path

import pytest

from indextts_train.config.family import INDEXTTS2, INDEXTTS25
from indextts_train.config.settings import load_config
from indextts_train.data.demo_data import _make_base_tokenizer, _make_base_vocabulary
from indextts_train.listen.model_folder import make_model_folder
from indextts_train.listen.synthesize import SynthesisLine, resolve_inference_python, synthesize
from indextts_train.listen.tiny_folder import tiny_gpt_config, write_tiny_inference_dir
from indextts_train.prepare.tiny import write_synthetic_clips

pytestmark = pytest.mark.slow  # every test here: the official inference runs in its own interpreter

PYTHONS = {INDEXTTS25: "INDEXTTS_TEST_PYTHON_V25", INDEXTTS2: "INDEXTTS_TEST_PYTHON_V2"}
TEXTS = {"one": "hello world, this is a test.", "two": "hello world, this is a test."}
# A random GPT seldom stops, so the cap sets each line's work: at the tiny config's 60 codes, IndexTTS2's
# generation (a 1280-wide GPT, 3 beams) took about 2 minutes a line on the shared 2-core machine
MAX_CODES = 24


@pytest.fixture(scope="module", autouse=True)
def offline(tmp_path_factory):
    """No hub: an empty Hugging Face home, offline; what the children inherit."""
    home = tmp_path_factory.mktemp("hf_home")
    saved = {name: os.environ.get(name) for name in ("HF_HOME", "HF_HUB_OFFLINE", "HF_HUB_CACHE")}
    os.environ.update(HF_HOME=str(home), HF_HUB_OFFLINE="1")
    os.environ.pop("HF_HUB_CACHE", None)
    yield
    for name, value in saved.items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value


@pytest.fixture(scope="module", params=[pytest.param(INDEXTTS25, id="v25", marks=pytest.mark.xdist_group("v25")),
                                        pytest.param(INDEXTTS2, id="v2", marks=pytest.mark.xdist_group("v2"))])
def tiny(request, tmp_path_factory) -> dict:
    """A tiny inference folder of the family, its interpreter, and a prompt clip."""
    family = request.param
    python = resolve_inference_python(family, Path(os.environ[PYTHONS[family]]))
    work = tmp_path_factory.mktemp(f"work_{family}")
    gpt = load_config(tiny_gpt_config(family, work)).gpt
    if family is INDEXTTS25:
        tokenizer = _make_base_vocabulary(work, gpt)
    else:
        tokenizer = _make_base_tokenizer(work / "bpe.model", gpt, seed=0)
    started = time.perf_counter()
    model_dir = write_tiny_inference_dir(work / "model", family, tokenizer=tokenizer, inference_python=python,
                                         seed=0, work=work)
    print(f"\n{family}: tiny inference folder written in {time.perf_counter() - started:.1f} s")
    write_synthetic_clips(work / "clips", [("a prompt", "en")], speakers=1, seed=0, seconds=(1.0, 1.2))
    return {"family": family, "python": python, "model_dir": model_dir, "prompt": work / "clips" / "utt0000.wav"}


def _speak(tiny: dict, folder: Path, out: Path, seed: int) -> dict[str, bytes]:
    lines = [SynthesisLine(line_id, text, tiny["prompt"], out / f"{line_id}.wav", "de")
             for line_id, text in TEXTS.items()]
    started = time.perf_counter()
    results = synthesize(folder, tiny["family"], lines, seed=seed, device="cpu", inference_python=tiny["python"],
                         log_path=out / "child.log", threads=1, max_mel_tokens=MAX_CODES)
    per_line = [round(r.seconds, 2) for r in results]
    print(f"{tiny['family']}: {time.perf_counter() - started:.1f} s for {len(lines)} lines (load included), "
          f"synthesis {per_line} s per line")
    assert all(r.ok for r in results), [r.error for r in results]
    return {r.line_id: r.out_wav.read_bytes() for r in results}


def test_seeded_synthesis_is_reproducible(tiny, tmp_path) -> None:
    """The export of a checkpoint, heard twice with the same seed in two processes: the same WAV bytes. The
    two lines differ only by id (so by seed): their WAVs differ, so the seed is what decides."""
    folder = make_model_folder(tiny["model_dir"] / "gpt.pth", tiny["model_dir"], tmp_path / "folder", tokenizer=None)
    first = _speak(tiny, folder, tmp_path / "first", seed=11)
    second = _speak(tiny, folder, tmp_path / "second", seed=11)
    assert {k: hashlib.sha256(v).hexdigest() for k, v in first.items()} == \
        {k: hashlib.sha256(v).hexdigest() for k, v in second.items()}
    assert first["one"] != first["two"]
    with wave.open(str(tmp_path / "first" / "one.wav")) as handle:
        assert handle.getframerate() == 22050 and handle.getsampwidth() == 2 and handle.getnframes() > 0
    assert not list((tmp_path / "first").glob(".*.tmp.wav"))  # written under a temporary name, then renamed


PARENT = """
import sys
from pathlib import Path
from indextts_train.config.family import family_named
from indextts_train.listen.synthesize import SynthesisLine, synthesize
folder, family, python, prompt, out = sys.argv[1:6]
lines = [SynthesisLine("one", "hello world", Path(prompt), Path(out) / "one.wav", "de")]
synthesize(Path(folder), family_named(family), lines, seed=1, device="cpu", inference_python=Path(python), threads=1)
"""


def _children(pid: int) -> list[int]:
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid:
            found.append(int(stat.parent.name))
    return found


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"  # a zombie has ended; whoever adopted it reaps it when it likes


def test_a_killed_parent_takes_its_synthesis_child_along(tiny, tmp_path) -> None:
    """SIGKILL of the process that called synthesize (what a killed `listen` is): its child goes too, and no
    WAV appears."""
    parent = subprocess.Popen([sys.executable, "-c", PARENT, str(tiny["model_dir"]), tiny["family"].key,
                               str(tiny["python"]), str(tiny["prompt"]), str(tmp_path / "out")])
    deadline = time.monotonic() + 120
    while not (children := _children(parent.pid)) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert children, "the child never started"
    time.sleep(0.5)  # killed before or after the child's first statements: either way it must end
    parent.kill()
    parent.wait()
    deadline = time.monotonic() + 60
    while any(_alive(pid) for pid in children) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not any(_alive(pid) for pid in children)
    assert not (tmp_path / "out" / "one.wav").exists()
