"""What `prepare` shows: a live bar (clips/s, hours of audio done/total, ETA) on rank 0, and a summary."""

from __future__ import annotations

import json
import re
import sys
import time
from pathlib import Path
from types import TracebackType

from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn

from indextts_train.ui.progress import format_duration


class PrepareProgress:
    """A rich bar on a terminal; plain lines every `plain_every` seconds elsewhere (logs, tee, CI)."""

    def __init__(self, *, total_clips: int, total_seconds: float, enabled: bool, plain_every: float = 30.0) -> None:
        self.total_clips, self.total_seconds = total_clips, total_seconds
        self.enabled, self.plain_every = enabled, plain_every
        self.clips = self.computed_clips = 0
        self.seconds = self.computed_seconds = 0.0
        self.started = time.monotonic()
        self.last_plain = self.started
        self.console = Console(stderr=True, highlight=False)
        self.live = enabled and sys.stderr.isatty()
        self.bar = Progress(TextColumn("prepare"), BarColumn(), TextColumn("{task.fields[status]}"),
                            console=self.console, transient=False) if self.live else None
        self.task = self.bar.add_task("prepare", total=max(total_clips, 1), status="") if self.bar else None

    def __enter__(self) -> PrepareProgress:
        if self.bar is not None:
            self.bar.start()
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        if self.bar is not None:
            self.bar.stop()

    def status(self) -> str:
        elapsed = max(time.monotonic() - self.started, 1e-9)
        rate = self.computed_clips / elapsed
        audio_rate = self.computed_seconds / elapsed
        left = (self.total_seconds - self.seconds) / audio_rate if audio_rate > 0 else None
        eta = format_duration(left) if left is not None else "--:--"
        return (f"{self.clips}/{self.total_clips} clips  {rate:.1f} clips/s  "
                f"{self.seconds / 3600:.2f}/{self.total_seconds / 3600:.2f} h audio  ETA {eta}")

    def advance(self, clips: int, seconds: float, *, skipped: bool = False) -> None:
        """`skipped`: complete before this start (a resume); it counts as done but not in the speed."""
        self.clips += clips
        self.seconds += seconds
        if not skipped:
            self.computed_clips += clips
            self.computed_seconds += seconds
        if not self.enabled:
            return
        if self.bar is not None:
            self.bar.update(self.task, completed=self.clips, status=self.status())
        elif skipped and clips:
            self.console.print(f"prepare: {clips} clips complete from an earlier run, skipped")
        elif time.monotonic() - self.last_plain >= self.plain_every:
            self.last_plain = time.monotonic()
            self.console.print(f"prepare: {self.status()}")


def text_coverage(counts: dict) -> str:
    """Text tokens and, with an extended tokenizer, how much of the text its grown pieces make up."""
    line = f"text tokens: {counts['text_tokens']} ({counts['distinct_text_tokens']} distinct)"
    grown = counts["extended_pieces"]
    if not grown:
        return line + "; the tokenizer has no pieces beyond the base model's vocabulary"
    line += (f"; extended pieces: {counts['extended_text_tokens']} tokens ({100 * counts['extended_token_share']:.1f}% "
             f"of the text), {counts['extended_pieces_used']} of the {grown} grown pieces occur")
    unused = grown - counts["extended_pieces_used"]
    if unused:
        line += (f"\nwarning: {unused} grown pieces never occur in these texts: their new rows will not be trained "
                 "(more text of the new language, or a tokenizer grown on text like this corpus)")
    return line


TOP_REASONS = 3


def top_rejections(rejected: list[dict]) -> list[dict]:
    """The most frequent kinds of rejection, each with its count and its first rejected.jsonl line.

    A kind is the reason up to its second colon with numbers as N ("too long: N codes > gpt.max_mel_tokens
    N"; not those inside names such as IndexTTS-2.5), so that
    clips rejected for one cause count together whatever their lengths or characters."""
    kinds: dict[str, list] = {}
    for line in rejected:
        kind = re.sub(r"(?<![\w.-])\d+(\.\d+)?(?![\w.])", "N", ":".join(line["reason"].split(":")[:2]))
        kinds.setdefault(kind, [0, line])[0] += 1
    ranked = sorted(kinds.items(), key=lambda item: -item[1][0])[:TOP_REASONS]  # stable: corpus order on ties
    return [{"reason": kind, "count": count, "example": example} for kind, (count, example) in ranked]


def print_summary(report: dict, out: Path) -> None:
    """The end of a run: kept, rejected by reason, hours, speakers, languages, text-token coverage, files."""
    counts = report["counts"]
    reasons = ", ".join(f"{reason} {n}" for reason, n in counts["rejected_by_reason"].items()) or "none"
    languages = ", ".join(f"{lang} {n}" for lang, n in counts["languages"].items()) or "none"
    print(f"prepared {counts['kept']}/{counts['utterances']} utterances ({report['hours']:.3f} h) of "
          f"{counts['speakers']} speakers; rejected {counts['rejected']} ({reasons}; see {out / 'rejected.jsonl'})")
    for top in counts["rejected_top"]:
        print(f"  {top['count']} x {top['reason']}, e.g. {json.dumps(top['example'], ensure_ascii=False)}")
    print(f"languages: {languages}; pairs: {counts['train_pairs']} train, {counts['val_pairs']} val "
          f"({counts['single_utterance_speakers']} single-utterance speakers left out)")
    fewer, asked = counts.get("targets_with_fewer_prompts"), report.get("settings", {}).get("prompts_per_target")
    if fewer:  # the speaker's other clips are all it can pair with: said, as the pair count alone hides it
        print(f"note: {fewer} target(s) have fewer than --prompts-per-target {asked} prompts: their speakers have "
              "fewer other clips (a prompt is another clip of the target's speaker; a training target takes none "
              "held out for validation)")
    unpaired = report.get("unpaired_targets")
    if unpaired:  # kept, yet in neither manifest: the pair count and the left-out speakers hid them
        print(f"warning: {unpaired} kept clip(s) are in no pair, so they neither train nor validate: every other clip "
              "of their speaker is held out for validation (training targets never take validation audio); add "
              "clips of those speakers, or lower --val-fraction")
    if counts["kept"] and not counts["val_pairs"]:
        print(no_validation_warning(report))
    print(text_coverage(counts))
    print(f"manifests: {out / 'train.jsonl'} for --train-manifest, {out / 'val.jsonl'} for --val-manifest; "
          f"{out / 'utterances.jsonl'} lists every utterance, the held-out ones too")  # which file goes where


def no_validation_warning(report: dict) -> str:
    """What to do when the split left no validation pair (val.jsonl is empty: train-gpt refuses it)."""
    settings, counts = report["settings"], report["counts"]
    rule = (f"--val-speakers {settings['val_speakers']} held out no speaker with two clips or more"
            if settings["val_speakers"] else
            f"no clip of a speaker with two clips or more fell in --val-fraction {settings['val_fraction']:g}")
    return (f"warning: 0 validation pairs ({rule}; {counts['kept']} clips kept, {counts['speakers']} speakers): "
            "val.jsonl is empty and train-gpt refuses it as --val-manifest; rerun with a larger --val-fraction "
            "(e.g. 0.2) or --val-speakers 1, add clips, or train without --val-manifest")
