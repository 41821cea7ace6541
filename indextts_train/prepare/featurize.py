"""Per-utterance features, computed as official inference computes them (batch size 1), batched where
batching is safe.

Stages (`tests/data/reference/prepare/README.md` has the rules): text ids through the inference text
path; the speaker-path waveform (soxr to 22,050 Hz, windowed-sinc to 16 kHz) -> w2v-BERT layer 17 ->
codec codes of the valid frames only (the whole clip: targets are never cut); the prompt, the first
`prompt_seconds` of the clip -> `condition` (IndexTTS2) or the CAMPPlus `spk_emb` (2.5); the
emotion-path waveform (soxr straight to 16 kHz) -> `emo_vec`. w2v-BERT masks padding, so it runs in
padded batches; the codecs and the conformer encoders do not (padding changes their output), so
they see each clip alone.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from indextts_train.checkpoint.reader import load_checkpoint
from indextts_train.config.settings import GPTConfig, load_config
from indextts_train.errors import UserError
from indextts_train.model.conditioning import ConditioningEncoders
from indextts_train.model.layout import clean_keys
from indextts_train.prepare.audio import (
    LIBROSA_RATE,
    W2V_RATE,
    AudioError,
    emotion_wave,
    sinc_output_length,
    speaker_waves,
)
from indextts_train.prepare.campplus import CampPlus
from indextts_train.prepare.clip_source import read_samples
from indextts_train.prepare.codecs import CODECS, EnhancedCodec, SemanticCodec, exact_float32, valid_code_count
from indextts_train.prepare.models import ModelFiles
from indextts_train.prepare.utterance import Utterance
from indextts_train.prepare.w2vbert import MIN_SAMPLES, W2vBert, w2vbert_frames
from indextts_train.text.inference_text import TextPath
from indextts_train.text.vocab import growth_between_runs, tokenizer_size

SILENCE_PEAK = 1e-4  # a clip whose loudest sample is below this has nothing to learn from


@dataclass
class Clip:
    """One utterance's waveforms, loaded and resampled (in a worker thread, ahead of the models)."""

    speaker_full: np.ndarray  # 16 kHz speaker path, whole clip: codes
    speaker_prompt: np.ndarray | None  # the first prompt_seconds; None when that is the whole clip
    emotion: np.ndarray  # 16 kHz emotion path, first prompt_seconds: emo_vec
    peak: float = 1.0  # loudest sample of the file: named when its features overflow


def load_clip(utt: Utterance, prompt_seconds: float) -> Clip | str:
    """The clip's waveforms, or the reason it cannot be used (unreadable, empty, non-finite, silent)."""
    try:
        mono, rate = read_samples(utt)
    except AudioError as exc:
        return f"audio: {exc}"
    peak = float(np.max(np.abs(mono))) if mono.size else 0.0
    if peak < SILENCE_PEAK:
        return "audio: silent (peak below 1e-4)"
    full, prompt = speaker_waves(mono, rate, prompt_seconds)
    emotion = emotion_wave(mono, rate, prompt_seconds)
    if min(full.shape[0], emotion.shape[0]) < MIN_SAMPLES:
        return f"too short: {min(full.shape[0], emotion.shape[0])} samples at 16 kHz, w2v-BERT needs {MIN_SAMPLES}"
    return Clip(speaker_full=full, speaker_prompt=prompt, emotion=emotion, peak=peak)


def non_finite_reason(clip: Clip, arrays: dict[str, np.ndarray], codes_from_finite: bool) -> str | None:
    """Why a clip's arrays cannot be kept: a float WAV of finite but absurd samples (1e30: a file of another
    sample format, or damaged) overflows inside the models, and NaN features would train NaN. The codes of
    non-finite w2v-BERT features are no speech either, whatever integers they came out as."""
    bad = [name for name, array in arrays.items() if array.dtype.kind == "f" and not np.isfinite(array).all()]
    bad = bad if codes_from_finite else ["codes", *bad]
    if not bad:
        return None
    return (f"audio: NaN or infinite {', '.join(bad)} from samples peaking at {clip.peak:.3g} (audio lies within "
            "[-1, 1]); check the file's sample format")


def grown_ids(models: ModelFiles, weights: dict[str, torch.Tensor]) -> range:
    """Ids of the pieces the tokenizer has beyond the base model's text rows (`--tokenizer` an extended
    one), placed where training grows them (vocab.growth_between_runs); empty when it has none."""
    table = weights.get("text_embedding.weight")
    if table is None:  # ConditioningEncoders names the missing tensors; nothing to count here
        return range(0)
    base_tokens, tokens = int(table.shape[0]) - 1, tokenizer_size(models.tokenizer)
    if tokens <= base_tokens:
        return range(0)
    return growth_between_runs(base_tokens, tokens, models.tokenizer).new_ids


def read_gpt_weights(path: Path) -> dict[str, torch.Tensor]:
    """The tensors of a gpt.pth (plain, {"model": ...}, DDP or compiled names), read by the checkpoint
    reader: no pickled code, bounded work, CRC-checked when it is ours.

    Only the speaker/emotion encoders are used here (ConditioningEncoders names any that are missing);
    train-gpt checks the whole file against the config when it trains on it.
    """
    try:
        loaded = load_checkpoint(path, mmap=True)  # only the encoders' tensors are touched
    except UserError as exc:
        raise UserError(f"{exc}; the speaker and emotion encoders come from the model folder's gpt.pth") from None
    state = loaded.get("model", loaded)
    if not isinstance(state, dict) or not all(isinstance(v, torch.Tensor) for v in state.values()):
        raise UserError(f"{path}: not a gpt.pth state dict (expected a mapping of key -> tensor)")
    return clean_keys(state).state


@dataclass(frozen=True)
class CodeLimit:
    """gpt.max_mel_tokens and the codec's frames per code: a clip with more codes is rejected before any model."""

    max_codes: int
    frames_per_code: int


def expected_codes(frames: int, rate: int, frames_per_code: int) -> int:
    """The valid codes of a clip of `frames` samples at `rate`, from the speaker path's length rules alone."""
    at_speaker_rate = frames if rate == LIBROSA_RATE else int(np.ceil(frames * (float(LIBROSA_RATE) / rate)))
    _, n_valid = w2vbert_frames(sinc_output_length(at_speaker_rate, LIBROSA_RATE, W2V_RATE))
    return valid_code_count(n_valid, frames_per_code)


def too_long_reason(codes: int, max_codes: int) -> str:
    return f"too long: {codes} codes > gpt.max_mel_tokens {max_codes}"


SHOWN_UNKNOWN = 20  # characters a rejection reason names: enough to see the script, never a 400 KB line


def unknown_reason(runs: list[str]) -> str:
    """Why a text with characters the tokenizer lacks is rejected: its first SHOWN_UNKNOWN distinct unknown
    characters and how many there are. The reason goes into rejected.jsonl, every record and the summary, so
    it is bounded whatever the transcript (the runs themselves are unbounded: a whole paragraph of a script
    the tokenizer lacks is one run)."""
    chars = list(dict.fromkeys(char for run in runs for char in run))
    more = f", {len(chars)} distinct in all" if len(chars) > SHOWN_UNKNOWN else ""
    return (f"text: characters the tokenizer does not know: {' '.join(chars[:SHOWN_UNKNOWN])}{more} "
            "(pass the extended --tokenizer that has them; --allow-unk keeps them as unknown)")


@dataclass
class TextIds:
    ids: np.ndarray  # (N,) int32
    lang_id: int | None  # IndexTTS-2.5 only
    extended: int = 0  # how many of `ids` are pieces the tokenizer grew beyond the base model's vocabulary


class Featurizer:
    """The real stages of one model family, loaded once per process."""

    def __init__(self, *, gpt_cfg: GPTConfig, text: TextPath, w2v: W2vBert, codec: SemanticCodec | EnhancedCodec,
                 encoders: ConditioningEncoders, campplus: CampPlus | None, device: torch.device,
                 allow_unk: bool, new_ids: range = range(0)) -> None:
        self.gpt_cfg, self.text, self.w2v, self.codec = gpt_cfg, text, w2v, codec
        self.encoders, self.campplus, self.device, self.allow_unk = encoders, campplus, device, allow_unk
        self.family = gpt_cfg.family
        self.new_ids = new_ids  # the grown pieces' ids (empty: the tokenizer is the base model's own)

    @classmethod
    def load(cls, models: ModelFiles, device: torch.device, *, allow_unk: bool = False) -> Featurizer:
        gpt_cfg = load_config(models.config).gpt
        carried = read_gpt_weights(models.gpt)
        codec_type = CODECS[models.family]
        return cls(gpt_cfg=gpt_cfg, text=TextPath.open(models.tokenizer), new_ids=grown_ids(models, carried),
                   w2v=W2vBert.load(models.w2v_bert, models.stats, device),
                   codec=codec_type.load(models.codec, models.codec_config, device),
                   encoders=ConditioningEncoders.from_gpt(carried, gpt_cfg, device),
                   campplus=CampPlus.load(models.campplus, device) if models.family.speaker_vector else None,
                   device=device, allow_unk=allow_unk)

    def code_limit(self) -> CodeLimit:
        return CodeLimit(self.gpt_cfg.max_mel_tokens, self.codec.frames_per_code)

    def notes(self) -> list[str]:
        """Warnings about the texts seen (digits without the official normaliser, unknown 2.5 languages)."""
        return self.text.notes()

    def text_ids(self, utt: Utterance) -> TextIds | str:
        """The ids inference gives this text, or why the utterance cannot be kept."""
        if not utt.text.strip():
            return "text: empty"
        if self.family.language_rows and not utt.language:
            return "text: no language (IndexTTS-2.5 needs one; pass --language or a language field)"
        unknown = self.text.unknown(utt.text, utt.language)
        if unknown and not self.allow_unk:
            return unknown_reason(unknown)
        ids = np.asarray(self.text.encode(utt.text, utt.language), dtype=np.int32)
        if ids.size == 0:
            return "text: no tokens"
        if ids.size > self.gpt_cfg.max_text_tokens:
            return f"too long: {ids.size} text tokens > gpt.max_text_tokens {self.gpt_cfg.max_text_tokens}"
        extended = int(np.count_nonzero((ids >= self.new_ids.start) & (ids < self.new_ids.stop)))
        return TextIds(ids, self.text.lang_id(utt.language) if self.family.language_rows else None, extended)

    def features(self, clips: list[Clip]) -> list[dict[str, np.ndarray] | str]:
        """Arrays of each clip (codes, condition or spk_emb, emo_vec), or the reason it is rejected."""
        with torch.no_grad(), exact_float32():  # TF32 would move features past the reference tolerances
            return self._features(clips)

    def _features(self, clips: list[Clip]) -> list[dict[str, np.ndarray] | str]:
        # Codes are discrete and came out the same from a padded batch (no code moved under 1e-4 noise
        # on the layer-17 features): the whole clips go through w2v-BERT together. The float outputs do
        # not: a padded batch moves layer 17 by ~1e-5, which the encoders grew to 1.8e-4 in emo_vec
        # (values ~8) against the 1e-4 tolerance. So condition and emo_vec take their features from a
        # pass of the clip alone, as official inference does, and do not depend on --batch-seconds.
        full = self.w2v.layer17([clip.speaker_full for clip in clips])  # one padded forward
        out: list[dict[str, np.ndarray] | str] = []
        for i, clip in enumerate(clips):
            feat, n_valid = full[i]
            codes = self.codec.codes(feat.to(self.device)).cpu()  # (T,) or (ceil(T/2),): one clip alone
            codes = codes[:valid_code_count(n_valid, self.codec.frames_per_code)]
            if codes.numel() > self.gpt_cfg.max_mel_tokens:  # plan() rejects these from the header already
                out.append(too_long_reason(codes.numel(), self.gpt_cfg.max_mel_tokens))
                continue
            arrays = {"codes": codes.numpy().astype(np.int32)}
            prompt = clip.speaker_full if clip.speaker_prompt is None else clip.speaker_prompt
            if self.family.speaker_vector:  # IndexTTS-2.5's speaker vector comes from the waveform, through CAMPPlus
                arrays["spk_emb"] = np.asarray(self.campplus.speaker_vector(prompt), dtype=np.float32)
            else:
                # A batch of this clip alone already was its single pass.
                prompt_feat = full[i][0] if len(clips) == 1 and clip.speaker_prompt is None else \
                    self.w2v.layer17([prompt])[0][0]
                arrays["condition"] = self._float(self.encoders.condition(prompt_feat.to(self.device)))
            [(emotion, _)] = self.w2v.layer17([clip.emotion])
            arrays["emo_vec"] = self._float(self.encoders.emo_vec(emotion.to(self.device)))
            out.append(non_finite_reason(clip, arrays, bool(torch.isfinite(feat).all())) or arrays)
        return out

    @staticmethod
    def _float(tensor: torch.Tensor) -> np.ndarray:
        return tensor.detach().to("cpu", torch.float32).numpy()
