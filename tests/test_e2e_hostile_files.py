"""Issue 29: small files that describe a great deal of work, through the public commands.

A zip bomb (2 MB inflating to 2 GiB), a strided view claiming 10^12 elements, a pickle of 120
million shared references, a model dict with an int key, an .npy header claiming 10^10 elements,
a YAML bomb, JSON nested 100,000 deep, a FIFO, /proc/self/mem, a w2v-BERT config.json with
100,000 layers and a (sparse) tokenizer of 256 MB and one byte, which sentencepiece alone would
read whole: every command that reads them answers at once with one line naming the file, exit 2
(the `checkpoints` table and the page's table list them as unreadable), no traceback, and nothing
on disk changes.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

import hostile
import pytest
import torch

from indextts_train.cli import app, run_app
from indextts_train.files.bounded import MAX_TOKENIZER_BYTES
from indextts_train.files.numpy_pickle import load_weights_only
from indextts_train.webui import records
from indextts_train.webui.roots import Roots

ROOT = Path(__file__).resolve().parents[1]
TINY_CONFIG = ROOT / "configs" / "tiny.yaml"
TOKENIZER = ROOT / "tests" / "data" / "reference" / "prepare" / "text" / "bpe_tiny.model"
CHECKPOINTS = ("bomb", "view", "refs", "claimed", "keys")


def hostile_checkpoints(folder: Path, base: Path) -> dict[str, Path]:
    """One file of each kind, named as a run's step files (a stranger's files in a run folder)."""
    folder.mkdir(parents=True, exist_ok=True)
    return {
        "bomb": hostile.zip_bomb(folder / "model_step9.pth"),
        "view": hostile.strided_view(folder / "model_step8.pth"),
        "refs": hostile.shared_references(folder / "model_step7.pth", 1_200_000, compressed=True),
        "claimed": hostile.claimed_sizes(hostile.shared_references(folder / "model_step6.pth", 100), "data.pkl",
                                         240_000_000),
        "keys": hostile.foreign_key(folder / "model_step5.pth", {"model": load_weights_only(base), "step": 5}),
    }


def stand_in_model_dir(folder: Path, config: Path = TINY_CONFIG) -> Path:
    """A model folder whose files exist (prepare locates and hashes them before reading the corpus)
    but hold nothing a model could be built from: any later read would fail, none must happen."""
    w2v = folder / "hf_cache" / "w2v-bert-2.0"
    (folder / "hf_cache" / "semantic_codec").mkdir(parents=True)
    w2v.mkdir(parents=True)
    shutil.copy(config, folder / "config.yaml")
    shutil.copy(TOKENIZER, folder / "bpe.model")
    for name in ("gpt.pth", "wav2vec2bert_stats.pt", "hf_cache/semantic_codec/model.safetensors",
                 "hf_cache/w2v-bert-2.0/model.safetensors", "hf_cache/w2v-bert-2.0/preprocessor_config.json"):
        (folder / name).write_bytes(b"stand-in")
    (w2v / "config.json").write_text(json.dumps({"hidden_size": 64, "num_hidden_layers": 17}))
    return folder


@pytest.fixture(scope="module")
def inputs(tmp_path_factory, tiny_data) -> dict[str, Path]:
    folder = tmp_path_factory.mktemp("hostile") / "inputs"
    run = folder / "run"
    files = hostile_checkpoints(run, tiny_data["base"])
    files["run"] = run
    files["models"] = stand_in_model_dir(folder / "models")
    huge_layers = stand_in_model_dir(folder / "models_100000_layers")
    (huge_layers / "hf_cache" / "w2v-bert-2.0" / "config.json").write_text(json.dumps({"num_hidden_layers": 100_000}))
    files["models_huge"] = huge_layers
    files["bomb.yaml"] = hostile.yaml_bomb(folder / "bomb.yaml")
    bomb_models = stand_in_model_dir(folder / "models_bomb", config=files["bomb.yaml"])
    files["models_bomb"] = bomb_models
    run_yaml = folder / "old_run" / "run.yaml"
    run_yaml.parent.mkdir()
    shutil.copy(files["bomb.yaml"], run_yaml)
    files["run.yaml"] = run_yaml
    files["deep.jsonl"] = folder / "deep.jsonl"
    files["deep.jsonl"].write_text(hostile.deep_json() + "\n")
    files["corpus.jsonl"] = folder / "corpus.jsonl"  # a well-formed corpus: prepare reads it before the models
    files["corpus.jsonl"].write_text(json.dumps({"audio": "clip.wav", "text": "hello"}) + "\n")
    files["big.model"] = folder / "big" / "bpe.model"  # sparse: past the tokenizer bound, nothing written
    files["big.model"].parent.mkdir()
    with open(files["big.model"], "wb") as handle:
        handle.truncate(MAX_TOKENIZER_BYTES + 1)
    files["fifo"] = hostile.fifo(folder / "fifo.jsonl")
    files["fifo.pth"] = hostile.fifo(folder / "fifo.pth")
    line = json.loads(Path(tiny_data["train"]).read_text().splitlines()[0])
    line["target_codes_path"] = str(hostile.huge_npy(folder / "huge_codes.npy", elements=10**10))
    for key, value in line.items():
        if key.endswith("_path") and key != "target_codes_path":
            line[key] = str(Path(tiny_data["train"]).parent / value)
    files["huge_npy.jsonl"] = folder / "huge_npy.jsonl"
    files["huge_npy.jsonl"].write_text(json.dumps(line) + "\n")
    return files


def commands(f: dict[str, Path], data: dict, out: Path) -> dict[str, tuple[list, str]]:
    """name -> (argv, a needle of its one error line). Outputs would go under `out`."""
    train = ["train", "--train-manifest", data["train"], "--config", TINY_CONFIG, "--max-steps", "1",
             "--output-dir", out / "train"]
    prepare = ["--out", out / "prepared", "--device", "cpu"]
    cases = {f"verify {k}": (["verify", f[k]], f[k].name) for k in CHECKPOINTS}
    cases |= {f"export {k}": (["export", f[k], "--config", TINY_CONFIG, "-o", out / "gpt.pth"], f[k].name)
              for k in CHECKPOINTS}
    return cases | {
        "verify a FIFO": (["verify", f["fifo.pth"]], "is a FIFO"),
        "verify /proc/self/mem": (["verify", "/proc/self/mem"], "system pseudo-file"),
        "train: config a YAML bomb": ([*train[:3], "--config", f["bomb.yaml"], *train[5:]], "aliases expanded"),
        "train: --from-run a YAML bomb": (["train", "--from-run", f["run.yaml"], "--output-dir", out / "t2"],
                                          "aliases expanded"),
        "train: manifest a FIFO": (["train", "--train-manifest", f["fifo"], *train[3:]], "is a FIFO"),
        "export: config a YAML bomb": (["export", data["base"], "--config", f["bomb.yaml"], "-o", out / "gpt.pth"],
                                       "aliases expanded"),
        "hardware: config a YAML bomb": (["hardware", "--config", f["bomb.yaml"]], "aliases expanded"),
        "prepare: model folder config a YAML bomb": (["prepare", f["corpus.jsonl"], "--model-dir", f["models_bomb"],
                                                      *prepare], "aliases expanded"),
        "prepare: corpus a FIFO": (["prepare", f["fifo"], "--model-dir", f["models"], *prepare], "is a FIFO"),
        # a model file named by a flag is hashed before any work: it was opened as it came (a FIFO blocked)
        "prepare: --tokenizer a FIFO": (["prepare", f["corpus.jsonl"], "--model-dir", f["models"], *prepare,
                                         "--tokenizer", f["fifo"]], "tokenizer bpe.model is a FIFO"),
        "prepare: --semantic-codec /proc/self/mem": (["prepare", f["corpus.jsonl"], "--model-dir", f["models"],
                                                      *prepare, "--semantic-codec", "/proc/self/mem"],
                                                     "--semantic-codec /proc/self/mem: semantic codec"),
        "prepare: corpus nested 100,000 deep": (["prepare", f["deep.jsonl"], "--model-dir", f["models"], *prepare],
                                                 "deep.jsonl:1: JSON nested deeper than 64"),
        "prepare: w2v-BERT with 100,000 layers": (["prepare", f["corpus.jsonl"], "--model-dir", f["models_huge"],
                                                   *prepare], "num_hidden_layers is 100000"),
        "tokenize: manifest nested 100,000 deep": (["tokenize", f["deep.jsonl"], "--tokenizer", TOKENIZER, "--out",
                                                    out / "tok"], "deep.jsonl:1: JSON nested deeper than 64"),
        "tokenize: manifest a FIFO": (["tokenize", f["fifo"], "--tokenizer", TOKENIZER, "--out", out / "tok"],
                                      "is a FIFO"),
        "check-data: an .npy claiming 10^10 elements": (["check-data", f["huge_npy.jsonl"]],
                                                        "claims [10000000000] float32"),
        "check-data: manifest a FIFO": (["check-data", f["fifo"]], "is a FIFO"),
        "check-data: a tokenizer past its bound": (["check-data", data["train"], "--tokenizer", f["big.model"]],
                                                   "larger than"),
        "train: a tokenizer past its bound": ([*train, "--tokenizer", f["big.model"]], "tokenizer of"),
        "tokenize: a tokenizer past its bound": (["tokenize", data["train"], "--tokenizer", f["big.model"], "--out",
                                                  out / "tok"], "larger than"),
        "check-data: manifest nested 100,000 deep": (["check-data", f["deep.jsonl"]], "nested too deeply"),
        "extend-tokenizer: corpus a FIFO": (["extend-tokenizer", "--base", TOKENIZER, "--corpus", f["fifo"],
                                             "--target-size", "300", "-o", out / "new.model"], "is a FIFO"),
    }


CASES = list(commands({k: Path(k) for k in (*CHECKPOINTS, "fifo", "fifo.pth", "bomb.yaml", "run.yaml", "models",
                                           "models_bomb", "models_huge", "deep.jsonl", "huge_npy.jsonl",
                                           "corpus.jsonl", "big.model")},
                      {"train": "", "base": ""}, Path()))


class Unblocker:
    """If a reader were blocked opening a FIFO (the regression this file tests), a writer opens and
    closes it after `after` seconds: the reader then sees an empty file and the test fails on its
    timing, instead of hanging the suite (no pytest timeout is installed)."""

    def __init__(self, fifos: list[Path], after: float = 15.0) -> None:
        self.fifos, self.after, self.done = fifos, after, threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        if self.done.wait(self.after):
            return
        while not self.done.is_set():
            for fifo in self.fifos:
                try:
                    os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
                except OSError:  # ENXIO: nobody is reading it
                    pass
            time.sleep(0.1)

    def __enter__(self) -> Unblocker:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.done.set()
        self.thread.join()


def snapshot(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


@pytest.mark.parametrize("case", CASES)
def test_each_command_refuses_each_hostile_file_in_one_line(case, inputs, tiny_data, tmp_path, capsys) -> None:
    out = tmp_path / "out"
    argv, needle = commands(inputs, tiny_data, out)[case]
    before = snapshot(inputs["run"])
    started = time.perf_counter()
    with Unblocker([inputs["fifo"], inputs["fifo.pth"]]):
        code = run_app(app, [str(a) for a in argv])
    elapsed = time.perf_counter() - started
    captured = capsys.readouterr()
    assert code == 2, (case, captured.out[-400:], captured.err[-400:])
    assert "Traceback" not in captured.err + captured.out
    said = [line for line in (captured.out + captured.err).splitlines() if needle in line]
    assert said, (case, captured.out[-400:], captured.err[-400:])
    if not case.startswith(("verify", "tokenize", "check-data")):  # those print a verdict or report around it
        lines = [line for line in captured.err.splitlines() if line.strip()]
        assert len(lines) == 1 and lines[0].startswith("error: "), lines
    assert elapsed < 5.0, (case, elapsed)  # bounds checked before the work: interpreter already started
    assert not out.exists() or {p.name for p in out.rglob("*") if p.is_file()} <= {"train.lock"}
    assert snapshot(inputs["run"]) == before


def test_the_checkpoints_table_and_the_page_list_each_hostile_file_as_unreadable(inputs, capsys) -> None:
    run = inputs["run"]
    before = snapshot(run)
    started = time.perf_counter()
    assert run_app(app, ["checkpoints", str(run)]) == 0
    out = capsys.readouterr().out
    rows = records.checkpoint_rows(run, Roots([run]))
    assert time.perf_counter() - started < 5.0
    assert "Traceback" not in out and "not written by this program, or unreadable" in out
    for name in CHECKPOINTS:
        assert any(inputs[name].name in line and "INCOMPLETE" in line for line in out.splitlines()), (name, out)
    assert len(rows) == len(CHECKPOINTS) and all(row["status"] == "INCOMPLETE" and row["reasons"] for row in rows)
    assert snapshot(run) == before


@pytest.mark.slow
def test_resume_auto_skips_every_hostile_file_and_resumes_its_own(inputs, tiny_data, tmp_path) -> None:
    """Through the real CLI with a timeout: a hang would fail the test, not stall it."""
    run = tmp_path / "run"
    args = ["--train-manifest", str(tiny_data["train"]), "--config", str(TINY_CONFIG), "--output-dir", str(run),
            "--batch-size", "2", "--grad-accumulation", "1", "--effective-batch-size", "2", "--num-workers", "0"]
    assert run_app(app, ["train", *args, "--max-steps", "1"]) == 0
    hostile_checkpoints(run, tiny_data["base"])
    strangers = {p.name: p.read_bytes() for p in run.glob("model_step[5-9].pth")}
    env = {**os.environ, "PYTHONPATH": str(ROOT), "PYTHONUNBUFFERED": "1"}
    done = subprocess.run([sys.executable, "-m", "indextts_train", "train", *args, "--max-steps", "2",
                           "--resume", "auto"], capture_output=True, text=True, cwd=ROOT, env=env, timeout=300)
    assert done.returncode == 0, done.stdout[-800:] + done.stderr[-800:]
    assert "Traceback" not in done.stderr
    for name in strangers:
        assert f"warning: skipping {run / name}" in done.stdout, name
    assert "starting at step 1" in done.stdout
    assert {p.name: p.read_bytes() for p in run.glob("model_step[5-9].pth")} == strangers
    fifo = hostile.fifo(tmp_path / "corpus.jsonl")
    prepared = subprocess.run([sys.executable, "-m", "indextts_train", "prepare", str(fifo), "--model-dir",
                               str(inputs["models"]), "--out", str(tmp_path / "prepared"), "--device", "cpu"],
                              capture_output=True, text=True, cwd=ROOT, env=env, timeout=120)
    assert prepared.returncode == 2 and "is a FIFO" in prepared.stderr and "Traceback" not in prepared.stderr
    assert not (tmp_path / "prepared").exists()
    assert torch.load(run / "latest.pth", weights_only=True)["progress"]["step"] == 2
