"""Audio as official IndexTTS inference reads a prompt: one read, two resampling paths.

Speaker path (codes, `condition`, the 2.5 fbank): librosa's default load (soundfile read, channel
mean, soxr `soxr_hq` to 22,050 Hz, length `ceil(N * 22050 / sr)`), the prompt cut at 22,050 Hz, then
torchaudio's `Resample(22050, 16000)` windowed-sinc kernel. Emotion path (`emo_vec`): soxr straight to
16 kHz with the same length rule, then the cut. librosa and torchaudio are not dependencies: soxr is
the library librosa calls (bitwise equal), and the sinc kernel is rebuilt here in torch, in float64
and stored as float32 as torchaudio does (reference README section 1).

soundfile and soxr belong to the optional `[prepare]` extra, so they are imported where used.
"""

from __future__ import annotations

import math
import re
from functools import lru_cache
from pathlib import Path
from typing import BinaryIO

import numpy as np
import torch
import torch.nn.functional as F

LIBROSA_RATE = 22050  # librosa.load's default rate: the speaker path goes through it
W2V_RATE = 16000  # what w2v-BERT, the codecs and CAMPPlus are fed
# Longest stretch of audio load_audio decodes. Bounds memory for a stray hour-long file; a TTS
# training clip is well under a minute (max_mel_tokens 1815 codes = 36 s at 50 Hz).
MAX_LOAD_SECONDS = 600.0
SINC_ZERO_CROSSINGS = 6  # torchaudio Resample defaults: lowpass_filter_width 6, rolloff 0.99, Hann
SINC_ROLLOFF = 0.99


class AudioError(Exception):
    """A clip that cannot be used; str() is the reason, for rejected.jsonl."""


_OBJECT_REPR = re.compile(r"<[^<>]* object at 0x[0-9a-fA-F]+>")


def error_detail(exc: BaseException, line: int = 0) -> str:
    """One line of a library's error for rejected.jsonl, the same bytes in every run: libsndfile names an
    in-memory file by its repr (`<_io.BytesIO object at 0x7f...>`), whose address changes from run to run."""
    detail = (str(exc).strip().splitlines() or [type(exc).__name__])[line]
    return _OBJECT_REPR.sub("(embedded bytes)", detail)


def _read_error(path, exc: BaseException) -> AudioError:
    first = error_detail(exc)
    name = path if isinstance(path, (str, Path)) else "(embedded bytes)"
    return AudioError(f"unreadable audio file {name}: {first}")


def segment_frames(total: int, rate: int, offset_seconds: float, duration_seconds: float | None) -> tuple[int, int]:
    """(first frame, frame count) of a selection in a file of `total` frames, counted in whole samples as
    librosa counts them; the header (planning) and the read share this rule. Raises AudioError."""
    start = int(offset_seconds * rate)
    if start < 0 or (start > 0 and start >= total):
        raise AudioError(f"offset {offset_seconds:g} s lies outside the {total / rate:.2f} s of the file")
    frames = total - start if duration_seconds is None else int(duration_seconds * rate)
    return start, max(0, min(frames, total - start))


def _read_segment(handle, offset_seconds: float, duration_seconds: float | None,
                  max_seconds: float | None) -> np.ndarray:
    """The selected frames of an open soundfile as float32 (N, channels), bounded by max_seconds."""
    rate = int(handle.samplerate)
    start, frames = segment_frames(int(handle.frames), rate, offset_seconds, duration_seconds)
    if max_seconds is not None and frames > max_seconds * rate:
        raise AudioError(f"{frames / rate:.1f} s of audio, more than the {max_seconds:g} s this reads")
    if start > 0:
        handle.seek(start)
    return handle.read(frames, dtype="float32", always_2d=True)


def load_audio(path: Path | BinaryIO, *, offset_seconds: float = 0.0, duration_seconds: float | None = None,
               max_seconds: float | None = MAX_LOAD_SECONDS) -> tuple[np.ndarray, int]:
    """float32 mono samples at the file's own rate, read as librosa.load(mono=True, sr=None) reads them.

    Several channels are averaged in float32 (librosa's to_mono), 16-bit PCM is divided by 32768.
    `offset_seconds` / `duration_seconds` select a segment (a lhotse supervision), counted in whole
    samples as librosa counts them. A selection longer than `max_seconds` is refused before decoding.
    `path` may also be an open binary file (a Hugging Face row's embedded bytes in a BytesIO).
    Raises AudioError for a missing, unreadable, empty, too long or non-finite clip.
    """
    import soundfile

    try:
        with soundfile.SoundFile(str(path) if isinstance(path, (str, Path)) else path) as handle:
            rate = int(handle.samplerate)
            data = _read_segment(handle, offset_seconds, duration_seconds, max_seconds)  # (N, channels)
    except AudioError:
        raise
    except Exception as exc:  # soundfile raises LibsndfileError, RuntimeError, OSError, TypeError, ...
        raise _read_error(path, exc) from exc
    if data.shape[0] == 0:
        raise AudioError("empty audio (0 samples)")
    mono = np.mean(data.T, axis=0) if data.shape[1] > 1 else data[:, 0]  # librosa: mean over the channel axis
    mono = np.ascontiguousarray(mono, dtype=np.float32)
    if not np.isfinite(mono).all():
        raise AudioError("audio holds NaN or infinite samples")
    return mono, rate


def soxr_resample(mono: np.ndarray, sr: int, target: int) -> np.ndarray:
    """librosa.resample(res_type="soxr_hq"): soxr, then zero-padded or trimmed to ceil(N * target / sr)."""
    if sr == target:
        return mono
    import soxr

    out = soxr.resample(mono, sr, target, quality="soxr_hq").astype(np.float32, copy=False)
    size = int(np.ceil(mono.shape[-1] * (float(target) / sr)))
    if out.shape[0] >= size:
        return np.ascontiguousarray(out[:size])
    return np.concatenate([out, np.zeros(size - out.shape[0], dtype=np.float32)])


@lru_cache(maxsize=8)
def sinc_kernel(orig: int, new: int) -> tuple[torch.Tensor, int]:
    """torchaudio's windowed-sinc (Hann) resampling kernel for reduced rates orig -> new.

    Built in float64 and returned as float32 (new, 1, 2 * width + orig), as transforms.Resample
    stores it; width is the number of input samples the kernel reaches beyond one period.
    """
    cutoff = min(orig, new) * SINC_ROLLOFF
    width = math.ceil(SINC_ZERO_CROSSINGS * orig / cutoff)
    offsets = torch.arange(-width, width + orig, dtype=torch.float64)[None, None] / orig  # (1, 1, L)
    # torchaudio divides the phase indices in float32 (an integer arange / int) before float64 math
    phases = torch.arange(0, -new, -1, dtype=torch.float32)[:, None, None] / new  # (new, 1, 1)
    t = ((phases + offsets) * cutoff).clamp(-SINC_ZERO_CROSSINGS, SINC_ZERO_CROSSINGS)  # (new, 1, L)
    window = torch.cos(t * math.pi / SINC_ZERO_CROSSINGS / 2) ** 2
    t = t * math.pi
    sinc = torch.where(t == 0, torch.ones_like(t), torch.sin(t) / t)
    kernel = sinc * window * (cutoff / orig)
    return kernel.to(torch.float32), width


def sinc_output_length(n: int, orig: int, new: int) -> int:
    """ceil(new * n / orig) as torchaudio computes it: the quotient in float32, so a long input whose
    exact quotient lies just above an integer gets that integer (rounding down), as the official one does."""
    g = math.gcd(orig, new)
    return int(math.ceil(np.float32(new // g * n / (orig // g))))


def sinc_resample(wave: np.ndarray, orig: int, new: int) -> np.ndarray:
    """torchaudio.transforms.Resample(orig, new) on a float32 1-D wave: float32 strided convolution."""
    if orig == new:
        return wave
    g = math.gcd(orig, new)
    orig_r, new_r = orig // g, new // g
    kernel, width = sinc_kernel(orig_r, new_r)
    x = torch.from_numpy(np.ascontiguousarray(wave, dtype=np.float32))[None, None]  # (1, 1, N)
    x = F.pad(x, (width, width + orig_r))
    with torch.no_grad():
        phases = F.conv1d(x, kernel, stride=orig_r)  # (1, new_r, periods): one output per phase and period
    out = phases[0].transpose(0, 1).reshape(-1)  # (periods * new_r,) in time order
    return out[: sinc_output_length(wave.shape[0], orig, new)].numpy().copy()


def _cut(wave: np.ndarray, rate: int, max_seconds: float | None) -> np.ndarray:
    return wave if max_seconds is None else wave[: int(max_seconds * rate)]


def speaker_wave(mono: np.ndarray, sr: int, max_seconds: float | None) -> np.ndarray:
    """The official speaker-path waveform: 16 kHz float32 (reference README section 1)."""
    at_22k = _cut(soxr_resample(mono, sr, LIBROSA_RATE), LIBROSA_RATE, max_seconds)
    return sinc_resample(at_22k, LIBROSA_RATE, W2V_RATE)


def speaker_waves(mono: np.ndarray, sr: int, prompt_seconds: float) -> tuple[np.ndarray, np.ndarray | None]:
    """The speaker path of the whole clip (the target's codes) and of its prompt cut (the first
    `prompt_seconds`, None when the clip is no longer), from one soxr pass at 22,050 Hz."""
    at_22k = soxr_resample(mono, sr, LIBROSA_RATE)
    full = sinc_resample(at_22k, LIBROSA_RATE, W2V_RATE)
    if at_22k.shape[0] <= int(prompt_seconds * LIBROSA_RATE):
        return full, None
    return full, sinc_resample(_cut(at_22k, LIBROSA_RATE, prompt_seconds), LIBROSA_RATE, W2V_RATE)


def emotion_wave(mono: np.ndarray, sr: int, max_seconds: float | None) -> np.ndarray:
    """The official emotion-path waveform: soxr straight to 16 kHz, then the cut; float32."""
    return np.ascontiguousarray(_cut(soxr_resample(mono, sr, W2V_RATE), W2V_RATE, max_seconds))
