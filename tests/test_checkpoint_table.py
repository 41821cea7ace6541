"""`indextts-train checkpoints OUT_DIR`: one row per checkpoint file, marks, status, `--json`."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from helpers import train_tiny_run
from typer.testing import CliRunner

from indextts_train.checkpoint.scores import RECORD_FORMAT, append_record, scores_path
from indextts_train.checkpoint.table import age_text, checkpoint_rows, render_table
from indextts_train.cli import app
from indextts_train.webui.records import checkpoint_rows as page_rows
from indextts_train.webui.roots import Roots

pytestmark = pytest.mark.slow  # every test here trains a tiny run or starts the CLI: seconds each

ROOT = Path(__file__).resolve().parents[1]


def test_checkpoints_table_and_json(tiny_data, tmp_path) -> None:
    out = tmp_path / "run"
    # A learning rate below float32 resolution: validation never improves, so best.pth stays at step 2,
    # whose step file rotation removes; steps 4 and 8 are milestones (kept aside: they do not count toward 2).
    train_tiny_run(tiny_data, out, max_steps=10, learning_rate=1e-30, log_interval=2, keep_checkpoints=2, keep_every=4)
    (out / "model_step1.pth").write_bytes(b"PK\x03\x04 not a checkpoint")  # someone else's damaged file

    result = subprocess.run([sys.executable, "-m", "indextts_train", "checkpoints", str(out)], capture_output=True,
                            text=True, cwd=ROOT, timeout=300)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0].split() == ["file", "step", "epoch", "val", "loss", "status", "size", "age", "marks"]
    headings = [line for line in lines[1:] if line.endswith(":")]
    assert headings[0] == "not written by this program, or unreadable:" and headings[1].startswith("branch ")
    rows = {line.split()[0]: line for line in lines[1:] if not line.startswith(" ") and line not in headings}
    assert set(rows) == {"model_step1.pth", "model_step4.pth", "model_step6.pth", "model_step8.pth",
                         "model_step10.pth", "best.pth"}
    assert rows["model_step10.pth"].split()[1:3] == ["10", "1"] and rows["model_step10.pth"].endswith("latest")
    assert rows["model_step8.pth"].endswith("milestone") and " COMPLETE " in rows["model_step6.pth"]
    assert rows["model_step4.pth"].endswith("milestone") and " COMPLETE " in rows["model_step4.pth"]
    assert rows["best.pth"].split()[1] == "2" and rows["best.pth"].endswith("best")
    assert " INCOMPLETE " in rows["model_step1.pth"]
    assert all(len(line) <= 80 for line in lines if not line.startswith(" "))

    rows = json.loads(CliRunner().invoke(app, ["checkpoints", str(out), "--json"]).stdout)
    by_file = {row["file"]: row for row in rows}
    assert [row["file"] for row in rows] == ["model_step1.pth", "model_step4.pth", "model_step6.pth",
                                             "model_step8.pth", "model_step10.pth", "best.pth"]
    assert by_file["model_step10.pth"]["also"] == ["latest.pth"] and by_file["model_step10.pth"]["latest"]
    assert by_file["model_step10.pth"]["branch"] == by_file["best.pth"]["branch"] is not None
    assert by_file["model_step1.pth"]["branch"] is None and not by_file["model_step10.pth"]["abandoned"]
    assert by_file["best.pth"]["best"] and by_file["model_step4.pth"]["milestone"]
    history = torch.load(out / "latest.pth", weights_only=True)["history"]
    assert by_file["best.pth"]["val"]["loss"] == next(row[1] for row in history["val"] if row[0] == 2)
    assert by_file["model_step1.pth"]["status"] == "INCOMPLETE" and by_file["model_step1.pth"]["reason"]
    assert by_file["model_step4.pth"]["bytes"] == (out / "model_step4.pth").stat().st_size
    # The web page's table is this one: same files, steps, statuses and validation losses.
    page = page_rows(out, Roots([out]))
    assert [(Path(row["file"]).name, row["step"], row["status"]) for row in page] == [
        (row["file"], row["step"], row["status"]) for row in rows]
    assert [row["val_loss"] for row in page] == [None if not row["val"] else round(row["val"]["loss"], 4)
                                                 for row in rows]
    assert page[-1]["val_loss"] is not None and "best.pth" in page[-1]["marks"]
    assert all(row["listen"] is None for row in rows)
    _listened_columns_and_pick(out, tmp_path)


def _listened_columns_and_pick(out: Path, tmp_path: Path) -> None:
    """After `listen` scored some steps (records as it appends them; step 2 is only best.pth now): the CER
    and similarity columns, and `export --pick cer|speaker_sim` takes the best scored file on disk."""
    for step, cer, sim in ((2, 0.01, 0.3), (4, 0.30, 0.5), (6, 0.10, 0.4), (10, 0.20, 0.7), (10, 0.40, 0.7)):
        append_record(scores_path(out), {"format": RECORD_FORMAT, "step": step, "line_id": f"l{cer}", "ok": True,
                                         "cer": cer, "speaker_sim": sim})
    result = subprocess.run([sys.executable, "-m", "indextts_train", "checkpoints", str(out)], capture_output=True,
                            text=True, cwd=ROOT, timeout=300)
    lines = result.stdout.splitlines()
    assert lines[0].split()[:7] == ["file", "step", "epoch", "val", "loss", "CER", "sim"]
    rows = {line.split()[0]: line.split() for line in lines[1:] if line.startswith(("model_", "best"))}
    assert rows["model_step6.pth"][4:6] == ["0.100", "0.400"] and rows["model_step10.pth"][4:6] == ["0.300", "0.700"]
    assert rows["model_step8.pth"][4:6] == ["-", "-"] and rows["best.pth"][4:6] == ["0.010", "0.300"]
    for metric, name, step in (("cer", "best.pth", 2), ("speaker_sim", "model_step10.pth", 10)):
        result = subprocess.run([sys.executable, "-m", "indextts_train", "export", str(out), "--pick", metric,
                                 "-o", str(tmp_path / metric / "gpt.pth")], capture_output=True, text=True,
                                cwd=ROOT, timeout=300)
        assert result.returncode == 0, result.stderr
        assert result.stdout.startswith(f"exported {out / name} (step {step}")
        assert f"; --pick: step {step}: best {metric} " in result.stdout.splitlines()[0]  # why it was picked
    page = {Path(row["file"]).name: row for row in page_rows(out, Roots([out]))}  # the web page shows them too
    assert (page["model_step6.pth"]["cer"], page["model_step6.pth"]["speaker_sim"]) == (0.1, 0.4)


def test_checkpoints_of_a_missing_folder_is_one_line(tmp_path) -> None:
    result = CliRunner().invoke(app, ["checkpoints", str(tmp_path / "nowhere")])
    assert result.exit_code == 2 and "no such run folder" in result.output
    (tmp_path / "latest.pth").write_bytes(b"")  # a file of the run, given for its folder
    for command in ("checkpoints", "listen"):
        result = CliRunner().invoke(app, [command, str(tmp_path / "latest.pth")])
        said = f"error: {tmp_path / 'latest.pth'}: a file, not a run folder; pass the run's --output-dir (the folder "
        assert result.exit_code == 2 and result.output == f"{said}{tmp_path}?)\n"


def test_each_row_says_when_its_file_was_written(tmp_path) -> None:
    (tmp_path / "model_step5.pth").write_bytes(b"PK\x03\x04 not a checkpoint")
    os.utime(tmp_path / "model_step5.pth", (1_700_000_000, 1_700_000_000))
    (row,) = checkpoint_rows(tmp_path)
    assert row["mtime"] == 1_700_000_000 and row["written"] == time.strftime("%Y-%m-%d %H:%M:%S",
                                                                              time.localtime(1_700_000_000))
    table = render_table([row], tmp_path, now=1_700_000_000 + 3 * 3600 + 5)
    (line,) = [line for line in table.splitlines() if line.startswith("model_step5.pth")]
    assert line.split()[-1] == "3h"  # age: no marks on this row
    assert [age_text(s) for s in (0, 59, 60, 7199, 86400 * 3)] == ["0s", "59s", "1m", "1h", "3d"]


def test_a_file_shows_its_own_scores_after_a_rollback(tiny_data, tmp_path) -> None:
    """Records name their checkpoint's branch: a step's scores from an abandoned branch are not the new file's
    (the table showed them on it); an abandoned file shows its own; records that name no branch (written
    before they did) stand for the run folder's file of their step. A CER of 1e308 keeps its column."""
    from indextts_train.checkpoint.lineage import lineage_of

    out = train_tiny_run(tiny_data, tmp_path / "run", max_steps=4)
    branch = lineage_of(out / "model_step4.pth").branch
    abandoned = out / "abandoned" / "before-rollback" / "model_step4.pth"
    abandoned.parent.mkdir(parents=True)
    os.link(out / "model_step2.pth", abandoned.parent / "model_step2.pth")  # an abandoned file: its own branch
    for step, cer, who in ((4, 0.01, "someone-else"), (2, 0.5, None), (2, 0.25, branch), (4, 1e308, branch)):
        record = {"format": RECORD_FORMAT, "step": step, "line_id": f"l{cer}", "ok": True, "cer": cer}
        append_record(scores_path(out), record if who is None else {**record, "branch": who})
    rows = {row["file"]: row for row in checkpoint_rows(out)}
    assert rows["model_step2.pth"]["listen"] == {"lines": 2, "cer": 0.375, "speaker_sim": None}
    assert rows["model_step4.pth"]["listen"] == {"lines": 1, "cer": 1e308, "speaker_sim": None}
    assert rows["abandoned/before-rollback/model_step2.pth"]["listen"] == {"lines": 1, "cer": 0.25,
                                                                           "speaker_sim": None}
    table = render_table(list(rows.values()), out)
    (line,) = [line for line in table.splitlines() if line.startswith("model_step4.pth")]
    (other,) = [line for line in table.splitlines() if line.startswith("model_step2.pth")]
    assert line.split()[4] == "1e+308" and line.index(" COMPLETE") == other.index(" COMPLETE")  # the columns hold


def test_files_are_grouped_by_identity_in_one_look_each(tmp_path, monkeypatch) -> None:
    """Hard links together, a link to nothing alone; each entry stat'ed once (it was each against every group:
    3,000 step files, 4.5 million stat calls)."""
    from indextts_train.checkpoint import table

    for step in range(1, 301):
        (tmp_path / f"model_step{step}.pth").write_bytes(b"x")
    os.link(tmp_path / "model_step300.pth", tmp_path / "latest.pth")
    os.link(tmp_path / "model_step200.pth", tmp_path / "best.pth")
    os.symlink(tmp_path / "gone.pth", tmp_path / "model_step301.pth")
    looks = []
    real_stat = os.stat
    monkeypatch.setattr(os, "stat", lambda path, *a, **kw: looks.append(path) or real_stat(path, *a, **kw))
    groups = table._files(tmp_path, lambda p: True)
    assert [[p.name for p in g] for g in groups if len(g) > 1] == [["model_step200.pth", "best.pth"],
                                                                     ["model_step300.pth", "latest.pth"]]
    assert len(groups) == 301 and [g[0].name for g in groups][:3] == ["model_step1.pth", "model_step2.pth",
                                                                       "model_step3.pth"]
    assert len(looks) <= 2 * 303, len(looks)
