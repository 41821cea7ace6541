"""The speech recogniser that transcribes synthesized lines: a `transformers` ASR pipeline.

`--asr-model` is a Hugging Face id or a local folder; Whisper (encoder-decoder) and CTC models
(wav2vec2, MMS) both load through `pipeline("automatic-speech-recognition")`. The audio is given
at 16 kHz (resampled here, so torchaudio is not needed). A line's language is passed on where the
model can use it: Whisper gets it as its `language` when its tokenizer knows the code; an MMS model
with language adapters (facebook/mms-1b-all) switches to the adapter of that code (ISO 639-3, or
the two-letter code of a few common languages, mapped below).
"""

from __future__ import annotations

import contextlib
import logging
import os
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from indextts_train.errors import UserError

ASR_RATE = 16_000
DEFAULT_ASR_MODEL = "openai/whisper-large-v3-turbo"
# Two-letter codes of languages users train, as MMS names its adapters (ISO 639-3).
MMS_CODES = {"am": "amh", "en": "eng", "zh": "cmn-script_simplified", "ja": "jpn", "ko": "kor", "fr": "fra",
             "de": "deu", "es": "spa", "ru": "rus", "ar": "ara", "hi": "hin", "sw": "swh", "yo": "yor",
             "ha": "hau", "ti": "tir", "om": "orm", "so": "som", "vi": "vie", "th": "tha", "yue": "yue"}


@dataclass
class Recogniser:
    """A loaded ASR pipeline and what names it in the record."""

    pipe: object
    label: dict
    adapters: set[str] = field(default_factory=set)  # MMS adapter codes, when the model has them
    current: str | None = None

    def transcribe(self, wave16k: np.ndarray, language: str | None) -> str:
        """The transcript of one 16 kHz mono clip."""
        kwargs = {}
        if language and self.label["kind"] == "whisper":
            code = f"<|{language}|>"
            if code in getattr(self.pipe.model.generation_config, "lang_to_id", {}):
                kwargs["generate_kwargs"] = {"language": language, "task": "transcribe"}
        elif language and self.adapters:
            self._switch(MMS_CODES.get(language, language))
        result = self.pipe({"raw": np.asarray(wave16k, dtype=np.float32), "sampling_rate": ASR_RATE}, **kwargs)
        return str(result.get("text", "")).strip()

    def _switch(self, code: str) -> None:
        if code in self.adapters and code != self.current:
            self.pipe.tokenizer.set_target_lang(code)
            self.pipe.model.load_adapter(code)
            self.current = code


def _missing(model: str, exc: BaseException) -> UserError:
    offline = os.environ.get("HF_HUB_OFFLINE", "") not in ("", "0")
    where = "not in the Hugging Face cache (HF_HUB_OFFLINE is set)" if offline else "could not be loaded"
    # `hf`: huggingface_hub 1.0 removed the `huggingface-cli` command (0.34 and later have `hf`)
    return UserError(f"--asr-model {model}: not a local folder and {where} ({type(exc).__name__}); pass a "
                     f"folder holding the model, or download it first: hf download {model}")


@contextlib.contextmanager
def _hub_quiet():
    """huggingface_hub's own warnings off while the model loads: with no network, each of its retries said two
    lines (`... thrown while requesting HEAD ...`, `Retrying in 8s`) before listen's one line of what to do."""
    logger = logging.getLogger("huggingface_hub")
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        yield
    finally:
        logger.setLevel(level)


def load_recogniser(model: str, device: str) -> Recogniser:
    """The pipeline for `model` on `device`, or one line saying what is missing."""
    try:
        import transformers
        from transformers import pipeline
    except ImportError:
        raise UserError("listening needs transformers: pip install 'indextts-train[prepare]'") from None
    transformers.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()  # one line per checkpoint is the output, not bars
    local = Path(model).expanduser()
    if local.exists() and not local.is_dir():  # "no config.json in that folder" said of a file misled
        raise UserError(f"--asr-model {model}: not a folder; pass a transformers ASR model folder (or a "
                        "Hugging Face id)")
    if local.exists() and not (local / "config.json").is_file():
        raise UserError(f"--asr-model {model}: no config.json in that folder; pass a transformers ASR model folder")
    try:
        with _hub_quiet():
            pipe = pipeline("automatic-speech-recognition", model=str(local) if local.exists() else model,
                            device=device)
    except (OSError, ValueError, KeyError) as exc:
        if local.exists():
            raise UserError(f"--asr-model {model}: not a transformers ASR model ({type(exc).__name__}: "
                            f"{str(exc).splitlines()[0] if str(exc) else ''})") from None
        raise _missing(model, exc) from None
    config = pipe.model.config
    kind = "whisper" if config.model_type == "whisper" else "ctc"
    label = {"model": model, "kind": kind, "model_type": config.model_type,
             "revision": getattr(config, "_commit_hash", None), "transformers": transformers.__version__,
             "parameters": sum(p.numel() for p in pipe.model.parameters())}
    vocab = getattr(pipe.tokenizer, "vocab", None)
    adapters = set(vocab) if kind == "ctc" and getattr(config, "adapter_attn_dim", None) and \
        isinstance(vocab, dict) and all(isinstance(v, dict) for v in vocab.values()) else set()
    return Recogniser(pipe, label, adapters)
