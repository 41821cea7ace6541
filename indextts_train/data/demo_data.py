"""The built-in demo dataset: real tokenizers, a paired manifest and learnable synthetic features.

A real SentencePiece BPE *base* model is trained on English sentences at the config's
`number_text_tokens`, then extended with pieces for Ethiopic script learned from Amharic sentences,
the way a user extends IndexTTS2's `bpe.model` for a new language. Both learn from the text as
official inference presents it (upper case, CJK split; inference_text), and the manifests' text ids
are that presented text's encoding. The demo sentences have no digits, so the character map alone
presents them as WeTextProcessing would, wherever the demo runs. Audio features are synthetic:
each utterance's semantic codes are a fixed function of its text ids and speaker, so a tiny GPT's
mel loss falls within a minute of CPU training, and the condition/emotion vectors cluster by speaker.
"""

from __future__ import annotations

import io
import json
from collections.abc import Callable
from pathlib import Path

import numpy as np
import sentencepiece as spm

from indextts_train.config.constants import CONDITION_LATENTS
from indextts_train.config.settings import GPTConfig
from indextts_train.errors import UserError
from indextts_train.text.inference_text import TextPath, charmap_normalize, cjk_split_upper
from indextts_train.text.spm_model import USER_DEFINED, Piece, parse_model, write_model
from indextts_train.text.tokenizer import extend_tokenizer

ENGLISH = [
    "The cat sat on the mat.", "A dog ran in the park.", "We read a book at home.",
    "She sings a song every day.", "He drinks hot tea in the morning.", "The sun is bright today.",
    "Open the door, please.", "Where is the train station?", "I like green apples.",
    "They walk to school together.", "The river is long and wide.", "My brother plays the drum.",
    "It is cold at night.", "Please sit down here.", "The bird flies over the tree.",
    "We eat bread and cheese.", "Thank you very much.", "Good morning to you.",
    "The baby is sleeping now.", "Turn left at the corner.", "How are you today?",
    "The market opens at nine.", "Rain falls on the roof.", "Her house has a red door.",
    "The children play in the garden.", "Can you help me, please?", "I will call you later.",
    "The coffee is too hot.", "We have two cats and a dog.", "The road is quiet at dawn.",
    "See you tomorrow.", "This is my friend.", "The teacher writes on the board.",
    "Listen to the music.", "Water is good for you.", "The moon is full tonight.",
]

# Short everyday Amharic (greetings, numbers, simple statements) over a small syllable inventory
# (about 40 characters), so the 50 new pieces of the tiny config cover every character plus merges.
AMHARIC = [
    "ሰላም ነው።", "ሰላም ነህ?", "ሰላም ነሽ?", "ደህና ነኝ።", "ደህና ነን።", "እንደምን ነህ?", "እንደምን ነሽ?",
    "ደህና ሁን።", "ቤቱ ትልቅ ነው።", "ቤቴ ትንሽ ነው።", "ቡና አለ።", "ቡና ደስ ይላል።", "ዳቦ አለ።",
    "ዳቦ እና ቡና አለ።", "መልካም ቀን።", "መልካም ምሽት።", "አንድ ሁለት ሶስት።", "አራት አምስት።",
    "ስሜ አበበ ነው።", "ስምህ ማን ነው?", "ስምሽ ማን ነው?", "ቤቱ ደስ ይላል።", "እናቴ ቤት ናት።",
    "አባቴ ቤት ነው።", "አመሰግናለሁ።", "በጣም አመሰግናለሁ።", "በጣም ደስ ይላል።", "ቀን ነው።",
    "ቡና እና ዳቦ ደስ ይላል።", "ትንሽ ቡና።", "አንድ ቡና እና አንድ ዳቦ።", "ሁለት ቤት አለ።",
    "ሰላም ቀን ነው።", "መልካም ቀን ነው።", "አንድ ቤት ትልቅ ነው።", "ሁለት ዳቦ አለ።",
]

EXTRA_PIECES = 50  # the extended tokenizer has base size + 50 pieces
N_SPEAKERS = 3
CODES_PER_SECOND = 25  # nominal, only for the manifest's prompt_duration (the trainer does not read it)
_FILLER = "<demo_filler_{}>"


def make_demo_dataset(out_dir: Path, *, gpt_cfg: GPTConfig, n_train: int = 96, n_val: int = 16,
                      seed: int = 0) -> dict:
    """Write tokenizers, corpora, arrays and train/val manifests into `out_dir`; return their paths.

    Deterministic for a seed: the same arguments give byte-identical files.
    """
    if n_train < 1 or n_val < 1:
        raise UserError(f"the demo needs at least one train and one val sample (got {n_train}, {n_val})")
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    base_path = _make_base_tokenizer(out_dir / "base_bpe.model", gpt_cfg, seed)
    amharic_corpus = _write_lines(out_dir / "corpus_am.txt", AMHARIC)
    corpus = _write_lines(out_dir / "corpus.txt", ENGLISH + AMHARIC)
    tokenizer = out_dir / "bpe.model"
    summary = extend_tokenizer(base_path, [amharic_corpus], gpt_cfg.number_text_tokens + EXTRA_PIECES, tokenizer,
                               seed=seed, normalizer="none", force=True)
    sentences = _encodable_sentences(tokenizer, gpt_cfg)
    code_table = _code_table(summary["new_size"], _code_limit(gpt_cfg), rng)
    speakers = _speakers(gpt_cfg.model_dim, _code_limit(gpt_cfg), rng)
    manifests = write_splits(out_dir, {"train": n_train, "val": n_val},
                             lambda uid: _utterance(uid, sentences, code_table, speakers, gpt_cfg, rng),
                             _save_arrays, _pairs, rng)
    return {"base_tokenizer": base_path, "tokenizer": tokenizer, "train_manifest": manifests["train"],
            "val_manifest": manifests["val"], "corpus": corpus, "extension_corpus": amharic_corpus,
            "n_train": n_train, "n_val": n_val, "n_speakers": N_SPEAKERS,
            "base_size": summary["base_size"], "vocab_size": summary["new_size"]}


def write_splits(out_dir: Path, counts: dict[str, int], utterance: Callable[[str], dict],
                 save_arrays: Callable[[Path, dict], None],
                 pairs: Callable[[list[dict], np.random.Generator], list[dict]],
                 rng: np.random.Generator) -> dict[str, Path]:
    """Each split's utterances made, their arrays saved and their paired lines written (both families)."""
    manifests = {}
    for split, count in counts.items():
        utterances = [utterance(f"{split}{i:04d}") for i in range(count)]
        for utt in utterances:
            save_arrays(out_dir, utt)
        manifests[split] = _write_manifest(out_dir / f"{split}.jsonl", pairs(utterances, rng))
    return manifests


def _write_lines(path: Path, lines: list[str]) -> Path:
    path.write_text("".join(f"{line}\n" for line in lines), encoding="utf-8")
    return path


def _make_base_tokenizer(path: Path, gpt_cfg: GPTConfig, seed: int) -> Path:
    """A BPE model of exactly `number_text_tokens` pieces, ids 0/1 being the GPT's start/stop text tokens.

    Making the GPT's start/stop ids spm's <s>/</s> control pieces means encoding never produces them.
    The English text supports only so many merges; USER_DEFINED filler pieces (which match no
    text) make up the rest, so the base size equals the config whatever its number.
    """
    start, stop = gpt_cfg.start_text_token, gpt_cfg.stop_text_token
    unk = min({0, 1, 2} - {start, stop})
    spm.set_random_generator_seed(seed)
    model = io.BytesIO()
    try:
        spm.SentencePieceTrainer.train(
            sentence_iterator=iter([cjk_split_upper(charmap_normalize(text)) for text in ENGLISH]),
            model_writer=model, model_type="bpe",
            vocab_size=gpt_cfg.number_text_tokens, hard_vocab_limit=False, character_coverage=1.0,
            byte_fallback=False, bos_id=start, eos_id=stop, unk_id=unk, pad_id=-1, num_threads=1, minloglevel=2)
    except RuntimeError as exc:
        raise UserError(f"gpt.number_text_tokens {gpt_cfg.number_text_tokens} (start/stop text {start}/{stop}) "
                        f"does not fit the demo's base tokenizer ({exc}); use >= 100 text tokens") from None
    base = parse_model(model.getvalue(), "demo base tokenizer")
    fillers = gpt_cfg.number_text_tokens - len(base.pieces)
    base.pieces += [Piece(_FILLER.format(i), 0.0, USER_DEFINED) for i in range(fillers)]
    write_model(base, path)
    return path


def _encodable_sentences(tokenizer: Path, gpt_cfg: GPTConfig) -> list[tuple[str, np.ndarray]]:
    """(text, ids) of every built-in sentence that encodes without <unk> and fits the length limits;
    ids as official inference encodes the text."""
    text_path = TextPath.open(tokenizer, normalizer="none")
    fitting = []
    for text in ENGLISH + AMHARIC:
        ids = np.asarray(text_path.encode(text), dtype=np.int32)
        # 3 codes per token at most, plus the 2-code start and end patterns
        if not text_path.unknown(text) and len(ids) <= gpt_cfg.max_text_tokens \
                and 3 * len(ids) + 4 <= gpt_cfg.max_mel_tokens:
            fitting.append((text, ids))
    if not fitting:
        raise UserError(f"gpt.max_text_tokens {gpt_cfg.max_text_tokens} / max_mel_tokens {gpt_cfg.max_mel_tokens} "
                        "are too small for any demo sentence; use configs/tiny.yaml")
    return fitting


def _code_limit(gpt_cfg: GPTConfig) -> int:
    """Codes are drawn below this, so they are never the start/stop mel ids."""
    return min(gpt_cfg.number_mel_codes - 2, gpt_cfg.start_mel_token, gpt_cfg.stop_mel_token)


def _code_table(vocab_size: int, code_limit: int, rng: np.random.Generator) -> list[np.ndarray]:
    """Each text id -> 1..3 codes c, c+1, c+2 (mod limit): after the first code of a token the rest
    follow from the previous code alone, which a tiny GPT learns within a few dozen steps."""
    lengths = rng.integers(1, 4, size=vocab_size)
    firsts = rng.integers(0, code_limit, size=vocab_size)
    return [((first + np.arange(n)) % code_limit).astype(np.int32) for first, n in zip(firsts, lengths, strict=True)]


def _speakers(dim: int, code_limit: int, rng: np.random.Generator) -> list[dict]:
    """Per speaker: condition (32, D), emotion (D) and a 2-code start pattern the condition predicts."""
    return [{"name": f"spk{s}",
             "condition": rng.standard_normal((CONDITION_LATENTS, dim)).astype(np.float32),
             "emo_vec": (0.5 * rng.standard_normal(dim)).astype(np.float32),
             "start_codes": rng.integers(0, code_limit, size=2).astype(np.int32)}
            for s in range(N_SPEAKERS)]


def _utterance(uid: str, sentences: list[tuple[str, np.ndarray]], code_table: list[np.ndarray],
               speakers: list[dict], gpt_cfg: GPTConfig, rng: np.random.Generator) -> dict:
    text, ids = sentences[int(rng.integers(len(sentences)))]
    speaker = speakers[int(rng.integers(N_SPEAKERS))]
    end_codes = np.array([0, 1], dtype=np.int32)  # the same for everyone: "the utterance is over"
    codes = np.concatenate([speaker["start_codes"], *(code_table[i] for i in ids), end_codes])
    noise = 0.05  # small per-utterance variation around the speaker's vectors
    return {"id": uid, "speaker": speaker["name"], "text": text, "text_ids": ids, "codes": codes,
            "condition": speaker["condition"] + noise * rng.standard_normal(speaker["condition"].shape,
                                                                            dtype=np.float32),
            "emo_vec": speaker["emo_vec"] + noise * rng.standard_normal(gpt_cfg.model_dim, dtype=np.float32)}


def _save_arrays(out_dir: Path, utt: dict) -> None:
    for folder, key in (("text_ids", "text_ids"), ("codes", "codes"), ("condition", "condition"),
                        ("emo_vec", "emo_vec")):
        (out_dir / folder).mkdir(exist_ok=True)
        np.save(out_dir / folder / f"{utt['id']}.npy", utt[key])


def _pairs(utterances: list[dict], rng: np.random.Generator) -> list[dict]:
    """Manifest lines in the paired form: each target gets another utterance of its speaker as prompt
    (itself only when the speaker has no other utterance in the split)."""
    lines = []
    for target in utterances:
        others = [u for u in utterances if u["speaker"] == target["speaker"] and u is not target] or [target]
        prompt = others[int(rng.integers(len(others)))]
        lines.append({
            "id": f"{target['id']}__{prompt['id']}", "speaker": target["speaker"],
            "prompt_id": prompt["id"], "prompt_audio_path": f"wavs/{prompt['id']}.wav",  # not written
            "prompt_condition_path": f"condition/{prompt['id']}.npy", "prompt_condition_len": CONDITION_LATENTS,
            "prompt_emo_vec_path": f"emo_vec/{prompt['id']}.npy",
            "prompt_duration": round(len(prompt["codes"]) / CODES_PER_SECOND, 2),
            "target_id": target["id"], "target_audio_path": f"wavs/{target['id']}.wav",
            "target_text": target["text"], "target_text_ids_path": f"text_ids/{target['id']}.npy",
            "target_text_len": len(target["text_ids"]), "target_codes_path": f"codes/{target['id']}.npy",
            "target_code_len": len(target["codes"]), "target_emo_vec_path": f"emo_vec/{target['id']}.npy",
        })
    return lines


def _write_manifest(path: Path, lines: list[dict]) -> Path:
    path.write_text("".join(json.dumps(line, ensure_ascii=False) + "\n" for line in lines), encoding="utf-8")
    return path
