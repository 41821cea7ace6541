"""Every non-export command through the CLI: good input, each kind of bad input, exit codes, files.

One case per command runs the real entry point (`python -m indextts_train ...` in a subprocess);
the rest use Typer's CliRunner on the same `app`, which is faster. Bad input must give one line on
stderr, the documented exit code and no traceback, and must leave every input file as it was.
"""

from __future__ import annotations

import contextlib
import io
import json
import math
import os
import pickle
import random
import re
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import sentencepiece as spm
import torch
import yaml
from conftest import write_dataset
from helpers import CheckpointReads
from typer.testing import CliRunner

from indextts_train.checkpoint.files import load_checkpoint
from indextts_train.cli import app, run_app
from indextts_train.cli_flags import plain_help
from indextts_train.config.scope_settings import ScopeSettings
from indextts_train.config.settings import load_config
from indextts_train.data.demo_data import AMHARIC, ENGLISH
from indextts_train.model.layout import trained_keys
from indextts_train.model.scope import scope_counts
from indextts_train.train.loop import resolve_settings, train

TRAINED_TEXT_KEYS = ("text_embedding.weight", "text_head.weight", "text_head.bias")
ROOT = Path(__file__).resolve().parents[1]
TINY = Path(__file__).resolve().parent / "data" / "reference" / "tiny"
TINY_CONFIG = ROOT / "configs" / "tiny.yaml"
EXPECTED = json.loads((TINY / "expected.json").read_text())


# ----------------------------------------------------------------------------- helpers


def real_cli(*args: object, env: dict | None = None) -> subprocess.CompletedProcess:
    """The installed entry point in a fresh interpreter, as a user's shell would run it."""
    return subprocess.run([sys.executable, "-m", "indextts_train", *map(str, args)], capture_output=True,
                          text=True, cwd=ROOT, env={**os.environ, **(env or {})}, timeout=300)


def start_cli(*args: object) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "indextts_train", *map(str, args)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, cwd=ROOT)


def cli(*args: object):
    """In-process run of the same Typer app; a Python exception (a bug) fails the test."""
    result = CliRunner().invoke(app, [str(a) for a in args])
    assert result.exception is None or isinstance(result.exception, SystemExit), result.exception
    return result


def entry(*args: object) -> SimpleNamespace:
    """In-process run of the real entry point (`run_app`): a value a flag's bounds refuse is one plain
    line there, as users see it (CliRunner alone would show Click's usage block)."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = run_app(app, [str(a) for a in args])
    return SimpleNamespace(exit_code=code, stdout=out.getvalue(), stderr=err.getvalue())


def error_line(stderr: str, *needles: str) -> str:
    """The one `error: ...` line a refused input must produce, containing every needle."""
    assert "Traceback" not in stderr
    lines = [line for line in stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), stderr
    for needle in needles:
        assert needle in lines[0], (needle, lines[0])
    return lines[0]


def snapshot(folder: Path) -> dict[str, tuple[bytes, int]]:
    """Bytes and mtime of every file under `folder`: what "nothing changed" compares."""
    return {str(p.relative_to(folder)): (p.read_bytes(), p.stat().st_mtime_ns)
            for p in sorted(folder.rglob("*")) if p.is_file()}


def absolute_paths(line: str, folder: Path) -> str:
    """A manifest line whose relative *_path values are made absolute, so it works from any folder."""
    obj = json.loads(line)
    return json.dumps({k: str(folder / v) if k.endswith("_path") else v for k, v in obj.items()})


def community_checkpoint(base: Path, config: Path, steps: int = 3) -> dict:
    """What the community train_gpt_v2.py saves after `steps` steps.

    Its AdamW holds every UnifiedVoice parameter in one group (state-dict order, buffers excluded),
    and only the GPT's tensors ever got a gradient: our optimizer's groups and order differ.
    """
    weights = torch.load(base, weights_only=True)
    trained = set(trained_keys(load_config(config).gpt))
    params = {k: torch.nn.Parameter(v.clone()) for k, v in weights.items() if not k.endswith(".pe")}
    optimizer = torch.optim.AdamW(params.values(), lr=1e-4)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: 1.0)
    generator = torch.Generator().manual_seed(0)
    for _ in range(steps):
        for key, param in params.items():
            param.grad = 0.01 * torch.randn(param.shape, generator=generator) if key in trained else None
        optimizer.step()
        scheduler.step()
    model = {k: params[k].detach() if k in params else v for k, v in weights.items()}
    return {"model": model, "optimizer": optimizer.state_dict(), "scheduler": scheduler.state_dict(),
            "scaler": None, "epoch": 1, "step": steps, "recent_checkpoints": [f"runs/model_step{steps}.pth"]}


def community_latest(base: Path, config: Path, steps: int = 3) -> dict:
    """The community trainer's latest.pth: its step checkpoint plus the resume extras it adds there.

    Its RNG states come from `np.random.get_state()` (a uint32 array pickled by numpy) and
    `torch.__version__` is a TorchVersion: torch.load(weights_only=True) alone refuses both.
    """
    return community_checkpoint(base, config, steps) | {
        "batch_idx": 6, "manifests": {"train": [{"path": "data/train_pairs.jsonl", "count": 24, "languages": ["am"]}],
                                      "val": []},
        "rng_state": {"torch_cpu": torch.Generator().manual_seed(1234).get_state(), "torch_cuda": None,
                      "numpy": np.random.RandomState(1234).get_state(), "python": random.Random(1234).getstate()},
        "batch_size": 2, "grad_accumulation": 2, "pytorch_version": torch.__version__, "cuda_version": None,
        "cuda_peak_memory": 0,
    }


# ----------------------------------------------------------------------------- fixtures


@pytest.fixture(scope="module")
def complete(tiny_data, tmp_path_factory) -> Path:
    """latest.pth of a real 2-step training run (COMPLETE)."""
    out = tmp_path_factory.mktemp("run") / "run"
    code = train(resolve_settings(train_manifests=[tiny_data["train"]], output_dir=out, config=tiny_data["config"],
                              base_checkpoint=tiny_data["base"], batch_size=2, grad_accumulation=2,
                              effective_batch_size=4, num_workers=0, max_steps=2, epochs=10, tensorboard=False))
    assert code == 0
    return out / "latest.pth"


@pytest.fixture(scope="module")
def community_bytes(tiny_data) -> bytes:
    buffer = io.BytesIO()
    torch.save(community_checkpoint(tiny_data["base"], tiny_data["config"]), buffer)
    return buffer.getvalue()


@pytest.fixture
def files(community_bytes, tmp_path) -> dict[str, Path]:
    """Checkpoints of every kind, each in its own file under tmp_path/in."""
    folder = tmp_path / "in"
    folder.mkdir()
    community = folder / "community.pth"
    community.write_bytes(community_bytes)
    garbage = folder / "garbage.pth"
    garbage.write_bytes(np.random.default_rng(0).bytes(5000))
    truncated = folder / "truncated.pth"
    truncated.write_bytes(community.read_bytes()[: community.stat().st_size // 2])
    return {"folder": folder, "community": community, "garbage": garbage,
            "truncated": truncated, "missing": folder / "missing.pth", "bare": TINY / "gpt.pth"}


# ----------------------------------------------------------------------------- verify


@pytest.mark.slow  # the real CLI in a process
def test_verify_complete_through_the_real_cli(complete) -> None:
    before = snapshot(complete.parent)
    proc = real_cli("verify", complete, "-v")
    assert proc.returncode == 0, proc.stderr
    assert "Traceback" not in proc.stderr and proc.stderr == ""
    lines = proc.stdout.splitlines()
    assert lines[0] == f"{complete}: COMPLETE (indextts-train)"
    text = proc.stdout
    for expected in ("step: 2", "epoch: 0", "samples_in_epoch: 8", "samples_total: 8", "precision: fp32",
                     "'base_tokens': 100", "'learning_rate':", "'file_bytes':"):
        assert expected in text, expected
    report = json.loads(cli("verify", complete, "--json").stdout)
    assert (report["status"], report["exit_code"], report["summary"]["step"]) == ("COMPLETE", 0, 2)
    assert report["summary"]["vocab_plan"] == {"base_tokens": 100, "tokens": 100, "freeze_base": True,
                                               "insert_at": None}
    assert report["summary"]["hparams"]["precision"] == "fp32"
    assert report["summary"]["sizes"]["tensors"] == 184
    assert snapshot(complete.parent) == before


@pytest.mark.parametrize("kind, reason", [("community", "lacks RNG states"), ("bare", "--base-checkpoint")])
def test_verify_partial(files, kind, reason) -> None:
    path = files[kind]
    before = path.read_bytes()
    result = cli("verify", path)
    assert result.exit_code == 1 and result.stderr == ""
    assert result.stdout.splitlines()[0].startswith(f"{path}: PARTIAL")
    assert reason in result.stdout
    report = json.loads(cli("verify", path, "--json", "-v").stdout)
    assert (report["status"], report["exit_code"]) == ("PARTIAL", 1)
    assert report["kind"] == {"community": "community", "bare": "gpt.pth"}[kind]
    assert path.read_bytes() == before


@pytest.mark.parametrize("kind, reason", [("garbage", "not a readable checkpoint"),
                                          ("truncated", "truncated"),
                                          ("missing", "no such checkpoint file")])
def test_verify_incomplete(files, kind, reason) -> None:
    before = snapshot(files["folder"])
    result = cli("verify", files[kind])
    assert result.exit_code == 2 and "Traceback" not in result.output
    first, *reasons = result.stdout.splitlines()
    assert first == f"{files[kind]}: INCOMPLETE ({'not a file' if kind == 'missing' else 'unknown'})"
    assert len(reasons) == 1 and reason in reasons[0] and str(files[kind]) in reasons[0]
    assert json.loads(cli("verify", files[kind], "--json").stdout)["status"] == "INCOMPLETE"
    assert snapshot(files["folder"]) == before


# ----------------------------------------------------------------------------- repair


@pytest.mark.slow  # the real CLI in a process, then trains
def test_repair_community_then_train_gpt_resumes_from_it(tiny_data, files, tmp_path) -> None:
    path = files["community"]
    original = path.read_bytes()
    proc = real_cli("repair", path, "--config", tiny_data["config"])
    assert proc.returncode == 0 and proc.stderr == "", proc.stderr
    assert proc.stdout.startswith(f"repaired checkpoint written to {path}")
    assert Path(f"{path}.bak").read_bytes() == original
    result = cli("verify", path)
    assert result.exit_code == 0 and "COMPLETE" in result.stdout.splitlines()[0]

    out = tmp_path / "resumed"  # train-gpt is the `train` command: same function, in-process here
    result = cli("train", "--train-manifest", tiny_data["train"], "--output-dir", out,
                 "--config", tiny_data["config"], "--resume", path, "--max-steps", 4, "--epochs", 10,
                 "--batch-size", 2, "--grad-accumulation", 2, "--effective-batch-size", 4, "--num-workers", 1)
    assert result.exit_code == 0, result.output[-2000:]
    state = load_checkpoint(out / "model_step4.pth")
    assert state["progress"]["step"] == 4
    # The community optimizer ran 3 steps: its moments were carried over by name, not restarted.
    names = state["optimizer_param_names"]
    moments = state["optimizer"]["state"][names.index("gpt.h.0.attn.c_attn.weight")]
    assert float(moments["step"]) == 4


@pytest.mark.slow  # the real CLI in a process
def test_verify_and_repair_read_the_community_latest_pth(tiny_data, tmp_path) -> None:
    path = tmp_path / "latest.pth"
    torch.save(community_latest(tiny_data["base"], tiny_data["config"]), path)
    with pytest.raises(pickle.UnpicklingError):  # control: the file users have needs the numpy allow-list
        torch.load(path, weights_only=True)
    original = path.read_bytes()
    proc = real_cli("verify", path)
    assert proc.returncode == 1 and proc.stderr == "", proc.stderr
    assert proc.stdout.startswith(f"{path}: PARTIAL (community)")
    result = cli("repair", path, "--config", tiny_data["config"])
    assert result.exit_code == 0 and f"repaired checkpoint written to {path}" in result.stdout, result.output
    assert Path(f"{path}.bak").read_bytes() == original
    assert cli("verify", path).exit_code == 0
    assert load_checkpoint(path)["progress"]["step"] == 3


@pytest.mark.slow  # seconds: several repairs and trainings
def test_repair_records_the_base_rows_it_was_told_or_assumed(tiny_data, files, tmp_path) -> None:
    out = tmp_path / "repaired.pth"
    result = cli("repair", files["community"], "-o", out, "--base-vocab", 80, "--config", tiny_data["config"])
    assert result.exit_code == 0, result.output
    assert "vocab plan (--base-vocab): the first 80 of 100 text tokens are base tokens, their rows" in result.stdout
    assert load_checkpoint(out)["vocab_plan"] == {"base_tokens": 80, "tokens": 100, "freeze_base": True,
                                                  "insert_at": None}
    run = tmp_path / "run"  # resumed from it, the first 80 rows do not move; the others train
    trained = cli("train", "--train-manifest", tiny_data["train"], "--output-dir", run, "--config",
                  tiny_data["config"], "--resume", out, "--max-steps", 5, "--batch-size", 2,
                  "--effective-batch-size", 4, "--num-workers", 0)
    assert trained.exit_code == 0, trained.output[-2000:]
    before, after = load_checkpoint(out)["model"], load_checkpoint(run / "latest.pth")["model"]
    for key in ("text_embedding.weight", "text_head.weight", "text_head.bias"):
        assert torch.equal(after[key][:80], before[key][:80]), key
        assert not torch.equal(after[key][80:100], before[key][80:100]), key

    # A community checkpoint over a larger vocabulary: the community trainer froze its first 12000 rows.
    weights = load_checkpoint(files["community"])["model"]
    grown = {k: torch.cat([v, v[-1:].repeat(12100 - 100, *[1] * (v.dim() - 1))]) if k.endswith(
        ("text_embedding.weight", "text_head.weight", "text_head.bias")) else v for k, v in weights.items()}
    big = tmp_path / "big.pth"
    torch.save({"model": grown, "step": 3, "epoch": 1}, big)
    result = cli("repair", big, "-o", tmp_path / "big_repaired.pth")
    assert result.exit_code == 0, result.output
    assert "vocab plan (assumed): the first 12000 of 12100 text tokens are base tokens" in result.stdout
    assert "pass --base-vocab N" in result.stdout
    plan = load_checkpoint(tmp_path / "big_repaired.pth")["vocab_plan"]
    assert plan == {"base_tokens": 12000, "tokens": 12100, "freeze_base": True, "insert_at": None}
    refused = cli("repair", files["community"], "-o", tmp_path / "x.pth", "--base-vocab", 101)
    assert refused.exit_code == 2 and not (tmp_path / "x.pth").exists()
    error_line(refused.stderr, "--base-vocab 101", "100 text tokens")


def test_resume_from_a_community_file_says_repair_once(files, tiny_data, tmp_path) -> None:
    result = cli("train", "--train-manifest", tiny_data["train"], "--output-dir", tmp_path / "run", "--config",
                 tiny_data["config"], "--resume", files["community"], "--max-steps", 1)
    assert result.exit_code == 2
    line = error_line(result.stderr, "PARTIAL", "`indextts-train repair` converts it")
    assert line.count("indextts-train repair") == 1


def test_repair_with_output_leaves_the_original_alone(tiny_data, files, tmp_path) -> None:
    out = tmp_path / "repaired.pth"
    before = snapshot(files["folder"])
    result = cli("repair", files["community"], "-o", out)
    assert result.exit_code == 0 and f"repaired checkpoint written to {out}" in result.stdout
    assert snapshot(files["folder"]) == before  # no .bak, nothing touched
    assert cli("verify", out).exit_code == 0
    again = cli("repair", out)  # already COMPLETE: says so, writes nothing
    assert again.exit_code == 0 and "nothing to repair" in again.stdout
    assert sorted(p.name for p in tmp_path.iterdir() if p.is_file()) == ["repaired.pth"]


@pytest.mark.parametrize("kind, reason", [("garbage", "not a readable checkpoint"), ("truncated", "truncated"),
                                          ("missing", "no such checkpoint file"), ("bare", "--base-checkpoint")])
def test_repair_refuses_what_it_cannot_convert(files, kind, reason) -> None:
    before = snapshot(files["folder"])
    bare_before = files["bare"].read_bytes() if kind == "bare" else None
    result = cli("repair", files[kind])
    assert result.exit_code == 2 and result.stdout == ""
    said = error_line(result.stderr, "cannot repair", reason)
    assert said.count(str(files[kind])) == 1, said  # the path once, though a missing file's reason names it too
    assert snapshot(files["folder"]) == before
    if kind == "bare":
        assert files["bare"].read_bytes() == bare_before and not Path(f"{files['bare']}.bak").exists()


def test_repair_refuses_an_existing_output(files) -> None:
    other = files["garbage"]
    before = snapshot(files["folder"])
    result = cli("repair", files["community"], "-o", other)
    assert result.exit_code == 2
    error_line(result.stderr, str(other), "already exists")
    assert snapshot(files["folder"]) == before


# ----------------------------------------------------------------------------- check-data


def bad_manifest(tmp_path: Path) -> tuple[Path, list[int]]:
    """A manifest with good lines and one line of each kind of problem; returns it and the bad line numbers."""
    folder = tmp_path / "data"
    good = [json.loads(line) for line in write_dataset(folder, 4, seed=5, name="good.jsonl").read_text().splitlines()]
    np.save(folder / "big_ids.npy", np.array([5, 7, 120], dtype=np.int32))  # 120 >= 100 text tokens
    np.save(folder / "big_codes.npy", np.array([3, 70, 4], dtype=np.int32))  # 70 >= 66 mel codes
    lines = [
        json.dumps(good[0]),
        '{"id": "broken", "speaker": ',  # 2: not JSON
        json.dumps(good[1]),
        json.dumps({**good[2], "target_codes_path": "no_such.npy"}),  # 4: missing file
        json.dumps({**good[2], "target_text_ids_path": "big_ids.npy", "target_text_len": 3}),  # 5: id >= vocab
        json.dumps({**good[2], "target_codes_path": "big_codes.npy", "target_code_len": 3}),  # 6: code >= codes
        json.dumps({**good[2], "target_text_len": 41}),  # 7: longer than max_text_tokens 40
        json.dumps({**good[3], "prompt_speaker": "spk9"}),  # 8: prompt speaker differs from target
        json.dumps(good[3]),
    ]
    manifest = folder / "mixed.jsonl"
    manifest.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return manifest, [2, 4, 5, 6, 7, 8]


@pytest.mark.slow  # the real CLI in a process
def test_check_data_good_manifest_through_the_real_cli(tiny_data) -> None:
    before = snapshot(tiny_data["folder"])
    proc = real_cli("check-data", tiny_data["train"], "--config", tiny_data["config"])
    assert proc.returncode == 0 and proc.stderr == "", proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0] == "24 lines in 1 manifest(s): 24 ok, OK"
    assert lines[1].startswith("text_len: min ") and lines[2].startswith("code_len: min ")
    assert "speakers: 1 (top: spk0 24)" in lines
    assert snapshot(tiny_data["folder"]) == before


def test_check_data_names_every_bad_line_and_writes_a_clean_manifest(tmp_path) -> None:
    manifest, bad = bad_manifest(tmp_path)
    before = snapshot(manifest.parent)
    result = cli("check-data", manifest, "--config", TINY_CONFIG)
    assert result.exit_code == 2 and "Traceback" not in result.output
    assert result.stdout.splitlines()[0] == "9 lines in 1 manifest(s): 3 ok, 6 BAD"
    errors = [line.strip() for line in result.stdout.splitlines() if line.startswith(f"  {manifest}:")]
    assert [int(line.split(":")[1]) for line in errors] == bad
    for line_no, needle in zip(bad, ("not valid JSON", "not found", "id 120", "id 70", "max_text_tokens",
                                     "speakers differ"), strict=True):
        assert needle in next(e for e in errors if e.startswith(f"{manifest}:{line_no}:")), needle

    report = json.loads(cli("check-data", manifest, "--config", TINY_CONFIG, "--json").stdout)
    assert report["bad_lines"] == [[str(manifest), n] for n in bad] and report["lines_ok"] == 3

    clean = tmp_path / "elsewhere" / "clean.jsonl"  # a new folder: relative paths must be rewritten
    result = cli("check-data", manifest, "--config", TINY_CONFIG, "--write-clean", clean)
    assert result.exit_code == 2 and f"clean manifest: {clean}" in result.stdout
    kept = [json.loads(line)["id"] for line in clean.read_text().splitlines()]
    assert kept == ["good0", "good1", "good3"]
    again = cli("check-data", clean, "--config", TINY_CONFIG)
    assert again.exit_code == 0 and again.stdout.startswith("3 lines in 1 manifest(s): 3 ok, OK")
    assert snapshot(manifest.parent) == before


def test_check_data_says_which_vocabulary_an_id_is_outside(spm_base, tmp_path) -> None:
    manifest, _ = bad_manifest(tmp_path)

    def error_of_line_5(*args: object) -> str:
        result = cli("check-data", manifest, *args)
        assert result.exit_code == 2
        return next(line.strip() for line in result.stdout.splitlines() if f"{manifest}:5:" in line)

    without = error_of_line_5("--config", TINY_CONFIG)
    assert "id 120, outside [0, 100) (gpt.number_text_tokens of --config)" in without
    assert "as --tokenizer" in without
    size = spm.SentencePieceProcessor(model_file=str(spm_base["base"])).get_piece_size()
    with_tokenizer = error_of_line_5("--config", TINY_CONFIG, "--tokenizer", spm_base["base"])
    assert f"id 120, outside [0, {size}) (size of --tokenizer)" in with_tokenizer
    assert "made with another tokenizer; pass that one as --tokenizer" in with_tokenizer


@pytest.mark.parametrize("case", ["missing manifest", "bad config", "missing tokenizer", "clean over input",
                                  "zero base vocab"])
def test_check_data_refusals(tiny_data, tmp_path, case) -> None:
    manifest = tiny_data["train"]
    bad_config = tmp_path / "bad.yaml"
    bad_config.write_text("gpt:\n  model_dim: 64\n  bogus_key: 1\n")
    args, needles = {
        "missing manifest": ([tmp_path / "nope.jsonl"], ["nope.jsonl", "manifest not found"]),
        "bad config": ([manifest, "--config", bad_config], ["bad.yaml", "bogus_key"]),
        "missing tokenizer": ([manifest, "--tokenizer", tmp_path / "nope.model"], ["nope.model"]),
        "clean over input": ([manifest, "--write-clean", manifest], ["input manifest"]),
        "zero base vocab": ([manifest, "--base-vocab", 0], ["--base-vocab", "is below 1"]),
    }[case]
    before = snapshot(tiny_data["folder"])
    result = entry("check-data", *args)
    assert result.exit_code == 2 and result.stdout == ""
    error_line(result.stderr, *needles)
    assert snapshot(tiny_data["folder"]) == before


# ----------------------------------------------------------------------------- tokenizers


@pytest.fixture(scope="module")
def spm_base(tmp_path_factory) -> dict[str, Path]:
    """A real SentencePiece BPE model trained by spm on English, and an Amharic corpus.

    Like IndexTTS2's bpe.model, the base learns from English as inference presents it: upper case.
    """
    folder = tmp_path_factory.mktemp("spm")
    text = folder / "english.txt"
    text.write_text("\n".join(line.upper() for line in ENGLISH) + "\n", encoding="utf-8")
    spm.SentencePieceTrainer.train(input=str(text), model_prefix=str(folder / "base"), model_type="bpe",
                                   vocab_size=100, hard_vocab_limit=False, character_coverage=1.0,
                                   bos_id=0, eos_id=1, unk_id=2, num_threads=1, minloglevel=2)
    corpus = folder / "amharic.txt"
    corpus.write_text("\n".join(AMHARIC) + "\n", encoding="utf-8")
    return {"base": folder / "base.model", "corpus": corpus, "folder": folder}


@pytest.mark.slow  # the real CLI in a process
def test_extend_then_check_tokenizer_through_the_real_cli(spm_base, tmp_path) -> None:
    base_sp = spm.SentencePieceProcessor(model_file=str(spm_base["base"]))
    base_size = base_sp.get_piece_size()
    target = base_size + 30
    out = tmp_path / "extended.model"
    before = snapshot(spm_base["folder"])
    proc = real_cli("extend-tokenizer", "--base", spm_base["base"], "--corpus", spm_base["corpus"],
                    "--target-size", target, "-o", out)
    assert proc.returncode == 0 and proc.stderr == "", proc.stderr
    wrote, normaliser = proc.stdout.strip().splitlines()
    assert wrote == f"wrote {out} ({base_size} base + 30 new = {target} pieces)"
    assert normaliser.startswith("text presented as official inference does; normaliser: ")
    assert snapshot(spm_base["folder"]) == before
    extended = spm.SentencePieceProcessor(model_file=str(out))
    assert extended.get_piece_size() == target
    for i in range(base_size):  # every base piece keeps its id
        piece = base_sp.id_to_piece(i)
        assert extended.id_to_piece(i) == piece and extended.piece_to_id(piece) == i
    assert extended.encode(AMHARIC[0]) != base_sp.encode(AMHARIC[0])  # the new pieces are used

    proc = real_cli("check-tokenizer", out, "--base", spm_base["base"], "--sample-text", spm_base["corpus"])
    assert proc.returncode == 0 and proc.stderr == "", proc.stderr
    assert f"base {spm_base['base']}: {base_size} pieces, ids kept, 30 extended" in proc.stdout
    assert proc.stdout.splitlines()[-1].strip() == "OK"
    report = json.loads(cli("check-tokenizer", out, "--base", spm_base["base"], "--json").stdout)
    assert (report["vocab_size"], report["base_size"], report["base_ids_kept"]) == (target, base_size, True)
    assert report["problems"] == []


def test_check_tokenizer_reports_moved_base_pieces(spm_base, tmp_path) -> None:
    # Checked against a base it was not extended from: the ids moved, so exit 2 with the problem.
    other = tmp_path / "other"
    other.mkdir()
    text = other / "t.txt"
    text.write_text("\n".join(reversed(ENGLISH + AMHARIC)) + "\n", encoding="utf-8")
    spm.SentencePieceTrainer.train(input=str(text), model_prefix=str(other / "o"), model_type="bpe",
                                   vocab_size=150, hard_vocab_limit=False, character_coverage=1.0,
                                   num_threads=1, minloglevel=2)
    result = cli("check-tokenizer", other / "o.model", "--base", spm_base["base"])
    assert result.exit_code == 2 and "NOT kept" in result.stdout and "PROBLEM" in result.stdout


@pytest.mark.parametrize("case", ["smaller target", "missing base", "missing corpus", "overwrite base"])
def test_extend_tokenizer_refusals_write_nothing(spm_base, tmp_path, case) -> None:
    base, corpus = spm_base["base"], spm_base["corpus"]
    size = spm.SentencePieceProcessor(model_file=str(base)).get_piece_size()
    out = tmp_path / "new.model"
    args, needles = {
        "smaller target": ([base, corpus, size - 1, out], [f"--target-size {size - 1}", "smaller"]),
        "missing base": ([tmp_path / "nope.model", corpus, size + 5, out], ["nope.model", "not found"]),
        "missing corpus": ([base, tmp_path / "nope.txt", size + 5, out], ["nope.txt", "not found"]),
        "overwrite base": ([base, corpus, size + 5, base], ["overwrite the base"]),
    }[case]
    before, before_tmp = snapshot(spm_base["folder"]), snapshot(tmp_path)
    result = cli("extend-tokenizer", "--base", args[0], "--corpus", args[1], "--target-size", args[2],
                 "-o", args[3])
    assert result.exit_code == 2 and result.stdout == ""
    error_line(result.stderr, *needles)
    assert snapshot(spm_base["folder"]) == before and snapshot(tmp_path) == before_tmp


def test_check_tokenizer_warns_when_the_sample_is_mostly_unknown(spm_base, tmp_path) -> None:
    # The English base meets Amharic text: nearly every character is <unk>, so it is not "OK".
    result = cli("check-tokenizer", spm_base["base"], "--sample-text", spm_base["corpus"])
    assert result.exit_code == 1, result.output
    warning = next(line for line in result.stdout.splitlines() if "warning:" in line)
    share = int(warning.split("warning: ")[1].split("%")[0])
    assert share > 90 and "does not cover the sample's language" in warning
    assert result.stdout.splitlines()[-1].strip() == "WARNING: the sample is not covered"
    english = tmp_path / "english.txt"
    english.write_text("\n".join(ENGLISH) + "\n", encoding="utf-8")
    covered = cli("check-tokenizer", spm_base["base"], "--sample-text", english)
    assert covered.exit_code == 0 and covered.stdout.splitlines()[-1].strip() == "OK", covered.output


def test_check_tokenizer_refuses_a_file_that_is_not_a_model(tmp_path) -> None:
    for path, needle in ((tmp_path / "nope.model", "not found"), (TINY / "config.yaml", "not a SentencePiece")):
        result = cli("check-tokenizer", path)
        assert result.exit_code == 2 and result.stdout == ""
        error_line(result.stderr, str(path), needle)


# ----------------------------------------------------------------------------- evaluate


@pytest.mark.slow  # the real CLI in a process
def test_evaluate_reference_batch_through_the_real_cli() -> None:
    proc = real_cli("evaluate", "--config", TINY / "config.yaml", "--checkpoint", TINY / "gpt.pth",
                    "--manifest", TINY / "pairs.jsonl", "--batch-size", 3, "--json")
    assert proc.returncode == 0 and proc.stderr == "", proc.stderr
    result, expected = json.loads(proc.stdout), EXPECTED["eval"]
    for key in ("text_loss", "mel_loss", "mel_top1"):
        assert math.isclose(result[key], expected[key], abs_tol=1e-5), key
    assert (result["samples"], result["text_tokens"]) == (3, 100)


@pytest.mark.slow  # the real CLI in a process
def test_bundled_configs_are_found_from_any_folder(tmp_path) -> None:
    """`--config configs/NAME.yaml` as the docs write it works outside the checkout; a name it does not
    ship is refused with the folder where the bundled configs really are."""
    def outside(*args: object) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "indextts_train", *map(str, args)], capture_output=True,
                              text=True, cwd=tmp_path, timeout=300)

    proc = outside("evaluate", "--config", "configs/tiny.yaml", "--checkpoint", TINY / "gpt.pth",
                   "--manifest", TINY / "pairs.jsonl", "--batch-size", 3, "--json")
    assert proc.returncode == 0 and json.loads(proc.stdout)["samples"] == 3, proc.stderr
    proc = outside("evaluate", "--config", "configs/indextts3.yaml", "--checkpoint", TINY / "gpt.pth",
                   "--manifest", TINY / "pairs.jsonl")
    assert proc.returncode == 2
    error_line(proc.stderr, "configs/indextts3.yaml: config not found",
               f"bundled configs in {ROOT / 'configs'} (indextts2.yaml, indextts2_5.yaml, tiny.yaml")


def test_evaluate_extended_vocabulary_params(tmp_path) -> None:
    weights = torch.load(TINY / "gpt.pth", weights_only=True)
    weights.update(torch.load(TINY / "ext150_text_params.pth", weights_only=True))
    extended = tmp_path / "gpt150.pth"
    torch.save(weights, extended)
    result = cli("evaluate", "--config", TINY / "config.yaml", "--checkpoint", extended,
                 "--manifest", TINY / "pairs.jsonl", "--batch-size", 3, "--json")
    assert result.exit_code == 0, result.output
    got, expected = json.loads(result.stdout), EXPECTED["extended_vocab"]["eval"]
    assert got["text_tokens"] == 150
    for key in ("text_loss", "mel_loss", "mel_top1"):
        assert math.isclose(got[key], expected[key], abs_tol=1e-5), key
    human = cli("evaluate", "--config", TINY / "config.yaml", "--checkpoint", extended,
                "--manifest", TINY / "pairs.jsonl", "--batch-size", 3)
    assert human.stdout.startswith(f"{extended}: text_loss ")
    assert math.isclose(float(human.stdout.split()[2]), expected["text_loss"], abs_tol=1e-5)


@pytest.mark.parametrize("case", ["missing checkpoint", "garbage checkpoint", "missing manifest", "wrong config",
                                  "zero batch"])
def test_evaluate_refusals(files, tiny_data, tmp_path, case) -> None:
    small = tmp_path / "dim32.yaml"
    small.write_text(TINY_CONFIG.read_text().replace("model_dim: 64", "model_dim: 32"))
    args, needles = {
        "missing checkpoint": ([files["missing"], tiny_data["val"], TINY_CONFIG], ["missing.pth", "no such"]),
        "garbage checkpoint": ([files["garbage"], tiny_data["val"], TINY_CONFIG], ["garbage.pth", "not a readable"]),
        "missing manifest": ([tiny_data["base"], tmp_path / "nope.jsonl", TINY_CONFIG], ["nope.jsonl"]),
        "wrong config": ([tiny_data["base"], tiny_data["val"], small], ["base_gpt.pth", "model_dim 32"]),
        "zero batch": ([tiny_data["base"], tiny_data["val"], TINY_CONFIG, "--batch-size", 0], ["--batch-size"]),
    }[case]
    before = snapshot(files["folder"])
    result = entry("evaluate", "--checkpoint", args[0], "--manifest", args[1], "--config", args[2], *args[3:])
    assert result.exit_code == 2 and result.stdout == ""
    error_line(result.stderr, *needles)
    assert snapshot(files["folder"]) == before


@pytest.mark.slow  # reads `complete`, a trained run
def test_evaluate_uses_the_config_stored_in_the_checkpoint(complete, tiny_data, tmp_path) -> None:
    stored = cli("evaluate", "--checkpoint", complete, "--manifest", tiny_data["val"], "--json")
    assert stored.exit_code == 0, stored.output
    given = cli("evaluate", "--checkpoint", complete, "--manifest", tiny_data["val"], "--config", TINY_CONFIG,
                "--json")
    assert json.loads(stored.stdout)["loss"] == json.loads(given.stdout)["loss"]
    small = tmp_path / "small.yaml"  # a vocabulary smaller than the manifest's ids: one short line, no IndexError
    small.write_text(TINY_CONFIG.read_text().replace("number_text_tokens: 100", "number_text_tokens: 20"))
    bare = tmp_path / "gpt20.pth"
    weights = torch.load(tiny_data["base"], weights_only=True)
    torch.save({k: v[:21] if k in TRAINED_TEXT_KEYS else v for k, v in weights.items()}, bare)
    result = cli("evaluate", "--checkpoint", bare, "--manifest", tiny_data["val"], "--config", small)
    assert result.exit_code == 2
    line = error_line(result.stderr, "val.jsonl:", "outside [0, 20)", "tokenizer")
    assert len(line.replace(str(tiny_data["val"]), "VAL").replace(str(bare), "CKPT")) < 200  # short but for
    # the paths it names (their length is the temp folder's)


@pytest.mark.slow  # reads `complete`, a trained run
def test_evaluate_reads_the_checkpoint_once(complete, tiny_data, monkeypatch) -> None:
    """One CRC pass and one load serve the checks, the stored config and the weights (checkpoints are GBs)."""
    reads = CheckpointReads(complete).install(monkeypatch)
    result = cli("evaluate", "--checkpoint", complete, "--manifest", tiny_data["val"], "--json")
    assert result.exit_code == 0, result.output
    assert (reads.loads, reads.crc_passes) == (1, 1)


@pytest.mark.slow  # the real CLI in a process
@pytest.mark.parametrize("case", ["vocabulary smaller than the data", "code beyond the codec", "negative id"])
def test_evaluate_names_an_id_outside_the_checkpoint_without_a_traceback(tiny_data, tmp_path, case) -> None:
    folder = tmp_path / "data"
    if case == "vocabulary smaller than the data":  # made with a 300-token tokenizer, base has 100
        manifest = write_dataset(folder, 3, seed=4, text_vocab=300, name="wide.jsonl")
        line, needles = 1, ["target_text_ids_path holds id", "outside [0, 100)", "base_gpt.pth", "tokenizer"]
    else:
        manifest = write_dataset(folder, 3, seed=4, name="val.jsonl")
        lines = manifest.read_text().splitlines()
        bad, array_path = {"code beyond the codec": ([3, 66, 4], "target_codes_path"),
                           "negative id": ([5, -1, 7], "target_text_ids_path")}[case]
        np.save(folder / "bad.npy", np.array(bad, dtype=np.int32))
        line = 2
        lines[line - 1] = json.dumps({**json.loads(lines[line - 1]), array_path: "bad.npy"} |
                                     ({"target_code_len": 3} if case == "code beyond the codec" else
                                      {"target_text_len": 3}))
        manifest.write_text("\n".join(lines) + "\n")
        needles = (["target_codes_path holds id 66", "gpt.number_mel_codes"] if case == "code beyond the codec"
                   else ["target_text_ids_path holds id -1"])
    args = ("evaluate", "--config", TINY_CONFIG, "--checkpoint", tiny_data["base"], "--manifest", manifest)
    # One case in a real process (what a user sees); cli() fails on any exception such as IndexError.
    if case == "vocabulary smaller than the data":
        result = real_cli(*args)
        code = result.returncode
    else:
        result = cli(*args)
        code = result.exit_code
    assert code == 2 and result.stdout == "", result.stdout
    error_line(result.stderr, f"{manifest}:{line}:", *needles)


# ----------------------------------------------------------------------------- hardware


@pytest.mark.slow  # the real CLI in a process
def test_hardware_on_this_machine_through_the_real_cli() -> None:
    proc = real_cli("hardware", "--config", TINY_CONFIG, "--json", env={"CUDA_VISIBLE_DEVICES": ""})
    assert proc.returncode == 0 and proc.stderr == "", proc.stderr
    plan = json.loads(proc.stdout)
    assert (plan["device"], plan["precision"], plan["use_grad_scaler"]) == ("cpu", "fp32", False)
    assert plan["effective_batch"] == 8
    assert plan["reasons"][0].endswith(" CPU core(s).")  # counted on this machine, not assumed


@pytest.mark.parametrize("gpu, precision, scaler", [("A100-80GB", "bf16", False), ("V100-16GB", "fp16", True)])
def test_hardware_for_an_assumed_gpu(gpu, precision, scaler) -> None:
    for config in (TINY_CONFIG, ROOT / "configs" / "indextts2.yaml"):
        plan = json.loads(cli("hardware", "--config", config, "--assume", gpu, "--json").stdout)
        assert (plan["device"], plan["precision"], plan["use_grad_scaler"]) == ("cuda", precision, scaler)
        wanted = load_config(config).train.effective_batch_size
        assert plan["effective_batch"] == wanted
        assert plan["micro_batch"] * plan["grad_accumulation"] * plan["world_size"] == wanted
    human = cli("hardware", "--config", TINY_CONFIG, "--assume", gpu)
    assert human.exit_code == 0 and f"{precision}, micro-batch" in human.stdout.splitlines()[0]
    # The core count is not read from any machine here, so the plan must say it is assumed.
    assert "8 CPU core(s) (assumed: a typical rented single-GPU box" in human.stdout.splitlines()[1]


@pytest.mark.parametrize("config", ["indextts2.yaml", "indextts2_5.yaml"])
def test_hardware_train_scope_lora_plans_a_bigger_micro_batch_on_l4(config) -> None:
    real = ROOT / "configs" / config
    plans = {scope: json.loads(cli("hardware", "--config", real, "--assume", "L4", "--train-scope", scope,
                                   "--json").stdout) for scope in ("full", "lora")}
    assert plans["lora"]["micro_batch"] > plans["full"]["micro_batch"]
    assert plans["lora"]["estimated_bytes"] <= plans["lora"]["budget_bytes"]
    human = cli("hardware", "--config", real, "--assume", "L4", "--train-scope", "lora").stdout
    trainable = scope_counts(load_config(real).gpt, ScopeSettings("lora"))["trainable"]
    assert "train scope lora (rank 16" in human and f"{trainable:,} trainable" in human


@pytest.mark.parametrize("typed", ["RTX4090", "4090", "rtx 4090", "NVIDIA GeForce RTX 4090", "RTX_4090"])
def test_hardware_finds_a_gpu_however_its_name_is_typed(typed) -> None:
    result = cli("hardware", "--config", TINY_CONFIG, "--assume", typed)
    assert result.exit_code == 0 and result.stdout.startswith("NVIDIA GeForce RTX 4090 (cuda): bf16"), result.output


@pytest.mark.parametrize("typed, closest", [("A100", "closest: A100-80GB, A100-40GB; known:"),
                                            ("RTX5090", "closest: RTX-4090, RTX-3090")])
def test_an_unknown_or_ambiguous_gpu_names_the_closest(typed, closest) -> None:
    result = cli("hardware", "--config", TINY_CONFIG, "--assume", typed)
    assert result.exit_code == 2
    error_line(result.stderr, f"--assume: unknown GPU {typed!r}; {closest}")


@pytest.mark.slow  # the real CLI in a process
def test_a_refused_value_is_said_in_plain_words(capsys) -> None:
    """What the parser refuses reads as the user typed it, not in the validation library's words
    ("Value error, ...", "Input should be ..."); through the entry point both commands use."""
    from indextts_train.cli import run_app

    train = ["train", "--train-manifest", "t.jsonl", "--output-dir", "run"]
    cases = [([*train, "--train-scope", "lroa"], "error: --train-scope: 'lroa' is not one of full, partial, lora"),
             ([*train, "--seed=abc"], "error: --seed: 'abc' is not a whole number"),
             ([*train, "--learning-rate", "fast"], "error: --learning-rate: 'fast' is not a number"),
             (["webui", "--port", "70000"], "error: --port: '70000' is above 65535, the most allowed"),
             # a required flag or argument left out is named (click keeps that message out of exc.message)
             # with what it is, from its help: a newcomer may not know what --model-dir wants
             (["evaluate", "--manifest", "v.jsonl"], "error: --checkpoint is missing: our checkpoint, a community "
                                                     "checkpoint or a gpt.pth; this command needs it"),
             (["prepare", "clips", "--out", "f"], "error: --model-dir is missing: the official model folder "
                                                  "(config.yaml, gpt.pth, ...); this command needs it"),
             (["check-data"], "error: MANIFEST is missing: manifest JSONL file(s); this command needs it"),
             (["listen"], "error: RUN_DIR is missing: a run's --output-dir; this command needs it")]
    for args, said in cases:
        assert run_app(app, args) == 2
        err = capsys.readouterr().err
        assert err.strip() == f"{said} (see --help)", err
    # the command alone: its help as --help shows it, a line each (it was one error line of literal "\n")
    assert run_app(app, []) == 2
    err = capsys.readouterr().err
    assert err.startswith("Usage: ") and "\\n" not in err and "\n  train " in err, err
    # a flag that does not exist: the ones meant, by words, initials or spelling (never click's "--help")
    mistyped = {"--lr": "did you mean --learning-rate", "--learning_rate": "did you mean --learning-rate?",
                "--steps": "--max-steps", "--outdir": "did you mean --output-dir?", "--xyz": "no such flag --xyz"}
    for typed, said in mistyped.items():
        assert run_app(app, [*train, typed, "1"]) == 2
        err = capsys.readouterr().err
        assert err.startswith(f"error: no such flag {typed}") and said in err and "--help?" not in err, err


@pytest.mark.slow
def test_the_module_entry_point_says_refusals_in_one_plain_line() -> None:
    proc = real_cli("trian")  # `python -m indextts_train WORD`: a command, not train-gpt flags
    assert proc.returncode == 2 and "No such command 'trian'. Did you mean 'train'?" in proc.stderr, proc.stderr
    proc = real_cli("export", "--pick", "newest", "runs/am")
    assert proc.returncode == 2
    assert proc.stderr.strip() == ("error: --pick: 'newest' is not one of best, latest, cer, speaker_sim "
                                   "(see --help)")


@pytest.mark.parametrize("case", ["unknown gpu", "missing config", "zero batch", "unknown scope"])
def test_hardware_refusals(tmp_path, case) -> None:
    args, needles = {
        "unknown scope": (["--config", TINY_CONFIG, "--train-scope", "half"], ["'half'", "full, partial, lora"]),
        "unknown gpu": (["--config", TINY_CONFIG, "--assume", "Z80"], ["'Z80'", "A100-80GB"]),
        "missing config": (["--config", tmp_path / "nope.yaml"], ["nope.yaml", "not found"]),
        "zero batch": (["--config", TINY_CONFIG, "--effective-batch-size", 0], ["--effective-batch-size"]),
    }[case]
    result = entry("hardware", *args)
    assert result.exit_code == 2 and result.stdout == ""
    error_line(result.stderr, *needles)


# ----------------------------------------------------------------------------- train: bad input


class Payload:
    """Unpickling this creates the marker file: proof that code ran."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (open, (str(self.marker), "w"))


@pytest.mark.parametrize("kind", ["ours", "community"])
def test_a_training_checkpoint_as_base_says_what_is_ignored(complete, files, tiny_data, tmp_path, kind) -> None:
    base, step = {"ours": (complete, 2), "community": (files["community"], 3)}[kind]
    result = cli("train", "--train-manifest", tiny_data["train"], "--output-dir", tmp_path / "run", "--config",
                 tiny_data["config"], "--base-checkpoint", base, "--max-steps", 1, "--batch-size", 2,
                 "--effective-batch-size", 4, "--num-workers", 0)
    assert result.exit_code == 0, result.output[-2000:]
    assert (f"--base-checkpoint {base} is a training checkpoint at step {step}: only its weights are used; its "
            "optimizer state and position are ignored and this run starts at step 0") in result.output
    assert "starting at step 0" in result.output
    if kind == "community":
        return
    plain = cli("train", "--train-manifest", tiny_data["train"], "--output-dir", tmp_path / "bare", "--config",
                tiny_data["config"], "--base-checkpoint", tiny_data["base"], "--max-steps", 1, "--batch-size", 2,
                "--effective-batch-size", 4, "--num-workers", 0)
    assert plain.exit_code == 0 and "is a training checkpoint" not in plain.output


@pytest.mark.slow  # the real CLI in processes
def test_train_gpt_refuses_bad_input_with_one_line(tiny_data, tmp_path) -> None:
    data = tiny_data
    bad_config = tmp_path / "bad.yaml"
    bad_config.write_text(TINY_CONFIG.read_text().replace("train:\n", "train:\n    learning_rat: 0.1\n"))
    good = [absolute_paths(line, data["folder"]) for line in data["train"].read_text().splitlines()]
    bad_lines = tmp_path / "bad_line.jsonl"
    bad_lines.write_text("\n".join(good[:3] + ['{"id": 1,'] + good[3:6]) + "\n")
    marker = tmp_path / "PWNED"
    evil = tmp_path / "evil.pth"
    torch.save({"model": {"w": torch.zeros(2)}, "optimizer": Payload(marker), "step": 3, "epoch": 1}, evil)
    small = tmp_path / "dim32.yaml"
    small.write_text(yaml.safe_dump({**yaml.safe_load(TINY_CONFIG.read_text()),
                                     "gpt": {**yaml.safe_load(TINY_CONFIG.read_text())["gpt"], "model_dim": 32}}))
    cases = {  # name: (changed flags, words the one error line must contain)
        "missing manifest": ({"--train-manifest": tmp_path / "nope.jsonl"}, ["nope.jsonl", "not found"]),
        "unknown config key": ({"--config": bad_config}, ["bad.yaml", "learning_rat"]),
        "bad manifest line": ({"--train-manifest": bad_lines}, [f"{bad_lines}:4", "not valid JSON"]),
        "missing resume": ({"--resume": tmp_path / "gone.pth"}, ["--resume", "gone.pth", "checkpoint not found"]),
        "malicious resume": ({"--resume": evil}, ["evil.pth", "refusing to load"]),
        "mismatched base": ({"--config": small}, ["base_gpt.pth", "model_dim 32"]),
    }
    before = snapshot(data["folder"]), snapshot(tmp_path)

    def flags(name: str) -> list[str]:
        values = {"--train-manifest": data["train"], "--config": TINY_CONFIG, "--base-checkpoint": data["base"],
                  "--output-dir": tmp_path / name.replace(" ", "_"), "--max-steps": 2, "--batch-size": 2,
                  "--grad-accumulation": 2, "--effective-batch-size": 4, **cases[name][0]}
        return [str(x) for pair in values.items() for x in pair]

    # Two cases in fresh interpreters (the entry point's own dispatch, in parallel); the rest in-process.
    procs = {name: start_cli(*flags(name)) for name in ("malicious resume", "bad manifest line")}
    outcomes = {}
    for name in cases.keys() - procs.keys():
        result = cli("train", *flags(name))
        outcomes[name] = (result.exit_code, result.stdout, result.stderr)
    for name, proc in procs.items():
        stdout, stderr = proc.communicate(timeout=300)
        outcomes[name] = (proc.returncode, stdout, stderr)
    for name, (code, stdout, stderr) in outcomes.items():
        assert code == 2, (name, stdout[-500:], stderr)
        assert "Traceback" not in stdout
        error_line(stderr, *cases[name][1])
        assert not list((tmp_path / name.replace(" ", "_")).glob("*.pth")), name
    assert not marker.exists()  # the payload never ran
    after = snapshot(data["folder"]), snapshot(tmp_path)
    assert after[0] == before[0]
    assert {k: v for k, v in after[1].items() if k in before[1]} == before[1]


@pytest.mark.slow  # the shim in a process
def test_community_script_shim_help_lists_train_flags() -> None:
    proc = subprocess.run([sys.executable, str(ROOT / "trainers" / "train_gpt_v2.py"), "--help"],
                          capture_output=True, text=True, cwd=ROOT, timeout=120,
                          env={**os.environ, "COLUMNS": "200", "TERM": "dumb"})
    assert proc.returncode == 0, proc.stderr
    for flag in ("--train-manifest", "--val-manifest", "--tokenizer", "--base-checkpoint", "--resume"):
        assert flag in proc.stdout, flag


@pytest.mark.slow  # the real CLI in a process
def test_train_help_at_80_columns_shows_every_flag_whole_with_its_default() -> None:
    from indextts_train.cli import train_parameters

    proc = subprocess.run([sys.executable, "-m", "indextts_train", "train", "--help"], capture_output=True,
                          text=True, cwd=ROOT, timeout=120, env={**os.environ, "COLUMNS": "80", "TERM": "dumb"})
    assert proc.returncode == 0, proc.stderr
    assert max(map(len, proc.stdout.splitlines())) <= 80
    text = " ".join(proc.stdout.split())  # help text wraps; flag names must not
    for parameter in train_parameters():
        if parameter.name == "ctx":  # Typer's context, not a flag
            continue
        info = parameter.annotation.__metadata__[0]
        # In Annotated form Typer keeps the first declaration in `default`.
        decls = [d for d in (info.default, *(info.param_decls or ())) if isinstance(d, str) and d.startswith("--")]
        flags = [name for decl in decls or [f"--{parameter.name.replace('_', '-')}"] for name in decl.split("/")]
        for flag in flags:
            assert re.search(rf"(?<![\w-]){re.escape(flag)}(?![\w-])", proc.stdout), flag
        if parameter.default is None and "from --config" not in info.help:  # optional inputs say what omitting does
            assert ("Omit" in info.help or "omitted" in info.help or "[required" in info.help
                    or parameter.name == "val_manifests"), parameter.name
    for name in ("epochs", "learning_rate", "keep_checkpoints", "grad_accumulation"):
        assert f"[default: train.{name} from --config, else" in text, name


def _balanced(text: str) -> bool:
    depth = {"[": 0, "(": 0}
    for char in text:
        if char in "[(":
            depth[char] += 1
        elif char in "])":
            depth["[" if char == "]" else "("] -= 1
            if min(depth.values()) < 0:
                return False
    return not any(depth.values())


def test_every_command_help_shows_only_values_a_user_can_type() -> None:
    """No object reprs (`<dataclasses._MISSING_TYPE object at 0x...>`), no empty defaults
    (`else ]`), brackets that close, for `indextts-train --help` and every command's."""
    names = [command.name or command.callback.__name__.replace("_", "-") for command in app.registered_commands]
    assert {"train", "verify", "check-data", "hardware", "checkpoints"} <= set(names)
    shown = plain_help(app)  # as run_cli shows it (the test passed alone only after another had called run_cli)
    for args in ([], *([name] for name in names)):
        result = CliRunner().invoke(shown, [*args, "--help"], env={"COLUMNS": "100"})
        assert result.exit_code == 0, (args, result.output)
        text = " ".join(result.output.split())  # wrapped lines joined
        assert not re.search(r"object at 0x|_MISSING|<function |<class ", text), (args, text)
        assert not re.search(r"(else|default:)\s*\]", text), (args, text)
        assert _balanced(text), (args, text)
        # The parser's internals: Python types, braces around the usage line's arguments
        assert not re.search(r"<list\[|<str>|\[Path\]", text), (args, text)
        assert not re.search(r"\{\w+\}", result.output.splitlines()[0]), (args, result.output)
    train_help = " ".join(CliRunner().invoke(app, ["train", "--help"]).output.split())
    assert "[default: train.borrow_languages from --config, else not set]" in train_help
    assert "[default: train.forgetting_limit from --config, else not set]" in train_help
    assert "--borrow-language NEW=CODE" in train_help


_NO_TORCH = """
import importlib.abc, runpy, sys
class NoTorch(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name.split(".")[0] == "torch":
            raise ImportError("torch was imported")
sys.meta_path.insert(0, NoTorch())
sys.argv = ["indextts-train", *sys.argv[1:]]
runpy.run_module("indextts_train", run_name="__main__")
"""


@pytest.mark.slow  # fresh interpreters
def test_help_and_refused_settings_do_not_load_torch(tiny_data, tmp_path) -> None:
    """torch takes seconds to import: the help and a refusal of the settings come before it (a command loads it
    when it runs). An interpreter where torch cannot be imported shows the help and refuses with the one line."""
    def run(*args: object) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-c", _NO_TORCH, *map(str, args)], capture_output=True, text=True,
                              cwd=tmp_path, timeout=120)

    for args in (["--help"], ["train", "--help"], ["prepare", "--help"]):
        shown = run(*args)
        assert shown.returncode == 0 and "Usage" in shown.stdout, (args, shown.stderr)
    refused = run("train", "--train-manifest", tiny_data["train"], "--val-interval", "5", "--output-dir", "o")
    assert refused.returncode == 2
    assert error_line(refused.stderr, "--val-interval", "--val-manifest")
    started = run("train", "--train-manifest", tiny_data["train"], "--output-dir", "o")  # this one trains: torch
    assert started.returncode == 1 and "torch was imported" in started.stderr
