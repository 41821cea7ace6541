"""The demo's data made by the real pipeline: synthetic clips + tiny random models -> `prepare` -> manifests.

The tokenizers are the demo's (demo_data*.py): a base vocabulary of the tiny config's size and one
grown with Amharic pieces. The model folder holds the base tokenizer, as a release does; prepare runs
with `--tokenizer` pointing at the grown one, as a user who extended the vocabulary runs it.
"""

from __future__ import annotations

from pathlib import Path

from indextts_train.config.settings import load_config
from indextts_train.data.demo_data import AMHARIC, ENGLISH, _make_base_tokenizer
from indextts_train.data.demo_data import EXTRA_PIECES as EXTRA_V2
from indextts_train.data.demo_data_v25 import EXTRA_RANKS, _make_base_vocabulary
from indextts_train.data.demo_data_v25 import LANGUAGES as LANGUAGES_V25
from indextts_train.errors import UserError
from indextts_train.files.atomic import atomic_write_text
from indextts_train.prepare.corpus import Defaults
from indextts_train.prepare.models import Overrides
from indextts_train.prepare.pairs import SplitRule
from indextts_train.prepare.pipeline import PrepareOptions, run_prepare
from indextts_train.prepare.tiny import write_synthetic_clips, write_tiny_model_dir
from indextts_train.text.inference_text import TextPath
from indextts_train.text.tiktoken_vocab import extend_tiktoken
from indextts_train.text.tokenizer import extend_tokenizer

N_SPEAKERS = 3
SECONDS = {False: (0.6, 1.1), True: (0.8, 2.4)}  # tiny max_mel_tokens: 60 codes at 50 Hz, 90 at 25 Hz
VAL_FRACTION = 0.15
INFERENCE_W2V_WIDTH = 1024  # the official GPT's conditioning encoders read 1024-wide w2v-BERT features


def _tokenizers(data_dir: Path, config_path: Path, is_v25: bool, seed: int) -> tuple[Path, Path]:
    """(base, grown) vocabularies, written once (again when an earlier demo left only one of them)."""
    gpt = load_config(config_path).gpt
    amharic = data_dir / "corpus_am.txt"
    amharic.write_text("".join(f"{line}\n" for line in AMHARIC), encoding="utf-8")
    if is_v25:
        base, grown = data_dir / "base.tiktoken", data_dir / "grown.tiktoken"
        if not (grown.is_file() and base.is_file()):
            base = _make_base_vocabulary(data_dir, gpt)
            extend_tiktoken(base, [amharic], gpt.number_text_tokens + EXTRA_RANKS, grown, force=True)
        return base, grown
    base, grown = data_dir / "base_bpe.model", data_dir / "bpe.model"
    if not (grown.is_file() and base.is_file()):
        _make_base_tokenizer(base, gpt, seed)
        extend_tokenizer(base, [amharic], gpt.number_text_tokens + EXTRA_V2, grown, seed=seed, force=True)
    return base, grown


def _texts(tokenizer: Path, is_v25: bool, max_text_tokens: int) -> list[tuple[str, str | None]]:
    """Every demo sentence that inference's text path encodes without unknown pieces and that fits."""
    path = TextPath.open(tokenizer)  # the normaliser prepare uses
    sources = LANGUAGES_V25 if is_v25 else (("en", ENGLISH), ("am", AMHARIC))
    texts = [(text, language if is_v25 else None) for language, sentences in sources for text in sentences]
    fitting = [(text, lang) for text, lang in texts
               if not path.unknown(text, lang) and len(path.encode(text, lang)) <= max_text_tokens]
    if len(fitting) < 2 * N_SPEAKERS:
        raise UserError(f"{tokenizer}: fewer than {2 * N_SPEAKERS} demo sentences encode without unknown pieces")
    return fitting


WIDE_MARK = "made_at_inference_widths.txt"  # in the demo's model folder: official inference can hear its GPT


def make_prepared_demo(out_dir: Path, config_path: Path, *, seed: int = 0, inference_widths: bool = False) -> dict:
    """Tokenizers, clips, a tiny model folder and the prepared data under out_dir; returns the paths.

    `inference_widths` (IndexTTS-2.5, when an inference environment can hear the result): the folder's
    w2v-BERT is 1024 wide, as the official GPT's conditioning takes, which makes `prepare` many times
    slower than at the tiny width; without it the demo stays quick and cannot be heard."""
    is_v25 = load_config(config_path).gpt.is_v25
    data_dir = out_dir / "data"
    data_dir.mkdir(parents=True, exist_ok=True)
    base, grown = _tokenizers(data_dir, config_path, is_v25, seed)
    model_dir = out_dir / "models"
    if not (model_dir / "gpt.pth").is_file():
        wide = is_v25 and inference_widths
        write_tiny_model_dir(model_dir, gpt_config=config_path, tokenizer=base, seed=seed,
                             **({"width": INFERENCE_W2V_WIDTH, "inference": True} if wide else {}))
        if wide:
            atomic_write_text(model_dir / WIDE_MARK, "w2v-BERT at the width official inference needs\n")
    corpus = data_dir / "clips" / "corpus.jsonl"
    if not corpus.is_file():
        texts = _texts(grown, is_v25, load_config(config_path).gpt.max_text_tokens)
        write_synthetic_clips(data_dir / "clips", texts, speakers=N_SPEAKERS, seed=seed, seconds=SECONDS[is_v25])
    prepared = data_dir / "prepared"
    code = run_prepare(PrepareOptions(corpora=[corpus], model_dir=model_dir, out=prepared, device="cpu",
                                      overrides=Overrides(tokenizer=grown), defaults=Defaults(),
                                      split=SplitRule(val_fraction=VAL_FRACTION, seed=seed), min_seconds=0.3))
    if code == 2:
        raise UserError(f"{prepared}: the demo's prepare kept no utterance; see {prepared / 'rejected.jsonl'}")
    return {"base_tokenizer": base, "tokenizer": grown, "model_dir": model_dir,
            "normalizer": TextPath.open(grown).normalizer_name,
            "base_checkpoint": model_dir / "gpt.pth", "train_manifest": prepared / "train.jsonl",
            "val_manifest": prepared / "val.jsonl", "inference_widths": (model_dir / WIDE_MARK).is_file()}
