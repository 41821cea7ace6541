"""The training page in a real Chromium: set up the demo run, start, stop, reload, resume, export.

The page is served by the real `indextts-train webui` command; Playwright drives the Debian
`chromium` (scripts/test.sh installs it, and the `webui` and `browser-test` extras). The run the page
stops and resumes must end bit-identical to the same command run uninterrupted from the CLI.
Screenshots of every stage are written to the test's tmp folder (screenshots/), or to
$WEBUI_SCREENSHOTS when set.
"""

from __future__ import annotations

import contextlib
import os
import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import threading
from pathlib import Path

import pytest
import torch
from helpers import ROOT

from indextts_train.checkpoint.files import load_checkpoint
from indextts_train.config.settings import load_config
from indextts_train.data.demo_data import make_demo_dataset
from indextts_train.demo import TINY_CONFIG, make_base_checkpoint

pytestmark = pytest.mark.slow  # every test here trains a tiny run or starts the CLI: seconds each

MAX_STEPS = 12
PAUSE_STEP = 3  # the page run stops itself here (SIGSTOP); the stop button is pressed while it waits
# Longest wait for one page state: a loaded 2-core machine trains the tiny demo at about 1-2 s a step.
VIEWPORT = {"width": 1400, "height": 1100}
TIMEOUT_MS = int(os.environ.get("WEBUI_TEST_TIMEOUT_MS", 240_000))


def _chromium() -> str:
    path = shutil.which("chromium") or shutil.which("chromium-browser")
    if path is None:
        pytest.fail("Chromium not found: `bash scripts/test.sh` installs it (apt-get install chromium)")
    return path


@pytest.fixture
def browser():
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        pytest.fail("playwright is missing: `bash scripts/test.sh` installs it "
                    "(pip install -e '.[webui,browser-test]')")
    with sync_playwright() as playwright:
        chromium = playwright.chromium.launch(executable_path=_chromium())
        yield chromium
        chromium.close()


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture
def server_url(tmp_path):
    """`indextts-train webui` as a user starts it; its one ready line gives the address."""
    log = open(tmp_path / "webui.log", "w")  # noqa: SIM115 - closed below
    # The runs this server starts freeze themselves (SIGSTOP) once step PAUSE_STEP is logged, so the
    # test meets the run mid-way however fast the machine is (indextts_train.files.faults).
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "INDEXTTS_TRAIN_PAUSE_AT": f"step_logged@{PAUSE_STEP}"}
    # The page may touch the test's folder (data, run, export) and the checkout (configs/tiny.yaml).
    roots = ["--root", str(tmp_path), "--root", str(ROOT)]
    proc = subprocess.Popen([sys.executable, "-m", "indextts_train", "webui", "--port", str(_free_port()), *roots],
                            cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env=env, start_new_session=True)
    first = ""
    for line in proc.stdout:
        log.write(line)
        if line.startswith("indextts-train webui: "):
            first = line
            break
    if not first:
        proc.wait()
        log.close()
        pytest.fail(f"webui did not start: {(tmp_path / 'webui.log').read_text()[-2000:]}")
    drain = threading.Thread(target=lambda: [log.write(line) for line in proc.stdout], daemon=True)
    drain.start()
    yield first.split()[2]
    proc.terminate()
    proc.wait(timeout=30)
    drain.join(timeout=10)
    log.close()


def _demo_inputs(folder: Path) -> dict:
    """The demo's own dataset, tokenizer and base checkpoint (indextts_train.demo), smaller."""
    paths = make_demo_dataset(folder / "data", gpt_cfg=load_config(TINY_CONFIG).gpt, n_train=32, n_val=8)
    make_base_checkpoint(TINY_CONFIG, folder / "base_gpt.pth")
    return {"train_manifests": str(paths["train_manifest"]), "val_manifests": str(paths["val_manifest"]),
            "tokenizer": str(paths["tokenizer"]), "base_checkpoint": str(folder / "base_gpt.pth")}


def _new_page(browser, context=None):
    """A tab in `context` (one visitor's browser: its storage is shared by its tabs), else a new visitor."""
    page = context.new_page() if context else browser.new_page(viewport=VIEWPORT)
    page.set_default_timeout(TIMEOUT_MS)
    return page


def _fill(page, elem_id: str, value) -> None:
    page.locator(f"#{elem_id} textarea, #{elem_id} input").first.fill(str(value))


def _value(page, elem_id: str) -> str:
    return page.locator(f"#{elem_id} textarea, #{elem_id} input").first.input_value()


def _wait_value(page, elem_id: str, pattern: str) -> re.Match:
    """Wait until the field's text matches `pattern` (Playwright polls; no fixed sleeps)."""
    from playwright.sync_api import expect

    field = page.locator(f"#{elem_id} textarea, #{elem_id} input").first
    expect(field).to_have_value(re.compile(pattern, re.S), timeout=TIMEOUT_MS)
    return re.search(pattern, field.input_value(), re.S)


def _tensors_equal(a: dict, b: dict) -> None:
    assert a["model"].keys() == b["model"].keys()
    for key in a["model"]:
        assert torch.equal(a["model"][key], b["model"][key]), key
    state_a, state_b = a["optimizer"]["state"], b["optimizer"]["state"]
    assert state_a.keys() == state_b.keys() and state_a
    for index in state_a:
        for name, value in state_a[index].items():
            assert torch.equal(value, state_b[index][name]), (index, name)


@pytest.fixture
def leftovers():
    """Process groups to kill if the test fails half-way (the runs live in their own sessions)."""
    groups: list[int] = []
    yield groups
    for group in groups:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(group, signal.SIGCONT)
            os.killpg(group, signal.SIGKILL)


def _set_up(page, server_url: str, inputs: dict, run_dir: Path) -> str:
    """Fill the form for the demo data; check the data and the hardware plan; return the command."""
    page.goto(server_url)
    _fill(page, "config", TINY_CONFIG)
    _wait_value(page, "learning_rate", r"^0\.003$")  # the config's own values are now the defaults
    for elem_id, value in {**inputs, "output_dir": run_dir, "max_steps": MAX_STEPS, "epochs": 1000,
                           "log_interval": 1, "val_interval": 4, "save_interval": 4}.items():
        _fill(page, elem_id, value)
    command = _wait_value(page, "command", rf"--output-dir=\S+ .*--max-steps={MAX_STEPS} .*--save-interval=4").string
    page.locator("#hardware").click()  # what auto mode picks here for these settings
    _wait_value(page, "report", r"fp32, micro-batch 4 x accumulation 2 x 1 process\(es\) = effective batch 8")
    page.locator("#check_data").click()
    _wait_value(page, "report", r"40 lines in 2 manifest\(s\): 40 ok, OK.*\(exit 0\)$")
    return command


def _reference_run(argv: list[str], output_dir: Path) -> subprocess.Popen:
    """The same command from the CLI, uninterrupted, in another output dir (runs while the page works)."""
    assert argv[:4] == [sys.executable, "-m", "indextts_train", "train"]
    same = [f"--output-dir={output_dir}" if arg.startswith("--output-dir=") else arg for arg in argv]
    return subprocess.Popen(same, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT,
                            start_new_session=True)


def test_page_runs_stops_resumes_and_matches_the_cli(tmp_path, browser, server_url, leftovers) -> None:
    from playwright.sync_api import expect

    shots = Path(os.environ.get("WEBUI_SCREENSHOTS") or tmp_path / "screenshots")
    shots.mkdir(parents=True, exist_ok=True)
    visitor = browser.new_context(viewport=VIEWPORT)  # this user's browser; another context is another visitor
    page = _new_page(browser, visitor)

    def shot(name: str) -> None:
        page.screenshot(path=str(shots / f"{name}.png"), full_page=True)

    run_dir = tmp_path / "page_run"
    command = _set_up(page, server_url, _demo_inputs(tmp_path / "demo"), run_dir)
    reference = _reference_run(shlex.split(command), tmp_path / "cli_run")
    leftovers.append(reference.pid)
    shot("01_setup_checked")

    page.locator("#start").click()
    running = _wait_value(page, "status", rf"running \(PID (\d+)\) · step (\d+)/{MAX_STEPS}")
    pid = int(running.group(1))
    leftovers.append(pid)
    # The counter follows the run up to the step where it froze itself (PAUSE_STEP).
    _wait_value(page, "status", rf"running \(PID {pid}\) · step {PAUSE_STEP}/{MAX_STEPS}")
    shot("02_running")

    page.close()  # the tab goes away; the run does not
    stranger = _new_page(browser)  # another visitor gets a blank form, never this user's last run
    stranger.goto(server_url)
    _wait_value(stranger, "status", r"^no output dir$")
    assert _value(stranger, "output_dir") == "" and _value(stranger, "train_manifests") == ""
    stranger.close()
    page = _new_page(browser, visitor)
    page.goto(server_url)
    _wait_value(page, "output_dir", re.escape(str(run_dir)))
    _wait_value(page, "status", rf"running \(PID {pid}\) · step {PAUSE_STEP}/{MAX_STEPS}")
    shot("03_reopened_while_running")

    page.locator("#stop").click()
    _wait_value(page, "message", rf"sent SIGINT to the process group of PID {pid}")
    os.killpg(pid, signal.SIGCONT)  # the pending SIGINT arrives: finish the step, save, exit 130
    stopped = _wait_value(page, "status", rf"exited with code 130 · step (\d+)/{MAX_STEPS} · checkpoint (\S+)")
    stop_step, saved = int(stopped.group(1)), Path(stopped.group(2))
    assert stop_step == PAUSE_STEP and saved == run_dir / f"model_step{stop_step}.pth" and saved.is_file()
    _wait_value(page, "notices", rf"stopped by signal after step {stop_step}")
    shot("04_stopped")

    page.reload()  # the form of the run comes back, and so does its state
    _wait_value(page, "output_dir", re.escape(str(run_dir)))
    _wait_value(page, "status", r"exited with code 130")
    expect(page.locator("#checkpoints")).to_contain_text(re.compile(rf"model_step{stop_step}\.pth\s*COMPLETE"),
                                                        timeout=TIMEOUT_MS)
    shot("05_reloaded")

    page.locator("#resume").click()  # "Resume from: auto"
    _wait_value(page, "running_command", re.escape(command) + r" --resume=auto$")
    _wait_value(page, "status", rf"exited with code 0 · step {MAX_STEPS}/{MAX_STEPS} · checkpoint \S+")
    _wait_value(page, "notices", r"resuming from \S+")
    # The checkpoints table's row of the last step file, which latest.pth and best.pth are hard links of.
    last_row = rf"model_step{MAX_STEPS}\.pth\s*COMPLETE\s*{MAX_STEPS}\s*\d+\s*[\d.]+\s*latest\.pth"
    expect(page.locator("#checkpoints")).to_contain_text(re.compile(last_row), timeout=TIMEOUT_MS)
    shot("06_finished")

    page.locator("#export").click()
    _wait_value(page, "export_report", r"wrote \S+bpe\.model\n(.*\n)*\(exit 0\)")  # export copies the tokenizer
    shot("07_exported")
    for name in ("gpt.pth", "config.yaml", "bpe.model"):  # in the checkpoint's own folder: none replaced
        assert (run_dir / "export" / f"model_step{MAX_STEPS}" / name).is_file(), name

    assert reference.wait(timeout=TIMEOUT_MS / 1000) == 0
    _tensors_equal(load_checkpoint(run_dir / "latest.pth"), load_checkpoint(tmp_path / "cli_run" / "latest.pth"))


def test_page_refuses_in_the_browser_what_would_leave_its_root(tmp_path, tmp_path_factory, browser,
                                                               server_url) -> None:
    """What a visitor types into the page: option-like values, outside paths, links out of the root,
    a NUL byte. Each is refused with one line on the page, and nothing outside the root is read or
    changed (the server's roots are tmp_path and the checkout)."""
    outside = tmp_path_factory.mktemp("outside")
    secret = "outside-secret-5e1d"
    for name in ("victim.jsonl", "train.log", "model_step3.pth"):
        (outside / name).write_text(f"{secret} {name}\n")
    run = tmp_path / "linked_run"
    run.mkdir()
    (run / "train.log").symlink_to(outside / "train.log")
    (run / "model_step3.pth").symlink_to(outside / "model_step3.pth")
    (tmp_path / "t.jsonl").write_text("")
    before = {p.name: (p.read_bytes(), p.stat().st_mtime_ns) for p in outside.iterdir()}
    page = _new_page(browser)
    page.goto(server_url)
    _fill(page, "config", TINY_CONFIG)
    _fill(page, "output_dir", tmp_path / "fresh_run")
    _fill(page, "train_manifests", f"{tmp_path}/t.jsonl\n--write-clean={outside}/victim.jsonl")
    _fill(page, "tokenizer", "--help")
    _wait_value(page, "command", r"^\(not ready\) Training manifests '--write-clean=.*': starts with '-'")
    page.locator("#check_data").click()
    _wait_value(page, "report", r"^error: Manifests '--write-clean=\S+': starts with '-', which a command would "
                                r"read as an option")
    _fill(page, "train_manifests", f"{tmp_path}/t.jsonl")
    page.locator("#check_tokenizer").click()
    _wait_value(page, "report", r"^error: Tokenizer '--help': starts with '-'")
    _fill(page, "tokenizer", f"{tmp_path}/../{outside.name}/victim.jsonl")
    page.locator("#check_tokenizer").click()
    _wait_value(page, "report", r"^error: Tokenizer \S+: outside the folders this page may touch")

    _fill(page, "tokenizer", "")
    _fill(page, "output_dir", run)
    _wait_value(page, "log", r"^train\.log not read: \S+: a symbolic link")
    _wait_value(page, "notices", r"not used \(leads outside the folders this page may touch\): train\.log -> ")
    from playwright.sync_api import expect

    expect(page.locator("#checkpoints")).to_contain_text(re.compile(r"model_step3\.pth\s*REFUSED"), timeout=TIMEOUT_MS)
    page.locator("#start").click()
    _wait_value(page, "message", r"^error: Output dir \S+: holds 2 symbolic link\(s\) leading outside")
    _fill(page, "output_dir", tmp_path / "fresh_run")
    _fill(page, "extra_flags", f"--from-run {outside}/run.yaml")
    page.locator("#start").click()
    _wait_value(page, "message", r"^error: Other flags --from-run \S+: outside the folders this page may touch")
    _fill(page, "output_dir", f"{tmp_path}/fresh\x00run")
    _wait_value(page, "status", r"^error: Output dir: holds a NUL byte")

    assert secret not in page.content()  # nothing read outside the root reached the page
    assert {p.name: (p.read_bytes(), p.stat().st_mtime_ns) for p in outside.iterdir()} == before
    assert not (tmp_path / "fresh_run").exists() and sorted(p.name for p in run.iterdir()) == [
        "model_step3.pth", "train.log"]
