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
