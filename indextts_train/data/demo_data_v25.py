"""The built-in IndexTTS-2.5 demo dataset: a real toy tiktoken vocabulary and a 2.5 paired manifest.

The base vocabulary is byte-level BPE as IndexTTS-2.5's: all 256 single bytes (printable ASCII
first, so ranks 0 and 1 are `!` and `"` as in the real file), then merges learned on English text,
followed by the 1,673 official special tokens. It is then grown with merges learned on Amharic (a
second script, `<|am|>`, a language the 2.5 release does not speak), the way a user grows the real
file, so training moves every special row up by the number of new ranks. Features are synthetic as
in the IndexTTS2 demo: codes are a fixed function of text ids and speaker, the 192-d speaker vector
and the emotion vector cluster by speaker. Merges are learned, and text encoded, as official inference
presents each language's text (inference_text: English lower-cased, Amharic as it is).
"""

from __future__ import annotations

import base64
from pathlib import Path

import numpy as np

from indextts_train.config.constants import SPK_EMB_DIM
from indextts_train.config.settings import GPTConfig
from indextts_train.data.demo_data import AMHARIC, ENGLISH, _code_limit, _code_table, _write_lines, write_splits
from indextts_train.errors import UserError
from indextts_train.text.inference_text import TextPath
from indextts_train.text.tiktoken_vocab import LANGUAGE_IDS, SPECIAL_TOKENS, extend_tiktoken

EXTRA_RANKS = 50  # the grown vocabulary has 50 more ranks (and every special id + 50)
N_SPEAKERS = 3
CODES_PER_SECOND = 25  # nominal, only for the manifest's prompt_duration
LANGUAGES = (("en", ENGLISH), ("am", AMHARIC))


def byte_order() -> list[int]:
    """GPT-2's byte order: printable bytes first (0x21 '!' is rank 0), then the others."""
    printable = [*range(0x21, 0x7F), *range(0xA1, 0xAD), *range(0xAE, 0x100)]
    return printable + [b for b in range(256) if b not in printable]


def make_demo_dataset_v25(out_dir: Path, *, gpt_cfg: GPTConfig, n_train: int = 96, n_val: int = 16,
                          seed: int = 0) -> dict:
    """Write the vocabularies, corpora, arrays and train/val manifests into `out_dir`; return their paths.

    Deterministic for a seed. The base vocabulary has gpt_cfg.number_text_tokens tokens.
    """
    if n_train < 1 or n_val < 1:
        raise UserError(f"the demo needs at least one train and one val sample (got {n_train}, {n_val})")
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    base = _make_base_vocabulary(out_dir, gpt_cfg)
    extension_corpus = _write_lines(out_dir / "corpus_am.txt", AMHARIC)
    tokenizer = out_dir / "grown.tiktoken"
    summary = extend_tiktoken(base, [extension_corpus], gpt_cfg.number_text_tokens + EXTRA_RANKS, tokenizer,
                              _presenter(base, "am"), force=True)
    sentences = _encodable_sentences(tokenizer, gpt_cfg)
    code_table = _code_table(summary["new_size"], _code_limit(gpt_cfg), rng)
    speakers = _speakers(gpt_cfg.model_dim, _code_limit(gpt_cfg), rng)
    manifests = write_splits(out_dir, {"train": n_train, "val": n_val},
                             lambda uid: _utterance(uid, sentences, code_table, speakers, gpt_cfg, rng),
                             _save_arrays, _pairs, rng)
    return {"base_tokenizer": base, "tokenizer": tokenizer, "train_manifest": manifests["train"],
            "val_manifest": manifests["val"], "extension_corpus": extension_corpus, "n_train": n_train,
            "n_val": n_val, "n_speakers": N_SPEAKERS, "base_size": summary["base_size"],
            "vocab_size": summary["new_size"], "base_ranks": summary["base_ranks"], "added": summary["added"]}


def _make_base_vocabulary(out_dir: Path, gpt_cfg: GPTConfig) -> Path:
    """256 byte ranks + merges learned on English, so ranks + specials = number_text_tokens."""
    if gpt_cfg.number_text_tokens <= 256 + len(SPECIAL_TOKENS):
        raise UserError(f"gpt.number_text_tokens {gpt_cfg.number_text_tokens} is too small for a tiktoken "
                        f"vocabulary (256 byte ranks + {len(SPECIAL_TOKENS)} specials); use configs/tiny_v25.yaml")
    byte_file = out_dir / "bytes.tiktoken"
    byte_file.write_bytes(b"".join(base64.b64encode(bytes([b])) + b" %d\n" % rank
                                   for rank, b in enumerate(byte_order())))
    english = _write_lines(out_dir / "corpus_en.txt", ENGLISH)
    base = out_dir / "base.tiktoken"
    summary = extend_tiktoken(byte_file, [english], gpt_cfg.number_text_tokens, base, _presenter(byte_file, "en"),
                             force=True)
    byte_file.unlink()
    if summary["short_by"]:
        raise UserError(f"gpt.number_text_tokens {gpt_cfg.number_text_tokens} needs more English merges than the "
                        f"demo text gives ({summary['added']}); use configs/tiny_v25.yaml")
    return base


def _presenter(vocabulary: Path, language: str):  # -> Callable[[str], str]
    """A corpus text as inference presents it after the `<|language|> ` tag (no digits: no normaliser needed)."""
    text_path = TextPath.open(vocabulary, normalizer="none")
    return lambda text: text_path.present_body(text, language)


def _encodable_sentences(tokenizer: Path, gpt_cfg: GPTConfig) -> list[tuple[str, str, np.ndarray]]:
    """(language, text, ids) of each built-in sentence that fits, as inference encodes it: the tag of
    its language first, the language's case rule, 0/1 dropped."""
    text_path = TextPath.open(tokenizer, normalizer="none")
    fitting = []
    for language, texts in LANGUAGES:
        for text in texts:
            ids = text_path.encode(text, language)
            if len(ids) <= gpt_cfg.max_text_tokens and 3 * len(ids) + 4 <= gpt_cfg.max_mel_tokens:
                fitting.append((language, text, np.asarray(ids, dtype=np.int32)))
    if {language for language, _, _ in fitting} != {language for language, _ in LANGUAGES}:
        raise UserError(f"gpt.max_text_tokens {gpt_cfg.max_text_tokens} / max_mel_tokens {gpt_cfg.max_mel_tokens} "
                        "are too small for the demo sentences of every language; use configs/tiny_v25.yaml")
    return fitting


def _speakers(dim: int, code_limit: int, rng: np.random.Generator) -> list[dict]:
    """Per speaker: a CAMPPlus-like vector (192), an emotion vector (D) and a 2-code start pattern."""
    return [{"name": f"spk{s}", "spk_emb": rng.standard_normal(SPK_EMB_DIM).astype(np.float32),
             "emo_vec": (0.5 * rng.standard_normal(dim)).astype(np.float32),
             "start_codes": rng.integers(0, code_limit, size=2).astype(np.int32)}
            for s in range(N_SPEAKERS)]


def _utterance(uid: str, sentences: list[tuple[str, str, np.ndarray]], code_table: list[np.ndarray],
               speakers: list[dict], gpt_cfg: GPTConfig, rng: np.random.Generator) -> dict:
    language, text, ids = sentences[int(rng.integers(len(sentences)))]
    speaker = speakers[int(rng.integers(N_SPEAKERS))]
    end_codes = np.array([0, 1], dtype=np.int32)
    codes = np.concatenate([speaker["start_codes"], *(code_table[i] for i in ids), end_codes])
    noise = 0.05
    return {"id": uid, "speaker": speaker["name"], "language": language, "text": text, "text_ids": ids,
            "codes": codes,
            "spk_emb": speaker["spk_emb"] + noise * rng.standard_normal(SPK_EMB_DIM, dtype=np.float32),
            "emo_vec": speaker["emo_vec"] + noise * rng.standard_normal(gpt_cfg.model_dim, dtype=np.float32)}


def _save_arrays(out_dir: Path, utt: dict) -> None:
    for key in ("text_ids", "codes", "spk_emb", "emo_vec"):
        (out_dir / key).mkdir(exist_ok=True)
        np.save(out_dir / key / f"{utt['id']}.npy", utt[key])


def _pairs(utterances: list[dict], rng: np.random.Generator) -> list[dict]:
    """2.5 paired lines: each target gets another utterance of its speaker as prompt."""
    lines = []
    for target in utterances:
        others = [u for u in utterances if u["speaker"] == target["speaker"] and u is not target] or [target]
        prompt = others[int(rng.integers(len(others)))]
        lines.append({
            "id": f"{target['id']}__{prompt['id']}", "speaker": target["speaker"],
            "language": target["language"], "lang_id": LANGUAGE_IDS[target["language"]],
            "prompt_id": prompt["id"], "prompt_audio_path": f"wavs/{prompt['id']}.wav",  # not written
            "prompt_spk_emb_path": f"spk_emb/{prompt['id']}.npy",
            "prompt_emo_vec_path": f"emo_vec/{prompt['id']}.npy",
            "prompt_duration": round(len(prompt["codes"]) / CODES_PER_SECOND, 2),
            "target_id": target["id"], "target_audio_path": f"wavs/{target['id']}.wav",
            "target_text": target["text"], "target_text_ids_path": f"text_ids/{target['id']}.npy",
            "target_text_len": len(target["text_ids"]), "target_codes_path": f"codes/{target['id']}.npy",
            "target_code_len": len(target["codes"]), "target_emo_vec_path": f"emo_vec/{target['id']}.npy",
        })
    return lines
