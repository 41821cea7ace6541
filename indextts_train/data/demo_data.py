"""The built-in demo dataset of either family: real tokenizers, a paired manifest, learnable synthetic features.

The tokenizers are real and grown the way a user grows the release's: a *base* vocabulary at the
config's `number_text_tokens` learned from English sentences, then extended by learning from
Amharic (a second script, a language neither release speaks). IndexTTS2: SentencePiece BPE models.
IndexTTS-2.5: byte-level BPE tiktoken ranks as its file has (all 256 single bytes, printable ASCII
first, so ranks 0 and 1 are `!` and `"`), followed by the 1,673 official special tokens, so growing it
moves every special row up. Text is learned from, and encoded, as official inference presents it
(inference_text; 2.5: with the language's tag and case rule); the demo sentences have no digits, so
the character map alone presents them as WeTextProcessing would, wherever the demo runs.

Audio features are synthetic: each utterance's codes are a fixed function of its text ids and
speaker, so a tiny GPT's mel loss falls within a minute of CPU training, and the speaker's
conditioning (IndexTTS2's 32 latents or 2.5's 192-d CAMPPlus-like vector) and emotion vectors
cluster by speaker.
"""

from __future__ import annotations

import base64
import io
import json
from collections.abc import Callable
from pathlib import Path

import numpy as np
import sentencepiece as spm

from indextts_train.config.constants import CONDITION_LATENTS, SPK_EMB_DIM
from indextts_train.config.family import TIKTOKEN, Family
from indextts_train.config.settings import GPTConfig
from indextts_train.errors import UserError
from indextts_train.text.inference_text import TextPath, charmap_normalize, cjk_split_upper
from indextts_train.text.spm_model import USER_DEFINED, Piece, parse_model, write_model
from indextts_train.text.tiktoken_vocab import LANGUAGE_IDS, SPECIAL_TOKENS, extend_tiktoken
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

LANGUAGES = (("en", ENGLISH), ("am", AMHARIC))
EXTRA_TOKENS = 50  # the grown vocabulary has base size + 50 tokens (2.5: ranks, and every special id + 50)
N_SPEAKERS = 3
CODES_PER_SECOND = 25  # nominal, only for the manifest's prompt_duration (the trainer does not read it)
_FILLER = "<demo_filler_{}>"


def make_demo_dataset(out_dir: Path, *, gpt_cfg: GPTConfig, n_train: int = 96, n_val: int = 16,
                      seed: int = 0) -> dict:
    """Write the vocabularies, corpora, arrays and train/val manifests of gpt_cfg's family into `out_dir`;
    return their paths.

    Deterministic for a seed: the same arguments give byte-identical files.
    """
    if n_train < 1 or n_val < 1:
        raise UserError(f"the demo needs at least one train and one val sample (got {n_train}, {n_val})")
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    family = gpt_cfg.family
    grow = _grow_tiktoken if family.tokenizer_kind == TIKTOKEN else _grow_sentencepiece
    vocabularies = grow(out_dir, gpt_cfg, seed)
    sentences = _encodable_sentences(vocabularies["tokenizer"], gpt_cfg)
    code_table = _code_table(vocabularies["vocab_size"], _code_limit(gpt_cfg), rng)
    speakers = _speakers(family, gpt_cfg.model_dim, _code_limit(gpt_cfg), rng)
    manifests = {}
    for split, count in {"train": n_train, "val": n_val}.items():
        utterances = [_utterance(f"{split}{i:04d}", sentences, code_table, speakers, family, rng)
                      for i in range(count)]
        for utt in utterances:
            _save_arrays(out_dir, utt, family)
        manifests[f"{split}_manifest"] = _write_manifest(out_dir / f"{split}.jsonl", _pairs(utterances, family, rng))
    return {**vocabularies, **manifests, "n_train": n_train, "n_val": n_val, "n_speakers": N_SPEAKERS}


def _write_lines(path: Path, lines: list[str]) -> Path:
    path.write_text("".join(f"{line}\n" for line in lines), encoding="utf-8")
    return path


def _grow_sentencepiece(out_dir: Path, gpt_cfg: GPTConfig, seed: int) -> dict:
    """IndexTTS2: base_bpe.model from English, grown into bpe.model with Amharic pieces."""
    base = _make_base_tokenizer(out_dir / "base_bpe.model", gpt_cfg, seed)
    extension = _write_lines(out_dir / "corpus_am.txt", AMHARIC)
    corpus = _write_lines(out_dir / "corpus.txt", ENGLISH + AMHARIC)
    tokenizer = out_dir / "bpe.model"
    summary = extend_tokenizer(base, [extension], gpt_cfg.number_text_tokens + EXTRA_TOKENS, tokenizer,
                               seed=seed, normalizer="none", force=True)
    return {"base_tokenizer": base, "tokenizer": tokenizer, "corpus": corpus, "extension_corpus": extension,
            "base_size": summary["base_size"], "vocab_size": summary["new_size"]}


def _grow_tiktoken(out_dir: Path, gpt_cfg: GPTConfig, seed: int) -> dict:
    """IndexTTS-2.5: base.tiktoken from English, grown into grown.tiktoken with Amharic merges (no seed:
    byte-pair merges are deterministic)."""
    base = _make_base_vocabulary(out_dir, gpt_cfg)
    extension = _write_lines(out_dir / "corpus_am.txt", AMHARIC)
    tokenizer = out_dir / "grown.tiktoken"
    summary = extend_tiktoken(base, [extension], gpt_cfg.number_text_tokens + EXTRA_TOKENS, tokenizer,
                              _presenter(base, "am"), force=True)
    return {"base_tokenizer": base, "tokenizer": tokenizer, "extension_corpus": extension,
            "base_size": summary["base_size"], "vocab_size": summary["new_size"],
            "base_ranks": summary["base_ranks"], "added": summary["added"]}


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


def byte_order() -> list[int]:
    """GPT-2's byte order: printable bytes first (0x21 '!' is rank 0), then the others."""
    printable = [*range(0x21, 0x7F), *range(0xA1, 0xAD), *range(0xAE, 0x100)]
    return printable + [b for b in range(256) if b not in printable]


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


def _presenter(vocabulary: Path, language: str) -> Callable[[str], str]:
    """A corpus text as inference presents it after the `<|language|> ` tag (no digits: no normaliser needed)."""
    text_path = TextPath.open(vocabulary, normalizer="none")
    return lambda text: text_path.present_body(text, language)


def _encodable_sentences(tokenizer: Path, gpt_cfg: GPTConfig) -> list[tuple[str | None, str, np.ndarray]]:
    """(language, text, ids) of each built-in sentence that encodes without <unk> and fits the length
    limits, ids as official inference encodes the text (2.5: the tag of its language first, the
    language's case rule, 0/1 dropped; IndexTTS2 text has no language: None)."""
    text_path = TextPath.open(tokenizer, normalizer="none")
    fitting, wanted = [], set()
    for language, texts in LANGUAGES:
        code = language if gpt_cfg.family.language_rows else None
        wanted.add(code)
        for text in texts:
            ids = np.asarray(text_path.encode(text, code), dtype=np.int32)
            # 3 codes per token at most, plus the 2-code start and end patterns
            if not text_path.unknown(text, code) and len(ids) <= gpt_cfg.max_text_tokens \
                    and 3 * len(ids) + 4 <= gpt_cfg.max_mel_tokens:
                fitting.append((code, text, ids))
    if {code for code, _, _ in fitting} != wanted:
        raise UserError(f"gpt.max_text_tokens {gpt_cfg.max_text_tokens} / max_mel_tokens {gpt_cfg.max_mel_tokens} "
                        f"are too small for the demo sentences of every language; use {gpt_cfg.family.tiny_config}")
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


def _speakers(family: Family, dim: int, code_limit: int, rng: np.random.Generator) -> list[dict]:
    """Per speaker: its conditioning (IndexTTS2: 32 x D latents; 2.5: a CAMPPlus-like 192 vector), an
    emotion vector (D) and a 2-code start pattern the conditioning predicts."""
    shape = (SPK_EMB_DIM,) if family.speaker_vector else (CONDITION_LATENTS, dim)
    return [{"name": f"spk{s}", family.speaker_input: rng.standard_normal(shape).astype(np.float32),
             "emo_vec": (0.5 * rng.standard_normal(dim)).astype(np.float32),
             "start_codes": rng.integers(0, code_limit, size=2).astype(np.int32)}
            for s in range(N_SPEAKERS)]


def _utterance(uid: str, sentences: list[tuple[str | None, str, np.ndarray]], code_table: list[np.ndarray],
               speakers: list[dict], family: Family, rng: np.random.Generator) -> dict:
    language, text, ids = sentences[int(rng.integers(len(sentences)))]
    speaker = speakers[int(rng.integers(N_SPEAKERS))]
    end_codes = np.array([0, 1], dtype=np.int32)  # the same for everyone: "the utterance is over"
    codes = np.concatenate([speaker["start_codes"], *(code_table[i] for i in ids), end_codes])
    noise = 0.05  # small per-utterance variation around the speaker's vectors
    vector, emo_vec = speaker[family.speaker_input], speaker["emo_vec"]
    return {"id": uid, "speaker": speaker["name"], "language": language, "text": text, "text_ids": ids,
            "codes": codes,
            family.speaker_input: vector + noise * rng.standard_normal(vector.shape, dtype=np.float32),
            "emo_vec": emo_vec + noise * rng.standard_normal(emo_vec.shape, dtype=np.float32)}


def _save_arrays(out_dir: Path, utt: dict, family: Family) -> None:
    for key in ("text_ids", "codes", family.speaker_input, "emo_vec"):
        (out_dir / key).mkdir(exist_ok=True)
        np.save(out_dir / key / f"{utt['id']}.npy", utt[key])


def _pairs(utterances: list[dict], family: Family, rng: np.random.Generator) -> list[dict]:
    """Manifest lines in the paired form: each target gets another utterance of its speaker as prompt
    (itself only when the speaker has no other utterance in the split)."""
    lines = []
    speaker_field = family.manifest_forms[True][0][family.speaker_input]
    for target in utterances:
        others = [u for u in utterances if u["speaker"] == target["speaker"] and u is not target] or [target]
        prompt = others[int(rng.integers(len(others)))]
        language = {"language": target["language"], "lang_id": LANGUAGE_IDS[target["language"]]} \
            if family.language_rows else {}
        conditioning = {speaker_field: f"{family.speaker_input}/{prompt['id']}.npy"}
        if not family.speaker_vector:
            conditioning["prompt_condition_len"] = CONDITION_LATENTS
        lines.append({
            "id": f"{target['id']}__{prompt['id']}", "speaker": target["speaker"], **language,
            "prompt_id": prompt["id"], "prompt_audio_path": f"wavs/{prompt['id']}.wav",  # not written
            **conditioning, "prompt_emo_vec_path": f"emo_vec/{prompt['id']}.npy",
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
