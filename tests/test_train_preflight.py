"""A start that is going to fail says so in one line before the hardware plan, exits 2, and leaves
the file system as it found it."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import yaml
from helpers import CheckpointReads
from typer.testing import CliRunner

from indextts_train.checkpoint.run_folder import check_output_dir
from indextts_train.cli import app
from indextts_train.config.run_inputs import config_beside, config_choice
from indextts_train.config.settings import DEFAULT_CONFIG, load_config
from indextts_train.data.checkdata import SAMPLE_LINES
from indextts_train.errors import UserError
from indextts_train.train.preflight import check_inputs
from indextts_train.train.runlock import first_missing
from indextts_train.ui.run_settings import resolve_settings

PLAN_WORDS = "micro-batch"  # the first line of the hardware plan says it


def snapshot(folder: Path) -> dict[str, int]:
    """Every path under `folder` with its size: what a refused start must leave as it was."""
    return {str(p.relative_to(folder)): (p.stat().st_size if p.is_file() else -1) for p in folder.rglob("*")}


def start(tiny_data: dict, out: Path, *extra: str, manifest: Path | None = None) -> tuple[int, str]:
    args = ["train", "--train-manifest", str(manifest or tiny_data["train"]), "--config", str(tiny_data["config"]),
            "--base-checkpoint", str(tiny_data["base"]), "--output-dir", str(out), "--max-steps", "1", *extra]
    result = CliRunner().invoke(app, args)
    return result.exit_code, result.output


def bad_ids_manifest(tiny_data: dict, folder: Path, line_no: int, *, repeat: int = 1) -> Path:
    """The training manifest (repeated `repeat` times) with line `line_no` holding text id 5000 (the
    vocabulary is 100); its paths made absolute, as the copy lives in another folder."""
    source = Path(tiny_data["train"]).parent
    objs = [json.loads(line) for line in Path(tiny_data["train"]).read_text().splitlines()] * repeat
    objs = [{k: str(source / v) if k.endswith("_path") else v for k, v in obj.items()} for obj in objs]
    np.save(folder / "bad_text.npy", np.array([3, 5000, 4], dtype=np.int32))
    objs[line_no - 1] = {**objs[line_no - 1], "target_text_ids_path": str(folder / "bad_text.npy"),
                         "target_text_len": 3}
    manifest = folder / "bad.jsonl"
    manifest.write_text("".join(json.dumps(obj) + "\n" for obj in objs))
    return manifest


@pytest.mark.parametrize("what", ["manifest", "base", "layout", "tokenizer", "ids", "earlier_run", "family",
                                  "speaker_proj", "borrow", "val_interval", "listen_lines", "batch", "listen_device"])
def test_a_bad_start_is_one_line_before_the_plan_and_creates_nothing(tiny_data, tmp_path, what) -> None:
    inputs = tmp_path / "inputs"
    inputs.mkdir()
    manifest, extra = None, []
    if what == "manifest":
        manifest = inputs / "missing.jsonl"
    elif what == "base":
        extra = ["--base-checkpoint", str(inputs / "missing_gpt.pth")]
    elif what == "layout":  # a base checkpoint of another model size: its keys are checked, not only its path
        deeper = yaml.safe_load(Path(tiny_data["config"]).read_text())
        deeper["gpt"]["layers"] += 1
        (inputs / "deeper.yaml").write_text(yaml.safe_dump(deeper))
        extra = ["--config", str(inputs / "deeper.yaml")]
    elif what == "tokenizer":
        extra = ["--tokenizer", str(inputs / "missing.model")]
    elif what == "earlier_run":  # checkpoints of another run in the folder, and no --resume
        (tmp_path / "runs" / "am").mkdir(parents=True)
        (tmp_path / "runs" / "am" / "model_step5.pth").write_bytes(b"a run's checkpoint")
    elif what == "family":  # a 2.5 vocabulary with the IndexTTS2 base checkpoint
        (inputs / "am.tiktoken").write_text("YQ== 0\n")
        extra = ["--tokenizer", str(inputs / "am.tiktoken")]
    elif what in ("speaker_proj", "borrow"):  # IndexTTS-2.5's settings for an IndexTTS2 model: they changed nothing
        extra = ["--train-speaker-proj"] if what == "speaker_proj" else ["--borrow-language", "kab=yo"]
    elif what in ("val_interval", "listen_lines"):  # read at validations, and there is no --val-manifest
        extra = [f"--{what.replace('_', '-')}", "5"]
    elif what == "batch":  # 4 x 4 makes 16: the plan took them and dropped the 8 asked for, with a note
        extra = ["--batch-size", "4", "--grad-accumulation", "4", "--effective-batch-size", "8"]
    elif what == "listen_device":  # each listener failed with it, said in RUN/listen/listen.log after the run
        extra = ["--listen-every", "1", "--listen-device", "gpu"]
    else:
        manifest = bad_ids_manifest(tiny_data, inputs, line_no=3)
    before = snapshot(tmp_path)
    code, output = start(tiny_data, tmp_path / "runs" / "am", *extra, manifest=manifest)
    assert code == 2
    lines = output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and PLAN_WORDS not in output, output
    needle = {"manifest": "missing.jsonl: manifest not found", "base": "--base-checkpoint",
              "layout": "does not match the IndexTTS2 GPT layout", "tokenizer": "--tokenizer",
              "ids": "bad.jsonl:3: target_text_ids_path holds id 5000",
              "earlier_run": "already holds checkpoints (model_step5.pth); pass --resume auto",
              "family": "am.tiktoken: an IndexTTS-2.5 .tiktoken vocabulary, but --base-checkpoint",
              "speaker_proj": "--train-speaker-proj is for an IndexTTS-2.5 model, and this run's is IndexTTS2 "
                              "(--base-checkpoint",
              "borrow": "--borrow-language is for an IndexTTS-2.5 model, and this run's is IndexTTS2",
              "val_interval": "--val-interval is read at validations only, and this start has no --val-manifest",
              "listen_lines": "--listen-lines is read at validations only, and this start has no --val-manifest",
              "batch": "--effective-batch-size 8 does not match --batch-size 4 x --grad-accumulation 4 x 1 "
                       "process(es) = 16",
              "listen_device": "--listen-device gpu: not a device the listener runs on"}[what]
    assert needle in lines[0]
    assert snapshot(tmp_path) == before  # no runs/, no runs/am, no train.lock, no log


def test_a_refusal_after_the_folder_was_claimed_takes_it_back(tiny_data, tmp_path) -> None:
    """--early-stop-patience without validation is found while the data is read (after the lock):
    the folders, lock and log this start made go again; a folder that was there stays as it was, and
    a run folder's own train.log gets the refusal."""
    code, output = start(tiny_data, tmp_path / "new" / "run", "--early-stop-patience", "2")
    assert code == 2 and "pass --val-manifest" in output
    assert not (tmp_path / "new").exists()
    kept = tmp_path / "kept"
    kept.mkdir()
    (kept / "notes.txt").write_text("mine")
    code, _ = start(tiny_data, kept, "--early-stop-patience", "2")
    assert code == 2 and sorted(p.name for p in kept.iterdir()) == ["notes.txt"]
    (kept / "train.log").write_text("=== start 2026-11-27 10:00:00 +0000: train-gpt ...\n")  # an earlier start's
    code, _ = start(tiny_data, kept, "--early-stop-patience", "2")
    assert code == 2 and sorted(p.name for p in kept.iterdir()) == ["notes.txt", "train.log"]
    assert "error: --early-stop-patience" in (kept / "train.log").read_text()  # the refusal is in the run's log


def test_the_sample_is_the_head_of_each_manifest(tiny_data, tmp_path) -> None:
    """SAMPLE_LINES lines are read, no more: a bad line just past them is the run's to find; within
    them it is refused, unless --skip-bad-lines hands such lines to the run."""
    config = load_config(tiny_data["config"])
    repeat = SAMPLE_LINES // 24 + 1
    for line_no, refused in ((SAMPLE_LINES, True), (SAMPLE_LINES + 1, False)):
        options = resolve_settings(output_dir=tmp_path / "run",
                                   train_manifests=[str(bad_ids_manifest(tiny_data, tmp_path, line_no, repeat=repeat))])
        if refused:
            with pytest.raises(UserError, match=f"bad.jsonl:{line_no}: target_text_ids_path holds id 5000"):
                check_inputs(options, config)
        else:
            check_inputs(options, config)
    options = resolve_settings(train_manifests=[str(bad_ids_manifest(tiny_data, tmp_path, 1))],
                               output_dir=tmp_path / "run", skip_bad_lines=True)
    check_inputs(options, config)


def test_the_heads_of_every_manifest_are_read_before_the_first_bad_line_is_refused(tiny_data, tmp_path) -> None:
    """The refusals keep check-data's order: an empty manifest named after a bad line is refused first."""
    config = load_config(tiny_data["config"])
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    options = resolve_settings(output_dir=tmp_path / "run",
                               train_manifests=[str(bad_ids_manifest(tiny_data, tmp_path, 1)), str(empty)])
    with pytest.raises(UserError, match=f"^{empty}: manifest is empty: it holds no line"):
        check_inputs(options, config)
    good = str(tiny_data["train"])
    options = resolve_settings(output_dir=tmp_path / "run", train_manifests=[good], val_manifests=[str(empty)])
    with pytest.raises(UserError, match=f"^{empty}: manifest is empty: it holds no line \\(pass"):  # no "train on"
        check_inputs(options, config)


@pytest.mark.slow
def test_config_defaults_to_the_official_one_beside_the_base_checkpoint(tiny_data, tmp_path) -> None:
    folder = tmp_path / "checkpoints"
    folder.mkdir()
    base = folder / "gpt.pth"
    base.write_bytes(Path(tiny_data["base"]).read_bytes())
    official = yaml.safe_load(Path(tiny_data["config"]).read_text())
    (folder / "config.yaml").write_text(yaml.safe_dump({**official, "gpt_checkpoint": "gpt.pth"}))
    settings = resolve_settings(train_manifests=[str(tiny_data["train"])], output_dir=tmp_path / "run",
                                base_checkpoint=base)
    line = settings.config_note
    assert settings.config.source == str(folder / "config.yaml") and line.startswith("--config not given: using")
    assert config_choice(None, base) == (folder / "config.yaml", line)
    assert config_beside(folder / "other.pth")[0] is None  # gpt_checkpoint names another file
    default = resolve_settings(train_manifests=["x"], output_dir=tmp_path)
    assert (default.config.source, default.config_note) == (str(DEFAULT_CONFIG), None)
    # A folder config.yaml that does not name the checkpoint is not taken, and the first line says why.
    (folder / "config.yaml").write_text(yaml.safe_dump(official))
    settings = resolve_settings(train_manifests=[str(tiny_data["train"])], output_dir=tmp_path / "run",
                                base_checkpoint=base)
    path, line = Path(settings.config.source), settings.config_note
    assert config_choice(None, base) == (path, line)
    assert path == DEFAULT_CONFIG and line == (
        f"--config not given: using {DEFAULT_CONFIG} (the full-size IndexTTS2), not {folder / 'config.yaml'}: its "
        "gpt_checkpoint is not 'gpt.pth', so it is not taken as that checkpoint's official config; pass --config "
        "for another size")
    (folder / "config.yaml").write_text(yaml.safe_dump({**official, "gpt_checkpoint": "gpt.pth"}))
    result = CliRunner().invoke(app, ["train", "--train-manifest", str(tiny_data["train"]), "--base-checkpoint",
                                      str(base), "--output-dir", str(tmp_path / "run"), "--max-steps", "1"])
    assert result.exit_code == 0 and result.output.splitlines()[0].endswith(
        f"--config not given: using {folder / 'config.yaml'}, the config.yaml of --base-checkpoint's model folder")


def test_one_error_prefix_for_a_bad_setting(tiny_data, tmp_path) -> None:
    code, output = start(tiny_data, tmp_path / "run", "--learning-rate", "-1")
    assert code == 2 and output.strip() == "error: train.learning_rate (--learning-rate) must be > 0, got -1.0"
    bad = tmp_path / "bad.yaml"
    config = yaml.safe_load(Path(tiny_data["config"]).read_text())
    bad.write_text(yaml.safe_dump({**config, "train": {**config.get("train", {}), "seed": -3}}))
    code, output = start(tiny_data, tmp_path / "run", "--config", str(bad))
    assert code == 2 and output.strip() == f"error: {bad}: train.seed (--seed) must be >= 0, got -3"


def test_output_dir_checks_make_nothing(tmp_path) -> None:
    (tmp_path / "file").write_text("x")
    with pytest.raises(UserError, match="is a file"):
        check_output_dir(tmp_path / "file" / "run")
    check_output_dir(tmp_path / "a" / "b")
    assert not (tmp_path / "a").exists() and first_missing(tmp_path / "a" / "b") == tmp_path / "a"
    assert first_missing(tmp_path) is None


def test_a_start_reads_the_base_checkpoint_once(tiny_data, tmp_path, monkeypatch) -> None:
    """A real gpt.pth is 3.5 GB: one read (mmap, one CRC pass) serves the family, the checks before
    work and the weights (it was three reads: family, preflight, weights)."""
    reads = CheckpointReads(tiny_data["base"]).install(monkeypatch)
    code, output = start(tiny_data, tmp_path / "run")
    assert code == 0, output
    assert (reads.loads, reads.crc_passes) == (1, 1)


def test_a_start_refused_by_a_cheap_check_never_reads_the_base_checkpoint(tiny_data, tmp_path, monkeypatch) -> None:
    """Cheapest first: a missing manifest or an earlier run in the output folder costs a stat, so it is
    said before the base checkpoint's whole-file CRC pass (seconds for a real 3.5 GB gpt.pth)."""
    reads = CheckpointReads(tiny_data["base"]).install(monkeypatch)
    code, output = start(tiny_data, tmp_path / "run", manifest=tmp_path / "missing.jsonl")
    assert code == 2 and "missing.jsonl" in output
    earlier = tmp_path / "earlier"
    earlier.mkdir()
    shutil.copy(tiny_data["base"], earlier / "model_step2.pth")  # a file named as a run's checkpoint
    code, output = start(tiny_data, earlier)
    assert code == 2 and "--resume" in output, output
    assert (reads.loads, reads.crc_passes) == (0, 0)


def test_a_folder_given_for_a_file_is_said_with_the_files_meant(tiny_data, tmp_path) -> None:
    """A newcomer's wrong turn: the model or data folder where a file belongs. Said as a folder (not
    'not found'), with the files in it that could be meant."""
    folder = Path(tiny_data["train"]).parent
    model = tmp_path / "IndexTTS-2"
    model.mkdir()
    (model / "gpt.pth").write_bytes(b"")
    (model / "bpe.model").write_bytes(b"")
    cases = {("--tokenizer", str(model)): f"--tokenizer {model} is a folder; pass the tokenizer file in it (e.g. "
                                          f"{model / 'bpe.model'})",
             ("--base-checkpoint", str(model)): f"--base-checkpoint {model} is a folder; pass the checkpoint file in "
                                                f"it (e.g. {model / 'gpt.pth'})",
             ("--val-manifest", str(folder)): f"--val-manifest {folder} is a folder; pass the manifest file in it "
                                              "(e.g.",
             ("--resume", str(tmp_path)): f"--resume {tmp_path} is a folder; pass the checkpoint file in it"}
    for extra, said in cases.items():
        code, output = start(tiny_data, tmp_path / "runs" / "am", *extra)
        assert code == 2 and output.strip().splitlines() == [output.strip()] and said in output, output
    assert not (tmp_path / "runs").exists()


def test_clips_and_transcripts_given_as_a_manifest_say_to_run_prepare(tiny_data, tmp_path) -> None:
    """The newcomer's first wrong turn: the LJSpeech folder (or its metadata.csv, or a folder of WAVs) as
    --train-manifest. Said as a corpus, with the prepare command that makes the manifest, before any work."""
    clips = tmp_path / "LJSpeech-1.1"
    (clips / "wavs").mkdir(parents=True)
    (clips / "wavs" / "LJ001-0001.wav").write_bytes(b"RIFF")
    (clips / "metadata.csv").write_text("LJ001-0001|Printing|Printing\n")
    for given in (clips, clips / "metadata.csv", clips / "wavs"):
        code, output = start(tiny_data, tmp_path / "runs" / "am", manifest=given)
        assert code == 2 and output.strip().splitlines() == [output.strip()], output
        assert f"--train-manifest {given} is " in output and "a corpus for `indextts-train prepare`" in output
        assert "then pass FEATURES/train.jsonl" in output, output
    assert not (tmp_path / "runs").exists()


def test_a_model_or_features_folder_as_output_dir_is_refused_unless_a_run_is_there(tiny_data, tmp_path) -> None:
    """IndexTTS calls its model folder checkpoints/: a newcomer gives it as --output-dir. A new run is not
    started among a model's or prepared features' files; a run already there (made before) goes on."""
    model = tmp_path / "checkpoints"
    model.mkdir()
    (model / "gpt.pth").write_bytes(Path(tiny_data["base"]).read_bytes())
    (model / "config.yaml").write_text(Path(tiny_data["config"]).read_text())
    features = tmp_path / "prepared"
    features.mkdir()
    (features / "prepare.json").write_text("{}")
    clips = tmp_path / "LJSpeech-1.1"
    clips.mkdir()
    (clips / "metadata.csv").write_text("LJ001-0001|Printing|Printing\n")
    for folder, holds in ((model, "a model (gpt.pth, config.yaml)"), (features, "prepared features (prepare.json)"),
                          (clips, "an LJSpeech folder")):
        before = sorted(p.name for p in folder.iterdir())
        for resume in ((), ("--resume", "auto")):
            code, output = start(tiny_data, folder, *resume)
            assert code == 2 and output.strip() == (f"error: --output-dir {folder} holds {holds}, not a run: a run "
                                                    "writes its checkpoints, logs and run.yaml into a folder of its "
                                                    "own; pass a new one (e.g. --output-dir runs/am)"), output
        assert sorted(p.name for p in folder.iterdir()) == before
    code, output = start(tiny_data, tmp_path / "run")
    assert code == 0, output
    for name in ("model_step1.pth", "latest.pth"):  # a run made there by an earlier release
        (features / name).hardlink_to(tmp_path / "run" / name)
    code, output = start(tiny_data, features, "--resume", "auto")
    assert code == 0 and "nothing to do" in output, output


def test_a_family_stated_by_the_config_is_blamed_on_the_config(tiny_data, tmp_path) -> None:
    """An IndexTTS-2.5 config (version: 2.5) with IndexTTS2's base checkpoint and tokenizer: the line named
    the base checkpoint as IndexTTS-2.5, and the one file that was wrong, the config, not at all."""
    config = Path(tiny_data["config"]).parent / "tiny_v25.yaml"
    spm = Path(__file__).parent / "data" / "reference" / "prepare" / "text" / "bpe_tiny.model"
    options = resolve_settings(output_dir=tmp_path / "run", train_manifests=[str(tiny_data["train"])],
                               config=config, base_checkpoint=tiny_data["base"], tokenizer=spm)
    with pytest.raises(UserError, match=rf"^--tokenizer {spm}: an IndexTTS2 .*, but --config {config} is "
                                        r"IndexTTS-2.5"):
        check_inputs(options, load_config(config))


def test_settings_not_typed_are_not_judged_and_the_batch_counts_every_process(tiny_data, tmp_path,
                                                                               monkeypatch) -> None:
    """--val-interval from a config file or a recorded run (not typed) passes without --val-manifest; the
    effective batch is micro x accumulation x the processes torchrun started. Refused as the settings are
    resolved, before the inputs are read."""
    base = {"train_manifests": [str(tiny_data["train"])], "output_dir": tmp_path / "run", "config": tiny_data["config"]}

    def check(**values) -> None:
        settings = resolve_settings(**base, **values)
        check_inputs(settings, settings.config)

    check(val_interval=7, listen_lines=2, typed=set(base))
    with pytest.raises(UserError, match="--val-interval is read at validations only"):
        check(val_interval=7)
    batch = {"batch_size": 4, "grad_accumulation": 4, "effective_batch_size": 32}
    with pytest.raises(UserError, match="--effective-batch-size 32 does not match .* x 1 process"):
        check(**batch)
    for name, value in (("WORLD_SIZE", "2"), ("RANK", "0"), ("MASTER_ADDR", "127.0.0.1"), ("MASTER_PORT", "29500")):
        monkeypatch.setenv(name, value)  # as torchrun starts each process, before the group is set up
    check(**batch)  # 4 x 4 x 2 processes = 32
