"""RUN/listen/scores.jsonl edited by hand (a field of another type, a number too large for a float): what
reads it, `checkpoints`, `export --pick` and listen's page, skips what it cannot use instead of ending in a
traceback. And a file or a link where listen makes its folders is one line before any work."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from helpers import ROOT, stand_in_inference_folder

from indextts_train.checkpoint.scores import RECORD_FORMAT, scores_path, summary_by_step
from indextts_train.errors import UserError
from indextts_train.listen import run as listen_run
from indextts_train.listen.choose import Chosen
from indextts_train.listen.page import render_page
from indextts_train.listen.run import ListenOptions, plan


def _scores(run_dir: Path, *records: dict) -> None:
    path = scores_path(run_dir)
    path.parent.mkdir(parents=True)
    path.write_text("".join(json.dumps({"format": RECORD_FORMAT, "ok": True, **r}) + "\n" for r in records) +
                    '{"broken": \n', encoding="utf-8")


def test_a_score_too_large_for_a_float_is_no_score(tmp_path) -> None:
    _scores(tmp_path, {"step": 2, "line_id": "a", "cer": 10**400, "speaker_sim": 0.5},
            {"step": 2, "line_id": "b", "cer": 0.25, "speaker_sim": -(10**400)})
    assert summary_by_step(tmp_path) == {2: {"lines": 2, "cer": 0.25, "speaker_sim": 0.5}}


def test_the_page_shows_a_hand_edited_record_as_far_as_it_reads(tmp_path) -> None:
    _scores(tmp_path, {"step": 2, "line_id": "a", "asr": "whisper, by hand", "text": 5, "transcript": None,
                       "cer": 10**400, "speaker_model": "campplus"},
            {"step": 4, "line_id": "a", "prompt_audio": 7, "reference_audio": ["x.wav"], "seconds": True,
             "asr": {"model": ["m"], "parameters": "many"}, "text": "hello", "transcript": "hallo", "cer": 0.2})
    page = render_page(tmp_path)
    assert "<th>step 2" in page and "<th>step 4" in page and "CER 0.200" in page
    assert 'title="expected e"' in page  # the record that reads is marked as ever


def _plan_of(tmp_path: Path, monkeypatch) -> ListenOptions:
    """A run folder with step 2 and step 4 chosen (stand-ins: chosen, never read before the refusal), a lines
    file and a model folder the checks accept."""
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    monkeypatch.setattr(listen_run, "choose_checkpoints",
                        lambda run, which: ([Chosen(2, run / "model_step2.pth"), Chosen(4, run / "model_step4.pth")],
                                            []))
    (tmp_path / "prompt.wav").write_bytes(b"RIFF stand-in")
    lines = tmp_path / "lines.jsonl"
    lines.write_text(json.dumps({"text": "Hello there.", "prompt_audio": "prompt.wav"}) + "\n", encoding="utf-8")
    model_dir = stand_in_inference_folder(tmp_path / "model", ROOT / "configs" / "tiny.yaml")
    return ListenOptions(run_dir=run_dir, lines=lines, model_dir=model_dir, device="cpu",
                         inference_python=tmp_path / "no-python", say=lambda line: None)


def test_a_file_where_listen_writes_its_folders_is_one_line_before_any_work(tmp_path, monkeypatch) -> None:
    """RUN/listen a file was a traceback; RUN/listen/step4 a file, one once step 4 had been synthesized (and
    a link there would have had the WAVs replace files elsewhere)."""
    options = _plan_of(tmp_path, monkeypatch)
    listen_dir = options.run_dir / "listen"
    listen_dir.write_text("my notes\n")
    with pytest.raises(UserError, match=rf"^{listen_dir}: is not a folder, and listen writes only into folders"):
        plan(options)
    listen_dir.unlink()
    listen_dir.mkdir()
    (listen_dir / "step4").write_text("my notes\n")
    with pytest.raises(UserError, match=rf"^{listen_dir / 'step4'}: is not a folder"):
        plan(options)
    (listen_dir / "step4").unlink()
    (listen_dir / "step4").symlink_to(tmp_path)
    with pytest.raises(UserError, match=rf"^{listen_dir / 'step4'}: is a link"):
        plan(options)
    assert (listen_dir / "step4").is_symlink() and sorted(p.name for p in listen_dir.iterdir()) == ["step4"]
