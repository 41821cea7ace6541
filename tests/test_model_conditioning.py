"""condition / emo_vec from the GPT's carried encoders against the official UnifiedVoice
(tests/data/reference/prepare/README.md, section 5; weights tests/data/reference/tiny/gpt.pth)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from indextts_train.checkpoint.base import load_base_checkpoint
from indextts_train.config.settings import GPTConfig, load_config
from indextts_train.errors import UserError
from indextts_train.model.conditioning import ConditioningEncoders, full_float32, official_lengths
from tests.conftest import REFERENCE

PREPARE = REFERENCE / "prepare"
CPU = torch.device("cpu")
EMO_KEYS = ("emo_conditioning_encoder.", "emo_perceiver_encoder.", "emovec_layer.", "emo_layer.")


pytestmark = pytest.mark.usefixtures("one_torch_thread")  # conftest: small ops, one thread


def _carried(folder: str) -> tuple[dict, GPTConfig]:
    cfg = load_config(REFERENCE / folder / "config.yaml").gpt
    _, carried, _ = load_base_checkpoint(REFERENCE / folder / "gpt.pth", cfg)
    return carried, cfg


@pytest.fixture(scope="module")
def v2() -> tuple[dict, GPTConfig]:
    return _carried("tiny")


@pytest.fixture(scope="module")
def encoders(v2) -> ConditioningEncoders:
    carried, cfg = v2
    return ConditioningEncoders.from_gpt(carried, cfg, CPU)


def _feat(frames: int) -> torch.Tensor:
    return torch.from_numpy(np.load(PREPARE / "inputs" / f"cond_rand_T{frames}.npy"))[0]  # (T, 1024)


def _expected(name: str) -> np.ndarray:
    return np.load(PREPARE / "cond" / f"{name}.npy")


def _padded_batch() -> torch.Tensor:
    batch = torch.zeros(2, 30, 1024)
    batch[0, :23], batch[1] = _feat(23), _feat(30)
    return batch


@pytest.mark.parametrize("frames", [23, 30])
def test_single_clip_equals_official(encoders: ConditioningEncoders, frames: int) -> None:
    condition, emo_vec = encoders.condition(_feat(frames)), encoders.emo_vec(_feat(frames))
    assert condition.shape == (32, 64) and emo_vec.shape == (64,)
    assert condition.dtype == emo_vec.dtype == torch.float32
    np.testing.assert_allclose(condition.numpy(), _expected(f"cond.rand_T{frames}")[0], rtol=0, atol=1e-4)
    np.testing.assert_allclose(emo_vec.numpy(), _expected(f"emo_vec.rand_T{frames}")[0], rtol=0, atol=1e-4)


def test_width_read_from_the_weights(encoders: ConditioningEncoders) -> None:
    assert encoders.width == 1024
    encoders.require_width(1024, "w2v-bert-2.0")
    with pytest.raises(UserError, match="tiny-w2v gives 32-wide features .* take 1024-wide"):
        encoders.require_width(32, "tiny-w2v")
    with pytest.raises(ValueError, match=r"\(B, T, 1024\)"):
        encoders.condition(torch.zeros(23, 32))


@pytest.mark.parametrize("lengths", [[23, 30], [1024, 1024]])
def test_padded_batch_equals_official_batch(encoders: ConditioningEncoders, lengths: list[int]) -> None:
    suffix = "" if lengths == [23, 30] else ".lengths1024"
    lengths_t = torch.tensor(lengths)
    np.testing.assert_allclose(encoders.condition_batch(_padded_batch(), lengths_t).numpy(),
                               _expected(f"cond.rand_batch{suffix}"), rtol=0, atol=1e-4)
    np.testing.assert_allclose(encoders.emo_vec_batch(_padded_batch(), lengths_t).numpy(),
                               _expected(f"emo_vec.rand_batch{suffix}"), rtol=0, atol=1e-4)


def test_padded_batch_changes_the_short_clip(encoders: ConditioningEncoders) -> None:
    """Why prepare runs each clip alone: even with true lengths, padding moves the short item."""
    lengths = torch.tensor([23, 30])
    condition = encoders.condition_batch(_padded_batch(), lengths)
    emo_vec = encoders.emo_vec_batch(_padded_batch(), lengths)
    assert (condition[0] - encoders.condition(_feat(23))).abs().max() > 0.05  # official: 0.10
    assert (emo_vec[0] - encoders.emo_vec(_feat(23))).abs().max() > 0.005  # official: 0.014
    assert (condition[1] - encoders.condition(_feat(30))).abs().max() < 1e-4
    assert (emo_vec[1] - encoders.emo_vec(_feat(30))).abs().max() < 1e-4


def test_the_trap_is_the_first_pointwise_bias(v2) -> None:
    """With that bias zeroed (in a copy), the padded batch equals single clips: the cause is confirmed."""
    carried, cfg = v2
    unbiased = {k: torch.zeros_like(v) if k.endswith("conv_module.pointwise_conv1.bias") else v
                for k, v in carried.items()}
    encoders = ConditioningEncoders.from_gpt(unbiased, cfg, CPU)
    lengths = torch.tensor([23, 30])
    condition = encoders.condition_batch(_padded_batch(), lengths)
    emo_vec = encoders.emo_vec_batch(_padded_batch(), lengths)
    assert (condition[0] - encoders.condition(_feat(23))).abs().max() < 1e-4
    assert (emo_vec[0] - encoders.emo_vec(_feat(23))).abs().max() < 1e-4


def test_equal_length_batch_equals_single_clips(encoders: ConditioningEncoders) -> None:
    """Batching clips of equal length is safe: what prepare may do."""
    batch = torch.stack([_feat(30), 0.5 * _feat(30) + 0.1])
    condition, emo_vec = encoders.condition_batch(batch), encoders.emo_vec_batch(batch)
    for i in range(2):
        assert (condition[i] - encoders.condition(batch[i])).abs().max() < 1e-4
        assert (emo_vec[i] - encoders.emo_vec(batch[i])).abs().max() < 1e-4


def test_official_lengths_are_the_width() -> None:
    assert official_lengths(23).tolist() == [23]
    assert official_lengths(1030, batch=2).tolist() == [1024, 1024]


def test_frames_past_1024_are_masked_as_official(encoders: ConditioningEncoders) -> None:
    """Official inference passes 1024 as the length, so frames from 1024 on do not count."""
    feat = torch.randn(1030, 1024, generator=torch.Generator().manual_seed(0))
    changed = feat.clone()
    changed[1024:] = 5.0
    assert torch.equal(encoders.emo_vec(feat), encoders.emo_vec(changed))
    assert torch.equal(encoders.condition(feat), encoders.condition(changed))
    changed[1000] = 5.0
    assert not torch.equal(encoders.emo_vec(feat), encoders.emo_vec(changed))


def _with_first_linear(carried: dict, change) -> dict:
    """`carried` with both conformers' first linear changed; `change` gets it as (D, D, bins), channel-major."""
    out = dict(carried)
    for prefix in ("conditioning_encoder", "emo_conditioning_encoder"):
        key = f"{prefix}.embed.out.0.weight"
        out[key] = change(carried[key].unflatten(1, (carried[key].shape[0], -1))).flatten(1).contiguous()
    return out


def test_another_width_works_and_is_exact(v2) -> None:
    """A 32-wide model (15 bins after the stride-2 conv) equals the verified 1024-wide path on
    zero-padded input when the 1024 model's first linear ignores the bins a 32-wide input cannot reach."""
    carried, cfg = v2
    narrow = ConditioningEncoders.from_gpt(_with_first_linear(carried, lambda w: w[:, :, :15]), cfg, CPU)
    wide = ConditioningEncoders.from_gpt(
        _with_first_linear(carried, lambda w: torch.cat([w[:, :, :15], torch.zeros_like(w[:, :, 15:])], dim=2)),
        cfg, CPU)
    assert narrow.width == 32
    feat = _feat(23)[:, :32]
    padded = torch.nn.functional.pad(feat, (0, 1024 - 32))
    assert narrow.condition(feat).shape == (32, 64)
    np.testing.assert_allclose(narrow.condition(feat).numpy(), wide.condition(padded).numpy(), rtol=0, atol=1e-5)
    np.testing.assert_allclose(narrow.emo_vec(feat).numpy(), wide.emo_vec(padded).numpy(), rtol=0, atol=1e-5)
    with pytest.raises(ValueError, match=r"\(B, T, 32\)"):
        narrow.emo_vec(_feat(23))


def test_v25_emo_vec_is_the_same_encoder() -> None:
    """IndexTTS-2.5 inference computes emo_vec with the same UnifiedVoice.get_emovec: with the IndexTTS2
    reference's emotion weights in the 2.5 GPT, the result is the official IndexTTS2 emo_vec."""
    carried25, cfg25 = _carried("v2_5/tiny")
    encoders = ConditioningEncoders.from_gpt(carried25, cfg25, CPU)
    own = encoders.emo_vec(_feat(23))
    assert own.shape == (64,) and torch.isfinite(own).all()
    with pytest.raises(ValueError, match="CAMPPlus"):
        encoders.condition(_feat(23))
    carried2, _ = _carried("tiny")
    transplanted = {**carried25, **{k: v for k, v in carried2.items() if k.startswith(EMO_KEYS)}}
    official = ConditioningEncoders.from_gpt(transplanted, cfg25, CPU).emo_vec(_feat(23))
    np.testing.assert_allclose(official.numpy(), _expected("emo_vec.rand_T23")[0], rtol=0, atol=1e-4)
    assert not torch.equal(own, official)


def test_missing_encoders_are_one_line(v2) -> None:
    carried, cfg = v2
    without = {k: v for k, v in carried.items() if not k.startswith("perceiver_encoder.")}
    with pytest.raises(UserError, match="has no perceiver_encoder"):
        ConditioningEncoders.from_gpt(without, cfg, CPU)


def _record_tf32(monkeypatch) -> list[tuple[bool, bool]]:
    """Wraps F.conv1d to record the TF32 flags each call runs under."""
    seen: list[tuple[bool, bool]] = []
    conv1d = torch.nn.functional.conv1d

    def spy(*args, **kwargs):
        seen.append((torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32))
        return conv1d(*args, **kwargs)

    monkeypatch.setattr(torch.nn.functional, "conv1d", spy)
    return seen


@pytest.fixture
def tf32_on():
    """Both TF32 flags on, as a training run on an Ampere GPU leaves them; restored after."""
    saved = torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32
    torch.backends.cudnn.allow_tf32 = torch.backends.cuda.matmul.allow_tf32 = True
    yield
    torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32 = saved


def test_encoders_run_without_tf32(encoders: ConditioningEncoders, monkeypatch, tf32_on) -> None:
    """A GPU would otherwise run the convolutions in TF32 (cuDNN's default, and training turns it on)."""
    seen = _record_tf32(monkeypatch)
    encoders.emo_vec(_feat(23))
    encoders.condition(_feat(23))
    assert seen and set(seen) == {(False, False)}
    assert torch.backends.cudnn.allow_tf32 and torch.backends.cuda.matmul.allow_tf32  # restored


def test_full_float32_restores_after_an_error(tf32_on) -> None:
    with pytest.raises(RuntimeError, match="boom"), full_float32():
        assert not torch.backends.cudnn.allow_tf32 and not torch.backends.cuda.matmul.allow_tf32
        raise RuntimeError("boom")
    assert torch.backends.cudnn.allow_tf32 and torch.backends.cuda.matmul.allow_tf32
