"""What the page shows of a run is what the run's records say: its status, its checkpoints and the choices
offered for resume and export, each against the files on disk and `indextts-train checkpoints`."""

from __future__ import annotations

import os
import sys

import pytest
from helpers import train_tiny_run

from indextts_train.ui.console import RunLogger
from indextts_train.ui.run_record import write_run_record
from indextts_train.ui.text_log import TextLog
from indextts_train.webui.roots import Roots
from indextts_train.webui.server import PageServer


def _logger(folder) -> RunLogger:
    """The trainer's own logger, writing train.log and events.jsonl into `folder` as a run does."""
    text_log = TextLog()
    text_log.attach(folder)
    return RunLogger(None, 20, tensorboard=False, text_log=text_log)


@pytest.mark.slow  # trains a tiny run and imports Gradio (seconds)
def test_an_abandoned_branch_is_named_as_such_and_not_exported_by_default(tiny_data, tmp_path) -> None:
    """After a rollback the Resume and Export lists offered an abandoned branch's model_step4.pth under the same
    label as the run's own, and Export chose the abandoned one by default (it came last in the table)."""
    from indextts_train.webui.page import Page

    out = train_tiny_run(tiny_data, tmp_path / "run", max_steps=4)
    branch = out / "abandoned" / "20260101-000000-abcdef"
    branch.mkdir(parents=True)
    os.link(out / "model_step4.pth", branch / "model_step4.pth")
    _, _, resume, export = Page(Roots([tmp_path])).run_records(str(out), "auto", None)
    labels = [label for label, _ in export["choices"]]
    assert len(set(labels)) == len(labels) == 3, labels
    assert "abandoned/20260101-000000-abcdef/model_step4.pth: COMPLETE, step 4" in labels
    assert export["value"] == str(out / "model_step4.pth")
    assert [label for label, _ in resume["choices"]][1:] == labels


def test_a_refused_start_shows_its_own_command_line_beside_its_error(tmp_path, monkeypatch) -> None:
    """A start refused before it wrote run.yaml (a resume asking for another --train-scope) was shown as
    `ended with an error` beside run.yaml's command line: the earlier start's, which had finished."""
    monkeypatch.setattr(sys, "argv", ["/venv/bin/train-gpt", "--output-dir", "/r", "--max-steps", "20"])
    first = _logger(tmp_path)
    write_run_record(tmp_path, {}, {}, {}, 0.0)
    first.done(20, 2, "best.pth is step 20", tmp_path)
    first.text_log.close()
    monkeypatch.setattr(sys, "argv", ["/venv/bin/train-gpt", "--output-dir", "/r", "--resume", "auto",
                                      "--train-scope", "lora"])
    second = _logger(tmp_path)
    second.info("error: a scope cannot change on resume", "error")
    second.text_log.close()
    status, command, *_ = PageServer(Roots([tmp_path])).watch(str(tmp_path))
    assert status.startswith("ended with an error")
    assert command == "train-gpt --output-dir /r --resume auto --train-scope lora"


def test_check_tokenizer_of_a_tiktoken_vocabulary_checks_it(tmp_path, monkeypatch) -> None:
    """Check tokenizer passed --base-vocab (the config's text rows) for an IndexTTS-2.5 .tiktoken too, which
    check-tokenizer refuses (`--base-vocab is for SentencePiece models`): the report was that refusal, never the
    check. A SentencePiece model is still checked against the config's base vocabulary."""
    from helpers import ROOT

    (tmp_path / "config.yaml").write_text((ROOT / "configs" / "tiny_v25.yaml").read_text())
    (tmp_path / "grown.tiktoken").write_text("")
    (tmp_path / "bpe.model").write_text("")
    page = PageServer(Roots([tmp_path]))
    asked = []
    monkeypatch.setattr(page, "run_cli", lambda args: asked.append(args) or "")
    for name in ("grown.tiktoken", "bpe.model"):
        page.check_tokenizer("", "", str(tmp_path / name), str(tmp_path / "config.yaml"), "", "",
                             *([None] * 17), "auto", "")
    assert asked[0] == ["check-tokenizer", "--", str(tmp_path / "grown.tiktoken")]
    assert asked[1][1].startswith("--base-vocab=") and asked[1][-1] == str(tmp_path / "bpe.model")


class _Ended:
    """A child of the page that ended with exit code 0."""

    pid = 1 << 22

    def poll(self) -> int:
        return 0


def test_a_run_started_after_the_pages_own_ended_is_shown_as_itself(tmp_path, monkeypatch) -> None:
    """The page's run finished (exit 0); a resume typed in a terminal then ran and was stopped. Watch said
    `exited with code 0` beside that later run's step and checkpoint, and the page's command line."""
    import time

    from indextts_train.webui.runs import Launch

    page = PageServer(Roots([tmp_path]))
    folder = tmp_path.resolve()
    page.registry._launches[folder] = Launch(["train-gpt", "--page"], folder, _Ended.pid, time.time(), 0, _Ended())
    mine = _logger(folder)
    mine.saved(folder / "model_step20.pth", best=True, step=20, total=20, epoch=1, sample=8)
    mine.done(20, 2, "best.pth is step 20", folder)
    mine.text_log.close()
    monkeypatch.setattr(sys, "argv", ["/venv/bin/train-gpt", "--resume", "auto", "--max-steps", "40"])
    later = _logger(folder)
    later.saved(folder / "model_step24.pth", best=False, step=24, total=40, epoch=1, sample=16)
    later.stopped(24, 130)
    later.text_log.close()
    status, command, *_ = page.watch(str(folder))
    assert status.startswith("stopped") and "step 24/40" in status and "code 0" not in status, status
    assert command == "train-gpt --resume auto --max-steps 40"


def test_a_run_killed_by_a_signal_is_said_so_not_as_a_negative_exit_code() -> None:
    """Popen gives -9 for a run the OOM killer or `kill -9` ended; the page said `exited with code -9`."""
    from indextts_train.webui.records import exit_text

    assert exit_text(-9) == "killed by SIGKILL (a shell says exit 137)"
    assert exit_text(130) == "exited with code 130" and exit_text(0) == "exited with code 0"
