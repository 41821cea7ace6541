"""The temporary official model folder: the user's folder linked, the three exported files in its place."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import yaml

from indextts_train.config.settings import load_config
from indextts_train.data.demo_data import _make_base_tokenizer
from indextts_train.demo import make_base_checkpoint
from indextts_train.errors import UserError
from indextts_train.listen.model_folder import MARKER, make_model_folder, replaced_names
from indextts_train.model.layout import official_shapes

ROOT = Path(__file__).resolve().parents[1]
S2MEL_SECTION = {"preprocess_params": {"sr": 22050}}


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> Path:
    """An IndexTTS2 folder at the tiny size: config.yaml with the inference sections, gpt.pth, bpe.model,
    and files the export does not touch (s2mel.pth, hf_cache/)."""
    folder = tmp_path_factory.mktemp("models")
    raw = yaml.safe_load((ROOT / "configs" / "tiny.yaml").read_text(encoding="utf-8"))
    raw.pop("train")
    raw.update(version=2.0, s2mel=S2MEL_SECTION, gpt_checkpoint="gpt.pth", dataset={"bpe_model": "bpe.model"})
    (folder / "config.yaml").write_text(yaml.safe_dump(raw), encoding="utf-8")
    make_base_checkpoint(folder / "config.yaml", folder / "gpt.pth", seed=1)
    _make_base_tokenizer(folder / "bpe.model", load_config(folder / "config.yaml").gpt, seed=0)
    (folder / "s2mel.pth").write_bytes(b"s2mel weights")
    (folder / "hf_cache" / "bigvgan").mkdir(parents=True)
    (folder / "hf_cache" / "bigvgan" / "config.json").write_text("{}", encoding="utf-8")
    return folder


@pytest.mark.slow  # the module's model folder trains a tokenizer: seconds
def test_the_folder_links_the_rest_and_holds_the_export(model_dir, tmp_path) -> None:
    folder = make_model_folder(model_dir / "gpt.pth", model_dir, tmp_path / "listen" / "step0", tokenizer=None)
    assert replaced_names(model_dir) == ("gpt.pth", "config.yaml", "bpe.model")
    for name in ("s2mel.pth", "hf_cache"):
        assert (folder / name).is_symlink() and (folder / name).resolve() == (model_dir / name).resolve()
    for name in ("gpt.pth", "config.yaml", "bpe.model"):
        assert not (folder / name).is_symlink()
    assert (folder / "bpe.model").read_bytes() == (model_dir / "bpe.model").read_bytes()
    config = yaml.safe_load((folder / "config.yaml").read_text(encoding="utf-8"))
    assert config["s2mel"] == S2MEL_SECTION and config["gpt_checkpoint"] == "gpt.pth"
    state = torch.load(folder / "gpt.pth", weights_only=True)
    base = torch.load(model_dir / "gpt.pth", weights_only=True)
    shapes = official_shapes(load_config(model_dir / "config.yaml").gpt)
    assert list(state) == list(shapes)
    assert all(torch.equal(state[key], base[key]) for key in shapes)


@pytest.mark.slow  # the module's model folder trains a tokenizer: seconds
def test_a_rerun_makes_the_folder_afresh(model_dir, tmp_path) -> None:
    target = tmp_path / "step0"
    make_model_folder(model_dir / "gpt.pth", model_dir, target, tokenizer=None)
    (target / "half_written.tmp").write_bytes(b"left by a killed run")
    make_model_folder(model_dir / "gpt.pth", model_dir, target, tokenizer=None)
    assert not (target / "half_written.tmp").exists() and (target / MARKER).is_file()
    assert (model_dir / "s2mel.pth").read_bytes() == b"s2mel weights"  # links removed, never followed


@pytest.mark.slow  # the module's model folder trains a tokenizer: seconds
def test_a_folder_it_did_not_make_is_never_removed(model_dir, tmp_path) -> None:
    target = tmp_path / "mine"
    target.mkdir()
    (target / "notes.txt").write_text("mine", encoding="utf-8")
    with pytest.raises(UserError, match="was not made by indextts-train listen"):
        make_model_folder(model_dir / "gpt.pth", model_dir, target, tokenizer=None)
    assert (target / "notes.txt").read_text(encoding="utf-8") == "mine"


@pytest.mark.slow  # the module's model folder trains a tokenizer: seconds
def test_a_link_in_its_place_is_refused_even_to_a_folder_of_ours(model_dir, tmp_path) -> None:
    """A link to a model folder listen made elsewhere (it holds the marker) is still not this folder."""
    elsewhere = make_model_folder(model_dir / "gpt.pth", model_dir, tmp_path / "elsewhere", tokenizer=None)
    link = tmp_path / "step0"
    link.symlink_to(elsewhere, target_is_directory=True)
    with pytest.raises(UserError, match="was not made by indextts-train listen"):
        make_model_folder(model_dir / "gpt.pth", model_dir, link, tokenizer=None)
    assert link.is_symlink() and (elsewhere / MARKER).is_file() and (elsewhere / "gpt.pth").is_file()


def test_a_model_folder_without_config_is_one_line(tmp_path) -> None:
    with pytest.raises(UserError, match="no config.yaml"):
        make_model_folder(tmp_path / "gpt.pth", tmp_path, tmp_path / "out", tokenizer=None)
    assert not (tmp_path / "out").exists()
