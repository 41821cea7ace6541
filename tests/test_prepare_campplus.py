"""The 2.5 speaker vector against the official code's outputs (tests/data/reference/prepare, section 7)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from indextts_train.errors import UserError
from indextts_train.prepare.campplus import (
    MEL_BINS,
    MIN_SAMPLES,
    TINY_SIZES,
    CampPlus,
    campplus_shapes,
    kaldi_fbank,
    write_tiny_campplus,
)
from tests.conftest import REFERENCE

PREPARE = REFERENCE / "prepare"
CLIPS = ["a_44k1_stereo_pcm16", "b_22k05_mono_float", "c_16k_mono_pcm16", "d_16k_mono_float_long"]
WEIGHTS = PREPARE / "campplus" / "campplus.pth"
CPU = torch.device("cpu")


pytestmark = pytest.mark.usefixtures("one_torch_thread")  # conftest: small ops, one thread


@pytest.fixture(scope="module")
def campplus() -> CampPlus:
    return CampPlus.load(WEIGHTS, CPU)


def _spk16k(clip: str) -> np.ndarray:
    return np.load(PREPARE / "audio" / f"{clip}.spk16k.npy")


@pytest.mark.parametrize("clip", CLIPS)
def test_fbank_equals_torchaudio_kaldi_fbank(clip: str) -> None:
    wave = _spk16k(clip)
    expected = np.load(PREPARE / "campplus" / f"{clip}.fbank.npy")
    fbank = kaldi_fbank(wave)
    assert fbank.dtype == torch.float32
    assert tuple(fbank.shape) == expected.shape == (1 + (len(wave) - 400) // 160, MEL_BINS)
    np.testing.assert_allclose(fbank.numpy(), expected, rtol=0, atol=1e-3)


def test_fbank_frame_count_edges() -> None:
    rng = np.random.default_rng(0)
    assert tuple(kaldi_fbank(rng.uniform(-1, 1, 399).astype(np.float32)).shape) == (0, MEL_BINS)
    for samples, frames in ((400, 1), (559, 1), (560, 2), (720, 3)):
        assert kaldi_fbank(rng.uniform(-1, 1, samples).astype(np.float32)).shape[0] == frames
    with pytest.raises(ValueError, match="1-D"):
        kaldi_fbank(np.zeros((2, 800), dtype=np.float32))


@pytest.mark.parametrize("clip", CLIPS)
def test_speaker_vector_equals_official_campplus(campplus: CampPlus, clip: str) -> None:
    expected = np.load(PREPARE / "campplus" / f"{clip}.spk_emb.npy")
    stored_fbank = torch.from_numpy(np.load(PREPARE / "campplus" / f"{clip}.fbank.npy"))
    from_stored = campplus.speaker_vector_of_fbank(stored_fbank)
    from_wave = campplus.speaker_vector(_spk16k(clip))
    assert from_stored.shape == from_wave.shape == (192,)
    assert from_stored.dtype == from_wave.dtype == np.float32
    np.testing.assert_allclose(from_stored, expected, rtol=0, atol=1e-4)
    np.testing.assert_allclose(from_wave, expected, rtol=0, atol=1e-3)


def test_mean_subtraction_is_part_of_the_rule(campplus: CampPlus) -> None:
    """2.5 subtracts each bin's utterance mean: a constant shift of the fbank changes nothing."""
    fbank = torch.from_numpy(np.load(PREPARE / "campplus" / f"{CLIPS[3]}.fbank.npy"))[:40]
    shifted = campplus.speaker_vector_of_fbank(fbank + torch.linspace(-3, 3, MEL_BINS))
    np.testing.assert_allclose(shifted, campplus.speaker_vector_of_fbank(fbank), rtol=0, atol=1e-4)


def test_too_short_for_a_speaker_vector(campplus: CampPlus) -> None:
    wave = np.random.default_rng(1).uniform(-0.5, 0.5, MIN_SAMPLES).astype(np.float32)
    assert np.isfinite(campplus.speaker_vector(wave)).all()
    with pytest.raises(ValueError, match=f"at least {MIN_SAMPLES} samples"):
        campplus.speaker_vector(wave[:-1])


def test_layout_is_the_official_one() -> None:
    state = torch.load(WEIGHTS, weights_only=True)
    shapes = campplus_shapes(TINY_SIZES)
    assert list(shapes) == list(state)
    assert all(tuple(state[k].shape) == shape for k, shape in shapes.items())


def test_load_is_strict(tmp_path) -> None:
    state = torch.load(WEIGHTS, weights_only=True)
    broken = {
        "missing": {k: v for k, v in state.items() if k != "xvector.block2.tdnnd3.linear1.weight"},
        "unexpected": {**state, "xvector.extra.weight": torch.zeros(1)},
        "mis-shaped": {**state, "head.bn2.bias": torch.zeros(31)},
    }
    for label, bad in broken.items():
        path = tmp_path / f"{label}.pth"
        torch.save(bad, path)
        with pytest.raises(UserError, match=f"{path}.*1 {label}"):
            CampPlus.load(path, CPU)
    not_campplus = tmp_path / "other.pth"
    torch.save({"weight": torch.zeros(3)}, not_campplus)
    with pytest.raises(UserError, match="not a CAMPPlus state dict"):
        CampPlus.load(not_campplus, CPU)
    garbage = tmp_path / "garbage.bin"
    garbage.write_bytes(b"not a torch file")
    with pytest.raises(UserError, match="cannot read the CAMPPlus weights"):
        CampPlus.load(garbage, CPU)
    with pytest.raises(UserError, match="no such file"):
        CampPlus.load(tmp_path / "absent.bin", CPU)


def test_load_bounds_the_file_size(tmp_path, monkeypatch) -> None:
    monkeypatch.setattr("indextts_train.prepare.campplus.MAX_WEIGHTS_BYTES", WEIGHTS.stat().st_size - 1)
    with pytest.raises(UserError, match="too large for the CAMPPlus weights"):
        CampPlus.load(WEIGHTS, CPU)


def test_tiny_weights_are_seeded_and_load(tmp_path) -> None:
    write_tiny_campplus(tmp_path / "a.pth", seed=5)
    write_tiny_campplus(tmp_path / "b.pth", seed=5)
    write_tiny_campplus(tmp_path / "c.pth", seed=6)
    wave = _spk16k(CLIPS[0])[:1600]  # 0.1 s keeps three forward passes cheap
    models = [CampPlus.load(tmp_path / name, CPU) for name in ("a.pth", "b.pth", "c.pth")]
    assert models[0].sizes == TINY_SIZES
    vectors = [model.speaker_vector(wave) for model in models]
    assert vectors[0].shape == (192,) and np.isfinite(vectors[0]).all()
    np.testing.assert_array_equal(vectors[0], vectors[1])
    assert not np.array_equal(vectors[0], vectors[2])


def test_campplus_runs_without_tf32(campplus: CampPlus, monkeypatch) -> None:
    """cuDNN runs fp32 convolutions in TF32 by default, above the 1e-4 tolerance."""
    monkeypatch.setattr(torch.backends.cudnn, "allow_tf32", True)
    seen: list[bool] = []
    conv1d = torch.nn.functional.conv1d

    def spy(*args, **kwargs):
        seen.append(torch.backends.cudnn.allow_tf32)
        return conv1d(*args, **kwargs)

    monkeypatch.setattr(torch.nn.functional, "conv1d", spy)
    campplus.speaker_vector(_spk16k(CLIPS[2])[:1600])
    assert seen and not any(seen)
    assert torch.backends.cudnn.allow_tf32
