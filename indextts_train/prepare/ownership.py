"""Which files under `prepare --out` prepare wrote, so that it writes, replaces and removes only those.

Before the files of a batch are written, the batch's file stems are appended to the rank's ledger
`records/written-<rank>.txt` and fsynced. So every `<array>/<stem>.npy` and `records/<stem>.json` of a
listed stem is prepare's (written, or about to be: a kill leaves a listed stem without files, never
a file without its stem). Anything else in prepare's folders, and any of its top-level names before
its settings file exists, is the user's: a run refuses the folder instead of writing beside it, and
`--restart` removes only what the ledger lists. A folder prepared by a version without a ledger is
adopted from its records (each record was written by prepare, after its arrays).
"""

from __future__ import annotations

import contextlib
import os
import re
from collections.abc import Iterable
from pathlib import Path

from indextts_train.errors import UserError
from indextts_train.files.atomic import fsync_dir, open_append, open_own
from indextts_train.files.bounded import open_regular

RECORDS = "records"
ARRAY_FOLDERS = ("text_ids", "codes", "condition", "spk_emb", "emo_vec")
_LEDGER = re.compile(r"written-\d+\.txt")
_TEMP = re.compile(r"\..+\.tmp-\d+")  # atomic.temp_name of any process
MAX_STEM = 200  # file_stem gives at most 100 characters: a longer ledger line is not prepare's
# A ledger lists each stem once: 10 million utterances (corpus_hf.MAX_ROWS) of up to 100 characters.
MAX_LEDGER_BYTES = 10_000_000 * 101


class Ledger:
    """The stems prepare claimed under `root` (every rank's ledger), and this rank's appends."""

    def __init__(self, root: Path, rank: int = 0) -> None:
        self.folder = root / RECORDS
        self.path = self.folder / f"written-{rank}.txt"
        self.claimed: set[str] | None = None  # read at the first claim

    def files(self) -> list[Path]:
        if not self.folder.is_dir():
            return []
        # a link is no ledger of prepare's (first_foreign refuses the folder): its target is never read
        return sorted(p for p in self.folder.iterdir() if _LEDGER.fullmatch(p.name) and p.is_file()
                      and not p.is_symlink())

    def stems(self) -> set[str]:
        """Every claimed stem; a last line cut by a kill is not a claim (its files were not begun)."""
        files = self.files()
        if not files:  # an earlier version's folder: its records are prepare's
            return {p.stem for p in self.folder.glob("*.json")} if self.folder.is_dir() else set()
        stems: set[str] = set()
        for path in files:
            with open_regular(path, "prepare ledger") as handle:  # swapped for a FIFO since listed: one line
                _check_ledger_size(path, os.fstat(handle.fileno()).st_size)
                starts_line = True  # a longer line is read in pieces, none of which is a stem
                while raw := handle.readline(MAX_STEM + 2):
                    if starts_line and raw.endswith(b"\n") and len(raw) > 1:
                        stems.add(raw[:-1].decode("ascii", "replace"))
                    starts_line = raw.endswith(b"\n")
        return stems

    def adopt(self, stems: set[str]) -> None:
        """An earlier version's folder: its record stems become the ledger, so the next claims add to them."""
        if stems and not self.files():
            self.claim(sorted(stems))

    def claim(self, stems: Iterable[str]) -> None:
        """Append `stems` (those not yet listed) and fsync, before any of their files is written."""
        if self.claimed is None:
            self.claimed = self.stems() if self.files() else set()
        new_stems = [stem for stem in dict.fromkeys(stems) if stem not in self.claimed]
        self.claimed.update(new_stems)
        lines = "".join(f"{stem}\n" for stem in new_stems).encode("ascii")
        if not lines:
            return
        self.folder.mkdir(parents=True, exist_ok=True)
        new = not self.path.exists()
        if not new:
            _drop_cut_line(self.path)
        with os.fdopen(open_append(self.path), "ab") as handle:  # a file of its own: no link, FIFO or hard link
            handle.write(lines)
            handle.flush()
            os.fsync(handle.fileno())
        if new:
            fsync_dir(self.folder)


def _check_ledger_size(path: Path, size: int) -> None:
    """A ledger larger than prepare writes (a 100 GB file of holes would be read for minutes) is refused."""
    if size > MAX_LEDGER_BYTES:
        raise UserError(f"{path}: {size} bytes, more than a ledger of prepare's holds ({MAX_LEDGER_BYTES}); it was "
                        "not written by prepare: move it out of the folder, or use another --out")


def _drop_cut_line(path: Path) -> None:
    """A last line a kill cut short claims nothing: it goes, so the next claim starts a line of its own."""
    with os.fdopen(open_own(path, os.O_RDWR), "r+b") as handle:
        size = os.fstat(handle.fileno()).st_size
        handle.seek(max(0, size - MAX_STEM - 2))
        tail = handle.read()
        if tail and not tail.endswith(b"\n"):
            handle.truncate(size - len(tail) + tail.rfind(b"\n") + 1)


def is_temp(entry: os.DirEntry) -> bool:
    """A temp file a writer of atomic.py left (removed by the next run)."""
    return bool(_TEMP.fullmatch(entry.name)) and entry.is_file(follow_symlinks=False)


def is_own(folder: str, entry: os.DirEntry, owned: set[str]) -> bool:
    """Whether `folder/entry` is a file prepare wrote (or a temp file it left)."""
    if not entry.is_file(follow_symlinks=False):
        return False
    if _TEMP.fullmatch(entry.name):
        return True
    stem, _, suffix = entry.name.rpartition(".")
    if folder == RECORDS:
        return bool(_LEDGER.fullmatch(entry.name)) or (suffix == "json" and stem in owned)
    return suffix == "npy" and stem in owned


def _occupied(path: Path) -> bool:
    return path.is_symlink() or path.exists()


def first_foreign(root: Path, top_names: tuple[str, ...], started: bool, owned: set[str]) -> str | None:
    """The first file or folder (relative to `root`) where prepare writes that prepare did not write.

    Before the settings file exists (`started` False) every top-level name and every file in prepare's
    folders is foreign; after, a top-level name is foreign only when it is not a plain file.
    """
    for name in top_names:
        path = root / name
        if _occupied(path) and (not started or path.is_symlink() or not path.is_file()):
            return name
    for folder in (RECORDS, *ARRAY_FOLDERS):
        path = root / folder
        if not _occupied(path):
            continue
        if path.is_symlink() or not path.is_dir():
            return folder
        with os.scandir(path) as entries:
            foreign = [e.name for e in entries if not (is_own(folder, e, owned) if started else is_temp(e))]
        if foreign:
            return f"{folder}/{min(foreign)}"
    return None


def foreign_error(root: Path, where: str) -> UserError:
    """The one line that refuses a folder holding `where`, a file prepare did not write."""
    return UserError(f"--out {root}: {where} was not written by prepare, which writes, replaces and removes "
                    "only its own files there; move it out of the folder, or use another --out")


def remove_own(root: Path, owned: set[str]) -> None:
    """--restart: every file of prepare's folders that is its own; a folder left empty goes too.

    The ledger goes last: a --restart killed (or Ctrl+C'd) half-way leaves files the ledger still lists,
    never arrays of no listed stem, which every later run would refuse as the user's."""
    for folder in (*ARRAY_FOLDERS, RECORDS):
        path = root / folder
        if path.is_symlink() or not path.is_dir():
            continue
        with os.scandir(path) as entries:
            mine = sorted((e.path for e in entries if is_own(folder, e, owned)),
                          key=lambda file: bool(_LEDGER.fullmatch(os.path.basename(file))))
        for file in mine:
            os.unlink(file)
        with contextlib.suppress(OSError):  # something appeared meanwhile: not ours to remove
            path.rmdir()
