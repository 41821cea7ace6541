"""Prompt/target pairs: same speaker, never itself, seeded and order-free; validation split by hash or speakers."""

from __future__ import annotations

import pytest

from indextts_train.config.family import INDEXTTS2, INDEXTTS25
from indextts_train.errors import UserError
from indextts_train.prepare.pairs import SplitRule, in_val_by_hash, make_pairs, paired_line


def _utts(spec: dict[str, int]) -> list[dict]:
    return [{"id": f"{spk}_{i}", "speaker": spk} for spk, n in spec.items() for i in range(n)]


def test_prompts_are_other_utterances_of_the_same_speaker() -> None:
    utts = _utts({"a": 5, "b": 3, "lone": 1})
    pairs = make_pairs(utts, SplitRule(val_fraction=0.0, prompts_per_target=2, seed=3))
    assert pairs.lone_speakers == ["lone"] and not pairs.val
    assert len(pairs.train) == 8 * 2
    for target, prompt in pairs.train:
        assert target["speaker"] == prompt["speaker"] and target["id"] != prompt["id"]
    assert [t["id"] for t, _ in pairs.train][::2] == [u["id"] for u in utts if u["speaker"] != "lone"]


def test_pairs_depend_on_seed_and_speaker_not_on_order() -> None:
    utts = _utts({"a": 6, "b": 4})
    rule = SplitRule(val_fraction=0.0, seed=1)
    forward = {(t["id"], p["id"]) for t, p in make_pairs(utts, rule).train}
    backward = {(t["id"], p["id"]) for t, p in make_pairs(utts[::-1], rule).train}
    assert forward == backward
    other_seed = {(t["id"], p["id"]) for t, p in make_pairs(utts, SplitRule(val_fraction=0.0, seed=2)).train}
    assert other_seed != forward


def test_val_fraction_is_a_stable_hash_of_the_id() -> None:
    utts = _utts({"a": 200})
    pairs = make_pairs(utts, SplitRule(val_fraction=0.25, prompts_per_target=1))
    val_ids = {t["id"] for t, _ in pairs.val}
    assert val_ids == {u["id"] for u in utts if in_val_by_hash(u["id"], 0.25)}
    assert 20 < len(val_ids) < 80
    train_targets = {t["id"] for t, _ in pairs.train}
    assert all(p["id"] not in val_ids for _, p in pairs.train) and not train_targets & val_ids
    more = make_pairs(utts + _utts({"b": 50}), SplitRule(val_fraction=0.25, prompts_per_target=1))
    assert {t["id"] for t, _ in more.val if t["speaker"] == "a"} == val_ids  # old clips do not move


def test_val_speakers_hold_out_whole_speakers() -> None:
    utts = _utts({"a": 3, "b": 3, "c": 3, "d": 1})
    pairs = make_pairs(utts, SplitRule(val_speakers=1, prompts_per_target=1))
    val_speakers = {t["speaker"] for t, _ in pairs.val}
    assert len(val_speakers) == 1 and not val_speakers & {t["speaker"] for t, _ in pairs.train}
    with pytest.raises(UserError, match="--val-speakers 3: the corpus has only 3 speakers"):
        make_pairs(utts, SplitRule(val_speakers=3))


def test_paired_line_has_the_fields_train_gpt_reads() -> None:
    base = {"speaker": "s", "language": "am", "audio": "/a.wav", "text": "t", "duration": 1.0, "lang_id": 177,
            "text_ids_path": "text_ids/x.npy", "codes_path": "codes/x.npy", "condition_path": "condition/x.npy",
            "spk_emb_path": "spk_emb/x.npy", "emo_vec_path": "emo_vec/x.npy", "text_len": 3, "code_len": 9}
    target, prompt = {**base, "id": "t"}, {**base, "id": "p", "condition_path": "condition/p.npy",
                                             "spk_emb_path": "spk_emb/p.npy"}
    v2 = paired_line(target, prompt, INDEXTTS2)
    assert v2["prompt_condition_path"] == "condition/p.npy" and "prompt_spk_emb_path" not in v2
    assert (v2["target_text_len"], v2["target_code_len"], v2["id"]) == (3, 9, "t__p")
    v25 = paired_line(target, prompt, INDEXTTS25)
    assert v25["prompt_spk_emb_path"] == "spk_emb/p.npy" and v25["lang_id"] == 177


def test_targets_with_fewer_prompts_than_asked_are_counted_and_said(tmp_path, capsys) -> None:
    """--prompts-per-target 5 on speakers of 3 clips gave 2 prompts a target, silently."""
    from indextts_train.prepare.progress import print_summary

    utts = _utts({"a": 3, "b": 7})
    pairs = make_pairs(utts, SplitRule(val_fraction=0.0, prompts_per_target=5))
    assert pairs.fewer_prompts == 3  # a's three targets have 2 other clips each; b's have 6
    assert make_pairs(utts, SplitRule(val_fraction=0.0, prompts_per_target=2)).fewer_prompts == 0
    counts = {"kept": 10, "utterances": 10, "speakers": 2, "rejected": 0, "rejected_by_reason": {},
              "rejected_top": [], "languages": {}, "train_pairs": len(pairs.train), "val_pairs": 1,
              "single_utterance_speakers": 0, "targets_with_fewer_prompts": pairs.fewer_prompts, "text_tokens": 20,
              "distinct_text_tokens": 9, "extended_pieces": 0}
    print_summary({"counts": counts, "hours": 0.001, "settings": {"prompts_per_target": 5}}, tmp_path)
    assert ("note: 3 target(s) have fewer than --prompts-per-target 5 prompts: their speakers have fewer other "
            "clips") in capsys.readouterr().out
