"""The scores of one synthesized WAV: what it says (ASR + CER/WER), whose voice (speaker similarity
to the prompt), how long (against the reference clip).

Speaker similarity is the cosine of two CAMPPlus embeddings (prepare/campplus.py, the network
IndexTTS itself uses for the speaker): the prompt's and the WAV's, each of the 16 kHz waveform.
The number is labelled with the weights that gave it (file name and sha256), since embeddings of
two encoders do not compare.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from indextts_train.listen.asr import ASR_RATE, Recogniser
from indextts_train.listen.lines import Line
from indextts_train.listen.text_score import cer, wer
from indextts_train.prepare.audio import load_audio, soxr_resample
from indextts_train.prepare.campplus import MIN_SAMPLES, CampPlus
from indextts_train.prepare.models import CAMPPLUS_HUB, cached_hub_file, sha256_file

MAX_TRANSCRIPT_CHARS = 4000  # a babbling model's transcript is kept, but not without end


def wave16k(path: Path) -> tuple[np.ndarray, float]:
    """(16 kHz mono float32, seconds) of an audio file."""
    mono, rate = load_audio(path)
    return soxr_resample(mono, rate, ASR_RATE), mono.shape[0] / rate


def find_campplus(model_dir: Path) -> Path | None:
    """campplus_cn_common.bin in the model folder's hf_cache (as a file or in the hub layout), or the user's cache."""
    local = model_dir / "hf_cache" / CAMPPLUS_HUB.filename
    if local.is_file():
        return local
    try:
        return cached_hub_file(CAMPPLUS_HUB, [model_dir / "hf_cache", None])
    except ImportError:  # huggingface_hub: in the [prepare] extra, like transformers
        return None


@dataclass
class Voice:
    """CAMPPlus on one device, with the prompts' embeddings kept (each prompt serves every checkpoint)."""

    encoder: CampPlus
    label: dict
    prompts: dict[Path, np.ndarray | None] = field(default_factory=dict)

    @classmethod
    def load(cls, path: Path, device: str) -> Voice:
        return cls(CampPlus.load(path, device), {"file": path.name, "sha256": sha256_file(path)})

    def embedding(self, wave: np.ndarray) -> np.ndarray | None:
        return self.encoder.speaker_vector(wave) if wave.shape[0] >= MIN_SAMPLES else None

    def similarity(self, prompt: Path, wave: np.ndarray) -> float | None:
        if prompt not in self.prompts:
            self.prompts[prompt] = self.embedding(wave16k(prompt)[0])
        a, b = self.prompts[prompt], self.embedding(wave)
        if a is None or b is None:
            return None
        return float(np.dot(a, b) / max(float(np.linalg.norm(a) * np.linalg.norm(b)), 1e-12))


def score_wav(line: Line, wav: Path, recogniser: Recogniser, voice: Voice | None) -> dict:
    """transcript, cer, wer, speaker_sim, seconds, reference_seconds, length_ratio of one WAV."""
    wave, seconds = wave16k(wav)
    transcript = recogniser.transcribe(wave, line.language)[:MAX_TRANSCRIPT_CHARS]
    reference_seconds = wave16k(line.reference_audio)[1] if line.reference_audio else None
    return {"transcript": transcript, "cer": cer(line.text, transcript), "wer": wer(line.text, transcript),
            "speaker_sim": voice.similarity(line.prompt_audio, wave) if voice else None,
            "seconds": round(seconds, 4),
            "reference_seconds": round(reference_seconds, 4) if reference_seconds else None,
            "length_ratio": round(seconds / reference_seconds, 4) if reference_seconds else None}
