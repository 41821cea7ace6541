"""Prompt/target pairs for the paired manifests, and the train/validation split.

A prompt is another utterance of the target's speaker (never the target itself); each target gets
`prompts_per_target` of them, drawn by a generator seeded with (seed, a stable hash of the target id),
so a pair depends only on the seed, the id and that speaker's utterances, not on the order of work.
Validation takes either a stable-hash fraction of the ids (adding clips later moves no old one) or
whole speakers. Validation targets may take prompts from training utterances of their speaker (a
prompt is only conditioning); training targets never take validation audio. Speakers with a single
utterance cannot make a pair: they are counted and left out.
"""

from __future__ import annotations

import hashlib
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field

import numpy as np

from indextts_train.config.constants import CONDITION_LATENTS
from indextts_train.config.family import Family
from indextts_train.errors import UserError


def stable_hash(text: str) -> int:
    """A 64-bit hash of a string that is the same in every process and Python version (unlike hash())."""
    return int.from_bytes(hashlib.sha256(text.encode("utf-8")).digest()[:8], "big")


@dataclass(frozen=True)
class SplitRule:
    """--val-fraction (by id hash) or --val-speakers (whole speakers), --prompts-per-target, --seed."""

    val_fraction: float = 0.05
    val_speakers: int = 0
    prompts_per_target: int = 2
    seed: int = 0

    def __post_init__(self) -> None:
        if not 0.0 <= self.val_fraction < 1.0:
            raise UserError(f"--val-fraction {self.val_fraction}: must be >= 0 and < 1")
        if self.val_speakers < 0:
            raise UserError(f"--val-speakers {self.val_speakers}: must be >= 0")
        if self.val_speakers and self.val_fraction not in (0.0, SplitRule.val_fraction):
            raise UserError(f"--val-fraction {self.val_fraction} and --val-speakers {self.val_speakers}: whole "
                            "speakers are held out instead of a share of the ids, so --val-fraction would change "
                            "nothing; pass one of them")
        if self.prompts_per_target < 1:
            raise UserError(f"--prompts-per-target {self.prompts_per_target}: must be >= 1")
        if not 0 <= self.seed < 2**64:  # numpy's generators take unsigned 64-bit seeds
            raise UserError(f"--seed {self.seed}: must be in 0..2**64-1")


@dataclass
class Pairs:
    train: list[tuple[dict, dict]] = field(default_factory=list)  # (target, prompt) utterance lines
    val: list[tuple[dict, dict]] = field(default_factory=list)
    lone_speakers: list[str] = field(default_factory=list)  # one utterance: no pair possible
    fewer_prompts: int = 0  # targets with fewer prompts than --prompts-per-target asks (none: in `unpaired` too)
    unpaired: list[str] = field(default_factory=list)  # training targets whose speaker's other clips are all held out


def check_val_speakers(speakers: Iterable[str], count: int) -> None:
    """--val-speakers refused before any audio is read when the corpus itself names too few speakers with two
    or more utterances: the clips rejected later can only lower that count (val_speaker_set's check)."""
    if count:
        seen = Counter(speakers)
        val_speaker_set([s for s, n in seen.items() if n > 1], count, 0)


def val_speaker_set(speakers: list[str], count: int, seed: int) -> set[str]:
    """`count` whole speakers, chosen by a seeded stable hash (not by corpus order)."""
    if count >= len(speakers):
        raise UserError(f"--val-speakers {count}: the corpus has only {len(speakers)} speakers with two or more "
                        "utterances; leave some for training")
    return set(sorted(speakers, key=lambda s: stable_hash(f"{seed}:{s}"))[:count])


def in_val_by_hash(uid: str, fraction: float) -> bool:
    return stable_hash(uid) < fraction * 2.0**64


def _choose(target: dict, candidates: list[dict], k: int, seed: int) -> list[dict]:
    others = sorted((u for u in candidates if u["id"] != target["id"]), key=lambda u: u["id"])  # a set, not an order
    if not others:
        return []
    rng = np.random.default_rng([seed, stable_hash(target["id"])])
    picked = rng.choice(len(others), size=min(k, len(others)), replace=False)
    return [others[i] for i in sorted(picked)]  # by id: the manifest does not depend on the draw order


def make_pairs(kept: list[dict], rule: SplitRule) -> Pairs:
    """Pairs of every kept utterance line (single form, corpus order), targets in corpus order."""
    by_speaker: dict[str, list[dict]] = {}
    for utt in kept:
        by_speaker.setdefault(utt["speaker"], []).append(utt)
    pairs = Pairs(lone_speakers=sorted(s for s, utts in by_speaker.items() if len(utts) == 1))
    pairable = [s for s, utts in by_speaker.items() if len(utts) > 1]
    held_out = val_speaker_set(pairable, rule.val_speakers, rule.seed) if rule.val_speakers else set()

    def is_val(utt: dict) -> bool:
        return utt["speaker"] in held_out if rule.val_speakers else in_val_by_hash(utt["id"], rule.val_fraction)

    for target in kept:
        if target["speaker"] in pairs.lone_speakers:
            continue
        speaker_utts = by_speaker[target["speaker"]]
        val = is_val(target)
        candidates = speaker_utts if val else [u for u in speaker_utts if not is_val(u)]
        chosen = _choose(target, candidates, rule.prompts_per_target, rule.seed)
        pairs.fewer_prompts += len(chosen) < rule.prompts_per_target
        if not chosen:  # a training target of a speaker whose other clips all went to validation: in no pair
            pairs.unpaired.append(target["id"])
        for prompt in chosen:
            (pairs.val if val else pairs.train).append((target, prompt))
    return pairs


def paired_line(target: dict, prompt: dict, family: Family) -> dict:
    """The paired-form manifest line train-gpt reads (README "Data"), paths relative to the output folder."""
    line = {"id": f"{target['id']}__{prompt['id']}", "speaker": target["speaker"]}
    if target["language"] is not None:
        line["language"] = target["language"]
    if family.language_rows:
        line["lang_id"] = target["lang_id"]
    line |= {"prompt_id": prompt["id"], "prompt_audio_path": prompt["audio"]}
    speaker = family.speaker_input  # the prompt's condition latents or its CAMPPlus vector
    line[family.manifest_forms[True][0][speaker]] = prompt[f"{speaker}_path"]
    if not family.speaker_vector:
        line["prompt_condition_len"] = CONDITION_LATENTS
    line |= {"prompt_emo_vec_path": prompt["emo_vec_path"], "prompt_duration": prompt["duration"],
             "target_id": target["id"], "target_audio_path": target["audio"], "target_text": target["text"],
             "target_text_ids_path": target["text_ids_path"], "target_text_len": target["text_len"],
             "target_codes_path": target["codes_path"], "target_code_len": target["code_len"],
             "target_emo_vec_path": target["emo_vec_path"], "target_duration": target["duration"]}
    return line
