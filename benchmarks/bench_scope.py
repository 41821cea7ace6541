"""What each --train-scope trains: parameter counts and gradient + AdamW bytes on the real configs,
and the CPU time of one optimizer step per scope on a small config.

Counts. The real IndexTTS2 and IndexTTS-2.5 GPTs (configs/indextts2.yaml, configs/indextts2_5.yaml)
are built on the meta device (shapes only, no memory, no weights), the scope is applied to each as
training applies it (text rows trainable: the vocabulary grew), and the parameters that keep
`requires_grad` (plus the LoRA adapters) are summed.
Gradient + AdamW state is 12 bytes per trainable number in fp32 (grad, exp_avg, exp_avg_sq); the
weights themselves are 4 bytes per number for every scope. The figures are checked against
`scope.scope_counts` (what hardware.py plans with).

Step time. A model_dim 256 / 6-layer / 4-head / max_mel_tokens 120 variant of configs/tiny.yaml with a grown vocabulary
(row freezer on), micro-batch 4 of text 32 and codes 96 tokens, fp32, `--threads` torch threads
(default 1: on a shared 2-core machine two spinning threads ran 8x slower than one):
forward, backward, row-freezer masking, clip, AdamW step (weight decay on) and restore, over
trainable tensors only. Each scope starts from the same weights; the scopes are interleaved
`--rounds` times, each round timing `--steps` steps after `--warmup`; the median step time is
reported. partial trains the last 2 of the 6 blocks; lora uses rank 16 on all four targets.

    python benchmarks/bench_scope.py [--steps 8] [--warmup 2] [--rounds 2] [--threads 1]

Writes benchmarks/results/scope.json and prints it.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import time
from pathlib import Path

import torch
from report import write_result

from indextts_train.config.settings import GPTConfig, load_config
from indextts_train.model.gpt import Batch, UnifiedVoiceGPT
from indextts_train.model.lora import LoraSpec
from indextts_train.model.scope import TRAIN_SCOPES, ScopeSettings, apply_scope, scope_counts, trainable_parameters
from indextts_train.text.vocab import RowFreezer, VocabPlan

ROOT = Path(__file__).resolve().parents[1]
RESULT = ROOT / "benchmarks" / "results" / "scope.json"
REAL_CONFIGS = {"indextts2": ROOT / "configs" / "indextts2.yaml",
                "indextts2.5": ROOT / "configs" / "indextts2_5.yaml"}
SMALL = {"model_dim": 256, "layers": 6, "heads": 4, "max_mel_tokens": 120}
SMALL_PARTIAL_LAYERS = 2
BASE_TOKENS, TOKENS = 90, 100  # the small model's vocabulary grew by 10 rows
MICRO_BATCH, TEXT, CODES = 4, 32, 96
GRAD_STATE_BYTES = 12  # fp32 gradient + AdamW exp_avg + exp_avg_sq


def meta_counts(cfg: GPTConfig, settings: ScopeSettings) -> dict:
    """Counts from a real module tree on the meta device, and the bytes they imply."""
    with torch.device("meta"):
        model = UnifiedVoiceGPT(cfg, dropout=0.0)
    adapters = apply_scope(model, settings, text_rows_train=True, generator=None)
    total = sum(p.numel() for p in model.parameters())
    trainable = sum(p.numel() for _, p in trainable_parameters(model, adapters))
    adapter_count = sum(p.numel() for p in adapters.parameters()) if adapters is not None else 0
    planned = scope_counts(cfg, settings, text_rows_train=True)
    if (planned["model"], planned["trainable"], planned["adapters"]) != (total, trainable, adapter_count):
        raise SystemExit(f"scope_counts disagrees with the meta model: {planned} vs {total}, {trainable}")
    return {
        "model_parameters": total, "adapter_parameters": adapter_count, "trainable_parameters": trainable,
        "trainable_share": round(trainable / total, 4),
        "gradient_plus_adamw_bytes": GRAD_STATE_BYTES * trainable,
        "gradient_plus_adamw_gib": round(GRAD_STATE_BYTES * trainable / 1024**3, 3),
        "weight_bytes": 4 * (total + adapter_count),
    }


def small_config() -> GPTConfig:
    cfg = load_config(ROOT / "configs" / "tiny.yaml").gpt
    for key, value in {**SMALL, "number_text_tokens": TOKENS}.items():
        setattr(cfg, key, value)
    return cfg


def batches(count: int) -> list[Batch]:
    g = torch.Generator().manual_seed(0)
    D = SMALL["model_dim"]
    return [Batch(text_ids=torch.randint(2, TOKENS, (MICRO_BATCH, TEXT), generator=g),
                  codes=torch.randint(0, 64, (MICRO_BATCH, CODES), generator=g),
                  text_lengths=torch.full((MICRO_BATCH,), TEXT), code_lengths=torch.full((MICRO_BATCH,), CODES),
                  condition=torch.randn(MICRO_BATCH, 32, D, generator=g),
                  emo_vec=torch.randn(MICRO_BATCH, D, generator=g))
            for _ in range(count)]


def step_seconds(scope: str, data: list[Batch], warmup: int) -> list[float]:
    """Per-step wall times of `len(data)` optimizer steps under `scope`, the first `warmup` dropped."""
    cfg = small_config()
    torch.manual_seed(0)
    model = UnifiedVoiceGPT(cfg, dropout=0.1).train()
    settings = ScopeSettings(scope, partial_layers=SMALL_PARTIAL_LAYERS, lora=LoraSpec())
    adapters = apply_scope(model, settings, text_rows_train=True, generator=torch.Generator().manual_seed(0))
    params = [p for _, p in trainable_parameters(model, adapters)]
    optimizer = torch.optim.AdamW(params, lr=1e-4, weight_decay=0.01)
    freezer = RowFreezer(model, VocabPlan(BASE_TOKENS, TOKENS))
    times = []
    for batch in data:
        start = time.perf_counter()
        out = model.compute_losses(batch)
        (0.2 * out.text_loss + 0.8 * out.mel_loss).backward()
        freezer.mask_grads()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        optimizer.step()
        freezer.restore()
        optimizer.zero_grad(set_to_none=True)
        times.append(time.perf_counter() - start)
    return times[warmup:]


def step_times(steps: int, warmup: int, rounds: int) -> dict:
    data = batches(warmup + steps)
    samples: dict[str, list[float]] = {scope: [] for scope in TRAIN_SCOPES}
    for _ in range(rounds):
        for scope in TRAIN_SCOPES:
            samples[scope] += step_seconds(scope, data, warmup)
    full = statistics.median(samples["full"])
    cfg = small_config()
    return {scope: {"median_step_s": round(statistics.median(times), 4),
                    "relative_to_full": round(statistics.median(times) / full, 3),
                    "trainable_parameters": scope_counts(cfg, ScopeSettings(scope, SMALL_PARTIAL_LAYERS))["trainable"],
                    "steps_timed": len(times)}
            for scope, times in samples.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=8, help="timed optimizer steps per scope and round")
    parser.add_argument("--warmup", type=int, default=2, help="untimed steps first")
    parser.add_argument("--rounds", type=int, default=2, help="interleaved rounds over the scopes")
    parser.add_argument("--threads", type=int, default=1, help="torch threads for the step timing")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    counts = {name: {scope: meta_counts(load_config(path).gpt, ScopeSettings(scope)) for scope in TRAIN_SCOPES}
              for name, path in REAL_CONFIGS.items()}
    result = {
        "defaults": {"partial_layers": ScopeSettings().partial_layers, "lora": vars(LoraSpec()) | {
            "targets": list(LoraSpec().targets)}},
        "real_config_counts": counts,
        "cpu_step_time": {"config": {**SMALL, "number_text_tokens": TOKENS, "base_tokens": BASE_TOKENS,
                                     "micro_batch": MICRO_BATCH, "text": TEXT, "codes": CODES,
                                     "partial_layers": SMALL_PARTIAL_LAYERS},
                          "scopes": step_times(args.steps, args.warmup, args.rounds)},
        "load_average": [round(x, 2) for x in os.getloadavg()],
        "torch_threads": torch.get_num_threads(), "cpu_count": os.cpu_count(), "torch": torch.__version__,
        "python": platform.python_version(), "date": time.strftime("%Y-%m-%d %H:%M:%S"),
    }
    write_result(RESULT, result)


if __name__ == "__main__":
    main()
