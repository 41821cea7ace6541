"""The generation check of every validation (`--listen-lines N`): does the model speak, stop, and not loop?

At each validation the GPT being trained generates speech codes (model/generation.py: official
inference's beam sampling, no vocoder) for N fixed validation lines per language, and each language
gets three numbers, catching the usual failures from step 0, long before anyone listens:
  - `stopped`: the share of lines that ended with the stop code before gpt.max_mel_tokens
    (a model that babbles on never stops);
  - `length_ratio`: generated / target code count, the median of the lines, and
    `length_ratio_worst`, the line farthest from 1 either way (dropped words: too short; babble: long);
  - `repetition`: the mean over the lines of the share of a line's code 4-grams that already occurred
    earlier in the same line: 0 = no 4 codes in a row twice, near 1 = one short loop. Natural speech
    repeats a little (pauses); `target_repetition` is the same measure on the real codes, for scale.
The lines are a seeded choice per language from the validation manifests (the same on every resume),
and every draw comes from a private generator seeded from (seed, step): training's RNG streams, the
model's mode and its weights are as they were, so a run ends bit-identical with the check on or off.
"""

from __future__ import annotations

import contextlib
import math
import statistics
import zlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np
import torch

from indextts_train.config.metric_names import GEN_KEYS
from indextts_train.data.manifest import ManifestDataset, collate
from indextts_train.model.generation import GeneratedLine, generate_codes
from indextts_train.model.gpt import Batch, UnifiedVoiceGPT

NGRAM = 4  # about 0.2 s of speech at IndexTTS's semantic code rate: a repeat that long is audible
CHUNK_LINES = 16  # lines generated together: bounds the KV cache (x 3 beams)


def choose_lines(groups: dict[str, np.ndarray], count: int, seed: int) -> dict[str, np.ndarray]:
    """Up to `count` line indices per group, a seeded choice that depends only on (seed, group, its lines)."""
    chosen = {}
    for name, lines in groups.items():
        rng = np.random.default_rng([seed, zlib.crc32(name.encode())])
        picks = np.sort(rng.choice(len(lines), size=min(count, len(lines)), replace=False))
        chosen[name] = lines[picks]
    return chosen


def repetition(codes: Sequence[int], n: int = NGRAM) -> float:
    """Share of the n-grams of `codes` that already occurred earlier in it (0 when shorter than n)."""
    grams = [tuple(codes[i:i + n]) for i in range(len(codes) - n + 1)]
    seen: set[tuple[int, ...]] = set()
    repeats = 0
    for gram in grams:
        repeats += gram in seen
        seen.add(gram)
    return repeats / len(grams) if grams else 0.0


def worst_ratio(ratios: Sequence[float]) -> float:
    """The ratio farthest from 1 on a log scale (x0.5 and x2 are equally bad); 0 (no code) is the worst."""
    return max(ratios, key=lambda r: math.inf if r <= 0 else abs(math.log(r)))


def summarize(generated: Sequence[GeneratedLine], targets: Sequence[Sequence[int]]) -> dict:
    """The check's numbers for one language (GEN_KEYS), plus `lines` and `target_repetition`."""
    ratios = [len(line.codes) / max(len(target), 1) for line, target in zip(generated, targets, strict=True)]
    values = [sum(line.stopped for line in generated) / len(generated), statistics.median(ratios),
              worst_ratio(ratios), statistics.fmean(repetition(line.codes) for line in generated)]
    return {**dict(zip(GEN_KEYS, values, strict=True)), "lines": len(generated),
            "target_repetition": statistics.fmean(repetition(target) for target in targets)}


def generation_seed(seed: int, step: int) -> int:
    """The private generator's seed for the check at `step`: a function of (seed, step) alone."""
    return int(np.random.SeedSequence([seed, step]).generate_state(1, np.uint64)[0])


@dataclass
class GenerationCheck:
    """The chosen lines, loaded once, and what the check needs to run at any step."""

    names: list[str]  # the group of each line
    samples: list[dict]  # ManifestDataset items of the lines
    max_codes: int  # gpt.max_mel_tokens: the limit a line must stop before
    seed: int
    announced: bool = field(default=False)  # the cost line is printed once per process

    @classmethod
    def build(cls, dataset: ManifestDataset, groups: dict[str, np.ndarray], *, count: int, seed: int,
              max_codes: int) -> GenerationCheck | None:
        """None when --listen-lines is 0."""
        if count == 0:
            return None
        chosen = choose_lines(groups, count, seed)
        names = [name for name, lines in chosen.items() for _ in lines]
        samples = [dataset[int(i)] for lines in chosen.values() for i in lines]
        return cls(names, samples, max_codes, seed)

    def run(self, model: UnifiedVoiceGPT, step: int, device: torch.device,
            autocast: Callable | None = None) -> dict:
        """{"total": numbers, "groups": {name: numbers} (with 2+ groups)}; the model's mode is kept.

        No timing in it: it goes into the checkpoint's history, which a resumed run must reproduce exactly.
        """
        generator = torch.Generator(device=device).manual_seed(generation_seed(self.seed, step))
        was_training = model.training
        model.eval()
        try:
            generated = []
            for first in range(0, len(self.samples), CHUNK_LINES):
                batch: Batch = collate(self.samples[first:first + CHUNK_LINES]).to(device)
                with autocast() if autocast else contextlib.nullcontext():
                    generated += generate_codes(model, batch, max_codes=self.max_codes, generator=generator)
        finally:
            model.train(was_training)
        targets = [sample["codes"][:sample["code_len"]].tolist() for sample in self.samples]
        groups = {}
        for name in dict.fromkeys(self.names):
            picked = [i for i, line_name in enumerate(self.names) if line_name == name]
            groups[name] = summarize([generated[i] for i in picked], [targets[i] for i in picked])
        return {"total": summarize(generated, targets), "groups": groups if len(groups) > 1 else {}}

    def cost_line(self, seconds: float) -> str:
        languages = len(dict.fromkeys(self.names))
        return (f"generation check: {len(self.samples)} validation line(s) of {languages} language(s) took "
                f"{seconds:.1f}s at this validation (--listen-lines 0 turns it off)")


def describe_generation(result: dict) -> str:
    """The check's part of the validation line: ` | gen: stop 3/4 len x0.97 (worst x1.62) rep 0.03`."""
    parts = [("gen", result["total"])] + [(f"gen {name}", numbers) for name, numbers in result["groups"].items()]
    return "".join(f" | {label}: stop {round(n['stopped'] * n['lines'])}/{n['lines']} len x{n['length_ratio']:.2f} "
                   f"(worst x{n['length_ratio_worst']:.2f}) rep {n['repetition']:.2f}" for label, n in parts)


def generation_scalars(result: dict) -> dict[str, float]:
    """TensorBoard scalars (under `val/`): `gen/<key>`, and `<group>/gen/<key>` per language."""
    values = {f"gen/{key}": result["total"][key] for key in GEN_KEYS}
    for name, numbers in result["groups"].items():
        values.update({f"{name}/gen/{key}": numbers[key] for key in GEN_KEYS})
    return values
