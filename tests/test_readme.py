"""The README and docs/ keep their promises: every command shown parses, every flag named exists,
every link leads somewhere, and the README's runnable blocks run.

Blocks are ```bash fences. In the README an HTML comment before a block says what the test does:
`<!-- readme-test: run -->` runs it as written in a fresh virtual environment (slow lane),
`<!-- readme-test: install -->` is the install block (done offline, see `fresh_venv`), and
`<!-- readme-test: flags -->` (needs a GPU, a model download or the user's data) only has its flags
checked. Every other bash block, in the README and in docs/, has its flags checked too.
"""

from __future__ import annotations

import dataclasses
import os
import re
import shlex
import subprocess
import sys
import sysconfig
from functools import cache
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from indextts_train.cli import app
from indextts_train.config.settings import GPTConfig, TrainConfig

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
DOCS = sorted((ROOT / "docs").glob("*.md"))
# Commands and pages that other branches bring (merged later): checked as soon as they exist.
FENCE = re.compile(r"(?:<!-- readme-test: (\w+) -->\n)?```(\w*)\n(.*?)```", re.S)


def blocks(path: Path) -> list[tuple[str | None, str, str]]:
    """(marker, language, body) of every fenced block."""
    return [(m.group(1), m.group(2), m.group(3)) for m in FENCE.finditer(path.read_text(encoding="utf-8"))]


def commands(body: str) -> list[str]:
    """The shell commands of a block: continuation lines joined, comments dropped."""
    joined = re.sub(r"\\\n\s*", " ", body)
    lines = [re.sub(r"\s+#.*$", "", line).strip() for line in joined.splitlines()]
    return [line for line in lines if line and not line.startswith("#")]


def parse(command: str) -> tuple[str, list[str]] | None:
    """(subcommand, flags) of a command of ours (train-gpt, indextts-train, python -m / torchrun -m
    indextts_train, trainers/train_gpt_v2.py); None for any other program."""
    words = shlex.split(command.replace("$(which train-gpt)", "train-gpt"))
    for i, word in enumerate(words):
        rest = words[i + 1:]
        if word in ("train-gpt", "trainers/train_gpt_v2.py") or (
                word == "indextts_train" and (not rest or rest[0].startswith("-"))):
            return "train", [w for w in rest if w.startswith("--")]
        if word in ("indextts-train", "indextts_train") and rest:
            return rest[0], [w for w in rest[1:] if w.startswith("--")]
    return None


def shown_commands() -> list[tuple[str, str]]:
    """(where, command) for every command of ours in a bash block of the README and docs/."""
    found = []
    for path in [README, *DOCS]:
        for _, language, body in blocks(path):
            if language in ("bash", "sh"):
                found += [(path.name, c) for c in commands(body) if parse(c) is not None]
    return found


@cache
def help_text(subcommand: str) -> str:
    result = CliRunner().invoke(app, [subcommand, "--help"], env={"COLUMNS": "200"})
    assert result.exit_code == 0, f"`indextts-train {subcommand} --help` failed: {result.output}"
    return result.output


def test_the_readme_is_a_path_not_a_reference() -> None:
    text = README.read_text(encoding="utf-8")
    assert len(text.splitlines()) <= 250
    for step in ("Install", "demo", "training data", "Train", "resume", "Export and listen", "Where to go next"):
        assert step.lower() in text.lower(), step
    assert "python3 -m venv" in text and "from indextts.infer_v2 import IndexTTS2" in text


def test_every_shown_command_parses_and_every_flag_exists() -> None:
    shown = shown_commands()
    assert len(shown) > 30  # the README and docs show commands; an empty find would prove nothing
    for where, command in shown:
        subcommand, flags = parse(command)
        text = help_text(subcommand)
        for flag in flags:
            name = flag.split("=", 1)[0]
            assert re.search(rf"(?<![\w-]){re.escape(name)}(?![\w-])", text), f"{where}: `{command}`: {name}"


def test_every_link_leads_to_a_file_or_heading() -> None:
    for path in [README, *DOCS]:
        text = path.read_text(encoding="utf-8")
        for target in re.findall(r"\]\(([^)\s]+)\)", text):
            if target.startswith(("http://", "https://")):
                continue
            file_part, _, anchor = target.partition("#")
            linked = (path.parent / file_part).resolve() if file_part else path
            assert linked.exists(), f"{path.name}: link to {target}"
            if anchor and linked.suffix == ".md":
                headings = re.findall(r"^#+ (.+)$", linked.read_text(encoding="utf-8"), re.M)
                slugs = {re.sub(r"[^\w\- ]", "", h.lower()).replace(" ", "-") for h in headings}
                assert anchor in slugs, f"{path.name}: link to {target}"


def test_docs_config_lists_every_key() -> None:
    text = (ROOT / "docs" / "config.md").read_text(encoding="utf-8")
    for cls in (TrainConfig, GPTConfig):
        for f in dataclasses.fields(cls):
            if f.name != "stated_family":  # the top-level `version:`, described above the tables
                assert f"| `{f.name}` |" in text, f.name


# ---- the README's blocks, run as a user runs them --------------------------------------------


def fresh_venv(folder: Path) -> Path:
    """A new virtual environment with this checkout installed (`pip install -e .`), offline.

    The README's install block downloads torch; CI has no network, so the venv reuses this
    interpreter's packages (a .pth line naming its site-packages: torch and the dependencies, not
    their .pth hooks, so no other checkout's editable install leaks in), and pip installs the
    project from its own pyproject with its entry points, without an index.
    """
    venv = folder / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    python = venv / "bin" / "python"
    target = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                            capture_output=True, text=True, check=True).stdout.strip()
    Path(target, "_reuse_test_interpreter.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    subprocess.run([str(python), "-m", "pip", "install", "--quiet", "--no-deps", "--no-build-isolation",
                    "--no-index", "-e", str(ROOT)], check=True, timeout=300, cwd=folder)
    return venv


@pytest.mark.slow
def test_the_readme_blocks_run_in_a_fresh_venv(tmp_path) -> None:
    marked = [(marker, body) for marker, _, body in blocks(README) if marker]
    assert [m for m, _ in marked].count("run") >= 2 and [m for m, _ in marked].count("install") == 1
    install = next(body for marker, body in marked if marker == "install")
    assert "python3 -m venv .venv" in install and "pip install -e '.[prepare]'" in install
    venv = fresh_venv(tmp_path)
    located = subprocess.run([str(venv / "bin" / "python"), "-c", "import indextts_train as p; print(p.__file__)"],
                             capture_output=True, text=True, check=True, cwd=tmp_path).stdout
    assert located.startswith(str(ROOT))  # this checkout, not another one installed elsewhere
    env = {**os.environ, "PATH": f"{venv / 'bin'}{os.pathsep}{os.environ['PATH']}", "VIRTUAL_ENV": str(venv)}
    env.pop("PYTHONPATH", None)
    work = tmp_path / "work"
    work.mkdir()
    for body in (body for marker, body in marked if marker == "run"):
        result = subprocess.run(["bash", "-euo", "pipefail", "-c", body], cwd=work, env=env, capture_output=True,
                                text=True, timeout=2400)  # the demo is CPU-bound: a shared machine is slow
        assert result.returncode == 0, f"{body}\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}"
    # What the blocks claim: the demo exported, the run folder explains itself, the rerun is exact.
    run, again = work / "runs" / "demo" / "run", work / "runs" / "demo" / "again"
    assert (work / "runs" / "demo" / "export" / "gpt.pth").is_file() and (work / "runs" / "demo25" / "export").is_dir()
    assert "indextts-train demo runs/demo" in (run / "run.yaml").read_text()
    assert re.search(r"^\d\d:\d\d:\d\d \+\d+:\d\d:\d\d done: 150 steps", (run / "train.log").read_text(), re.M)
    # Section 4 on the demo's folders: the model folder's config.yaml is taken as an official one.
    am_log = (work / "runs" / "am" / "train.log").read_text()
    head, opening = am_log.splitlines()[:2]  # the start's header, then its first line
    assert head.startswith("=== start ")
    assert "--config not given: using runs/demo/models/config.yaml, the config.yaml of" in opening
    assert re.search(r"^\d\d:\d\d:\d\d \+\d+:\d\d:\d\d done: 30 steps", am_log, re.M) and "warning:" not in am_log
    first = torch.load(run / "latest.pth", weights_only=True)["model"]
    second = torch.load(again / "latest.pth", weights_only=True)["model"]
    assert list(first) == list(second) and all(torch.equal(first[k], second[k]) for k in first)
