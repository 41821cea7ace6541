"""The run's data (train/run_data.py): its manifests indexed for the model's family, which the weights
have settled by the time setup reads them."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from types import SimpleNamespace

import pytest

from indextts_train.errors import UserError
from indextts_train.text.languages import parse_borrowed
from indextts_train.train.run_data import RunData
from indextts_train.ui.run_settings import resolve_settings

ROOT = Path(__file__).resolve().parents[1]
V25_TINY = ROOT / "tests" / "data" / "reference" / "v2_5" / "tiny"  # the reference's IndexTTS-2.5 lines
V25_CONFIG = ROOT / "configs" / "tiny_v25.yaml"


def mixed_manifest(tiny_data: dict, folder: Path) -> tuple[Path, int]:
    """The tiny IndexTTS2 training lines, then one IndexTTS-2.5 line (a speaker vector, not latents)
    past the first lines that the checks before training read. (Indexing reads no array.)"""
    lines = tiny_data["train"].read_text().splitlines()
    other = json.loads(lines[0])
    other["prompt_spk_emb_path"] = other.pop("prompt_condition_path")
    manifest = folder / "mixed_families.jsonl"
    manifest.write_text("\n".join([*lines, json.dumps(other)]) + "\n")
    return manifest, len(lines) + 1


def test_a_line_of_the_other_family_is_refused_or_skipped_as_a_bad_line(tiny_data, tmp_path) -> None:
    manifest, line = mixed_manifest(tiny_data, tmp_path)
    said: list[str] = []
    log = SimpleNamespace(warn=said.append)
    strict = resolve_settings(train_manifests=[manifest], output_dir=tmp_path / "run", config=tiny_data["config"])
    assert strict.config.gpt.family.name == "IndexTTS2"
    with pytest.raises(UserError, match=f"mixed_families.jsonl:{line}: an IndexTTS-2.5 line, but the model is "
                                        "IndexTTS2"):
        RunData.read(strict, strict.config, log)
    skipping = resolve_settings(train_manifests=[manifest], output_dir=tmp_path / "run", config=tiny_data["config"],
                                skip_bad_lines=True)
    data = RunData.read(skipping, skipping.config, log)
    assert (len(data.index), data.index.skipped, data.index.family.name) == (line - 1, 1, "IndexTTS2")
    assert len(said) == 1 and said[0].startswith("skipped 1 bad manifest line(s)")
    assert f"mixed_families.jsonl:{line}: an IndexTTS-2.5 line" in said[0]
    dataset, validation = data.datasets(skipping.config)
    assert len(dataset) == line - 1 and validation is None


def test_a_validation_manifest_that_is_a_training_one_is_said(tiny_data, tmp_path) -> None:
    said: list[str] = []
    log = SimpleNamespace(warn=said.append)
    apart = resolve_settings(train_manifests=[tiny_data["train"]], val_manifests=[tiny_data["val"]],
                             output_dir=tmp_path / "run", config=tiny_data["config"])
    RunData.read(apart, apart.config, log)
    assert said == []
    link = tmp_path / "val.jsonl"
    link.symlink_to(tiny_data["train"])  # the same file by another name
    for val in (tiny_data["train"], link):
        same = resolve_settings(train_manifests=[tiny_data["train"]], val_manifests=[f"{val}::held"],
                                output_dir=tmp_path / "run", config=tiny_data["config"])
        RunData.read(same, same.config, log)
        assert said.pop() == (f"--val-manifest {val} is also a --train-manifest: validation would measure lines the "
                              "model trains on, not how it does on new ones; hold lines out for it (prepare writes "
                              "val.jsonl)")


def test_validation_lines_that_also_train_are_counted(tiny_data, tmp_path) -> None:
    """prepare's utterances.jsonl (every line) as --train-manifest with its val.jsonl: another file, the same
    utterances. Found by the codes file a line trains on, wherever the manifest sits (paths resolved)."""
    said: list[str] = []
    log = SimpleNamespace(warn=said.append)
    source = Path(tiny_data["train"]).parent
    trained = [json.loads(line) for line in Path(tiny_data["train"]).read_text().splitlines()[:2]]
    held = Path(tiny_data["val"]).read_text().splitlines()
    val_dir = Path(tiny_data["val"]).parent
    absolute = [{k: str(source / v) if k.endswith("_path") else v for k, v in obj.items()} for obj in trained]
    moved = [{k: str(val_dir / v) if k.endswith("_path") else v for k, v in json.loads(line).items()}
             for line in held]
    mixed = tmp_path / "elsewhere" / "val.jsonl"
    mixed.parent.mkdir()
    mixed.write_text("".join(json.dumps(obj) + "\n" for obj in [*moved, *absolute]))
    settings = resolve_settings(train_manifests=[tiny_data["train"]], val_manifests=[mixed],
                                output_dir=tmp_path / "run", config=tiny_data["config"])
    data = RunData.read(settings, settings.config, log)
    assert said == [f"2 of the {len(held) + 2} --val-manifest lines train too (the same codes file as a "
                    f"--train-manifest line; e.g. {mixed}:{len(held) + 1}): validation would measure lines the "
                    "model trains on; hold them out (prepare's train.jsonl leaves out its val.jsonl, its "
                    "utterances.jsonl holds every line)"]
    assert list(data.val_index.lines_also_in(data.index)) == [len(held), len(held) + 1]


def test_a_borrowed_language_no_training_line_is_in_is_refused(tmp_path) -> None:
    """--borrow-language kab=yo where no line is in kab changed nothing, yet the log and the export said kab
    was trained on yo's row: one line, from the flag or from the config; a line in kab lets it through."""
    shutil.copytree(V25_TINY, tmp_path / "tiny", ignore=shutil.ignore_patterns("*.pth"))
    manifest = tmp_path / "tiny" / "pairs.jsonl"  # en, ja, tr
    log = SimpleNamespace(warn=lambda line: None)
    base = {"train_manifests": [manifest], "output_dir": tmp_path / "run", "config": V25_CONFIG}
    typed = resolve_settings(**base, borrow_languages=["kab=yo"])
    with pytest.raises(UserError, match=r"^--borrow-language kab=yo: no --train-manifest line is in kab \(their "
                                        r"languages: en, ja, tr\), so kab would not be trained on the row of yo"):
        RunData.read(typed, typed.config, log)
    from_config = resolve_settings(**base, borrow_languages=["kab=yo"], typed=set(base))
    with pytest.raises(UserError, match=r"^train.borrow_languages 'kab=yo' \(the config's or the recorded run's\): "
                                        "no --train-manifest line is in kab"):
        RunData.read(from_config, from_config.config, log)
    lines = [json.loads(line) for line in manifest.read_text().splitlines()]
    lines[2].pop("lang_id")
    lines[2]["language"] = "Kab"  # as the index reads it: trimmed, any case
    manifest.write_text("".join(json.dumps(line) + "\n" for line in lines))
    data = RunData.read(typed, typed.config, log)
    assert data.index.lang_ids.tolist()[2] == parse_borrowed(["kab=yo"])["kab"]
