"""index.html: one row per line, one column per checkpoint, errors marked, every text escaped."""

from __future__ import annotations

import pytest

from indextts_train.checkpoint.scores import RECORD_FORMAT, append_record, scores_path
from indextts_train.errors import UserError
from indextts_train.listen.page import check_page, marked_transcript, render_page, write_page


def _record(step, line_id, text, transcript, **extra):
    return {"format": RECORD_FORMAT, "step": step, "line_id": line_id, "text": text, "transcript": transcript,
            "ok": True, "wav": f"step{step}/{line_id}.wav", "cer": 0.25, "speaker_sim": 0.5,
            "gpt_model_dim": 1280, "asr": {"model": "openai/whisper-small", "parameters": 240_000_000},
            "prompt_audio": "/data/p.wav", "reference_audio": None, **extra}


def test_marked_transcript():
    assert marked_transcript("abc", "abd") == 'ab<mark class="sub" title="expected c">d</mark>'
    assert marked_transcript("abc", "ac") == 'a<del title="missing">b</del>c'
    assert marked_transcript("ab", "ab<") == 'ab<mark class="ins" title="not in the text">&lt;</mark>'


def test_page_has_a_row_per_line_and_a_column_per_checkpoint(tmp_path):
    path = scores_path(tmp_path)
    append_record(path, _record(100, "l1", "good day", "good day"))
    append_record(path, _record(100, "l2", "<script>alert(1)</script>", "script"))
    append_record(path, _record(200, "l1", "good day", "god day"))
    append_record(path, {**_record(200, "l2", "<script>alert(1)</script>", ""), "ok": False,
                         "error": "inference process exited with code 1: <boom>"})
    page = write_page(tmp_path).read_text(encoding="utf-8")
    assert page.count("<tr>") == 3  # the header and two lines
    assert "<th>step 100" in page and "<th>step 200" in page
    assert "<script>" not in page and "&lt;script&gt;alert(1)&lt;/script&gt;" in page
    assert "failed: inference process exited with code 1: &lt;boom&gt;" in page
    assert 'src="step200/l1.wav"' in page
    assert page.count('<del title="missing">o</del>') == 1  # "god" for "good": one o missing
    assert "mean nothing" not in page
    assert "NFKC" in page


def test_page_says_when_the_models_are_tiny(tmp_path):
    append_record(scores_path(tmp_path), _record(5, "l1", "abc", "xyz", gpt_model_dim=32))
    assert "mean nothing" in render_page(tmp_path)


def test_empty_record(tmp_path):
    assert "No checkpoint has been heard yet" in render_page(tmp_path)


# The head of a page written by releases before the generator tag: still ours, replaced as before.
OLD_PAGE = ("<!doctype html><html><head><meta charset='utf-8'><title>run: listen</title><style>body{font-family:"
            "sans-serif;margin:1em}table{border-collapse:collapse}</style></head><body></body></html>\n")


def test_only_a_page_of_ours_is_replaced(tmp_path):
    """RUN/listen/index.html is replaced when it is none yet or a page listen wrote (this release's or an
    older one's); someone's own page there, or a link, is refused before any work and left as it was."""
    check_page(tmp_path)  # none yet
    page = write_page(tmp_path)
    check_page(tmp_path)  # ours
    page.write_text(OLD_PAGE, encoding="utf-8")
    check_page(tmp_path)  # ours, from before the tag
    someone = tmp_path / "mine.html"
    someone.write_text("<html>my own notes</html>", encoding="utf-8")
    for kind in ("file", "link"):
        page.unlink()
        if kind == "file":
            page.write_text("<html>my own notes</html>", encoding="utf-8")
        else:
            page.symlink_to(someone)
        with pytest.raises(UserError, match="index.html: not a page listen wrote, and listen writes its page there"):
            check_page(tmp_path)
    page.unlink()
    page.symlink_to(tmp_path / "listen" / "elsewhere.html")  # a link to a page of ours is not ours either
    (tmp_path / "listen" / "elsewhere.html").write_text(render_page(tmp_path), encoding="utf-8")
    with pytest.raises(UserError, match="not a page listen wrote"):
        check_page(tmp_path)
    assert someone.read_text(encoding="utf-8") == "<html>my own notes</html>"


def test_the_page_shows_the_scores_checkpoints_shows(tmp_path):
    """A NaN, a CER of -5 or `"ok": "false"` in a hand-edited scores.jsonl: `checkpoints` and `export --pick`
    count none of them, the page's column head averaged them (CER 26.1 against the table's 57.3, similarity
    nan) and showed the line as scored."""
    path = scores_path(tmp_path)
    append_record(path, _record(8, "a", "good day", "good day", cer=0.5, speaker_sim=0.9))
    append_record(path, _record(8, "b", "good day", "good day", cer=-5, speaker_sim=float("nan")))
    append_record(path, _record(8, "c", "good day", "good day", ok="false", error="stand-in failure"))
    page = render_page(tmp_path)
    assert "CER 0.500 · similarity 0.900 · 2 line(s)" in page
    assert "CER -5" not in page and "nan" not in page and "failed: stand-in failure" in page


def test_a_lone_surrogate_in_the_scores_does_not_end_listen(tmp_path):
    """`"line_id": "\\ud800"` is valid JSON but no UTF-8: writing the page ended listen in a traceback."""
    path = scores_path(tmp_path)
    path.parent.mkdir()
    line = '{"format": "%s", "step": 2, "line_id": "\\ud800", "ok": true, "cer": 0.5, "text": "x\\udfff"}\n'
    path.write_text(line % RECORD_FORMAT, encoding="utf-8")
    assert "CER 0.500" in write_page(tmp_path).read_text(encoding="utf-8")


def test_after_a_rollback_the_page_shows_the_file_on_disk(tmp_path):
    """The step-4 file of a rollback's new branch has no scores yet: the page showed the abandoned step-4
    file's (as if the new one had been heard), while `checkpoints` showed none."""
    import torch

    from indextts_train.checkpoint.state import FORMAT

    torch.save({"format": FORMAT, "progress": {"step": 4},
                "lineage": {"branch": "new", "parent": "old", "parent_step": 2, "born": 2, "forks": []}},
               tmp_path / "model_step4.pth")
    append_record(scores_path(tmp_path), _record(4, "a", "good day", "good day", branch="old"))
    assert "No checkpoint has been heard yet" in render_page(tmp_path)
    append_record(scores_path(tmp_path), _record(4, "a", "good day", "god day", branch="new"))
    assert "<th>step 4" in render_page(tmp_path) and '<del title="missing">o</del>' in render_page(tmp_path)
