"""prepare is a pure function of (corpus, models, settings): SIGKILL at random moments and rerun, or two
torchrun CPU ranks, give the manifests of one uninterrupted process byte for byte and equal arrays."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from indextts_train.prepare.tiny import write_synthetic_clips, write_tiny_model_dir

ROOT = Path(__file__).resolve().parents[1]
REF = ROOT / "tests" / "data" / "reference" / "prepare"
MANIFESTS = ("utterances.jsonl", "train.jsonl", "val.jsonl", "rejected.jsonl", "prepare.json")
TEXT = "Hello world, this is a test."


@pytest.fixture(scope="module")
def setup(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("kill")
    write_tiny_model_dir(root / "models", gpt_config=ROOT / "configs" / "tiny.yaml",
                         tokenizer=REF / "text" / "bpe_tiny.model", seed=1)
    texts = [(TEXT, None)] * 11 + [("", None)]  # one rejected line too
    write_synthetic_clips(root / "clips", texts, speakers=3, seed=4, seconds=(0.6, 1.1))
    return root


def _command(root: Path, out: str) -> list[str]:
    return ["prepare", str(root / "clips" / "corpus.jsonl"), "--model-dir", str(root / "models"), "--out",
            str(root / out), "--device", "cpu", "--batch-seconds", "2", "--val-fraction", "0.3"]


def _env() -> dict[str, str]:
    return {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}


def _run(root: Path, out: str) -> int:
    return subprocess.run([sys.executable, "-m", "indextts_train", *_command(root, out)], env=_env(), cwd=ROOT,
                          capture_output=True, timeout=600).returncode


def _same_outputs(reference: Path, other: Path) -> None:
    for name in MANIFESTS:
        assert (other / name).read_bytes() == (reference / name).read_bytes(), name
    for line in map(json.loads, (reference / "utterances.jsonl").read_text().splitlines()):
        for key in ("text_ids_path", "codes_path"):
            assert np.array_equal(np.load(other / line[key]), np.load(reference / line[key]))
        for key in ("condition_path", "emo_vec_path"):
            np.testing.assert_allclose(np.load(other / line[key]), np.load(reference / line[key]), atol=1e-4, rtol=0)


@pytest.mark.slow
def test_sigkill_at_random_moments_then_rerun_gives_the_same_bytes(setup) -> None:
    start = time.monotonic()
    assert _run(setup, "whole") == 1  # the empty text is rejected
    whole_s = time.monotonic() - start
    rng = random.Random(7)
    kills = 0
    for _ in range(4):  # kill points spread over the run (start-up, batches, manifests), as the machine's speed goes
        process = subprocess.Popen([sys.executable, "-m", "indextts_train", *_command(setup, "killed")], env=_env(),
                                   cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        time.sleep(rng.uniform(0.3, 0.9) * whole_s)
        if process.poll() is None:
            process.send_signal(signal.SIGKILL)
            kills += 1
        process.wait()
    assert kills >= 1
    assert _run(setup, "killed") == 1
    assert not list((setup / "killed").rglob(".*.tmp-*"))  # no temp file left under a final name's folder
    _same_outputs(setup / "whole", setup / "killed")


@pytest.mark.slow
def test_two_torchrun_cpu_ranks_equal_one_process(setup) -> None:
    if not (setup / "whole" / "prepare.json").is_file():
        assert _run(setup, "whole") == 1
    ranks = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
                            "-m", "indextts_train", *_command(setup, "ranks")], env=_env(), cwd=ROOT,
                           capture_output=True, text=True, timeout=600)
    assert (setup / "ranks" / "prepare.json").is_file(), ranks.stderr[-3000:]
    _same_outputs(setup / "whole", setup / "ranks")


@pytest.mark.slow
def test_a_refusal_every_rank_meets_is_printed_once(setup, tmp_path) -> None:
    """Every rank reads the corpus and refused its bad line, each printing it: one line per GPU."""
    corpus = tmp_path / "bad.jsonl"
    corpus.write_text('{"audio": "a.wav"}\n')
    command = _command(setup, "refused")
    command[1] = str(corpus)
    ranks = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
                            "-m", "indextts_train", *command], env=_env(), cwd=ROOT,
                           capture_output=True, text=True, timeout=600)
    lines = [line for line in (ranks.stdout + ranks.stderr).splitlines() if line.startswith("error: ")]
    assert ranks.returncode != 0 and len(lines) == 1 and str(corpus) in lines[0], lines
