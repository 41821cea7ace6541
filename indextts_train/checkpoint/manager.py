"""The checkpoint manager: which file a run resumes from, loaded in today's format, as one typed state.

Saving is one call (`TrainingState.state_dict`, state.py); `select_resume` is its reverse. It resolves
`--resume` (None, "auto" or a path), each step owned by one module and taken once, in order: the run
folder listed (run_folder.survey); for auto its files in lineage order (lineage.resume_order), each
candidate verified until one resumes, those that fail skipped and left untouched (verify.py); the
refusal of a folder none of whose files resumes and the names this run must not touch (run_folder.py);
then the chosen file is loaded, migrated (reader.load_checkpoint, state.migrate), and split into a
typed `Resumed` (resumed.py), whose parts the run's own parts load with their `load_state_dict`.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from indextts_train.checkpoint.lineage import resume_order
from indextts_train.checkpoint.reader import load_checkpoint
from indextts_train.checkpoint.resumed import Resumed, resumed_state
from indextts_train.checkpoint.run_folder import check_no_earlier_run, refuse_fresh_start, survey, untouchable_names
from indextts_train.checkpoint.verify import find_resume_checkpoint, verified_resume_file

Say = Callable[[str], None]


def select_resume(output_dir: Path, resume: str | None, *, warn: Say,
                  notice: Say) -> tuple[Resumed | None, frozenset[str]]:
    """Resolve --resume (None, "auto" or a path) into the state to resume, or None to start fresh.

    Also returns the file names in `output_dir` that this run must never replace or delete. The folder
    is listed once (run_folder.survey), under the run's lock: the checks, the order and the names read it.
    """
    folder = survey(output_dir)
    if resume is None:
        check_no_earlier_run(folder)
        return None, frozenset()
    if resume == "auto":
        # Newest branch first (lineage.py): a rollback's branch wins over the higher steps it abandoned.
        ordered = resume_order(folder.checkpoints)
        path, skipped = find_resume_checkpoint(ordered)
    else:
        path, skipped = verified_resume_file(resume), []
    if path is None and skipped:
        raise refuse_fresh_start(folder, skipped)
    for bad, reason in skipped:
        warn(f"skipping {bad}: {reason} (left on disk, never overwritten or deleted by this run)")
    if path is None:
        notice(f"--resume auto: no checkpoint in {output_dir}; starting fresh")
        return None, frozenset()
    protected = untouchable_names(folder, [bad for bad, _ in skipped], path)
    notice(f"resuming from {path}")
    loaded = load_checkpoint(path, crc_checked=True)  # migrated; its CRC was checked by the verification above
    return resumed_state(loaded, path), protected
