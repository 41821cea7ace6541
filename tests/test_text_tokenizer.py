"""extend_tokenizer / check_tokenizer on real SentencePiece models trained in tmp_path."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest
import sentencepiece as spm

from indextts_train.data.demo_data import AMHARIC, ENGLISH
from indextts_train.errors import UserError
from indextts_train.text.spm_model import NORMAL, Piece, parse_model, read_model, write_model
from indextts_train.text.tokenizer import check_tokenizer, extend_tokenizer, render_tokenizer_report

ADD = {"bpe": 50, "unigram": 40}  # the unigram trainer keeps only 46 new pieces from the small corpus


def train_base(folder: Path, model_type: str) -> Path:
    """A real base model written by spm itself (.model and .vocab), ids 0/1/2 = <s>, </s>, <unk>."""
    text = folder / "english.txt"
    text.write_text("\n".join(ENGLISH) + "\n", encoding="utf-8")
    spm.SentencePieceTrainer.train(
        input=str(text), model_prefix=str(folder / f"base_{model_type}"), model_type=model_type,
        vocab_size=100 if model_type == "bpe" else 60, hard_vocab_limit=False, character_coverage=1.0,
        bos_id=0, eos_id=1, unk_id=2, num_threads=1, minloglevel=2)
    return folder / f"base_{model_type}.model"


@pytest.fixture(params=["bpe", "unigram"])
def setup(request, tmp_path) -> dict:
    base = train_base(tmp_path, request.param)
    corpus = tmp_path / "amharic.txt"
    corpus.write_text("\n".join(AMHARIC) + "\n", encoding="utf-8")
    size = spm.SentencePieceProcessor(model_file=str(base)).get_piece_size()
    return {"base": base, "corpus": corpus, "size": size, "target": size + ADD[request.param], "dir": tmp_path}


def snapshot(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir()) if p.is_file()}


def test_reader_writer_round_trip_is_byte_exact(setup):
    base = setup["base"]
    model = read_model(base)
    assert model.to_bytes() == base.read_bytes()
    out = setup["dir"] / "copy.model"
    write_model(model, out)
    assert out.read_bytes() == base.read_bytes()
    # spm wrote base_*.vocab itself: ours must be the same text
    ours, theirs = out.with_suffix(".vocab"), base.with_suffix(".vocab")
    assert ours.read_text(encoding="utf-8") == theirs.read_text(encoding="utf-8")


def test_extend_keeps_every_base_piece_and_reaches_target(setup):
    out = setup["dir"] / "ext.model"
    summary = extend_tokenizer(setup["base"], [setup["corpus"]], setup["target"], out)
    assert (summary["base_size"], summary["new_size"]) == (setup["size"], setup["target"])
    assert summary["added"] == setup["target"] - setup["size"] and summary["sample_new_pieces"]

    base, ext = read_model(setup["base"]), read_model(out)
    assert len(ext.pieces) == setup["target"]
    assert spm.SentencePieceProcessor(model_file=str(out)).get_piece_size() == setup["target"]
    for old, new in zip(base.pieces, ext.pieces, strict=False):
        assert (new.text, new.score, new.kind) == (old.text, old.score, old.kind)
        assert new.encode() == old.encode()  # byte-identical, not just equal
    assert ext.rest == base.rest  # trainer/normalizer specs untouched
    added = ext.pieces[setup["size"]:]
    assert all(p.kind == NORMAL for p in added)
    assert len({p.text for p in ext.pieces}) == len(ext.pieces)
    scores = [p.score for p in added]
    assert scores[0] < min(p.score for p in base.pieces)
    assert all(a > b for a, b in zip(scores, scores[1:], strict=False))

    vocab = out.with_suffix(".vocab").read_text(encoding="utf-8").splitlines()
    assert len(vocab) == setup["target"]
    piece, score = vocab[-1].split("\t")
    assert piece == added[-1].text and float(score) == pytest.approx(scores[-1], rel=1e-5)  # %g, like spm


def test_extended_model_encodes_ethiopic_and_leaves_base_text_alone(setup):
    out = setup["dir"] / "ext.model"
    extend_tokenizer(setup["base"], [setup["corpus"]], setup["target"], out)
    base = spm.SentencePieceProcessor(model_file=str(setup["base"]))
    ext = spm.SentencePieceProcessor(model_file=str(out))

    def unknowns(processor: spm.SentencePieceProcessor) -> int:
        return sum(ids.count(processor.unk_id()) for ids in processor.encode(AMHARIC))

    assert unknowns(ext) < unknowns(base)
    assert unknowns(ext) <= unknowns(base) // 5
    for text in AMHARIC:
        ids = ext.encode(text)
        assert any(i >= setup["size"] for i in ids)
        if ext.unk_id() not in ids:
            assert ext.decode(ids) == text
    # the new pieces are Ethiopic only, so English tokenizes exactly as before
    assert ext.encode(ENGLISH) == base.encode(ENGLISH)


def test_jsonl_corpus_gives_the_same_model_as_plain_text(setup):
    jsonl = setup["dir"] / "amharic.jsonl"
    jsonl.write_text("".join(json.dumps({"text": t, "id": i}, ensure_ascii=False) + "\n"
                             for i, t in enumerate(AMHARIC)), encoding="utf-8")
    extend_tokenizer(setup["base"], [setup["corpus"]], setup["target"], setup["dir"] / "a.model")
    extend_tokenizer(setup["base"], [jsonl], setup["target"], setup["dir"] / "b.model")
    assert (setup["dir"] / "a.model").read_bytes() == (setup["dir"] / "b.model").read_bytes()


def test_lines_longer_than_spm_s_default_limit_are_learned_from(setup):
    """spm drops lines past max_sentence_length (4192 bytes) silently: a corpus of one long paragraph and
    two short lines learned nothing from the paragraph, and one of long lines only failed in spm."""
    paragraph = " ".join(AMHARIC * 6)
    assert len(paragraph.encode("utf-8")) > 4192
    base = spm.SentencePieceProcessor(model_file=str(setup["base"]))
    for name, lines in (("mixed", [paragraph, *ENGLISH[:2]]), ("long_only", [paragraph, paragraph])):
        corpus = setup["dir"] / f"{name}.txt"
        corpus.write_text("\n".join(lines) + "\n", encoding="utf-8")
        out = setup["dir"] / f"{name}.model"
        extend_tokenizer(setup["base"], [corpus], setup["target"], out)
        ext = spm.SentencePieceProcessor(model_file=str(out))
        assert ext.encode(paragraph).count(ext.unk_id()) < base.encode(paragraph).count(base.unk_id()) // 5, name


def test_extend_is_deterministic(setup):
    extend_tokenizer(setup["base"], [setup["corpus"]], setup["target"], setup["dir"] / "a.model", seed=3)
    extend_tokenizer(setup["base"], [setup["corpus"]], setup["target"], setup["dir"] / "b.model", seed=3)
    assert (setup["dir"] / "a.model").read_bytes() == (setup["dir"] / "b.model").read_bytes()


@pytest.mark.parametrize("case", ["smaller_target", "missing_base", "garbage_base", "empty_corpus",
                                  "out_is_base", "bad_jsonl", "corpus_too_small"])
def test_refusals_raise_and_touch_nothing(setup, case):
    folder, base, corpus, target = setup["dir"], setup["base"], setup["corpus"], setup["target"]
    out = folder / "ext.model"
    if case == "smaller_target":
        target, match = setup["size"] - 1, "smaller than the base"
    elif case == "missing_base":
        base, match = folder / "nope.model", "not found"
    elif case == "garbage_base":
        base, match = folder / "garbage.model", "not a SentencePiece model"
        base.write_bytes(b"\xff\xff\xff\xff not a model")
    elif case == "empty_corpus":
        corpus, match = folder / "empty.txt", "no text"
        corpus.write_text("\n  \n", encoding="utf-8")
    elif case == "out_is_base":
        out, match = base, "overwrite the base"
    elif case == "bad_jsonl":
        corpus, match = folder / "bad.jsonl", r"bad\.jsonl:2: .*\"text\""
        corpus.write_text('{"text": "ሰላም"}\n{"txt": "ነው"}\n', encoding="utf-8")
    else:
        target, match = setup["size"] + 5000, r"yields only \d+ new pieces, 5000 are needed"
    before = snapshot(folder)
    with pytest.raises(UserError, match=match):
        extend_tokenizer(base, [corpus], target, out)
    assert snapshot(folder) == before


def test_check_reports_clean_extension_and_coverage(setup):
    out = setup["dir"] / "ext.model"
    extend_tokenizer(setup["base"], [setup["corpus"]], setup["target"], out)
    report = check_tokenizer(out, base=setup["base"], sample_text=setup["corpus"])
    assert report["problems"] == [] and report["base_ids_kept"]
    assert (report["vocab_size"], report["base_size"], report["n_duplicates"]) == (setup["target"], setup["size"], 0)
    assert report["n_unreachable_extended"] == 0
    sample = report["sample"]
    assert sample["lines"] == len(AMHARIC)
    assert sample["extended_char_share"] > 0.8 and sample["extended_token_share"] > 0.5
    assert sample["unk_token_rate"] < 0.05
    swapped = check_tokenizer(setup["base"], base=out)  # a wrong turn: the base first, the extension as --base
    assert swapped["problems"] == [f"the model has {setup['size']} pieces and --base {out} has {setup['target']}, its "
                                   "first ones the same: are the two swapped? Pass the extended tokenizer first and "
                                   "the base after --base"]
    base_report = check_tokenizer(setup["base"], base_vocab=setup["size"], sample_text=setup["corpus"])
    assert base_report["sample"]["unk_char_rate"] > 0.5 and base_report["sample"]["extended_token_share"] == 0
    assert "OK" in render_tokenizer_report(report)


def test_check_finds_moved_base_pieces(setup):
    out = setup["dir"] / "ext.model"
    extend_tokenizer(setup["base"], [setup["corpus"]], setup["target"], out)
    model = read_model(out)
    model.pieces[10], model.pieces[11] = model.pieces[11], model.pieces[10]
    swapped = setup["dir"] / "swapped.model"
    write_model(model, swapped)
    report = check_tokenizer(swapped, base=setup["base"])
    assert not report["base_ids_kept"]
    assert [m["id"] for m in report["id_mismatches"]] == [10, 11]
    assert report["problems"] and "PROBLEM" in render_tokenizer_report(report)


def test_check_finds_duplicates_and_unreachable_pieces(setup):
    model = read_model(setup["base"])
    lowest = min(p.score for p in model.pieces)
    normal = next(p for p in model.pieces if p.kind == NORMAL and len(p.text) > 1)
    # full-width letters: NFKC normalizes them to ASCII before encoding, so this piece can never come out
    model.pieces += [Piece("ＸＹＺ", lowest - 1.0)]
    unreachable = setup["dir"] / "unreachable.model"
    write_model(model, unreachable)
    report = check_tokenizer(unreachable)
    assert report["problems"] == []
    assert {"id": len(model.pieces) - 1, "piece": "ＸＹＺ"} in report["unreachable"]

    model.pieces += [Piece(normal.text, lowest - 2.0)]
    duplicate = setup["dir"] / "duplicate.model"
    write_model(model, duplicate)
    report = check_tokenizer(duplicate)
    assert report["n_duplicates"] == 1 and report["duplicates"][0]["piece"] == normal.text
    assert any("cannot load" in p for p in report["problems"])


def test_parse_rejects_truncated_bytes(setup):
    data = setup["base"].read_bytes()
    with pytest.raises(UserError, match="not a SentencePiece model"):
        parse_model(data[:-3], "cut.model")  # the last field now runs past the end


# ---------------------------------------------------------------------------------------------
# the official text path (inference_text): what extend and check see is what inference encodes

TEXT_REFERENCE = Path(__file__).parent / "data" / "reference" / "prepare" / "text"
TINY_BPE = TEXT_REFERENCE / "bpe_tiny.model"  # 150 pieces, upper-case Latin, learned from presented text
TURKISH = [
    "Bugün hava çok güzel, Ayşe ile parka gidiyoruz.",
    "Öğretmenimiz yarın sınavı erteleyeceğini söyledi.",
    "İstanbul Boğazı'nda akşam güneşi batarken martılar uçuşuyordu.",
    "Çocuklar bahçede top oynarken Ömer kitabını okuyordu.",
    "Şehrin eski sokaklarında yürümek insana huzur veriyor.",
    "Kahvaltıda peynir, zeytin, domates ve taze ekmek yedik.",
    "Güzel bir günün ardından herkes evine döndü.",
    "Ağaçların yaprakları sonbaharda sararıp dökülüyor.",
    "Yağmur yağınca çiçekler daha canlı görünüyor.",
    "Annem bize sıcak çorba ve ıhlamur hazırladı.",
    "Öğrenciler kütüphanede sessizce çalışıyorlardı.",
    "Dağların zirvesinde kar hâlâ erimemişti.",
]


def _grow_turkish(tmp_path: Path, monkeypatch=None) -> tuple[Path, Path]:
    corpus = tmp_path / "turkish.txt"
    corpus.write_text("\n".join(TURKISH) + "\n", encoding="utf-8")
    out = tmp_path / "grown.model"
    extend_tokenizer(TINY_BPE, [corpus], 150 + 40, out, normalizer="none")
    return corpus, out


def test_growth_from_mixed_case_latin_gives_only_pieces_inference_produces(tmp_path):
    from indextts_train.text.inference_text import TextPath

    corpus, out = _grow_turkish(tmp_path)
    new = [p.text for p in read_model(out).pieces[150:]]
    assert len(new) == 40
    assert [p for p in new if any(ch != ch.upper() for ch in p)] == []
    path = TextPath.open(out, normalizer="none")
    assert [path.unknown(text) for text in TURKISH] == [[]] * len(TURKISH)
    report = check_tokenizer(out, base=TINY_BPE, sample_text=corpus, normalizer="none")
    assert report["problems"] == [] and report["n_lower_case_extended"] == 0
    assert report["sample"]["unk_char_rate"] == 0.0
    assert report["normalizer"] == "character map only"


def test_check_finds_a_tokenizer_grown_from_raw_text(tmp_path, monkeypatch):
    """What earlier versions did: pieces learned on the raw (mixed-case) text."""
    from indextts_train.text.inference_text import SentencePiecePath

    monkeypatch.setattr(SentencePiecePath, "present", lambda self, text, language=None: text)
    corpus, out = _grow_turkish(tmp_path)
    monkeypatch.undo()
    report = check_tokenizer(out, base=TINY_BPE, sample_text=corpus, normalizer="none")
    assert report["n_lower_case_extended"] > 0
    (problem,) = [p for p in report["problems"] if "lower-case" in p]
    assert "grown from raw text" in problem and "indextts-train tokenize" in problem
    assert report["sample"]["unk_char_rate"] > 0  # the official path finds unknown text in its own corpus
    assert report["sample"]["unknown_characters"] and "unknown characters (most frequent): " in \
        render_tokenizer_report(report)


def test_check_coverage_equals_the_official_encoding(tmp_path):
    """unk and token counts from check-tokenizer equal those of the official pieces of text_cases.json."""
    cases = json.loads((TEXT_REFERENCE / "text_cases.json").read_text(encoding="utf-8"))["cases"]
    plain = [c for c in cases if c["text"].strip() and c["normalized"] in (None, c["text"]) or c["id"] in
             ("zh_plain", "punctuation")]  # texts the character map alone presents as WeTextProcessing does
    sample = tmp_path / "sample.txt"
    sample.write_text("\n".join(c["text"] for c in plain) + "\n", encoding="utf-8")
    report = check_tokenizer(TINY_BPE, base_vocab=100, sample_text=sample, normalizer="none")["sample"]
    tokens = sum(len(c["ids"]) for c in plain)
    chars = sum(len(p.replace("\u2581", "")) for c in plain for p in c["pieces"])
    unk_chars = sum(len(p.replace("\u2581", "")) for c in plain for p, i in zip(c["pieces"], c["ids"], strict=True)
                    if i == 2)
    assert {c["id"] for c in plain} == {"en_plain", "zh_plain", "punctuation", "amharic", "single_char_latin",
                                        "single_char_cjk"}
    assert (report["lines"], report["tokens"], report["characters"]) == (len(plain), tokens, chars)
    assert report["unk_char_rate"] == unk_chars / chars
    assert report["unk_token_rate"] == sum(c["n_unk"] for c in plain) / tokens
    unknown = Counter(ch for c in plain for p, i in zip(c["pieces"], c["ids"], strict=True) if i == 2
                      for ch in p.replace("\u2581", ""))
    shown = dict(report["unknown_characters"])  # the 10 most frequent (ties in any order)
    assert all(unknown[char] == count for char, count in shown.items())
    assert sorted(shown.values(), reverse=True) == sorted(unknown.values(), reverse=True)[:10]
