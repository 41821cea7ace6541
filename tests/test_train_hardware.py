"""hardware.py: precision, micro-batch, accumulation and workers from the device, and OOM fallback."""

from __future__ import annotations

import json
import os
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from indextts_train.config.family import INDEXTTS2, INDEXTTS25
from indextts_train.config.scope_settings import LoraSpec, ScopeSettings
from indextts_train.config.settings import GPTConfig
from indextts_train.errors import UserError
from indextts_train.model.scope import scope_counts
from indextts_train.train import hardware, memory
from indextts_train.train.device import KNOWN_GPUS, DeviceInfo, assume_device, detect_device
from indextts_train.train.hardware import (
    HardwarePlan,
    choose_plan,
    gpu_table,
    halve_for_oom,
    is_oom_error,
    plan_device,
)
from indextts_train.train.memory import GIB, estimate_memory, max_sequence_positions, trained_parameter_count

PROJECT = Path(__file__).resolve().parents[1]
REFERENCE = Path(__file__).resolve().parent / "data" / "reference"
REAL = GPTConfig()  # defaults are the real IndexTTS2 sizes
BF16_GPUS = ["A100-80GB", "A100-40GB", "H100-80GB", "L4"]
FP16_GPUS = ["V100-16GB", "V100-32GB", "T4"]


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def _small_cfg() -> GPTConfig:
    return GPTConfig(model_dim=128, heads=4, layers=2, max_text_tokens=20, max_mel_tokens=60,
                     number_text_tokens=100, number_mel_codes=66, start_mel_token=64, stop_mel_token=65)


# ---- what is on the GPU ---------------------------------------------------------------------


def test_trained_parameter_count_matches_the_reference_backward():
    keys = json.loads((REFERENCE / "indextts2_gpt_keys.json").read_text(encoding="utf-8"))
    trained = keys["indextts2"]["trained_with_precomputed_conditions"]
    assert trained_parameter_count(REAL) == trained["numel"] == 527_083_235


def test_trained_parameter_count_of_the_real_25_config_matches_its_reference_backward():
    keys = json.loads((REFERENCE / "v2_5" / "indextts25_gpt_keys.json").read_text(encoding="utf-8"))
    cfg = GPTConfig(number_text_tokens=60509, stated_family=INDEXTTS25)
    assert trained_parameter_count(cfg) == keys["indextts25"]["trained_in_training_path"]["numel"] == 651_696_224
    assert max_sequence_positions(cfg) == max_sequence_positions(REAL) - 31  # a 3-row prefix, not 34


# ---- precision --------------------------------------------------------------------------------


@pytest.mark.parametrize("name", BF16_GPUS)
def test_ampere_and_newer_get_bf16_and_tf32(name):
    plan = choose_plan(assume_device(name), REAL, effective_batch=64)
    assert (plan.precision, plan.amp_dtype, plan.use_grad_scaler, plan.tf32) == ("bf16", "bfloat16", False, True)


@pytest.mark.parametrize("name", FP16_GPUS)
def test_older_gpus_get_fp16_with_a_scaler_and_no_tf32(name):
    plan = choose_plan(assume_device(name), REAL, effective_batch=64)
    assert (plan.precision, plan.amp_dtype, plan.use_grad_scaler, plan.tf32) == ("fp16", "float16", True, False)
    assert any("no native bfloat16" in reason for reason in plan.reasons)


def test_no_amp_on_a_gpu_is_fp32_without_scaler():
    plan = choose_plan(assume_device("A100-80GB"), REAL, effective_batch=64, amp=False)
    assert (plan.precision, plan.amp_dtype, plan.use_grad_scaler) == ("fp32", None, False)
    assert plan.tf32  # TF32 still speeds up fp32 matmuls on Ampere
    assert any("--no-amp" in reason for reason in plan.reasons)


def test_amp_true_keeps_the_device_choice_on_gpu_and_is_ignored_on_cpu():
    assert choose_plan(assume_device("V100-16GB"), REAL, effective_batch=64, amp=True).precision == "fp16"
    assert choose_plan(assume_device("L4"), REAL, effective_batch=64, amp=True).precision == "bf16"
    cpu = DeviceInfo("cpu", "cpu", 16 * GIB, (0, 0), False, 4)
    plan = choose_plan(cpu, _small_cfg(), effective_batch=8, amp=True)
    assert (plan.precision, plan.use_grad_scaler, plan.tf32) == ("fp32", False, False)
    assert any("--amp ignored" in reason for reason in plan.reasons)


# ---- micro-batch and accumulation -------------------------------------------------------------


@pytest.mark.parametrize("ckpt", [False, True])
@pytest.mark.parametrize("effective", [64, 48])
@pytest.mark.parametrize("name", list(KNOWN_GPUS))
def test_auto_keeps_the_effective_batch_and_takes_the_largest_fitting_divisor(name, effective, ckpt):
    plan = choose_plan(assume_device(name), REAL, effective_batch=effective, activation_checkpointing=ckpt)
    assert plan.effective_batch == plan.micro_batch * plan.grad_accumulation == effective
    assert effective % plan.micro_batch == 0

    def estimate(micro: int) -> int:
        return estimate_memory(REAL, micro, precision=plan.precision, activation_checkpointing=ckpt)

    assert plan.estimated_bytes == estimate(plan.micro_batch)
    assert plan.budget_bytes == int(0.85 * assume_device(name).total_memory)
    if plan.estimated_bytes > plan.budget_bytes:  # nothing fits: the floor, and the reasons say so
        assert plan.micro_batch == 1
        assert any("OVER the budget" in reason for reason in plan.reasons)
    larger = [d for d in _divisors(effective) if d > plan.micro_batch]
    assert not larger or estimate(larger[0]) > plan.budget_bytes


@pytest.mark.parametrize("ckpt", [False, True])
def test_a100_80gb_gets_a_bigger_micro_batch_than_a100_40gb(ckpt):
    big = choose_plan(assume_device("A100-80GB"), REAL, effective_batch=64, activation_checkpointing=ckpt)
    small = choose_plan(assume_device("A100-40GB"), REAL, effective_batch=64, activation_checkpointing=ckpt)
    assert big.micro_batch > small.micro_batch
    assert big.effective_batch == small.effective_batch == 64


def test_activation_checkpointing_fits_more_samples():
    off = choose_plan(assume_device("L4"), REAL, effective_batch=64)
    on = choose_plan(assume_device("L4"), REAL, effective_batch=64, activation_checkpointing=True)
    assert on.micro_batch > off.micro_batch


def test_world_size_splits_the_batch_and_counts_ddp_buckets():
    one = choose_plan(assume_device("A100-40GB"), REAL, effective_batch=64, activation_checkpointing=True)
    two = choose_plan(assume_device("A100-40GB"), REAL, effective_batch=64, activation_checkpointing=True,
                      world_size=2)
    assert two.micro_batch * two.grad_accumulation * 2 == two.effective_batch == 64
    same = estimate_memory(REAL, 4, precision="bf16", activation_checkpointing=True)
    ddp = estimate_memory(REAL, 4, precision="bf16", activation_checkpointing=True, world_size=2)
    assert ddp - same == 4 * trained_parameter_count(REAL)
    assert one.world_size == 1 and two.world_size == 2


def test_explicit_values_win():
    device = assume_device("A100-80GB")
    both = choose_plan(device, REAL, effective_batch=64, batch_size=3, grad_accumulation=5, num_workers=2)
    assert (both.micro_batch, both.grad_accumulation, both.effective_batch, both.num_workers) == (3, 5, 15, 2)
    assert any("NOT the one asked for" in reason and "asked 64" in reason for reason in both.reasons)

    only_batch = choose_plan(device, REAL, effective_batch=64, batch_size=8)
    assert (only_batch.micro_batch, only_batch.grad_accumulation, only_batch.effective_batch) == (8, 8, 64)
    uneven = choose_plan(device, REAL, effective_batch=64, batch_size=6)
    assert (uneven.grad_accumulation, uneven.effective_batch) == (11, 66)

    only_accum = choose_plan(device, REAL, effective_batch=64, grad_accumulation=16)
    assert (only_accum.micro_batch, only_accum.grad_accumulation, only_accum.effective_batch) == (4, 16, 64)


def test_explicit_batch_over_the_budget_is_kept_and_flagged():
    plan = choose_plan(assume_device("T4"), REAL, effective_batch=64, batch_size=32)
    assert plan.micro_batch == 32 and plan.estimated_bytes > plan.budget_bytes
    assert any("OVER the budget" in reason and "activation_checkpointing" in reason for reason in plan.reasons)


def test_bad_counts_are_user_errors():
    device = assume_device("L4")
    with pytest.raises(UserError, match="--batch-size"):
        choose_plan(device, REAL, effective_batch=64, batch_size=-1)
    with pytest.raises(UserError, match="effective_batch_size"):
        choose_plan(device, REAL, effective_batch=0)
    with pytest.raises(UserError, match="memory share"):
        choose_plan(device, REAL, effective_batch=64, memory_share=1.5)


# ---- the estimate -------------------------------------------------------------------------------


def test_estimate_grows_with_the_batch_and_shrinks_with_checkpointing_and_half_precision():
    def est(micro: int, precision: str = "bf16", ckpt: bool = False) -> int:
        return estimate_memory(REAL, micro, precision=precision, activation_checkpointing=ckpt)

    assert est(1) < est(2) < est(4)
    assert est(4, ckpt=True) < est(4)
    assert est(4) < est(4, "fp32")
    assert est(4, "fp16") == est(4, "bf16")
    fixed = 16 * trained_parameter_count(REAL) + GIB  # weights, grads, AdamW moments, CUDA reserve
    assert est(1) > fixed
    with pytest.raises(ValueError):
        estimate_memory(REAL, 1, precision="int8", activation_checkpointing=False)


@pytest.mark.parametrize("family", [INDEXTTS2, INDEXTTS25])
@pytest.mark.parametrize("ckpt", [False, True])
def test_estimate_covers_what_the_real_model_saves_for_backward(ckpt, family):
    """Bytes saved for backward by indextts_train.model.gpt per sample (fp32, dropout 0 so CPU SDPA takes
    the flash path as GPUs do) must not exceed the estimate's per-sample share."""
    from indextts_train.model.gpt import Batch, UnifiedVoiceGPT

    cfg = _small_cfg()
    cfg.stated_family = family
    torch.manual_seed(0)
    model = UnifiedVoiceGPT(cfg, dropout=0.0, activation_checkpointing=ckpt).train()
    weights = {p.untyped_storage().data_ptr() for p in model.parameters()}

    def saved_bytes(batch_size: int) -> int:
        T, M, D = cfg.max_text_tokens, cfg.max_mel_tokens, cfg.model_dim
        batch = Batch(torch.randint(2, 100, (batch_size, T)), torch.randint(0, 64, (batch_size, M)),
                      torch.full((batch_size,), T), torch.full((batch_size,), M),
                      None if cfg.family.speaker_vector else torch.randn(batch_size, 32, D), torch.randn(batch_size, D),
                      spk_emb=torch.randn(batch_size, 192) if cfg.family.speaker_vector else None,
                      lang_ids=torch.randint(0, 107, (batch_size,)) if cfg.family.speaker_vector else None)
        storages: dict[int, int] = {}

        def pack(t: torch.Tensor) -> torch.Tensor:
            storage = t.untyped_storage()
            if storage.data_ptr() not in weights:
                storages[storage.data_ptr()] = storage.nbytes()
            return t

        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):  # what backward will need
            model.compute_losses(batch)
        return sum(storages.values())

    measured = (saved_bytes(4) - saved_bytes(2)) / 2
    # The step term (AdamW's temporary) must not hide the per-sample part at these batch sizes.
    est = [estimate_memory(cfg, m, precision="fp32", activation_checkpointing=ckpt) for m in (2, 4)]
    per_sample = (est[1] - est[0]) / 2
    assert measured <= per_sample
    if not ckpt:  # without checkpointing nearly everything is saved: the estimate is not wildly high
        assert per_sample < 2 * measured


# ---- workers and the CPU path -------------------------------------------------------------------


def test_cpu_path_on_this_machine(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    device = detect_device()
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    assert (device.kind, device.name, device.bf16, device.cpu_count) == ("cpu", "cpu", False, cores)
    plan = choose_plan(device, _small_cfg(), effective_batch=64)
    assert (plan.device, plan.precision, plan.amp_dtype, plan.use_grad_scaler, plan.tf32) == (
        "cpu", "fp32", None, False, False)
    assert plan.num_workers == 0  # the CPU's cores go to the model's threads
    assert plan.micro_batch == 8 and plan.grad_accumulation == 8 and plan.effective_batch == 64


@pytest.mark.parametrize(("cores", "world", "workers"), [(1, 1, 0), (2, 1, 1), (32, 1, 8), (16, 4, 3)])
def test_auto_workers_leave_a_core_per_process(cores, world, workers):
    device = DeviceInfo("cuda", "NVIDIA L4", 24 * GIB, (8, 9), True, cores)
    assert choose_plan(device, _small_cfg(), effective_batch=64, world_size=world).num_workers == workers


def test_detect_device_reads_cuda_and_ignores_emulated_bf16(monkeypatch):
    props = SimpleNamespace(name="Tesla V100-SXM2-32GB", total_memory=34_089_730_048, major=7, minor=0)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda index: props)
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *a, **k: True)  # emulation says yes
    device = detect_device(0)
    assert (device.kind, device.name, device.capability, device.bf16) == ("cuda", props.name, (7, 0), False)
    assert choose_plan(device, REAL, effective_batch=64).precision == "fp16"
    with pytest.raises(UserError, match="LOCAL_RANK 1"):
        detect_device(1)


# ---- out of memory ------------------------------------------------------------------------------


def test_is_oom_error_recognises_oom_and_nothing_else():
    assert is_oom_error(torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB"))
    assert is_oom_error(RuntimeError("HIP out of memory. Tried to allocate 20 MiB"))
    assert not is_oom_error(RuntimeError("mat1 and mat2 shapes cannot be multiplied"))
    assert not is_oom_error(ValueError("out of memory"))
    assert not is_oom_error(KeyboardInterrupt())


def test_halve_for_oom_keeps_the_effective_batch_until_one():
    plan = choose_plan(assume_device("A100-80GB"), REAL, effective_batch=48, batch_size=12)
    seen = []
    while plan.micro_batch > 1:
        before = plan.micro_batch
        plan = halve_for_oom(plan)
        seen.append(plan.micro_batch)
        assert plan.micro_batch <= before // 2
        assert plan.micro_batch * plan.grad_accumulation * plan.world_size == plan.effective_batch == 48
        assert "Out of memory at micro-batch" in plan.reasons[-1]
    assert seen == [6, 3, 1]
    oom = torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 9.00 GiB")
    with pytest.raises(UserError, match="micro-batch 1.*activation_checkpointing") as info:
        halve_for_oom(plan, error=oom)
    assert info.value.__cause__ is oom and "Tried to allocate 9.00 GiB" in str(info.value)


# ---- plan records and the docs table ------------------------------------------------------------


def test_plan_round_trips_through_json():
    plan = choose_plan(assume_device("T4"), REAL, effective_batch=64, activation_checkpointing=True)
    again = HardwarePlan.from_dict(json.loads(json.dumps(plan.to_dict())))
    assert again == plan
    text = plan.describe()
    assert text.splitlines()[0].startswith("Tesla T4 (cuda): fp16, micro-batch 4 x accumulation 16")
    assert len(text.splitlines()) == 1 + len(plan.reasons)
    with pytest.raises(UserError, match="unknown key"):
        HardwarePlan.from_dict({**plan.to_dict(), "colour": "red"})


def test_docs_table_is_the_current_output():
    table = gpu_table(REAL)
    assert len(table.splitlines()) == 2 + 2 * len(KNOWN_GPUS)
    assert table in (PROJECT / "docs" / "gpu_table.md").read_text(encoding="utf-8")
    table_25 = gpu_table(GPTConfig(number_text_tokens=60509, stated_family=INDEXTTS25))
    assert table_25 != table and table_25 in (PROJECT / "docs" / "gpu_table.md").read_text(encoding="utf-8")


# ---- --train-scope: gradients and AdamW state only for what trains ----------------------------


SCOPES = [ScopeSettings("full"), ScopeSettings("partial"), ScopeSettings("lora")]
REAL_BY_FAMILY = {"2": REAL, "2.5": GPTConfig(number_text_tokens=60509, stated_family=INDEXTTS25)}


@pytest.mark.parametrize("family", list(REAL_BY_FAMILY))
@pytest.mark.parametrize("scope", SCOPES, ids=lambda s: s.train_scope)
def test_gradients_and_adamw_state_are_counted_for_trainable_tensors_only(scope, family):
    cfg = REAL_BY_FAMILY[family]
    counts = scope_counts(cfg, scope)
    if scope.train_scope == "full":
        assert counts["trainable"] == counts["model"] == trained_parameter_count(cfg)
    # micro-batch 0 in fp32 leaves the fixed part and the larger of AdamW's step temporary (4 bytes per
    # stepped number) and the chunked loss's working set
    fixed = estimate_memory(cfg, 0, precision="fp32", activation_checkpointing=True, scope=scope)
    weights = 4 * (counts["model"] + counts["adapters"])
    transient = max(4 * counts["trainable"], memory.loss_working_bytes(cfg, 4))
    assert fixed == weights + 12 * counts["trainable"] + transient + memory.CUDA_RESERVE_BYTES
    ddp = estimate_memory(cfg, 0, precision="fp32", activation_checkpointing=True, scope=scope, world_size=2)
    assert ddp - fixed == 4 * counts["trainable"]


@pytest.mark.parametrize("family", list(REAL_BY_FAMILY))
@pytest.mark.parametrize("name", list(KNOWN_GPUS))
@pytest.mark.parametrize("ckpt", [False, True])
def test_partial_and_lora_fit_at_least_the_full_micro_batch(name, ckpt, family):
    cfg = REAL_BY_FAMILY[family]
    plans = [choose_plan(assume_device(name), cfg, effective_batch=64, activation_checkpointing=ckpt, scope=s)
             for s in SCOPES]
    full = plans[0]
    for plan in plans[1:]:
        assert plan.micro_batch >= full.micro_batch
        assert estimate_memory(cfg, full.micro_batch, precision=full.precision, activation_checkpointing=ckpt,
                               scope=SCOPES[plans.index(plan)]) < full.estimated_bytes
    if name == "T4" and ckpt:  # the card the issue names: 4 -> 8 samples per micro-batch (2.5: 1 -> 8)
        assert [p.micro_batch for p in plans] == ([4, 8, 8] if family == "2" else [1, 8, 8])
    assert "train scope lora (rank 16, alpha 32, dropout 0," in plans[2].reasons[-2]


@pytest.mark.parametrize("scope", SCOPES[1:], ids=lambda s: s.train_scope)
def test_estimate_covers_what_partial_and_lora_save_for_backward(scope):
    """As the full-model test above: saved-for-backward bytes per sample under each scope (the text
    rows train, so the gradient crosses every block) stay within the estimate's per-sample share."""
    from indextts_train.model.gpt import Batch, UnifiedVoiceGPT
    from indextts_train.model.scope import apply_scope

    cfg = _small_cfg()
    scope = ScopeSettings(scope.train_scope, partial_layers=1, lora=LoraSpec(dropout=0.0))  # CPU masks are float
    torch.manual_seed(0)
    model = UnifiedVoiceGPT(cfg, dropout=0.0).train()
    adapters = apply_scope(model, scope, text_rows_train=True, generator=torch.Generator())
    params = [*model.parameters(), *(adapters.parameters() if adapters else [])]
    weights = {p.untyped_storage().data_ptr() for p in params}

    def saved_bytes(batch_size: int) -> int:
        T, M, D = cfg.max_text_tokens, cfg.max_mel_tokens, cfg.model_dim
        batch = Batch(torch.randint(2, 100, (batch_size, T)), torch.randint(0, 64, (batch_size, M)),
                      torch.full((batch_size,), T), torch.full((batch_size,), M),
                      torch.randn(batch_size, 32, D), torch.randn(batch_size, D))
        storages: dict[int, int] = {}

        def pack(t: torch.Tensor) -> torch.Tensor:
            if t.untyped_storage().data_ptr() not in weights:
                storages[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
            return t

        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            model.compute_losses(batch)
        return sum(storages.values())

    measured = (saved_bytes(4) - saved_bytes(2)) / 2
    est = [estimate_memory(cfg, m, precision="fp32", activation_checkpointing=False, scope=scope) for m in (2, 4)]
    per_sample = (est[1] - est[0]) / 2
    assert measured <= per_sample < 2 * measured


# ---- exact resume on CUDA (issue 23) ------------------------------------------------------------


def test_a_cuda_plan_asks_for_deterministic_algorithms_and_a_cpu_plan_does_not(monkeypatch) -> None:
    monkeypatch.delenv("CUBLAS_WORKSPACE_CONFIG", raising=False)
    cpu = DeviceInfo("cpu", "cpu", 16 * GIB, (0, 0), False, 4)
    cpu_plan = choose_plan(cpu, _small_cfg(), effective_batch=8)
    assert not hardware.apply_determinism(cpu_plan)
    assert not torch.are_deterministic_algorithms_enabled() and "CUBLAS_WORKSPACE_CONFIG" not in os.environ
    cuda_plan = choose_plan(assume_device("A100-80GB"), REAL, effective_batch=64)  # a fake plan: no GPU here
    try:
        assert hardware.apply_determinism(cuda_plan)
        assert torch.are_deterministic_algorithms_enabled()
        assert os.environ["CUBLAS_WORKSPACE_CONFIG"] == ":4096:8"
        assert torch.backends.cudnn.deterministic and not torch.backends.cudnn.benchmark
    finally:
        torch.use_deterministic_algorithms(False)
        torch.backends.cudnn.deterministic = False


def test_a_cublas_setting_of_the_user_is_kept() -> None:
    environ = {"CUBLAS_WORKSPACE_CONFIG": ":16:8"}
    hardware.prepare_exact_resume_env(environ)
    assert environ == {"CUBLAS_WORKSPACE_CONFIG": ":16:8"}
    fresh: dict = {}
    hardware.prepare_exact_resume_env(fresh)
    assert fresh == {"CUBLAS_WORKSPACE_CONFIG": ":4096:8"}
# ---- sizes refused before anything is built ---------------------------------------------------------


def test_a_model_whose_weights_exceed_host_memory_is_refused_before_it_is_built():
    huge = GPTConfig(model_dim=16384, heads=16, layers=1000)
    cpu = DeviceInfo("cpu", "cpu", 8 * GIB, (0, 0), False, 2)
    with pytest.raises(UserError, match=r"has [\d,]+ parameters: [\d.]+ GiB of fp32 weights, more than this "
                                        r"machine's 8.00 GiB of memory; check the config's sizes \(gpt.layers 1000"):
        choose_plan(cpu, huge, effective_batch=8)
    assert choose_plan(cpu, _small_cfg(), effective_batch=8).micro_batch >= 1


def test_a_model_whose_training_state_exceeds_the_gpu_is_refused(monkeypatch):
    monkeypatch.setattr(hardware, "system_memory", lambda: 2**50)  # plenty of host RAM: the GPU decides
    big = GPTConfig(model_dim=4096, heads=32, layers=200)  # ~40G parameters: 640 GB of fp32 training state
    with pytest.raises(UserError, match="for weights, gradients and AdamW state alone, more than the"):
        choose_plan(assume_device("A100-80GB", cpu_count=8), big, effective_batch=64)
    choose_plan(assume_device("A100-80GB", cpu_count=8), REAL, effective_batch=64)  # the real size fits


def test_more_workers_than_cores_are_lowered_with_a_warning():
    device = assume_device("A100-80GB", cpu_count=6)
    plan = choose_plan(device, REAL, effective_batch=64, num_workers=100_000)
    assert plan.num_workers == 6
    assert "warning: --num-workers 100000 is more than the 6 CPU core(s); lowered to 6 data worker(s)." in plan.reasons
    assert choose_plan(device, REAL, effective_batch=64, num_workers=6).num_workers == 6
CONSUMER = ("RTX-4090", "RTX-3090", "A10G", "L40S", "RTX-A6000")


@pytest.mark.parametrize("name", CONSUMER)
def test_consumer_gpus_plan_from_memory_and_capability_alone(name) -> None:
    """A named card is only its memory and compute capability: the same numbers given as MEM@CC plan
    the same, and a spelling with spaces or lower case finds the card."""
    known = assume_device(name.lower().replace("-", " "))
    spec = f"{known.total_memory / GIB:.6f}GiB@{known.capability[0]}.{known.capability[1]}"
    described = assume_device(spec)
    assert described.capability == known.capability and abs(described.total_memory - known.total_memory) < 2**12
    plans = [choose_plan(device, REAL, effective_batch=64, activation_checkpointing=True)
             for device in (known, described)]
    assert plans[0].precision == "bf16" and not plans[0].use_grad_scaler  # compute capability 8.6 / 8.9
    assert (plans[0].micro_batch, plans[0].grad_accumulation) == (plans[1].micro_batch, plans[1].grad_accumulation)


def test_assume_spec_follows_capability_and_memory() -> None:
    old = choose_plan(assume_device("16GiB@7.5"), REAL, effective_batch=64, activation_checkpointing=True)
    assert old.precision == "fp16" and old.use_grad_scaler
    small, big = (choose_plan(assume_device(f"{gib}GiB@8.9"), REAL, effective_batch=64, activation_checkpointing=True)
                  for gib in (12, 48))
    assert small.micro_batch < big.micro_batch
    with pytest.raises(UserError, match="MEMORY@CAPABILITY"):
        assume_device("24GB")


def test_an_assumed_memory_of_hundreds_of_digits_is_no_gpu_not_an_overflow() -> None:
    """`--assume 999...9GiB@8.9`: the size was an infinite float, and int() of it an OverflowError (a traceback)."""
    with pytest.raises(UserError, match="not a GPU a plan can be made for"):
        choose_plan(plan_device("9" * 400 + "GiB@8.9"), REAL, effective_batch=64)
