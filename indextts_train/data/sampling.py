"""Which samples an epoch draws and in what order: a pure function of (seed, epoch).

Each `--train-manifest PATH[::lang][@weight]` is a *source*. How long an epoch is:

- every manifest without a weight is drawn once per epoch (all its lines);
- a manifest with `@w` makes up the share w of the epoch, so with unweighted manifests of N lines
  in all and weights summing to W (< 1), an epoch has N / (1 - W) samples, w * N / (1 - W) of them
  from that manifest (less than its size: it is *replayed* in part; more: drawn several times);
- when every manifest has a weight, the weights are relative shares and the epoch has as many
  samples as all manifests together;
- the epoch is then rounded *down* to whole optimizer steps and each source's count is cut in
  proportion (largest remainder). Nothing is lost by the cut: a source draws from its own stream of
  *passes* (a pass is a seeded permutation of the manifest), each epoch continuing where the
  previous one stopped, so every line is drawn once per pass, whatever its weight.

Order rules (the checkpoint records which one a run uses, so a run resumes with its own order):

- rule 1 (before the sampler had rules): one seeded permutation of all samples, each window of
  `sort_window` sorted short to long, the tail short of a whole step dropped. That tail was always
  the longest samples of the last window, and the windows made every epoch a length curriculum.
- rule 2 (current): the epoch's samples (drawn as above) are shuffled, sorted by length within
  windows, cut into buckets of one optimizer step (`step_samples`), and the buckets are shuffled;
  so a step holds similar lengths (little padding) and steps of all lengths come in random order.

Batch size, world size and worker count play no part in either rule: a micro-step consumes
`micro_batch * world_size` consecutive samples of the epoch order, so a resume with another
micro-batch or world size continues from the same sample.
"""

from __future__ import annotations

import functools
import math
import os
import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from indextts_train.errors import UserError

LEGACY_RULE = 1  # what a checkpoint without a recorded rule used
ORDER_RULE = 2  # what new runs use
_PASS, _MIX, _BUCKETS = 1, 2, 3  # separate random streams of rule 2
_LANG = re.compile(r"[A-Za-z][A-Za-z0-9_-]{0,31}")
_NUMBER = re.compile(r"[0-9.eE+-]+")


# ---------------------------------------------------------------------------------------------
# PATH[::lang][@weight]


@dataclass(frozen=True)
class ManifestSpec:
    """One `--train-manifest`/`--val-manifest` value: the file, an optional language and weight."""

    path: Path
    lang: str | None = None
    weight: float | None = None

    def __str__(self) -> str:
        lang = f"::{self.lang}" if self.lang else ""
        weight = f"@{self.weight:g}" if self.weight is not None else ""
        return f"{self.path}{lang}{weight}"


def _parse_weight(text: str, value: str, flag: str) -> float:
    try:
        weight = float(text)
    except ValueError:
        weight = math.nan
    if not _NUMBER.fullmatch(text) or not math.isfinite(weight) or weight <= 0:
        raise UserError(f"{flag} {value}: weight {text!r} must be a number > 0 (e.g. @0.15 for 15% of an "
                        "epoch); write PATH::lang@weight")
    return weight


def parse_manifest_spec(value: str, flag: str = "--train-manifest") -> ManifestSpec:
    """`PATH`, `PATH::lang`, `PATH@weight` or `PATH::lang@weight`, checked.

    An existing file whose name happens to hold '@' or '::' is taken whole. After the last '@' a
    text with a '/' belongs to the path (`/data/user@host/am.jsonl`); anything else must be a weight.
    """
    if os.path.isfile(value):
        return ManifestSpec(Path(value))
    rest, weight = value, None
    head, at, tail = value.rpartition("@")
    if at and "/" not in tail and os.sep not in tail:
        if "::" in tail:
            raise UserError(f"{flag} {value}: the language goes before the weight; write PATH::lang@weight")
        rest, weight = head, _parse_weight(tail, value, flag)
    path, sep, lang = rest.rpartition("::")
    if not sep:
        path, lang = rest, None
    elif not _LANG.fullmatch(lang):
        raise UserError(f"{flag} {value}: language {lang!r} must be a short name of letters, digits, '_' or '-' "
                        "starting with a letter (e.g. ::am, ::zh_en)")
    if not path:
        raise UserError(f"{flag} {value}: no manifest path before the suffix")
    return ManifestSpec(Path(path).expanduser(), lang, weight)


def parse_manifest_specs(values: Sequence[str], flag: str, *, weights: bool, labels: bool = True) -> list[ManifestSpec]:
    """Parse every value of a repeated flag; weights must leave a share for unweighted manifests. `labels` False:
    a `::lang` label would change nothing (evaluate's one loss over all manifests), so it is refused."""
    specs = [parse_manifest_spec(value, flag) for value in values]
    labelled = next((spec for spec in specs if spec.lang is not None), None)
    if labelled is not None and not labels:
        raise UserError(f"{flag} {labelled}: a language label has no meaning here (one loss over all manifests); "
                        f"drop the ::{labelled.lang}")
    weighted = [spec for spec in specs if spec.weight is not None]
    if weighted and not weights:
        raise UserError(f"{flag} {weighted[0]}: a weight has no meaning here; drop the @{weighted[0].weight:g}")
    total = sum(spec.weight for spec in weighted)
    if weighted and len(weighted) < len(specs) and total >= 1:
        raise UserError(f"{flag}: the weights add up to {total:g}, leaving no share of the epoch for the "
                        f"manifest(s) without a weight; weights are shares of an epoch (e.g. @0.15), so keep "
                        "their sum below 1, or give every manifest a weight")
    return specs


# ---------------------------------------------------------------------------------------------
# The sampler's settings, recorded in the checkpoint


@dataclass(frozen=True)
class Source:
    """One training manifest as the sampler sees it."""

    name: str  # the manifest as given, for messages and the record
    lines: int  # its usable lines; they are consecutive in the index, sources in order
    weight: float | None = None
    lang: str | None = None


@dataclass(frozen=True)
class SamplerSpec:
    """Everything the data order depends on besides the epoch. Fixed when a run starts.

    `step_samples` is the effective batch when the run started: rule 2 cuts the epoch into buckets
    of it, and both rules round the epoch down to whole steps of it.
    """

    rule: int
    seed: int
    sort_window: int
    step_samples: int
    sources: tuple[Source, ...]

    def __post_init__(self) -> None:
        if self.rule not in (LEGACY_RULE, ORDER_RULE):
            raise UserError(f"the checkpoint's data order rule {self.rule} is unknown to this indextts-train "
                            "(a newer file needs a newer indextts-train)")
        if self.sort_window < 1 or self.step_samples < 1 or not self.sources:
            raise ValueError(f"bad sampler settings: {self}")

    @property
    def total_lines(self) -> int:
        return sum(source.lines for source in self.sources)

    def state_dict(self) -> dict:
        """Plain values (weights_only-safe) for the checkpoint."""
        return {"rule": self.rule, "seed": self.seed, "sort_window": self.sort_window,
                "step_samples": self.step_samples,
                "sources": [{"name": s.name, "lines": s.lines, "weight": s.weight, "lang": s.lang}
                            for s in self.sources]}

    @classmethod
    def from_state_dict(cls, state: dict) -> SamplerSpec:
        sources = tuple(Source(s["name"], int(s["lines"]), s["weight"], s["lang"]) for s in state["sources"])
        return cls(int(state["rule"]), int(state["seed"]), int(state["sort_window"]), int(state["step_samples"]),
                   sources)


def sampler_spec(manifests: Sequence[ManifestSpec], lines: Sequence[int], *, seed: int, sort_window: int,
                 step_samples: int) -> SamplerSpec:
    """The rule-2 settings of a new run: one source per manifest, `lines` its usable line count."""
    empty = [str(m.path) for m, n in zip(manifests, lines, strict=True) if n == 0]
    if empty:
        raise UserError(f"{empty[0]}: no usable line left in this manifest; fix its lines or drop it")
    sources = tuple(Source(str(m.path), int(n), m.weight, m.lang) for m, n in zip(manifests, lines, strict=True))
    return SamplerSpec(ORDER_RULE, seed, sort_window, step_samples, sources)


def legacy_spec(seed: int, sort_window: int, step_samples: int, lines: int) -> SamplerSpec:
    """Rule 1 for a checkpoint written before order rules existed: one pool, the current effective batch
    (as the code of that time computed the epoch), the seed it recorded, the configured window."""
    return SamplerSpec(LEGACY_RULE, seed, sort_window, step_samples, (Source("all manifests", lines),))


def sampler_problem(record: object) -> str | None:
    """Why a checkpoint's `sampler` record is unusable, or None."""
    try:
        SamplerSpec.from_state_dict(record)
    except UserError as exc:
        return f"sampler: {exc}"
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        return f"sampler: malformed record ({type(exc).__name__}: {exc})"
    return None


def mix_change(saved: SamplerSpec, current: SamplerSpec) -> str | None:
    """What differs between the run's recorded sources and the flags of this invocation, or None."""
    def mix(spec: SamplerSpec) -> list[tuple]:
        return [(s.lang, s.weight) for s in spec.sources]
    names = [(a.name, b.name) for a, b in zip(saved.sources, current.sources, strict=False)]
    if saved.rule == LEGACY_RULE or (mix(saved) == mix(current) and all(_same_manifest(*pair) for pair in names)):
        return None
    shown = ", ".join(str(ManifestSpec(Path(s.name), s.lang, s.weight)) for s in saved.sources)
    return (f"the training manifests or their weights differ from the run's ({shown}); the data order keeps "
            "the run's mix so that no sample is skipped or repeated; to change the mix, start a new "
            "--output-dir with --base-checkpoint pointing at a checkpoint of this run")


def _same_manifest(saved: str, current: str) -> bool:
    """The same name, or two spellings of one file (`data/t.jsonl` and `/abs/data/t.jsonl`, as --from-run
    gives it back): not a change of the mix."""
    if saved == current:
        return True
    try:
        return os.path.samefile(saved, current)
    except OSError:  # the saved name does not lead to a file from here: say the difference
        return False


def _apportion(total: int, shares: np.ndarray) -> np.ndarray:
    """`total` split in proportion to `shares` in whole numbers (largest remainder, ties to the first)."""
    quotas = total * shares / shares.sum()
    counts = np.floor(quotas).astype(np.int64)
    leftover = total - int(counts.sum())
    by_remainder = np.lexsort((np.arange(len(shares)), -(quotas - counts)))
    counts[by_remainder[:leftover]] += 1
    return counts


def raw_shares(sources: Sequence[Source]) -> np.ndarray:
    """Samples per epoch of each source before rounding to whole steps (see the module docstring)."""
    lines = np.array([s.lines for s in sources], dtype=np.float64)
    weights = np.array([s.weight if s.weight is not None else np.nan for s in sources])
    weighted = ~np.isnan(weights)
    if weighted.all():
        return lines.sum() * weights / weights.sum()
    epoch = lines[~weighted].sum() / (1.0 - weights[weighted].sum())
    return np.where(weighted, np.nan_to_num(weights) * epoch, lines)


def epoch_counts(spec: SamplerSpec) -> np.ndarray:
    """Samples each source gives to every epoch (int64, one per source); their sum is whole steps."""
    if spec.rule == LEGACY_RULE:  # rule 1 knows one pool, cut to whole steps
        return np.array([spec.total_lines // spec.step_samples * spec.step_samples])
    raw = raw_shares(spec.sources)
    epoch = int(math.floor(raw.sum() + 1e-9)) // spec.step_samples * spec.step_samples
    return _apportion(epoch, raw) if epoch else np.zeros(len(raw), dtype=np.int64)


@functools.lru_cache(maxsize=16)  # the loop asks several times a step; a spec is frozen, its length fixed
def epoch_length(spec: SamplerSpec) -> int:
    """Samples in one epoch: a whole number of steps of `spec.step_samples` (0: fewer than one step)."""
    return int(epoch_counts(spec).sum())


def describe_epoch(spec: SamplerSpec) -> str:
    """One line per source: its samples per epoch, share and how much of the manifest that is."""
    counts = epoch_counts(spec)
    total = max(int(counts.sum()), 1)
    if spec.rule == LEGACY_RULE or len(spec.sources) == 1:
        return f"epoch: {int(counts.sum())} of {spec.total_lines} samples (order rule {spec.rule})"
    lines = [f"epoch: {int(counts.sum())} samples (order rule {spec.rule}), drawn from"]
    for source, count in zip(spec.sources, counts, strict=True):
        lang = f" [{source.lang}]" if source.lang else ""
        weight = f"@{source.weight:g}" if source.weight is not None else "all lines"
        lines.append(f"  {source.name}{lang} ({weight}): {int(count)} ({100 * count / total:.1f}%), "
                     f"{count / source.lines:.2f} of its {source.lines} lines per epoch")
    return "\n".join(lines)


# ---------------------------------------------------------------------------------------------
# Order


def legacy_epoch_order(lengths: np.ndarray, seed: int, epoch: int, sort_window: int) -> np.ndarray:
    """Rule 1: a seeded permutation, then each run of `sort_window` positions sorted (stably) by length."""
    lengths = np.asarray(lengths)
    order = np.random.default_rng([seed, epoch]).permutation(len(lengths))
    window = np.arange(len(order)) // sort_window
    # lexsort is stable; the last key is the primary one: window first, then length.
    return order[np.lexsort((lengths[order], window))]


def _draw(seed: int, source: int, lines: int, start: int, count: int) -> np.ndarray:
    """Positions [start, start + count) of a source's endless stream of passes (permutations of its lines)."""
    parts = []
    position, end = start, start + count
    while position < end:
        number, offset = divmod(position, lines)
        permutation = np.random.default_rng([seed, ORDER_RULE, _PASS, source, number]).permutation(lines)
        take = min(lines - offset, end - position)
        parts.append(permutation[offset:offset + take])
        position += take
    return np.concatenate(parts) if parts else np.zeros(0, dtype=np.int64)


def _bucketed(samples: np.ndarray, lengths: np.ndarray, spec: SamplerSpec, epoch: int) -> np.ndarray:
    """Shuffle, sort by length within windows of whole steps, cut into steps, shuffle the steps."""
    step = spec.step_samples
    shuffled = samples[np.random.default_rng([spec.seed, ORDER_RULE, _MIX, epoch]).permutation(len(samples))]
    window = np.arange(len(shuffled)) // (max(1, spec.sort_window // step) * step)
    by_length = shuffled[np.lexsort((lengths[shuffled], window))]  # (L,), L a multiple of `step`
    buckets = by_length.reshape(-1, step)  # (L / step, step): one optimizer step each
    permutation = np.random.default_rng([spec.seed, ORDER_RULE, _BUCKETS, epoch]).permutation(len(buckets))
    return buckets[permutation].reshape(-1)


def epoch_order(spec: SamplerSpec, lengths: np.ndarray, epoch: int) -> np.ndarray:
    """Indices of the samples of `epoch`, in training order: (epoch_length(spec),) int64.

    `lengths` is the length key of every usable line (text_len + code_len), sources concatenated.
    """
    lengths = np.asarray(lengths)
    if len(lengths) != spec.total_lines:
        raise UserError(f"the training manifests have {len(lengths)} usable lines but the run's data order was "
                        f"made for {spec.total_lines}; resume with the same manifests or start a new --output-dir")
    counts = epoch_counts(spec)
    if spec.rule == LEGACY_RULE:
        return legacy_epoch_order(lengths, spec.seed, epoch, spec.sort_window)[: int(counts[0])]
    starts = np.cumsum([0] + [s.lines for s in spec.sources])
    drawn = [starts[i] + _draw(spec.seed, i, s.lines, epoch * int(counts[i]), int(counts[i]))
             for i, s in enumerate(spec.sources)]
    return _bucketed(np.concatenate(drawn).astype(np.int64), lengths, spec, epoch)


class ResumableBatchSampler:
    """Micro-batches of dataset indices from an epoch order, starting anywhere in it (a DataLoader's
    `batch_sampler`, which may be any iterable of index lists with a length: no torch base class, so that
    the CLI, which reads the manifest specs here, starts without importing torch).

    Each micro-step consumes `micro_batch * world_size` consecutive samples of `order`; rank r
    takes the r-th slice of `micro_batch`. `start_sample` is a position in that order, so resuming
    is a slice (nothing is replayed) and works with any new micro_batch/world_size.
    drop_last=True drops an incomplete final group, so every rank runs the same number of steps.
    drop_last=False keeps it: its samples go to ranks in order, so some ranks may get a short
    batch or none (meant for single-process evaluation).
    """

    def __init__(self, order: np.ndarray, *, micro_batch: int, start_sample: int = 0, world_size: int = 1,
                 rank: int = 0, drop_last: bool = True) -> None:
        if micro_batch < 1 or world_size < 1 or not 0 <= rank < world_size or start_sample < 0:
            raise ValueError(f"bad sampler arguments: micro_batch={micro_batch} world_size={world_size} "
                             f"rank={rank} start_sample={start_sample}")
        self.micro_batch = micro_batch
        self.world_size = world_size
        self.rank = rank
        self.remaining = np.asarray(order)[start_sample:]
        group = micro_batch * world_size
        steps, leftover = divmod(len(self.remaining), group)
        self.steps = steps + int(not drop_last and leftover > rank * micro_batch)

    def __len__(self) -> int:
        return self.steps

    def __iter__(self) -> Iterator[list[int]]:
        group = self.micro_batch * self.world_size
        for step in range(self.steps):
            start = step * group + self.rank * self.micro_batch
            yield self.remaining[start:start + self.micro_batch].tolist()
