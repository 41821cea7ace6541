"""Model discovery: the official layout, the hub caches, --download (size and licence printed first)."""

from __future__ import annotations

import hashlib
import re
import shutil
from pathlib import Path
from types import SimpleNamespace

import huggingface_hub
import pytest

from indextts_train.errors import UserError
from indextts_train.prepare.models import Overrides, locate_models, model_hashes

ROOT = Path(__file__).resolve().parents[1]
TINY_V2 = ROOT / "tests" / "data" / "reference" / "tiny" / "config.yaml"


def _release_files(model_dir: Path) -> None:
    """What the IndexTTS2 release itself ships (the hub files are missing)."""
    model_dir.mkdir()
    shutil.copy(TINY_V2, model_dir / "config.yaml")
    for name in ("gpt.pth", "wav2vec2bert_stats.pt"):
        (model_dir / name).write_bytes(name.encode())
    shutil.copy(ROOT / "tests" / "data" / "reference" / "prepare" / "text" / "bpe_tiny.model", model_dir / "bpe.model")


def _fake_hub(monkeypatch, printed_sizes: dict[str, int]) -> list[str]:
    """hf_hub_download writing the Hugging Face cache layout, and file sizes from get_paths_info."""
    fetched = []

    def download(repo: str, filename: str, cache_dir: Path) -> str:
        folder = Path(cache_dir) / f"models--{repo.replace('/', '--')}"
        (folder / "refs").mkdir(parents=True, exist_ok=True)
        (folder / "refs" / "main").write_text("abc")
        path = folder / "snapshots" / "abc" / filename
        path.parent.mkdir(parents=True, exist_ok=True)
        size = printed_sizes[filename]  # a JSON file is read (its sizes are bounded): valid, padded to size
        path.write_bytes(b"{}".ljust(size) if filename.endswith(".json") else b"x" * size)
        fetched.append(f"{repo}/{filename}")
        return str(path)

    monkeypatch.setattr(huggingface_hub, "hf_hub_download", download)
    monkeypatch.setattr(huggingface_hub.HfApi, "get_paths_info",
                        lambda self, repo, paths: [SimpleNamespace(size=printed_sizes[paths[0]])])
    return fetched


def test_download_prints_size_and_licence_then_finds_the_files(tmp_path, monkeypatch, capsys) -> None:
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "user_cache"))
    _release_files(tmp_path / "models")
    sizes = {"semantic_codec/model.safetensors": 2_000_000, "config.json": 10, "preprocessor_config.json": 10,
             "model.safetensors": 3_000_000}
    with pytest.raises(UserError, match="model files missing: semantic codec"):
        locate_models(tmp_path / "models", Overrides())
    fetched = _fake_hub(monkeypatch, sizes)
    models = locate_models(tmp_path / "models", Overrides(), download=True)
    printed = capsys.readouterr().out
    assert "amphion/MaskGCT/semantic_codec/model.safetensors (2.0 MB), licence CC-BY-NC-4.0" in printed
    assert "facebook/w2v-bert-2.0/model.safetensors (3.0 MB), licence MIT" in printed
    assert len(fetched) == 4 and models.codec.stat().st_size == 2_000_000
    assert (models.w2v_bert / "model.safetensors").is_file()
    assert str(models.codec).startswith(str(tmp_path / "models" / "hf_cache"))  # where the official code looks
    hashes = model_hashes(models)
    assert hashes["codec"] == hashlib.sha256(models.codec.read_bytes()).hexdigest()
    assert "w2v_bert/model.safetensors" in hashes


def test_overrides_win_and_a_missing_release_file_is_not_downloaded(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "user_cache"))
    _release_files(tmp_path / "models")
    codec = tmp_path / "codec.safetensors"
    codec.write_bytes(b"c")
    w2v = tmp_path / "w2v"
    w2v.mkdir()
    (w2v / "config.json").write_text("{}")
    models = locate_models(tmp_path / "models", Overrides(semantic_codec=codec, w2v_bert=w2v))
    assert (models.codec, models.w2v_bert) == (codec, w2v)
    (tmp_path / "models" / "gpt.pth").unlink()
    with pytest.raises(UserError, match=r"GPT gpt\.pth \(looked in .*models/gpt\.pth\)"):
        locate_models(tmp_path / "models", Overrides(semantic_codec=codec, w2v_bert=w2v), download=True)


def test_an_indextts25_folder_reads_its_tiktoken_whatever_bpe_model_says(tmp_path) -> None:
    """Inference of 2.5 opens multilingual_zh_ja_yue_char_del.tiktoken whatever dataset.bpe_model names; a
    config still naming bpe.model must neither make prepare encode with that nor be refused for it."""
    import yaml

    model_dir = tmp_path / "models"
    model_dir.mkdir()
    raw = yaml.safe_load((ROOT / "configs" / "tiny_v25.yaml").read_text())
    raw["dataset"] = {**(raw.get("dataset") or {}), "bpe_model": "bpe.model"}
    (model_dir / "config.yaml").write_text(yaml.safe_dump(raw))
    for name in ("gpt.pth", "wav2vec2bert_stats.pt", "bpe.model", "codec.pth"):
        (model_dir / name).write_bytes(name.encode())
    with pytest.raises(UserError, match=r"^model files missing: tokenizer multilingual_zh_ja_yue_char_del\.tiktoken"):
        locate_models(model_dir, Overrides())


def test_a_tokenizer_that_is_no_tokenizer_is_refused_naming_the_flag(tiny_models) -> None:
    """`prepare --tokenizer MODELS/gpt.pth` was refused only once the features were loaded, after
    prepare.settings.json was written into --out, and its line did not name the flag."""
    with pytest.raises(UserError, match=rf"^--tokenizer {re.escape(str(tiny_models / 'gpt.pth'))}: not a "
                                        "SentencePiece model"):
        locate_models(tiny_models, Overrides(tokenizer=tiny_models / "gpt.pth"))
    assert locate_models(tiny_models, Overrides()).tokenizer == tiny_models / "bpe.model"
