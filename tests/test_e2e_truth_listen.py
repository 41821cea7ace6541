"""What listening says, against what it did: the numbers TensorBoard shows for a heard checkpoint, and which
checkpoints `--listen-every` hears when a run ends before its last step."""

from __future__ import annotations

import json
import time
from pathlib import Path

import numpy as np
import pytest
import soundfile
from helpers import stand_in_inference_folder, train_tiny_run

from indextts_train.checkpoint.scores import scores_path, summary_by_step
from indextts_train.listen import board as board_module
from indextts_train.listen import run as run_module
from indextts_train.listen.synthesize import SynthesisResult, line_seed
from indextts_train.train import listening
from indextts_train.train.listening import Listener

# ------------------------------------------------------------------ TensorBoard's listen/cer of a checkpoint


class _Writer:
    """A TensorBoard writer that keeps what it was given."""

    def __init__(self, scalars: list) -> None:
        self.scalars = scalars

    def add_scalar(self, tag: str, value: float, step: int) -> None:
        self.scalars.append((tag, value, step))

    def add_audio(self, *args, **kwargs) -> None:
        pass

    def flush(self) -> None:
        pass

    def close(self) -> None:
        pass


def _tone_synthesis(model_dir, family, lines, *, seed, device, inference_python, log_path):
    """The inference child's part: each line a second of a tone (no child process)."""
    results = []
    for number, line in enumerate(lines):
        t = np.arange(16000) / 16000.0
        soundfile.write(line.out_wav, (np.sin(2 * np.pi * (220 + 90 * number) * t) * 0.3).astype(np.float32), 16000)
        results.append(SynthesisResult(line.line_id, line.out_wav, 0.1, True, None, line_seed(seed, line.line_id)))
    return results


def _lines_file(folder: Path, texts: list[str]) -> Path:
    path = folder / f"lines{len(texts)}.jsonl"
    path.write_text("".join(json.dumps({"id": f"l{n}", "text": text, "prompt_audio": str(folder / "prompt.wav"),
                                        "language": "en"}) + "\n" for n, text in enumerate(texts)))
    return path


@pytest.mark.slow  # trains a tiny run and loads a tiny ASR model
def test_tensorboard_shows_the_checkpoint_s_mean_over_all_its_lines(tiny_data, tmp_path, monkeypatch) -> None:
    """A listen that heard the rest of a checkpoint's lines (a rerun after a kill, or a lines file grown by a
    line) put the mean of those lines alone at the step in TensorBoard's listen/cer, where `checkpoints`, the
    page and `export --pick` take the mean over every line of the checkpoint."""
    from indextts_train.prepare.tiny_asr import write_tiny_asr

    run = train_tiny_run(tiny_data, tmp_path / "run", max_steps=2)
    model_dir = stand_in_inference_folder(tmp_path / "model", tiny_data["config"])
    soundfile.write(tmp_path / "prompt.wav", (np.sin(np.arange(16000) / 7.0) * 0.3).astype(np.float32), 16000)
    scalars: list = []
    monkeypatch.setattr(board_module, "open_tensorboard", lambda *args: _Writer(scalars))
    monkeypatch.setattr(run_module, "synthesize", _tone_synthesis)
    monkeypatch.setattr(run_module, "resolve_inference_python", lambda *args, **kwargs: None)
    asr = write_tiny_asr(tmp_path / "asr")
    texts = ["Hello there.", "Good morning to you all, my friends."]
    for count in (1, 2):  # the first listen hears l0; the second only l1, which it adds to the checkpoint
        options = run_module.ListenOptions(run_dir=run, checkpoints="step2", lines=_lines_file(tmp_path, texts[:count]),
                                           asr_model=str(asr), model_dir=model_dir, device="cpu", say=lambda _: None)
        assert run_module.listen(options)[1] == 0
    records = [json.loads(line) for line in scores_path(run).read_text().splitlines()]
    assert [r["line_id"] for r in records] == ["l0", "l1"] and records[0]["cer"] != records[1]["cer"]
    shown = [value for tag, value, step in scalars if tag == "listen/cer" and step == 2]
    assert shown[-1] == pytest.approx(summary_by_step(run)[2]["cer"])  # was records[1]["cer"] alone


# ------------------------------------------------------------------ --listen-every: the last checkpoint


class _Child:
    pid = 1 << 22

    def wait(self, timeout=None) -> int:
        return 0


def _started(monkeypatch) -> list[list[str]]:
    started: list[list[str]] = []

    def popen(args, **kwargs):
        started.append(args)
        return _Child()

    monkeypatch.setattr(listening.subprocess, "Popen", popen)
    monkeypatch.delenv("RANK", raising=False)
    return started


def _checkpoint(folder: Path, step: int) -> Path:
    path = folder / f"model_step{step}.pth"
    path.write_bytes(b"a checkpoint")
    return path


def test_an_early_stopped_run_hears_its_last_checkpoint(tmp_path, monkeypatch) -> None:
    """--listen-every hears 'the last one', always: a run that early-stopped at step 4 (not a due step: every 3rd
    save of every 2 steps) ended with its last checkpoint unheard, and no listener started at all."""
    started = _started(monkeypatch)
    listener = Listener(tmp_path, ["--device", "cpu"], lambda _: None, lambda _: None)
    for step in (2, 4):  # saved, not due
        _checkpoint(tmp_path, step)
        listener.wrote(step)
    listener.hand_over()  # the run is done; no step was due
    assert len(started) == 1
    assert started[0][started[0].index("--checkpoints") + 1] == "step4"


def test_a_run_that_ended_on_a_due_step_or_wrote_nothing_starts_no_listener_at_the_end(tmp_path, monkeypatch) -> None:
    """What was due was named to the listener (and heard): no second listener. A run that saved nothing (a rerun
    of a finished run: the folder's checkpoints are an earlier run's) has no last checkpoint of its own to hear."""
    started = _started(monkeypatch)
    _checkpoint(tmp_path, 6)
    Listener(tmp_path, [], lambda _: None, lambda _: None).hand_over()
    assert started == []
    listener = Listener(tmp_path, [], lambda _: None, lambda _: None)
    _checkpoint(tmp_path, 8)
    listener.wrote(8)
    listener.hear([6, 8])
    for _ in range(100):  # the watcher thread sees the child end
        if listener.child is None:
            break
        time.sleep(0.01)
    listener.hand_over()
    assert len(started) == 1


# ------------------------------------------------------------------ the demo's failed lines


def test_the_demo_s_failed_lines_name_where_each_reason_is(tmp_path, monkeypatch, capsys) -> None:
    """`demo` sent every failed line to synthesis.log, which holds only what the inference child printed: a line
    whose scoring failed (an unreadable WAV, the ASR model) is told in scores.jsonl alone."""
    from indextts_train.config.family import INDEXTTS25
    from indextts_train.listen import demo as demo_module

    (tmp_path / "listen_model").mkdir()
    (tmp_path / "listen_model" / "s2mel.pth").write_bytes(b"made")
    (tmp_path / "asr").mkdir()
    (tmp_path / "asr" / "config.json").write_text("{}")
    page = tmp_path / "run" / "listen" / "index.html"
    monkeypatch.setattr(demo_module, "listen", lambda options: (page, 1))
    assert demo_module.listen_to_demo(tmp_path, INDEXTTS25, Path("python"), "", wide=True) == 0
    assert str(page.parent / "scores.jsonl") in capsys.readouterr().out
