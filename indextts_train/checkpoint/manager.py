"""The checkpoint manager: which file a run resumes from, loaded in today's format, as one typed state.

Saving is one call (`TrainingState.state_dict`, state.py); `select_resume` is its reverse. It resolves
`--resume` (None, "auto" or a path), each step owned by one module and taken once, in order: the run
folder listed (run_folder.survey); its files' lineage read once (lineage.look: the order --resume auto
tries, the names not ours); each candidate verified until one resumes, those that fail skipped and
left untouched, a folder none of whose files resumes refused (verify.py: the chosen file is read once,
in full, and migrated by its verification); the names this run must not touch: those skipped and those
not ours; then the chosen file is split into a typed `Resumed` (resumed.py), whose parts the run's own
parts load with their `load_state_dict`, with whether it goes on with its branch (the same look).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from indextts_train.checkpoint.files import kept_names
from indextts_train.checkpoint.lineage import look
from indextts_train.checkpoint.resumed import Resumed, resumed_state
from indextts_train.checkpoint.run_folder import check_no_earlier_run, survey
from indextts_train.checkpoint.verify import choose_resume

Say = Callable[[str], None]


def select_resume(output_dir: Path, resume: str | None, *, warn: Say,
                  notice: Say) -> tuple[Resumed | None, frozenset[str]]:
    """Resolve --resume (None, "auto" or a path) into the state to resume, or None to start fresh.

    Also returns the file names in `output_dir` that this run must never replace or delete. The folder
    is listed once (run_folder.survey), under the run's lock: the checks, the order and the names read it.
    """
    folder = survey(output_dir)
    if resume is None:
        check_no_earlier_run(folder)  # refused before any file is read: a best.pth is all it may hold
    # One look at each file's lineage (lineage.py): the order --resume auto tries them in (newest branch
    # first: a rollback's branch wins over the higher steps it abandoned), and which are not ours.
    seen, choice = look(folder), None
    if resume is not None:
        candidates = seen.order if resume == "auto" else [Path(resume)]
        choice = choose_resume(candidates, named=resume != "auto", folder=output_dir)
        for bad, reason in choice.skipped:
            warn(f"skipping {bad}: {reason} (left on disk, never overwritten or deleted by this run)")
    # never replaced, moved or deleted by this run: the files not ours, and those that failed to resume
    skipped = {bad.name for bad, _ in (choice.skipped if choice else [])}
    protected = seen.foreign | skipped
    for name in sorted(seen.foreign - skipped, key=lambda name: folder.steps.get(name, 0)):
        if name in folder.steps:  # said now, not only when that step's save is refused
            warn(f"{output_dir / name} is not a checkpoint of this run: kept as it is; the run stops before it "
                 f"would save step {folder.steps[name]} under that name: move it out of {output_dir} before then")
    for name in sorted(kept_names(output_dir, protected)):  # so these names this run publishes not at all
        warn(f"{output_dir / name} is not a checkpoint this run can use: kept as it is, so this run publishes no "
             f"{name}; its checkpoints stay as model_stepN.pth")
    if choice is None or choice.path is None:
        if choice is not None:
            notice(f"--resume auto: no checkpoint in {output_dir}; starting fresh")
        return None, protected
    notice(f"resuming from {choice.path}")
    # --resume auto goes on with what it found; a named file, only when it is the newest branch's head
    continues = resume == "auto" or seen.continues(choice.path)
    return resumed_state(choice.state, choice.path, choice.unknown, continues=continues), protected
