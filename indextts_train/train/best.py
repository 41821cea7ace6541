"""Which checkpoint is best, which are milestones, and when to stop early.

- **best**: the lowest value of one validation metric (`--best-metric`, default the weighted total
  `loss`; `text_loss`, `mel_loss`, or `GROUP/loss` for one language) among validations that were
  within the forgetting limit, if one is set. Or what `listen` heard (`listen/cer`, lowest;
  `listen/speaker_sim`, highest): best.pth then follows the scores as they arrive (`take_heard`).
  The trainer saves a checkpoint at every new best and publishes it as `best.pth` (atomically, like
  `latest.pth`); rotation never removes it.
- **milestones**: with `--keep-every N`, every checkpoint whose step is a multiple of N is kept out
  of rotation (checkpoint.is_milestone).
- **early stopping**: `--early-stop-patience K` ends the run after K validations in a row without a
  new best.

`BestTracker` is the bookkeeping; its `state_dict()` travels in the checkpoint's history, so all
of this carries across resumes.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from indextts_train.checkpoint.files import BEST, publish
from indextts_train.checkpoint.run_folder import same_file
from indextts_train.checkpoint.scores import LOWER_IS_BETTER, summary_by_step
from indextts_train.config.metric_names import LISTEN_METRICS, LOSS_KEYS
from indextts_train.errors import UserError
from indextts_train.train.validation import forgetting_breaches, losses_of


def check_metric(metric: str, groups: Sequence[str]) -> None:
    """`loss`, `text_loss`, `mel_loss`, or `GROUP/<one of those>` for a validation group; or a listen metric."""
    if metric in LISTEN_METRICS:
        return
    group, _, key = metric.rpartition("/")
    if key not in LOSS_KEYS or (group and group not in groups):
        where = f"groups: {', '.join(groups)}" if groups else "no validation groups"
        raise UserError(f"--best-metric {metric}: expected one of {', '.join(LOSS_KEYS)}, optionally as "
                        f"GROUP/{LOSS_KEYS[0]} for a validation group ({where})")


def metric_value(result: dict, metric: str) -> float:
    """The value of `metric` in an evaluate_groups result."""
    group, _, key = metric.rpartition("/")
    return losses_of(result, group or None)[key]


@dataclass
class BestTracker:
    """The best validation so far and how many validations have passed without beating it."""

    metric: str = "loss"
    value: float | None = None
    step: int | None = None
    stale: int = 0  # validations since the last new best (listen metrics: heard checkpoints)
    heard: int = -1  # listen metrics: the last step whose scores were taken

    def update(self, value: float, step: int, *, eligible: bool = True) -> bool:
        """Record a validation; True when it is a new best (then the trainer saves and publishes it).

        A validation over the forgetting limit is not eligible: it never becomes best and counts as
        one without improvement.
        """
        # a non-finite value (a diverged validation) is never best: NaN would compare as no better and
        # no worse, and best.pth would name a broken model
        if eligible and math.isfinite(value) and (self.value is None or value < self.value):
            self.value, self.step, self.stale = value, step, 0
            return True
        self.stale += 1
        return False

    def patience_spent(self, patience: int) -> bool:
        return patience > 0 and self.stale >= patience

    def state_dict(self) -> dict:
        return {"metric": self.metric, "value": self.value, "step": self.step, "stale": self.stale,
                "heard": self.heard}

    def load_state_dict(self, state: dict | None) -> None:
        """The stored tracker; a changed metric starts over (values of two metrics do not compare)."""
        if not state or state.get("metric") != self.metric:
            self.value, self.step, self.stale, self.heard = None, None, 0, -1
            return
        self.value, self.step, self.stale, self.heard = state["value"], state["step"], state["stale"], \
            state.get("heard", -1)

    @classmethod
    def from_state_dict(cls, state: dict | None, metric: str) -> BestTracker:
        """A tracker of `metric` loaded from `state` (see load_state_dict)."""
        tracker = cls(metric)
        tracker.load_state_dict(state)
        return tracker

    def describe(self, published: bool = True) -> str:
        """The best so far, as the run's last line says it; `published` False: the folder's best.pth is not
        this run's (kept as it was), so the step's own file is named."""
        later = f"`export --pick {self.metric.partition('/')[2]}` ranks the checkpoints heard after it too"
        if self.step is None and self.metric in LISTEN_METRICS:  # scores arrive from listen, after saves
            return f"no checkpoint was heard before this point, so there is no {BEST}; {later}"
        if self.step is None:
            return f"no validation qualified as best, so there is no {BEST}"
        shown = -self.value if self.metric == "listen/speaker_sim" else self.value  # kept negated: higher is better
        if not published:
            return (f"the best is step {self.step} ({self.metric} {shown:.4f}): model_step{self.step}.pth "
                    f"({BEST} there is not this run's)")
        heard = f"; the best heard so far: {later}" if self.metric in LISTEN_METRICS else ""
        return f"{BEST} is step {self.step} ({self.metric} {shown:.4f}{heard})"


def breaches_of(result: dict, baseline: dict | None, limits: dict[str | None, float]) -> list[str]:
    return forgetting_breaches(result, baseline, limits) if limits and baseline is not None else []


def verdict(tracker: BestTracker, result: dict, step: int, *, baseline: dict | None,
            limits: dict[str | None, float], patience: int, breaches: list[str] | None = None) -> str | None:
    """Why the run ends at this validation (forgetting limit, early stop), or None. Changes nothing."""
    breaches = breaches_of(result, baseline, limits) if breaches is None else breaches
    if breaches:
        return (f"forgetting limit reached at step {step}: {'; '.join(breaches)}; the best checkpoint within "
                f"the limit: {tracker.describe()}")
    if tracker.patience_spent(patience):
        counted = "heard checkpoint(s)" if tracker.metric in LISTEN_METRICS else "validation(s)"
        return (f"early stop at step {step}: {tracker.stale} {counted} without a better {tracker.metric}; "
                f"{tracker.describe()}")
    return None


def judge(tracker: BestTracker, result: dict, step: int, *, baseline: dict | None,
          limits: dict[str | None, float], patience: int) -> tuple[bool, str | None]:
    """Record a validation: (is it a new best, why the run ends now or None). With a listen metric the
    validation is never a new best: `take_heard` publishes best.pth from the scores instead."""
    breaches = breaches_of(result, baseline, limits)
    if tracker.metric in LISTEN_METRICS:
        return False, verdict(tracker, result, step, baseline=baseline, limits=limits, patience=patience,
                              breaches=breaches)
    new_best = tracker.update(metric_value(result, tracker.metric), step, eligible=not breaches)
    return new_best, verdict(tracker, result, step, baseline=baseline, limits=limits, patience=patience,
                             breaches=breaches)


def restored_best(saved: dict | None, metric: str, step: int, *, resumed_from: Path | None, output_dir: Path,
                  protected: frozenset[str], is_main: bool, say: Callable[[str], None],
                  new_branch: bool = False) -> BestTracker:
    """The tracker from a checkpoint's history (`saved`; None: fresh). A run that resumes from its best
    checkpoint has best.pth name it: rank 0 publishes it now. That is a kill between saving a new best and
    publishing best.pth, or (`new_branch`) a rollback to it or a --resume of another folder's file."""
    tracker, best = BestTracker.from_state_dict(saved, metric), output_dir / BEST
    if is_main and resumed_from is not None and tracker.step == step and not same_file(best, resumed_from):
        publish(output_dir, resumed_from, BEST, protected)
        say(_republished(best, resumed_from, output_dir, step, new_branch))
    return tracker


def _republished(best: Path, resumed_from: Path, output_dir: Path, step: int, new_branch: bool) -> str:
    """Why best.pth now names the checkpoint the run resumes from."""
    if resumed_from.resolve().parent != output_dir.resolve():
        return (f"{best} now holds the checkpoint this run resumes from, {resumed_from}: the best of its run up to "
                f"step {step}")
    if new_branch:
        return (f"{best} now names {resumed_from.name}, the best checkpoint up to step {step}, where this new branch "
                f"starts (best.pth named a file of the branch it leaves, or none)")
    return f"{best} now names {resumed_from.name}, the best checkpoint (its publication was interrupted)"


def take_heard(tracker: BestTracker, output_dir: Path, up_to: int, protected: frozenset[str],
               say: Callable[[str], None]) -> None:
    """--best-metric listen/...: take the scores `listen` recorded for this run's checkpoints after
    `tracker.heard` up to step `up_to` (RUN/listen/scores.jsonl, means over each checkpoint's lines),
    and point best.pth at a new best's file.
    Only the file that best.pth names changes: nothing the training computes depends on it."""
    if tracker.metric not in LISTEN_METRICS:
        return
    key = tracker.metric.partition("/")[2]
    sign = 1 if LOWER_IS_BETTER[key] else -1  # the tracker keeps the lowest value
    summary = summary_by_step(output_dir)
    for step in sorted(s for s, values in summary.items() if tracker.heard < s <= up_to and values[key] is not None):
        tracker.heard = step
        path = output_dir / f"model_step{step}.pth"
        if tracker.update(sign * summary[step][key], step) and path.is_file():
            publish(output_dir, path, BEST, protected)
            say(f"{BEST} now names {path.name}: {tracker.metric} {summary[step][key]:.4f}, the best heard so far")
