"""Audio loading and both official resampling paths against the prepare oracle (reference README section 1)."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch

from indextts_train.prepare.audio import (
    AudioError,
    emotion_wave,
    load_audio,
    sinc_kernel,
    sinc_output_length,
    soxr_resample,
    speaker_wave,
)
from tests.conftest import REFERENCE

soundfile = pytest.importorskip("soundfile")
pytest.importorskip("soxr")

ORACLE = REFERENCE / "prepare"
CLIPS = ["a_44k1_stereo_pcm16", "b_22k05_mono_float", "c_16k_mono_pcm16", "d_16k_mono_float_long"]
ATOL = json.loads((ORACLE / "expected.json").read_text())["tolerances"]["audio/*.spk16k.npy"]["atol"]


def _oracle(clip: str, kind: str) -> np.ndarray:
    return np.load(ORACLE / "audio" / f"{clip}.{kind}.npy")


def _assert_close(ours: np.ndarray, official: np.ndarray) -> None:
    assert ours.dtype == np.float32
    assert ours.shape == official.shape
    assert float(np.abs(ours - official).max()) <= ATOL


@pytest.mark.parametrize("clip", CLIPS)
def test_both_paths_equal_the_official_waveforms(clip: str) -> None:
    mono, rate = load_audio(ORACLE / "audio" / f"{clip}.wav")
    _assert_close(soxr_resample(mono, rate, 22050), _oracle(clip, "librosa22050"))
    _assert_close(speaker_wave(mono, rate, 15.0), _oracle(clip, "spk16k"))
    _assert_close(emotion_wave(mono, rate, 15.0), _oracle(clip, "emo16k"))


def test_16k_files_round_trip_on_the_speaker_path_and_not_on_the_emotion_path() -> None:
    mono, rate = load_audio(ORACLE / "audio" / "d_16k_mono_float_long.wav")
    assert rate == 16000 and mono.shape == (32800,)
    assert np.array_equal(emotion_wave(mono, rate, 15.0), mono)  # emotion path: the file's own samples
    assert speaker_wave(mono, rate, 15.0).shape == (32801,)  # 16 k -> 22.05 k -> 16 k gains a sample


def test_stereo_is_the_float32_channel_mean(tmp_path) -> None:
    left = np.linspace(-0.5, 0.5, 1000, dtype=np.float32)
    right = np.float32(0.25) * np.cos(np.arange(1000, dtype=np.float32))
    path = tmp_path / "st.wav"
    soundfile.write(path, np.stack([left, right], axis=1), 8000, subtype="FLOAT")
    mono, rate = load_audio(path)
    assert rate == 8000
    assert np.array_equal(mono, (left + right) / np.float32(2))


def test_the_cut_happens_at_22050_before_the_sinc_step(tmp_path) -> None:
    # 16 s at 8 kHz: the speaker path keeps int(15 * 22050) samples, then 240,000 at 16 kHz.
    wave = np.random.default_rng(0).uniform(-0.3, 0.3, 16 * 8000).astype(np.float32)
    path = tmp_path / "long.wav"
    soundfile.write(path, wave, 8000, subtype="FLOAT")
    mono, rate = load_audio(path)
    assert speaker_wave(mono, rate, 15.0).shape == (240000,)
    assert emotion_wave(mono, rate, 15.0).shape == (240000,)
    assert speaker_wave(mono, rate, None).shape == (256000,)  # targets are never cut


def test_sinc_kernel_is_torchaudios_shape_and_a_lowpass_of_unit_gain() -> None:
    kernel, width = sinc_kernel(441, 320)
    assert width == 9 and kernel.shape == (320, 1, 459) and kernel.dtype == torch.float32
    dc_gain = kernel.double().sum(dim=-1)  # every phase passes a constant at gain ~1
    assert float((dc_gain - 1).abs().max()) < 1e-2


def test_output_length_rounds_the_quotient_in_float32_like_torchaudio() -> None:
    for n in (30209, 22050, 45203, 330750):
        assert sinc_output_length(n, 22050, 16000) == math.ceil(320 * n / 441)
    # A long input whose exact quotient is an integer + 1/441: float32 rounds it to the integer.
    n = next(k for k in range(200000, 300000) if 320 * k % 441 == 1)
    torchaudio_rule = int(torch.ceil(torch.as_tensor(320 * n / 441)).item())  # the expression torchaudio runs
    assert sinc_output_length(n, 22050, 16000) == torchaudio_rule == 320 * n // 441
    assert speaker_wave(np.zeros(n, dtype=np.float32), 22050, None).shape == (torchaudio_rule,)


def test_a_segment_is_the_same_samples_as_slicing_the_whole_file() -> None:
    path = ORACLE / "audio" / "c_16k_mono_pcm16.wav"
    whole, _ = load_audio(path)
    part, rate = load_audio(path, offset_seconds=0.25, duration_seconds=0.5)
    assert np.array_equal(part, whole[4000:12000]) and rate == 16000


def test_an_mp3_clip_loads_like_any_other(tmp_path) -> None:
    if "MP3" not in soundfile.available_formats():
        pytest.skip("this libsndfile has no MP3 support")
    tone = (0.3 * np.sin(np.arange(24000) * 2 * np.pi * 440 / 24000)).astype(np.float32)
    path = tmp_path / "clip.mp3"
    soundfile.write(path, tone, 24000, format="MP3")
    mono, rate = load_audio(path)
    assert rate == 24000 and mono.dtype == np.float32 and abs(mono.shape[0] - 24000) < 2400
    assert speaker_wave(mono, rate, 15.0).shape == (sinc_output_length(int(np.ceil(mono.shape[0] * 22050 / 24000)),
                                                                       22050, 16000),)


def test_an_offset_past_the_end_is_a_reason_not_a_crash() -> None:
    with pytest.raises(AudioError, match="offset 3 s lies outside"):
        load_audio(ORACLE / "audio" / "c_16k_mono_pcm16.wav", offset_seconds=3.0)


@pytest.mark.parametrize("case", ["missing", "garbage", "empty", "nan", "too_long"])
def test_bad_audio_raises_audio_error_with_a_reason(tmp_path, case: str) -> None:
    path = tmp_path / f"{case}.wav"
    if case == "garbage":
        path.write_bytes(b"RIFF this is not a wave file")
    elif case == "empty":
        soundfile.write(path, np.zeros(0, dtype=np.float32), 16000)
    elif case == "nan":
        soundfile.write(path, np.array([0.1, np.nan, 0.2], dtype=np.float32), 16000, subtype="FLOAT")
    elif case == "too_long":
        soundfile.write(path, np.zeros(16000 * 3, dtype=np.float32), 16000)
    with pytest.raises(AudioError) as caught:
        load_audio(path, max_seconds=2.0)
    reason = str(caught.value)
    assert "\n" not in reason
    expected = {"missing": str(path), "garbage": str(path), "empty": "empty", "nan": "NaN", "too_long": "3.0 s"}
    assert expected[case] in reason
