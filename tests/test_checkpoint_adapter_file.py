"""`verify` on an adapter file from `export --adapters-out`, and on a path that is not a file."""

from __future__ import annotations

import torch
from typer.testing import CliRunner

from indextts_train.checkpoint.verify import verify_checkpoint
from indextts_train.cli import app
from indextts_train.config.scope_settings import LoraSpec
from indextts_train.model.lora import adapter_file

LAYER = "gpt.h.0.attn.c_attn"


def write_adapter_file(path, *, poison: bool = False) -> None:
    """What export --adapters-out writes, for one adapted layer of a tiny trunk (dim 8, rank 2)."""
    generator = torch.Generator().manual_seed(0)
    adapters = {f"{LAYER}.lora_A": torch.randn(2, 8, generator=generator),
                f"{LAYER}.lora_B": torch.randn(24, 2, generator=generator)}
    if poison:
        adapters[f"{LAYER}.lora_B"][0, 0] = float("nan")
    base = {f"{LAYER}.weight": torch.randn(8, 24, generator=generator)}
    payload = adapter_file(adapters, LoraSpec(rank=2, alpha=4.0, targets=("qkv",)), base,
                           {"text_head.weight": torch.randn(5, 8, generator=generator)},
                           {"family": "indextts2", "model_dim": 8, "layers": 1, "checkpoint": "latest.pth"})
    torch.save(payload, path)


def test_verify_knows_an_adapter_file(tmp_path) -> None:
    path = tmp_path / "lora.pth"
    write_adapter_file(path)
    verdict = verify_checkpoint(path)
    assert (verdict.status, verdict.kind) == ("PARTIAL", "adapters")
    assert verdict.summary["rank"] == 2 and verdict.summary["adapted_layers"] == 1
    assert verdict.summary["trained_tensors"] == 1 and verdict.summary["params"] == 2 * 8 + 24 * 2 + 5 * 8
    result = CliRunner().invoke(app, ["verify", str(path)])
    assert result.exit_code == 1 and f"{path}: PARTIAL (adapters)" in result.output
    assert "LoRA adapter file (export --adapters-out): rank 2 on 1 layer(s)" in result.output
    assert "cannot resume a run" in result.output


def test_export_or_evaluate_of_an_adapter_file_says_what_it_is(tmp_path) -> None:
    """It said "stores no config; pass --config", and with one, "not a gpt.pth state dict"."""
    path = tmp_path / "lora.pth"
    write_adapter_file(path)
    for args in (["export", str(path), "-o", str(tmp_path / "out" / "gpt.pth")],
                 ["evaluate", "--checkpoint", str(path), "--manifest", str(tmp_path / "m.jsonl")]):
        result = CliRunner().invoke(app, args)
        assert result.exit_code == 2, result.output
        assert f"{path} is an adapters file (export --adapters-out" in result.output
        assert "pass the run's checkpoint" in result.output
    assert not (tmp_path / "out").exists()


def test_a_damaged_adapter_file_is_incomplete(tmp_path) -> None:
    path = tmp_path / "lora.pth"
    write_adapter_file(path, poison=True)
    verdict = verify_checkpoint(path)
    assert (verdict.status, verdict.kind) == ("INCOMPLETE", "adapters") and "no usable adapters" in verdict.reasons[0]


def test_verify_says_why_a_path_is_missing(tmp_path) -> None:
    (tmp_path / "run").mkdir()
    for name in ("model_step10.pth", "latest.pth"):
        (tmp_path / "run" / name).write_bytes(b"")
    cases = {tmp_path / "run": "is a folder, not a checkpoint file",
             tmp_path / "nowhere" / "latest.pth": f"its folder {tmp_path / 'nowhere'} does not exist",
             tmp_path / "run" / "lates.pth": ".pth files there: latest.pth, model_step10.pth",
             tmp_path / "lates.pth": "the folder holds no .pth file",
             tmp_path / "links" / "loop.pth": "a symbolic link to loop2.pth, which leads to no file (missing, or a "
                                               "loop of links)",
             tmp_path / "links" / "gone.pth": "a symbolic link to moved.pth, which leads to no file"}
    (tmp_path / "links").mkdir()
    (tmp_path / "links" / "loop.pth").symlink_to("loop2.pth")
    (tmp_path / "links" / "loop2.pth").symlink_to("loop.pth")
    (tmp_path / "links" / "gone.pth").symlink_to("moved.pth")
    for path, reason in cases.items():
        result = CliRunner().invoke(app, ["verify", str(path)])  # no -v: the reason is always said
        assert result.exit_code == 2 and reason in result.output, result.output
