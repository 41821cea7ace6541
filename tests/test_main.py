"""The entry points: a Ctrl+C while the commands still import is one line and exit 130, not a traceback."""

from __future__ import annotations

import signal
import subprocess
import sys
import time

import pytest

from indextts_train import __main__ as entry
from indextts_train import cli


def test_an_interrupt_that_escapes_a_command_is_one_line(monkeypatch, capsys) -> None:
    def interrupted() -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(cli, "main", interrupted)
    with pytest.raises(SystemExit) as exit_info:
        entry.main()
    assert exit_info.value.code == 130
    assert capsys.readouterr().err == "interrupted (Ctrl+C)\n"


@pytest.mark.slow
@pytest.mark.parametrize("after", [0.3, 0.6, 0.9])
def test_ctrl_c_while_the_commands_import_is_one_line(tmp_path, after) -> None:
    """A real process, interrupted while it imports torch and the commands (about the first second)."""
    proc = subprocess.Popen([sys.executable, "-m", "indextts_train", "checkpoints", str(tmp_path)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    time.sleep(after)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    assert "Traceback" not in err, err
    # before Python installs its handler the default one ends it (-2); then our line and 130; a run that
    # finished first (a fast machine) exits 0
    assert proc.returncode in (-signal.SIGINT, 130, 0), (proc.returncode, err)
    assert proc.returncode != 130 or err == "interrupted (Ctrl+C)\n"


def test_an_interrupt_inside_a_command_is_one_line(monkeypatch, capsys) -> None:
    """Past the imports, Typer caught the Ctrl+C itself and ended the command with 130 and no word."""
    from indextts_train.checkpoint import verify

    def interrupted(path):
        raise KeyboardInterrupt

    monkeypatch.setattr(verify, "verify_checkpoint", interrupted)
    assert cli.run_app(cli.app, ["verify", "/nowhere/x.pth"]) == 130
    assert capsys.readouterr().err == "interrupted (Ctrl+C)\n"


@pytest.mark.parametrize("where", ["group", "command"])
def test_an_interrupt_while_the_command_line_is_read_is_one_line(monkeypatch, capsys, where) -> None:
    """A Ctrl+C about 0.3 s after the start landed in Click's reading of the command line, where Typer ended the
    process with 130 and no word (1 of 20 runs of the test above, on a busy machine)."""
    from typer.core import TyperCommand, TyperGroup

    def interrupted(self, ctx, args):
        raise KeyboardInterrupt

    monkeypatch.setattr(TyperGroup if where == "group" else TyperCommand, "parse_args", interrupted)
    assert cli.run_app(cli.app, ["checkpoints", "somewhere"]) == 130
    assert capsys.readouterr().err == "interrupted (Ctrl+C)\n"


@pytest.mark.slow  # starts the interpreter
def test_the_cli_module_run_as_a_program_runs_the_commands(tmp_path) -> None:
    """`python -m indextts_train.cli ...` (the form torchrun's -m takes) imported the commands, ran none and
    exited 0; it is `python -m indextts_train ...`: a command, or train-gpt's flags."""
    def run(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "indextts_train.cli", *args], capture_output=True, text=True,
                              cwd=tmp_path, timeout=120)

    refused = run("hardware", "--train-scope=x")
    assert refused.returncode == 2 and "--train-scope: 'x' is not one of" in refused.stderr
    flags = run("--train-manifest", str(tmp_path / "none.jsonl"), "--output-dir", str(tmp_path / "run"))
    assert flags.returncode == 2 and "none.jsonl" in flags.stderr, flags.stderr
