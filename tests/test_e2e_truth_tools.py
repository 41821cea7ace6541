"""What the commands other than training say agrees with the files they write and read: prepare's summary
and its manifests, export's adapter file and what verify says of it."""

from __future__ import annotations

import json

import pytest
import test_train_loop_v25
import torch
from typer.testing import CliRunner

from indextts_train.checkpoint.verify import verify_checkpoint
from indextts_train.cli import app
from indextts_train.prepare.pairs import SplitRule, make_pairs
from indextts_train.prepare.pipeline import PrepareOptions, run_prepare
from indextts_train.prepare.progress import print_summary
from indextts_train.prepare.tiny import write_synthetic_clips

# stable_hash fractions: utt0000 0.503, utt0001 0.769, utt0002 0.781, utt0003 0.835; --val-fraction 0.6 holds
# out utt0000 alone, so spk0's other clip, utt0002, is a training target with no prompt it may take
VAL_FRACTION = 0.6


def test_a_training_target_whose_other_clips_are_all_held_out_is_counted_and_said(tmp_path, capsys) -> None:
    """Such a clip is in no pair; the summary said '0 single-utterance speakers left out' and, of its prompts,
    'their speakers have fewer other clips' (its speaker had another, held out for validation)."""
    utts = [{"id": f"utt{i:04d}", "speaker": f"spk{i % 2}"} for i in range(4)]
    pairs = make_pairs(utts, SplitRule(val_fraction=VAL_FRACTION, prompts_per_target=2))
    assert pairs.unpaired == ["utt0002"]
    assert {t["id"] for t, _ in pairs.train + pairs.val} == {"utt0000", "utt0001", "utt0003"}
    counts = {"kept": 4, "utterances": 4, "speakers": 2, "rejected": 0, "rejected_by_reason": {},
              "rejected_top": [], "languages": {}, "train_pairs": len(pairs.train), "val_pairs": len(pairs.val),
              "single_utterance_speakers": 0, "targets_with_fewer_prompts": pairs.fewer_prompts, "text_tokens": 20,
              "distinct_text_tokens": 9, "extended_pieces": 0}
    print_summary({"counts": counts, "hours": 0.001, "settings": {"prompts_per_target": 2},
                   "unpaired_targets": len(pairs.unpaired)}, tmp_path)
    out = capsys.readouterr().out
    assert "warning: 1 kept clip(s) are in no pair, so they neither train nor validate" in out
    assert "a training target takes none held out for validation" in out


@pytest.mark.slow  # the real model stages: seconds a run
def test_prepare_says_how_many_kept_clips_its_manifests_leave_out(tmp_path, tiny_models, capsys) -> None:
    texts = [("hello there", None), ("good day", None), ("one more", None), ("and again", None)]
    corpus = write_synthetic_clips(tmp_path / "clips", texts, speakers=2, seed=0, seconds=(0.6, 1.2))
    out = tmp_path / "out"
    options = PrepareOptions(corpora=[corpus], model_dir=tiny_models, device="cpu", min_seconds=0.3, out=out,
                             split=SplitRule(val_fraction=VAL_FRACTION, prompts_per_target=2))
    assert run_prepare(options) == 0
    said = capsys.readouterr().out
    kept = [json.loads(line)["id"] for line in (out / "utterances.jsonl").read_text().splitlines()]
    targets = {json.loads(line)["target_id"] for name in ("train.jsonl", "val.jsonl")
               for line in (out / name).read_text().splitlines()}
    left_out = [uid for uid in kept if uid not in targets]
    assert left_out == ["utt0002"]
    assert f"warning: {len(left_out)} kept clip(s) are in no pair" in said, said
    assert "unpaired_targets" not in json.loads((out / "prepare.json").read_text())  # the record is as it was


@pytest.mark.slow  # trains a tiny IndexTTS-2.5 lora run in this process: seconds
def test_the_adapter_file_holds_only_tensors_the_lora_run_trained(tiny25_data, tmp_path) -> None:
    """Without --train-speaker-proj the run keeps spk_emb_proj bit-identical to the base, yet the adapter file
    held it among 'the other tensors the run trained', and verify counted it: '8 other trained tensors'."""
    run = tmp_path / "run"
    args = test_train_loop_v25.cli_args(tiny25_data, run, max_steps=2, extra=("--train-scope", "lora"))
    result = CliRunner().invoke(app, args[3:])
    assert result.exit_code == 0, result.output
    result = CliRunner().invoke(app, ["export", str(run), "-o", str(tmp_path / "gpt.pth"), "--adapters-out",
                                      str(tmp_path / "lora.pth"), "--tokenizer", str(tiny25_data["tokenizer"])])
    assert result.exit_code == 0, result.output
    tensors = torch.load(tmp_path / "lora.pth", weights_only=True)["tensors"]
    base = torch.load(tiny25_data["base"], weights_only=True)
    base = base.get("model", base)
    unchanged = sorted(k for k, v in tensors.items() if k in base and torch.equal(v, base[k]))
    assert unchanged == [] and not any(k.startswith("spk_emb_proj.") for k in tensors), unchanged
    verdict = verify_checkpoint(tmp_path / "lora.pth")
    assert verdict.summary["trained_tensors"] == len(tensors)
    assert f"{len(tensors)} other trained tensors" in verdict.reasons[0]
