"""prepare's progress line: clips, clips/s, hours done/total and an ETA from this start's own speed."""

from __future__ import annotations

from indextts_train.prepare import progress
from indextts_train.prepare.progress import PrepareProgress


def test_status_counts_resumed_work_as_done_but_not_in_the_speed(monkeypatch) -> None:
    now = [100.0]
    monkeypatch.setattr(progress.time, "monotonic", lambda: now[0])
    bar = PrepareProgress(total_clips=10, total_seconds=7200.0, enabled=False)
    bar.advance(4, 3600.0, skipped=True)  # complete before this start
    now[0] += 10.0
    bar.advance(2, 360.0)
    assert bar.status() == "6/10 clips  0.2 clips/s  1.10/2.00 h audio  ETA 1:30"  # (7200 - 3960) s left at 36 s/s


def test_the_summary_says_which_manifest_goes_to_which_flag(capsys, tmp_path) -> None:
    """utterances.jsonl (every line) as --train-manifest beside val.jsonl trained on the held-out lines: the
    summary's last line says which file goes where."""
    from indextts_train.prepare.progress import print_summary

    counts = {"kept": 4, "utterances": 4, "speakers": 2, "rejected": 0, "rejected_by_reason": {}, "rejected_top": [],
              "languages": {}, "train_pairs": 3, "val_pairs": 1, "single_utterance_speakers": 0, "text_tokens": 20,
              "distinct_text_tokens": 9, "extended_pieces": 0}
    print_summary({"counts": counts, "hours": 0.001}, tmp_path)
    last = capsys.readouterr().out.strip().splitlines()[-1]
    assert last == (f"manifests: {tmp_path / 'train.jsonl'} for --train-manifest, {tmp_path / 'val.jsonl'} for "
                    f"--val-manifest; {tmp_path / 'utterances.jsonl'} lists every utterance, the held-out ones too")
