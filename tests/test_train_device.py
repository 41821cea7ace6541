"""The devices a run plans for: the known GPUs as torch reports them, and the names users type."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from indextts_train.errors import UserError
from indextts_train.train.device import KNOWN_GPUS, assume_device
from indextts_train.train.memory import GIB


def test_known_gpus_report_less_than_the_size_on_the_box():
    # The community table's `>= 80 GiB` branch never fires for these; ours must not need it.
    assert KNOWN_GPUS["A100-80GB"].total_memory < 80 * GIB
    assert KNOWN_GPUS["H100-80GB"].total_memory < 80 * GIB
    assert KNOWN_GPUS["A100-40GB"].total_memory < 40 * GIB
    assert KNOWN_GPUS["H200"].total_memory < 141 * GIB  # "141 GB" on the box; torch reported 139.8 GiB


def test_the_gpu_the_benchmarks_ran_on_can_be_assumed():
    """The README quotes H200 figures; `hardware --assume H200` answered "unknown GPU"."""
    measured = json.loads((Path(__file__).parents[1] / "benchmarks" / "results" / "gpu-NVIDIA-H200.json").read_text())
    device = assume_device("h200")
    assert device.name == measured["device"] and round(device.total_memory / GIB, 1) == measured["total_memory_gib"]
    assert device.capability == tuple(measured["capability"]) and device.bf16


def test_assume_device_is_case_insensitive_and_copies():
    device = assume_device("a100-80gb", cpu_count=3)
    assert device.name == "NVIDIA A100-SXM4-80GB" and device.cpu_count == 3
    assert KNOWN_GPUS["A100-80GB"].cpu_count != 3


def test_assume_device_unknown_name_lists_the_known_ones():
    with pytest.raises(UserError) as info:
        assume_device("RTX-9090")
    assert "RTX-9090" in str(info.value)
    assert all(name in str(info.value) for name in KNOWN_GPUS)
