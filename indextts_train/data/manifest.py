"""Manifests → index → dataset → resumable sampler → collate.

Lines are read and checked one by one in lines.py (their forms, the two families' fields) and their
arrays in arrays.py; here they are indexed, loaded and batched.

The index keeps only numpy arrays (byte offset, file number, line number, lengths, language), so a
million-line manifest costs a few tens of MB; a line is re-read with a seek when it is needed.

Which samples an epoch draws, and in what order, is sampling.py's: a pure function of (seed, epoch).
"""

from __future__ import annotations

import os
from array import array
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset, Sampler

from indextts_train.config.family import Family
from indextts_train.config.metric_names import group_name
from indextts_train.config.settings import GPTConfig
from indextts_train.data.arrays import TEXT_VOCAB_SOURCE, check_arrays, check_ids, check_text_ids
from indextts_train.data.lines import (
    lang_id_of,
    line_form,
    line_language,
    parse_line,
    read_arrays,
    resolve_paths,
)
from indextts_train.data.sampling import ManifestSpec
from indextts_train.data.workers import StopSafeLoader, ignore_stop_signals_in_worker
from indextts_train.errors import UserError
from indextts_train.files.bounded import MAX_LINE_BYTES, iter_lines, open_regular
from indextts_train.model.gpt import Batch

SKIPPED_EXAMPLES = 5
REPORT_ERRORS = 20


# ---------------------------------------------------------------------------------------------
# Index


@dataclass
class _Columns:
    """The index's columns while the manifests are read, one entry per usable line."""

    offsets: array = field(default_factory=lambda: array("q"))
    file_ids: array = field(default_factory=lambda: array("i"))
    line_numbers: array = field(default_factory=lambda: array("i"))
    text_lengths: array = field(default_factory=lambda: array("i"))
    code_lengths: array = field(default_factory=lambda: array("i"))
    lang_ids: array = field(default_factory=lambda: array("h"))
    languages: array = field(default_factory=lambda: array("i"))
    language_names: dict[str, int] = field(default_factory=dict)  # name -> its number, in first-seen order
    code_files: array = field(default_factory=lambda: array("q"))

    def add(self, offset: int, file_id: int, line_no: int, text_len: int, code_len: int, lang_id: int,
            language: str | None, code_file: int) -> None:
        self.code_files.append(code_file)
        self.offsets.append(offset)
        self.file_ids.append(file_id)
        self.line_numbers.append(line_no)
        self.text_lengths.append(text_len)
        self.code_lengths.append(code_len)
        self.lang_ids.append(lang_id)
        self.languages.append(-1 if language is None else self.language_names.setdefault(language,
                                                                                         len(self.language_names)))

    def arrays(self) -> dict:
        """The ManifestIndex fields these columns fill."""
        return {"offsets": np.array(self.offsets, dtype=np.int64), "file_ids": np.array(self.file_ids, dtype=np.int32),
                "line_numbers": np.array(self.line_numbers, dtype=np.int32),
                "text_lengths": np.array(self.text_lengths, dtype=np.int32),
                "code_lengths": np.array(self.code_lengths, dtype=np.int32),
                "lang_ids": np.array(self.lang_ids, dtype=np.int16),
                "languages": np.array(self.languages, dtype=np.int32), "language_names": list(self.language_names),
                "code_files": np.array(self.code_files, dtype=np.int64)}


@dataclass
class ManifestIndex:
    """Index of one or more manifests without keeping JSON objects in memory.

    Parallel numpy arrays, one entry per usable line: byte offset, file number, line number,
    text_len and code_len, the lang_embedding row (IndexTTS-2.5 lines; -1 for IndexTTS2 lines) and
    the language field (validation groups are made from it without reading the lines again).
    `record(i)` seeks back to the line when the dataset needs it.
    """

    files: list[str]  # as the user gave them, for messages
    offsets: np.ndarray  # int64 byte offset of each line
    file_ids: np.ndarray  # int32 index into `files`
    line_numbers: np.ndarray  # int32, from 1
    text_lengths: np.ndarray  # int32, manifest text_len
    code_lengths: np.ndarray  # int32, manifest code_len
    max_text_tokens: int | None = None
    max_mel_tokens: int | None = None
    skipped: int = 0
    skipped_examples: list[str] = field(default_factory=list)
    family: Family | None = None  # the model's; None accepts lines of either family
    lang_ids: np.ndarray | None = None  # int16 per line
    languages: np.ndarray | None = None  # int32 per line: its language field in `language_names`; -1: none
    language_names: list[str] = field(default_factory=list)
    # int64 per line: a key of its codes file's absolute path (hash: within one process), so that lines two
    # indexes share are found without keeping the paths (`lines_also_in`)
    code_files: np.ndarray | None = None

    @classmethod
    def build(
        cls,
        paths: Sequence[str | Path],
        *,
        skip_bad: bool = False,
        max_text_tokens: int | None = None,
        max_mel_tokens: int | None = None,
        family: Family | None = None,
        borrowed: dict[str, int] | None = None,
    ) -> ManifestIndex:
        """Validate every line and index the usable ones.

        A bad line raises UserError "FILE:LINE: ...", or with `skip_bad` is counted in `.skipped`.
        Each line is also keyed by its codes file (`lines_also_in`): 9% of the time, 8 bytes a line.
        `family` refuses lines of the other family; `borrowed` maps untagged language codes to the
        row they borrow (`text.languages.parse_borrowed`).
        """
        files = [str(p) for p in paths]
        if not files:
            raise UserError("no manifest given; pass at least one .jsonl manifest")
        columns = _Columns()
        skipped: list[str] = []
        skipped_count = 0
        for file_id, path in enumerate(files):
            seen_lines = 0
            manifest_dir = os.path.dirname(os.path.abspath(path))
            for line_no, offset, raw in iter_lines(path, "manifest"):
                seen_lines += 1
                try:
                    obj, fields, text_len, code_len = parse_line(
                        raw, f"{path}:{line_no}", max_text_tokens, max_mel_tokens, family
                    )
                    lang_id = (lang_id_of(obj, f"{path}:{line_no}", borrowed or {})
                               if "spk_emb" in fields else -1)
                except UserError as exc:
                    if not skip_bad:
                        raise
                    skipped_count += 1
                    if len(skipped) < SKIPPED_EXAMPLES:
                        skipped.append(str(exc))
                    continue
                codes = obj[fields["codes"]]  # the utterance the line trains on, keyed by its resolved path
                code_file = hash(os.path.normpath(os.path.join(manifest_dir, codes)))
                columns.add(offset, file_id, line_no, text_len, code_len, lang_id, line_language(obj), code_file)
            if not seen_lines:
                raise UserError(f"{path}: manifest is empty; pass a manifest with at least one line")
        if not columns.offsets:
            first = f"; first: {skipped[0]}" if skipped else ""
            raise UserError(f"{', '.join(files)}: no usable line ({skipped_count} bad{first})")
        return cls(files=files, max_text_tokens=max_text_tokens, max_mel_tokens=max_mel_tokens,
                   skipped=skipped_count, skipped_examples=skipped, family=family, **columns.arrays())

    def __len__(self) -> int:
        return len(self.offsets)

    def lines_also_in(self, other: ManifestIndex) -> np.ndarray:
        """This index's lines whose codes file (the utterance a line trains on) is a line's of `other` too."""
        if self.code_files is None or other.code_files is None:
            return np.zeros(0, dtype=np.int64)
        return np.flatnonzero(np.isin(self.code_files, other.code_files))

    def group_lines(self, manifests: Sequence[ManifestSpec]) -> dict[str, np.ndarray]:
        """Line indices (manifest order) per validation group, groups in first-seen order: the `::lang` of
        the line's manifest, else its language field, else the manifest's file name without `.jsonl`."""
        if len(manifests) != len(self.files):
            raise ValueError("one ManifestSpec per indexed file is needed")
        groups: dict[str, list[int]] = {}
        for i in range(len(self)):
            spec, language = manifests[int(self.file_ids[i])], int(self.languages[i])
            name = (spec.lang or (self.language_names[language] if language >= 0 else None)
                    or Path(spec.path).name.removesuffix(".jsonl"))
            groups.setdefault(group_name(name), []).append(i)
        return {name: np.array(lines, dtype=np.int64) for name, lines in groups.items()}

    @property
    def total_lengths(self) -> np.ndarray:
        """text_len + code_len per line (int64): the key `epoch_order` sorts windows by."""
        return self.text_lengths.astype(np.int64) + self.code_lengths

    def source(self, i: int) -> str:
        """'file:line' of entry i, for messages."""
        return f"{self.files[self.file_ids[i]]}:{self.line_numbers[i]}"

    def record(self, i: int) -> dict:
        """Line i parsed again, with `*_path` values made absolute and `_source` = 'file:line'."""
        path = self.files[self.file_ids[i]]
        try:  # the file indexed at the start, read again: it may have been replaced since (by a FIFO, say)
            with open_regular(path, "manifest") as handle:
                handle.seek(int(self.offsets[i]))
                raw = handle.readline(MAX_LINE_BYTES + 1)  # a line is never held past its bound
        except (OSError, UserError) as exc:
            reason = str(exc).removeprefix(f"{path}: ")
            raise UserError(f"{path}: manifest cannot be read any more ({reason}); was it moved?") from None
        where = self.source(i)
        if len(raw) > MAX_LINE_BYTES:
            raise UserError(f"{where}: a line longer than {MAX_LINE_BYTES >> 20} MiB, which no manifest line is; was "
                            "the manifest changed while the run read it?")
        obj, _, _, _ = parse_line(raw, where, self.max_text_tokens, self.max_mel_tokens, self.family)
        out = resolve_paths(obj, os.path.dirname(os.path.abspath(path)))
        out["_source"] = where
        return out


def refuse_given_twice(paths: Sequence[str | Path], flag: str | None = None) -> None:
    """One line when a manifest is given twice (by another name, a link or a hard link): its lines would count,
    and check-data --write-clean write them, twice. check-data and evaluate ask it of their paths."""
    for i, path in enumerate(paths):
        twin = next((other for other in paths[:i] if _same_file(other, path)), None)
        if twin is not None:
            named = f"{flag} {path}" if flag else f"{path}"
            raise UserError(f"{named}: the same file as {twin}, given before it; pass each manifest once")


def _same_file(a: str | Path, b: str | Path) -> bool:
    try:
        return str(a) == str(b) or os.path.samefile(a, b)
    except OSError:  # one of them is no file: the reader says so
        return False


# ---------------------------------------------------------------------------------------------
# Dataset, collate


class ManifestDataset(Dataset):
    """One example per indexed line, as int64/float32 tensors.

    `model_dim`, when given, also checks that condition/emo_vec were made for this model;
    `text_vocab` / `mel_codes`, that every id fits the embedding it indexes (naming the line).
    """

    def __init__(self, index: ManifestIndex, *, model_dim: int | None = None, text_vocab: int | None = None,
                 mel_codes: int | None = None, text_source: tuple[str, str] = TEXT_VOCAB_SOURCE,
                 mel_specials: tuple[int, ...] = ()) -> None:
        self.index = index
        self.model_dim = model_dim
        self.text_vocab = text_vocab
        self.mel_codes = mel_codes
        self.text_source = text_source  # what text_vocab is and what to do past it, for the error line
        self.mel_specials = mel_specials

    @classmethod
    def for_model(cls, index: ManifestIndex, gpt: GPTConfig) -> ManifestDataset:
        """The samples of an index as the model of `gpt` reads them."""
        return cls(index, model_dim=gpt.model_dim, text_vocab=gpt.number_text_tokens, mel_codes=gpt.number_mel_codes,
                   mel_specials=(gpt.start_mel_token, gpt.stop_mel_token))

    def __len__(self) -> int:
        return len(self.index)

    def __getitem__(self, i: int) -> dict[str, Any]:
        record = self.index.record(i)
        fields = line_form(record, record["_source"], self.index.family)
        text_len = int(self.index.text_lengths[i])
        code_len = int(self.index.code_lengths[i])
        paths, arrays = read_arrays(record, fields)
        check_arrays(arrays, paths, fields, text_len, code_len, max_text=self.index.max_text_tokens,
                     max_mel=self.index.max_mel_tokens, model_dim=self.model_dim, where=record["_source"])
        check_ids(arrays["text_ids"][:text_len], arrays["codes"][:code_len], self.text_vocab, self.mel_codes,
                  fields, record["_source"], self.text_source, self.mel_specials)
        if "spk_emb" in arrays:  # 2.5 text: no start/stop id inside, the language tag first (as check-data)
            check_text_ids(arrays["text_ids"][:text_len], int(self.index.lang_ids[i]), self.text_vocab,
                           record[fields["text_ids"]], record["_source"])
        features = ({"spk_emb": torch.from_numpy(arrays["spk_emb"].astype(np.float32)),  # (192,)
                     "lang_id": int(self.index.lang_ids[i])} if "spk_emb" in arrays
                    else {"condition": torch.from_numpy(arrays["condition"].astype(np.float32))})  # (32, D)
        return {
            "text_ids": torch.from_numpy(arrays["text_ids"].astype(np.int64)),  # (T_b,)
            "codes": torch.from_numpy(arrays["codes"].astype(np.int64)),  # (M_b,)
            "emo_vec": torch.from_numpy(arrays["emo_vec"].astype(np.float32)),  # (D,)
            "text_len": text_len,
            "code_len": code_len,
            "index": i,
            **features,
        }


def collate(samples: list[dict]) -> Batch:
    """Reference rule 1: pad ids with 0 to the longest *array*, stack features, keep the order.

    Lengths are the manifest fields; the model's padding rule (stop tokens) uses them.
    """
    def pad(key: str) -> torch.Tensor:
        return torch.nn.utils.rnn.pad_sequence([s[key] for s in samples], batch_first=True, padding_value=0)

    v25 = "spk_emb" in samples[0]
    return Batch(
        text_ids=pad("text_ids"),  # (B, T)
        codes=pad("codes"),  # (B, M)
        text_lengths=torch.tensor([s["text_len"] for s in samples], dtype=torch.int64),  # (B,)
        code_lengths=torch.tensor([s["code_len"] for s in samples], dtype=torch.int64),  # (B,)
        condition=None if v25 else torch.stack([s["condition"] for s in samples]),  # (B, 32, D)
        emo_vec=torch.stack([s["emo_vec"] for s in samples]),  # (B, D)
        spk_emb=torch.stack([s["spk_emb"] for s in samples]) if v25 else None,  # (B, 192)
        lang_ids=torch.tensor([s["lang_id"] for s in samples], dtype=torch.int64) if v25 else None,  # (B,)
    )


# ---------------------------------------------------------------------------------------------
# Loading (the order of training samples is sampling.py's)


def make_loader(dataset: Dataset, sampler: Sampler[list[int]] | Sequence[list[int]], num_workers: int,
                pin_memory: bool = False, collate_fn: Callable[[list], Any] | None = None) -> DataLoader:
    """A DataLoader whose batches depend only on the sampler (never on `num_workers`).

    The dataset draws no random numbers, and DataLoader returns batches in sampler order. It gets a
    private generator: DataLoader draws a base seed each time an iterator starts, and drawing it from
    the global RNG would shift the training dropout stream depending on where a run was resumed.
    """
    return StopSafeLoader(dataset, batch_sampler=sampler, num_workers=num_workers, collate_fn=collate_fn or collate,
                           pin_memory=pin_memory, persistent_workers=False, generator=torch.Generator(),
                           worker_init_fn=ignore_stop_signals_in_worker if num_workers else None)


def sequential_batches(indices: Sequence[int], size: int) -> list[list[int]]:
    """`indices` in order, `size` at a time (evaluation keeps manifest order; the last batch may be short)."""
    return [list(indices[i:i + size]) for i in range(0, len(indices), size)]
