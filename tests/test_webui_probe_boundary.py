"""What an attacker of the page found (a probe of its handlers, called as the page calls them): each test
is one way a value or a run folder's file got past the boundary roots.py holds, and is refused now."""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path

import pytest

from indextts_train.errors import UserError
from indextts_train.webui import records
from indextts_train.webui.roots import Roots, checked_text
from indextts_train.webui.server import REPORT_CHARS, PageServer


@pytest.fixture()
def root(tmp_path: Path) -> Path:
    folder = tmp_path / "root"
    (folder / "run").mkdir(parents=True)
    return folder


def _form(root: Path, **paths: str) -> list:
    values = {"train": f"{root}/t.jsonl", "val": "", "tokenizer": "", "config": f"{root}/c.yaml", "base": "",
              "output": f"{root}/run", **paths}
    return [*values.values(), *([None] * 17), "auto", ""]


def test_a_symlink_loop_is_one_line_in_every_handler_not_an_exception(root) -> None:
    """Path.resolve() raised RuntimeError on a loop: Watch and Stop answered with a traceback."""
    (root / "a").symlink_to(root / "b")
    (root / "b").symlink_to(root / "a")
    server = PageServer(Roots([root]))
    said = "its symbolic links loop"
    for value in (root / "a", root / "a" / "run"):
        assert said in server.watch(str(value))[0]
        assert said in server.stop(str(value))
        assert said in server.start(None, *_form(root, output=str(value)), None)[0]
        assert said in server.export(str(value), "", str(root / "run"), "")
        assert said in server.export(str(root / "run" / "latest.pth"), str(value), str(root / "run"), "")


def test_a_link_to_a_name_holding_a_line_break_or_escape_is_refused_as_the_typed_value_would_be(root) -> None:
    """The typed text was checked, but what runs is the resolved path: a link made it hold a line break."""
    for name in ("a\nb.yaml", "x\x1b[2Jy", "r\u202eevil"):
        (root / name).mkdir()
    (root / "nl.yaml").symlink_to(root / "a\nb.yaml")
    (root / "esc").symlink_to(root / "x\x1b[2Jy")
    (root / "bidi").symlink_to(root / "r\u202eevil")
    roots = Roots([root])
    with pytest.raises(UserError, match=r"resolved to .*a\\nb\.yaml\): holds a control character \(U\+000A\)"):
        roots.inside(str(root / "nl.yaml"), "Config")
    with pytest.raises(UserError, match=r"U\+001B"):
        roots.program(str(root / "esc" / "python"), "--listen-inference-python")
    with pytest.raises(UserError, match=r"U\+202E"):
        roots.inside(str(root / "bidi"), "Output dir")
    assert PageServer(roots).preview(*_form(root, output=str(root / "esc"))).startswith("(not ready) Output dir")


@pytest.mark.parametrize("char", ["\u202e", "\u202d", "\u2066", "\u2067", "\u2068", "\u2069", "\u200f", "\u061c"])
def test_a_bidirectional_control_is_refused_it_shows_another_command_than_runs(char) -> None:
    with pytest.raises(UserError, match="a bidirectional control"):
        checked_text(f"run{char}/lmay.c", "Config")
    assert checked_text("run\u200d\u200cname", "Config") == "run\u200d\u200cname"  # joiners: some scripts need them


def _read_unblocking(fifo: Path, read, wait: float = 2.0):
    """read() in a thread; if it still waits on `fifo` after `wait` seconds, a writer opens and closes it so
    the reader sees its end (the test then fails on what it says, never hangs)."""
    box: dict = {}
    thread = threading.Thread(target=lambda: box.update(result=read()), daemon=True)
    thread.start()
    thread.join(wait)
    blocked = thread.is_alive()
    if blocked:
        os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
        thread.join(5)
    return blocked, box.get("result")


def test_a_fifo_in_a_tensorboard_folder_is_not_read_it_blocked_the_page(root) -> None:
    """TensorBoard's reader opens every events file: a FIFO there (or a link to one) blocked the page's
    records handler for good, one more thread every 3 s."""
    roots = Roots([root])
    for link in (False, True):
        run = root / f"run{int(link)}"
        (run / "logs" / "run").mkdir(parents=True)
        fifo = run / "logs" / "run" / "events.out.tfevents.1"
        if link:
            os.mkfifo(root / "pipe")
            fifo.symlink_to(root / "pipe")
        else:
            os.mkfifo(fifo)
        blocked, curves = _read_unblocking(fifo, lambda run=run: records.loss_curves(run, roots))
        assert not blocked and curves == []
        assert roots.leads_outside(run / "logs" / "run")
        assert "logs/run/events.out.tfevents.1 (a FIFO (named pipe))" in PageServer(roots).watch(str(run))[4]


def test_a_link_to_nothing_in_a_tensorboard_folder_is_skipped_not_an_exception(root) -> None:
    roots = Roots([root])
    (root / "run" / "logs" / "run").mkdir(parents=True)
    events = root / "run" / "logs" / "run" / "events.out.tfevents.1"
    events.symlink_to(root / "gone")
    assert records.loss_curves(root / "run", roots) == []  # was FileNotFoundError from the handler
    events.unlink()
    events.symlink_to(events)
    assert records.loss_curves(root / "run", roots) == []  # was OSError ELOOP
    assert "leads nowhere" in PageServer(roots).watch(str(root / "run"))[4]


def test_watch_shows_the_end_of_a_huge_notice_not_all_of_it_every_second(root) -> None:
    notice = {"t": 1.0, "kind": "notice", "text": "x" * 3_000_000 + "the end"}
    plan = {"t": 1.0, "kind": "plan", "text": "p" * 1_000_000}
    (root / "run" / "events.jsonl").write_text(json.dumps(notice) + "\n" + json.dumps(plan) + "\n")
    _, _, _, shown_plan, notices = PageServer(Roots([root])).watch(str(root / "run"))
    assert notices.endswith("the end") and len(notices) < REPORT_CHARS + 100
    assert len(shown_plan) < REPORT_CHARS + 100


def test_a_link_name_cannot_forge_a_line_of_the_watch_notices(root) -> None:
    os.symlink("/", root / "run" / "x\nstep 150 of 150: done")
    notices = PageServer(Roots([root])).watch(str(root / "run"))[4]
    assert notices.splitlines() == ["not used (leads outside the folders this page may touch): "
                                    "x\\nstep 150 of 150: done -> /"]


def test_the_log_tail_is_shown_with_controls_escaped(root) -> None:
    """train.log holds what the run printed of its data (a manifest's text, a file's name): a bidirectional control
    in it reordered the log box's lines, and an escape sequence went to the page raw. Escaped as the notices are."""
    (root / "run" / "train.log").write_text("step 1 of \u202eevil\x1b[2J line\nnext\tline\n", encoding="utf-8")
    tail = PageServer(Roots([root])).watch(str(root / "run"))[2]
    assert "\u202e" not in tail and "\x1b" not in tail and "\t" not in tail
    assert tail == "step 1 of \\u202eevil\\x1b[2J line\nnext\\tline"
