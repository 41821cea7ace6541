"""`indextts-train demo`: the whole pipeline on the built-in data, and a rerun resumes."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
import yaml

from indextts_train import demo
from indextts_train.checkpoint.files import load_checkpoint
from indextts_train.config.run_inputs import config_beside
from indextts_train.demo import run_demo
from indextts_train.errors import UserError

pytestmark = pytest.mark.slow  # every test here trains a tiny run or starts the CLI: seconds each


def assert_extended_share(prepared, grown: range, printed: str) -> None:
    """prepare.json's text coverage, recounted from the text_ids arrays it wrote: the ids in `grown` are
    the pieces the demo's tokenizer has beyond the base checkpoint's rows."""
    counts = json.loads((prepared / "prepare.json").read_text())["counts"]
    ids = [np.load(prepared / line["text_ids_path"]) for line in
           map(json.loads, (prepared / "utterances.jsonl").read_text().splitlines())]
    every = np.concatenate(ids)
    extended = int(np.count_nonzero((every >= grown.start) & (every < grown.stop)))
    assert 0 < extended < every.size
    assert counts["text_tokens"] == every.size and counts["extended_text_tokens"] == extended
    assert counts["extended_token_share"] == round(extended / every.size, 4)
    used = len({int(t) for t in every if int(t) in grown})
    assert counts["extended_pieces"] == len(grown) and counts["extended_pieces_used"] == used
    assert (f"extended pieces: {extended} tokens ({100 * extended / every.size:.1f}% of the text), {used} of the "
            f"{len(grown)} grown pieces occur") in printed


@pytest.mark.slow
def test_demo_trains_with_a_grown_vocabulary_and_exports(tmp_path, capsys, monkeypatch) -> None:
    assert run_demo(tmp_path, max_steps=60) == 0
    printed = capsys.readouterr().out
    assert "100 base tokens -> 150 tokens" in printed and "exported" in printed
    report = json.loads((tmp_path / "data" / "prepared" / "prepare.json").read_text())  # made by the real prepare
    assert report["family"] == "IndexTTS2" and report["counts"]["kept"] > 20 and report["counts"]["val_pairs"] > 0
    assert_extended_share(tmp_path / "data" / "prepared", range(100, 150), printed)  # SentencePiece: appended
    state = load_checkpoint(tmp_path / "run" / "latest.pth")
    losses = [row[1] for row in state["history"]["train"]]
    assert losses[-1] < 0.7 * losses[0], losses  # the loss visibly falls
    base = torch.load(tmp_path / "models" / "gpt.pth", weights_only=True)["text_embedding.weight"]
    exported = torch.load(tmp_path / "export" / "gpt.pth", weights_only=True)
    assert exported["text_embedding.weight"].shape[0] == 151
    assert torch.equal(exported["text_embedding.weight"][:100], base[:100])  # base rows frozen
    named = yaml.safe_load((tmp_path / "export" / "config.yaml").read_text())["dataset"]["bpe_model"]
    assert (tmp_path / "export" / named).is_file()  # the tokenizer beside gpt.pth, under the config's name
    # The model folder is an official one: train-gpt without --config takes its config.yaml (README section 4)
    assert config_beside(tmp_path / "models" / "gpt.pth") == (tmp_path / "models" / "config.yaml", "")

    assert run_demo(tmp_path, max_steps=70) == 0  # the same command again continues the run
    printed = capsys.readouterr().out
    assert "resuming from" in printed and "starting at step 60" in printed
    # another scope on the same folder: the trainer's advice names --output-dir, which the demo reads as OUT_DIR
    with pytest.raises(UserError, match=r"a scope cannot change on resume.*\(the demo trains in OUT_DIR/run: for "
                                        r"--output-dir read OUT_DIR, and run the demo into another OUT_DIR\)$"):
        run_demo(tmp_path, max_steps=80, train_scope="lora")

    def data_changed(settings):  # what the trainer says of data that changed since the checkpoint
        raise UserError("the training data changed since the checkpoint; restore the data, or pass "
                        "--accept-data-change to go on with it")

    monkeypatch.setattr(demo, "train", data_changed)
    with pytest.raises(UserError, match=r"--accept-data-change to go on with it \(the demo has no "
                                        r"--accept-data-change: run the demo into a new OUT_DIR\)$"):
        run_demo(tmp_path, max_steps=80)


@pytest.mark.slow
def test_demo_25_trains_with_a_grown_tiktoken_vocabulary_and_exports(tmp_path, capsys) -> None:
    assert run_demo(tmp_path, max_steps=30, family="2.5") == 0
    printed = capsys.readouterr().out
    assert "1993 base tokens -> 2043 tokens" in printed and "moved up by 50" in printed
    report = json.loads((tmp_path / "data" / "prepared" / "prepare.json").read_text())
    assert report["family"] == "IndexTTS-2.5" and set(report["counts"]["languages"]) == {"en", "am"}
    assert_extended_share(tmp_path / "data" / "prepared", range(320, 370), printed)  # tiktoken: before the specials
    losses = [row[1] for row in load_checkpoint(tmp_path / "run" / "latest.pth")["history"]["train"]]
    assert losses[-1] < 0.85 * losses[0], losses  # the loss visibly falls (real prepared codes: 0.81 measured)
    base = torch.load(tmp_path / "models" / "gpt.pth", weights_only=True)["text_embedding.weight"]
    exported = torch.load(tmp_path / "export" / "gpt.pth", weights_only=True)["text_embedding.weight"]
    assert exported.shape[0] == 2044 and torch.equal(exported[:320], base[:320])
    assert torch.equal(exported[370:], base[320:])  # the specials moved with their ids, frozen
    assert (tmp_path / "export" / "multilingual_zh_ja_yue_char_del.tiktoken").is_file()
    assert config_beside(tmp_path / "models" / "gpt.pth") == (tmp_path / "models" / "config.yaml", "")
