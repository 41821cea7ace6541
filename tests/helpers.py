"""Helpers shared by several test files (pytest puts this folder on sys.path)."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import numpy as np
import torch
from torch.nn.utils.rnn import pad_sequence

from indextts_train.model import Batch

ROOT = Path(__file__).resolve().parents[1]
TINY_REFERENCE = ROOT.parent / "shared" / "reference" / "tiny"


def reference_batch(lines: list[dict] | None = None) -> Batch:
    """Collate tiny/pairs.jsonl the reference way: pad with 0, lengths from the manifest."""
    if lines is None:
        lines = [json.loads(line) for line in (TINY_REFERENCE / "pairs.jsonl").read_text().splitlines()]

    def load(line: dict, key: str) -> torch.Tensor:
        return torch.from_numpy(np.load(TINY_REFERENCE / line[key]))

    return Batch(
        text_ids=pad_sequence([load(x, "target_text_ids_path").long() for x in lines], batch_first=True),
        codes=pad_sequence([load(x, "target_codes_path").long() for x in lines], batch_first=True),
        text_lengths=torch.tensor([x["target_text_len"] for x in lines]),
        code_lengths=torch.tensor([x["target_code_len"] for x in lines]),
        condition=torch.stack([load(x, "prompt_condition_path") for x in lines]),
        emo_vec=torch.stack([load(x, "prompt_emo_vec_path") for x in lines]),
    )


def start(args: list[str], env: dict | None = None) -> subprocess.Popen:
    """The real CLI in its own session, output unbuffered so the test sees each line as it comes."""
    return subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=ROOT,
                            env={**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})}, start_new_session=True)


def wait_for_training(proc: subprocess.Popen) -> bool:
    """Read output until the loop starts; False when the process ended first (run complete)."""
    for line in proc.stdout:
        if line.startswith("training "):
            return True
    proc.wait()
    return False
