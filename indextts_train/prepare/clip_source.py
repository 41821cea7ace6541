"""Where an utterance's samples are: a whole file, a segment of a recording (lhotse), or a row of a
Hugging Face dataset (its embedded bytes, or the file it names). The header (planning) and the read
(the loader threads) both go through here, so both see the same frames.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

import numpy as np

from indextts_train.prepare.audio import AudioError, error_detail, load_audio, segment_frames
from indextts_train.prepare.corpus_hf import RowAudioError, row_audio
from indextts_train.prepare.utterance import Utterance


def _opened(utt: Utterance):
    """What soundfile opens: a path, or a fresh BytesIO of a dataset row's bytes. Raises AudioError."""
    if utt.row is None:
        return utt.audio
    try:
        return row_audio(utt.audio, utt.row)
    except RowAudioError as exc:
        raise AudioError(str(exc)) from None
    except Exception as exc:  # pyarrow / datasets: a damaged file; one rejection, not a crash of the loader
        raise AudioError(f"unreadable row {utt.row} of {utt.audio}: {error_detail(exc)}") from None


def audio_header(utt: Utterance) -> tuple[int, int] | str:
    """(frames, sample rate) of the clip from the file header (no decoding), or why it cannot be read.

    A segment's frames are the segment's, counted as the read counts them."""
    import soundfile

    try:
        source = _opened(utt)
    except AudioError as exc:
        return f"audio: {exc}"
    if isinstance(source, str) and not os.path.isfile(source):
        named = "" if utt.row is None else f" ({source})"
        if os.path.exists(source):  # a folder, a FIFO (whose read would block), a device: never opened
            return f"audio: not a regular file{named}, but a {_kind(source)}; name an audio file"
        return f"audio: file not found{named}"
    try:
        info = soundfile.info(source)
    except Exception as exc:  # soundfile raises several types for unreadable files; each is one rejection
        return f"audio: unreadable ({error_detail(exc, -1)})"
    if info.samplerate <= 0:
        return "audio: unreadable (no sample rate)"
    if not utt.is_segment:
        return int(info.frames), int(info.samplerate)
    try:
        _, frames = segment_frames(int(info.frames), int(info.samplerate), utt.offset, utt.duration)
    except AudioError as exc:
        return f"audio: {exc}"
    return frames, int(info.samplerate)


def _kind(path: str) -> str:
    try:
        mode = os.stat(path).st_mode
    except OSError:  # gone since it was looked at
        return "file that went away"
    return "folder" if stat.S_ISDIR(mode) else "FIFO (named pipe)" if stat.S_ISFIFO(mode) else \
        "device" if stat.S_ISCHR(mode) or stat.S_ISBLK(mode) else "socket or other special file"


def read_samples(utt: Utterance) -> tuple[np.ndarray, int]:
    """float32 mono samples of the clip (the segment only) at the file's rate; raises AudioError."""
    source = _opened(utt)
    return load_audio(Path(source) if isinstance(source, str) else source, offset_seconds=utt.offset,
                      duration_seconds=utt.duration)
