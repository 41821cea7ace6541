"""train/resume.py's lines about a resume on another setup: what they say of the effective batch is what the plan
holds (a resume with another process count may change it, and the line said it was the same)."""

from __future__ import annotations

import dataclasses

from indextts_train.train.hardware import HardwarePlan
from indextts_train.train.resume import note_changed_arithmetic

PLAN = HardwarePlan(device="cpu", device_name="cpu", precision="fp32", amp_dtype=None, use_grad_scaler=False,
                    tf32=False, micro_batch=2, grad_accumulation=1, effective_batch=4, world_size=2, num_workers=0,
                    memory_share=1.0, estimated_bytes=0, budget_bytes=0)


class Said:
    def __init__(self) -> None:
        self.warnings: list[str] = []

    def warn(self, line: str) -> None:
        self.warnings.append(line)


def test_another_process_count_says_the_effective_batch_it_trains_with() -> None:
    said = Said()
    three = dataclasses.replace(PLAN, world_size=3, effective_batch=6)  # 4 does not split over 3 processes
    note_changed_arithmetic(three, PLAN.to_dict(), said)
    (line,) = said.warnings
    assert "processes 2 -> 3" in line and "with an effective batch of 6 (it was 4)" in line
    assert "same effective batch" not in line and "same course" not in line

    said = Said()
    split = dataclasses.replace(PLAN, micro_batch=1, grad_accumulation=2)  # the same 4, split otherwise
    note_changed_arithmetic(split, PLAN.to_dict(), said)
    (line,) = said.warnings
    assert "with the same effective batch, but rounds differently" in line and "(they follow the same course)" in line
