"""Scoring real WAVs with a tiny random ASR model and tiny CAMPPlus weights built here (offline)."""

from __future__ import annotations

import huggingface_hub
import numpy as np
import pytest
import soundfile

from indextts_train.errors import UserError
from indextts_train.listen.asr import load_recogniser
from indextts_train.listen.lines import Line
from indextts_train.listen.score import Voice, score_wav
from indextts_train.listen.text_score import cer
from indextts_train.prepare.campplus import write_tiny_campplus
from indextts_train.prepare.tiny_asr import write_tiny_asr

pytestmark = pytest.mark.slow  # transformers and two models load: seconds, not milliseconds


def _wav(path, seconds, pitch, rate=22_050, seed=0):
    t = np.arange(int(seconds * rate)) / rate
    noise = np.random.default_rng(seed).normal(0, 0.02, t.shape)
    soundfile.write(path, (0.3 * np.sin(2 * np.pi * pitch * t) + noise).astype(np.float32), rate)
    return path


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    folder = tmp_path_factory.mktemp("models")
    write_tiny_campplus(folder / "campplus.bin", seed=3)
    recogniser = load_recogniser(str(write_tiny_asr(folder / "asr", seed=1)), "cpu")
    return recogniser, Voice.load(folder / "campplus.bin", "cpu")


def test_scores_of_a_wav(tmp_path, models):
    recogniser, voice = models
    prompt = _wav(tmp_path / "prompt.wav", 1.5, 220)
    other = _wav(tmp_path / "other.wav", 2.0, 660, rate=16_000, seed=1)
    reference = _wav(tmp_path / "ref.wav", 1.0, 300)
    line = Line("l1", "Hello there, world!", prompt, "en", reference)
    same = score_wav(line, prompt, recogniser, voice)
    assert same["speaker_sim"] == pytest.approx(1.0, abs=1e-5)  # the prompt itself: the same speaker
    assert same["seconds"] == pytest.approx(1.5) and same["reference_seconds"] == pytest.approx(1.0)
    assert same["length_ratio"] == pytest.approx(1.5)
    scores = score_wav(line, other, recogniser, voice)
    assert -1.0 <= scores["speaker_sim"] < 0.999
    assert scores["cer"] == cer(line.text, scores["transcript"])
    assert scores["wer"] is not None  # three words
    assert scores == score_wav(line, other, recogniser, voice)  # deterministic
    assert recogniser.label["parameters"] < 100_000 and recogniser.label["kind"] == "ctc"


def test_missing_asr_model_is_one_line(tmp_path, monkeypatch):
    # as a user who set HF_HUB_OFFLINE before starting: the hub reads it once, when it is imported (set here
    # alone, the hub went online and spent 23 s in retries before the same line)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "empty-cache"))
    with pytest.raises(UserError, match="--asr-model nobody/no-such-asr-model: not a local folder and not in the"):
        load_recogniser("nobody/no-such-asr-model", "cpu")
    (tmp_path / "empty").mkdir()
    with pytest.raises(UserError, match="no config.json"):
        load_recogniser(str(tmp_path / "empty"), "cpu")
