"""RUN/listen/scores.jsonl: appended whole lines, torn lines skipped, the last record of a key wins."""

from __future__ import annotations

import json
import os
import threading

import pytest

from indextts_train.checkpoint.scores import (
    RECORD_FORMAT,
    append_record,
    check_scores_file,
    read_records,
    scored_keys,
    scores_path,
    summary_by_step,
)
from indextts_train.errors import UserError


def _record(step, line_id, ok=True, **scores):
    return {"format": RECORD_FORMAT, "step": step, "line_id": line_id, "ok": ok, **scores}


def test_torn_line_is_skipped_and_the_next_append_starts_fresh(tmp_path):
    path = scores_path(tmp_path)
    append_record(path, _record(10, "a", cer=0.5))
    with open(path, "ab") as handle:  # what a kill in the middle of a write leaves
        handle.write(b'{"format": "' + RECORD_FORMAT.encode() + b'", "step": 10, "line_id": "b", "c')
    append_record(path, _record(10, "b", cer=0.25))
    assert [(r["step"], r["line_id"]) for r in read_records(path)] == [(10, "a"), (10, "b")]
    assert len(path.read_bytes().splitlines()) == 3
    json.loads(path.read_bytes().splitlines()[-1])


def test_failed_lines_are_not_scored_and_the_last_record_wins(tmp_path):
    path = scores_path(tmp_path)
    append_record(path, _record(10, "a", ok=False, error="inference process exited"))
    append_record(path, _record(10, "b", cer=0.5, speaker_sim=0.2))
    assert scored_keys(read_records(path)) == {(10, "b")}
    append_record(path, _record(10, "a", cer=0.1, speaker_sim=0.6))
    append_record(path, _record(20, "a", cer=0.0, speaker_sim=None))
    assert scored_keys(read_records(path)) == {(10, "a"), (10, "b"), (20, "a")}
    summary = summary_by_step(tmp_path)
    assert summary[10] == {"lines": 2, "cer": (0.1 + 0.5) / 2, "speaker_sim": (0.6 + 0.2) / 2}
    assert summary[20] == {"lines": 1, "cer": 0.0, "speaker_sim": None}


def test_a_score_that_cannot_be_is_not_counted(tmp_path):
    """NaN (json reads the literal), a negative CER, a similarity beyond 1 or a bool are no scores: one such
    line, crafted or damaged, would otherwise rank first in `export --pick`."""
    path = scores_path(tmp_path)
    for line_id, cer, sim in (("a", float("nan"), float("nan")), ("b", -5, 3.0), ("c", True, False),
                              ("d", 0.5, 0.9)):
        append_record(path, _record(50, line_id, cer=cer, speaker_sim=sim))
    assert summary_by_step(tmp_path)[50] == {"lines": 4, "cer": 0.5, "speaker_sim": 0.9}
    append_record(path, _record(60, "a", cer=float("inf"), speaker_sim=-1.5))
    assert summary_by_step(tmp_path)[60] == {"lines": 1, "cer": None, "speaker_sim": None}


def test_foreign_lines_are_ignored(tmp_path):
    path = scores_path(tmp_path)
    path.parent.mkdir(parents=True)
    path.write_text('{"step": 3, "line_id": "x"}\nnot json\n[1, 2]\n', encoding="utf-8")
    assert read_records(path) == []
    assert summary_by_step(tmp_path) == {}
    # crafted: a line nested 200,000 deep and a number of 5,000 digits (RecursionError / ValueError in json)
    path.write_text("[" * 200_000 + "]" * 200_000 + "\n" + '{"n": ' + "9" * 5000 + "}\n", encoding="utf-8")
    assert read_records(path) == [] and summary_by_step(tmp_path) == {}


def test_a_step_that_is_no_count_is_no_record(tmp_path):
    """`"step": true` is an int to Python: it counted as step 1 (and a negative step as a step before the run),
    so a crafted line put a score on a checkpoint that was never heard."""
    path = scores_path(tmp_path)
    for step in (True, -1, 2.0, "3"):
        append_record(path, _record(step, "a", cer=0.0))
    append_record(path, _record(4, "a", cer=0.5))
    assert [r["step"] for r in read_records(path)] == [4]
    assert summary_by_step(tmp_path) == {4: {"lines": 1, "cer": 0.5, "speaker_sim": None}}


def test_a_scores_file_that_is_no_regular_file_is_read_as_none_and_never_appended_to(tmp_path):
    """A FIFO in its place: readers (the table, the page, export --pick) see no records at once instead of
    blocking on it, and listen refuses before any work. A reader still blocked after 10 s fails the test
    (the FIFO is then opened for writing, so the suite goes on)."""
    path = scores_path(tmp_path)
    path.parent.mkdir()
    os.mkfifo(path)
    got = []
    reader = threading.Thread(target=lambda: got.append(read_records(path)), daemon=True)
    reader.start()
    reader.join(10)
    if reader.is_alive():
        os.close(os.open(path, os.O_WRONLY))
        reader.join()
        pytest.fail("read_records blocked on a FIFO")
    assert got == [[]]
    with pytest.raises(UserError, match="is not a regular file, and listen appends only to a scores file of its own"):
        check_scores_file(path)
    path.unlink()
    path.symlink_to(tmp_path / "someone.jsonl")
    with pytest.raises(UserError, match="is a link"):
        check_scores_file(path)
    path.unlink()
    (tmp_path / "theirs.jsonl").write_text("mine\n", encoding="utf-8")
    os.link(tmp_path / "theirs.jsonl", path)  # an append would change their file too
    with pytest.raises(UserError, match="is a file with another hard link"):
        check_scores_file(path)
    check_scores_file(tmp_path / "nothing" / "scores.jsonl")  # none yet: listen makes its own


def _checkpoint(path, step, branch):
    """A file lineage_of reads as one of ours: its step and branch (nothing else of a checkpoint is read)."""
    import torch

    from indextts_train.checkpoint.state import FORMAT

    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save({"format": FORMAT, "progress": {"step": step},
                "lineage": {"branch": branch, "parent": None, "parent_step": None, "born": 1, "forks": []}}, path)


def test_a_rollback_s_new_files_do_not_take_the_abandoned_files_scores(tmp_path):
    """After a rollback the new branch writes model_step4.pth again: the scores listen recorded for the
    abandoned step-4 file were shown for the new one, `export --pick` ranked it by them and listen skipped it
    as heard. A record names its file's branch; one written before records did stands for any file."""
    from indextts_train.checkpoint.scores import pick_scored

    _checkpoint(tmp_path / "model_step2.pth", 2, "old")  # the ancestor both branches share
    _checkpoint(tmp_path / "model_step4.pth", 4, "new")  # the rollback's file of step 4
    path = scores_path(tmp_path)
    append_record(path, _record(2, "a", cer=0.5, branch="old"))
    append_record(path, _record(4, "a", cer=0.1, branch="old"))  # the abandoned step-4 file's: the best
    assert summary_by_step(tmp_path) == {2: {"lines": 1, "cer": 0.5, "speaker_sim": None}}
    assert pick_scored(tmp_path, "cer")[0] == tmp_path / "model_step2.pth"
    assert scored_keys(read_records(path), {4: "new"}) == set()  # listen hears the new file
    assert scored_keys(read_records(path), {4: "old"}) == {(4, "a")}
    append_record(path, _record(4, "b", cer=0.3))  # written before records named a branch: any file of step 4
    append_record(path, _record(4, "a", cer=0.7, branch="new"))
    assert summary_by_step(tmp_path)[4] == {"lines": 2, "cer": (0.7 + 0.3) / 2, "speaker_sim": None}
    assert scored_keys(read_records(path), {4: "new"}) == {(4, "a"), (4, "b")}
    (tmp_path / "model_step4.pth").unlink()  # gone: its step's history is every record of it
    assert summary_by_step(tmp_path)[4]["lines"] == 2


def test_pick_takes_no_file_that_cannot_be_read_and_says_why(tmp_path):
    """A step file cut short (or a FIFO under its name): `checkpoints` shows no step and no scores for it, but
    `export --pick cer` picked it by its name, and the export then failed."""
    from indextts_train.checkpoint.scores import pick_scored

    _checkpoint(tmp_path / "model_step8.pth", 8, "b")
    (tmp_path / "model_step2.pth").write_bytes(b"PK\x03\x04 cut short")
    os.mkfifo(tmp_path / "model_step3.pth")
    path = scores_path(tmp_path)
    for step, cer in ((2, 0.0), (3, 0.0), (8, 0.9)):
        append_record(path, _record(step, "a", cer=cer, branch="b"))
    _checkpoint(tmp_path / "elsewhere" / "model.pth", 9, "b")  # a link leads out of the run: never read
    (tmp_path / "model_step9.pth").symlink_to(tmp_path / "elsewhere" / "model.pth")
    append_record(path, _record(9, "a", cer=0.0, branch="b"))
    assert pick_scored(tmp_path, "cer") == (tmp_path / "model_step8.pth",
                                            "step 8: best cer 0.9000 of 1 scored checkpoints")
    (tmp_path / "model_step8.pth").unlink()
    with pytest.raises(UserError, match=r"steps 2, 3, 8, 9 were scored, but those files are gone, unreadable, or were "
                                        r"written again since by a rollback\); no checkpoint of ours is there to hear "
                                        r"\(`indextts-train checkpoints"):  # `listen` first: it has nothing to hear
        pick_scored(tmp_path, "cer")
    _checkpoint(tmp_path / "model_step10.pth", 10, "b")
    with pytest.raises(UserError, match=r"; run `indextts-train listen .*` first$"):
        pick_scored(tmp_path, "cer")


def test_only_ok_true_is_scored_and_an_overflowing_mean_is_none(tmp_path):
    """`"ok": "false"` (a hand edit) is a truthy string: it counted as scored. Two CERs of 1e308 (each in range)
    made a mean of inf."""
    path = scores_path(tmp_path)
    append_record(path, _record(5, "a", ok="false", cer=0.0))
    append_record(path, _record(5, "b", ok=1, cer=0.0))
    assert summary_by_step(tmp_path) == {} and scored_keys(read_records(path)) == set()
    append_record(path, _record(6, "a", cer=1e308))
    append_record(path, _record(6, "b", cer=1e308))
    assert summary_by_step(tmp_path)[6] == {"lines": 2, "cer": None, "speaker_sim": None}
    append_record(path, _record(7, "a", cer=0.5, branch=5))  # a branch is a name: a crafted line is no record
    assert 7 not in summary_by_step(tmp_path)
