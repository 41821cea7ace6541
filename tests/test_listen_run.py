"""`indextts-train listen` end to end through the CLI with the real inference packages of both families, on a
tiny trained run and a tiny random ASR model: the records, the WAVs, the page, and kills at random moments.

Run by scripts/test_listen.sh (INDEXTTS_TEST_PYTHON_V25 and INDEXTTS_TEST_PYTHON_V2 name the inference
environments' interpreters); the main run does not collect this file (conftest.py). Offline.

The IndexTTS2 run is trained at the width its inference takes: the official s2mel projects a 1280-wide GPT
latent (listen/tiny_folder.py), so the run's GPT is the stand-in folder's (1280 wide, one layer) and its
manifests carry 1280-wide conditions; its lines are capped short, since a barely trained GPT never stops.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from conftest import write_dataset

from indextts_train.checkpoint.scores import read_records, scores_path
from indextts_train.config.family import INDEXTTS2, INDEXTTS25
from indextts_train.config.settings import load_config
from indextts_train.data.demo_data import _make_base_tokenizer
from indextts_train.demo import make_base_checkpoint
from indextts_train.files.bounded import load_yaml
from indextts_train.listen.tiny_folder import tiny_gpt_config, write_tiny_inference_dir
from indextts_train.prepare.outputs import file_stem
from indextts_train.prepare.tiny import write_synthetic_clips
from indextts_train.prepare.tiny_asr import write_tiny_asr
from indextts_train.train.loop import resolve_settings, train

pytestmark = pytest.mark.slow  # every test here: trains a tiny run and starts `listen` in a process

ROOT = Path(__file__).resolve().parents[1]
# What may differ between two hearings of one checkpoint: when, and how long it took.
TIMING = ("scored_at", "synthesis_seconds")
PYTHONS = {INDEXTTS25: "INDEXTTS_TEST_PYTHON_V25", INDEXTTS2: "INDEXTTS_TEST_PYTHON_V2"}
PACKAGES = {INDEXTTS25: "indextts25-inference", INDEXTTS2: "indextts2-inference"}
# IndexTTS2's generation (1280 wide, 3 beams) costs seconds a code on the CPU: its lines stop at 16 codes,
# and its manifests' codes fit under that limit
V2_MAX_CODES = 16
# What each family's listen hears and how often it is killed: IndexTTS2's model load and lines cost minutes
# on the CPU, so it hears the latest checkpoint and is killed once (the kill rules are the family's alike)
HEARD = {INDEXTTS25: ("all", (2, 4), 2), INDEXTTS2: ("latest", (4,), 1)}


def _v2_inputs(work: Path) -> dict:
    """IndexTTS2 at the stand-in inference folder's widths: its GPT config (lines capped at V2_MAX_CODES), which
    the folder is made with too, a base gpt.pth of it, and 24 + 8 samples with 1280-wide conditions.

    The base never says the stop code (its bias far below the others, where 4 steps cannot lift it): a tiny
    model that learnt to stop at once gives the official s2mel no code at all, which it cannot take."""
    raw = load_yaml(tiny_gpt_config(INDEXTTS2, work), "config")
    raw["gpt"]["max_mel_tokens"] = V2_MAX_CODES
    config = work / "gpt_v2.yaml"
    config.write_text(json.dumps(raw), encoding="utf-8")  # JSON is YAML
    base = work / "base_gpt.pth"
    make_base_checkpoint(config, base, seed=3)
    gpt = load_config(config).gpt
    state = torch.load(base, weights_only=True)
    state["mel_head.bias"][gpt.stop_mel_token] = -100.0
    torch.save(state, base)
    sizes = {"text_vocab": gpt.number_text_tokens, "dim": gpt.model_dim, "max_text": 6, "max_codes": V2_MAX_CODES}
    return {"train": write_dataset(work / "data", 24, seed=1, name="train.jsonl", **sizes),
            "val": write_dataset(work / "data", 8, seed=2, name="val.jsonl", **sizes),
            "config": config, "base": base, "tokenizer": None,
            "base_tokenizer": _make_base_tokenizer(work / "bpe.model", gpt, seed=0)}


@pytest.fixture(scope="module", params=[pytest.param(INDEXTTS25, id="v25", marks=pytest.mark.xdist_group("v25")),
                                        pytest.param(INDEXTTS2, id="v2", marks=pytest.mark.xdist_group("v2"))])
def heard_run(request, tmp_path_factory) -> dict:
    """A tiny run of the family (checkpoints at steps 2 and 4), a tiny inference folder of it, two lines, and
    what listen hears of it (HEARD)."""
    family = request.param
    work = tmp_path_factory.mktemp(f"listen_run_{family}")
    python = Path(os.environ[PYTHONS[family]])
    data = request.getfixturevalue("tiny25_data") if family is INDEXTTS25 else _v2_inputs(work)
    model_dir = write_tiny_inference_dir(work / "model", family, tokenizer=Path(data["base_tokenizer"]),
                                         inference_python=python, seed=0, work=work, gpt_config=data["config"])
    run = work / "run"
    assert train(resolve_settings(train_manifests=[data["train"]], val_manifests=[data["val"]],
                              output_dir=run, config=data["config"], tokenizer=data["tokenizer"],
                              base_checkpoint=data["base"], batch_size=4, grad_accumulation=1,
                              effective_batch_size=4, num_workers=0, max_steps=4, epochs=100, val_interval=2,
                              save_interval=2, tensorboard=False)) == 0
    write_synthetic_clips(work / "clips", [("a prompt", "en"), ("another", "en")], speakers=2, seed=0,
                          seconds=(1.0, 1.2))
    lines = work / "lines.jsonl"
    lines.write_text(json.dumps({"text": "Hello there, world.", "prompt_audio": "clips/utt0000.wav", "language": "en",
                                 "reference_audio": "clips/utt0001.wav"}) + "\n" +
                     json.dumps({"id": "second line", "text": "A second line.", "prompt_audio": "clips/utt0001.wav",
                                 "language": "en"}) + "\n", encoding="utf-8")
    args = ["--lines", str(lines), "--asr-model", str(write_tiny_asr(work / "asr")), "--model-dir", str(model_dir),
            "--inference-python", str(python), "--device", "cpu", "--seed", "5", "--checkpoints", HEARD[family][0]]
    return {"run": run, "args": args, "work": work, "family": family, "steps": HEARD[family][1],
            "kills": HEARD[family][2]}


def _listen(run: Path, args: list[str]) -> subprocess.Popen:
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    return subprocess.Popen([sys.executable, "-m", "indextts_train", "listen", str(run), *args], cwd=ROOT, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def _scores(run: Path) -> dict[tuple[int, str], dict]:
    """(step, line) -> its scored record without the timing; each pair scored exactly once."""
    records = [r for r in read_records(scores_path(run)) if r.get("ok")]
    keys = [(r["step"], r["line_id"]) for r in records]
    assert len(keys) == len(set(keys)), f"a scored line was scored again: {keys}"
    return {key: {k: v for k, v in r.items() if k not in TIMING} for key, r in zip(keys, records, strict=True)}


def test_listen_records_every_checkpoint_and_a_killed_listen_loses_and_redoes_nothing(heard_run) -> None:
    whole = heard_run["work"] / "whole"
    shutil.copytree(heard_run["run"], whole)
    started = time.monotonic()
    proc = _listen(whole, heard_run["args"])
    output = proc.communicate(timeout=3600)[0]
    took = time.monotonic() - started
    assert proc.returncode == 0, output
    steps = heard_run["steps"]
    print(f"\nlisten {heard_run['family']}: {len(steps)} checkpoint(s) x 2 lines in {took:.0f} s\n{output}")
    want = _scores(whole)
    assert set(want) == {(step, line) for step in steps for line in ("line001", file_stem("second line"))}
    for (step, line), record in want.items():
        assert (whole / "listen" / f"step{step}" / f"{line}.wav").is_file()
        assert record["speaker_model"]["file"] == "campplus_cn_common.bin" and record["seed"] == 5
        assert record["inference"][PACKAGES[heard_run["family"]]] and record["asr"]["kind"] == "ctc"
    assert want[(steps[0], "line001")]["length_ratio"] is not None
    page = (whole / "listen" / "index.html").read_text(encoding="utf-8")
    assert page.count("<audio") == len(want) + 3 and "mean nothing" in page  # the WAVs, 2 prompts, 1 reference
    assert list((whole / "logs" / "listen").glob("events.out.tfevents.*"))
    again = _listen(whole, heard_run["args"])
    assert "nothing to do" in again.communicate(timeout=600)[0] and again.returncode == 0
    assert _scores(whole) == want

    killed = heard_run["work"] / "killed"
    shutil.copytree(heard_run["run"], killed)
    rng = random.Random(int(os.environ.get("LISTEN_KILL_SEED", time.time_ns())))
    for _ in range(heard_run["kills"]):  # killed at random moments, then left to finish
        proc = _listen(killed, heard_run["args"])
        time.sleep(rng.uniform(0.1, 0.8) * took)
        proc.send_signal(signal.SIGKILL)
        proc.communicate()
    proc = _listen(killed, heard_run["args"])
    output = proc.communicate(timeout=3600)[0]
    assert proc.returncode == 0, output
    assert _scores(killed) == want
    assert not list((killed / "listen").glob(".model-*"))  # the killed ones' temporary folders are gone
