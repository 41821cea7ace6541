"""w2v-BERT input features and normalised layer-17 features against the prepare oracle (sections 2, 3)."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
import torch

from indextts_train.errors import UserError
from indextts_train.prepare.audio import AudioError
from indextts_train.prepare.w2vbert import EXTRACTOR_CONFIG, W2vBert, w2vbert_frames, write_tiny_w2vbert
from tests.conftest import REFERENCE

pytest.importorskip("transformers")
pytest.importorskip("safetensors")

ORACLE = REFERENCE / "prepare"
TOLERANCES = json.loads((ORACLE / "expected.json").read_text())["tolerances"]
FEATURES_ATOL = TOLERANCES["features/*.input_features.npy"]["atol"]
L17_ATOL = TOLERANCES["w2vbert/*.l17.npy"]["atol"]
CLIPS = ["a_44k1_stereo_pcm16", "b_22k05_mono_float", "c_16k_mono_pcm16", "d_16k_mono_float_long"]
CPU = torch.device("cpu")


pytestmark = pytest.mark.usefixtures("one_torch_thread")  # conftest: small ops, one thread


@pytest.fixture(scope="module")
def w2v() -> W2vBert:
    return W2vBert.load(ORACLE / "w2vbert", ORACLE / "w2vbert" / "wav2vec2bert_stats.pt", CPU)


def _wave(clip: str, path: str = "spk") -> np.ndarray:
    return np.load(ORACLE / "audio" / f"{clip}.{path}16k.npy")


def _max_diff(ours: torch.Tensor, official: np.ndarray) -> float:
    assert tuple(ours.shape) == official.shape
    return float(np.abs(ours.numpy() - official).max())


def test_built_in_extractor_settings_are_the_hub_file() -> None:
    assert EXTRACTOR_CONFIG == json.loads((ORACLE / "features" / "preprocessor_config.json").read_text())


@pytest.mark.parametrize("clip", CLIPS)
def test_input_features_of_each_clip(w2v: W2vBert, clip: str) -> None:
    batch = w2v.input_features([_wave(clip)])
    official_mask = np.load(ORACLE / "features" / f"{clip}.spk.attention_mask.npy")
    assert batch.mask.dtype == torch.int32 and np.array_equal(batch.mask.numpy(), official_mask)
    assert _max_diff(batch.values, np.load(ORACLE / "features" / f"{clip}.spk.input_features.npy")) <= FEATURES_ATOL
    assert batch.frames == [official_mask.shape[1]]
    assert w2vbert_frames(_wave(clip).shape[0]) == (official_mask.shape[1], int(official_mask.sum()))


def test_padded_batch_features_are_the_extractors_padded_call(w2v: W2vBert) -> None:
    batch = w2v.input_features([_wave("a_44k1_stereo_pcm16"), _wave("d_16k_mono_float_long")])
    assert np.array_equal(batch.mask.numpy(), np.load(ORACLE / "features" / "batch.spk.attention_mask.npy"))
    assert _max_diff(batch.values, np.load(ORACLE / "features" / "batch.spk.input_features.npy")) <= FEATURES_ATOL
    assert batch.frames == [68, 102]


@pytest.mark.parametrize("clip", CLIPS)
def test_layer17_of_each_clip_on_both_paths(w2v: W2vBert, clip: str) -> None:
    for path in ("spk", "emo"):
        [(feat, n_valid)] = w2v.layer17([_wave(clip, path)])
        official = np.load(ORACLE / "w2vbert" / f"{clip}.{path}.l17.npy")[0]  # (T, 32), masked frame included
        assert feat.dtype == torch.float32 and feat.device.type == "cpu"
        assert _max_diff(feat, official) <= L17_ATOL
        assert n_valid == w2vbert_frames(_wave(clip, path).shape[0])[1]


def test_one_padded_forward_gives_each_clip_its_single_clip_frames(w2v: W2vBert) -> None:
    (feat_a, valid_a), (feat_d, valid_d) = w2v.layer17([_wave("a_44k1_stereo_pcm16"), _wave("d_16k_mono_float_long")])
    assert (feat_a.shape[0], valid_a, feat_d.shape[0], valid_d) == (68, 67, 102, 101)
    official_batch = np.load(ORACLE / "w2vbert" / "batch.spk.l17.npy")  # (2, 102, 32)
    assert _max_diff(feat_a, official_batch[0, :68]) <= L17_ATOL
    assert _max_diff(feat_d, official_batch[1]) <= L17_ATOL
    assert _max_diff(feat_a, np.load(ORACLE / "w2vbert" / "a_44k1_stereo_pcm16.spk.l17.npy")[0]) <= L17_ATOL
    assert _max_diff(feat_d, np.load(ORACLE / "w2vbert" / "d_16k_mono_float_long.spk.l17.npy")[0]) <= L17_ATOL


def test_frame_rule_matches_the_extractor_at_many_lengths(w2v: W2vBert) -> None:
    rng = np.random.default_rng(3)
    for n in (560, 719, 720, 879, 880, 16000, 16159, 16160):
        batch = w2v.input_features([rng.uniform(-0.5, 0.5, n).astype(np.float32)])
        assert w2vbert_frames(n) == (batch.frames[0], int(batch.mask.sum())), n


def test_a_clip_without_a_valid_frame_is_refused(w2v: W2vBert) -> None:
    with pytest.raises(AudioError, match="clip 1: 559 samples"):
        w2v.layer17([_wave("c_16k_mono_pcm16"), np.zeros(559, dtype=np.float32)])


def _model_copy(tmp_path):
    folder = tmp_path / "w2v"
    shutil.copytree(ORACLE / "w2vbert", folder)
    return folder


@pytest.mark.parametrize("change, fragment", [
    ("missing", "missing"), ("unknown", "unknown key extra.weight"), ("shape", "[33]")])
def test_weights_load_strictly(tmp_path, change: str, fragment: str) -> None:
    from safetensors.torch import load_file, save_file

    folder = _model_copy(tmp_path)
    state = load_file(str(folder / "model.safetensors"))
    key = "encoder.layers.3.ffn1_layer_norm.weight"
    if change == "missing":
        del state[key]
    elif change == "unknown":
        state["extra.weight"] = torch.zeros(2)
    else:
        state[key] = torch.zeros(33)
    save_file(state, str(folder / "model.safetensors"))
    with pytest.raises(UserError) as caught:
        W2vBert.load(folder, folder / "wav2vec2bert_stats.pt", CPU)
    message = str(caught.value)
    assert str(folder / "model.safetensors") in message and fragment in message and "\n" not in message
    if change != "unknown":
        assert key in message


def test_bad_stats_and_shallow_models_are_refused(tmp_path) -> None:
    folder = _model_copy(tmp_path)
    torch.save({"mean": torch.zeros(32), "var": torch.ones(16)}, folder / "bad_stats.pt")
    with pytest.raises(UserError, match="'var' of shape \\[32\\]"):
        W2vBert.load(folder, folder / "bad_stats.pt", CPU)
    with pytest.raises(UserError, match="no such file"):
        W2vBert.load(folder, folder / "absent.pt", CPU)
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, "num_hidden_layers": 12}))
    with pytest.raises(UserError, match="num_hidden_layers is 12"):
        W2vBert.load(folder, folder / "wav2vec2bert_stats.pt", CPU)


def test_tiny_w2vbert_is_seeded_loadable_and_never_overwrites(tmp_path) -> None:
    folder = tmp_path / "tiny"
    write_tiny_w2vbert(folder, seed=7, hidden=16)
    written = {p.name: p.read_bytes() for p in folder.iterdir()}
    assert set(written) == {"config.json", "model.safetensors", "preprocessor_config.json", "wav2vec2bert_stats.pt"}
    write_tiny_w2vbert(folder, seed=7, hidden=16)  # the same bytes again: nothing to do
    with pytest.raises(UserError, match="already exists"):
        write_tiny_w2vbert(folder, seed=8, hidden=16)
    assert {p.name: p.read_bytes() for p in folder.iterdir()} == written
    tiny = W2vBert.load(folder, folder / "wav2vec2bert_stats.pt", CPU)
    assert tiny.width == 16
    [(feat, n_valid)] = tiny.layer17([_wave("b_22k05_mono_float")])
    assert feat.shape == (49, 16) and n_valid == 49 and torch.isfinite(feat).all()
    assert float(feat.std()) > 0.1  # perturbed weights: features vary


def test_a_truncated_weights_file_is_one_line(tmp_path) -> None:
    folder = _model_copy(tmp_path)
    data = (folder / "model.safetensors").read_bytes()
    (folder / "model.safetensors").write_bytes(data[: len(data) // 2])
    with pytest.raises(UserError) as caught:
        W2vBert.load(folder, folder / "wav2vec2bert_stats.pt", CPU)
    assert "not a readable safetensors file" in str(caught.value) and "\n" not in str(caught.value)
