"""Settings a run would not read, typed all the same (config/unread_settings.py)."""

from __future__ import annotations

import pytest

from indextts_train.config.family import INDEXTTS2, INDEXTTS25
from indextts_train.config.settings import TrainConfig
from indextts_train.config.unread_settings import (
    batch_unread,
    check_start_settings,
    setting_of_other_family,
    setting_unread,
    validation_unread,
)
from indextts_train.errors import UserError


def test_a_setting_of_the_other_family_is_said_unless_it_holds_its_default() -> None:
    train = TrainConfig(train_speaker_proj=True, borrow_languages=["kab=yo"])
    assert setting_of_other_family(train, INDEXTTS2, "train_speaker_proj", "the config") == (
        "--train-speaker-proj is for an IndexTTS-2.5 model, and this run's is IndexTTS2 (the config): leave "
        "--train-speaker-proj out")
    assert "--borrow-language is for an IndexTTS-2.5 model" in setting_of_other_family(
        train, INDEXTTS2, "borrow_languages", "the config")
    assert setting_of_other_family(train, INDEXTTS25, "train_speaker_proj", "x") is None  # its own family
    assert setting_of_other_family(TrainConfig(), INDEXTTS2, "train_speaker_proj", "x") is None  # the default:
    # --freeze-speaker-proj, what an IndexTTS2 run does anyway
    assert setting_of_other_family(train, INDEXTTS2, "learning_rate", "x") is None  # read by every family


def test_a_setting_of_another_mode_is_said_with_the_setting_it_needs() -> None:
    assert setting_unread(TrainConfig(), "lora_rank") == (
        "--lora-rank is read under --train-scope lora only, and this run has --train-scope full: the flag would "
        "change nothing; add --train-scope lora, or leave --lora-rank out")
    assert setting_unread(TrainConfig(train_scope="lora"), "lora_rank") is None
    assert "--listen-every K (K > 0) only, and this run has --listen-every 0" in setting_unread(TrainConfig(),
                                                                                               "listen_device")
    assert setting_unread(TrainConfig(listen_every=3), "listen_device") is None
    assert setting_unread(TrainConfig(), "seed") is None  # read by every run


def test_a_validation_setting_named_without_validation_data_is_said() -> None:
    """--val-interval, --listen-lines: read at validations only; typed without --val-manifest they changed nothing."""
    for name, flag in (("val_interval", "--val-interval"), ("listen_lines", "--listen-lines")):
        assert validation_unread(frozenset({name, "seed"}), has_validation=False) == (
            f"{flag} is read at validations only, and this start has no --val-manifest: the flag would change "
            f"nothing; add --val-manifest PATH (prepare writes val.jsonl), or leave {flag} out")
        assert validation_unread(frozenset({name}), has_validation=True) is None
    assert validation_unread(frozenset({"seed"}), has_validation=False) is None  # the default (or the config's)


def test_an_effective_batch_named_against_a_micro_batch_and_accumulation_is_said() -> None:
    """The planner takes --batch-size and --grad-accumulation as given: an --effective-batch-size beside them
    that they do not make was overridden with a note (train/hardware.py)."""
    train = TrainConfig(batch_size=4, grad_accumulation=4, effective_batch_size=8)
    every = frozenset({"batch_size", "grad_accumulation", "effective_batch_size"})
    assert batch_unread(train, every, world_size=1) == (
        "--effective-batch-size 8 does not match --batch-size 4 x --grad-accumulation 4 x 1 process(es) = 16, the "
        "batch the run would train with: set --effective-batch-size 16, or leave one of --batch-size and "
        "--grad-accumulation at 0 (auto), and it is chosen to reach 8")
    assert "does not match train.batch_size 4 x --grad-accumulation 4" in batch_unread(  # the config's micro-batch
        train, frozenset({"grad_accumulation", "effective_batch_size"}), world_size=1)
    assert batch_unread(TrainConfig(batch_size=2, grad_accumulation=4, effective_batch_size=8), every, 1) is None
    assert batch_unread(TrainConfig(batch_size=2, grad_accumulation=4, effective_batch_size=32), every, 4) is None
    assert "x 2 process(es) = 16" in batch_unread(TrainConfig(batch_size=2, grad_accumulation=4,
                                                               effective_batch_size=32), every, 2)
    assert batch_unread(train, every - {"effective_batch_size"}, 1) is None  # the effective batch not asked for
    assert batch_unread(TrainConfig(batch_size=4, effective_batch_size=8), every, 1) is None  # accumulation auto
    with pytest.raises(UserError, match="--val-interval is read at validations only"):  # the first reason said
        check_start_settings(train, every | {"val_interval"}, has_validation=False, world_size=1)
    check_start_settings(TrainConfig(), every | {"val_interval"}, has_validation=True, world_size=1)
