"""Speed options that must not change results: no host syncs per micro-batch, fused AdamW's state
format, compiled blocks, and the background checkpoint writer."""

from __future__ import annotations

import sys
import threading
from pathlib import Path

import pytest
import torch
from helpers import reference_batch

from indextts_train.checkpoint.async_save import BackgroundSaver, cpu_snapshot
from indextts_train.checkpoint.base import load_base_checkpoint
from indextts_train.checkpoint.files import load_checkpoint
from indextts_train.config.settings import load_config
from indextts_train.model.gpt import UnifiedVoiceGPT
from indextts_train.train.accel import adamw_options, compile_blocks
from indextts_train.train.loop import resolve_settings, train

pytestmark = pytest.mark.slow  # every test here trains a tiny run or starts the CLI: seconds each

TINY = Path(__file__).resolve().parent / "data" / "reference" / "tiny"
TRAIN_LAYER = Path(__file__).resolve().parents[1] / "indextts_train" / "train"


def test_the_loop_reads_metrics_once_per_log_interval(tiny_data, tmp_path, monkeypatch) -> None:
    """Every host read of a tensor made by a module of train/ (the loop, its steps, window and saving) is
    counted: none per micro-batch (8 steps x 2 micro-batches), one per log line (every 4 steps), one per
    optimizer step for the divergence guard (may the step update the weights: guard.py) and one per
    checkpoint (no NaN/Inf tensor is written; one save, at the end)."""
    calls: dict[str, int] = {}

    def counting(name: str):
        original = getattr(torch.Tensor, name)

        def read(self, *args, **kwargs):
            caller = Path(sys._getframe(1).f_code.co_filename)
            if caller.parent == TRAIN_LAYER:  # any module of the training layer, the loop's helpers included
                calls[f"{caller.name}:{name}"] = calls.get(f"{caller.name}:{name}", 0) + 1
            return original(self, *args, **kwargs)
        return read

    for name in ("item", "tolist", "__float__", "__int__", "__bool__"):
        monkeypatch.setattr(torch.Tensor, name, counting(name))
    options = resolve_settings(train_manifests=[tiny_data["train"]], output_dir=tmp_path / "run",
                           config=tiny_data["config"], base_checkpoint=tiny_data["base"], batch_size=2,
                           grad_accumulation=2, effective_batch_size=4, num_workers=0, max_steps=8, epochs=100,
                           log_interval=4, save_interval=100, tensorboard=False)
    assert train(options) == 0
    assert calls == {"window.py:tolist": 2, "steps.py:item": 8, "saving.py:__bool__": 1}
    assert len(load_checkpoint(tmp_path / "run" / "latest.pth")["history"]["train"]) == 2


def test_fused_adamw_only_on_cuda_and_its_state_loads_into_the_default_one() -> None:
    assert adamw_options(torch.device("cpu")) == {}
    assert adamw_options(torch.device("cuda", 0)) == {"fused": True}
    torch.manual_seed(0)
    params = [torch.nn.Parameter(torch.randn(4, 3)), torch.nn.Parameter(torch.randn(3))]
    fused = torch.optim.AdamW(params, lr=1e-2, fused=True)  # the CPU has a fused kernel too
    for _ in range(3):
        for p in params:
            p.grad = torch.randn_like(p)
        fused.step()
    state = fused.state_dict()
    default = torch.optim.AdamW([torch.nn.Parameter(p.detach().clone()) for p in params], lr=1e-2)
    default.load_state_dict(state)
    again = default.state_dict()
    assert again["param_groups"][0]["fused"] is True and again["state"].keys() == state["state"].keys()
    for index, slots in state["state"].items():
        assert {k: (v.shape, v.dtype) for k, v in slots.items()} == {
            k: (v.shape, v.dtype) for k, v in again["state"][index].items()}
        assert all(torch.equal(v, again["state"][index][k]) for k, v in slots.items())


def test_compiled_blocks_equal_eager_and_keep_the_official_keys() -> None:
    cfg = load_config(TINY / "config.yaml").gpt
    trained, _, _ = load_base_checkpoint(TINY / "gpt.pth", cfg)
    results = []
    for compiled in (False, True):
        model = UnifiedVoiceGPT(cfg, dropout=0.0)
        model.load_state_dict(trained)
        if compiled:
            compile_blocks(model.gpt.h)
        out = model.compute_losses(reference_batch())
        (0.2 * out.text_loss + 0.8 * out.mel_loss).backward()
        results.append((out.mel_loss.detach(), out.text_loss.detach(), list(model.state_dict()),
                        {k: p.grad for k, p in model.named_parameters()}))
    (mel, text, keys, grads), (c_mel, c_text, c_keys, c_grads) = results
    assert c_keys == keys
    torch.testing.assert_close(c_mel, mel, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(c_text, text, rtol=1e-6, atol=1e-6)
    for key, grad in grads.items():
        torch.testing.assert_close(c_grads[key], grad, rtol=1e-5, atol=1e-6, msg=key)


def test_snapshot_is_a_cpu_copy_the_loop_may_change() -> None:
    moment = torch.zeros(3)
    model = {"w": torch.ones(2)}
    state = {"model": model, "optimizer": {"state": {0: {"exp_avg": moment}}, "param_groups": [{"lr": 0.1}]},
             "history": {"train": [[1, 0.5]], "val": []}, "progress": {"step": 1}}
    snapshot = cpu_snapshot(state)
    moment.add_(1.0)
    state["history"]["train"].append([2, 0.4])
    state["optimizer"]["param_groups"][0]["lr"] = 0.2
    assert torch.equal(snapshot["optimizer"]["state"][0]["exp_avg"], torch.zeros(3))
    assert snapshot["history"]["train"] == [[1, 0.5]] and snapshot["optimizer"]["param_groups"][0]["lr"] == 0.1
    assert snapshot["model"] is model  # the official-layout tensors are fresh copies already


def test_background_saver_runs_one_at_a_time_and_reraises() -> None:
    saver, release, order = BackgroundSaver(), threading.Event(), []
    saver.start(lambda: (release.wait(5), order.append("first")))
    assert saver.in_flight
    release.set()
    saver.start(lambda: order.append("second"))  # waits for the first
    saver.wait()
    assert order == ["first", "second"] and not saver.in_flight

    def full_disk() -> None:
        raise OSError(28, "No space left on device")

    saver.start(full_disk)
    with pytest.raises(OSError, match="No space"):
        saver.wait()
    saver.wait()  # raised once, then clear
