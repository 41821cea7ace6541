"""Settings a run would not read, typed all the same (config/unread_settings.py)."""

from __future__ import annotations

from indextts_train.config.family import INDEXTTS2, INDEXTTS25
from indextts_train.config.settings import TrainConfig
from indextts_train.config.unread_settings import setting_of_other_family, setting_unread


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
