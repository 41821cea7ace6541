"""listen/run.py's checks before any work, in the main lane (test_listen_run.py, end to end with the real
inference packages, is the listen lane's): --device, then the inference environment, then the ASR model.

The run's checkpoints and the ASR model are stand-ins (what is checked here comes before either is read); the
lines, the model folder and the run folder are real, and so is the probe of the inference interpreter."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from helpers import ROOT, fake_inference_python, stand_in_inference_folder

from indextts_train.errors import UserError
from indextts_train.listen import run as listen_run
from indextts_train.listen.choose import Chosen
from indextts_train.listen.run import ListenOptions, plan, resolve_device


def test_a_device_torch_cannot_parse_is_one_line() -> None:
    """Digits prepare's rule lets through but torch.device will not parse ended in torch's RuntimeError."""
    for bad in ("cuda:01", "cuda:99999999999999999999"):
        with pytest.raises(UserError, match=rf"^--device {bad}: not a device the models run on; use cpu, cuda or "
                                            r"cuda:N"):
            resolve_device(bad)


def test_a_gpu_index_past_the_machines_count_is_one_line(monkeypatch) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)  # a machine with two GPUs, on any machine
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    assert resolve_device("cuda:1") == "cuda:1"
    with pytest.raises(UserError, match=r"^--device cuda:7: this machine has 2 GPU\(s\), cuda:0 to cuda:1$"):
        resolve_device("cuda:7")


@pytest.fixture
def inputs(tmp_path, monkeypatch) -> dict:
    """A run folder with one checkpoint to hear (a stand-in: chosen, never read here), a lines file, an IndexTTS2
    model folder with what the official inference needs (stand-in bytes), and `said`: every progress line, and
    "ASR loaded" where the ASR model would load."""
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    monkeypatch.setattr(listen_run, "choose_checkpoints",
                        lambda run, which: ([Chosen(2, run / "model_step2.pth")], []))
    said: list[str] = []
    monkeypatch.setattr(listen_run, "load_recogniser", lambda model, device: said.append("ASR loaded"))
    (tmp_path / "prompt.wav").write_bytes(b"RIFF stand-in")
    lines = tmp_path / "lines.jsonl"
    lines.write_text(json.dumps({"text": "Hello there.", "prompt_audio": "prompt.wav"}) + "\n", encoding="utf-8")
    model_dir = stand_in_inference_folder(tmp_path / "model", ROOT / "configs" / "tiny.yaml")
    return {"run": run_dir, "lines": lines, "model_dir": model_dir, "said": said, "folder": tmp_path}


def _options(inputs: dict, python: Path, device: str = "cpu") -> ListenOptions:
    return ListenOptions(run_dir=inputs["run"], lines=inputs["lines"], model_dir=inputs["model_dir"],
                         inference_python=python, device=device, say=inputs["said"].append)


@pytest.mark.slow  # starts the probe's process
def test_the_probe_is_announced_and_comes_before_the_asr_model(inputs) -> None:
    """The probe may wait minutes (a cold import, or a program that never exits, up to its limit): listen said
    nothing meanwhile. Now one line says what is checked and for how long, and the ASR model loads after."""
    python = fake_inference_python(inputs["folder"], "indextts.infer_v2", "")
    work = plan(_options(inputs, python))
    assert work.python == python and work.device == "cpu"
    assert inputs["said"] == [f"checking that --inference-python {python} imports indextts.infer_v2 (waiting up to "
                              f"300 s)", "ASR loaded"]


@pytest.mark.slow  # starts the probe's process
def test_a_broken_inference_module_is_refused_before_the_asr_model(inputs) -> None:
    """Installed, but its module fails on import: one line before the ASR model loads (it was found by
    find_spec, and every line failed after the ASR model loaded and synthesis began)."""
    python = fake_inference_python(inputs["folder"], "indextts.infer_v2",
                                   "raise ImportError(\"cannot import name 'IndexTTS2'\")\n")
    with pytest.raises(UserError, match=r"cannot import indextts.infer_v2, the IndexTTS2 inference code "
                                        r"\(ImportError: cannot import name 'IndexTTS2'\)"):
        plan(_options(inputs, python))
    assert "ASR loaded" not in inputs["said"]
    assert not (inputs["run"] / "listen").exists()  # nothing written


def test_a_bad_device_is_refused_before_the_probe_and_the_asr_model(inputs) -> None:
    with pytest.raises(UserError, match=r"^--device foo: not a device the models run on"):
        plan(_options(inputs, inputs["folder"] / "no-python", device="foo"))
    assert inputs["said"] == []
