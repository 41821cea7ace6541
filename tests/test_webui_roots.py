"""The web page is confined: every path it is given resolves (symlinks followed) inside a --root, or
the action is refused with one line; Stop signals only a process the page started or a train run of
that very output dir (its command line, read from /proc), never whatever PID a lock file names."""

from __future__ import annotations

import fcntl
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from indextts_train.errors import UserError
from indextts_train.webui.page import PageServer
from indextts_train.webui.roots import Roots
from indextts_train.webui.runs import LOCK_NAME, RunRegistry, _is_train_command, is_train_run_of


@pytest.fixture()
def folders(tmp_path: Path) -> dict[str, Path]:
    root, outside = tmp_path / "root", tmp_path / "outside"
    for folder in (root / "run", outside):
        folder.mkdir(parents=True)
    (outside / "bpe.model").write_bytes(b"not ours to copy")
    (root / "link").symlink_to(outside)  # inside by name, outside once followed
    return {"root": root, "outside": outside}


def test_paths_resolve_inside_a_root_or_are_refused(folders) -> None:
    roots = Roots([folders["root"]])
    assert roots.inside(folders["root"] / "run" / "gpt.pth", "-o") == folders["root"].resolve() / "run" / "gpt.pth"
    for path in (folders["outside"] / "bpe.model", folders["root"] / "link" / "bpe.model",
                 folders["root"] / ".." / "outside"):
        with pytest.raises(UserError, match="outside the folders this page may touch"):
            roots.inside(path, "Tokenizer")
    assert Roots([folders["root"], folders["outside"]]).inside(folders["root"] / "link", "x") == \
        folders["outside"].resolve()


@pytest.mark.parametrize("argv", [["--tokenizer", "{out}/bpe.model"], ["--tokenizer={out}/bpe.model"],
                                  ["--train-manifest", "{out}/am.jsonl::am@0.5"], ["--resume", "{out}/x.pth"],
                                  ["--output-dir", "{root}/link/run"], ["--from-run", "{out}/run.yaml"]])
def test_every_path_flag_of_a_run_is_checked(folders, argv) -> None:
    argv = [arg.format(out=folders["outside"], root=folders["root"]) for arg in argv]
    with pytest.raises(UserError, match="outside the folders"):
        Roots([folders["root"]]).check_flags(["--config", str(folders["root"] / "c.yaml"), *argv])
    Roots([folders["root"]]).check_flags(["--resume", "auto", "--output-dir", str(folders["root"] / "run")])


def test_the_page_refuses_a_tokenizer_or_export_folder_outside_the_root(folders, monkeypatch) -> None:
    server = PageServer(Roots([folders["root"]]))
    ran: list = []
    monkeypatch.setattr(server, "run_cli", lambda args: ran.append(args) or "(exit 0)")
    checkpoint, run = str(folders["root"] / "run" / "latest.pth"), str(folders["root"] / "run")
    tokenizer = server.export(checkpoint, "", run, str(folders["outside"] / "bpe.model"))
    assert tokenizer.startswith("error: Tokenizer") and "outside the folders" in tokenizer
    linked = server.export(checkpoint, "", run, str(folders["root"] / "link" / "bpe.model"))
    assert "outside the folders" in linked
    target = server.export(checkpoint, str(folders["outside"] / "export"), run, "")
    assert target.startswith("error: Export dir") and "outside the folders" in target
    assert ran == [] and sorted(p.name for p in folders["outside"].iterdir()) == ["bpe.model"]
    # Inside the root: export gets the run's config and tokenizer (it copies the tokenizer itself).
    (folders["root"] / "bpe.model").write_bytes(b"x")
    server.export(checkpoint, "", run, str(folders["root"] / "bpe.model"), str(folders["root"] / "c.yaml"))
    assert ran[0][ran[0].index("--config") + 1] == str(folders["root"].resolve() / "c.yaml")
    assert ran[0][ran[0].index("--tokenizer") + 1] == str(folders["root"].resolve() / "bpe.model")
    assert "--force" in ran[0]  # the page's own OUTPUT_DIR/export: the new export replaces the last
    server.export(checkpoint, str(folders["root"] / "mine"), run, "")
    assert "--force" not in ran[1]  # a folder the user named is never overwritten


def test_the_page_watches_and_starts_nothing_outside_the_root(folders, monkeypatch) -> None:
    server = PageServer(Roots([folders["root"]]))
    monkeypatch.setattr(server.registry, "start", lambda *a: pytest.fail("a run was started"))
    assert "outside the folders" in server.watch(str(folders["outside"]))[0]
    assert "outside the folders" in server.stop(str(folders["outside"]))
    form = [str(folders["root"] / "t.jsonl"), "", "", str(folders["root"] / "c.yaml"), "",
            str(folders["root"] / "run"), *([None] * 17), "auto", f"--base-checkpoint {folders['outside']}/gpt.pth"]
    assert "outside the folders" in server.start(None, *form)


def hold_forged_lock(folder: Path, pid: int):
    lock = open(folder / LOCK_NAME, "w")  # noqa: SIM115 - held until the test closes it
    fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    lock.write(f"pid={pid} started=2026-01-01T00:00:00Z\n")
    lock.flush()
    return lock


def test_stop_does_not_signal_a_process_a_forged_lock_names(folders) -> None:
    bystander = subprocess.Popen(["sleep", "60"], start_new_session=True)
    lock = hold_forged_lock(folders["root"] / "run", bystander.pid)
    try:
        with pytest.raises(UserError, match=f"PID {bystander.pid}, which is not a train-gpt run"):
            RunRegistry().stop(folders["root"] / "run")
        message = PageServer(Roots([folders["root"]])).stop(str(folders["root"] / "run"))
        assert message.startswith("error: ") and "was not signalled" in message
        time.sleep(0.3)
        assert bystander.poll() is None  # SIGINT would have ended sleep
    finally:
        lock.close()
        bystander.kill()
        bystander.wait()


def test_a_train_run_of_that_output_dir_is_recognised_by_its_command_line(tmp_path) -> None:
    script = tmp_path / "train-gpt"
    script.write_text("import time\ntime.sleep(60)\n")
    (tmp_path / "run").mkdir()
    process = subprocess.Popen([sys.executable, str(script), "--output-dir", "run"], cwd=tmp_path)
    try:
        deadline = time.monotonic() + 10
        while not Path(f"/proc/{process.pid}/cmdline").read_bytes().count(b"--output-dir"):
            assert time.monotonic() < deadline
            time.sleep(0.05)
        assert is_train_run_of(process.pid, tmp_path / "run")  # relative to the process's own folder
        assert not is_train_run_of(process.pid, tmp_path)
        assert not is_train_run_of(os.getpid(), tmp_path / "run")  # pytest is no train run
        process.send_signal(signal.SIGINT)
    finally:
        process.kill()
        process.wait()


@pytest.mark.parametrize(("argv", "is_train"), [
    (["/venv/bin/python", "/venv/bin/train-gpt", "--output-dir", "r"], True),
    (["python", "-m", "indextts_train", "train", "--output-dir", "r"], True),
    (["python", "-u", "-m", "indextts_train", "--train-manifest", "t.jsonl"], True),  # torchrun's ranks
    (["python", "trainers/train_gpt_v2.py", "--output-dir", "r"], True),
    (["python", "-m", "indextts_train", "export", "r/latest.pth"], False),
    (["sleep", "60"], False),
])
def test_which_command_lines_are_train_runs(argv, is_train) -> None:
    assert _is_train_command(argv) == is_train
