"""The run folder (checkpoint/run_folder.py): one listing answers whether a run may start there, and
with lineage's look which names a resumed run may never replace or delete."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from test_checkpoint_files import make_state

from indextts_train.checkpoint.files import save_checkpoint
from indextts_train.checkpoint.lineage import look
from indextts_train.checkpoint.run_folder import check_no_earlier_run, check_run_folder, survey
from indextts_train.errors import UserError


def test_one_listing_answers_every_question(tmp_path: Path) -> None:
    save_checkpoint(make_state(3), tmp_path, 3, keep=10, best=True)
    torch.save({"w": torch.zeros(2)}, tmp_path / "model_step9.pth")  # a bare state dict someone put there
    (tmp_path / "notes.pth").write_bytes(b"not a checkpoint name")
    folder = survey(tmp_path)
    assert [p.name for p in folder.checkpoints] == [
        "model_step3.pth", "model_step9.pth", "latest.pth"]
    assert folder.best == tmp_path / "best.pth"
    with pytest.raises(UserError, match=r"already holds checkpoints \(latest.pth\); pass --resume auto"):
        check_no_earlier_run(folder)
    assert folder.files == [*folder.checkpoints, tmp_path / "best.pth"]
    assert look(folder).foreign == {"model_step9.pth"}
    (tmp_path / "best.pth").unlink()
    torch.save({"w": torch.zeros(2)}, tmp_path / "best.pth")  # replaced by a file that is not ours
    (tmp_path / "model_step3.pth").unlink()  # latest.pth's twin, replaced by a file that cannot be read
    (tmp_path / "model_step3.pth").write_bytes(b"garbage")
    assert look(folder).foreign == {"model_step9.pth", "model_step3.pth", "best.pth"}


def test_a_new_folder_is_checked_without_making_it(tmp_path: Path) -> None:
    new = tmp_path / "a" / "run"
    folder = survey(new)
    assert (folder.checkpoints, folder.best) == ((), None)
    check_run_folder(new, None)
    assert not (tmp_path / "a").exists()
    (tmp_path / "file").write_text("x")
    with pytest.raises(UserError, match="is a file, so no folder can be made under it"):
        check_run_folder(tmp_path / "file" / "run", "auto")


def test_a_new_run_is_refused_in_what_the_caller_found_to_be_a_corpus(tmp_path: Path) -> None:
    """The run folder takes the corpus answer from its caller (the start asks data/corpus_forms.py once per path,
    with the manifests): a new run is refused there, a run already there goes on."""
    clips = tmp_path / "clips"
    clips.mkdir()
    with pytest.raises(UserError, match=r"--output-dir .*clips holds a folder of 3 clips, not a run"):
        check_run_folder(clips, None, "a folder of 3 clips")
    check_run_folder(clips, None)  # no answer: nothing else it holds is other work
    torch.save({"w": torch.zeros(2)}, clips / "model_step2.pth")
    check_run_folder(clips, "auto", "a folder of 3 clips")  # holds a run: it goes on


def test_a_run_folder_to_read_that_is_a_fifo_is_said_as_such(tmp_path: Path) -> None:
    """`checkpoints FIFO` said "no such run folder"."""
    import os

    from indextts_train.checkpoint.run_folder import run_folder_to_read

    os.mkfifo(tmp_path / "run")
    with pytest.raises(UserError, match=r"run: is a FIFO \(named pipe\), not a run folder; pass the --output-dir"):
        run_folder_to_read(tmp_path / "run")
    with pytest.raises(UserError, match=r"gone: no such run folder"):
        run_folder_to_read(tmp_path / "gone")


def test_the_file_systems_root_is_no_run_folder() -> None:
    """An earlier probe trained with `--output-dir /` (as `/$NAME` with NAME unset gives): its checkpoints, logs
    and run.yaml went among the system's folders."""
    from indextts_train.checkpoint.run_folder import check_output_dir

    for given in ("/", "//", "/tmp/.."):
        with pytest.raises(UserError, match=r"the file system's root, not a folder of the run's own"):
            check_output_dir(Path(given))
    check_output_dir(Path("/tmp/a-new-run"))  # any other folder that can be made is fine
