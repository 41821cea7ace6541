"""files/atomic.py: `open_append` appends only to a regular file of our own, and never waits on a FIFO."""

from __future__ import annotations

import os

import pytest

from indextts_train.files.atomic import open_append


def _append(path, data: bytes) -> None:
    fd = open_append(path)
    try:
        os.write(fd, data)
    finally:
        os.close(fd)


def test_a_new_or_own_file_is_appended_to(tmp_path) -> None:
    path = tmp_path / "log.txt"
    _append(path, b"one\n")
    _append(path, b"two\n")
    assert path.read_bytes() == b"one\ntwo\n"


def test_a_link_a_fifo_or_a_hard_link_is_refused_and_left_as_it_was(tmp_path) -> None:
    theirs = tmp_path / "theirs.txt"
    theirs.write_bytes(b"mine\n")
    (tmp_path / "link.txt").symlink_to(theirs)
    os.link(theirs, tmp_path / "hard.txt")
    os.mkfifo(tmp_path / "fifo.txt")  # without O_NONBLOCK the open would wait for a reader forever
    for name in ("link.txt", "hard.txt", "fifo.txt"):
        with pytest.raises(OSError):
            open_append(tmp_path / name)
    assert theirs.read_bytes() == b"mine\n" and (tmp_path / "fifo.txt").is_fifo()
