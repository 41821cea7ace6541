"""What `listen` shows in TensorBoard, in RUN/logs/listen (a run of its own beside the training curves,
so a training resume's purge never hides it): each line's audio under `listen/LINE`, and per
checkpoint `listen/cer` and `listen/speaker_sim` (means over its lines) at the checkpoint's step."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import torch

from indextts_train.prepare.audio import load_audio
from indextts_train.ui.metrics import open_tensorboard

MAX_AUDIO_SECONDS = 60  # a babbling checkpoint's clip is cut in TensorBoard (the WAV keeps it whole)


class ListenBoard:
    def __init__(self, run_dir: Path, warn: Callable[[str], None]) -> None:
        self.writer = open_tensorboard(Path(run_dir) / "logs" / "listen", lambda line: warn(f"warning: {line}"),
                                       "listening goes on, and scores.jsonl and index.html keep every score")

    def line(self, record: dict, wav: Path) -> None:
        if not record.get("ok"):
            return
        mono, rate = load_audio(wav)
        clip = torch.from_numpy(mono[: MAX_AUDIO_SECONDS * rate]).clamp(-1, 1)[None]  # (1, N)
        self.writer.add_audio(f"listen/{record['line_id']}", clip, record["step"], rate)

    def checkpoint(self, step: int, summary: dict | None) -> None:
        """`summary`: the checkpoint file's means over all its scored lines (scores.Heard.summary), as
        `checkpoints` and the page show them: not only the lines this listen heard (a rerun after a kill hears
        the rest, and its mean alone stood at the step)."""
        for key in ("cer", "speaker_sim"):
            if summary is not None and summary.get(key) is not None:
                self.writer.add_scalar(f"listen/{key}", summary[key], step)
        self.writer.flush()

    def close(self) -> None:
        self.writer.close()
