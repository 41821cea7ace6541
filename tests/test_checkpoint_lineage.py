"""Checkpoint lineage (issue 23): a rollback is a branch of its own, never lost to an abandoned higher step.

A run reached step 8; the user rolls back with `--resume RUN/model_step4.pth`. The new branch must
survive a SIGKILL (`--resume auto` continues it, not the abandoned step 8), its own rotation must not
touch other branches' files, and the abandoned branch's bytes stay under `RUN/abandoned/<branch>/`.
"""

from __future__ import annotations

import json
import shutil
import signal
import sys
from pathlib import Path

import pytest
import torch
from helpers import start
from test_e2e_nothing_lost import assert_same_state, cli, finish, train_args

from indextts_train.checkpoint.files import load_checkpoint, save_checkpoint
from indextts_train.checkpoint.lineage import ABANDONED, OLD_BRANCH, lineage_of, owned_by, set_aside
from indextts_train.checkpoint.state import FORMAT, Lineage, migrate
from indextts_train.webui.records import checkpoint_rows as page_rows
from indextts_train.webui.roots import Roots


@pytest.fixture(scope="module")
def data(tiny_data, tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("lineage_data") / "data"
    shutil.copytree(tiny_data["folder"], folder)
    return folder


@pytest.fixture(scope="module")
def reference(data, tmp_path_factory) -> Path:
    """An uninterrupted 8-step run saved every 2 steps (test_nothing_lost's reference flags)."""
    out = tmp_path_factory.mktemp("lineage_reference") / "run"
    code, stdout, stderr = cli(train_args(data, out))
    assert code == 0, stdout + stderr
    return out


def copy_run(reference: Path, dest: Path) -> Path:
    shutil.copytree(reference, dest, copy_function=shutil.copy2)
    (dest / "latest.pth").unlink()  # copytree copies the hard link as a file: make it a link again
    (dest / "latest.pth").hardlink_to(dest / "model_step8.pth")
    return dest


def rollback_args(data: Path, out: Path) -> list[str]:
    args = train_args(data, out)
    args[args.index("--resume") + 1] = str(out / "model_step4.pth")
    return args


@pytest.mark.slow
def test_rollback_killed_then_resume_auto_equals_an_uninterrupted_rollback(data, reference, tmp_path) -> None:
    step8 = (reference / "model_step8.pth").read_bytes()
    step6 = (reference / "model_step6.pth").read_bytes()
    # The rollback, uninterrupted: from step 4 back to step 8 on a new branch.
    whole = copy_run(reference, tmp_path / "whole")
    code, stdout, stderr = cli(rollback_args(data, whole))
    assert code == 0, stdout + stderr
    # The same rollback, SIGKILLed after the new branch saved step 6, then `--resume auto`.
    killed = copy_run(reference, tmp_path / "killed")
    proc = start([sys.executable, "-m", "indextts_train", *rollback_args(data, killed)],
                 env={"INDEXTTS_TRAIN_CRASH_AT": "step_logged@7"})
    code, output = finish(proc)
    assert code == -signal.SIGKILL, output
    code, stdout, stderr = cli(train_args(data, killed))
    assert code == 0, stdout + stderr
    assert "resuming from" in stdout, stdout + stderr
    assert_same_state(killed / "latest.pth", whole / "latest.pth")
    # The abandoned branch's bytes are kept, under abandoned/<its branch>/.
    old_branch = lineage_of(reference / "model_step8.pth").branch
    kept = killed / ABANDONED / old_branch
    assert (kept / "model_step8.pth").read_bytes() == step8
    assert (kept / "model_step6.pth").read_bytes() == step6
    new = lineage_of(killed / "latest.pth")
    assert new.branch != old_branch and new.parent == old_branch and new.parent_step == 4
    # `checkpoints` lists both branches.
    code, stdout, stderr = cli(["checkpoints", str(killed)])
    assert code == 0, stdout + stderr
    assert f"branch {new.branch}" in stdout and f"abandoned branch {old_branch}" in stdout
    # The web page shows the same table: the same files, steps, statuses and val losses, abandoned included.
    code, stdout, stderr = cli(["checkpoints", str(killed), "--json"])
    assert code == 0, stdout + stderr
    table = [(str(killed / row["file"]), row["step"], row["status"], (row["val"] or {}).get("loss"))
             for row in json.loads(stdout)]
    page = page_rows(killed, Roots([killed]))
    assert [(row["file"], row["step"], row["status"]) for row in page] == [row[:3] for row in table]
    assert [row["val_loss"] for row in page] == [None if v is None else round(v, 4) for _, _, _, v in table]
    assert any(f"abandoned branch {old_branch}" in row["marks"] for row in page)


def test_a_checkpoint_without_lineage_is_migrated_to_an_unknown_branch() -> None:
    state = {"format": FORMAT, "format_version": 2, "progress": {"step": 3}}
    migrated = migrate(state)
    assert migrated["lineage"] == {"branch": None, "parent": None, "parent_step": None, "born": 0, "forks": []}


@pytest.mark.slow
def test_rotation_deletes_only_this_branchs_files_and_milestones_do_not_count(reference, tmp_path) -> None:
    out = copy_run(reference, tmp_path / "run")
    state = load_checkpoint(out / "model_step8.pth")
    others = {name: (out / name).read_bytes() for name in ("model_step2.pth", "model_step4.pth")}
    mine = "b-new"
    state["lineage"] = {"branch": mine, "parent": None, "parent_step": None, "born": 1, "forks": []}
    for step in (10, 12, 14, 16):
        state["progress"]["step"] = step
        save_checkpoint(state, out, step, keep=2, keep_every=12,
                        own=owned_by(Lineage(branch=mine, parent=None, parent_step=None, born=1, forks=[])))
    names = sorted(p.name for p in out.glob("model_step*.pth"))
    # Another branch's files stay; of ours, the milestone 12 stays aside and two others are kept.
    assert names == sorted(["model_step2.pth", "model_step4.pth", "model_step6.pth", "model_step8.pth",
                            "model_step12.pth", "model_step14.pth", "model_step16.pth"])
    assert {name: (out / name).read_bytes() for name in others} == others
    assert torch.equal(load_checkpoint(out / "model_step16.pth")["model"]["text_embedding.weight"],
                       state["model"]["text_embedding.weight"])


@pytest.mark.slow
def test_set_aside_keeps_ancestors_and_never_overwrites_an_abandoned_file(reference, tmp_path) -> None:
    out = copy_run(reference, tmp_path / "run")
    old = lineage_of(out / "model_step8.pth").branch
    step8 = (out / "model_step8.pth").read_bytes()
    folder = out / ABANDONED / old
    folder.mkdir(parents=True)
    (folder / "model_step8.pth").write_bytes(b"an earlier abandoned file of that name")
    branch = Lineage(branch="new", parent=old, parent_step=4, born=2, forks=[[old, 4]])
    moved = set_aside(out, branch, protected=frozenset())
    assert sorted(p.name for p in out.glob("*.pth")) == ["model_step2.pth", "model_step4.pth"]
    assert (folder / "model_step8.pth").read_bytes() == b"an earlier abandoned file of that name"
    assert (folder / "model_step8.1.pth").read_bytes() == step8
    assert not (folder / "latest.pth").exists()  # it was a hard link of model_step8.pth: only the name went
    assert {dest.name for _, dest in moved} == {"model_step8.1.pth", "model_step6.pth"}
    assert set_aside(out, branch, protected=frozenset()) == []  # done once: nothing left to move


@pytest.mark.slow
def test_a_checkpoint_written_before_lineage_resumes_exactly(data, reference, tmp_path) -> None:
    out = tmp_path / "run"
    out.mkdir()
    for step in (2, 4):  # the reference run's first files, as a version before lineage wrote them
        state = torch.load(reference / f"model_step{step}.pth", weights_only=True)
        del state["lineage"]
        del state["progress"]["save_pending"]
        torch.save(state, out / f"model_step{step}.pth")
    (out / "latest.pth").hardlink_to(out / "model_step4.pth")
    code, stdout, stderr = cli(train_args(data, out))
    assert code == 0, stdout + stderr
    assert_same_state(out / "latest.pth", reference / "latest.pth")
    assert lineage_of(out / "latest.pth").branch is None  # it goes on as the old branch
    assert not (out / ABANDONED).exists()


@pytest.mark.parametrize("branch", ["../../outside", "/tmp/elsewhere", "a/b", "..", "", "x" * 200, "a\nb"])
def test_a_branch_read_from_a_file_is_data_never_a_path(tmp_path: Path, branch: str) -> None:
    from test_checkpoint_files import make_state

    out = tmp_path / "run"
    out.mkdir()
    state = make_state(2)
    state["lineage"] = {"branch": branch, "parent": None, "parent_step": None, "born": 5, "forks": []}
    torch.save(state, out / "model_step2.pth")  # save_checkpoint would refuse it: a stranger's file
    assert Lineage.problems(state["lineage"])
    assert lineage_of(out / "model_step2.pth").branch is None  # read as one old branch
    moved = set_aside(out, Lineage(branch="new", parent=None, parent_step=None, born=9, forks=[]), frozenset())
    assert [dest for _, dest in moved] == [out / ABANDONED / OLD_BRANCH / "model_step2.pth"]
    assert sorted(str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*") if p.is_file()) == [
        f"run/{ABANDONED}/{OLD_BRANCH}/model_step2.pth"]
