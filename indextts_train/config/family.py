"""The model family, a type: what differs between IndexTTS2 and IndexTTS-2.5, as data.

The two families share the GPT; they differ in the tokenizer (SentencePiece `.model` vs tiktoken
ranks), the prompt's conditioning input (32 conditioning latents vs a 192-d CAMPPlus speaker vector),
language rows on the text positions (2.5 only), the codec that makes the codes, the names official
inference opens and the package it lives in. A family is chosen once (from the config's top-level
`version:`, a checkpoint's keys or a tokenizer's suffix); the code asks it instead of testing which
one it is, so a third family is a third instance here, not a new branch in every module.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from types import MappingProxyType
from typing import Any

from indextts_train.errors import UserError

SENTENCEPIECE = "sentencepiece"
TIKTOKEN = "tiktoken"


@dataclass(frozen=True, eq=False)  # one instance per family: identity is equality
class Family:
    """One model family: its names, its tokenizer, its conditioning input, its files and its inference code.

    Capabilities (`language_rows`, `speaker_vector`, `hub_parts`, ...) are named for what code needs,
    so a caller asks the question it has, not which family it holds.
    """

    key: str  # what run records and exported metadata write ("indextts2", "indextts2.5")
    name: str  # what messages say
    version: float  # the official config.yaml's top-level `version:`
    tokenizer_kind: str  # SENTENCEPIECE or TIKTOKEN
    tokenizer_suffix: str
    tokenizer_name: str  # the tokenizer file a release folder holds
    tokenizer_name_fixed: bool  # inference opens tokenizer_name whatever the config's dataset.bpe_model says
    tokenizer_label: str  # what messages call the file a user should pass ...
    tokenizer_noun: str  # ... and the file they did pass
    specials_follow_ranks: bool  # the special tokens sit after the ranks: new tokens go in before them
    speaker_input: str  # the prompt's array: "condition" (32 latents) or "spk_emb" (CAMPPlus vector)
    language_rows: bool  # a lang_embedding row on every text position; text and lines carry a language
    weight_markers: tuple[str, ...]  # state-dict keys only this family's GPT has
    codec_file: str  # where a release folder keeps the codec whose codes the GPT reads (prepare.codecs.CODECS)
    inference_module: str  # the official inference code's module and its package
    inference_package: str
    hub_parts: bool  # official inference loads BigVGAN by hub id and turns emotion text into a vector with Qwen
    tiny_config: str  # the bundled tiny CPU config of this family
    inference_gpt_width: int | None  # the GPT width official inference's later stages take (None: any)
    demo_seconds: tuple[float, float]  # demo clip lengths that fit the tiny config's max_mel_tokens

    def __reduce__(self) -> tuple:  # copies and pickles (spawned workers) stay the one instance
        return family_named, (self.key,)

    def __repr__(self) -> str:
        return f"Family({self.name})"

    @property
    def speaker_vector(self) -> bool:
        """The prompt conditions the GPT through a CAMPPlus speaker vector, not conditioning latents."""
        return self.speaker_input == "spk_emb"

    @cached_property  # read for every manifest line: made once
    def manifest_forms(self) -> dict[bool, tuple[Mapping[str, str], frozenset[str]]]:
        """paired? -> (canonical name -> field of a line of that form, the set of fields such a line needs).

        Paired: the prompt gives the conditioning, the target text and codes; single: one utterance."""
        speaker = self.speaker_input
        paired = {"text_ids": "target_text_ids_path", "codes": "target_codes_path", speaker: f"prompt_{speaker}_path",
                  "emo_vec": "prompt_emo_vec_path", "text_len": "target_text_len", "code_len": "target_code_len"}
        single = {"text_ids": "text_ids_path", "codes": "codes_path", speaker: f"{speaker}_path",
                  "emo_vec": "emo_vec_path", "text_len": "text_len", "code_len": "code_len"}
        return {form: (MappingProxyType(fields), frozenset(fields.values()))
                for form, fields in ((True, paired), (False, single))}

    @property
    def line_markers(self) -> tuple[str, ...]:
        """Manifest fields only this family's lines have."""
        return tuple(fields[self.speaker_input] for fields, _ in self.manifest_forms.values())

    def holds(self, keys: Iterable[str]) -> bool:
        """Whether a state dict with these keys is a GPT of this family."""
        return not set(self.weight_markers).isdisjoint(keys)


INDEXTTS2 = Family(
    key="indextts2", name="IndexTTS2", version=2.0,
    tokenizer_kind=SENTENCEPIECE, tokenizer_suffix=".model", tokenizer_name="bpe.model", tokenizer_name_fixed=False,
    tokenizer_label="SentencePiece .model", tokenizer_noun="SentencePiece model", specials_follow_ranks=False,
    speaker_input="condition", language_rows=False, weight_markers=("speed_emb.weight", "perceiver_encoder.latents"),
    codec_file="hf_cache/semantic_codec/model.safetensors",
    inference_module="indextts.infer_v2", inference_package="indextts2-inference",
    hub_parts=True, inference_gpt_width=1280,
    tiny_config="configs/tiny.yaml", demo_seconds=(0.6, 1.1))  # tiny max_mel_tokens: 60 codes at 50 Hz
INDEXTTS25 = Family(
    key="indextts2.5", name="IndexTTS-2.5", version=2.5,
    tokenizer_kind=TIKTOKEN, tokenizer_suffix=".tiktoken", tokenizer_name="multilingual_zh_ja_yue_char_del.tiktoken",
    tokenizer_name_fixed=True, tokenizer_label=".tiktoken", tokenizer_noun=".tiktoken vocabulary",
    specials_follow_ranks=True, speaker_input="spk_emb", language_rows=True,
    weight_markers=("spk_emb_proj.weight", "lang_embedding.weight"),
    codec_file="codec.pth", inference_module="indextts25.api", inference_package="indextts25-inference",
    hub_parts=False, inference_gpt_width=None,
    tiny_config="configs/tiny_v25.yaml", demo_seconds=(0.8, 2.4))  # 90 codes at 25 Hz
FAMILIES = (INDEXTTS2, INDEXTTS25)
_VERSIONS = {"2": INDEXTTS2, "2.0": INDEXTTS2, "2.5": INDEXTTS25}


def family_named(key: str) -> Family:
    """The family a run record or job file names by its key."""
    for family in FAMILIES:
        if family.key == key:
            return family
    raise ValueError(f"unknown model family {key!r}")


def family_of_version(value: object, where: str) -> Family | None:
    """The family a top-level `version:` names (None when absent)."""
    if value is None:
        return None
    family = _VERSIONS.get(str(value).strip()) if not isinstance(value, bool) else None
    if family is None:
        raise UserError(f"{where}: version {value!r} is not a known model family; use 2.0 (IndexTTS2) or 2.5 "
                        "(IndexTTS-2.5)")
    return family


def family_of_tokenizer(path: str | Path) -> Family:
    """The family whose tokenizer a file is, by its suffix: `.tiktoken` ranks are 2.5's, anything else
    is read as IndexTTS2's SentencePiece model (which names a file that is neither)."""
    suffix = Path(path).suffix
    return next((family for family in FAMILIES if family.tokenizer_suffix == suffix), INDEXTTS2)


def grown_tokenizer_family(base: Path, output: Path) -> Family:
    """The family of a tokenizer grown from `base` into `output`: both files must be of its kind."""
    family = family_of_tokenizer(base)
    if Path(output).suffix != family.tokenizer_suffix:  # the suffix is how every reader tells the kind
        raise UserError(f"--output {output} must end in {family.tokenizer_suffix}, the kind of its base {base} "
                        f"(train-gpt and prepare tell a tokenizer's family by it); e.g. "
                        f"{Path(output).with_suffix(family.tokenizer_suffix)}")
    return family


def family_of_keys(keys: Iterable[str]) -> Family | None:
    """The family a GPT state dict's keys show (None: no marker key, e.g. a partial dict)."""
    keys = set(keys)
    found = [family for family in FAMILIES if family.holds(keys)]
    return found[0] if len(found) == 1 else None


def other_family(stated: Family | None, found: Family | None, source: Path | str) -> str | None:
    """Why a checkpoint whose keys show `found` does not fit a config that states another family (None: it fits)."""
    if found is None or stated in (None, found):
        return None  # no marker key: the layout check names what is missing or mixed
    return (f"{source}: the checkpoint is {found.name} (it has {found.weight_markers[0]}) but the config says "
            f"version {stated.version} ({stated.name}); pass the config.yaml that came with the checkpoint")


def settle_family(cfg: Any, found: Family | None, source: Path | str) -> str | None:
    """A checkpoint whose keys show `found` against the model config `cfg` (a GPTConfig): its family is
    settled from them when the config states none; returns the disagreement line (other_family), None
    when it fits."""
    problem = other_family(cfg.stated_family, found, source)
    if problem is None:
        cfg.stated_family = cfg.stated_family or found
    return problem
