"""The shared flag handling of every command (cli_flags.py), as a flag fuzz found it: values the shell hands over
as typed (a `~` in `--flag=~/path`, a path of spaces), each either taken as meant or refused in one line naming
its flag, exit 2, before anything is written. In this process through the entry point's own `run_app`."""

from __future__ import annotations

from pathlib import Path

import pytest

from indextts_train.cli import app, run_app


def _lines(capsys) -> list[str]:
    return [line for line in capsys.readouterr().err.splitlines() if line.strip()]


@pytest.mark.parametrize("args", [
    ["train", "--train-manifest", "t.jsonl", "--output-dir=~nosuchuser9/run"],
    ["train", "--train-manifest=~nosuchuser9/t.jsonl::am", "--output-dir", "run"],
    ["demo", "~nosuchuser9/demo"],
    ["export", "~nosuchuser9/run", "-o", "gpt.pth"],
])
def test_tilde_of_no_user_is_one_line_before_any_write(args, tmp_path, monkeypatch, capsys):
    """bash leaves the ~ of `--output-dir=~/run` as typed: the run wrote into a folder named `~...` here."""
    monkeypatch.chdir(tmp_path)
    assert run_app(app, args) == 2
    lines = _lines(capsys)
    assert len(lines) == 1 and "no user 'nosuchuser9'" in lines[0] and "Traceback" not in lines[0], lines
    assert list(tmp_path.iterdir()) == []


def test_tilde_is_expanded_as_a_shell_would(tmp_path, monkeypatch, capsys):
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.chdir(tmp_path)
    assert run_app(app, ["train", "--train-manifest=t.jsonl", "--output-dir=~/run", "--config=~/c.yaml"]) == 2
    assert str(home / "c.yaml") in capsys.readouterr().err  # the file under HOME, not ./~/c.yaml
    assert sorted(p.name for p in tmp_path.iterdir()) == ["home"] and list(home.iterdir()) == []


@pytest.mark.parametrize("args", [
    ["train", "--train-manifest", "t.jsonl", "--output-dir", " "],
    ["demo", "  "],
    ["tokenize", "m.jsonl", "--tokenizer", "bpe.model", "--out", " "],
])
def test_a_path_of_spaces_is_refused_by_its_flag(args, tmp_path, monkeypatch, capsys):
    """An unset variable between quotes with a space: the run went into a folder named ' '."""
    monkeypatch.chdir(tmp_path)
    assert run_app(app, args) == 2
    lines = _lines(capsys)
    assert len(lines) == 1 and "is blank" in lines[0], lines
    assert list(Path(tmp_path).iterdir()) == []


@pytest.mark.parametrize("flag", ["--batch-size", "--effective-batch-size", "--seed", "--max-steps"])
def test_an_integer_flag_of_hundreds_of_digits_is_one_line(flag, tmp_path, monkeypatch, capsys):
    """`--batch-size 1000...0` (400 zeros): the range check's math.isfinite raised OverflowError, a traceback."""
    monkeypatch.chdir(tmp_path)
    assert run_app(app, ["train", "--train-manifest", "t.jsonl", "--output-dir", "run", flag, "1" + "0" * 400]) == 2
    lines = _lines(capsys)
    assert len(lines) == 1 and f"({flag}) must be at most" in lines[0] and "401 digits" in lines[0], lines
    assert list(tmp_path.iterdir()) == []


def test_an_empty_manifest_of_tokenize_is_said_as_empty(tmp_path, monkeypatch, capsys):
    """`tokenize '' ...` (an unset shell variable) read the current folder: `. is a folder`."""
    monkeypatch.chdir(tmp_path)
    assert run_app(app, ["tokenize", "", "--tokenizer", "bpe.model", "--out", "o"]) == 2
    assert capsys.readouterr().err.strip() == ("error: tokenize: an argument is empty; give the path to read "
                                               "(empty is the current folder)")
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("flag", ["--lines", "--inference-python"])
def test_an_empty_listen_input_is_said_as_empty(flag, tmp_path, monkeypatch, capsys):
    """`listen RUN --lines ''` read the current folder: `--lines .: a folder, not a file`."""
    monkeypatch.chdir(tmp_path)
    assert run_app(app, ["listen", "run", flag, ""]) == 2
    assert capsys.readouterr().err.strip() == (f"error: {flag} is empty; give the path to read (empty is the "
                                               "current folder)")
