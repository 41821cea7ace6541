"""The demo's data made by the real pipeline: synthetic clips + tiny random models -> `prepare` -> manifests.

The tokenizers are the demo's (data/demo_data.py): a base vocabulary of the tiny config's size and one
grown with Amharic pieces. The model folder holds the base tokenizer, as a release does; prepare runs
with `--tokenizer` pointing at the grown one, as a user who extended the vocabulary runs it.
"""

from __future__ import annotations

from pathlib import Path

from indextts_train.config.family import TIKTOKEN
from indextts_train.config.settings import GPTConfig, load_config
from indextts_train.data.demo_data import AMHARIC, EXTRA_TOKENS, LANGUAGES, _make_base_tokenizer, _make_base_vocabulary
from indextts_train.errors import UserError
from indextts_train.files.atomic import atomic_write_text
from indextts_train.prepare.corpus import Defaults
from indextts_train.prepare.models import Overrides
from indextts_train.prepare.pairs import SplitRule
from indextts_train.prepare.pipeline import STOPPED, PrepareOptions, run_prepare
from indextts_train.prepare.tiny import write_synthetic_clips, write_tiny_model_dir
from indextts_train.text.inference_text import TextPath
from indextts_train.text.tiktoken_vocab import extend_tiktoken
from indextts_train.text.tokenizer import extend_tokenizer

N_SPEAKERS = 3
VAL_FRACTION = 0.15
INFERENCE_W2V_WIDTH = 1024  # the official GPT's conditioning encoders read 1024-wide w2v-BERT features


def _tokenizers(data_dir: Path, gpt: GPTConfig, seed: int) -> tuple[Path, Path]:
    """(base, grown) vocabularies, written once (again when an earlier demo left only one of them)."""
    amharic = data_dir / "corpus_am.txt"
    amharic.write_text("".join(f"{line}\n" for line in AMHARIC), encoding="utf-8")
    size = gpt.number_text_tokens + EXTRA_TOKENS
    if gpt.family.tokenizer_kind == TIKTOKEN:
        base, grown = data_dir / "base.tiktoken", data_dir / "grown.tiktoken"
        if not (grown.is_file() and base.is_file()):
            base = _make_base_vocabulary(data_dir, gpt)
            extend_tiktoken(base, [amharic], size, grown, force=True)
        return base, grown
    base, grown = data_dir / "base_bpe.model", data_dir / "bpe.model"
    if not (grown.is_file() and base.is_file()):
        _make_base_tokenizer(base, gpt, seed)
        extend_tokenizer(base, [amharic], size, grown, seed=seed, force=True)
    return base, grown


def _texts(tokenizer: Path, gpt: GPTConfig) -> list[tuple[str, str | None]]:
    """Every demo sentence that inference's text path encodes without unknown pieces and that fits."""
    path = TextPath.open(tokenizer)  # the normaliser prepare uses
    languages = gpt.family.language_rows  # IndexTTS2 text has no language
    texts = [(text, language if languages else None) for language, sentences in LANGUAGES for text in sentences]
    fitting = [(text, lang) for text, lang in texts
               if not path.unknown(text, lang) and len(path.encode(text, lang)) <= gpt.max_text_tokens]
    if len(fitting) < 2 * N_SPEAKERS:
        raise UserError(f"{tokenizer}: fewer than {2 * N_SPEAKERS} demo sentences encode without unknown pieces")
    return fitting


WIDE_MARK = "made_at_inference_widths.txt"  # in the demo's model folder: official inference can hear its GPT


def make_prepared_demo(out_dir: Path, config_path: Path, *, seed: int = 0, inference_widths: bool = False) -> dict:
    """Tokenizers, clips, a tiny model folder and the prepared data under out_dir; returns the paths.

    `inference_widths` (IndexTTS-2.5, when an inference environment can hear the result): the folder's
    w2v-BERT is 1024 wide, as the official GPT's conditioning takes, which makes `prepare` many times
    slower than at the tiny width; without it the demo stays quick and cannot be heard."""
    gpt = load_config(config_path).gpt
    data_dir = out_dir / "data"
    data_dir.mkdir(parents=True, exist_ok=True)
    base, grown = _tokenizers(data_dir, gpt, seed)
    model_dir = out_dir / "models"
    if not (model_dir / "gpt.pth").is_file():
        wide = inference_widths and gpt.family.inference_gpt_width is None  # a tiny GPT official inference hears
        write_tiny_model_dir(model_dir, gpt_config=config_path, tokenizer=base, seed=seed,
                             **({"width": INFERENCE_W2V_WIDTH, "inference": True} if wide else {}))
        if wide:
            atomic_write_text(model_dir / WIDE_MARK, "w2v-BERT at the width official inference needs\n")
    corpus = data_dir / "clips" / "corpus.jsonl"
    if not corpus.is_file():
        write_synthetic_clips(data_dir / "clips", _texts(grown, gpt), speakers=N_SPEAKERS, seed=seed,
                              seconds=gpt.family.demo_seconds)
    prepared = data_dir / "prepared"
    code = run_prepare(PrepareOptions(corpora=[corpus], model_dir=model_dir, out=prepared, device="cpu",
                                      overrides=Overrides(tokenizer=grown), defaults=Defaults(),
                                      split=SplitRule(val_fraction=VAL_FRACTION, seed=seed), min_seconds=0.3))
    if code in STOPPED:  # prepare said so in its line; the demo must not go on to train on half the data
        raise SystemExit(code)
    if code == 2:
        raise UserError(f"{prepared}: the demo's prepare kept no utterance; see {prepared / 'rejected.jsonl'}")
    return {"base_tokenizer": base, "tokenizer": grown, "model_dir": model_dir,
            "normalizer": TextPath.open(grown).normalizer_name,
            "base_checkpoint": model_dir / "gpt.pth", "train_manifest": prepared / "train.jsonl",
            "val_manifest": prepared / "val.jsonl", "inference_widths": (model_dir / WIDE_MARK).is_file()}
