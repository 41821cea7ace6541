"""The output folder of `prepare`: per-utterance arrays and records, the settings guard, the manifests.

Layout: `<name>/<stem>.npy` per array (text_ids, codes, condition or spk_emb, emo_vec), and
`records/<stem>.json`, written last, that says the utterance is complete (kept: its manifest line;
rejected: the reason) and what it was computed from (`source`: Utterance.source_key). Every file is
written atomically, so a kill leaves either nothing or a whole file under a final name; a rerun skips
utterances whose record has the same source, and recomputes those whose text or audio changed.
`prepare.settings.json` holds what decides the arrays (model hashes and feature settings): a rerun
with other values refuses to mix with them, and `--restart` removes what prepare wrote here (and
nothing else: ownership.py says which files those are; a folder holding others is refused).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from pathlib import Path

import numpy as np

from indextts_train.checkpoint.run_folder import A_MODEL, holds_model, list_checkpoints
from indextts_train.data.corpus_forms import PREPARE_RECORD
from indextts_train.errors import UserError
from indextts_train.files.atomic import atomic_write, atomic_write_text, stale_temps
from indextts_train.files.bounded import json_or_none, read_bounded
from indextts_train.files.targets import check_output_folder, make_output_folder
from indextts_train.prepare.outlock import OutLock
from indextts_train.prepare.ownership import (
    ARRAY_FOLDERS,
    RECORDS,
    Ledger,
    first_foreign,
    foreign_error,
    is_temp,
    remove_own,
)

SETTINGS_FILE = "prepare.settings.json"
MANIFESTS = ("utterances.jsonl", "train.jsonl", "val.jsonl", "rejected.jsonl", PREPARE_RECORD)
MAX_RECORD_BYTES = 1 << 20
# What the manifests and the summary read of a kept record's line (pipeline._line writes them all).
KEPT_KEYS = frozenset({"id", "audio", "text", "speaker", "language", "duration", "text_ids_path", "codes_path",
                       "emo_vec_path", "text_len", "code_len"})
_UNSAFE = re.compile(r"[^A-Za-z0-9._-]")
_HASHED = re.compile(r".*-[0-9a-f]{12}")  # the form file_stem gives an id it cleans


def file_stem(uid: str) -> str:
    """A file name for an id: the id itself when it is a safe name, else a cleaned form plus a hash of the id.

    An id that already ends like a cleaned one (`a_b-<12 hex>`) is hashed too, so it can never take the
    name of another id (`a/b`) cleaned: two ids never share a file.
    """
    if not _UNSAFE.search(uid) and 0 < len(uid) <= 100 and not uid.startswith(".") and not _HASHED.fullmatch(uid):
        return uid
    cleaned = _UNSAFE.sub("_", uid)[:80].lstrip(".")
    return f"{cleaned}-{hashlib.sha256(uid.encode('utf-8')).hexdigest()[:12]}"


def dumps(obj: dict) -> str:
    """One manifest line: fixed key order as built, no ASCII escaping, so the bytes are reproducible."""
    return json.dumps(obj, ensure_ascii=False)


def _changed(key: str, now: object, before: object) -> str:
    """A setting that changed since the folder was prepared, as said: `models (bpe.model)` names the model
    files whose hashes differ (a rerun with another --tokenizer read as "other models")."""
    if isinstance(now, dict) and isinstance(before, dict):
        parts = sorted(str(k) for k in now.keys() | before.keys() if now.get(k) != before.get(k))
        return f"{key} ({', '.join(parts[:4])}{', ...' if len(parts) > 4 else ''})"
    return key


class OutputFolder:
    """What one prepare run writes under --out."""

    def __init__(self, root: Path, rank: int = 0) -> None:
        self.root = root
        self.ledger = Ledger(root, rank)
        self.lock = OutLock(root)  # rank 0's, for the whole run (outlock.py)

    def array_path(self, name: str, stem: str) -> Path:
        return self.root / name / f"{stem}.npy"

    def record_path(self, stem: str) -> Path:
        return self.root / RECORDS / f"{stem}.json"

    def has_record(self, stem: str, source: str) -> bool:
        """Whether the utterance is complete: its record exists and was computed from `source`
        (Utterance.source_key); an older record of other text or audio is recomputed, then replaced."""
        return self.read_record(stem, source) is not None

    def read_record(self, stem: str, source: str) -> dict | None:
        """The utterance's record, or None when it has none or a stale one (another `source`)."""
        path = self.record_path(stem)
        if not path.is_file():
            return None
        if path.stat().st_size > MAX_RECORD_BYTES:
            raise UserError(f"{path}: larger than any record prepare writes; rerun with --restart")
        record = json_or_none(read_bounded(path, MAX_RECORD_BYTES, "prepare record"))  # one a crafted file may
        # nest 100,000 deep or fill with a number of thousands of digits
        if not isinstance(record, dict):
            raise UserError(f"{path}: not a record prepare wrote; rerun with --restart")
        if record.get("source") != source or not self._complete(record):
            return None
        return record

    def _complete(self, record: dict) -> bool:
        """A record the manifests can be built from: a rejection's reason, or a kept line with every key
        they read and its arrays on disk. Anything else (a damaged record, an array removed by hand) is
        stale: its utterance is computed again, not turned into a traceback or a line naming no file."""
        if isinstance(record.get("rejected"), str):
            return True
        kept = record.get("kept")
        if not (isinstance(kept, dict) and KEPT_KEYS <= kept.keys() and isinstance(record.get("tokens"), list)
                and isinstance(record.get("extended"), int) and isinstance(kept["text_len"], int)
                and isinstance(kept["duration"], (int, float))):
            return False
        if "spk_emb_path" in kept and "lang_id" not in kept:  # IndexTTS-2.5's lines name their language row
            return False
        arrays = [value for key, value in kept.items() if key.endswith("_path")]
        return len(arrays) == len(ARRAY_FOLDERS) - 1 and all(
            isinstance(a, str) and a.count("/") == 1 and a.split("/")[0] in ARRAY_FOLDERS
            and (self.root / a).is_file() for a in arrays)

    def write_arrays(self, stem: str, arrays: dict[str, np.ndarray]) -> dict[str, str]:
        """Each array to `<name>/<stem>.npy`, atomically; returns `<name>_path` -> path relative to the folder."""
        paths = {}
        for name, array in arrays.items():
            path = self.array_path(name, stem)
            path.parent.mkdir(parents=True, exist_ok=True)
            atomic_write(path, lambda handle, a=array: np.save(handle, a, allow_pickle=False))
            paths[f"{name}_path"] = f"{name}/{stem}.npy"
        return paths

    def write_record(self, stem: str, record: dict) -> None:
        """Written after the arrays: its presence means the utterance is complete."""
        self.record_path(stem).parent.mkdir(parents=True, exist_ok=True)
        atomic_write_text(self.record_path(stem), json.dumps(record, ensure_ascii=False, sort_keys=True))

    def check_foreign(self) -> None:
        """Refuse an --out that is a file, under a file, or holds files prepare did not write where it
        writes (see ownership.py); reads only, so every rank may check before any model is read."""
        check_output_folder("--out", self.root)
        started = (self.root / SETTINGS_FILE).is_file()
        if not started:  # a new --out: not among a model's or a run's files, where its outputs would mix
            self._check_not_model_or_run()
        owned = self.ledger.stems() if started else set()
        foreign = first_foreign(self.root, (SETTINGS_FILE, *MANIFESTS), started, owned)
        if foreign is not None:
            raise foreign_error(self.root, foreign)

    def check_and_lock(self) -> None:
        """check_foreign, then the run's lock on a folder that exists (a new one is locked once made): a
        second prepare on the same --out is refused before it reads any model."""
        self.check_foreign()
        if self.root.is_dir():
            self.lock.acquire()

    def _check_not_model_or_run(self) -> None:
        held = "a run (its checkpoints)" if list_checkpoints(self.root) else A_MODEL if holds_model(self.root) else None
        if held is not None:
            raise UserError(f"--out {self.root} holds {held}: prepare writes its arrays and manifests into a folder "
                            "of its own; pass a new one (e.g. --out features/am)")

    def guard_settings(self, settings: dict, *, restart: bool) -> None:
        """Refuse foreign files and mixing with outputs of other models or settings; --restart removes
        prepare's own files first. A start that prepared nothing (no utterance claimed) is simply replaced."""
        self.check_foreign()
        make_output_folder("--out", self.root)  # a new folder: nothing to compare, and the lock needs it
        self.lock.acquire()  # before the temp files or --restart's removals below: none may be another run's
        path = self.root / SETTINGS_FILE
        owned = self.ledger.stems() if path.is_file() else set()
        self.remove_stale_temp_files()
        if restart and path.is_file():
            self.remove_own_files(owned)
        elif owned:
            previous = self._previous_settings(path)
            changed = [_changed(key, settings.get(key), previous.get(key))
                       for key in sorted(settings.keys() | previous.keys()) if settings.get(key) != previous.get(key)]
            if changed:
                raise UserError(f"{self.root}: prepared with other {', '.join(changed)}; rerun with --restart "
                                "to start over (it removes prepare's files there), or use another --out")
            self.ledger.adopt(owned)
            return
        atomic_write_text(path, json.dumps(settings, indent=1, sort_keys=True) + "\n")

    def claim(self, stems: list[str]) -> None:
        """Recorded before the files of `stems` are written: they become prepare's (ownership.py)."""
        self.ledger.claim(stems)

    def remove_stale_temp_files(self) -> int:
        """Temp files a killed run left: anywhere in prepare's own folders, and beside the manifests and
        settings file it writes into --out itself (`.NAME.tmp-PID`, see atomic.py)."""
        stale = [temp for name in (*MANIFESTS, SETTINGS_FILE) for temp in stale_temps(self.root / name)]
        for name in (RECORDS, *ARRAY_FOLDERS):
            if (self.root / name).is_dir():
                with os.scandir(self.root / name) as entries:
                    stale += [Path(e.path) for e in entries if is_temp(e)]
        for temp in stale:
            temp.unlink(missing_ok=True)
        return len(stale)

    def _previous_settings(self, path: Path) -> dict:
        try:
            previous = json_or_none(read_bounded(path, MAX_RECORD_BYTES, "prepare settings file"))
        except OSError:
            raise UserError(f"{path}: unreadable; rerun with --restart to start over") from None
        if not isinstance(previous, dict):
            raise UserError(f"{path}: not a settings file prepare wrote; rerun with --restart to start over")
        return previous

    def remove_own_files(self, owned: set[str]) -> None:
        """Only what prepare wrote: the files its ledger lists, its manifests and settings file."""
        remove_own(self.root, owned)
        for name in (*MANIFESTS, SETTINGS_FILE):
            (self.root / name).unlink(missing_ok=True)

    def write_manifest(self, name: str, lines: list[dict]) -> Path:
        path = self.root / name
        atomic_write_text(path, "".join(dumps(line) + "\n" for line in lines))
        return path

    def write_json(self, name: str, obj: dict) -> Path:
        path = self.root / name
        atomic_write_text(path, json.dumps(obj, indent=1, ensure_ascii=False) + "\n")
        return path
