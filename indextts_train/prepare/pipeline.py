"""`indextts-train prepare`: corpus -> per-utterance arrays -> manifests, resumable, on any number of processes.

The work is cut into batches that depend only on the corpus and `--batch-seconds`: utterances sorted
by duration (longest first, corpus order for ties), packed while `clips x longest` stays within the
budget. Batch k belongs to rank k % world_size, so any number of processes computes exactly the
same batches, and a rerun recomputes a whole batch when any member lacks its record (so a member's
arrays never depend on which other members finished before a kill). Rank 0 writes the manifests
after every rank is done, from the records, in corpus order: the same bytes whatever was killed.
"""

from __future__ import annotations

import errno
import importlib.metadata
import math
import os
import platform
import signal
import sys
import threading
from collections import Counter
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
import torch

from indextts_train.data.corpus_forms import PREPARE_RECORD
from indextts_train.distributed import (
    DistInfo,
    barrier,
    broadcast_from_main,
    said_by_main,
    setup_distributed,
    teardown_distributed,
)
from indextts_train.errors import NotOwnFile, UserError, refusal
from indextts_train.files.faults import crash_point
from indextts_train.prepare.clip_source import audio_header
from indextts_train.prepare.corpus import Defaults, Utterance, read_corpora
from indextts_train.prepare.featurize import (
    Clip,
    CodeLimit,
    Featurizer,
    TextIds,
    expected_codes,
    load_clip,
    too_long_reason,
)
from indextts_train.prepare.models import ModelFiles, Overrides, locate_models, model_hashes
from indextts_train.prepare.outputs import OutputFolder, file_stem
from indextts_train.prepare.pairs import Pairs, SplitRule, check_val_speakers, make_pairs, paired_line
from indextts_train.prepare.progress import PrepareProgress, print_summary, top_rejections
from indextts_train.prepare.utterance import MAX_SECONDS

INTERRUPTED = 130  # the exit code of a Ctrl+C, as the shell reports one
PREFETCH_BATCHES = 2  # audio of the next batches loads in threads while the models run
LIBRARIES = ("torch", "numpy", "transformers", "soundfile", "soxr", "sentencepiece", "tiktoken",
             "lhotse", "datasets")  # the last two read some corpus forms (prepare.json says which were installed)


@dataclass
class PrepareOptions:
    corpora: list[Path]
    model_dir: Path
    out: Path
    overrides: Overrides = field(default_factory=Overrides)
    defaults: Defaults = field(default_factory=Defaults)
    split: SplitRule = field(default_factory=SplitRule)
    device: str | None = None
    batch_seconds: float = 120.0
    prompt_seconds: float = 15.0
    min_seconds: float = 0.5
    max_seconds: float | None = None
    allow_unk: bool = False
    restart: bool = False
    download: bool = False
    workers: int = 2

    def __post_init__(self) -> None:
        # A NaN passes every comparison below unnoticed and, once written into prepare's settings, makes
        # each rerun refuse them (NaN != NaN); an inf overflows the first sample count made from it.
        for flag, value in (("--batch-seconds", self.batch_seconds), ("--prompt-seconds", self.prompt_seconds),
                            ("--min-seconds", self.min_seconds), ("--max-seconds", self.max_seconds)):
            if value is not None and not (math.isfinite(value) and value <= MAX_SECONDS):
                raise UserError(f"{flag} {value}: must be a number of seconds up to {MAX_SECONDS:g}")
        if not self.batch_seconds > 0:
            raise UserError(f"--batch-seconds {self.batch_seconds}: must be > 0")
        if not self.prompt_seconds >= 0.1:  # as --help says: 0.1 itself is a prompt (1,600 samples at 16 kHz)
            raise UserError(f"--prompt-seconds {self.prompt_seconds}: must be >= 0.1")
        if self.min_seconds < 0 or (self.max_seconds is not None and self.max_seconds <= self.min_seconds):
            raise UserError(f"--min-seconds {self.min_seconds} / --max-seconds {self.max_seconds}: need 0 <= min < max")
        if self.workers < 1:
            raise UserError(f"--workers {self.workers}: must be >= 1")
        check_device_name(self.device)

    def feature_settings(self) -> dict:
        """What decides the arrays (a rerun with other values refuses to mix with them).

        --batch-seconds is not among them: it moves floats only by rounding (within the reference
        tolerances, codes unchanged; tested), so a run stopped by GPU memory can go on with a smaller one.
        """
        return {"prompt_seconds": self.prompt_seconds, "min_seconds": self.min_seconds,
                "max_seconds": self.max_seconds, "allow_unk": self.allow_unk,
                "default_speaker": self.defaults.speaker, "default_language": self.defaults.language}


@dataclass
class Planned:
    """The corpus, each utterance's duration and file stem, the batches, and what was rejected before any model."""

    utterances: list[Utterance]
    durations: list[float]
    stems: list[str]
    batches: list[list[int]]
    early: dict[int, str]  # corpus index -> reason
    sources: list[str] = field(default_factory=list)  # Utterance.source_key of each: a record of another is stale
    texts: dict[int, TextIds] = field(default_factory=dict)  # corpus index -> its ids, when plan() encoded them


def _early_reason(frames: int, rate: int, options: PrepareOptions, limit: CodeLimit | None) -> str | None:
    """Why a clip cannot be kept, from its header alone (the code count follows the length rules exactly)."""
    seconds = frames / rate
    if seconds < options.min_seconds:
        return f"too short: {seconds:.2f} s < --min-seconds {options.min_seconds:g}"
    if options.max_seconds is not None and seconds > options.max_seconds:
        return f"too long: {seconds:.2f} s > --max-seconds {options.max_seconds:g}"
    if limit is not None:
        codes = expected_codes(frames, rate, limit.frames_per_code)
        if codes > limit.max_codes:
            return too_long_reason(codes, limit.max_codes)
    return None


def plan(utterances: list[Utterance], options: PrepareOptions, limit: CodeLimit | None = None,
         text_ids: Callable[[Utterance], TextIds | str] | None = None) -> Planned:
    """Durations from the headers, the rejections that need no audio, and the batches (see the module doc).

    With `text_ids` (Featurizer.text_ids) each text is encoded first: a text that cannot be kept (no
    language for IndexTTS-2.5, pieces the tokenizer lacks, too many tokens) is rejected before its audio
    is opened, as is a missing audio file (by its header)."""
    durations, early, texts = [], {}, {}
    for i, utt in enumerate(utterances):
        text = text_ids(utt) if text_ids is not None else None
        if isinstance(text, str):
            early[i] = text
            durations.append(0.0)
            continue
        if text is not None:
            texts[i] = text
        header = audio_header(utt)
        if isinstance(header, str):
            early[i], seconds = header, 0.0
        else:
            seconds = header[0] / header[1]
            reason = _early_reason(*header, options, limit)
            if reason is not None:
                early[i] = reason
        durations.append(seconds)
    order = sorted((i for i in range(len(utterances)) if i not in early), key=lambda i: (-durations[i], i))
    batches: list[list[int]] = []
    for i in order:  # longest first: a batch's first clip is its longest, so its padded cost is n x that
        if batches and (len(batches[-1]) + 1) * durations[batches[-1][0]] <= options.batch_seconds:
            batches[-1].append(i)
        else:
            batches.append([i])
    stems = [file_stem(utt.id) for utt in utterances]
    return Planned(utterances, durations, stems, batches, early, [utt.source_key() for utt in utterances], texts)


def _line(utt: Utterance, duration: float, text: TextIds, arrays: dict[str, np.ndarray],
          paths: dict[str, str]) -> dict:
    """The single-form line of a kept utterance (utterances.jsonl)."""
    line = {"id": utt.id, **utt.audio_fields(), "text": utt.text, "speaker": utt.speaker,
            "language": utt.language, "duration": round(duration, 4)}
    if text.lang_id is not None:
        line["lang_id"] = text.lang_id
    return line | paths | {"text_len": int(arrays["text_ids"].size), "code_len": int(arrays["codes"].size)}


def run_batch(batch: list[int], clips: list[Clip | str], planned: Planned, featurizer: Featurizer,
              folder: OutputFolder) -> None:
    """Features of one batch; the arrays and record of each member that has no record yet."""
    results: dict[int, dict | str] = {}
    texts: dict[int, TextIds] = {}
    for i, clip in zip(batch, clips, strict=True):
        text = planned.texts[i] if i in planned.texts else featurizer.text_ids(planned.utterances[i])
        if isinstance(text, str) or isinstance(clip, str):
            results[i] = text if isinstance(text, str) else clip
        else:
            texts[i] = text
    ready = [i for i in batch if i in texts]
    if ready:
        by_index = dict(zip(batch, clips, strict=True))
        try:
            results |= dict(zip(ready, featurizer.features([by_index[i] for i in ready]), strict=True))
        except torch.cuda.OutOfMemoryError:
            raise UserError(f"out of GPU memory on a batch of {len(ready)} clips; rerun with a smaller "
                            "--batch-seconds (finished utterances are kept)") from None
    todo = [i for i in batch if not folder.has_record(planned.stems[i], planned.sources[i])]
    folder.claim([planned.stems[i] for i in todo])  # the files below become prepare's (ownership.py)
    for i in todo:  # a member with a record was done before a kill; its arrays came from this same batch
        stem, utt = planned.stems[i], planned.utterances[i]
        source = planned.sources[i]
        if isinstance(results[i], str):
            folder.write_record(stem, {"id": utt.id, "source": source, "rejected": results[i]})
            continue
        arrays = {"text_ids": texts[i].ids, **results[i]}
        paths = folder.write_arrays(stem, arrays)
        folder.write_record(stem, {"id": utt.id, "source": source,
                                   "kept": _line(utt, planned.durations[i], texts[i], arrays, paths),
                                   "tokens": sorted({int(t) for t in texts[i].ids}), "extended": texts[i].extended})


def _loaded_batches(batches: list[list[int]], planned: Planned, options: PrepareOptions,
                    pool: ThreadPoolExecutor) -> Iterator[tuple[list[int], list[Clip | str]]]:
    """Each batch with its clips; the next PREFETCH_BATCHES batches are already loading."""
    def submit(batch: list[int]) -> list[Future]:
        return [pool.submit(load_clip, planned.utterances[i], options.prompt_seconds) for i in batch]

    pending = [submit(batch) for batch in batches[:PREFETCH_BATCHES]]
    for k, batch in enumerate(batches):
        if k + PREFETCH_BATCHES < len(batches):
            pending.append(submit(batches[k + PREFETCH_BATCHES]))
        yield batch, [future.result() for future in pending.pop(0)]


def compute_share(planned: Planned, featurizer: Featurizer, folder: OutputFolder, options: PrepareOptions,
                  info: DistInfo) -> None:
    """This rank's batches (k % world == rank) that are not complete yet."""
    mine = [b for k, b in enumerate(planned.batches) if k % info.world_size == info.rank]
    complete = [all(folder.has_record(planned.stems[i], planned.sources[i]) for i in b) for b in mine]
    todo = [b for b, done in zip(mine, complete, strict=True) if not done]
    seconds = [sum(planned.durations[i] for i in b) for b in mine]
    progress = PrepareProgress(total_clips=sum(map(len, mine)), total_seconds=sum(seconds),
                               enabled=info.is_main)
    progress.advance(sum(len(b) for b, done in zip(mine, complete, strict=True) if done),
                     sum(s for s, done in zip(seconds, complete, strict=True) if done), skipped=True)
    with progress, ThreadPoolExecutor(options.workers) as pool:
        for done, (batch, clips) in enumerate(_loaded_batches(todo, planned, options, pool), start=1):
            run_batch(batch, clips, planned, featurizer, folder)
            progress.advance(len(batch), sum(planned.durations[i] for i in batch))
            crash_point("prepare_batch", done)  # tests: stop or kill a run known to be mid-way (faults.py)


def assemble(planned: Planned, folder: OutputFolder, options: PrepareOptions, models: ModelFiles,
             hashes: dict[str, str], new_ids: range = range(0)) -> dict:
    """Manifests from the records, in corpus order (rank 0, after every rank finished)."""
    kept, rejected, tokens = [], [], TokenCount(new_ids)
    for i, utt in enumerate(planned.utterances):
        record = {"rejected": planned.early[i]} if i in planned.early else \
            folder.read_record(planned.stems[i], planned.sources[i])
        if record is None:
            raise UserError(f"{folder.root}: no record for {utt.id} after all ranks finished; rerun the same command")
        if "kept" in record:
            kept.append(record["kept"])
            tokens.add(record)
        else:
            rejected.append({"id": utt.id, **utt.audio_fields(), "reason": record["rejected"]})
    pairs = make_pairs(kept, options.split)
    folder.write_manifest("utterances.jsonl", kept)
    folder.write_manifest("rejected.jsonl", rejected)
    for name, chosen in (("train.jsonl", pairs.train), ("val.jsonl", pairs.val)):
        folder.write_manifest(name, [paired_line(t, p, models.family) for t, p in chosen])
    report = _report(kept, rejected, tokens, pairs, options, models, hashes)
    folder.write_json(PREPARE_RECORD, report)
    # for the summary only (prepare.json stays as it was): kept clips that are in no pair although their speaker
    # has other clips, all of them held out for validation
    return report | {"unpaired_targets": len(pairs.unpaired)}


def _versions() -> dict[str, str]:
    versions = {"python": platform.python_version()}
    for name in LIBRARIES:
        try:
            versions[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            versions[name] = "not installed"
    return versions


class TokenCount:
    """Text-token coverage of the kept utterances: distinct ids, and how much of the text is made of the
    pieces an extended tokenizer grew (`new_ids`). A grown piece that never occurs keeps its new,
    untrained row after training: inference that meets it reads noise."""

    def __init__(self, new_ids: range) -> None:
        self.new_ids, self.distinct, self.total, self.extended = new_ids, set(), 0, 0

    def add(self, record: dict) -> None:
        """A kept utterance's record (records of earlier versions have no source, so they were recomputed)."""
        self.distinct.update(record["tokens"])
        self.total += int(record["kept"]["text_len"])
        self.extended += int(record["extended"])

    def counts(self) -> dict:
        used = sum(1 for t in self.distinct if t in self.new_ids)
        return {"distinct_text_tokens": len(self.distinct), "text_tokens": self.total,
                "extended_pieces": len(self.new_ids), "extended_pieces_used": used,
                "extended_text_tokens": self.extended,
                "extended_token_share": round(self.extended / self.total, 4) if self.total else 0.0}


def _report(kept: list[dict], rejected: list[dict], tokens: TokenCount, pairs: Pairs, options: PrepareOptions,
            models: ModelFiles, hashes: dict[str, str]) -> dict:
    """prepare.json: settings, model hashes, versions, counts, hours (no times: the bytes are reproducible)."""
    return {
        "family": models.family.name,
        "corpora": [str(Path(p).resolve()) for p in options.corpora], "model_dir": str(models.model_dir.resolve()),
        "settings": options.feature_settings() | {"batch_seconds": options.batch_seconds} | asdict(options.split),
        "models": {name: str(path.resolve()) for name, path in sorted(models.files().items())},
        "model_sha256": hashes, "versions": _versions(),
        "counts": {"utterances": len(kept) + len(rejected), "kept": len(kept), "rejected": len(rejected),
                   "rejected_by_reason": dict(sorted(Counter(r["reason"].split(":")[0] for r in rejected).items())),
                   "rejected_top": top_rejections(rejected),
                   "train_pairs": len(pairs.train), "val_pairs": len(pairs.val),
                   "speakers": len({line["speaker"] for line in kept}),
                   "single_utterance_speakers": len(pairs.lone_speakers),
                   "targets_with_fewer_prompts": pairs.fewer_prompts,
                   "languages": dict(sorted(Counter(line["language"] or "unspecified" for line in kept).items())),
                   } | tokens.counts(),
        "hours": round(sum(line["duration"] for line in kept) / 3600, 4),
    }


def check_device_name(name: str | None) -> None:
    """cpu, cuda or cuda:N: the devices prepare's models run on (meta, mps, xla and the like would fail
    inside a model, after the corpus was read)."""
    if name is None:
        return
    kind, colon, index = name.partition(":")
    # torch parses an index only as plain decimal that fits: cuda:01 or 20 digits end in its traceback
    canonical = index.isascii() and index.isdigit() and str(int(index)) == index and len(index) <= 4
    if kind == "cpu" and not colon or kind == "cuda" and (not colon or canonical):
        return
    raise UserError(f"--device {name or repr(name)}: not a device the models run on; use cpu, cuda or cuda:N (N: a "
                    "GPU's index, written as cuda:1)")


def pick_device(name: str | None, info: DistInfo) -> torch.device:
    """--device, else this rank's GPU when there is one, else the CPU."""
    if name is not None:
        device = torch.device(name)
        if device.type == "cuda" and not torch.cuda.is_available():
            raise UserError(f"--device {name}: no CUDA GPU here; use --device cpu")
        if device.type == "cuda" and (device.index or 0) >= torch.cuda.device_count():
            raise UserError(f"--device {name}: this machine has {torch.cuda.device_count()} GPU(s), "
                            f"cuda:0 to cuda:{torch.cuda.device_count() - 1}")
        return device
    return torch.device("cuda", info.local_rank) if torch.cuda.is_available() else torch.device("cpu")


STOP_SIGNALS = {signal.SIGTERM: ("SIGTERM", 143), signal.SIGHUP: ("SIGHUP", 129)}  # preemption, a closed terminal
STOPPED = (INTERRUPTED, *(code for _, code in STOP_SIGNALS.values()))  # the exit codes of a stopped prepare


class _Stopped(KeyboardInterrupt):
    """A stop signal, taken as Ctrl+C is: wherever it lands, every file was written atomically."""

    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum


def _raise_stopped(signum: int, frame: object) -> None:
    raise _Stopped(signum)


def run_prepare(options: PrepareOptions) -> int:
    """Exit 0 every utterance kept, 1 some rejected, 2 nothing usable (or a UserError); 130 / 143 / 129 when
    Ctrl+C, SIGTERM (a preempted machine) or SIGHUP (a closed terminal) stopped it."""
    info = setup_distributed()
    folder = OutputFolder(options.out, rank=info.rank)
    main = threading.current_thread() is threading.main_thread()  # signal handlers are the main thread's
    previous = {signum: signal.signal(signum, _raise_stopped) for signum in STOP_SIGNALS} if main else {}
    try:
        return _refused_once(options, info, folder)
    except KeyboardInterrupt as stop:  # every file was written atomically and each record after its arrays
        name, code = STOP_SIGNALS[stop.signum] if isinstance(stop, _Stopped) else ("Ctrl+C", INTERRUPTED)
        print(f"prepare: interrupted ({name}); the finished utterances in {options.out} are kept: rerun the same "
              "command to go on", file=sys.stderr)
        return code
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
        folder.lock.release()  # a later run in this process (the demo, tests) takes it again
        teardown_distributed(info)


def _refused_once(options: PrepareOptions, info: DistInfo, folder: OutputFolder) -> int:
    """_run; under torchrun a refusal every rank meets (a bad corpus line, a busy --out) is printed once, by
    rank 0, not once a rank (distributed.said_by_main)."""
    try:
        try:
            return _run(options, info, folder)
        except OSError as exc:
            failure = _write_failure(exc, options.out)
            if failure is None:
                raise
            raise failure from None
    except UserError as exc:
        if said_by_main(refusal(exc), info):
            return 2
        raise


def _write_failure(exc: OSError, out: Path) -> UserError | None:
    """A full, read-only or forbidden --out is one line; every write was atomic, so a rerun goes on."""
    inside = exc.filename is not None and Path(os.path.abspath(exc.filename)).is_relative_to(os.path.abspath(out))
    if isinstance(exc, NotOwnFile):  # a link, a FIFO or a hard link where prepare writes: left as it is
        return UserError(f"{exc.filename}: {exc.strerror}; move it out of --out {out}, then rerun the same command")
    if exc.errno in (errno.ENOSPC, errno.EDQUOT) or (inside and exc.errno in (errno.EROFS, errno.EACCES, errno.EPERM)):
        return UserError(f"--out {out}: cannot write ({exc.strerror}); make room or choose a writable --out, then "
                         "rerun the same command (finished utterances are kept)")
    return None


def _on_main(step: Callable[[], None], info: DistInfo) -> None:
    """`step` on rank 0 only (it reads or changes --out); every rank stops with its line instead of hanging."""
    error = None
    if info.is_main:
        try:
            step()
        except UserError as exc:
            error = str(exc)
    error = broadcast_from_main(error, info)
    if error:
        raise UserError(error)


def _run(options: PrepareOptions, info: DistInfo, folder: OutputFolder) -> int:
    device = pick_device(options.device, info)
    _on_main(folder.check_and_lock, info)  # before any model is read: a wrong or busy --out costs no wait
    if options.download and info.enabled:
        raise UserError("--download: run it once in a single process (without torchrun), then start the ranks")
    # The corpus first: a bad line is named in a second, not after the models' GBs were hashed.
    utterances = read_corpora(options.corpora, options.defaults)
    check_val_speakers((utt.speaker for utt in utterances), options.split.val_speakers)
    models = locate_models(options.model_dir, options.overrides, download=options.download)
    hashes = model_hashes(models) if info.is_main else {}  # only rank 0 records them (GBs to read)
    _on_main(lambda: folder.guard_settings({"models": hashes} | options.feature_settings(),
                                          restart=options.restart), info)
    featurizer = Featurizer.load(models, device, allow_unk=options.allow_unk)
    planned = plan(utterances, options, featurizer.code_limit(), featurizer.text_ids)
    compute_share(planned, featurizer, folder, options, info)
    for note in featurizer.notes() if info.is_main else []:  # rank 0's share of the texts; enough to warn
        print(f"warning: {note}")
    barrier(info)
    if not info.is_main:
        return 0
    report = assemble(planned, folder, options, models, hashes, featurizer.new_ids)
    print_summary(report, options.out)
    counts = report["counts"]
    return 2 if counts["kept"] == 0 else (1 if counts["rejected"] else 0)

