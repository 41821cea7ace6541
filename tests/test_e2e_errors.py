"""One error boundary per command: what a careless or hostile user can feed each command gives one
`error:` line (or the command's own one-line verdict), the documented exit code, no traceback, and
leaves no file behind. The crafted checkpoint of issue 23 (a list nested 40 deep whose elements are
shared references) is refused at once by every command that reads checkpoints.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import torch
import yaml
from helpers import FaultyFolder
from typer.testing import CliRunner

from indextts_train.checkpoint import table as checkpoint_table
from indextts_train.cli import app, run_app
from indextts_train.webui import records
from indextts_train.webui.roots import Roots
from indextts_train.webui.server import PageServer

ROOT = Path(__file__).resolve().parents[1]
TINY_CONFIG = ROOT / "configs" / "tiny.yaml"
NOT_OURS = "not a checkpoint this program wrote"


def crafted(path: Path, depth: int = 40) -> Path:
    """A few hundred bytes whose naive walk visits 2^depth nodes."""
    nested: list = []
    for _ in range(depth):
        nested = [nested, nested]
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save({"format": "indextts-train", "model": {"w": torch.zeros(2)}, "history": {"train": nested}}, path)
    return path


def files_under(folder: Path) -> set[str]:
    return {str(p.relative_to(folder)) for p in folder.rglob("*") if p.is_file()}


def reader_commands(bad: Path, run: Path, manifest: Path, out: Path) -> dict[str, tuple[list[str], int]]:
    """Every command that reads a checkpoint, pointed at the crafted file: (argv, exit code)."""
    train = ["train", "--train-manifest", str(manifest), "--config", str(TINY_CONFIG), "--max-steps", "1"]
    return {
        "verify": (["verify", str(bad)], 2),
        "checkpoints": (["checkpoints", str(run)], 0),  # a table: the file's row says INCOMPLETE and why
        "repair": (["repair", str(bad), "-o", str(out / "repaired.pth")], 2),
        "export": (["export", str(bad), "-o", str(out / "gpt.pth")], 2),
        "evaluate": (["evaluate", "--checkpoint", str(bad), "--manifest", str(manifest)], 2),
        "resume path": ([*train, "--output-dir", str(out / "run"), "--resume", str(bad)], 2),
        "resume auto": ([*train, "--output-dir", str(run), "--resume", "auto"], 2),
    }


@pytest.fixture()
def crafted_run(tmp_path: Path, tiny_data) -> dict:
    bad = crafted(tmp_path / "bad.pth")
    run = tmp_path / "run"
    crafted(run / "model_step1.pth")
    out = tmp_path / "out"
    out.mkdir()
    return {"commands": reader_commands(bad, run, tiny_data["train"], out), "tmp": tmp_path}


@pytest.mark.slow
def test_every_reader_command_refuses_the_crafted_checkpoint_at_once(crafted_run) -> None:
    before = files_under(crafted_run["tmp"])
    for name, (argv, code) in crafted_run["commands"].items():
        started = time.monotonic()
        done = subprocess.run([sys.executable, "-m", "indextts_train", *argv], capture_output=True, text=True,
                              cwd=ROOT, timeout=120, env={**os.environ, "PYTHONUNBUFFERED": "1"})
        assert done.returncode == code, (name, done.stdout[-500:], done.stderr[-500:])
        assert NOT_OURS in done.stdout + done.stderr and "Traceback" not in done.stderr, name
        assert time.monotonic() - started < 60, name  # interpreter and torch start included
    # the run lock is the only file a refused command may leave (it is how the trainer holds a folder)
    assert {f for f in files_under(crafted_run["tmp"]) - before if not f.endswith("train.lock")} == set()


def test_reader_commands_in_process_take_well_under_a_second(crafted_run) -> None:
    for name, (argv, code) in crafted_run["commands"].items():
        if name.startswith("resume"):
            continue  # setup (data, model) dominates; the subprocess test covers them
        started = time.perf_counter()
        result = CliRunner().invoke(app, argv)
        elapsed = time.perf_counter() - started
        assert result.exit_code == code and NOT_OURS in result.output, (name, result.output)
        assert elapsed < 1.0, (name, elapsed)


def test_the_page_run_table_refuses_the_crafted_file_and_other_requests_still_answer(tmp_path: Path,
                                                                                    monkeypatch) -> None:
    run = tmp_path / "run"
    crafted(run / "model_step1.pth")
    started = time.perf_counter()
    rows = records.checkpoint_rows(run, Roots([tmp_path]))
    assert time.perf_counter() - started < 1.0
    assert rows[0]["status"] == "INCOMPLETE" and NOT_OURS in rows[0]["reasons"]
    # A slow read (a big file on a slow disk) holds only its own request: the table keeps no lock
    # that the log and status requests need.
    reading, release = threading.Event(), threading.Event()

    real_verify = checkpoint_table.verify_checkpoint

    def slow_verify(path: Path):
        reading.set()
        release.wait(10)
        return real_verify(path)

    monkeypatch.setattr(checkpoint_table, "verify_checkpoint", slow_verify)
    crafted(run / "model_step2.pth", depth=3)
    table = threading.Thread(target=records.checkpoint_rows, args=(run, Roots([tmp_path])))
    table.start()
    assert reading.wait(10)
    try:
        started = time.perf_counter()
        status = PageServer().watch(str(run))
        assert time.perf_counter() - started < 1.0 and status[0]
    finally:
        release.set()
        table.join(10)


# ----------------------------------------------------------------------------- the no-traceback matrix


def bad_inputs(folder: Path) -> dict[str, Path]:
    """Files a careless user passes: a folder, a plain file, bad UTF-8, deep JSON and YAML, another config."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "adir").mkdir(exist_ok=True)
    (folder / "afile").write_text("not what was asked for\n")
    (folder / "badutf.yaml").write_bytes(b"gpt:\n  layers: \xff\xfe\n")
    (folder / "badutf.jsonl").write_bytes(b'{"id": "\xff"}\n')
    (folder / "deep.yaml").write_text("gpt: " + "[" * 5000 + "]" * 5000 + "\n")
    (folder / "deep.jsonl").write_text("[" * 100_000 + "]" * 100_000 + "\n")
    other = yaml.safe_load(TINY_CONFIG.read_text())
    other["gpt"].update(model_dim=32, layers=3)
    (folder / "other.yaml").write_text(yaml.safe_dump(other))
    deeper = yaml.safe_load(TINY_CONFIG.read_text())
    deeper["gpt"].update(layers=3)  # the data still fits (same widths): only the checkpoint does not
    (folder / "deeper.yaml").write_text(yaml.safe_dump(deeper))
    return {name: folder / name for name in ("adir", "afile", "badutf.yaml", "badutf.jsonl", "deep.yaml",
                                             "deep.jsonl", "other.yaml", "deeper.yaml")}


@pytest.fixture(scope="module")
def trained_tiny(tiny_data, tmp_path_factory) -> Path:
    """One step of the tiny config: a checkpoint of our own format."""
    out = tmp_path_factory.mktemp("trained") / "run"
    code = run_app(app, ["train", "--train-manifest", str(tiny_data["train"]), "--config", str(TINY_CONFIG),
                         "--output-dir", str(out), "--max-steps", "1", "--batch-size", "2", "--grad-accumulation", "1",
                         "--effective-batch-size", "2", "--num-workers", "0"])
    assert code == 0
    return out / "model_step1.pth"


def matrix(bad: dict[str, Path], data: dict, checkpoint: Path, out: Path) -> dict[str, tuple[list, str]]:
    """Command line -> a needle its one error line must hold. `out` is where outputs would go."""
    manifest, base, config = str(data["train"]), str(data["base"]), str(TINY_CONFIG)
    train = ["train", "--train-manifest", manifest, "--config", config, "--max-steps", "1"]
    return {
        "train: manifest is a folder": ([*train[:1], "--train-manifest", bad["adir"], "--output-dir", out], "adir"),
        "train: manifest bad UTF-8": (["train", "--train-manifest", bad["badutf.jsonl"], "--config", config,
                                       "--output-dir", out], "not UTF-8"),
        "train: manifest nested deep": (["train", "--train-manifest", bad["deep.jsonl"], "--config", config,
                                         "--output-dir", out], "nested too deeply"),
        "train: output is a file": ([*train, "--output-dir", bad["afile"]], "is a file, not a folder"),
        "train: config bad UTF-8": ([*train[:3], "--config", bad["badutf.yaml"], "--output-dir", out], "not UTF-8"),
        "train: config nested deep": ([*train[:3], "--config", bad["deep.yaml"], "--output-dir", out], "too deeply"),
        "train: config is a folder": ([*train[:3], "--config", bad["adir"], "--output-dir", out],
                                      "is a folder; pass the config file"),
        "train: seed 1e20": ([*train, "--output-dir", out, "--seed", "1e20"], "--seed: '1e20' is not a whole"),
        "train: seed past 64 bits": ([*train, "--output-dir", out, "--seed", str(2**64)], "at most"),
        "train: batch 10^30": ([*train, "--output-dir", out, "--batch-size", str(10**30)], "at most 65,536"),
        "train: unknown flag": ([*train, "--output-dir", out, "--lerning-rate", "1"], "--lerning-rate"),
        "train: tokenizer is a folder": ([*train, "--output-dir", out, "--tokenizer", bad["adir"]],
                                         "is a folder; pass the tokenizer file in it"),
        "train: base is a folder": ([*train, "--output-dir", out, "--base-checkpoint", bad["adir"]],
                                    "is a folder; pass the checkpoint file in it"),
        "train: base of another config": ([*train[:3], "--config", bad["other.yaml"], "--output-dir", out,
                                           "--base-checkpoint", base], "does not match"),
        "train: resume of another config": ([*train[:3], "--config", bad["deeper.yaml"], "--output-dir", out,
                                             "--resume", checkpoint], "changes the model"),
        "evaluate: checkpoint is a folder": (["evaluate", "--checkpoint", bad["adir"], "--manifest", manifest],
                                             "is a folder, not a checkpoint file"),
        "evaluate: manifest nested deep": (["evaluate", "--checkpoint", base, "--manifest", bad["deep.jsonl"],
                                            "--config", config], "nested too deeply"),
        "evaluate: another config": (["evaluate", "--checkpoint", base, "--manifest", manifest, "--config",
                                      bad["other.yaml"]], "mis-shaped"),
        "checkpoints: a file": (["checkpoints", bad["afile"]], "a file, not a run folder; pass the run's --output-dir"),
        "repair: a folder": (["repair", bad["adir"]], "is a folder, not a checkpoint file"),
        "repair: config nested deep": (["repair", checkpoint, "--config", bad["deep.yaml"]], "too deeply"),
        "check-data: a folder": (["check-data", bad["adir"]], "is a folder; pass the manifest file in it"),
        "check-data: config nested deep": (["check-data", manifest, "--config", bad["deep.yaml"]], "too deeply"),
        "check-tokenizer: a plain file": (["check-tokenizer", bad["afile"]], "not a SentencePiece model"),
        "extend-tokenizer: base a folder": (["extend-tokenizer", "--base", bad["adir"], "--corpus", bad["deep.jsonl"],
                                             "--target-size", "200", "-o", out / "new.model"], "adir"),
        "export: output under a file": (["export", base, "--config", config, "-o", bad["afile"] / "gpt.pth"],
                                        "is a file, not a folder"),
        "export: config bad UTF-8": (["export", base, "--config", bad["badutf.yaml"], "-o", out / "gpt.pth"],
                                     "not UTF-8"),
        "export: another config": (["export", base, "--config", bad["other.yaml"], "-o", out / "gpt.pth"],
                                   "does not match"),
        "export: onto an existing file": (["export", base, "--config", config, "-o", bad["afile"]], "--force"),
        "hardware: config nested deep": (["hardware", "--config", bad["deep.yaml"]], "too deeply"),
        "hardware: batch 10^30": (["hardware", "--config", config, "--effective-batch-size", str(10**30)],
                                  "--effective-batch-size: "),
        "webui: root a file": (["webui", "--root", bad["afile"]], "not a folder"),
        "webui: port past 65535": (["webui", "--port", str(10**8)], "--port: '100000000' is above"),
        "extend-tokenizer: target 10^20": (["extend-tokenizer", "--base", bad["afile"], "--corpus", bad["afile"],
                                            "--target-size", str(10**20), "-o", out / "new.model"], "--target-size: "),
    }


CASES = list(matrix(dict.fromkeys(("adir", "afile", "badutf.yaml", "badutf.jsonl", "deep.yaml", "deep.jsonl",
                                   "other.yaml", "deeper.yaml"), Path()), {"train": "", "base": ""}, Path(), Path()))


def files_and_bytes(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


@pytest.mark.parametrize("case", CASES)
def test_bad_input_is_one_line_exit_2_and_leaves_nothing(case, tiny_data, trained_tiny, tmp_path, capsys) -> None:
    bad = bad_inputs(tmp_path / "inputs")
    out = tmp_path / "out"
    args, needle = matrix(bad, tiny_data, trained_tiny, out)[case]
    before, run_before = files_and_bytes(tmp_path), files_and_bytes(trained_tiny.parent)
    assert run_app(app, [str(a) for a in args]) == 2
    captured = capsys.readouterr()
    lines = [line for line in captured.err.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), lines
    assert needle in lines[0], lines[0]
    assert "Traceback" not in captured.err
    after = files_and_bytes(tmp_path)
    assert {k: v for k, v in after.items() if not k.endswith("train.lock")} == before  # nothing new, nothing changed
    assert files_and_bytes(trained_tiny.parent) == run_before


@pytest.mark.parametrize("command", ["export", "repair", "train"])
def test_a_read_only_output_folder_is_one_line(command, tiny_data, trained_tiny, tmp_path, capsys, monkeypatch) -> None:
    locked = tmp_path / "locked"
    locked.mkdir()
    FaultyFolder(locked, read_only=True).install(monkeypatch)
    args = {"export": ["export", tiny_data["base"], "--config", TINY_CONFIG, "-o", locked / "gpt.pth"],
            "repair": ["repair", tiny_data["base"], "-o", locked / "r.pth"],
            "train": ["train", "--train-manifest", tiny_data["train"], "--config", TINY_CONFIG,
                      "--output-dir", locked / "run", "--max-steps", "1"]}[command]
    assert run_app(app, [str(a) for a in args]) == 2
    lines = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), lines
    assert list(locked.iterdir()) == []


@pytest.mark.parametrize("command", ["verify", "checkpoints", "check-data", "check-tokenizer", "repair", "export",
                                     "hardware", "tokenize", "train"])
def test_a_path_with_a_name_past_255_bytes_is_one_line(command, tiny_data, tmp_path, capsys) -> None:
    """A name no file system holds (ENAMETOOLONG from the first stat): one line naming the path, exit 2."""
    long = tmp_path / ("x" * 300)
    config = str(TINY_CONFIG)
    args = {"verify": [long], "checkpoints": [long], "check-data": [long], "check-tokenizer": [long],
            "repair": [long], "export": [long, "--config", config, "-o", tmp_path / "gpt.pth"],
            "hardware": ["--config", long], "tokenize": [long, "--tokenizer", long, "--out", tmp_path / "tok"],
            "train": ["--train-manifest", long, "--config", config, "--output-dir", tmp_path / "run"]}[command]
    assert run_app(app, [command, *map(str, args)]) == 2
    captured = capsys.readouterr()
    lines = [line for line in captured.err.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: ") and "x" * 300 in lines[0], lines
    assert "Traceback" not in captured.err + captured.out
    assert sorted(p.name for p in tmp_path.iterdir()) == []


@pytest.mark.parametrize("command", ["repair", "export", "extend-tokenizer", "tokenize"])
def test_a_symlink_loop_given_as_a_path_is_one_line(command, tiny_data, tmp_path, capsys) -> None:
    """`ln -s loop loop`: resolving it raises in Python (RuntimeError), so every check of it must not."""
    loop = tmp_path / "loop"
    loop.symlink_to(loop)
    tokenizer = str(ROOT / "tests" / "data" / "reference" / "prepare" / "text" / "bpe_tiny.model")
    args = {"repair": [loop], "export": [tiny_data["base"], "--config", TINY_CONFIG, "-o", loop],
            "extend-tokenizer": ["--base", tokenizer, "--corpus", tiny_data["train"], "--target-size", "300",
                                 "-o", loop],
            "tokenize": [loop, "--tokenizer", tokenizer, "--out", tmp_path / "tok"]}[command]
    assert run_app(app, [command, *map(str, args)]) == 2
    captured = capsys.readouterr()
    lines = [line for line in captured.err.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: ") and str(loop) in lines[0], lines
    assert "Traceback" not in captured.err + captured.out
    assert sorted(p.name for p in tmp_path.iterdir()) == ["loop"] and loop.is_symlink()


@pytest.mark.parametrize("command", ["verify", "checkpoints", "check-data", "check-tokenizer", "repair", "export",
                                     "hardware", "tokenize", "train", "listen"])
def test_a_path_with_a_line_break_or_a_control_character_is_one_line(command, tiny_data, tmp_path, capsys) -> None:
    """A name holding a line break (or an escape sequence) is said with it escaped: still one line, and no
    control sequence reaches the terminal."""
    odd = tmp_path / "a\nb\x1b[2Jc"
    config = str(TINY_CONFIG)
    args = {"verify": [odd], "checkpoints": [odd], "check-data": [odd], "check-tokenizer": [odd],
            "repair": [odd], "export": [odd, "--config", config, "-o", tmp_path / "gpt.pth"],
            "hardware": ["--config", odd], "tokenize": [odd, "--tokenizer", odd, "--out", tmp_path / "tok"],
            "train": ["--train-manifest", odd, "--config", config, "--output-dir", tmp_path / "run"],
            "listen": [odd]}[command]
    assert run_app(app, [command, *map(str, args)]) == 2
    captured = capsys.readouterr()
    if command == "verify":  # its report, on stdout: INCOMPLETE and why, a line each
        lines = captured.out.splitlines()
        assert len(lines) == 2 and lines[0].endswith("INCOMPLETE (not a file)") and captured.err == "", lines
    else:
        lines = [line for line in captured.err.splitlines() if line.strip()]
        assert len(lines) == 1 and lines[0].startswith("error: "), lines
    assert "a\\nb\\x1b[2Jc" in lines[0] and "\x1b" not in captured.err + captured.out, lines
    assert sorted(p.name for p in tmp_path.iterdir()) == []
