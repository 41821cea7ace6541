"""`indextts-train listen` end to end through the CLI with the real IndexTTS-2.5 inference package, on a tiny
trained run and a tiny random ASR model: the records, the WAVs, the page, and a kill at a random moment.

Run by scripts/test_listen.sh (INDEXTTS_TEST_PYTHON_V25 names the inference environment's interpreter);
the main run does not collect this file (conftest.py). Offline.
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

from indextts_train.checkpoint.scores import read_records, scores_path
from indextts_train.config.family import INDEXTTS25
from indextts_train.listen.tiny_folder import write_tiny_inference_dir
from indextts_train.prepare.outputs import file_stem
from indextts_train.prepare.tiny import write_synthetic_clips
from indextts_train.prepare.tiny_asr import write_tiny_asr
from indextts_train.train.loop import TrainOptions, train

ROOT = Path(__file__).resolve().parents[1]
# What may differ between two hearings of one checkpoint: when, and how long it took.
TIMING = ("scored_at", "synthesis_seconds")


@pytest.fixture(scope="module")
def heard_run(tiny25_data, tmp_path_factory) -> dict:
    """A tiny IndexTTS-2.5 run (checkpoints at steps 2 and 4), a tiny inference folder of its family, two lines."""
    work = tmp_path_factory.mktemp("listen_run")
    python = Path(os.environ["INDEXTTS_TEST_PYTHON_V25"])
    model_dir = write_tiny_inference_dir(work / "model", INDEXTTS25, tokenizer=Path(tiny25_data["base_tokenizer"]),
                                         inference_python=python, seed=0, work=work)
    run = work / "run"
    assert train(TrainOptions(train_manifests=[tiny25_data["train"]], val_manifests=[tiny25_data["val"]],
                              output_dir=run, config=tiny25_data["config"], tokenizer=tiny25_data["tokenizer"],
                              base_checkpoint=tiny25_data["base"], batch_size=4, grad_accumulation=1,
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
            "--inference-python", str(python), "--device", "cpu", "--seed", "5"]
    return {"run": run, "args": args, "work": work}


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
    print(f"\nlisten: 2 checkpoints x 2 lines in {took:.0f} s\n{output}")
    want = _scores(whole)
    second = file_stem("second line")
    assert set(want) == {(2, "line001"), (4, "line001"), (2, second), (4, second)}
    for (step, line), record in want.items():
        assert (whole / "listen" / f"step{step}" / f"{line}.wav").is_file()
        assert record["speaker_model"]["file"] == "campplus_cn_common.bin" and record["seed"] == 5
        assert record["inference"]["indextts25-inference"] and record["asr"]["kind"] == "ctc"
    assert want[(2, "line001")]["length_ratio"] is not None
    page = (whole / "listen" / "index.html").read_text(encoding="utf-8")
    assert page.count("<audio") == 4 + 3 and "mean nothing" in page  # 4 WAVs, 2 prompts, 1 reference
    assert list((whole / "logs" / "listen").glob("events.out.tfevents.*"))
    again = _listen(whole, heard_run["args"])
    assert "nothing to do" in again.communicate(timeout=600)[0] and again.returncode == 0
    assert _scores(whole) == want

    killed = heard_run["work"] / "killed"
    shutil.copytree(heard_run["run"], killed)
    rng = random.Random(int(os.environ.get("LISTEN_KILL_SEED", time.time_ns())))
    for _ in range(2):  # killed twice at random moments, then left to finish
        proc = _listen(killed, heard_run["args"])
        time.sleep(rng.uniform(0.1, 0.8) * took)
        proc.send_signal(signal.SIGKILL)
        proc.communicate()
    proc = _listen(killed, heard_run["args"])
    output = proc.communicate(timeout=3600)[0]
    assert proc.returncode == 0, output
    assert _scores(killed) == want
    assert not list((killed / "listen").glob(".model-*"))  # the killed ones' temporary folders are gone
