"""The end of the demo: without an inference environment it says in one line how to enable listening."""

from __future__ import annotations

import subprocess
import sys

import pytest

from indextts_train.config.family import INDEXTTS2, INDEXTTS25
from indextts_train.listen.demo import PYTHON_VARIABLE, demo_listener, listen_to_demo


@pytest.mark.slow  # a new venv: seconds
def test_without_the_inference_package_the_demo_says_how_to_listen(tmp_path, monkeypatch, capsys) -> None:
    venv = tmp_path / "bare"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=300)
    monkeypatch.setenv(PYTHON_VARIABLE, str(venv / "bin" / "python"))
    python, why_not = demo_listener(INDEXTTS25)
    assert python is None
    assert listen_to_demo(tmp_path / "demo", INDEXTTS25, python, why_not, wide=False) == 0
    said = capsys.readouterr().out.strip().splitlines()
    # the demo has no --inference-python: the line names the variable it reads (it named the flag)
    assert len(said) == 1 and said[0].startswith(f"listening skipped: {PYTHON_VARIABLE}={venv / 'bin' / 'python'} "
                                                 "cannot import indextts25.api")
    assert "pip install indextts25-inference" in said[0] and not (tmp_path / "demo").exists()
    assert f"or set {PYTHON_VARIABLE}=VENV/bin/python of an environment" in said[0] and "--inference" not in said[0]


def test_the_indextts2_demo_says_why_it_is_not_heard(tmp_path, capsys) -> None:
    python, why_not = demo_listener(INDEXTTS2)
    assert python is None and listen_to_demo(tmp_path, INDEXTTS2, python, why_not, wide=False) == 0
    said = capsys.readouterr().out.strip().splitlines()
    assert len(said) == 1 and "--family 2.5` ends by listening" in said[0]


def test_a_demo_folder_made_narrow_says_to_use_a_new_folder(tmp_path, capsys) -> None:
    """A folder made before an inference environment was there cannot be heard: one line says what to do."""
    assert listen_to_demo(tmp_path, INDEXTTS25, tmp_path / "python", "", wide=False) == 0
    said = capsys.readouterr().out.strip().splitlines()
    assert len(said) == 1 and "run the demo into a new OUT_DIR" in said[0] and not list(tmp_path.iterdir())
