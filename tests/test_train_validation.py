"""Validation per language: groups, per-group losses equal to `evaluate` alone, the forgetting limit."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from conftest import write_dataset

from indextts_train.checkpoint.base import load_base_checkpoint
from indextts_train.checkpoint.files import is_milestone
from indextts_train.config.metric_names import parse_forgetting_limit
from indextts_train.config.settings import load_config
from indextts_train.data.manifest import ManifestDataset, ManifestIndex
from indextts_train.data.sampling import parse_manifest_spec
from indextts_train.errors import UserError
from indextts_train.model.gpt import UnifiedVoiceGPT
from indextts_train.train.best import BestTracker, check_metric, metric_value
from indextts_train.train.evaluate import evaluate_checkpoint
from indextts_train.train.validation import (
    check_limit_groups,
    describe,
    evaluate_groups,
    forgetting_breaches,
    scalars,
)


def with_language(manifest: Path, languages: list[str | None]) -> Path:
    """The manifest with a `language` field per line (None: no field)."""
    lines = [json.loads(line) for line in manifest.read_text().splitlines()]
    for line, language in zip(lines, languages, strict=True):
        if language is not None:
            line["language"] = language
    out = manifest.with_name(manifest.stem + "_lang.jsonl")
    out.write_text("".join(json.dumps(line) + "\n" for line in lines))
    return out


@pytest.fixture(scope="module")
def two_languages(tmp_path_factory) -> dict:
    folder = tmp_path_factory.mktemp("val_langs")
    return {"am": write_dataset(folder, 7, seed=11, name="am.jsonl"),
            "zh": write_dataset(folder, 5, seed=12, name="zh.jsonl")}


def index_of(values: list[str]) -> tuple[ManifestIndex, list]:
    specs = [parse_manifest_spec(value, "--val-manifest") for value in values]
    return ManifestIndex.build([spec.path for spec in specs]), specs


def test_groups_come_from_the_suffix_then_the_language_field_then_the_file(two_languages) -> None:
    index, specs = index_of([f"{two_languages['am']}::am", str(two_languages["zh"])])
    assert {k: v.tolist() for k, v in index.group_lines(specs).items()} == {
        "am": list(range(7)), "zh": list(range(7, 12))}  # zh: the file name, no language known
    mixed = with_language(two_languages["am"], ["en", None, "en", "de/AT", None, None, "en"])
    index, specs = index_of([str(mixed)])
    assert {k: v.tolist() for k, v in index.group_lines(specs).items()} == {
        "en": [0, 2, 6], "am_lang": [1, 4, 5], "de_AT": [3]}


def test_each_group_equals_evaluate_on_its_manifest_alone(tiny_data, two_languages) -> None:
    config = load_config(tiny_data["config"])
    trained, _, tokens = load_base_checkpoint(tiny_data["base"], config.gpt)
    config.gpt.number_text_tokens = tokens
    model = UnifiedVoiceGPT(config.gpt, dropout=0.0)
    model.load_state_dict(trained)
    model.train()  # validation runs inside training: evaluate must switch to eval mode and back
    index, specs = index_of([f"{two_languages['am']}::am", f"{two_languages['zh']}::zh"])
    result = evaluate_groups(model, ManifestDataset(index), index.group_lines(specs), batch_size=3,
                             config=config, device=torch.device("cpu"))
    assert model.training
    for lang in ("am", "zh"):
        alone = evaluate_checkpoint(tiny_data["base"], [two_languages[lang]], tiny_data["config"], batch_size=3)
        assert {k: alone[k] for k in result["groups"][lang]} == result["groups"][lang]  # exact, not approx
    groups = result["groups"]
    assert result["total"]["samples"] == 12
    assert min(g["mel_loss"] for g in groups.values()) < result["total"]["mel_loss"] < max(
        g["mel_loss"] for g in groups.values())
    assert set(scalars(result)) >= {"loss", "am/loss", "zh/mel_top1"}
    one = evaluate_groups(model, ManifestDataset(index), {"all": torch.arange(12).numpy()}, batch_size=3,
                          config=config, device=torch.device("cpu"))
    assert one["groups"] == {}  # a single group is only the total


def result_of(total: float, **groups: float) -> dict:
    def losses(x: float) -> dict:
        return {"loss": x, "text_loss": x, "mel_loss": x, "mel_top1": 0.5, "samples": 4}
    return {"total": losses(total), "groups": {k: losses(v) for k, v in groups.items()}}


def test_forgetting_limit_against_the_base_model() -> None:
    base = result_of(3.0, am=4.0, zh=2.0)
    assert parse_forgetting_limit("5") == {None: 5.0}
    assert parse_forgetting_limit("zh=5, en-US=2.5") == {"zh": 5.0, "en-US": 2.5}
    for bad in ("", "five", "zh=", "=5", "-1", "zh=nan"):
        with pytest.raises(UserError, match="--forgetting-limit"):
            parse_forgetting_limit(bad)
    now = result_of(2.5, am=2.9, zh=2.12)  # am improves a lot, zh is 6% worse than the base model
    assert forgetting_breaches(now, base, {None: 10}) == []
    assert forgetting_breaches(now, base, {None: 5}) == [
        "zh loss 2.1200 is +6.0% over the base model's 2.0000 (limit 5%)"]
    assert forgetting_breaches(now, base, {"am": 0}) == []
    assert forgetting_breaches(result_of(3.3), result_of(3.0), {None: 5})[0].startswith("total loss 3.3000 is +10.0%")
    check_limit_groups({"zh": 5}, ["am", "zh"])
    with pytest.raises(UserError, match="'en', which is not a validation group"):
        check_limit_groups({"en": 5}, ["am", "zh"])
    line = describe(40, now, base)
    assert line.startswith("val step 40: loss 2.5000") and "(-16.7% vs base)" in line
    assert line.endswith("| am 2.9000 (-27.5%) zh 2.1200 (+6.0%)")
    assert "vs base" not in describe(0, base, base)


def test_best_tracker_milestones_and_patience() -> None:
    tracker = BestTracker()
    assert [tracker.update(v, s) for s, v in ((10, 3.0), (20, 2.5), (30, 2.7), (40, 2.6))] == [
        True, True, False, False]
    assert (tracker.step, tracker.value, tracker.stale) == (20, 2.5, 2)
    assert tracker.patience_spent(2) and not tracker.patience_spent(3) and not tracker.patience_spent(0)
    assert not tracker.update(1.0, 50, eligible=False) and tracker.step == 20  # over the forgetting limit
    restored = BestTracker.from_state_dict(tracker.state_dict(), "loss")
    assert restored == tracker
    assert BestTracker.from_state_dict(tracker.state_dict(), "mel_loss") == BestTracker("mel_loss")
    assert [s for s in range(0, 101, 10) if is_milestone(s, 25)] == [50, 100]
    assert not any(is_milestone(s, 0) for s in range(1, 10))
    check_metric("zh/mel_loss", ["am", "zh"])
    for bad in ("top1", "mel_top1", "en/loss", "zh/"):
        with pytest.raises(UserError, match="--best-metric"):
            check_metric(bad, ["am", "zh"])
    assert metric_value(result_of(3.0, zh=2.0), "zh/loss") == 2.0
