"""Choosing the inference interpreter, and seeding lines (the synthesis itself: test_listen_inference.py)."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest
from helpers import fake_inference_python

from indextts_train.config.family import INDEXTTS2, INDEXTTS25, family_named
from indextts_train.errors import UserError
from indextts_train.listen import synthesize as synthesize_module
from indextts_train.listen.synthesize import SynthesisLine, line_seed, resolve_inference_python, synthesize


@pytest.fixture(scope="module")
def bare_python(tmp_path_factory) -> Path:
    """An interpreter with neither inference package: a new venv that does not see this one's packages."""
    venv = tmp_path_factory.mktemp("bare") / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    return venv / "bin" / "python"


@pytest.mark.slow  # a new venv: seconds
@pytest.mark.parametrize(("family", "package", "module"), [(INDEXTTS25, "indextts25-inference", "indextts25"),
                                                           (INDEXTTS2, "indextts2-inference", "indextts")])
def test_an_environment_without_the_package_is_one_line_naming_it(bare_python, family, package, module) -> None:
    with pytest.raises(UserError) as caught:
        resolve_inference_python(family, bare_python)
    message = str(caught.value)
    assert "\n" not in message
    assert f"--inference-python {bare_python}" in message and f"pip install {package}" in message
    assert f"No module named '{module}'" in message


def test_a_missing_interpreter_is_one_line(tmp_path) -> None:
    with pytest.raises(UserError, match=r"--inference-python .*nothing/python: not an executable file"):
        resolve_inference_python(INDEXTTS25, tmp_path / "nothing" / "python")


@pytest.mark.slow  # starts the probe's process
def test_an_installed_package_that_cannot_import_is_one_line_before_any_work(tmp_path) -> None:
    """find_spec imports the parent package only: a broken api module (a torchaudio built for another torch)
    passed, and every line failed after the ASR model loaded."""
    python = fake_inference_python(tmp_path, "indextts25.api",
                                   "raise ImportError(\"cannot import name 'IndexTTS25'\")\n")
    with pytest.raises(UserError, match=r"cannot import indextts25.api.*ImportError: cannot import name 'IndexTTS25'"):
        resolve_inference_python(INDEXTTS25, python)


@pytest.mark.slow  # starts the probe's process
def test_a_relative_interpreter_path_runs_that_very_file(tmp_path, monkeypatch) -> None:
    """`--inference-python ./python` became "python", which the start looked up on PATH: another
    interpreter ran, and the one named never did."""
    marker = tmp_path / "ran"
    fake_inference_python(tmp_path, "indextts25.api", "", marker)
    monkeypatch.chdir(tmp_path)
    assert resolve_inference_python(INDEXTTS25, Path("./python")) == tmp_path / "python"
    assert marker.exists()


@pytest.mark.slow  # starts the probe's process
def test_a_bare_name_with_no_such_file_here_is_looked_up_on_path(tmp_path, monkeypatch) -> None:
    python = fake_inference_python(tmp_path / "env", "indextts25.api", "")
    monkeypatch.setenv("PATH", str(python.parent))
    (tmp_path / "elsewhere").mkdir()
    monkeypatch.chdir(tmp_path / "elsewhere")
    assert resolve_inference_python(INDEXTTS25, Path("python")) == python


def _program(folder: Path, name: str, text: str) -> Path:
    script = folder / name
    script.write_text(text)
    script.chmod(0o755)
    return script


@pytest.mark.slow  # starts the probe's process
def test_the_probe_says_what_it_waits_for_and_how_long(tmp_path, monkeypatch) -> None:
    """A program that never exits was waited for in silence, up to the probe's limit; `./quick.sh` was looked
    up on PATH (FileNotFoundError, though the file is there). A program that exits at once shows the line."""
    _program(tmp_path, "quick.sh", "#!/bin/sh\nexit 3\n")  # 3: the probe's "not installed"
    monkeypatch.chdir(tmp_path)
    said: list[str] = []
    with pytest.raises(UserError, match=r"^--inference-python quick.sh cannot import indextts25.api, the IndexTTS-2.5 "
                                        r"inference code \(not installed\)"):
        resolve_inference_python(INDEXTTS25, Path("./quick.sh"), say=said.append)
    assert said == [f"checking that --inference-python quick.sh imports indextts25.api (waiting up to "
                    f"{synthesize_module.PROBE_TIMEOUT_S} s)"]


@pytest.mark.slow  # starts the probe's process and waits for its limit (1 s here)
def test_a_program_that_never_answers_is_one_line_at_the_limit(tmp_path, monkeypatch) -> None:
    monkeypatch.setattr(synthesize_module, "PROBE_TIMEOUT_S", 1)
    hang = _program(tmp_path, "hang.sh", "#!/bin/sh\nexec sleep 60\n")
    started = time.monotonic()
    with pytest.raises(UserError, match=rf"^--inference-python {hang}: did not finish importing indextts25.api in 1 s"):
        resolve_inference_python(INDEXTTS25, hang)
    assert time.monotonic() - started < 30


@pytest.mark.slow  # tries to start the probe's process
def test_a_program_that_cannot_start_says_why(tmp_path) -> None:
    """An existing file was said to be a FileNotFoundError when its #! line named a missing interpreter."""
    missing = _program(tmp_path, "missing.sh", f"#!{tmp_path}/gone/python\n")
    with pytest.raises(UserError, match=r"cannot run it \(its #! line names a program that is not there\); pip"):
        resolve_inference_python(INDEXTTS25, missing)
    with pytest.raises(UserError, match=r"cannot run it \(Exec format error\); pip"):
        resolve_inference_python(INDEXTTS25, _program(tmp_path, "text.sh", "no #! line\n"))


def test_an_unknown_family_is_refused() -> None:
    with pytest.raises(ValueError, match="unknown model family 'indextts3'"):
        family_named("indextts3")


def test_a_line_seed_depends_on_the_seed_and_the_line_only() -> None:
    seeds = {line_seed(seed, line) for seed in range(3) for line in ("a", "b", "c")}
    assert len(seeds) == 9 and all(0 <= s < 2**31 for s in seeds)
    assert line_seed(7, "en/utt1") == line_seed(7, "en/utt1")


@pytest.mark.slow
def test_a_child_that_cannot_run_fails_every_line_with_its_reason(bare_python, tmp_path) -> None:
    """The bare interpreter has no torch: the child reports the load failure, the parent gets one line per line."""
    lines = [SynthesisLine(f"l{i}", "text", tmp_path / "p.wav", tmp_path / "out" / f"l{i}.wav", "en") for i in range(2)]
    results = synthesize(tmp_path / "model", INDEXTTS25, lines, seed=1, device="cpu", inference_python=bare_python,
                         log_path=tmp_path / "log.txt")
    assert [r.line_id for r in results] == ["l0", "l1"]
    for result in results:
        assert not result.ok and result.error.startswith("loading the model failed: ")
        assert "No module named" in result.error and "\n" not in result.error
        assert result.seed == line_seed(1, result.line_id)
    assert not (tmp_path / "out").exists()
    assert "Traceback" not in (tmp_path / "log.txt").read_text()


def test_a_link_at_a_wavs_name_is_replaced_as_a_name_and_its_target_kept(tmp_path) -> None:
    """The job named each WAV by its resolved path, so the child's rename replaced a link's target: a
    file of the user's, outside the run, overwritten by a synthesized clip."""
    from indextts_train.listen import child_infer
    from indextts_train.listen.synthesize import _job

    theirs = tmp_path / "theirs.wav"
    theirs.write_bytes(b"their recording")
    step = tmp_path / "run" / "listen" / "step4"
    step.mkdir(parents=True)
    (step / "a.wav").symlink_to(theirs)
    line = SynthesisLine("a", "text", tmp_path / "prompt.wav", step / "a.wav", None)
    job = _job(tmp_path, INDEXTTS2, [line], 0, "cpu", tmp_path / "result.json", None, None)

    class Engine:
        def speak(self, line: dict, out: Path) -> None:
            out.write_bytes(b"synthesized")

    assert child_infer._speak_line(Engine(), job["lines"][0])["ok"]
    assert theirs.read_bytes() == b"their recording"
    assert not (step / "a.wav").is_symlink() and (step / "a.wav").read_bytes() == b"synthesized"
