"""The `listen` command's own lines (listen/command.py)."""

from __future__ import annotations

from indextts_train.listen.command import _why


def test_a_failure_names_only_the_logs_listen_wrote(tmp_path) -> None:
    """A link in synthesis.log's place is left as it is and gets nothing of the run: the line that a line
    failed named it as where to read why."""
    (tmp_path / "elsewhere.txt").write_text("theirs\n")
    (tmp_path / "synthesis.log").symlink_to(tmp_path / "elsewhere.txt")
    assert _why(tmp_path) == [tmp_path / "scores.jsonl"]
    (tmp_path / "synthesis.log").unlink()
    (tmp_path / "synthesis.log").write_text("the child's output\n")
    assert _why(tmp_path) == [tmp_path / "scores.jsonl", tmp_path / "synthesis.log"]
