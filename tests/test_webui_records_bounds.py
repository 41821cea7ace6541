"""What the page reads of a run folder by itself is read with bounded work and only inside the roots: the
TensorBoard files behind the loss curves (a byte budget, a cap on the points and series kept), the listen
scores behind the checkpoint table (not through a link leading outside), and train.log, which Start
opens in the folder it checked (a folder swapped for a link afterwards is refused, not written through)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from indextts_train.checkpoint import scores
from indextts_train.checkpoint.scores import RECORD_FORMAT, scores_path
from indextts_train.errors import UserError
from indextts_train.webui import records, runs
from indextts_train.webui.roots import Roots
from indextts_train.webui.runs import RunRegistry
from indextts_train.webui.server import PageServer


@pytest.fixture()
def folders(tmp_path: Path) -> dict[str, Path]:
    root, outside = tmp_path / "root", tmp_path / "outside"
    for folder in (root / "run", outside):
        folder.mkdir(parents=True)
    return {"root": root, "outside": outside}


def _write_losses(folder: Path, steps: range, value: float = 1.0, tags: tuple[str, ...] = ("train/loss",)) -> Path:
    """One TensorBoard events file in `folder`, as the trainer writes it (torch's SummaryWriter)."""
    from torch.utils.tensorboard import SummaryWriter

    before = set(folder.glob("events.out.tfevents.*"))
    with SummaryWriter(str(folder)) as writer:
        for step in steps:
            for tag in tags:
                writer.add_scalar(tag, value + step, step)
    (path,) = set(folder.glob("events.out.tfevents.*")) - before
    return path


def test_a_long_curve_keeps_a_sample_of_its_points_the_last_one_among_them(folders) -> None:
    """A curve of 1,500 points keeps MAX_POINTS (TensorBoard's reservoir), not all: a file of a million
    scalars kept a million (+383 MB on every refresh)."""
    run = folders["root"] / "run"
    _write_losses(run / "logs" / "run", range(1, 1501), tags=("train/loss", "train/lr"))
    curves = records.loss_curves(run, Roots([folders["root"]]))
    assert len(curves) == 1000 == records.MAX_POINTS
    assert {tag for tag, _, _ in curves} == {"train/loss"}
    assert curves[-1] == ("train/loss", 1500, 1501.0)
    assert all(value == step + 1.0 for _, step, value in curves)  # sampled, never mixed up


def test_loss_series_past_the_cap_are_not_kept(folders, monkeypatch) -> None:
    monkeypatch.setattr(records, "MAX_CURVES", 2)
    run = folders["root"] / "run"
    _write_losses(run / "logs" / "run", range(1, 4), tags=("a/loss", "b/loss", "c/loss"))
    curves = records.loss_curves(run, Roots([folders["root"]]))
    assert {tag for tag, _, _ in curves} == {"a/loss", "b/loss"} and len(curves) == 6


def test_only_the_newest_event_files_within_the_byte_budget_are_read(folders, monkeypatch) -> None:
    """Files are taken newest first while their sizes fit MAX_CURVE_BYTES; an older file (and folder) past
    it is not opened at all. Before, every file was read whole, whatever its size."""
    run = folders["root"] / "run"
    old_file = _write_losses(run / "logs" / "run_1", range(1, 201), value=100.0)
    new_file = _write_losses(run / "logs" / "run_2", range(150, 161))
    opened: list[str] = []
    real = records._tfrecords

    def counted(path: str, size: int):
        opened.append(os.path.basename(path))
        return real(path, size)

    monkeypatch.setattr(records, "_tfrecords", counted)
    monkeypatch.setattr(records, "MAX_CURVE_BYTES", new_file.stat().st_size + old_file.stat().st_size - 1)
    curves = records.loss_curves(run, Roots([folders["root"]]))
    assert opened == [new_file.name]
    assert [step for _, step, _ in curves] == list(range(150, 161))

    monkeypatch.setattr(records, "MAX_CURVE_BYTES", new_file.stat().st_size - 1)  # the newest alone is over it
    opened.clear()
    assert records.loss_curves(run, Roots([folders["root"]])) == [] and opened == []

    monkeypatch.setattr(records, "MAX_CURVE_BYTES", new_file.stat().st_size + old_file.stat().st_size)
    steps = [step for _, step, _ in records.loss_curves(run, Roots([folders["root"]]))]
    assert steps == list(range(1, 201))  # both fit: the later folder wins where both logged a step


def test_a_file_is_read_no_further_than_the_size_budgeted(folders) -> None:
    """The size taken when the budget was counted bounds the read: a file that grew since (or a record
    whose length field claims more than is left) ends the read there."""
    path = _write_losses(folders["root"] / "tb", range(1, 51))
    whole = list(records._tfrecords(str(path), path.stat().st_size))
    assert len(whole) == 51  # the file-version record, then one a step
    cut = sum(len(data) + 16 for data in whole[:10])
    assert list(records._tfrecords(str(path), cut + 15)) == whole[:10]
    assert list(records._tfrecords(str(path), cut)) == whole[:10]
    path.write_bytes((1 << 40).to_bytes(8, "little") + bytes(8))  # a length far past the file
    assert list(records._tfrecords(str(path), path.stat().st_size)) == []


def test_listen_scores_that_lead_outside_the_roots_are_not_read(folders, monkeypatch) -> None:
    """checkpoint_rows read RUN/listen/scores.jsonl through a symlink to outside the roots; now it is
    not opened (Watch names the link), while a scores file of the run's own is still read."""
    root, outside = folders["root"], folders["outside"]
    secret = outside / "scores.jsonl"
    secret.write_text(f'{{"format": "{RECORD_FORMAT}", "step": 3, "line_id": "a", "ok": true, "cer": 0.5}}\n')
    read: list[Path] = []
    real = scores.read_bounded

    def spied(path, *args, **kwargs):
        read.append(Path(path))
        return real(path, *args, **kwargs)

    monkeypatch.setattr(scores, "read_bounded", spied)
    roots = Roots([root])
    mine = root / "mine"
    (mine / "listen").mkdir(parents=True)
    scores_path(mine).write_text(secret.read_text())
    assert records.checkpoint_rows(mine, roots) == [] and read == [scores_path(mine)]

    for run, link, target in ((root / "run", scores_path(root / "run"), secret),
                              (root / "run2", root / "run2" / "listen", outside)):
        link.parent.mkdir(parents=True, exist_ok=True)
        link.symlink_to(target)
        read.clear()
        assert records.checkpoint_rows(run, roots) == [] and read == []
        notices = PageServer(roots).watch(str(run))[4]
        assert f"not used (leads outside the folders this page may touch): {link.relative_to(run)} ->" in notices


@pytest.mark.parametrize("swapped", ["run", "parent"])
def test_a_folder_swapped_for_a_link_after_the_check_is_not_written_through(folders, swapped) -> None:
    """Start re-resolved the output dir and opened train.log by path: a folder (or a folder above it)
    replaced by a symlink to outside after the page checked it got train.log written outside. Now the
    folder is opened a part at a time without following links, and train.log in that open folder."""
    root, outside = folders["root"], folders["outside"]
    checked = Roots([root]).inside(str(root / "a" / "run"), "Output dir")  # what the page checked and passes on
    (outside / "run").mkdir()
    if swapped == "run":
        (root / "a").mkdir()
        (root / "a" / "run").symlink_to(outside / "run")
    else:
        (root / "a").symlink_to(outside)
    with pytest.raises(UserError, match="a part of it is a symbolic link"):
        RunRegistry().start([sys.executable, "-c", "pass"], checked)  # refused before any process starts
    assert list((outside / "run").iterdir()) == []

    if swapped == "parent":
        (root / "a").unlink()
    else:
        (root / "a" / "run").unlink()
    with runs._open_log(checked) as log:  # no link: the folder is made, its log opened to append
        log.write(b"mine\n")
    assert (checked / "train.log").read_text() == "mine\n" and list((outside / "run").iterdir()) == []


def test_watch_says_when_the_curves_leave_tensorboard_logs_out(folders, monkeypatch) -> None:
    """Past the byte budget the plot was silent: older logs left out looked like a run that began later, and a
    newest file alone over the budget (a long run logging every step) showed no curve with no word why."""
    run = folders["root"] / "run"
    roots = Roots([folders["root"]])
    assert records.curves_left_out(run, roots) is None  # no logs yet
    old_file = _write_losses(run / "logs" / "run_1", range(1, 201), value=100.0)
    new_file = _write_losses(run / "logs" / "run_2", range(150, 161))
    assert records.curves_left_out(run, roots) is None  # everything is read
    monkeypatch.setattr(records, "MAX_CURVE_BYTES", new_file.stat().st_size + old_file.stat().st_size - 1)
    said = records.curves_left_out(run, roots)
    assert said.startswith("loss curves: older TensorBoard logs are left out") and f"--logdir {run / 'logs'}" in said
    monkeypatch.setattr(records, "MAX_CURVE_BYTES", new_file.stat().st_size - 1)
    said = records.curves_left_out(run, roots)
    assert said.startswith(f"no loss curve: {run / 'logs' / 'run_2' / new_file.name} is ")
    assert "MiB, more than the 0 MiB of TensorBoard logs this page reads" in said
    notices = PageServer(roots).watch(str(run))[4]  # Watch's box of warnings
    assert said in notices.splitlines()
