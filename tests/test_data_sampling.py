"""Data order rules, weighted mixing and `PATH[::lang][@weight]` specs."""

from __future__ import annotations

import dataclasses
import gzip
import io
import json
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
import torch

from indextts_train.data.sampling import (
    LEGACY_RULE,
    ORDER_RULE,
    ManifestSpec,
    ResumableBatchSampler,
    SamplerSpec,
    Source,
    epoch_counts,
    epoch_length,
    epoch_order,
    legacy_epoch_order,
    mix_change,
    parse_manifest_spec,
    parse_manifest_specs,
    sampler_spec,
)
from indextts_train.errors import UserError

FIXTURES = Path(__file__).resolve().parent / "data" / "fixtures"


def spec(*sources: Source, step: int = 8, seed: int = 3, window: int = 16, rule: int = ORDER_RULE) -> SamplerSpec:
    return SamplerSpec(rule, seed, window, step, tuple(sources))


def flatten(batches: list[list[int]]) -> list[int]:
    return [i for batch in batches for i in batch]


# --------------------------------------------------------------------------------------------- specs


@pytest.mark.parametrize(("value", "expected"), [
    ("am.jsonl", ManifestSpec(Path("am.jsonl"))),
    ("am.jsonl::am", ManifestSpec(Path("am.jsonl"), "am")),
    ("zh_en.jsonl@0.15", ManifestSpec(Path("zh_en.jsonl"), None, 0.15)),
    ("d/zh_en.jsonl::zh_en@.5", ManifestSpec(Path("d/zh_en.jsonl"), "zh_en", 0.5)),
    ("/data/user@host/am.jsonl", ManifestSpec(Path("/data/user@host/am.jsonl"))),
    ("a::b/am.jsonl::am", ManifestSpec(Path("a::b/am.jsonl"), "am")),
])
def test_manifest_spec_forms(value: str, expected: ManifestSpec) -> None:
    assert parse_manifest_spec(value) == expected


def test_an_existing_file_is_taken_whole(tmp_path: Path) -> None:
    odd = tmp_path / "odd@2"
    odd.write_text("")
    assert parse_manifest_spec(str(odd)) == ManifestSpec(odd)


@pytest.mark.parametrize(("value", "words"), [
    ("am.jsonl@high", "weight 'high' must be a number > 0"),
    ("am.jsonl@0", "must be a number > 0"),
    ("am.jsonl@-1", "must be a number > 0"),
    ("am.jsonl@nan", "must be a number > 0"),
    ("am.jsonl@0.2::am", "the language goes before the weight"),
    ("am.jsonl::9x", "language '9x'"),
    ("am.jsonl::", "language ''"),
    ("::am", "no manifest path"),
])
def test_bad_manifest_specs_say_what_to_write(value: str, words: str) -> None:
    with pytest.raises(UserError, match="--train-manifest") as info:
        parse_manifest_spec(value)
    assert words in str(info.value)


def test_weights_must_leave_a_share_and_mean_nothing_for_validation() -> None:
    with pytest.raises(UserError, match="add up to 1.1"):
        parse_manifest_specs(["a.jsonl", "b.jsonl@0.6", "c.jsonl@0.5"], "--train-manifest", weights=True)
    assert len(parse_manifest_specs(["b.jsonl@0.6", "c.jsonl@0.5"], "--train-manifest", weights=True)) == 2
    with pytest.raises(UserError, match="--val-manifest b.jsonl@0.6: a weight has no meaning"):
        parse_manifest_specs(["b.jsonl@0.6"], "--val-manifest", weights=False)


def test_a_language_label_where_it_means_nothing_is_refused() -> None:
    """evaluate reports one loss over all its manifests: `--manifest m.jsonl::am` was taken and the label ignored."""
    assert parse_manifest_specs(["v.jsonl::am"], "--val-manifest", weights=False)[0].lang == "am"  # groups there
    with pytest.raises(UserError, match=r"--manifest v.jsonl::am: a language label has no meaning .*drop the ::am"):
        parse_manifest_specs(["a.jsonl", "v.jsonl::am"], "--manifest", weights=False, labels=False)


# --------------------------------------------------------------------------------------------- epoch length


def test_epoch_length_with_weights() -> None:
    # 85 unweighted lines + 15% replay: 100 samples per epoch, 15 of them from the 1000-line manifest.
    mixed = spec(Source("am", 85), Source("zh", 1000, 0.15), step=10)
    assert epoch_counts(mixed).tolist() == [85, 15] and epoch_length(mixed) == 100
    # Rounded down to whole steps; the cut is shared in proportion.
    assert epoch_counts(spec(Source("am", 85), Source("zh", 1000, 0.15), step=8)).tolist() == [82, 14]
    # Every manifest weighted: relative shares of an epoch as long as all lines together.
    assert epoch_counts(spec(Source("a", 30), Source("b", 10), step=4, rule=ORDER_RULE)).tolist() == [30, 10]
    assert epoch_counts(spec(Source("a", 30, 1.0), Source("b", 10, 3.0), step=4)).tolist() == [10, 30]
    # Fewer lines than one step: an empty epoch, which the trainer refuses with a message.
    assert epoch_length(spec(Source("a", 5), step=8)) == 0


def test_sampler_spec_rejects_an_empty_manifest_and_round_trips() -> None:
    manifests = [ManifestSpec(Path("a.jsonl"), "am"), ManifestSpec(Path("b.jsonl"), None, 0.2)]
    with pytest.raises(UserError, match="b.jsonl: no usable line"):
        sampler_spec(manifests, [5, 0], seed=1, sort_window=4, step_samples=2)
    made = sampler_spec(manifests, [5, 7], seed=1, sort_window=4, step_samples=2)
    assert SamplerSpec.from_state_dict(made.state_dict()) == made
    with pytest.raises(UserError, match="data order rule 9 is unknown"):
        SamplerSpec.from_state_dict({**made.state_dict(), "rule": 9})


# --------------------------------------------------------------------------------------------- rule 2


def test_order_is_a_pure_function_of_seed_and_epoch() -> None:
    lengths = np.random.default_rng(3).integers(1, 100, 100)
    one = spec(Source("a", 100))
    order = epoch_order(one, lengths, 2)
    np.testing.assert_array_equal(order, epoch_order(one, lengths.copy(), 2))
    assert not np.array_equal(order, epoch_order(one, lengths, 3))
    assert not np.array_equal(order, epoch_order(spec(Source("a", 100), seed=4), lengths, 2))


def test_every_sample_is_drawn_over_the_epochs() -> None:
    """Issue 10: 20 samples, effective batch 8 — before, the same 4 longest were dropped every epoch."""
    lengths = np.arange(1, 21)
    one = spec(Source("a", 20), step=8, window=512)
    epochs = [epoch_order(one, lengths, e) for e in range(5)]  # 5 x 16 = 80 draws = 4 whole passes
    assert all(len(order) == 16 for order in epochs)
    assert Counter(np.concatenate(epochs).tolist()) == {i: 4 for i in range(20)}
    assert set(np.concatenate(epochs[:2]).tolist()) == set(range(20))  # the first 2 epochs already cover all


def test_steps_hold_similar_lengths_and_come_in_random_order() -> None:
    lengths = np.random.default_rng(7).permutation(np.arange(400))
    one = spec(Source("a", 400), step=8, window=400)
    steps = lengths[epoch_order(one, lengths, 0)].reshape(-1, 8)  # (50 steps, 8)
    assert all(np.all(np.diff(step) >= 0) for step in steps)  # sorted inside a step
    assert int((steps[:, -1] - steps[:, 0]).max()) < 50  # a step holds neighbours in length
    means = steps.mean(axis=1)
    assert 0 < int(np.sum(np.diff(means) > 0)) < len(means) - 1  # neither short→long nor long→short
    assert np.corrcoef(np.arange(len(means)), means)[0, 1] ** 2 < 0.2  # no curriculum over the epoch


@pytest.mark.parametrize("micro_batch", [2, 4])
@pytest.mark.parametrize("world_size", [1, 2])
def test_resume_with_another_micro_batch_or_world_size_continues_from_the_same_sample(
        micro_batch: int, world_size: int) -> None:
    lengths = np.random.default_rng(0).integers(1, 50, 45)
    mixed = spec(Source("a", 30), Source("b", 15, 0.25), step=8)
    order = epoch_order(mixed, lengths, 3).tolist()
    group = micro_batch * world_size
    for start in range(0, len(order), 8):  # a resume starts at a step boundary
        ranks = [list(ResumableBatchSampler(np.array(order), micro_batch=micro_batch, start_sample=start,
                                            world_size=world_size, rank=r)) for r in range(world_size)]
        merged = flatten([flatten(step) for step in zip(*ranks, strict=True)])
        assert merged == order[start:start + (len(order) - start) // group * group]


def test_drop_last_false_covers_every_sample() -> None:
    sampler = ResumableBatchSampler(np.arange(11), micro_batch=4, drop_last=False)
    batches = list(sampler)
    assert [len(b) for b in batches] == [4, 4, 3] and len(sampler) == 3
    assert len(ResumableBatchSampler(np.arange(11), micro_batch=4)) == 2


def test_weighted_mixing_draws_each_share_and_covers_each_manifest() -> None:
    # am: 60 lines drawn once per epoch; zh: 200 lines at 25% of the epoch (80 -> epoch 80, 20 of zh).
    lengths = np.random.default_rng(1).integers(1, 80, 260)
    mixed = spec(Source("am", 60, lang="am"), Source("zh", 200, 0.25), step=10)
    epochs = [epoch_order(mixed, lengths, e) for e in range(10)]
    for order in epochs:
        assert np.sum(order < 60) == 60 and np.sum(order >= 60) == 20
    zh = Counter(np.concatenate(epochs)[np.concatenate(epochs) >= 60].tolist())
    assert zh == {i: 1 for i in range(60, 260)}  # 10 epochs x 20 = one whole pass, no repeat
    am = Counter(np.concatenate(epochs)[np.concatenate(epochs) < 60].tolist())
    assert am == {i: 10 for i in range(60)}


def test_an_upsampled_manifest_repeats_only_across_passes() -> None:
    lengths = np.ones(24, dtype=np.int64)
    mixed = spec(Source("big", 20), Source("small", 4, 0.5), step=4)  # small: 20 of 40 per epoch = 5 passes
    order = epoch_order(mixed, lengths, 0)
    assert Counter(order[order >= 20].tolist()) == {20: 5, 21: 5, 22: 5, 23: 5}


def test_a_changed_dataset_is_refused() -> None:
    with pytest.raises(UserError, match="have 9 usable lines but the run's data order was made for 10"):
        epoch_order(spec(Source("a", 10)), np.ones(9), 0)


# --------------------------------------------------------------------------------------------- rule 1


def test_legacy_rule_keeps_the_order_old_runs_started_with() -> None:
    """Orders written by the code before rule 2 existed: a rule-1 checkpoint resumes in them."""
    recorded = json.loads((FIXTURES / "legacy_order_rule1.json").read_text())
    lengths = np.array(recorded["lengths"])
    legacy = spec(Source("a", len(lengths)), step=5, seed=recorded["seed"], window=recorded["sort_window"],
                  rule=LEGACY_RULE)
    for epoch, expected in enumerate(recorded["orders"]):
        order = epoch_order(legacy, lengths, epoch)
        assert order.tolist() == expected[:35]  # rule 1 drops the tail short of a step (37 -> 35)


@pytest.mark.slow  # a real training run of 4 steps: about 3 s
def test_a_checkpoint_from_before_order_rules_resumes_in_its_old_order(tmp_path, monkeypatch) -> None:
    """The format-1 fixture (step 4 of a run by main before rule 2) continues in rule 1's order, also
    into the next epoch, and records rule 1 for its later resumes."""
    from conftest import TINY_CONFIG, write_dataset

    from indextts_train.checkpoint.files import load_checkpoint
    from indextts_train.data.manifest import ManifestIndex
    from indextts_train.train import steps
    from indextts_train.train.loop import resolve_settings, train

    out = tmp_path / "run"
    out.mkdir()
    with gzip.open(FIXTURES / "format1_step4.pth.gz", "rb") as f:
        (out / "model_step4.pth").write_bytes(f.read())
    (out / "latest.pth").hardlink_to(out / "model_step4.pth")
    data = write_dataset(tmp_path / "data", 24, seed=1, name="train.jsonl")  # the fixture run's data
    seen = []

    def spy(order: np.ndarray, **kwargs) -> ResumableBatchSampler:
        seen.append((np.asarray(order).tolist(), kwargs["start_sample"]))
        return ResumableBatchSampler(order, **kwargs)

    monkeypatch.setattr(steps, "ResumableBatchSampler", spy)
    assert train(resolve_settings(train_manifests=[str(data)], output_dir=out, config=TINY_CONFIG, resume="auto",
                              max_steps=8, epochs=100, batch_size=2, grad_accumulation=2, effective_batch_size=4,
                              learning_rate=3e-3, warmup_steps=4, weight_decay=0.1, seed=11, log_interval=1,
                              tensorboard=False)) == 0
    lengths = ManifestIndex.build([data]).total_lengths
    # 24 samples, 4 a step: step 4 is sample 16 of epoch 0; steps 7-8 are epoch 1. Seed 11, window 512.
    assert seen == [(legacy_epoch_order(lengths, 11, 0, 512).tolist(), 16),
                    (legacy_epoch_order(lengths, 11, 1, 512).tolist(), 0)]
    assert load_checkpoint(out / "latest.pth")["sampler"]["rule"] == LEGACY_RULE


def test_a_rule_1_run_keeps_the_sort_window_it_started_with() -> None:
    """The default window grew (512 -> 4096) after rule 1; a rule-1 run's order depends on its window,
    so its resume takes the one in its stored config, not today's default."""
    from indextts_train.checkpoint.resumed import resumed_state, stored_sort_window
    from indextts_train.checkpoint.state import migrate
    from indextts_train.config.settings import TrainConfig

    with gzip.open(FIXTURES / "format1_step4.pth.gz", "rb") as f:
        fixture = torch.load(io.BytesIO(f.read()), weights_only=True)
    resumed = resumed_state(migrate(fixture), FIXTURES / "format1_step4.pth.gz", [])
    assert resumed.sampler is None  # rule 1: no sampler record
    assert TrainConfig().sort_window == 4096 and resumed.legacy_window(TrainConfig().sort_window) == 512
    assert stored_sort_window({"config": {}}) is None  # nothing stored: the flag
    nothing_stored = dataclasses.replace(resumed, sort_window=None)
    assert nothing_stored.legacy_window(TrainConfig(sort_window=64).sort_window) == 64


def test_another_spelling_of_the_same_manifest_is_no_change_of_the_mix(tmp_path, monkeypatch) -> None:
    """--from-run gives a recorded relative manifest back absolute: the same file is the same mix (the
    warning said to start a new run)."""
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "t.jsonl").write_text("{}\n")
    (tmp_path / "other").mkdir()
    saved = spec(Source("data/t.jsonl", 10, 1.0, "am"))
    monkeypatch.chdir(tmp_path)
    assert mix_change(saved, spec(Source(str(tmp_path / "data" / "t.jsonl"), 10, 1.0, "am"))) is None
    monkeypatch.chdir(tmp_path / "other")
    # from here the recorded name leads nowhere: the names differ, and that is said
    moved = mix_change(saved, spec(Source("../data/t.jsonl", 10, 1.0, "am")))
    assert "differ from the run's (data/t.jsonl::am@1)" in moved
    monkeypatch.chdir(tmp_path)
    assert mix_change(saved, spec(Source("data/t.jsonl", 10, 2.0, "am"))) is not None  # a new weight is a change
