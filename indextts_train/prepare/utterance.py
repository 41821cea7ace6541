"""What every corpus reader gives: one `Utterance` per clip and transcript, and the defaults it fills in."""

from __future__ import annotations

import hashlib
import json
import math
import os
from dataclasses import dataclass, field

from indextts_train.errors import UserError, text_problem

DEFAULT_SPEAKER = "speaker"
MAX_SECONDS = 86_400.0  # a day of audio: longer than any clip, prompt or batch; beyond it, a typo or an inf


@dataclass(frozen=True)
class Utterance:
    """One clip and its transcript, as a corpus names it."""

    id: str
    audio: str  # absolute path (of the file, the recording, or the Hugging Face dataset when `row` is set)
    text: str
    speaker: str
    language: str | None
    where: str  # "file:line" for messages
    offset: float = 0.0  # seconds into `audio` where the clip starts (a lhotse supervision)
    duration: float | None = None  # seconds from `offset`; None: to the end of the file
    row: int | None = None  # the clip is row `row` of the dataset at `audio` (its audio column, read lazily)
    # Which of "speaker" / "language" the source itself does not name (filled from --speaker / --language,
    # else a fallback such as the file's stem): read_corpora refuses a flag no utterance needed. Not part
    # of what the arrays are computed from, so no record key or equality depends on it.
    lacks: frozenset[str] = field(default=frozenset(), compare=False)

    def __post_init__(self) -> None:
        """Every reader's utterance is checked here, once: a value that would stop the run later (a path
        the OS refuses, a transcript that cannot be written, a NaN time) is named with its line now."""
        for name in ("id", "audio", "text", "speaker", "language"):
            value = getattr(self, name)
            problem = text_problem(value) if value is not None else None
            if problem:
                raise UserError(f"{self.where}: {name} {value!r} {problem}; fix the corpus")
        for name, said in (("offset", "start"), ("duration", "duration")):  # lhotse's words for them
            value = getattr(self, name)
            if value is not None and not (math.isfinite(value) and 0 <= value <= MAX_SECONDS):
                raise UserError(f"{self.where}: {said} {value!r} is not a time in seconds (0 to {MAX_SECONDS:g}); "
                                "fix the corpus")

    @property
    def is_segment(self) -> bool:
        return self.offset != 0.0 or self.duration is not None

    def audio_fields(self) -> dict:
        """How manifests name the clip: `audio` a readable string (`<dataset>#<row>` for a dataset row),
        and for a segment of a longer recording its `offset` and `duration` in seconds."""
        if self.row is not None:
            return {"audio": f"{self.audio}#{self.row}"}
        if self.is_segment:
            return {"audio": self.audio, "offset": self.offset, "duration": self.duration}
        return {"audio": self.audio}

    def source_key(self) -> str:
        """What an utterance's arrays were computed from: its fields, and the audio file's size and change
        time (the quick check make and rsync use; reading every clip again on each rerun would cost as
        much as decoding it). A record whose key differs is stale: a fixed transcript, a replaced clip."""
        try:
            stat = os.stat(self.audio)
            audio = [stat.st_size, stat.st_mtime_ns]
        except OSError:
            audio = None  # missing or unreadable: planning rejects it, nothing is recorded
        fields = [self.id, self.audio, self.offset, self.duration, self.row, self.text, self.speaker,
                  self.language, audio]
        return hashlib.sha256(json.dumps(fields, ensure_ascii=False).encode("utf-8")).hexdigest()[:32]


def lacking(**named: str | None) -> frozenset[str]:
    """Utterance.lacks: the names among `named` (speaker=..., language=...) whose source value is missing or
    empty (the readers fill an empty one from the defaults as they fill a missing one)."""
    return frozenset(name for name, value in named.items() if not value)


@dataclass(frozen=True)
class Defaults:
    """`--speaker` / `--language`: what a source that lacks them gets; `--text-column`: which column of a
    Hugging Face dataset holds the transcript (None: the first of the usual names)."""

    speaker: str | None = None
    language: str | None = None
    text_column: str | None = None

    def __post_init__(self) -> None:
        """An empty value fills nothing in (the readers skip it as they skip a missing one), yet says the
        user meant to: refused, rather than prepare running on as if the flag were not there."""
        for flag, value in (("--speaker", self.speaker), ("--language", self.language),
                            ("--text-column", self.text_column)):
            if value is not None and not value.strip():
                raise UserError(f"{flag} {value!r}: empty; give a value (e.g. {_EXAMPLES[flag]}), or leave the "
                                "flag out")
            problem = text_problem(value) if value is not None else None
            if problem:
                raise UserError(f"{flag} {value!r} {problem}; give another value")


_EXAMPLES = {"--speaker": "--speaker abebe", "--language": "--language am", "--text-column": "--text-column text"}
