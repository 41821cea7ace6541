"""`indextts-train demo`: the whole pipeline on the built-in data, and a rerun resumes."""

from __future__ import annotations

import torch

from indextts_train.checkpoint import load_checkpoint
from indextts_train.demo import run_demo


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
