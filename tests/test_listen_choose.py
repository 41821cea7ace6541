"""`listen --checkpoints`: which checkpoints are heard, and one line for a word that names none."""

from __future__ import annotations

import os

import pytest

from indextts_train.errors import UserError
from indextts_train.listen.choose import choose_checkpoints


@pytest.mark.parametrize("word", ["step²", "step٤", "step 4", "STEP4"])
def test_a_step_that_is_no_ascii_number_is_one_line(tmp_path, word) -> None:
    """`step²` passed str.isdigit and ended in int()'s ValueError (a traceback); `step٤` was taken as step4."""
    with pytest.raises(UserError, match=r"expected best, latest, stepN \(e.g. step500\) or all, comma-separated"):
        choose_checkpoints(tmp_path, word)


def test_a_fifo_under_a_checkpoint_s_name_is_said_as_such(tmp_path) -> None:
    """It exists (`checkpoints` lists it as a FIFO): "does not exist" misled."""
    os.mkfifo(tmp_path / "model_step6.pth")
    os.mkfifo(tmp_path / "latest.pth")
    with pytest.raises(UserError, match=rf"^--checkpoints step6: {tmp_path}/model_step6.pth is a FIFO \(named pipe\), "
                                        "not a file; `indextts-train checkpoints"):
        choose_checkpoints(tmp_path, "step6")
    with pytest.raises(UserError, match=r"^--checkpoints latest: .*latest.pth is a FIFO \(named pipe\), not a file"):
        choose_checkpoints(tmp_path, "latest")
    with pytest.raises(UserError, match=r"model_step7.pth does not exist"):
        choose_checkpoints(tmp_path, "step7")


def test_all_says_which_checkpoint_names_hold_no_file(tmp_path) -> None:
    """`all` left a FIFO under a checkpoint's name out without a word (`checkpoints` lists it)."""
    os.mkfifo(tmp_path / "model_step6.pth")
    (tmp_path / "best.pth").mkdir()
    with pytest.raises(UserError, match=r"no COMPLETE checkpoint to hear \(left out best.pth: it is a folder, not a "
                                        r"file; left out model_step6.pth: it is a FIFO \(named pipe\), not a file\)"):
        choose_checkpoints(tmp_path, "all")


@pytest.mark.parametrize("spec", [",", "", " , "])
def test_a_list_without_names_is_refused_not_taken_for_all(tmp_path, spec) -> None:
    with pytest.raises(UserError, match=rf"^--checkpoints {spec!r} names no checkpoint; give best, latest"):
        choose_checkpoints(tmp_path, spec)
