"""A fourth probe of the web page, as an attacker and as a confused user would use it: each test is one
thing a handler did wrong (a traceback where a line was due, a second run started into one folder, work
or reads without bound, another program's command line shown), called as the page calls it."""

from __future__ import annotations

import fcntl
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from helpers import ROOT

from indextts_train.errors import UserError
from indextts_train.webui import form as forms
from indextts_train.webui import records, runs
from indextts_train.webui.roots import Roots
from indextts_train.webui.runs import LOCK_NAME, RunRegistry
from indextts_train.webui.server import REPORT_CHARS, PageServer


@pytest.fixture()
def root(tmp_path: Path) -> Path:
    folder = tmp_path / "root"
    (folder / "run").mkdir(parents=True)
    (folder / "t.jsonl").write_text("")
    (folder / "c.yaml").write_bytes((ROOT / "configs" / "tiny.yaml").read_bytes())
    return folder


def _form(root: Path, numbers: dict | None = None, **paths: str) -> list:
    values = {"train": f"{root}/t.jsonl", "val": "", "tokenizer": "", "config": f"{root}/c.yaml", "base": "",
              "output": f"{root}/run", **paths}
    given = numbers or {}
    return [*values.values(), *(given.get(name) for name in forms.MAIN_FIELDS), "auto", ""]


def _one_line(said: str) -> None:
    assert said.startswith(("error: ", "(not ready) ")) and "\n" not in said, said


def test_a_tilde_naming_no_user_is_one_line_not_a_traceback(root) -> None:
    """Path.expanduser() raised RuntimeError on ~USER of no user: every handler answered with a traceback."""
    server = PageServer(Roots([root]))
    value = "~no-such-user-4b1d/run"
    for said in (server.watch(value)[0], server.stop(value), server.preview(*_form(root, output=value)),
                 server.start(None, *_form(root, output=value), None)[0], server.preview(*_form(root, tokenizer=value)),
                 server.export(value, "", str(root / "run"), "")):
        _one_line(said)
        assert "there is no user 'no-such-user-4b1d' here to expand ~no-such-user-4b1d for" in said, said
    extra = _form(root)[:-1] + [f"--listen-inference-python={value}/bin/python --listen-asr-model={value}"]
    _one_line(server.preview(*extra))


def test_a_name_longer_than_the_file_system_allows_is_one_line_in_watch_and_stop(root) -> None:
    """ENAMETOOLONG came out of Watch (once a second, into the server's log) and Stop as an OSError."""
    server = PageServer(Roots([root]))
    value = str(root / ("a" * 300))
    for said in (server.watch(value)[0], server.stop(value)):
        _one_line(said)
        assert "a name in it is longer than the file system allows" in said


def test_a_number_past_a_floats_range_is_one_line(root) -> None:
    """A JSON integer has no size limit: 10**400 in a number box raised OverflowError in preview and start."""
    server = PageServer(Roots([root]))
    for name in ("epochs", "learning_rate"):
        values = _form(root, {name: 10**400})
        for said in (server.preview(*values), server.hardware(*values), server.start(None, *values, None)[0]):
            _one_line(said)
            assert f"{forms.flag_name(name)}: a number of 1329 bits is beyond any setting's range" in said


@pytest.mark.slow  # starts (sleep) processes
def test_start_and_resume_at_once_start_one_run_into_the_folder(root, monkeypatch) -> None:
    """Start and Resume are two events Gradio runs at once: both found the folder free and each started a run."""
    real_popen = subprocess.Popen

    def slow_popen(*args, **kwargs):  # the time a real start takes, so both clicks are in it
        time.sleep(0.3)
        return real_popen(*args, **kwargs)

    monkeypatch.setattr(runs.subprocess, "Popen", slow_popen)
    registry, folder, said = RunRegistry(), (root / "run").resolve(), []
    barrier = threading.Barrier(2)

    def click() -> None:
        barrier.wait()
        try:
            said.append(registry.start(["sleep", "30"], folder))
        except UserError as exc:
            said.append(str(exc))

    threads = [threading.Thread(target=click) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    started = [launch for launch in said if isinstance(launch, runs.Launch)]
    try:
        assert len(started) == 1, said
        assert any(isinstance(s, str) and "is already training in" in s for s in said), said
        assert (folder / "train.log").read_text().count(runs.HEADER) == 1
    finally:
        for launch in started:
            launch.process.kill()
            launch.process.wait()


@pytest.mark.slow  # the old code started a process here
def test_a_run_that_holds_the_lock_but_is_still_starting_is_not_joined_by_a_second(root) -> None:
    folder = (root / "run").resolve()
    with open(folder / LOCK_NAME, "w") as lock:  # held, no PID written yet: a run starting
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        with pytest.raises(UserError, match=f"a run is starting in {folder} \\(it holds {LOCK_NAME}\\)"):
            RunRegistry().start(["sleep", "30"], folder)
    assert not (folder / "train.log").exists()


@pytest.mark.slow  # the exec of an over-long command line fails after a fork
def test_a_command_line_the_system_cannot_start_is_one_line(root) -> None:
    """E2BIG from Popen came out of Start as an OSError."""
    with pytest.raises(UserError, match=r"the run could not be started \(Argument list too long\); nothing runs"):
        RunRegistry().start(["sleep", "x" * 200_000], (root / "run").resolve())


def test_a_manifests_box_of_many_lines_is_refused_before_any_work(root, monkeypatch) -> None:
    """100,000 lines took 8 s a keystroke to preview, and Check data raised E2BIG (a traceback)."""
    server = PageServer(Roots([root]))
    monkeypatch.setattr(server, "run_cli", lambda args: pytest.fail("check-data ran"))
    many = "\n".join([f"{root}/t.jsonl"] * 1001)
    for said in (server.preview(*_form(root, train=many)), server.check_data(*_form(root, val=many)),
                 server.start(None, *_form(root, train=many), None)[0]):
        _one_line(said)
        assert "1,001 lines; give at most 1,000 manifests (merge them into fewer files)" in said
    long = "/".join(["a"] * 131_073)  # one line of 262,145 characters
    assert "262,145 characters; give at most 262,144" in server.preview(*_form(root, train=long))


def test_a_fifo_or_a_file_in_the_output_dirs_place_is_named_at_start(root) -> None:
    """A FIFO train.log was said as 'No such device or address'; an output dir that is a file as a link swapped
    in since the check."""
    server = PageServer(Roots([root]))
    os.mkfifo(root / "run" / "train.log")
    said = server.start(None, *_form(root), None)[0]
    assert said == f"error: {(root / 'run' / 'train.log').resolve()}: a FIFO (named pipe), not a regular file; " \
                   "the page does not use it"
    for output in (root / "c.yaml", root / "c.yaml" / "run"):
        said = server.start(None, *_form(root, output=str(output)), None)[0]
        assert f": {(root / 'c.yaml').resolve()} is a file, not a folder; give a folder for the run" in said, said


def test_the_checkpoint_table_reads_the_newest_files_once_each(root, monkeypatch) -> None:
    """3,000 files named as checkpoints took the table 35 s (hard links paired by comparing every two), every 3 s
    the page looked, and every look verified every file again (a full read of each)."""
    run = (root / "run").resolve()
    for step in range(207):
        (run / f"model_step{step}.pth").write_bytes(b"not a checkpoint")
    reads = []
    real = records.run_checkpoint_rows
    monkeypatch.setattr(records, "run_checkpoint_rows", lambda *a, **k: reads.append(1) or real(*a, **k))
    roots = Roots([root])
    rows = records.checkpoint_rows(run, roots)
    assert {Path(row["file"]).name for row in rows} == {f"model_step{n}.pth" for n in range(7, 207)}  # the newest 200
    assert records.checkpoint_rows(run, roots) == rows and len(reads) == 1  # nothing changed: not read again
    (run / "model_step206.pth").write_bytes(b"rewritten, longer than it was")
    records.checkpoint_rows(run, roots)
    assert len(reads) == 2
    notices = PageServer(roots).watch(str(run))[4]
    assert (f"checkpoints: 7 older checkpoint file(s) not listed; the page lists the newest 200; "
            f"`indextts-train checkpoints {run}` lists them all") in notices


def _wait_for_argv(pid: int, word: bytes) -> None:
    deadline = time.monotonic() + 10
    while word not in Path(f"/proc/{pid}/cmdline").read_bytes():
        assert time.monotonic() < deadline
        time.sleep(0.05)


@pytest.mark.slow  # starts a bystander process
def test_watch_shows_no_command_line_of_a_process_a_forged_lock_names(root) -> None:
    """A lock names whatever PID its writer chose: Watch showed that process's command line (another user's
    program, with the secrets on its command line), read from /proc: outside the roots."""
    bystander = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)", "secret-password-9c1e"],
                                 start_new_session=True)
    _wait_for_argv(bystander.pid, b"secret")
    lock = open(root / "run" / LOCK_NAME, "w")  # noqa: SIM115 - held until the test closes it
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        lock.write(f"pid={bystander.pid} started=2026-01-01T00:00:00Z\n")
        lock.flush()
        command = PageServer(Roots([root])).watch(str(root / "run"))[1]
        assert "secret" not in command
        assert command == (f"(PID {bystander.pid}, named by {LOCK_NAME}, is not a train run of this folder: its "
                           "command line is not shown)")
    finally:
        lock.close()
        bystander.kill()
        bystander.wait()


@pytest.mark.slow  # starts a stand-in train run
def test_stop_signals_a_run_in_the_pages_own_process_group_not_the_page(tmp_path) -> None:
    """A run started beside the page in one process group (a script's `train-gpt ... & indextts-train webui`):
    Stop sent SIGINT to the whole group, the page's own process with it."""
    script, run = tmp_path / "train-gpt", tmp_path / "run"
    run.mkdir()
    script.write_text("import fcntl, os, sys, time\n"
                      f"lock = open({str(run / LOCK_NAME)!r}, 'w')\n"
                      "fcntl.flock(lock, fcntl.LOCK_EX)\n"
                      "lock.write(f'pid={os.getpid()} started=2026-01-01T00:00:00Z\\n'); lock.flush()\n"
                      "print('ready', flush=True)\n"
                      "time.sleep(60)\n")
    got: list[int] = []
    before = signal.signal(signal.SIGINT, lambda number, frame: got.append(number))
    process = subprocess.Popen([sys.executable, str(script), "--output-dir", str(run)], stdout=subprocess.PIPE)
    try:
        assert process.stdout.readline() == b"ready\n"
        assert os.getpgid(process.pid) == os.getpgrp()
        whom = RunRegistry().stop(run)  # the page's message says whom: the PID, not the group it shares
        assert whom == f"PID {process.pid} (it shares this page's process group, which is not signalled)"
        assert process.wait(timeout=30) != 0  # the run got SIGINT (KeyboardInterrupt)...
        time.sleep(0.2)
        assert got == []  # ...the page did not
    finally:
        signal.signal(signal.SIGINT, before)
        process.kill()
        process.wait()


def test_watch_escapes_a_recorded_command_line_and_shows_the_end_of_an_endless_log_line(root, monkeypatch) -> None:
    """run.yaml's command line was shown as recorded (a line break in it forged a second line); a log line
    without end was sent whole, 256 KiB a second."""
    from indextts_train.ui.run_record import write_run_record

    run = (root / "run").resolve()
    monkeypatch.setattr(sys, "argv", ["train-gpt", "--output-dir", "/r\n$ rm -rf ~"])
    write_run_record(run, {}, {}, {}, 0.0)
    (run / "train.log").write_text("x" * 200_000)
    _, command, tail, _, _ = PageServer(Roots([root])).watch(str(run))
    assert "\n" not in command and "/r\\n$ rm -rf ~" in command
    assert len(tail) < REPORT_CHARS + 100 and tail.endswith("x" * 100)


@pytest.mark.slow  # imports Gradio (seconds)
def test_a_stored_form_of_other_kinds_is_not_restored(root) -> None:
    """The browser's stored form comes from the browser (or any API caller): text in a number box or an amp that
    is no choice went into the page as given."""
    from indextts_train.webui.page import FORM_SIZE, Page

    page = Page(Roots([root]))
    good = [*_form(root)[:6], *([1] * len(forms.MAIN_FIELDS)), "on", ""]
    assert page.restore(good) == [*good, good[3]]
    for bad in (["x"] * FORM_SIZE, [*good[:-2], "rm -rf", ""], [*good[:6], {"a": 1}, *good[7:]],
                [*good[:6], True, *good[7:]], [None, *good[1:]]):
        assert all(update == {"__type__": "update"} for update in page.restore(bad)), bad


class _Running:
    """A child that is running, for status_line (no process is started)."""

    pid = 4242

    def poll(self) -> None:
        return None


def test_a_crafted_events_file_neither_breaks_nor_forges_watch(root) -> None:
    """events.jsonl is a file anyone who can write the run folder can edit: a total of 10**400 raised OverflowError
    in Watch once a second, and a checkpoint name or a notice holding a line break or a bidirectional control
    forged the status line or reordered the notices."""
    from indextts_train.ui.events import read_events

    run = (root / "run").resolve()
    launch = runs.Launch(["train-gpt"], run, 4242, time.time(), 0, _Running())

    def status(*events: dict) -> str:
        start = {"t": 1, "kind": "start", "text": "", "started": 9e18}
        (run / "events.jsonl").write_text("".join(json.dumps(e) + "\n" for e in (start, *events)))
        return records.status_line(launch, read_events(run))

    assert status({"t": 2, "kind": "step", "text": "", "step": 1, "total": 10**400}).endswith("ETA: measuring")
    assert status({"t": 3, "kind": "step", "text": "", "step": 2, "total": 10**400}).endswith("ETA: unknown")
    assert status({"t": 4, "kind": "step", "text": "", "step": 9, "total": 5}).endswith("ETA: unknown")  # not -1:59:59
    said = status({"t": 5, "kind": "save", "text": "", "step": 3, "total": 5, "file": "a.pth\nrunning \u202eyes"})
    assert "\n" not in said and said.endswith("checkpoint a.pth\\nrunning \\u202eyes")
    assert "\n" not in records.status_line(None, read_events(run))
    status({"t": 6, "kind": "warning", "text": "one\nt\u202ewo\x1b[2J"})
    notices = PageServer(Roots([root])).watch(str(run))[4]
    assert notices.endswith("one\nt\\u202ewo\\x1b[2J")


@pytest.mark.slow  # starts a run (sleep) and a stand-in for one started in a terminal
def test_a_run_started_in_a_terminal_after_the_pages_ended_is_seen_and_not_joined(root) -> None:
    """Once the page's own run had ended, the page no longer looked at the lock: a run started in a terminal into
    the folder showed as the page's ended run, Stop said no run was training, and Start started a second one."""
    folder = (root / "run").resolve()
    registry = RunRegistry()
    ours = registry.start(["sleep", "0"], folder)
    ours.process.wait()
    terminal = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], start_new_session=True)
    lock = open(folder / LOCK_NAME, "w")  # noqa: SIM115 - held until the test closes it
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        lock.write(f"pid={terminal.pid} started=2026-01-01T00:00:00Z\n")
        lock.flush()
        found = registry.find(folder)
        assert found.pid == terminal.pid and found.running()
        with pytest.raises(UserError, match=f"a run \\(PID {terminal.pid}\\) is already training in {folder}"):
            registry.start(["sleep", "30"], folder)
    finally:
        lock.close()
        terminal.kill()
        terminal.wait()
    assert not registry.find(folder).running()  # the terminal's run ended: Start may start one again


@pytest.mark.slow  # imports Gradio (seconds)
def test_the_checkpoint_table_escapes_what_it_found_on_disk(root, tmp_path) -> None:
    """A link's target (or a branch's name) went into the table's cells as found: a bidirectional control in it
    reordered the row."""
    from indextts_train.webui.page import Page

    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "x\u202ey.pth").write_bytes(b"not ours")
    (root / "run" / "model_step5.pth").symlink_to(outside / "x\u202ey.pth")
    _, table, _, _ = Page(Roots([root])).run_records(str(root / "run"), "auto", None)
    (row,) = table
    assert row[:2] == ["model_step5.pth", records.REFUSED]
    assert "\u202e" not in row[-1] and "x\\u202ey.pth" in row[-1]


@pytest.mark.parametrize("dash", ["\u2014", "\u2013", "\u2212", "\u2010"])
def test_a_flag_typed_with_a_look_alike_dash_is_named_as_such(root, dash) -> None:
    """Pasted from a document, '—lr 1' or '−−seed 3' was 'not a train-gpt flag', with no word on why."""
    said = PageServer(Roots([root])).preview(*_form(root)[:-1], f"{dash}{dash}lora-rank 4")
    assert said == (f"(not ready) Other flags: '{dash}{dash}lora-rank' starts with '{dash}' (U+{ord(dash):04X}), "
                    "not '-': type flags with the keyboard's hyphen-minus (--flag)")


def test_watch_reads_no_log_through_a_folder_swapped_for_a_link_after_its_check(root, tmp_path) -> None:
    """Watch checked the output dir, then opened OUTPUT_DIR/train.log and events.jsonl by that path: the folder made
    a link to another one in between, the log tail and notices shown were those of files outside the roots."""
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "train.log").write_text("outside-secret-5e2a\n")
    (outside / "events.jsonl").write_text(json.dumps({"t": 1, "kind": "start", "text": "", "started": 1}) + "\n" +
                                          json.dumps({"t": 2, "kind": "warning", "text": "outside-secret-5e2a"}) + "\n")
    (root / "run" / "train.log").write_text("our own log\n")
    server = PageServer(Roots([root]))
    checked = server.roots.inside

    def check_then_swap(value, what):  # what another process may do right after the page's check
        folder = checked(value, what)
        if what == "Output dir":
            (root / "run").rename(root / "run.before")
            (root / "run").symlink_to(outside)
        return folder

    server.roots.inside = check_then_swap
    status, _, tail, _, notices = server.watch(str(root / "run"))
    assert "outside-secret" not in tail + notices and status == "no run in this output dir yet"
    assert tail.startswith("train.log not read: ")
    assert "lies outside the folders this page may touch once opened" in tail


def test_a_recorded_run_is_parsed_once_and_its_lists_are_bounded(root, monkeypatch) -> None:
    """Preview checks --from-run's record on every keystroke: a run.yaml listing 60,000 manifests took 13 s a
    keystroke (5 s of them parsing the same file again)."""
    from indextts_train.ui.run_record import write_run_record
    from indextts_train.webui import trainflags

    run = (root / "run").resolve()
    write_run_record(run, {"train_manifests": [f"{root}/t.jsonl"] * 1001, "output_dir": str(run)}, {}, {}, 0.0)
    parses = []
    real = trainflags.recorded_options
    monkeypatch.setattr(trainflags, "recorded_options", lambda path: parses.append(path) or real(path))
    server = PageServer(Roots([root]))
    for _ in range(3):
        said = server.preview(*_form(root)[:-1], f"--from-run={run}/run.yaml")
        assert said == (f"(not ready) --from-run {run}/run.yaml: its --train-manifest lists 1,001 values; the page "
                        "checks at most 1,000 (merge them into fewer files, or start this run from a terminal)")
    assert len(parses) == 1


def test_a_tensorboard_file_is_not_read_through_a_folder_made_a_link_after_its_check(root, tmp_path) -> None:
    """The loss curves open each event file by the resolved path found inside the roots: a folder of that path made
    a link since led the read to a file outside them."""
    outside = tmp_path / "outside"
    outside.mkdir()
    record = (5).to_bytes(8, "little") + bytes(4) + b"hello" + bytes(4)
    (outside / "events.out.tfevents.1").write_bytes(record)
    (root / "logs").mkdir()
    (root / "logs" / "events.out.tfevents.1").write_bytes(record)
    checked = str((root / "logs" / "events.out.tfevents.1").resolve())
    assert list(records._tfrecords(checked, len(record))) == [b"hello"]
    (root / "logs").rename(root / "logs.before")
    (root / "logs").symlink_to(outside)  # made so after the page found `checked` inside the roots
    assert list(records._tfrecords(checked, len(record))) == []
