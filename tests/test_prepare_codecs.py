"""RepCodec (IndexTTS2) and EnhancedCodec (IndexTTS-2.5) codes against the prepare oracle, exactly."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch

from indextts_train.config.family import INDEXTTS2, INDEXTTS25, Family
from indextts_train.errors import UserError
from indextts_train.prepare.codecs import (
    EnhancedCodec,
    SemanticCodec,
    codec_config,
    codec_shapes,
    exact_float32,
    valid_code_count,
    write_tiny_codec,
)
from tests.conftest import REFERENCE

pytest.importorskip("safetensors")

ORACLE = REFERENCE / "prepare"
EXPECTED = json.loads((ORACLE / "expected.json").read_text())
CLIPS = ["a_44k1_stereo_pcm16", "b_22k05_mono_float", "c_16k_mono_pcm16", "d_16k_mono_float_long"]
CPU = torch.device("cpu")
FAMILIES = {  # folder of the oracle -> (class, weights file, downsample)
    "semantic_codec": (SemanticCodec, "model.safetensors", 1),
    "codec25": (EnhancedCodec, "codec.pth", 2),
}


def _config(folder: str) -> dict:
    return json.loads((ORACLE / folder / "config.json").read_text())


def _codec(folder: str):
    cls, weights, _ = FAMILIES[folder]
    return cls.load(ORACLE / folder / weights, _config(folder), CPU)


def _array(path: str) -> torch.Tensor:
    return torch.from_numpy(np.load(ORACLE / path))


def _official(folder: str, name: str) -> torch.Tensor:
    return _array(f"{folder}/codes.{name}.npy")


pytestmark = pytest.mark.usefixtures("one_torch_thread")  # conftest: small ops, one thread


@pytest.fixture(scope="module", params=list(FAMILIES))
def codec_and_folder(request):
    return _codec(request.param), request.param


@pytest.mark.parametrize("folder", list(FAMILIES))
def test_expected_layout_is_the_official_state_dict(folder: str) -> None:
    _, _, downsample = FAMILIES[folder]
    ours = codec_shapes(codec_config(_config(folder), downsample, "config.json"))
    official = {k: tuple(v) for k, v in EXPECTED[folder]["weights"]["keys"].items()}
    assert ours == official


def test_random_inputs_alone_give_the_official_codes(codec_and_folder) -> None:
    codec, folder = codec_and_folder
    for name in ("rand_T37", "rand_T50"):
        feat = _array(f"inputs/feat_{name}.npy")[0]  # (T, 32)
        codes = codec.codes(feat)
        assert codes.dtype == torch.int64
        assert torch.equal(codes, _official(folder, name)[0])
        assert codes.shape[0] == math.ceil(feat.shape[0] / codec.frames_per_code)


def test_zero_padded_batch_reproduces_the_official_batch_and_differs_from_single(codec_and_folder) -> None:
    codec, folder = codec_and_folder
    short, long = _array("inputs/feat_rand_T37.npy")[0], _array("inputs/feat_rand_T50.npy")[0]
    batch = torch.zeros(2, 50, 32)
    batch[0, :37], batch[1] = short, long
    codes = codec.codes_batch(batch)
    assert torch.equal(codes, _official(folder, "rand_batch"))
    n_short = valid_code_count(37, codec.frames_per_code)
    differing = (codes[0, :n_short] != codec.codes(short)).nonzero().flatten().tolist()
    recorded = EXPECTED[folder]["batch_vs_single_random"][0]
    assert differing == recorded.get("differing_valid_frames", recorded.get("differing_codes"))


@pytest.mark.parametrize("clip", CLIPS)
def test_each_clip_layer17_gives_the_official_codes(codec_and_folder, clip: str) -> None:
    codec, folder = codec_and_folder
    feat = _array(f"w2vbert/{clip}.spk.l17.npy")[0]
    assert torch.equal(codec.codes(feat), _official(folder, f"{clip}.spk")[0])


def test_per_clip_rows_of_the_w2vbert_batch_give_the_single_clip_codes(codec_and_folder) -> None:
    codec, folder = codec_and_folder
    batch = _array("w2vbert/batch.spk.l17.npy")  # (2, 102, 32): clip a padded after 68 frames, then clip d
    assert torch.equal(codec.codes_batch(batch), _official(folder, "batch.spk"))  # what a padded batch gives
    for row, clip in enumerate(["a_44k1_stereo_pcm16", "d_16k_mono_float_long"]):
        frames = np.load(ORACLE / f"features/{clip}.spk.attention_mask.npy").shape[1]  # the single clip's frames
        assert torch.equal(codec.codes(batch[row, :frames]), _official(folder, f"{clip}.spk")[0])
    padded_a = codec.codes_batch(batch)[0, : valid_code_count(68, codec.frames_per_code)]
    assert not torch.equal(padded_a, _official(folder, "a_44k1_stereo_pcm16.spk")[0])  # why per clip matters


def test_valid_code_counts_follow_the_attention_mask() -> None:
    mask_a = np.load(ORACLE / "features/a_44k1_stereo_pcm16.spk.attention_mask.npy")[0]
    codes_a = np.load(ORACLE / "semantic_codec/codes.a_44k1_stereo_pcm16.spk.npy")[0]
    assert (codes_a.shape[0], int(mask_a.sum())) == (68, 67)
    assert valid_code_count(int(mask_a.sum()), 1) == 67
    assert valid_code_count(67, 2) == 34 == np.load(ORACLE / "codec25/codes.a_44k1_stereo_pcm16.spk.npy").shape[1]
    assert [valid_code_count(n, 2) for n in (0, 1, 2, 37, 50, 101)] == [0, 1, 1, 19, 25, 51]


def _tamper_safetensors(source, target, change: str) -> None:
    from safetensors.torch import load_file, save_file

    state = load_file(str(source))
    if change == "missing":
        del state["encoder.0.norm.weight"]
    elif change == "unknown":
        state["encoder.0.extra"] = torch.zeros(1)
    else:
        state["encoder.0.norm.weight"] = torch.zeros(17)
    save_file(state, str(target))


def _tamper_pth(source, target, change: str) -> None:
    state = dict(torch.load(source, weights_only=True)["model"])
    if change == "missing":
        del state["encoder.0.norm.weight"]
    elif change == "unknown":
        state["encoder.0.extra"] = torch.zeros(1)
    else:
        state["encoder.0.norm.weight"] = torch.zeros(17)
    torch.save({"model": state}, target)


@pytest.mark.parametrize("folder", list(FAMILIES))
@pytest.mark.parametrize("change", ["missing", "unknown", "shape"])
def test_loading_is_strict_and_names_the_file_and_key(tmp_path, folder: str, change: str) -> None:
    cls, weights, _ = FAMILIES[folder]
    target = tmp_path / weights
    (_tamper_safetensors if weights.endswith("safetensors") else _tamper_pth)(ORACLE / folder / weights, target, change)
    with pytest.raises(UserError) as caught:
        cls.load(target, _config(folder), CPU)
    message = str(caught.value)
    key = "encoder.0.extra" if change == "unknown" else "encoder.0.norm.weight"
    assert str(target) in message and key in message and "\n" not in message
    assert {"missing": "missing", "unknown": "unknown", "shape": "[17]"}[change] in message


@pytest.mark.parametrize("folder", list(FAMILIES))
def test_unreadable_or_absent_weights_are_one_line(tmp_path, folder: str) -> None:
    cls, weights, _ = FAMILIES[folder]
    for target, content in ((tmp_path / weights, b"not weights at all"), (tmp_path / "absent" / weights, None)):
        if content is not None:
            target.write_bytes(content)
        with pytest.raises(UserError) as caught:
            cls.load(target, _config(folder), CPU)
        assert str(target) in str(caught.value) and "\n" not in str(caught.value)


def test_codec_pth_without_the_model_wrapper_is_refused(tmp_path) -> None:
    target = tmp_path / "codec.pth"
    torch.save(dict(torch.load(ORACLE / "codec25/codec.pth", weights_only=True)["model"]), target)
    with pytest.raises(UserError, match="'model'"):
        EnhancedCodec.load(target, _config("codec25"), CPU)


@pytest.mark.parametrize("section, fragment", [
    ({"codebook_size": 64, "vocos_layers": 2}, "vocos_layers"),
    ({"num_quantizers": 2}, "num_quantizers"),
    ({"hidden_size": "32"}, "hidden_size"),
    ({"downsample_scale": 2}, "downsample_scale"),
])
def test_bad_config_sections_are_refused(section: dict, fragment: str) -> None:
    with pytest.raises(UserError, match=fragment):
        SemanticCodec.load(ORACLE / "semantic_codec/model.safetensors", section, CPU)


@pytest.mark.parametrize("family, cls", [(INDEXTTS2, SemanticCodec), (INDEXTTS25, EnhancedCodec)])
def test_tiny_codec_is_seeded_loadable_and_never_overwrites(tmp_path, family: Family, cls) -> None:
    path = tmp_path / ("model.safetensors" if cls is SemanticCodec else "codec.pth")
    section = write_tiny_codec(path, family, seed=5, hidden=24)
    assert section["hidden_size"] == 24
    first = path.read_bytes()
    write_tiny_codec(path, family, seed=5, hidden=24)  # same bytes: accepted as already written
    assert path.read_bytes() == first
    with pytest.raises(UserError, match="already exists"):
        write_tiny_codec(path, family, seed=6, hidden=24)
    assert path.read_bytes() == first
    codec = cls.load(path, section, CPU)
    feat = torch.randn(40, 24, generator=torch.Generator().manual_seed(0))
    codes = codec.codes(feat)
    assert codes.shape == (valid_code_count(40, codec.frames_per_code),)
    assert len(set(codes.tolist())) > 3  # a working codec spreads over its codebook
    assert torch.equal(codec.codes_batch(torch.stack([feat, feat]))[1], codes)


def test_exact_float32_switches_tf32_off_and_restores_the_callers_settings() -> None:
    before = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = True
    try:
        with exact_float32():
            assert not torch.backends.cuda.matmul.allow_tf32 and not torch.backends.cudnn.allow_tf32
        assert torch.backends.cuda.matmul.allow_tf32 and torch.backends.cudnn.allow_tf32
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = before


def test_a_feature_width_other_than_the_codecs_is_one_line_before_any_clip(codec_and_folder) -> None:
    codec, _ = codec_and_folder
    codec.require_width(32, "w2v-bert-2.0")
    with pytest.raises(UserError, match="w2v-bert-2.0: w2v-BERT features are 1024 wide .*hidden_size is 32"):
        codec.require_width(1024, "w2v-bert-2.0")
    with pytest.raises(ValueError):
        codec.codes(torch.zeros(0, 32))
