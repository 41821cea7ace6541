"""files/atomic.py: what this program writes goes only to files of its own: `open_append` and
`atomic_write` refuse a link, a FIFO or a hard link at their name, and never wait on a FIFO."""

from __future__ import annotations

import os

import pytest

from indextts_train.files.atomic import atomic_write_bytes, link_or_copy, open_append, temp_name


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


def test_atomic_write_reuses_its_own_stale_temp_and_never_writes_through_another_file_at_its_name(tmp_path) -> None:
    """The temp name is `.NAME.tmp-PID`, and containers reuse PIDs: a killed writer's temp is reused, but a
    link, a FIFO or a hard link under that name was opened with open(..., "wb"), written through (or waited
    on for a reader) and then removed."""
    final = tmp_path / "latest.pth"
    temp_name(final).write_bytes(b"a killed writer's half file, longer than what follows")
    atomic_write_bytes(final, b"new")
    assert final.read_bytes() == b"new" and not temp_name(final).exists()
    theirs = tmp_path / "theirs.txt"
    for kind, make in (("a link", lambda t: t.symlink_to(theirs)), ("another hard link", lambda t: os.link(theirs, t)),
                       ("not a regular file", os.mkfifo)):
        theirs.write_bytes(b"mine\n")
        make(temp_name(final))
        with pytest.raises(OSError, match=kind):
            atomic_write_bytes(final, b"newer")
        assert theirs.read_bytes() == b"mine\n" and final.read_bytes() == b"new"
        assert os.path.lexists(temp_name(final))  # left as it was
        temp_name(final).unlink()


def test_link_or_copy_never_writes_over_a_name_that_exists(tmp_path, monkeypatch) -> None:
    source, dest, theirs = tmp_path / "source", tmp_path / "dest", tmp_path / "theirs"
    source.write_bytes(b"checkpoint")
    theirs.write_bytes(b"mine")
    dest.symlink_to(theirs)
    with pytest.raises(FileExistsError):
        link_or_copy(source, dest)
    monkeypatch.setattr(os, "link", lambda *a: (_ for _ in ()).throw(OSError(18, "Invalid cross-device link")))
    with pytest.raises(FileExistsError):  # the copy where links fail makes a new file, never opens an old one
        link_or_copy(source, dest)
    assert theirs.read_bytes() == b"mine"
    link_or_copy(source, tmp_path / "copy")
    assert (tmp_path / "copy").read_bytes() == b"checkpoint"
