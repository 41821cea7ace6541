"""export's targets: with --force, an existing file is replaced only when it is of the kind its flag writes."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

from indextts_train.checkpoint.export_targets import check_targets
from indextts_train.errors import UserError

TEXT = Path(__file__).parent / "data" / "reference" / "prepare" / "text"


def _check(tmp_path: Path, flag: str, target: Path) -> None:
    checkpoint = tmp_path / "ckpt.pth"
    checkpoint.write_bytes(b"PK\x03\x04")
    targets = {"-o": None, "--config-out": None, "--adapters-out": None, "--tokenizer": None, flag: target}
    tokenizer = TEXT / "bpe_tiny.model" if flag == "--tokenizer" else None  # the copy's target: the run's tokenizer
    check_targets(checkpoint, None, tokenizer, targets, force=True, replaceable=set())


@pytest.mark.parametrize(("flag", "typed"), [
    ("-o", "bpe.model"), ("-o", "train.jsonl"), ("-o", "config.yaml"), ("--adapters-out", "codes.npy"),
    ("--config-out", "train.jsonl"), ("--config-out", "bpe.model"), ("--tokenizer", "config.yaml"),
    ("--tokenizer", "gpt.pth"),
])
def test_force_does_not_replace_a_file_of_another_kind(tmp_path, flag, typed) -> None:
    """`export RUN -o data/bpe.model --force` replaced the run's tokenizer with a gpt.pth."""
    files = {"bpe.model": (TEXT / "bpe_tiny.model").read_bytes(),
             "train.jsonl": b'{"id": "a", "text": "x"}\n{"id": "b", "text": "y"}\n',
             "config.yaml": b"gpt:\n  model_dim: 64\n"}
    target = tmp_path / typed
    if typed == "codes.npy":
        np.save(target, np.arange(4, dtype=np.int32))
    elif typed == "gpt.pth":
        torch.save({"w": torch.zeros(1)}, target)
    else:
        target.write_bytes(files[typed])
    before = target.read_bytes()
    with pytest.raises(UserError, match=rf"^{flag} {target} exists and is not a .*, so --force does not replace it"):
        _check(tmp_path, flag, target)
    assert target.read_bytes() == before


@pytest.mark.parametrize(("flag", "name", "make"), [
    ("-o", "gpt.pth", lambda p: torch.save({"w": torch.zeros(1)}, p)),
    ("--adapters-out", "a.pth", lambda p: torch.save({"w": torch.zeros(1)}, p, _use_new_zipfile_serialization=False)),
    ("--config-out", "config.yaml", lambda p: p.write_text("gpt:\n  model_dim: 64\n")),
    ("--tokenizer", "bpe.model", lambda p: shutil.copy(TEXT / "bpe_tiny.model", p)),
    ("--tokenizer", "m.tiktoken", lambda p: shutil.copy(TEXT / "toy_base.tiktoken", p)),  # the suffix says the kind
    ("-o", "gpt.pth", lambda p: os.symlink(TEXT / "bpe_tiny.model", p)),  # a link is replaced itself, never its target
])
def test_force_replaces_a_file_of_the_kind_its_flag_writes(tmp_path, flag, name, make) -> None:
    target = tmp_path / name
    make(target)
    _check(tmp_path, flag, target)


def test_force_does_not_replace_a_fifo(tmp_path) -> None:
    fifo = tmp_path / "gpt.pth"
    os.mkfifo(fifo)
    with pytest.raises(UserError, match=r"is a FIFO \(named pipe\), not a file"):
        _check(tmp_path, "-o", fifo)
