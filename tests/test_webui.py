"""The web page's parts that need no browser: the optional extra, the command it builds, the child
process it starts (own session, SIGINT to the group, found again through the run lock), and what it
reads back from a run's records. The page itself is driven in a real browser in test_webui_browser.py.
"""

from __future__ import annotations

import ast
import fcntl
import os
import re
import socket
import subprocess
import sys
import time
from unittest import mock

import pytest
import typer
from helpers import ROOT
from typer.testing import CliRunner

from indextts_train.checkpoint.verify import verify_checkpoint
from indextts_train.cli import app
from indextts_train.errors import UserError
from indextts_train.ui.console import RunLogger
from indextts_train.ui.events import read_events
from indextts_train.ui.run_record import write_run_record
from indextts_train.ui.text_log import TextLog
from indextts_train.webui import form as forms
from indextts_train.webui import is_loopback, records, server_name
from indextts_train.webui.roots import Roots
from indextts_train.webui.runs import LOCK_NAME, RunRegistry, read_log, train_command
from indextts_train.webui.trainflags import FLAGS

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import pip._vendor.tomli as tomllib


def cli(args: list[str], env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "indextts_train", *args], capture_output=True, text=True,
                          cwd=ROOT, env={**os.environ, **(env or {})}, timeout=120)


@pytest.mark.slow  # the real CLI in a process
def test_without_gradio_webui_says_how_to_install(tmp_path) -> None:
    (tmp_path / "gradio.py").write_text("raise ImportError(\"No module named 'gradio'\")\n")
    path = os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")])
    with socket.socket() as probe:  # a free port: the port is checked first (another page may hold 7860)
        probe.bind(("127.0.0.1", 0))
        port = str(probe.getsockname()[1])
    result = cli(["webui", "--port", port], env={"PYTHONPATH": path})
    assert result.returncode == 2, result.stderr
    assert "pip install 'indextts-train[webui]'" in result.stderr and "Traceback" not in result.stderr


@pytest.mark.parametrize(("args", "says"), [(["--share"], "add --auth USER:PASS"),
                                            (["--share", "--auth", "me"], "--auth must be USER:PASS"),
                                            (["--auth", ":pw"], "--auth must be USER:PASS")])
@pytest.mark.slow  # the real CLI in a process
def test_a_public_link_needs_a_password(args, says) -> None:
    result = cli(["webui", *args])
    assert result.returncode == 2 and says in result.stderr and "Traceback" not in result.stderr


def test_the_password_is_taken_from_the_environment_and_kept_from_the_runs(monkeypatch, capsys) -> None:
    """--auth on the command line is read by any user of the machine (ps, /proc/PID/cmdline): the page takes it
    from INDEXTTS_WEBUI_AUTH, says so when it was typed, and its runs do not inherit it."""
    import indextts_train.webui as webui_package
    from indextts_train.webui import AUTH_ENV, parse_auth
    from indextts_train.webui.runs import run_environment

    given = {}
    monkeypatch.setattr(webui_package, "serve", lambda *args, **kwargs: given.update(kwargs) or 0)
    result = CliRunner().invoke(app, ["webui"], env={AUTH_ENV: "me:long-secret"})
    assert result.exit_code == 0 and given["auth"] == "me:long-secret", result.output
    monkeypatch.setenv(AUTH_ENV, "me:long-secret")
    assert parse_auth("me:long-secret", share=True) == ("me", "long-secret")
    assert capsys.readouterr().out == ""
    assert AUTH_ENV not in run_environment() and run_environment()["PYTHONUNBUFFERED"] == "1"
    monkeypatch.delenv(AUTH_ENV)
    assert parse_auth("me:typed", share=True) == ("me", "typed")
    assert capsys.readouterr().out == (f"warning: --auth on the command line: any user of this machine can read the "
                                       f"password (ps); set it as {AUTH_ENV}=USER:PASS in the environment instead\n")


def test_a_page_other_machines_can_reach_needs_a_password() -> None:
    """Refused before anything is served: one line, exit 2 (the real command, in this process)."""
    for args in (["--host", "0.0.0.0"], ["--host", "::"], ["--host", "my-box.lan"], ["--host", "192.168.1.5"],
                 ["--host", "0.0.0.0", "--share", "--no-auth-on-network"]):
        result = CliRunner().invoke(app, ["webui", *args])
        assert result.exit_code == 2 and len(result.output.strip().splitlines()) == 1, (args, result.output)
        assert re.fullmatch(r"error: (--host \S+ makes the page reachable from other machines, where anyone could "
                            r"start runs and read the --root folders: add --auth USER:PASS \(or, on a network you "
                            r"trust, --no-auth-on-network\)|--share makes the page public: add --auth .*)\n",
                            result.output), result.output
    assert not is_loopback("0.0.0.0") and is_loopback("127.0.0.2") and is_loopback("::1") and is_loopback("localhost")


@pytest.mark.slow  # the real CLI in a process
def test_a_taken_port_is_one_line_and_no_auth_on_network_must_be_said() -> None:
    with socket.socket() as taken:
        taken.bind(("0.0.0.0", 0))  # bound, not listening: the port is taken, nothing can connect
        port = str(taken.getsockname()[1])
        result = cli(["webui", "--port", port])
        assert result.returncode == 2 and "Traceback" not in result.stderr
        assert result.stderr == (f"error: --port {port}: cannot listen on 127.0.0.1:{port} (Address already in use); "
                                 "is another webui running? pass another --port\n")
        # Said in so many words, a page without a password on every interface is served (with a warning).
        result = cli(["webui", "--host", "0.0.0.0", "--no-auth-on-network", "--port", port])
        assert result.returncode == 2 and f"cannot listen on 0.0.0.0:{port}" in result.stderr
        assert result.stdout.startswith("warning: --host 0.0.0.0 --no-auth-on-network: anyone who can reach")


@pytest.mark.slow  # a fresh interpreter
def test_only_the_page_imports_gradio_and_only_the_extra_installs_it() -> None:
    importers = []
    for path in (ROOT / "indextts_train").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else (
                [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            if any(name.split(".")[0] == "gradio" for name in names):
                importers.append(path.relative_to(ROOT).as_posix())
    # __init__ imports it only to say how to install it when it is missing.
    assert sorted(set(importers)) == ["indextts_train/webui/__init__.py", "indextts_train/webui/page.py"]
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert not [d for d in project["dependencies"] if d.startswith(("gradio", "playwright"))]
    assert project["optional-dependencies"]["webui"][0].startswith("gradio")
    assert "${EXTRAS:-dev,prepare}" in (ROOT / "scripts" / "install.sh").read_text()  # what demo.sh installs
    assert "EXTRAS" not in (ROOT / "scripts" / "demo.sh").read_text()
    loaded = subprocess.run([sys.executable, "-c", "import sys, indextts_train.cli, indextts_train.train.loop, "
                             "indextts_train.webui.form, indextts_train.webui.records, indextts_train.webui.server; "
                             "print('gradio' in sys.modules)"],
                            capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert loaded.stdout.strip() == "False", loaded.stderr


def test_the_form_becomes_flags_the_cli_accepts(tmp_path) -> None:
    defaults = forms.defaults_for(str(ROOT / "configs" / "tiny.yaml"))
    assert defaults["learning_rate"] == 3.0e-3 and defaults["effective_batch_size"] == 8
    roots = Roots([tmp_path, ROOT])
    root = tmp_path.resolve()
    run = forms.RunForm(train_manifests=f"{tmp_path}/a.jsonl\n\n {tmp_path}/b.jsonl::am ",
                        output_dir=str(tmp_path / "out"), config=str(ROOT / "configs" / "tiny.yaml"),
                        val_manifests=f"{tmp_path}/v.jsonl@0.5", tokenizer=f"{tmp_path}/bpe.model",
                        base_checkpoint=f"{tmp_path}/gpt.pth",
                        hparams={**defaults, "max_steps": 7.0}, amp="off",
                        extra="--skip-bad-lines --train-scope lora --lora-rank=8")
    flags = forms.flags(run, roots, resume="auto")
    # Every value as --flag=VALUE, every path resolved: nothing typed can be read as a flag of its own.
    assert flags[:3] == [f"--train-manifest={root}/a.jsonl", f"--train-manifest={root}/b.jsonl::am",
                         f"--val-manifest={root}/v.jsonl@0.5"]
    assert "--max-steps=7" in flags and "--learning-rate=0.003" in flags
    assert flags[-5:] == ["--no-amp", "--skip-bad-lines", "--train-scope=lora", "--lora-rank=8", "--resume=auto"]
    command = typer.main.get_command(app).commands["train"]
    context = command.make_context("train", list(flags))  # every flag the page writes is one the CLI knows
    assert context.params["max_steps"] == 7 and context.params["resume"] == "auto"
    assert str(context.params["tokenizer"]) == f"{root}/bpe.model"
    assert str(context.params["base_checkpoint"]) == f"{root}/gpt.pth"
    assert context.params["train_scope"].value == "lora" and context.params["lora_rank"] == 8

    with pytest.raises(UserError, match="--max-steps must be a whole number"):
        forms.flags(forms.RunForm("a.jsonl", "out", "c.yaml", hparams={"max_steps": 2.5}), roots)
    for bad in (float("nan"), float("inf"), "7"):
        with pytest.raises(UserError, match="--seed must be a finite number"):
            forms.flags(forms.RunForm("a.jsonl", "out", "c.yaml", hparams={"seed": bad}), roots)
    with pytest.raises(UserError, match="Training manifests"):
        forms.flags(forms.RunForm(" \n", "out", "c.yaml"), roots)
    with pytest.raises(UserError, match="Other flags"):
        forms.flags(forms.RunForm("a.jsonl", "out", "c.yaml", extra="--seed-x '1"), roots)


def test_the_page_knows_every_train_gpt_flag_and_its_spellings() -> None:
    """The flag table comes from the schema; checked against the real command's options."""
    command = typer.main.get_command(app).commands["train"]
    names = {name for param in command.params for name in (*param.opts, *param.secondary_opts)
             if name.startswith("--") and name != "--help"}
    assert set(FLAGS) == names
    switches = {name for param in command.params if getattr(param, "is_flag", False)
                for name in (*param.opts, *param.secondary_opts)}
    assert {name for name, flag in FLAGS.items() if flag.kind == "switch"} == switches - {"--help"}


def wait_until(condition, what: str, timeout: float = 60) -> None:
    """Poll a condition (the child's own writes) with a deadline."""
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


CHILD = ("import signal, sys, time\n"
         "signal.signal(signal.SIGINT, lambda *_: sys.exit(130))\n"
         "print('ready', flush=True)\n"
         "time.sleep(120)\n")


@pytest.mark.slow  # starts runs in processes
def test_a_run_lives_in_its_own_session_stops_with_sigint_and_is_found_again(tmp_path) -> None:
    out = tmp_path / "out"
    registry = RunRegistry()
    launch = registry.start([sys.executable, "-c", CHILD], out)
    wait_until(lambda: "\nready\n" in read_log(launch, out), "the child to start")
    assert os.getsid(launch.pid) == launch.pid  # its own session: a closed terminal or page does not reach it
    assert registry.find(out) is launch and launch.running()
    with pytest.raises(UserError, match=f"PID {launch.pid}"):
        registry.start([sys.executable, "-c", CHILD], out)  # one run per output dir
    registry.stop(out)
    launch.process.wait(timeout=60)
    assert not launch.running() and launch.exit_code == 130
    assert read_log(launch, out).startswith("=== indextts-train webui ")

    # A run this server did not start (another server, tmux): found through the run lock's PID.
    other = subprocess.Popen([sys.executable, "-c", CHILD], stdout=subprocess.PIPE, text=True,
                             start_new_session=True)
    assert other.stdout.readline() == "ready\n"
    with open(out / LOCK_NAME, "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        lock.write(f"pid={other.pid} started=2026-01-01T00:00:00Z\n")  # the run lock's contract
        lock.flush()
        found = RunRegistry().find(out)
        assert found is not None and found.pid == other.pid and found.running()
        assert found.argv == [sys.executable, "-c", CHILD]
        os.killpg(other.pid, 2)
        assert other.wait(timeout=60) == 130
    assert RunRegistry().find(out) is None


@pytest.mark.slow  # starts the trainer in a process
def test_a_trainer_run_is_found_through_its_run_lock_after_a_server_restart(tiny_data, tmp_path) -> None:
    """The real trainer holds OUTPUT_DIR/train.lock: a page that did not start the run (the web server
    was restarted) shows it running with its PID, and Stop ends it the way Ctrl+C does."""
    out = tmp_path / "run"
    steps = 5000  # far more than the test waits for: the run is stopped mid-way
    flags = ["--train-manifest", str(tiny_data["train"]), "--config", str(tiny_data["config"]),
             "--base-checkpoint", str(tiny_data["base"]), "--output-dir", str(out), "--batch-size", "4",
             "--grad-accumulation", "2", "--num-workers", "0", "--max-steps", str(steps), "--epochs", str(steps),
             "--log-interval", "1", "--save-interval", str(10 * steps)]
    launch = RunRegistry().start(train_command(flags), out)  # the registry of the server before its restart
    try:
        wait_until(lambda: records.progress(read_events(out)) is not None, "the first step", timeout=180)
        registry = RunRegistry()  # the restarted server: no child of its own
        found = registry.find(out)
        assert found is not None and found is not launch and found.process is None
        assert found.pid == launch.pid and found.running() and found.argv == launch.argv
        assert records.status_line(found, read_events(out)).startswith(f"running (PID {launch.pid}) · step ")
        registry.stop(out)
        assert launch.process.wait(timeout=180) == 130  # finished its step and saved, as after Ctrl+C
        events = read_events(out)
        step = records.progress(events)[0]
        saved = out / f"model_step{step}.pth"
        assert not found.running() and registry.find(out) is found  # still shown, now as ended
        assert records.status_line(found, events) == (f"ended (PID {launch.pid}) · step {step}/{steps} · "
                                                      f"checkpoint {saved}")
        assert "stopped by signal" in records.notices(events)
        assert verify_checkpoint(saved).status == "COMPLETE"
    finally:
        if launch.process.poll() is None:
            os.killpg(launch.pid, 9)
            launch.process.wait()


def logger(folder, total_steps: int = 20) -> RunLogger:
    """The trainer's own logger, writing train.log and events.jsonl into `folder` as a run does."""
    text_log = TextLog()
    text_log.attach(folder)
    return RunLogger(None, total_steps, tensorboard=False, text_log=text_log)


VALUES = {"loss": 4.1, "text_loss": 5.0, "mel_loss": 3.8, "mel_top1": 0.1, "lr": 1.5e-3, "samples_per_s": 2.3}


def test_progress_plan_and_notices_come_from_the_events(tmp_path) -> None:
    log = logger(tmp_path)
    log.info("cpu (cpu): fp32, micro-batch 4 ...\n  - fp32: CPU trains in full precision.", "plan", plan={})
    log.notice("resuming from /r/latest.pth")
    log.notice("settings changed since the checkpoint:")
    log.notice("  learning_rate: 0.001 -> 0.002")
    log.warn("the learning rate changed: the schedule continues with the new peak value")
    log.train_step(4, 0, VALUES, print_line=True)
    log.saved(tmp_path / "model_step4.pth", best=False, step=4, total=20, epoch=0, sample=32)
    log.train_step(5, 1, VALUES, print_line=True)
    log.text_log.close()
    events = read_events(tmp_path)
    assert records.progress(events) == (5, 20) and records.last_saved(events) == str(tmp_path / "model_step4.pth")
    assert records.plan_text(events).splitlines()[1] == "  - fp32: CPU trains in full precision."
    assert records.notices(events).splitlines() == [
        "resuming from /r/latest.pth", "settings changed since the checkpoint:", "  learning_rate: 0.001 -> 0.002",
        "warning: the learning rate changed: the schedule continues with the new peak value"]
    assert records.progress([]) is None


def test_a_cut_or_foreign_event_line_is_skipped(tmp_path) -> None:
    log = logger(tmp_path)
    log.train_step(3, 0, VALUES, print_line=True)
    log.text_log.close()
    with open(tmp_path / "events.jsonl", "ab") as file:
        file.write(b'[1, 2]\n{"kind": 7}\n{"t": 1.0, "kind": "step", "step": 9, "to')  # a kill mid-line
    assert records.progress(read_events(tmp_path)) == (3, 20)
    with open(tmp_path / "events.jsonl", "ab") as file:  # `true` is an int to Python: no step of a run
        file.write(b'\n{"t": 2.0, "kind": "step", "step": true, "total": 20}\n')
    assert records.progress(read_events(tmp_path)) is None


def test_loss_curves_join_the_runs_tensorboard_files_by_step(tmp_path) -> None:
    from torch.utils.tensorboard import SummaryWriter

    for folder, steps in (("run_1", range(1, 6)), ("run_2", range(4, 8))):  # killed after 3, resumed at 3
        with SummaryWriter(str(tmp_path / "logs" / folder)) as writer:
            for step in steps:
                writer.add_scalar("train/loss", float(step + 10 * int(folder[-1])), step)
                writer.add_scalar("train/lr", 0.1, step)  # not a loss: not plotted
    curves = records.loss_curves(tmp_path, Roots([tmp_path]))
    assert [(s, v) for _, s, v in curves] == [(1, 11.0), (2, 12.0), (3, 13.0), (4, 24.0), (5, 25.0), (6, 26.0),
                                              (7, 27.0)]
    assert {tag for tag, _, _ in curves} == {"train/loss"}


def test_loss_curves_of_one_run_folder_drop_what_a_killed_process_logged_past_its_checkpoint(tmp_path) -> None:
    from torch.utils.tensorboard import SummaryWriter

    from indextts_train.ui.console import tensorboard_dir

    folder = tensorboard_dir(tmp_path, 0)
    assert folder == tmp_path / "logs" / "run"
    with SummaryWriter(str(folder), purge_step=0) as writer:  # killed after step 5, checkpoint at 3
        for step in range(1, 6):
            writer.add_scalar("train/loss", float(10 + step), step)
    assert tensorboard_dir(tmp_path, 3) == folder  # the resume writes into the same folder
    # A resume is a later process: its file's name (time, host, pid, a counter) sorts after the killed one's.
    # Two writers of this one process within a second are told apart by the counter alone, which sorts as
    # text (".10" before ".9"): the resumed writer is made a few seconds later, as a resume is.
    with mock.patch("time.time", return_value=time.time() + 5):
        resumed = SummaryWriter(str(folder), purge_step=4)
    with resumed as writer:
        for step in range(4, 8):
            writer.add_scalar("train/loss", float(20 + step), step)
    curves = records.loss_curves(tmp_path, Roots([tmp_path]))
    assert [(s, v) for _, s, v in curves] == [(1, 11.0), (2, 12.0), (3, 13.0), (4, 24.0), (5, 25.0), (6, 26.0),
                                              (7, 27.0)]


def test_watch_shows_a_run_finished_from_the_command_line_from_its_record(tmp_path, monkeypatch) -> None:
    """No process of this server and no lock holder: the run's own events and run.yaml tell."""
    assert records.status_line(None, []) == "no run in this output dir yet"
    first = logger(tmp_path)
    first.train_step(10, 0, VALUES, print_line=True)
    first.stopped(10, 130)
    first.text_log.close()
    stopped = records.status_line(None, read_events(tmp_path))
    assert stopped.startswith("stopped") and "step 10/20" in stopped
    second = logger(tmp_path)
    second.train_step(20, 1, VALUES, print_line=True)
    second.saved(tmp_path / "model_step20.pth", best=True, step=20, total=20, epoch=1, sample=8)
    second.done(20, 2, "best.pth is step 20 (loss 3.4)", tmp_path)
    second.text_log.close()
    status = records.status_line(None, read_events(tmp_path))
    assert status.startswith("finished (read from the run's events") and "step 20/20" in status
    assert f"checkpoint {tmp_path / 'model_step20.pth'}" in status
    assert records.recorded_command(tmp_path) == ""
    monkeypatch.setattr(sys, "argv", ["/venv/bin/train-gpt", "--output-dir", "/r", "--max-steps", "20"])
    write_run_record(tmp_path, {}, {}, {}, 0.0)
    assert records.recorded_command(tmp_path) == "train-gpt --output-dir /r --max-steps 20"


def test_no_module_of_the_page_matches_log_wording() -> None:
    """The page reads the trainer's events, never its prose: no regular expression in webui/."""
    for path in (ROOT / "indextts_train" / "webui").glob("*.py"):
        assert "import re\n" not in path.read_text(), path.name


def test_the_tokenizer_box_names_both_kinds() -> None:
    source = (ROOT / "indextts_train" / "webui" / "page.py").read_text()
    assert 'label="Tokenizer (.model or .tiktoken)"' in source and "Tokenizer (.model)\"" not in source


def test_an_ipv6_literal_is_bound_bare_and_given_to_gradio_in_brackets() -> None:
    """Gradio builds the page's URL as http://NAME:PORT/ (bare, `::1` made "http://::1:7860/": its traceback)
    and strips the brackets to bind; a socket takes the address bare (`[::1]` was "not an address")."""
    for host in ("::1", "[::1]", " ::1 "):
        assert server_name(host) == ("::1", "[::1]"), host
    assert server_name("::") == ("::", "[::]")
    for host in ("127.0.0.1", "0.0.0.0", "localhost", "my-box.lan"):
        assert server_name(host) == (host, host)
