"""The typed state a run resumes from: a loaded checkpoint, split into the parts the run loads.

`resumed_state` is the only reader of the checkpoint's top-level layout on the way in (the checkpoint
manager, manager.py, chose the file and loaded it migrated): each part comes out typed, and the run's
own parts load them with their `load_state_dict` (Weights, OptimizerSet, checkpoint.rng.restore_rng,
the data position, the history, the lineage).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from torch import Tensor

from indextts_train.checkpoint.run_folder import step_file_of
from indextts_train.checkpoint.state import DataRecord, History, Lineage, Progress
from indextts_train.config.schema import is_int
from indextts_train.data.sampling import LEGACY_RULE, SamplerSpec


@dataclass(frozen=True)
class Resumed:
    """Everything a checkpoint holds for a run that goes on from it, each part typed.

    `model` (official layout), `vocab_plan`, `optimizer_set` (the set's own four keys) and `rng` (one
    state per rank) are the saved forms their owners load (Weights; the tokenizer, text.vocab.Tokenizer.grow;
    OptimizerSet; checkpoint.rng.restore_rng).
    """

    path: Path
    model: dict[str, Tensor]
    vocab_plan: dict  # VocabPlan.to_dict()
    lora: dict | None  # the adapters of a --train-scope lora run
    optimizer_set: dict  # optimizer, optimizer_param_names, scheduler, scaler
    progress: Progress
    history: History
    data: DataRecord
    lineage: Lineage
    rng: list[dict]
    hparams: dict  # the settings it was trained with ({} after a repair: not known)
    train_config: dict  # its stored `train:` section (scope checks)
    gpt_config: dict  # its stored `gpt:` section: the model a run resumes
    hardware: dict  # its HardwarePlan.to_dict() (an OOM-reduced micro-batch, the arithmetic)
    sampler: SamplerSpec | None  # None: written before data order rules, so rule 1
    sort_window: int | None  # the window of a rule-1 run's stored config, when it has a usable one
    repaired: bool  # made by `indextts-train repair` (a community file or a partial one of ours)
    samples_unknown: bool  # a repair could not tell progress.samples_total
    # Goes on with its branch (--resume auto, or the folder's newest checkpoint named): no new branch unless
    # the run starts over. Decided by the manager from its one look at the folder's lineage.
    continues: bool = True

    @property
    def step(self) -> int:
        return self.progress.step

    def legacy_window(self, flag: int) -> int:
        """The sort window of a rule-1 run: the one in its stored config (rule 1 recorded no sampler
        part), else the flag. Its order depends on it, and the default has changed since (512)."""
        return self.sort_window if self.sort_window is not None else flag

    @property
    def step_file(self) -> Path:
        """The model_step{N}.pth that holds the step resumed from (latest.pth's twin), or the file itself."""
        return step_file_of(self.path) or self.path


def _part(cls: type, saved: dict) -> object:
    part = cls()
    part.load_state_dict(saved)
    return part


def stored_sort_window(ckpt: dict) -> int | None:
    """The sort window in a checkpoint's stored config, or None when it has no usable one."""
    stored = (ckpt.get("config") or {}).get("train", {}).get("sort_window")
    return stored if is_int(stored) and stored > 0 else None


def resumed_state(ckpt: dict, path: Path, unknown: list[str], *, continues: bool = True) -> Resumed:
    """A loaded (migrated, verified) checkpoint dict as its typed parts; `unknown` is what its verdict
    says a repair could not tell (kinds.Verdict.unknown); `continues`: see Resumed.continues."""
    sampler = ckpt.get("sampler", {})
    legacy = sampler.get("rule", LEGACY_RULE) == LEGACY_RULE  # no record: written before order rules
    sort_window = stored_sort_window(ckpt) if legacy else None
    samples_unknown = "progress.samples_total" in unknown
    return Resumed(
        path=path, model=ckpt["model"], vocab_plan=ckpt["vocab_plan"], lora=ckpt.get("lora"),
        optimizer_set={key: ckpt[key] for key in ("optimizer", "optimizer_param_names", "scheduler", "scaler")},
        progress=_part(Progress, ckpt["progress"]), history=_part(History, ckpt["history"]),
        data=_part(DataRecord, ckpt["data"]), lineage=_part(Lineage, ckpt["lineage"]), rng=ckpt["rng"],
        hparams=ckpt["hparams"], train_config=ckpt["config"].get("train") or {},
        gpt_config=ckpt["config"].get("gpt") or {}, hardware=ckpt.get("hardware") or {},
        sampler=None if legacy else SamplerSpec.from_state_dict(sampler),
        sort_window=sort_window, repaired=bool(ckpt.get("repaired")), samples_unknown=samples_unknown,
        continues=continues)
