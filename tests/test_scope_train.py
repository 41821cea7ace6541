"""--train-scope partial / lora through the real trainer: exact resume after SIGKILL, frozen tensors
bit-identical to the base, the scope fixed for a run, the demo's loss falling, and the merged export."""

from __future__ import annotations

import math
import random
import signal
import time
from pathlib import Path

import pytest
import torch
from helpers import start, wait_for_training
from test_resume import assert_same_final_state, cli_args, finish, run_to_end
from typer.testing import CliRunner

from indextts_train.checkpoint import load_checkpoint, verify_checkpoint
from indextts_train.cli import app
from indextts_train.config import load_config
from indextts_train.demo import run_demo
from indextts_train.evaluate import evaluate_checkpoint
from indextts_train.lora import apply_adapter_file
from indextts_train.model import official_shapes

ROOT = Path(__file__).resolve().parents[1]
TINY = load_config(ROOT / "configs" / "tiny.yaml").gpt
STEPS = 16  # 24 samples / effective batch 4: 6 steps an epoch, so the kills cross epochs
SCOPE_FLAGS = {"partial": ["--train-scope", "partial"],  # tiny.yaml: partial_layers 1 of 2 blocks
               "lora": ["--train-scope", "lora", "--lora-rank", "4", "--lora-dropout", "0.1"]}


def scoped_args(tiny_data: dict, config: Path, out: Path, scope: str, workers: int = 0) -> list[str]:
    args = cli_args(tiny_data, config, out, workers)
    args[args.index("--max-steps") + 1] = str(STEPS)
    return args + SCOPE_FLAGS[scope]


@pytest.fixture(scope="module")
def grown(tiny_data, tmp_path_factory) -> Path:
    """Tiny config with 150 text tokens over the 100-token base: new rows train, base rows freeze."""
    text = (ROOT / "configs" / "tiny.yaml").read_text()
    path = tmp_path_factory.mktemp("cfg") / "grown.yaml"
    path.write_text(text.replace("number_text_tokens: 100", "number_text_tokens: 150"))
    return path


def frozen_keys(scope: str) -> list[str]:
    """Tensors the scope never trains (the tiny model has 2 blocks; partial trains block 1)."""
    never = ("mel_embedding.", "text_pos_embedding.", "mel_pos_embedding.", "speed_emb.", "gpt.h.0.",
             "conditioning_encoder.", "emo_layer.")
    keys = [k for k in official_shapes(TINY) if k.startswith(never)]
    if scope == "lora":
        keys += [k for k in official_shapes(TINY) if k.startswith(("gpt.h.1.", "gpt.ln_f.", "final_norm."))]
    return keys


@pytest.mark.parametrize("scope", ["partial", "lora"])
def test_sigkill_then_resume_is_bit_identical(tiny_data, grown, tmp_path, scope) -> None:
    whole = tmp_path / "whole"
    run_to_end(scoped_args(tiny_data, grown, whole, scope))
    killed = tmp_path / "killed"
    for point in ("accumulation@3", "save_before_latest@6", "accumulation@7"):  # mid-step, mid-save, new epoch
        code, output = finish(start(scoped_args(tiny_data, grown, killed, scope, workers=2),
                                    env={"INDEXTTS_TRAIN_CRASH_AT": point}))
        assert code == -signal.SIGKILL, f"{point} did not fire:\n{output}"
    proc = start(scoped_args(tiny_data, grown, killed, scope))  # and at a random moment
    if wait_for_training(proc):
        time.sleep(random.Random(7).uniform(0.0, 0.4))
        proc.kill()
    finish(proc)
    assert "resuming from" in run_to_end(scoped_args(tiny_data, grown, killed, scope))
    assert_same_final_state(killed, whole)
    got, want = load_checkpoint(killed / "latest.pth"), load_checkpoint(whole / "latest.pth")
    if scope == "lora":
        assert got["lora"]["adapters"].keys() == want["lora"]["adapters"].keys()
        assert all(torch.equal(got["lora"]["adapters"][k], v) for k, v in want["lora"]["adapters"].items())
    else:
        assert got["lora"] is None
    base = torch.load(tiny_data["base"], weights_only=True)
    for key in frozen_keys(scope):
        assert torch.equal(got["model"][key], base[key]), key
    assert torch.equal(got["model"]["text_embedding.weight"][:100], base["text_embedding.weight"][:100])
    names = got["optimizer_param_names"]  # only what trains has optimizer state
    assert not set(names) & set(frozen_keys(scope))
    assert any(".lora_A" in n for n in names) == (scope == "lora")


def test_the_scope_cannot_change_on_resume(tiny_data, grown, tmp_path) -> None:
    out = tmp_path / "run"
    args = scoped_args(tiny_data, grown, out, "lora")
    args[args.index("--max-steps") + 1] = "2"
    run_to_end(args)
    before = {p.name: p.stat().st_mtime_ns for p in out.iterdir()}
    for flags, needle in ((["--train-scope", "full"], "this run asks for full"),
                          (SCOPE_FLAGS["lora"][:2] + ["--lora-rank", "8"], "asks for lora (rank 8")):
        result = CliRunner().invoke(app, [str(a) for a in args[3:-len(SCOPE_FLAGS["lora"])] + flags])
        assert result.exit_code == 2, result.output
        line = result.stderr.strip()
        assert "\n" not in line and "was trained with --train-scope lora (rank 4" in line and needle in line
        assert "export" in line  # says how to switch
    assert {p.name: p.stat().st_mtime_ns for p in out.iterdir()} == before
    state = load_checkpoint(out / "latest.pth")  # a lora checkpoint without its adapters cannot resume
    del state["lora"]
    torch.save(state, tmp_path / "no_adapters.pth")
    verdict = verify_checkpoint(tmp_path / "no_adapters.pth")
    assert verdict.status != "COMPLETE" and any("lora: missing" in r for r in verdict.reasons), verdict.reasons


@pytest.mark.parametrize("scope", ["partial", "lora"])
def test_demo_trains_and_exports_a_plain_gpt_pth(tmp_path, capsys, scope) -> None:
    assert run_demo(tmp_path, max_steps=40, train_scope=scope) == 0
    assert f"train scope: {scope}" in capsys.readouterr().out
    run = tmp_path / "run" / "latest.pth"
    state = load_checkpoint(run)
    losses = [row[1] for row in state["history"]["train"]]
    assert losses[-1] < 0.8 * losses[0], losses  # the loss visibly falls
    base = torch.load(tmp_path / "base_gpt.pth", weights_only=True)
    for key in frozen_keys(scope):
        assert torch.equal(state["model"][key], base[key]), key
    exported = torch.load(tmp_path / "export" / "gpt.pth", weights_only=True)
    cfg = load_config(tmp_path / "export" / "config.yaml").gpt
    assert list(exported) == list(official_shapes(cfg))  # exactly the official keys, in release order
    assert {k: tuple(v.shape) for k, v in exported.items()} == official_shapes(cfg)
    manifest = [tmp_path / "data" / "val.jsonl"]
    adapted = evaluate_checkpoint(run, manifest)
    merged = evaluate_checkpoint(tmp_path / "export" / "gpt.pth", manifest, tmp_path / "export" / "config.yaml")
    for key in ("text_loss", "mel_loss", "loss"):
        assert math.isclose(adapted[key], merged[key], rel_tol=0, abs_tol=1e-5), key
    if scope == "lora":  # the merge changed the trunk, and the adapters-only file reproduces it
        assert not torch.equal(exported["gpt.h.0.attn.c_attn.weight"], base["gpt.h.0.attn.c_attn.weight"])
        result = CliRunner().invoke(app, ["export", str(run), "-o", str(tmp_path / "again.pth"),
                                          "--adapters-out", str(tmp_path / "lora.pth")])
        assert result.exit_code == 0, result.output
        payload = torch.load(tmp_path / "lora.pth", weights_only=True)
        assert (tmp_path / "lora.pth").stat().st_size < (tmp_path / "again.pth").stat().st_size / 2
        applied = apply_adapter_file(base, payload, "lora.pth")
        assert all(torch.allclose(applied[k], exported[k], rtol=0, atol=1e-6) for k in exported)
    assert verify_checkpoint(run).status == "COMPLETE"
