"""`indextts-train demo`: the whole pipeline on the built-in data, and a rerun resumes."""

from __future__ import annotations

import torch

from indextts_train.checkpoint.files import load_checkpoint
from indextts_train.train.demo import run_demo


def test_demo_trains_with_a_grown_vocabulary_and_exports(tmp_path, capsys) -> None:
    assert run_demo(tmp_path, max_steps=60) == 0
    printed = capsys.readouterr().out
    assert "100 base tokens -> 150 tokens" in printed and "exported" in printed
    state = load_checkpoint(tmp_path / "run" / "latest.pth")
    losses = [row[1] for row in state["history"]["train"]]
    assert losses[-1] < 0.7 * losses[0], losses  # the loss visibly falls
    base = torch.load(tmp_path / "base_gpt.pth", weights_only=True)["text_embedding.weight"]
    exported = torch.load(tmp_path / "export" / "gpt.pth", weights_only=True)
    assert exported["text_embedding.weight"].shape[0] == 151
    assert torch.equal(exported["text_embedding.weight"][:100], base[:100])  # base rows frozen

    assert run_demo(tmp_path, max_steps=70) == 0  # the same command again continues the run
    printed = capsys.readouterr().out
    assert "resuming from" in printed and "starting at step 60" in printed


def test_demo_25_trains_with_a_grown_tiktoken_vocabulary_and_exports(tmp_path, capsys) -> None:
    assert run_demo(tmp_path, max_steps=30, family="2.5") == 0
    printed = capsys.readouterr().out
    assert "1993 base tokens -> 2043 tokens" in printed and "moved up by 50" in printed
    losses = [row[1] for row in load_checkpoint(tmp_path / "run" / "latest.pth")["history"]["train"]]
    assert losses[-1] < 0.8 * losses[0], losses  # the loss visibly falls
    base = torch.load(tmp_path / "base_gpt.pth", weights_only=True)["text_embedding.weight"]
    exported = torch.load(tmp_path / "export" / "gpt.pth", weights_only=True)["text_embedding.weight"]
    assert exported.shape[0] == 2044 and torch.equal(exported[:320], base[:320])
    assert torch.equal(exported[370:], base[320:])  # the specials moved with their ids, frozen
    assert (tmp_path / "export" / "multilingual_zh_ja_yue_char_del.tiktoken").is_file()
