"""The checkpoint manager (checkpoint/manager.py) and the parts that save and load themselves.

Every part of a checkpoint gives back what it saved (`load_state_dict(state_dict())`); the manager
chooses the file (falling back past broken ones), migrates an older format and splits it into typed parts.
"""

from __future__ import annotations

import gzip
import os
import random
import shutil
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from test_checkpoint_files import make_state, save_steps

from indextts_train.checkpoint.files import protected_name_error
from indextts_train.checkpoint.manager import select_resume
from indextts_train.checkpoint.resumed import Resumed
from indextts_train.checkpoint.rng import ProcessRng
from indextts_train.checkpoint.state import DataRecord, History, Lineage, Progress, Stateful
from indextts_train.config.settings import GPTConfig, TrainConfig
from indextts_train.errors import UserError
from indextts_train.model.gpt import UnifiedVoiceGPT
from indextts_train.model.layout import official_shapes, trained_keys
from indextts_train.model.scope import trainable_parameters
from indextts_train.text.vocab import VocabPlan
from indextts_train.train.best import BestTracker
from indextts_train.train.optim import OptimizerSet
from indextts_train.train.weights import Weights

FIXTURES = Path(__file__).resolve().parent / "data" / "fixtures"
GPT = GPTConfig(model_dim=8, heads=2, layers=1, max_text_tokens=20, max_mel_tokens=30, number_text_tokens=50,
                number_mel_codes=40, start_mel_token=38, stop_mel_token=39)


class Said:
    def __init__(self) -> None:
        self.warnings: list[str] = []
        self.notices: list[str] = []


def select(output_dir: Path, resume: str | None) -> tuple[Resumed | None, frozenset[str], Said]:
    said = Said()
    resumed, protected = select_resume(output_dir, resume, warn=said.warnings.append, notice=said.notices.append)
    return resumed, protected, said


# ----------------------------------------------------------------------------- load_state_dict round trips


def round_trip(part: Stateful, empty: Stateful) -> Stateful:
    empty.load_state_dict(part.state_dict())
    return empty


def test_the_dataclass_parts_load_what_they_saved() -> None:
    progress = Progress(step=9, epoch=1, samples_in_epoch=12, samples_total=36, sampler_seed=5, micro_batch=2,
                        grad_accumulation=2, bad_steps=1, bad_streak=1, bad_streak_start=9, save_pending=1)
    history = History(train=[[3, 1.5, 1.0, 2.0, 0.1, 1e-3]], val=[[3, 1.2, 1.1, 1.3, 0.2]], best_val_loss=1.2,
                      best_val_step=3, pending=[[1.0, 2.0, 3.0, 0.5, 0.7]])
    data = DataRecord(fingerprint={"lines": 24}, skipped_loads=2, skipped_lines=["a.jsonl:3: bad"])
    lineage = Lineage(branch="b2", parent="b1", parent_step=4, born=7, forks=[["b1", 4]])
    for part in (progress, history, data, lineage):
        loaded = round_trip(part, type(part)())
        assert loaded == part and loaded is not part
    assert round_trip(Progress(), Progress(step=5)) == Progress()  # loading replaces every field


def test_the_best_tracker_loads_what_it_saved_and_starts_over_for_another_metric() -> None:
    tracker = BestTracker("loss")
    tracker.update(2.0, 4)
    tracker.update(3.0, 8)
    tracker.heard = 8
    assert round_trip(tracker, BestTracker("loss")) == tracker
    other = BestTracker("mel_loss", value=1.0, step=2, stale=1, heard=2)
    other.load_state_dict(tracker.state_dict())  # values of two metrics do not compare
    assert other == BestTracker("mel_loss")
    assert BestTracker.from_state_dict(tracker.state_dict(), "loss") == tracker


def draws() -> tuple:
    return random.random(), float(np.random.rand()), torch.rand(3).tolist()


def test_the_rng_part_puts_every_stream_back() -> None:
    rng = ProcessRng()
    saved = rng.state_dict()
    first = draws()
    draws()
    rng.load_state_dict(saved)
    assert draws() == first


def tiny_weights(seed: int) -> Weights:
    torch.manual_seed(seed)
    model = UnifiedVoiceGPT(GPTConfig(**vars(GPT)))
    # The carried encoder tensors are only passed through: one number each stands in for their full size.
    carried = {key: torch.full((1,), float(seed)) for key in official_shapes(model.cfg)
               if key not in trained_keys(model.cfg)}
    return Weights(model, carried, VocabPlan(50, 50), trainable_parameters(model, None))


def test_the_weights_load_the_official_layout_they_saved() -> None:
    weights, other = tiny_weights(0), tiny_weights(1)
    saved = weights.state_dict()
    assert any(not torch.equal(v, other.state_dict()[k]) for k, v in saved.items())
    other.load_state_dict(saved)
    loaded = other.state_dict()
    assert list(loaded) == list(saved) and all(torch.equal(loaded[k], v) for k, v in saved.items())
    assert set(other.carried) == set(weights.carried)


def optimizer_set(seed: int) -> OptimizerSet:
    weights = tiny_weights(seed)
    plan = SimpleNamespace(effective_batch=4, use_grad_scaler=False)  # what the set reads of a hardware plan
    return OptimizerSet.build(weights.trainable, TrainConfig(learning_rate=1e-2, warmup_steps=2), plan, 10)


@pytest.mark.slow
def test_the_optimizer_set_loads_what_it_saved() -> None:
    trained = optimizer_set(0)
    params = [p for group in trained.optimizer.param_groups for p in group["params"]]
    for _ in range(3):
        sum(p.square().sum() for p in params).backward()
        trained.optimizer.step()
        trained.scheduler.step()
        trained.optimizer.zero_grad()
    fresh = optimizer_set(0)
    fresh.load_state_dict(trained.state_dict())
    again = fresh.state_dict()
    saved = trained.state_dict()
    assert again["scheduler"] == saved["scheduler"] and again["optimizer_param_names"] == saved["optimizer_param_names"]
    moments = [(a, b) for i in saved["optimizer"]["state"] for a, b in
               zip(saved["optimizer"]["state"][i].values(), again["optimizer"]["state"][i].values(), strict=True)]
    assert len(moments) == 3 * len(params) and all(torch.equal(a, b) for a, b in moments)
    assert fresh.scheduler.get_last_lr() == trained.scheduler.get_last_lr()


def test_the_optimizer_set_refuses_a_set_built_for_other_parameters() -> None:
    saved = optimizer_set(0).state_dict()
    saved["optimizer_param_names"] = list(reversed(saved["optimizer_param_names"]))
    with pytest.raises(UserError, match="built for other parameters"):
        optimizer_set(0).load_state_dict(saved, source="run/model_step3.pth")


# ----------------------------------------------------------------------------- selection


def test_a_new_run_resumes_nothing_and_refuses_a_folder_with_checkpoints(tmp_path: Path) -> None:
    assert select(tmp_path, None)[:2] == (None, frozenset())
    save_steps(tmp_path, [1])
    with pytest.raises(UserError, match="already holds checkpoints"):
        select(tmp_path, None)


def test_auto_falls_back_past_a_broken_newest_file_and_protects_it(tmp_path: Path) -> None:
    save_steps(tmp_path, [1, 2])
    (tmp_path / "latest.pth").unlink()
    newest = tmp_path / "model_step2.pth"
    newest.write_bytes(newest.read_bytes()[:100])  # killed mid-write by a writer that is not atomic
    resumed, protected, said = select(tmp_path, "auto")
    assert resumed is not None and resumed.path == tmp_path / "model_step1.pth" and resumed.step == 1
    assert protected == frozenset({"model_step2.pth"})
    assert len(said.warnings) == 1 and str(newest) in said.warnings[0] and "INCOMPLETE" in said.warnings[0]
    assert said.notices == [f"resuming from {tmp_path / 'model_step1.pth'}"]
    assert newest.stat().st_size == 100  # left on disk as it was


def test_auto_with_nothing_usable_refuses_to_start_over(tmp_path: Path) -> None:
    save_steps(tmp_path, [1])
    for path in tmp_path.glob("*.pth"):
        path.write_bytes(b"not a checkpoint")
    with pytest.raises(UserError, match="none of them can resume"):
        select(tmp_path, "auto")
    empty = tmp_path / "empty"
    empty.mkdir()
    resumed, _, said = select(empty, "auto")
    assert resumed is None and said.notices == [f"--resume auto: no checkpoint in {empty}; starting fresh"]


def test_files_that_are_not_ours_are_never_touched_however_the_run_starts(tmp_path: Path) -> None:
    alone = tmp_path / "alone"
    alone.mkdir()
    torch.save({"w": torch.zeros(2)}, alone / "best.pth")  # someone's weights, named like our best file
    for resume in (None, "auto"):  # a new run, or --resume auto finding no checkpoint
        resumed, protected, _ = select(alone, resume)
        assert resumed is None and protected == frozenset({"best.pth"})
    save_steps(tmp_path, [1, 2])
    torch.save({"w": torch.zeros(2)}, tmp_path / "model_step9.pth")
    (tmp_path / "model_step7.pth").write_bytes(b"garbage")
    resumed, protected, said = select(tmp_path, str(tmp_path / "model_step1.pth"))
    assert resumed.step == 1 and protected == frozenset({"model_step9.pth", "model_step7.pth"})
    # a named file: the others are not tried, only looked at; the steps they would stop are said at the start
    assert said.warnings == [f"{tmp_path / f'model_step{n}.pth'} is not a checkpoint of this run: kept as it is; the "
                             f"run stops before it would save step {n} under that name: move it out of {tmp_path} "
                             "before then" for n in (7, 9)]


def test_what_is_no_file_under_a_checkpoint_name_is_never_replaced(tmp_path: Path) -> None:
    """A save of step 4 replaced a user's FIFO named model_step4.pth: the listing saw regular files only."""
    save_steps(tmp_path, [1, 2])
    os.mkfifo(tmp_path / "model_step4.pth")  # never opened: a reader would wait for a writer
    (tmp_path / "model_step6.pth").mkdir()
    (tmp_path / "model_step8.pth").symlink_to(tmp_path / "nowhere")
    os.mkfifo(tmp_path / "best.pth")
    resumed, protected, said = select(tmp_path, "auto")
    assert resumed.step == 2
    assert protected == {"model_step4.pth", "model_step6.pth", "model_step8.pth", "best.pth"}
    assert [w.split(" is not ")[0] for w in said.warnings] == [
        *(str(tmp_path / f"model_step{n}.pth") for n in (4, 6, 8)), str(tmp_path / "best.pth")]
    for step in (4, 6, 8):
        assert protected_name_error(tmp_path, step, protected) is not None
    assert (tmp_path / "model_step4.pth").is_fifo() and (tmp_path / "best.pth").is_fifo()


def test_a_named_file_is_verified_and_split_into_its_typed_parts(tmp_path: Path) -> None:
    save_steps(tmp_path, [3])
    state = make_state(3)
    resumed, _, _ = select(tmp_path, str(tmp_path / "model_step3.pth"))
    assert resumed.progress == Progress(**state["progress"])
    assert resumed.history.train == state["history"]["train"] and isinstance(resumed.history, History)
    assert resumed.data == DataRecord() and resumed.lineage == Lineage()
    assert resumed.vocab_plan == VocabPlan(base_tokens=10, tokens=12, freeze_base=True).to_dict()  # as saved, for
    # the tokenizer to load (insert_at filled: None)
    assert resumed.hparams == state["hparams"] and resumed.hardware == {"device": "cpu"}
    assert set(resumed.optimizer_set) == {"optimizer", "optimizer_param_names", "scheduler", "scaler"}
    assert resumed.optimizer_set["optimizer_param_names"] == state["optimizer_param_names"]
    assert len(resumed.rng) == 1 and not resumed.repaired and not resumed.samples_unknown
    assert resumed.step_file == tmp_path / "model_step3.pth"
    with pytest.raises(UserError, match="no such checkpoint file"):
        select(tmp_path, str(tmp_path / "model_step9.pth"))


def test_the_manager_says_whether_the_chosen_file_goes_on_with_its_branch(tmp_path: Path) -> None:
    """From its one look at the folder: --resume auto, or the newest branch's head named (here or as a copy in
    another folder), goes on with the branch; an earlier step named is a rollback (a new branch)."""
    run, elsewhere = tmp_path / "run", tmp_path / "elsewhere"
    save_steps(run, [3, 5])
    elsewhere.mkdir()
    for step in (3, 5):
        shutil.copyfile(run / f"model_step{step}.pth", elsewhere / f"model_step{step}.pth")
    for resume, continues in (("auto", True), (run / "model_step5.pth", True), (run / "latest.pth", True),
                              (run / "model_step3.pth", False), (elsewhere / "model_step5.pth", True),
                              (elsewhere / "model_step3.pth", False)):
        resumed, _, _ = select(run, str(resume))
        assert resumed.continues is continues, resume


def test_an_old_format_file_is_migrated_through_the_manager(tmp_path: Path) -> None:
    """format 1 (the fixture an early version wrote): best_val_step filled in, the parts newer than it
    created empty, and no sampler record, so the run keeps data order rule 1 with its stored window."""
    with gzip.open(FIXTURES / "format1_step4.pth.gz", "rb") as f, open(tmp_path / "model_step4.pth", "wb") as out:
        shutil.copyfileobj(f, out)
    resumed, protected, _ = select(tmp_path, "auto")
    assert resumed is not None and resumed.path == tmp_path / "model_step4.pth" and protected == frozenset()
    assert resumed.step == 4 and resumed.progress.bad_steps == 0 and resumed.progress.save_pending == 0
    rows = resumed.history.val
    assert rows and resumed.history.best_val_step == min(rows, key=lambda row: row[1])[0]
    assert resumed.history.pending == [] and resumed.history.best is None
    assert resumed.data == DataRecord() and resumed.lineage == Lineage()
    assert resumed.sampler is None and resumed.sort_window == 512 and resumed.legacy_window(4096) == 512
    assert resumed.optimizer_set["optimizer"] is not None and len(resumed.rng) == 1
