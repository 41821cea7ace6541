"""IndexTTS-2.5 vocabulary: the .tiktoken file, its growth by learned merges, and the row rule."""

from __future__ import annotations

import base64
import json
from pathlib import Path

import pytest
import torch

from indextts_train.checkpoint.base import load_base_checkpoint
from indextts_train.checkpoint.state import FORMAT_VERSION, migrate
from indextts_train.config.settings import GPTConfig, load_config
from indextts_train.errors import UserError
from indextts_train.model.gpt import UnifiedVoiceGPT
from indextts_train.text.tiktoken_vocab import (
    LANGUAGE_CODES,
    SPECIAL_TOKENS,
    check_tiktoken,
    extend_tiktoken,
    language_id,
    reachable,
    read_tiktoken,
)
from indextts_train.text.vocab import (
    RowFreezer,
    VocabPlan,
    frozen_language_rows,
    frozen_rows,
    growth_between_runs,
    growth_point,
    remap_optimizer_rows,
    resize_text_rows,
    tokenizer_size,
)

V25 = Path(__file__).resolve().parent / "data" / "reference" / "v2_5"
TINY = V25 / "tiny"
VOCAB = TINY / "vocab"
GROWTH = json.loads((V25 / "vocab_growth.json").read_text())
LANGUAGES = json.loads((V25 / "languages.json").read_text())
TEXT_KEYS = ("text_embedding.weight", "text_head.weight", "text_head.bias")


def test_specials_and_languages_are_the_official_ones():
    assert len(SPECIAL_TOKENS) == LANGUAGES["totals"]["specials"] == 1673
    ranks = LANGUAGES["totals"]["ranks"]
    for block in LANGUAGES["special_blocks"]:
        assert SPECIAL_TOKENS[block["first_id"] - ranks] == block["first_token"]
        assert SPECIAL_TOKENS[block["last_id"] - ranks] == block["last_token"]
    assert list(LANGUAGE_CODES) == [entry["code"] for entry in LANGUAGES["languages"]]
    for code, lang_id in LANGUAGES["lang_to_token"]["examples"].items():
        assert language_id(code) in (lang_id, None)  # unknown codes: we refuse rather than send to `common`
    assert language_id("zhen") is None and language_id("EN") == 0


def test_the_toy_vocabulary_encodes_the_reference_ids():
    vocab = read_tiktoken(VOCAB / "toy_base.tiktoken")
    assert (vocab.n_ranks, vocab.n_vocab, vocab.tag_id(0), vocab.tag_id(9)) == (100, 1773, 102, 111)
    ids = vocab.encoding().encode("<|en|> the cat sat on the mat", allowed_special="all")
    assert ids == json.loads((TINY / "expected.json").read_text())["batch"]["text_ids"][0]
    assert tokenizer_size(VOCAB / "toy_ext10.tiktoken") == 110 + 1673


def test_extend_learns_the_reference_merges_byte_identically(tmp_path):
    corpus = tmp_path / "ext.txt"
    corpus.write_text("\n".join(GROWTH["toy_files"]["ext_corpus"]) + "\n")
    out = tmp_path / "grown.tiktoken"
    summary = extend_tiktoken(VOCAB / "toy_base.tiktoken", [corpus], 1773 + 10, out)
    assert summary["added"] == 10 and summary["new_size"] == 1783
    assert out.read_bytes() == (VOCAB / "toy_ext10.tiktoken").read_bytes()


def test_every_new_rank_is_produced_from_ordinary_text(tmp_path):
    corpus = tmp_path / "ext.txt"
    corpus.write_text("merhaba dunya nasilsin\ntesekkur ederim\nsekai wa hiroi desu\n" * 3)
    base = read_tiktoken(VOCAB / "toy_base.tiktoken")
    extend_tiktoken(VOCAB / "toy_base.tiktoken", [corpus], base.n_vocab + 25, tmp_path / "g.tiktoken")
    grown = read_tiktoken(tmp_path / "g.tiktoken")
    assert grown.ranks[:100] == base.ranks and grown.n_ranks > 100
    table = grown.rank_table()
    assert all(reachable(table, token) for token in grown.ranks[100:])
    encoding = grown.encoding()
    produced = {i for text in corpus.read_text().splitlines() for i in encoding.encode(text)}
    # the longest new ranks are whole words; every rank under them is a step of some word's merges
    assert set(range(100, grown.n_ranks)) <= produced | {
        r for r in range(100, grown.n_ranks) if any(grown.ranks[r] in grown.ranks[q] for q in produced)}
    assert encoding.encode("<|tr|>", allowed_special="all") == [grown.tag_id(9)]


def test_the_empty_rank_is_kept_and_the_base_lines_are_copied(tmp_path):
    lines = (VOCAB / "toy_base.tiktoken").read_bytes().splitlines()
    lines.insert(50, b"=")  # the real file's line "= 48474": base64 of b""
    base = tmp_path / "empty.tiktoken"
    base.write_bytes(b"".join(line.split()[0] + b" %d\n" % i for i, line in enumerate(lines)))
    vocab = read_tiktoken(base)
    assert vocab.ranks[50] == b"" and vocab.n_ranks == 101
    corpus = tmp_path / "c.txt"
    corpus.write_text("merhaba merhaba\n")
    extend_tiktoken(base, [corpus], vocab.n_vocab + 3, tmp_path / "g.tiktoken")
    grown = tmp_path / "g.tiktoken"
    assert grown.read_bytes().startswith(base.read_bytes())
    report = check_tiktoken(grown, base=base)
    assert report["empty_ranks"] == [50] and report["base_ids_kept"] and not report["problems"]
    swapped = check_tiktoken(base, base=grown)  # a wrong turn: the base first, the grown file as --base
    assert swapped["problems"] == [f"the file has 101 ranks and --base {grown} has {read_tiktoken(grown).n_ranks}, "
                                   "its first ones the same: are the two swapped? Pass the grown .tiktoken first and "
                                   "the base after --base"]


def test_bad_ranks_files_name_the_line_and_a_changed_base_is_a_problem(tmp_path):
    bad = tmp_path / "bad.tiktoken"
    bad.write_text("IQ== 0\nIg== 2\n")
    with pytest.raises(UserError, match=r"bad.tiktoken:2: rank 2 where 1 was expected"):
        read_tiktoken(bad)
    bad.write_text("IQ== 0\nnot base64! 1\n")
    with pytest.raises(UserError, match=r"bad.tiktoken:2: not a tiktoken line"):
        read_tiktoken(bad)
    changed = tmp_path / "changed.tiktoken"
    changed.write_bytes((VOCAB / "toy_base.tiktoken").read_bytes().replace(b"IQ== 0", b"Iw== 0"))
    report = check_tiktoken(changed, base=VOCAB / "toy_base.tiktoken")
    assert not report["base_ids_kept"] and any("base rank 0 changed" in p for p in report["problems"])
    with pytest.raises(UserError, match="can only grow"):
        extend_tiktoken(VOCAB / "toy_ext10.tiktoken", [bad], 1773, tmp_path / "x.tiktoken")


def test_growth_follows_the_reference_row_rule():
    """R = 100, k = 10: rows 0..99 stay, 100..120 move to 110..130, rows 100..109 are new."""
    state = torch.load(TINY / "gpt.pth", weights_only=True)
    reference = torch.load(TINY / "ext_text_params.pth", weights_only=True)
    plan = VocabPlan(base_tokens=120, tokens=130, insert_at=100)
    grown = resize_text_rows({k: state[k] for k in TEXT_KEYS}, plan, torch.Generator().manual_seed(0))
    kept = [*range(100), *range(110, 131)]
    for key in TEXT_KEYS:
        assert grown[key].shape == reference[key].shape
        assert torch.equal(grown[key][kept], reference[key][kept]), key
    assert list(plan.new_ids) == list(range(100, 110))
    assert frozen_rows(plan).tolist() == kept
    assert "rows 110..129: special tokens, moved up by 10" in plan.describe()


def test_growth_point_of_a_tiktoken_tokenizer_is_the_base_rank_count():
    assert growth_point(VOCAB / "toy_ext10.tiktoken", 60509) == 58836
    assert growth_point("bpe.model", 12000) is None
    with pytest.raises(UserError, match="1673 special tokens"):
        growth_point(VOCAB / "toy_ext10.tiktoken", 120)


def test_a_second_growth_goes_after_the_first_and_moves_optimizer_moments_with_their_rows():
    second = growth_between_runs(1773 + 10, 1773 + 13, VOCAB / "toy_ext10.tiktoken")  # 100 ranks + 10, then + 3
    assert (second.growth_at, list(second.new_ids)) == (110, [110, 111, 112])
    moments = torch.arange(1784.0)[:, None].expand(1784, 2)
    moved = remap_optimizer_rows({"exp_avg": moments, "step": torch.tensor(3.0)}, second)["exp_avg"]
    assert moved.shape == (1787, 2)
    assert torch.equal(moved[:110], moments[:110]) and torch.equal(moved[113:], moments[110:])
    assert torch.equal(moved[110:113], torch.zeros(3, 2))
    # a plan saved before insert_at existed is a SentencePiece plan: migrate fills in None
    old = migrate({"format_version": FORMAT_VERSION, "vocab_plan": {"base_tokens": 10, "tokens": 12,
                                                                   "freeze_base": True}})
    assert VocabPlan.from_dict(old["vocab_plan"]).insert_at is None


def test_freezer_keeps_base_rows_unused_languages_and_the_speaker_projection_bit_identical():
    cfg: GPTConfig = load_config(TINY / "config.yaml").gpt
    trained, _, _ = load_base_checkpoint(TINY / "gpt.pth", cfg)
    plan = VocabPlan(base_tokens=120, tokens=130, insert_at=100)
    trained = resize_text_rows(trained, plan, torch.Generator().manual_seed(0))
    cfg.number_text_tokens = 130
    model = UnifiedVoiceGPT(cfg).train()
    model.load_state_dict(trained)
    language_rows = frozen_language_rows([0, 7])
    freezer = RowFreezer(model, plan, language_rows=language_rows, freeze_speaker_proj=True)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.1)
    torch.manual_seed(0)
    for _ in range(3):
        loss = sum((p * torch.randn_like(p)).sum() for p in model.parameters())
        loss.backward()
        freezer.mask_grads()
        optimizer.step()
        freezer.restore()
        optimizer.zero_grad()
    after = model.state_dict()
    kept = frozen_rows(plan)
    for key in TEXT_KEYS:
        assert torch.equal(after[key][kept], before[key][kept])
        assert not torch.equal(after[key][100:110], before[key][100:110])
    assert torch.equal(after["lang_embedding.weight"][language_rows], before["lang_embedding.weight"][language_rows])
    assert not torch.equal(after["lang_embedding.weight"][[0, 7]], before["lang_embedding.weight"][[0, 7]])
    assert torch.equal(after["spk_emb_proj.weight"], before["spk_emb_proj.weight"])
    assert torch.equal(after["spk_emb_proj.bias"], before["spk_emb_proj.bias"])
    assert not torch.equal(after["mel_head.weight"], before["mel_head.weight"])


def test_check_coverage_counts_the_ids_official_25_inference_gives_the_gpt(tmp_path):
    """Through the official path (case rule, tag, 0/1 dropped) the sample's tokens are the oracle's."""
    from indextts_train.text.inference_text import TextPath

    text = Path(__file__).parent / "data" / "reference" / "prepare" / "text"
    cases = [c for c in json.loads((text / "tiktoken_cases.json").read_text(encoding="utf-8"))["cases"]
             if c["lang"] == "en" and c["normalized"] == c["char_map"]]
    sample = tmp_path / "sample.txt"
    sample.write_text("\n".join(c["input"] for c in cases) + "\n", encoding="utf-8")
    path = TextPath.open(text / "toy_base.tiktoken", normalizer="none")
    report = check_tiktoken(text / "toy_base.tiktoken", sample_text=sample,
                            present=lambda line: path.present(line, "en"))
    assert len(cases) == 4
    assert report["sample"]["tokens"] == sum(len(c["ids_as_gpt_sees_them"]) for c in cases)
    raw = check_tiktoken(text / "toy_base.tiktoken", sample_text=sample)  # the text as it is, no tag
    assert raw["sample"]["tokens"] != report["sample"]["tokens"]


def test_a_ranks_file_past_any_vocabulary_is_refused_before_it_is_held(tmp_path, monkeypatch) -> None:
    """10^6 ranks took 660 MB and 7 s in check-tokenizer, and the 256 MiB file bound let 20 times more through;
    the count is bounded (here at 3, the same check)."""
    import indextts_train.text.tiktoken_vocab as vocab_module

    monkeypatch.setattr(vocab_module, "MAX_RANKS", 3)
    path = tmp_path / "big.tiktoken"
    raw = b"".join(base64.b64encode(bytes([i])) + b" %d\n" % i for i in range(4))
    assert len(vocab_module.tiktoken_from_bytes(path, raw.rsplit(b"\n", 2)[0]).ranks) == 3
    with pytest.raises(UserError, match=r"big\.tiktoken: more than 3 ranks, which no IndexTTS vocabulary has"):
        vocab_module.tiktoken_from_bytes(path, raw)
