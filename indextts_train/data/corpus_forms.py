"""A corpus for `prepare` told apart from a manifest of prepared features, by what it looks like.

`prepare` reads clips and transcripts (prepare/corpus.py reads each form); train-gpt, check-data,
evaluate and tokenize read the manifests it writes. A newcomer often passes the one for the other: a
`metadata.csv` or a folder of WAVs as `--train-manifest`. The commands ask `refuse_corpus` once for each
manifest path, before it is read (train's checks before work, check-data, evaluate, tokenize), so that
the refusal names the command the file is for instead of saying "not valid JSON" or "is a folder". A
JSONL of `{"audio", "text"}` lines is told by its line, where the line's form is judged (data/lines.py),
so no file is read here.

What is looked at is bounded: the name, and at most LOOKED_AT entries of a folder (and of a few of its
subfolders).
"""

from __future__ import annotations

import os
import shlex
from pathlib import Path

from indextts_train.errors import UserError

PREPARE_RECORD = "prepare.json"  # written by `prepare` beside the manifests it writes: a folder of features
AUDIO_SUFFIXES = (".wav", ".flac", ".mp3", ".ogg", ".opus")
TRANSCRIPT_SUFFIXES = (".txt", ".lab")
LOOKED_AT = 1000  # entries of one folder looked at for clips
SUBFOLDERS = 8  # speaker folders looked into when the folder itself holds no clip
_TABLES = {".csv": "an LJSpeech-style metadata.csv", ".tsv": "a Common Voice .tsv",
           ".parquet": "a Hugging Face dataset file", ".arrow": "a Hugging Face dataset file"}


def _entries(folder: Path) -> list[os.DirEntry]:
    try:
        with os.scandir(folder) as scan:
            return [entry for _, entry in zip(range(LOOKED_AT), scan, strict=False)]
    except OSError:  # unreadable: not ours to judge here; the reader says what is wrong with it
        return []


def _holds_clips(folder: Path) -> bool:
    entries = _entries(folder)
    if any(e.name.lower().endswith(AUDIO_SUFFIXES) for e in entries):
        return True
    subfolders = [e for e in entries if e.is_dir(follow_symlinks=False)][:SUBFOLDERS]
    return any(e.name.lower().endswith(AUDIO_SUFFIXES) for sub in subfolders for e in _entries(Path(sub.path)))


def corpus_form(path: Path) -> str | None:
    """The corpus form `path` has ("an LJSpeech folder", "a folder of audio clips", ...), or None."""
    path = Path(path)
    name = path.name.lower()
    if not path.exists():  # the reader says it is not there
        return None
    if path.is_dir():
        if (path / "metadata.csv").is_file():
            return "an LJSpeech folder"
        return "a folder of audio clips" if _holds_clips(path) else None
    if name.endswith(AUDIO_SUFFIXES):
        return "an audio clip"
    return next((form for suffix, form in _TABLES.items() if name.endswith(suffix)), None)


def prepare_command(corpus: Path | str) -> str:
    """What to run to make a manifest of `corpus`, and what to pass then."""
    return (f"run `indextts-train prepare {shlex.quote(str(corpus))} --model-dir MODEL_DIR --out FEATURES` "
            "(MODEL_DIR: the official model folder), then pass FEATURES/train.jsonl")


def refuse_corpus(path: Path | str, flag: str | None = None) -> None:
    """One line, when `path` is a corpus given where a manifest belongs: what to run to make the manifest."""
    form = corpus_form(Path(path))
    if form is None:
        return
    named = f"{flag} {path}" if flag else str(path)
    corpus = Path(path).parent if form == "an audio clip" else Path(path)  # prepare reads the folder of clips
    val = " (and FEATURES/val.jsonl to --val-manifest)" if flag == "--train-manifest" else ""
    raise UserError(f"{named} is {form}, a corpus for `indextts-train prepare`, not a manifest; "
                    f"{prepare_command(corpus)}{val}")
