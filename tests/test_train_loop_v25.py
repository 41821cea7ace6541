"""IndexTTS-2.5 through the real CLI: training with a grown tiktoken vocabulary, what stays frozen,
exact resume after SIGKILL, a vocabulary grown again between runs, and verify/repair/evaluate/export."""

from __future__ import annotations

import json
import random
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from helpers import start, wait_for_training
from test_train_resume import assert_same_final_state, finish, run_to_end
from test_ui_console import scalars as tensorboard_scalars
from typer.testing import CliRunner, Result

from indextts_train.checkpoint.export import export_checkpoint
from indextts_train.checkpoint.files import CheckpointError, load_checkpoint
from indextts_train.checkpoint.repair import repair_checkpoint
from indextts_train.checkpoint.verify import verify_checkpoint
from indextts_train.cli import app
from indextts_train.config.family import INDEXTTS25
from indextts_train.config.settings import TrainConfig, config_to_dict, load_config
from indextts_train.data.retokenize import tokenize_manifests
from indextts_train.data.sampling import ManifestSpec, epoch_order, sampler_spec
from indextts_train.model.layout import official_shapes
from indextts_train.text.tiktoken_vocab import extend_tiktoken, read_tiktoken
from indextts_train.train import preflight
from indextts_train.train.evaluate import evaluate_checkpoint

pytestmark = pytest.mark.slow  # every test here trains a tiny run or starts the CLI: seconds each

ROOT = Path(__file__).resolve().parents[1]
TEXT_KEYS = ("text_embedding.weight", "text_head.weight", "text_head.bias")
R, N, K = 320, 1993, 50  # base ranks, base text tokens, ranks the grown vocabulary adds


def cli_args(data: dict, out: Path, *, max_steps: int, workers: int = 0, tokenizer: Path | None = None,
             extra: tuple[str, ...] = ()) -> list[str]:
    return [sys.executable, "-m", "indextts_train", "train",
            "--train-manifest", str(data["train"]), "--val-manifest", str(data["val"]),
            "--config", str(data["config"]), "--base-checkpoint", str(data["base"]),
            "--tokenizer", str(tokenizer or data["tokenizer"]), "--output-dir", str(out), "--resume", "auto",
            "--batch-size", "2", "--grad-accumulation", "2", "--effective-batch-size", "4",
            "--num-workers", str(workers), "--max-steps", str(max_steps), "--epochs", "100",
            "--learning-rate", "3e-3", "--warmup-steps", "2", "--weight-decay", "0.5", "--seed", "11",
            "--save-interval", "2", "--val-interval", "6", "--log-interval", "1", "--keep-checkpoints", "2", *extra]


@pytest.fixture(scope="module")
def trained(tiny25_data, tmp_path_factory) -> dict:
    out = tmp_path_factory.mktemp("run25")
    output = run_to_end(cli_args(tiny25_data, out, max_steps=12))
    return {"out": out, "output": output, "state": load_checkpoint(out / "latest.pth")}


def test_training_grows_the_vocabulary_and_the_loss_falls(trained):
    output, state = trained["output"], trained["state"]
    assert f"text vocab: {N} base tokens -> {N + K} tokens" in output
    assert f"rows {R + K}..{N + K - 1}: special tokens, moved up by {K}" in output
    assert "language rows trained: en (0), am (75)" in output and "spk_emb_proj frozen (default)" in output
    losses = [row[1] for row in state["history"]["train"]]
    assert sum(losses[-3:]) < sum(losses[:3])
    assert state["config"]["version"] == 2.5 and state["hparams"]["borrow_languages"] == []
    assert state["vocab_plan"]["insert_at"] == R


def test_frozen_rows_language_rows_and_speaker_projection_stay_bit_identical(tiny25_data, trained):
    base = torch.load(tiny25_data["base"], weights_only=True)
    model = trained["state"]["model"]
    for key in TEXT_KEYS:
        assert torch.equal(model[key][:R], base[key][:R]), key  # ranks (weight decay 0.5 is on)
        assert torch.equal(model[key][R + K:], base[key][R:]), key  # specials and the extra row, moved by K
    unused = [row for row in range(107) if row not in (0, 75)]
    assert torch.equal(model["lang_embedding.weight"][unused], base["lang_embedding.weight"][unused])
    assert not torch.equal(model["lang_embedding.weight"][[0, 75]], base["lang_embedding.weight"][[0, 75]])
    assert torch.equal(model["spk_emb_proj.weight"], base["spk_emb_proj.weight"])
    assert torch.equal(model["spk_emb_proj.bias"], base["spk_emb_proj.bias"])


CRASH_POINTS = ["accumulation@3", "save_partial@4", "save_before_latest@6"]


def test_sigkill_anywhere_then_resume_is_bit_identical(tiny25_data, trained, tmp_path):
    """The same 12 steps as the `trained` run, killed at chosen points and at random moments."""
    out = tmp_path / "killed"
    restarts = 0
    for point in CRASH_POINTS:
        code, output = finish(start(cli_args(tiny25_data, out, max_steps=12, workers=2 * (restarts % 2)),
                                    env={"INDEXTTS_TRAIN_CRASH_AT": point}))
        restarts += 1
        assert code == -signal.SIGKILL, f"{point} did not fire:\n{output}"
    rng = random.Random(25)
    for _ in range(2):
        proc = start(cli_args(tiny25_data, out, max_steps=12, workers=2 * (restarts % 2)))
        restarts += 1
        assert wait_for_training(proc), "the run finished before the random kills"
        time.sleep(rng.uniform(0.0, 0.4))
        proc.kill()
        finish(proc)
    assert "resuming from" in run_to_end(cli_args(tiny25_data, out, max_steps=12))
    assert_same_final_state(out, trained["out"])
    # one TensorBoard run across the restarts, showing what the uninterrupted run shows
    assert tensorboard_scalars(out) == tensorboard_scalars(trained["out"])


def test_vocabulary_grown_again_between_runs_keeps_every_row_and_the_optimizer(tiny25_data, trained, tmp_path):
    out = tmp_path / "run"
    shutil.copytree(trained["out"], out, ignore=shutil.ignore_patterns("logs"))
    first = trained["state"]
    corpus = tmp_path / "more.txt"
    corpus.write_text("selam new words here\nmore new words here again\n" * 3)
    regrown = tmp_path / "regrown.tiktoken"
    extend_tiktoken(tiny25_data["tokenizer"], [corpus], N + K + 6, regrown)
    assert read_tiktoken(regrown).n_ranks == R + K + 6
    # the language tags moved up by 6 with the specials: the text is re-encoded, as the README says
    # (training refuses ids that do not start with the line's tag)
    retokenized = tokenize_manifests([tiny25_data["train"], tiny25_data["val"]], regrown, tmp_path / "retok",
                                     normalizer="none")
    assert retokenized["bad"] == 0
    data = {**tiny25_data, "train": tmp_path / "retok" / "train.jsonl", "val": tmp_path / "retok" / "val.jsonl"}
    output = run_to_end(cli_args(data, out, max_steps=14, tokenizer=regrown, extra=("--accept-data-change",)))
    assert f"vocabulary changed: {N + K} -> {N + K + 6}" in output and "optimizer state kept" in output
    after = load_checkpoint(out / "latest.pth")
    base = torch.load(tiny25_data["base"], weights_only=True)
    for key in TEXT_KEYS:
        grown = after["model"][key]
        assert grown.shape[0] == N + K + 7
        assert torch.equal(grown[:R], base[key][:R]) and torch.equal(grown[R + K + 6:], base[key][R:]), key
    assert after["history"]["train"][:12] == first["history"]["train"]
    assert after["progress"]["step"] == 14 and after["vocab_plan"]["insert_at"] == R
    names = after["optimizer_param_names"]
    moment = after["optimizer"]["state"][names.index("text_embedding.weight")]["exp_avg"]
    assert moment.shape[0] == N + K + 7


def test_verify_evaluate_and_export_with_the_grown_tiktoken(tiny25_data, trained, tmp_path):
    checkpoint = trained["out"] / "latest.pth"
    verdict = verify_checkpoint(checkpoint)
    assert verdict.status == "COMPLETE" and verdict.summary["family"] == "IndexTTS-2.5"
    export = tmp_path / "export"
    export_checkpoint(checkpoint, export / "gpt.pth", config_out=export / "config.yaml",
                      tokenizer=Path(tiny25_data["tokenizer"]))
    weights = torch.load(export / "gpt.pth", weights_only=True)
    shipped = load_config(export / "config.yaml").gpt
    assert shipped.family is INDEXTTS25 and shipped.number_text_tokens == N + K
    # IndexTTS-2.5's loader is strict=False: the key set must be exactly the official one, checked here.
    assert list(weights) == list(official_shapes(shipped))
    assert {k: tuple(v.shape) for k, v in weights.items()} == official_shapes(shipped)
    assert (export / "multilingual_zh_ja_yue_char_del.tiktoken").read_bytes() == \
        Path(tiny25_data["tokenizer"]).read_bytes()

    def evaluate(path: Path) -> float:
        return evaluate_checkpoint(path, [Path(tiny25_data["val"])], export / "config.yaml")["loss"]

    assert evaluate(export / "gpt.pth") == pytest.approx(evaluate(checkpoint), abs=1e-6)


def test_corrupt_latest_is_skipped_and_left_on_disk(tiny25_data, trained, tmp_path):
    out = tmp_path / "corrupt"
    shutil.copytree(trained["out"], out, ignore=shutil.ignore_patterns("logs"))  # hard links become copies
    for name in ("latest.pth", "model_step12.pth"):  # one file in the run: both names are cut
        with open(out / name, "r+b") as handle:
            handle.truncate((out / name).stat().st_size // 2)
    damaged = {name: (out / name).read_bytes() for name in ("latest.pth", "model_step12.pth")}
    output = run_to_end(cli_args(tiny25_data, out, max_steps=14))
    assert "skipping" in output and "resuming from" in output and "model_step10.pth" in output
    # Never overwritten, renamed over or deleted: the step-12 save is skipped with a warning.
    assert {name: (out / name).read_bytes() for name in damaged} == damaged
    assert f"not saving step 12: {out / 'model_step12.pth'} is a file this run could not verify" in output
    assert load_checkpoint(out / "model_step14.pth")["progress"]["step"] == 14


def test_a_repaired_community_25_checkpoint_resumes_and_grows_like_a_base(tiny25_data, tmp_path):
    base = torch.load(tiny25_data["base"], weights_only=True)
    community = tmp_path / "community.pth"
    torch.save({"model": {f"module.{k}": v for k, v in base.items()}, "step": 4, "epoch": 1}, community)
    assert verify_checkpoint(community).status == "PARTIAL"
    repair_checkpoint(community, config=config_to_dict(load_config(tiny25_data["config"])))
    assert verify_checkpoint(community).status == "COMPLETE"
    args = cli_args(tiny25_data, tmp_path / "run", max_steps=6)
    args[args.index("--resume") + 1] = str(community)
    output = run_to_end(args)
    assert "starting at step 4" in output and f"vocabulary changed: {N} -> {N + K}" in output
    model = load_checkpoint(tmp_path / "run" / "latest.pth")["model"]
    for key in TEXT_KEYS:  # the specials moved up with their ids, as for a fresh growth
        assert torch.equal(model[key][:R], base[key][:R]) and torch.equal(model[key][R + K:], base[key][R:]), key


def test_repair_base_vocab_of_a_grown_25_file_freezes_the_base_ranks_and_the_specials(tiny25_data, trained,
                                                                                        tmp_path):
    grown = trained["state"]["model"]  # N + K text tokens: the K new ranks sit at R..R+K-1
    community = tmp_path / "community.pth"
    torch.save({"model": {f"module.{k}": v for k, v in grown.items()}, "step": 4, "epoch": 1}, community)
    config = config_to_dict(load_config(tiny25_data["config"]))
    _, notes = repair_checkpoint(community, tmp_path / "assumed.pth", config=config)
    assert load_checkpoint(tmp_path / "assumed.pth")["vocab_plan"] == {
        "base_tokens": N + K, "tokens": N + K, "freeze_base": False, "insert_at": None}
    assert any("no base vocabulary is assumed for IndexTTS-2.5" in note for note in notes)  # not IndexTTS2's 12000
    with pytest.raises(CheckpointError, match="1673 special tokens"):
        repair_checkpoint(community, tmp_path / "x.pth", config=config, base_vocab=1000)
    _, notes = repair_checkpoint(community, config=config, base_vocab=N)
    assert load_checkpoint(community)["vocab_plan"] == {"base_tokens": N, "tokens": N + K, "freeze_base": True,
                                                        "insert_at": R}
    assert any(f"its {R} ranks (rows 0..{R - 1}) and its specials (rows {R + K}..{N + K - 1})" in n for n in notes)
    args = cli_args(tiny25_data, tmp_path / "run", max_steps=6)
    args[args.index("--resume") + 1] = str(community)
    assert "starting at step 4" in run_to_end(args)
    model = load_checkpoint(tmp_path / "run" / "latest.pth")["model"]
    for key in TEXT_KEYS:  # weight decay 0.5 is on: only frozen rows stay bit-identical
        assert torch.equal(model[key][:R], grown[key][:R]) and torch.equal(model[key][R + K:], grown[key][R + K:])
        assert not torch.equal(model[key][R:R + K], grown[key][R:R + K]), key


def test_a_language_without_a_tag_borrows_an_unused_row_and_the_export_says_so(tiny25_data, tmp_path):
    lines = [json.loads(line) for line in Path(tiny25_data["train"]).read_text(encoding="utf-8").splitlines()]
    for line in lines:
        if line["language"] == "am":  # the Amharic lines now say `kab`, a code with no row and no tag
            line["language"] = "kab"
            del line["lang_id"]
    manifest = Path(tiny25_data["train"]).with_name("kab_train.jsonl")
    manifest.write_text("".join(json.dumps(line, ensure_ascii=False) + "\n" for line in lines), encoding="utf-8")
    data = {**tiny25_data, "train": manifest}
    refused = subprocess.run(cli_args(data, tmp_path / "refused", max_steps=2), cwd=ROOT, capture_output=True,
                             text=True)
    assert refused.returncode == 2 and "--borrow-language kab=CODE" in refused.stderr + refused.stdout
    output = run_to_end(cli_args(data, tmp_path / "run", max_steps=2,
                                 extra=("--borrow-language", "kab=am", "--train-speaker-proj")))
    assert "language rows trained: en (0), am (75)" in output and "language kab was trained on the row" in output
    model = load_checkpoint(tmp_path / "run" / "latest.pth")["model"]
    base = torch.load(tiny25_data["base"], weights_only=True)
    assert not torch.equal(model["spk_emb_proj.weight"], base["spk_emb_proj.weight"])  # --train-speaker-proj
    summary = export_checkpoint(tmp_path / "run" / "latest.pth", tmp_path / "out" / "gpt.pth",
                                config_out=tmp_path / "out" / "c.yaml", tokenizer=Path(tiny25_data["tokenizer"]))
    assert any("call IndexTTS-2.5 inference with lang='am'" in note for note in summary["notes"])
    assert (tmp_path / "out" / "c.yaml").read_text().startswith("# indextts-train: language kab was trained")


def test_bad_data_mid_run_and_changed_data_lose_nothing(tiny25_data, tmp_path, monkeypatch):
    """Issue 9 on IndexTTS-2.5 data, through the CLI in this process: a bad sample found mid-run (a stop
    mel token inside a target's codes) ends the run with exit 2 after saving the steps done;
    --skip-bad-lines leaves it out instead and lists it; a manifest changed since the checkpoint is
    refused on resume."""
    # The checks before training read the head of each manifest; this tiny one is all head, so they
    # step aside here to let the line stand for one deep in a big manifest, found only when loaded.
    monkeypatch.setattr(preflight, "check_manifest_sample", lambda *args, **kwargs: None)
    folder = tmp_path / "data"
    shutil.copytree(tiny25_data["folder"], folder)
    manifest = folder / Path(tiny25_data["train"]).name
    lines = manifest.read_text().splitlines()
    lengths = np.array([json.loads(line)["target_text_len"] + json.loads(line)["target_code_len"] for line in lines])
    spec = sampler_spec([ManifestSpec(manifest)], [len(lines)], seed=11, sort_window=TrainConfig().sort_window,
                        step_samples=4)
    index = int(epoch_order(spec, lengths, 0)[9])  # a sample of step 3
    codes_path = folder / json.loads(lines[index])["target_codes_path"]
    codes = np.load(codes_path)
    codes[1] = 65  # tiny_v25's stop_mel_token
    np.save(codes_path, codes)

    def train(out: Path, *extra: str, steps: int = 6) -> Result:
        return CliRunner().invoke(app, [
            "train", "--train-manifest", str(manifest), "--config", str(tiny25_data["config"]),
            "--base-checkpoint", str(tiny25_data["base"]), "--tokenizer", str(folder / tiny25_data["tokenizer"].name),
            "--output-dir", str(out), "--resume", "auto", "--batch-size", "2", "--grad-accumulation", "2",
            "--effective-batch-size", "4", "--num-workers", "0", "--max-steps", str(steps), "--epochs", "100",
            "--seed", "11", "--save-interval", "100", *extra])

    out = tmp_path / "stopped"
    result = train(out)
    assert result.exit_code == 2, result.output
    assert result.stderr.startswith(f"error: {manifest}:{index + 1}: target_codes_path holds the start/stop mel "
                                    "token 65 at position 1"), result.stderr
    assert f"step 2, the last completed one, is saved in {out / 'model_step2.pth'}" in result.stderr
    assert verify_checkpoint(out / "model_step2.pth").status == "COMPLETE"

    out = tmp_path / "skipping"
    result = train(out, "--skip-bad-lines")
    assert result.exit_code == 0, result.output
    assert f"sample load(s) of 1 bad line(s) (--skip-bad-lines):\n  {manifest}:{index + 1}: " in result.stdout
    assert load_checkpoint(out / "latest.pth")["data"]["skipped_loads"] >= 1
    manifest.write_text("".join(f"{line}\n" for line in lines[:-1]))
    result = train(out, "--skip-bad-lines", steps=8)
    assert result.exit_code == 2
    assert result.stderr.startswith(f"error: the training data changed since {out / 'latest.pth'} ({manifest}: "
                                    f"{len(lines)} -> {len(lines) - 1} usable lines (removed))"), result.stderr
