"""The run folder (`--output-dir`): which checkpoint files it holds, and whether a run may start there.

A run folder holds model_step{N}.pth files, latest.pth (the newest, usually a hard link of its step
file) and best.pth. This module owns those names and the one listing of them (`survey`), and the
questions asked of the folder before a run writes into it: can it be made and written, is it someone
else's work (a model folder, prepared features, a corpus the caller found it to be: a new run is not started
among their files), and does
it hold an earlier run's checkpoints (refused without --resume). Which of them are ours is lineage.py's
look (`lineage.look`), the refusal of a folder none of whose files resumes verify.py's. Saving and
rotation (files.py) and lineage use the same listing.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from indextts_train.data.corpus_forms import PREPARE_RECORD
from indextts_train.errors import UserError
from indextts_train.files.bounded import kind_of_path

LATEST = "latest.pth"
BEST = "best.pth"  # the lowest validation metric so far (best.py decides); never rotated

# A model folder (a release's: IndexTTS calls it checkpoints/, or an export), which a newcomer gives as
# --output-dir or --out: the files that tell it, and what it is said as.
MODEL_FILES = ("gpt.pth", "config.yaml")
A_MODEL = "a model (gpt.pth, config.yaml)"

_STEP_FILE = re.compile(r"^model_step(\d+)\.pth$")


def step_of(path: Path) -> int | None:
    """N of a model_step{N}.pth name; None for any other name."""
    match = _STEP_FILE.match(path.name)
    return int(match.group(1)) if match else None


def list_checkpoints(output_dir: Path) -> list[Path]:
    """Checkpoint files in `output_dir`: model_step*.pth oldest step first, then latest.pth if present."""
    output_dir = Path(output_dir)
    if not output_dir.is_dir():
        return []
    steps = sorted((p for p in output_dir.iterdir() if step_of(p) is not None and p.is_file()), key=step_of)
    latest = output_dir / LATEST
    return steps + [latest] if latest.is_file() else steps


def same_file(a: Path, b: Path) -> bool:
    """Whether `a` and `b` are one file (hard links included); False when either is missing."""
    try:
        return os.path.samefile(a, b)
    except OSError:
        return False


def latest_target(output_dir: Path) -> Path | None:
    """The model_step file latest.pth is a hard link of, if any."""
    latest = output_dir / LATEST
    steps = [p for p in list_checkpoints(output_dir) if p.name != LATEST]
    return next((p for p in steps if same_file(p, latest)), None) if latest.is_file() else None


def step_file_of(path: Path) -> Path | None:
    """The model_step{N}.pth that `path` is (itself, or the file latest.pth is a hard link of), if any."""
    if step_of(path) is not None:
        return path
    return latest_target(path.parent) if path.name == LATEST else None


@dataclass(frozen=True)
class RunFolder:
    """One listing of a run folder, taken once and read by every question asked of it."""

    path: Path
    checkpoints: tuple[Path, ...]  # model_step*.pth oldest step first, then latest.pth if present
    best: Path | None  # best.pth, when it is a file
    # What stands under a checkpoint's name but is no regular file (a FIFO, a folder, a link to nothing):
    # never a checkpoint, never ours, so never replaced (a save of that step once replaced a user's FIFO)
    not_files: tuple[Path, ...] = ()
    steps: Mapping[str, int] = field(default_factory=dict)  # the step of each model_step{N}.pth name listed

    @property
    def files(self) -> list[Path]:
        """Every checkpoint-named entry in it: the steps, latest.pth and best.pth, and the names no file holds."""
        return [*self.checkpoints, *([self.best] if self.best is not None else []), *self.not_files]


def survey(output_dir: Path) -> RunFolder:
    """What `output_dir` holds now (nothing when it does not exist yet), from one listing of it: the files
    list_checkpoints would give, best.pth, and the checkpoint names no regular file holds (nothing opened)."""
    output_dir = Path(output_dir)
    files, not_files = _checkpoint_entries(output_dir)
    steps = sorted((path for path in files if step_of(path) is not None), key=step_of)
    latest, best = output_dir / LATEST, output_dir / BEST
    checkpoints = (*steps, *([latest] if latest in files else []))
    named = {path.name: step for path in (*steps, *not_files) if (step := step_of(path)) is not None}
    return RunFolder(output_dir, checkpoints, best if best in files else None, tuple(not_files), named)


def _checkpoint_entries(output_dir: Path) -> tuple[set[Path], list[Path]]:
    """The checkpoint-named entries of `output_dir`: regular files (a link to one counts), and the others."""
    files: set[Path] = set()
    others: list[Path] = []
    try:
        with os.scandir(output_dir) as entries:
            for entry in entries:
                if step_of(Path(entry.name)) is None and entry.name not in (LATEST, BEST):
                    continue
                if entry.is_file():
                    files.add(Path(entry.path))
                else:
                    others.append(Path(entry.path))
    except OSError:  # not there yet, or not a folder (checked elsewhere)
        pass
    return files, sorted(others)


def check_output_dir(output_dir: Path) -> None:
    """The run folder can be made and written, checked without making it."""
    path = Path(output_dir)
    flag = f"--output-dir {path}"
    real = Path(os.path.realpath(path))
    if real.parent == real:  # `--output-dir /$NAME` with NAME unset: the run's files among the system's
        raise UserError(f"{flag}: the file system's root, not a folder of the run's own (an unset variable in the "
                        "path?); pass a folder for the run, e.g. --output-dir runs/am")
    if path.exists() and not path.is_dir():
        raise UserError(f"{flag}: is a file, not a folder; choose a folder path for the run")
    existing = next((p for p in (path, *path.parents) if p.exists()), None)
    if existing is not None and not existing.is_dir():
        raise UserError(f"{flag}: {existing} is a file, so no folder can be made under it; choose another path")
    if existing is not None and not os.access(existing, os.W_OK | os.X_OK):
        raise UserError(f"{flag}: {existing} is not writable; choose a writable folder")


def run_folder_to_read(path: Path) -> Path:
    """A run's --output-dir given to read (checkpoints, listen): one line when it is missing or a file."""
    path = Path(path)
    if path.is_file():
        raise UserError(f"{path}: a file, not a run folder; pass the run's --output-dir (the folder {path.parent}?)")
    if not path.is_dir():  # a FIFO or a device under the name is said as what it is
        what = f"is {kind_of_path(path)}, not a run folder" if os.path.lexists(path) else "no such run folder"
        raise UserError(f"{path}: {what}; pass the --output-dir of a run")
    return path


MAX_LOOKED = 1000  # entries of a folder looked through for runs inside it (a folder of clips holds thousands)


def runs_inside(folder: Path) -> str:
    """A clause naming the runs in `folder`'s subfolders (a folder holding a latest.pth), for the line that says
    `folder` itself holds no checkpoint: the demo's OUT holds its run in OUT/run. '' when there is none."""
    found: list[str] = []
    try:
        with os.scandir(folder) as entries:
            for i, entry in enumerate(entries):
                if i >= MAX_LOOKED or len(found) == 3:
                    break
                if entry.is_dir() and os.path.isfile(os.path.join(entry.path, LATEST)):
                    found.append(entry.path)
    except OSError:
        return ""
    if not found:
        return ""
    return f"; {' and '.join(sorted(found))} {'holds a run' if len(found) == 1 else 'hold runs'}: pass it"


def check_no_earlier_run(folder: RunFolder) -> None:
    """A new run (no --resume) never starts over the checkpoints of another one in the same folder."""
    if folder.checkpoints:
        raise UserError(f"{folder.path} already holds checkpoints ({folder.checkpoints[-1].name}); pass --resume "
                        "auto to continue that run, or choose another --output-dir")


def holds_model(path: Path) -> bool:
    return all((Path(path) / name).is_file() for name in MODEL_FILES)


def other_work(path: Path, corpus: str | None = None) -> str | None:
    """What `path` holds of other work than a run (a model, prepared features, a corpus), said as a phrase.
    `corpus`: what the caller found the folder to be as a corpus (data/corpus_forms.py, asked at its edge)."""
    if holds_model(path):
        return A_MODEL
    if (path / PREPARE_RECORD).is_file():
        return f"prepared features ({PREPARE_RECORD})"
    return corpus  # the clips and transcripts themselves


def check_not_other_work(folder: RunFolder, corpus: str | None = None) -> None:
    """A run starts in a folder of its own, not among a model's, prepared features' or a corpus's files (where
    its checkpoints, logs and run.yaml would mix with them). A folder that holds a run already goes on."""
    if folder.files:
        return
    found = other_work(folder.path, corpus)
    if found is not None:
        raise UserError(f"--output-dir {folder.path} holds {found}, not a run: a run writes its checkpoints, logs "
                        "and run.yaml into a folder of its own; pass a new one (e.g. --output-dir runs/am)")


def check_run_folder(output_dir: Path, resume: str | None, corpus: str | None = None) -> None:
    """Before anything is made: the folder can be made and written, is no other work's (`corpus`: what it
    is as a corpus, as the caller found), and a new run starts in no earlier run's."""
    check_output_dir(output_dir)
    folder = survey(output_dir)
    if resume is None:
        check_no_earlier_run(folder)
    check_not_other_work(folder, corpus)  # a folder that holds checkpoints is a run's: only one without them
