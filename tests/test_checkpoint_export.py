"""`indextts-train export`: train with a grown vocabulary, export, and load with IndexTTS2's strict key set.

The grown run is the tiny config at 150 text tokens fine-tuned from a 100-token base (base rows
frozen, weight decay on), so the export must show: the official keys in release order and shapes for
151 text rows, base rows and carried encoder tensors bit-identical to the base, a config.yaml that
says number_text_tokens 150, and the same losses as the training checkpoint it came from.
"""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml
from helpers import CheckpointReads, FaultyFolder, assert_refused, run_cli, tree_state
from test_checkpoint_files import make_state
from typer.testing import CliRunner

from indextts_train.checkpoint.export import _checked_tokenizer, _tokenizer_target
from indextts_train.checkpoint.files import load_checkpoint, save_checkpoint
from indextts_train.cli import app
from indextts_train.config.family import INDEXTTS2, INDEXTTS25
from indextts_train.config.settings import Config, GPTConfig, load_config
from indextts_train.errors import UserError
from indextts_train.model.gpt import UnifiedVoiceGPT
from indextts_train.model.layout import official_shapes, split_state_dict
from indextts_train.train.loop import resolve_settings, train

ROOT = Path(__file__).resolve().parents[1]
TINY = Path(__file__).resolve().parent / "data" / "reference" / "tiny"
TEXT_KEYS = ("text_embedding.weight", "text_head.weight", "text_head.bias")
INFERENCE_SECTIONS = {"dataset": {"bpe_model": "bpe.model", "sample_rate": 24000},
                      "semantic_codec": {"codebook_size": 8192, "hidden_size": 1024},
                      "s2mel": {"preprocess_params": {"sr": 22050}}, "vocoder": {"type": "bigvgan"}}


def cli(*args: object):
    result = CliRunner().invoke(app, [str(a) for a in args])
    assert result.exception is None or isinstance(result.exception, SystemExit), result.exception
    return result


def snapshot(folder: Path) -> dict[str, tuple[bytes, int]]:
    return {str(p.relative_to(folder)): (p.read_bytes(), p.stat().st_mtime_ns)
            for p in sorted(folder.rglob("*")) if p.is_file()}


@pytest.fixture(scope="module")
def grown_run(tiny_data, tmp_path_factory) -> dict:
    """2 steps at 150 text tokens from the 100-token base, weight decay 0.5 on: frozen rows must not move."""
    folder = tmp_path_factory.mktemp("grown")
    config = yaml.safe_load((ROOT / "configs" / "tiny.yaml").read_text())
    config["gpt"]["number_text_tokens"] = 150
    config.update(INFERENCE_SECTIONS)  # IndexTTS2's own sections: stored, and shipped by export
    config_path = folder / "grown.yaml"
    config_path.write_text(yaml.safe_dump(config))
    out = folder / "run"
    code = train(resolve_settings(train_manifests=[tiny_data["train"]], output_dir=out, config=config_path,
                              base_checkpoint=tiny_data["base"], batch_size=2, grad_accumulation=2,
                              effective_batch_size=4, num_workers=0, max_steps=2, epochs=10,
                              weight_decay=0.5, tensorboard=False))
    assert code == 0
    return {"checkpoint": out / "latest.pth", "run": out, "config": config_path, "base": tiny_data["base"],
            "val": tiny_data["val"]}


@pytest.fixture(scope="module")
def exported(grown_run, tmp_path_factory) -> dict:
    """The export made by the real entry point, with --config-out."""
    folder = tmp_path_factory.mktemp("export")
    before = snapshot(grown_run["run"])
    gpt, config = folder / "gpt.pth", folder / "config.yaml"
    proc = subprocess.run([sys.executable, "-m", "indextts_train", "export", str(grown_run["checkpoint"]),
                           "-o", str(gpt), "--config-out", str(config)],
                          capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert proc.returncode == 0 and proc.stderr == "", proc.stderr
    assert snapshot(grown_run["run"]) == before  # the run is untouched
    return {"gpt": gpt, "config": config, "stdout": proc.stdout}


@pytest.mark.slow  # `exported` runs the real entry point
def test_export_has_the_official_keys_order_and_shapes(grown_run, exported) -> None:
    step = load_checkpoint(grown_run["checkpoint"])["progress"]["step"]
    lines = exported["stdout"].splitlines()
    assert lines[0].startswith(f"exported {grown_run['checkpoint']} (step {step}")  # which step it exported
    assert lines[1:] == [
        f"wrote {exported['gpt']}: 184 tensors, text rows 151 (number_text_tokens 150), float32",
        f"wrote {exported['config']}"]
    weights = torch.load(exported["gpt"], map_location="cpu", weights_only=True)
    shapes = official_shapes(load_config(grown_run["config"]).gpt)
    assert list(weights) == list(shapes)  # the release key order, nothing more, nothing less
    assert {k: tuple(v.shape) for k, v in weights.items()} == shapes
    assert all(v.dtype == torch.float32 for v in weights.values())
    assert weights["text_embedding.weight"].shape[0] == 151
    # The shipped config builds a model that takes these weights strictly, as IndexTTS2's loader does.
    shipped = load_config(exported["config"]).gpt
    assert official_shapes(shipped) == shapes
    trained, _carried = split_state_dict(weights, shipped)
    UnifiedVoiceGPT(shipped, dropout=0.0).load_state_dict(trained, strict=True)


@pytest.mark.slow  # `exported` runs the real entry point
def test_export_config_names_the_grown_vocabulary(exported) -> None:
    config = yaml.safe_load(exported["config"].read_text())
    assert config["gpt"]["number_text_tokens"] == 150
    assert config["dataset"]["bpe_model"] == "bpe.model"
    assert config["gpt_checkpoint"] == "gpt.pth"
    assert "train" not in config  # our own section is not IndexTTS2's


@pytest.mark.slow  # `exported` runs the real entry point
def test_export_keeps_frozen_and_carried_tensors_bit_for_bit(grown_run, exported) -> None:
    base = torch.load(grown_run["base"], weights_only=True)
    weights = torch.load(exported["gpt"], weights_only=True)
    checkpoint = load_checkpoint(grown_run["checkpoint"])["model"]
    for key in TEXT_KEYS:
        assert torch.equal(weights[key][:100], base[key][:100]), key  # base ids, frozen
        assert torch.equal(weights[key][150], base[key][100]), key  # the old extra row, moved to the end
    trained, carried = split_state_dict(weights, load_config(grown_run["config"]).gpt)
    assert carried and all(torch.equal(v, base[k]) for k, v in carried.items())
    assert all(torch.equal(weights[k], checkpoint[k]) for k in weights)  # exactly the trained weights
    assert not torch.equal(trained["gpt.h.0.attn.c_attn.weight"], base["gpt.h.0.attn.c_attn.weight"])


@pytest.mark.slow  # `exported` runs the real entry point
def test_exported_gpt_pth_evaluates_like_the_checkpoint(grown_run, exported) -> None:
    def losses(checkpoint: Path, config: Path) -> dict:
        result = cli("evaluate", "--checkpoint", checkpoint, "--manifest", grown_run["val"],
                     "--config", config, "--batch-size", 4, "--json")
        assert result.exit_code == 0, result.output
        return json.loads(result.stdout)

    ours = losses(grown_run["checkpoint"], grown_run["config"])
    theirs = losses(exported["gpt"], exported["config"])
    assert ours["text_tokens"] == theirs["text_tokens"] == 150
    for key in ("text_loss", "mel_loss", "mel_top1", "loss"):
        assert math.isclose(ours[key], theirs[key], abs_tol=1e-6), key


def test_float16_export(grown_run, tmp_path) -> None:
    out = tmp_path / "gpt16.pth"
    result = cli("export", grown_run["checkpoint"], "-o", out, "--dtype", "float16")
    assert result.exit_code == 0 and result.stdout.strip().endswith("float16")
    weights = torch.load(out, weights_only=True)
    checkpoint = load_checkpoint(grown_run["checkpoint"])["model"]
    assert all(v.dtype == torch.float16 for v in weights.values())
    assert all(torch.equal(v, checkpoint[k].half()) for k, v in weights.items())
    assert sorted(p.name for p in tmp_path.iterdir()) == ["gpt16.pth"]  # no config unless asked


def test_export_into_an_indextts2_config_keeps_its_other_sections(grown_run, tmp_path) -> None:
    base = yaml.safe_load((TINY / "config.yaml").read_text())
    base["dataset"] = {"bpe_model": "bpe.model", "sample_rate": 24000, "squeeze": False}
    base["s2mel"] = {"preprocess_params": {"sr": 22050, "spect_params": {"n_fft": 1024, "hop_length": 256}}}
    base["semantic_codec"] = {"codebook_size": 8192, "hidden_size": 1024}
    base["vocoder"] = {"type": "bigvgan", "name": "nvidia/bigvgan_v2_22khz_80band_256x"}
    base_path = tmp_path / "config.yaml"
    base_path.write_text(yaml.safe_dump(base, sort_keys=False))
    before = base_path.read_bytes()
    out, config_out = tmp_path / "out" / "gpt_am.pth", tmp_path / "out" / "config.yaml"
    result = cli("export", grown_run["checkpoint"], "-o", out, "--config", base_path, "--config-out", config_out,
                 "--tokenizer-name", "am_bpe.model")
    assert result.exit_code == 0, result.output
    assert base_path.read_bytes() == before
    written = yaml.safe_load(config_out.read_text())
    for section in ("s2mel", "semantic_codec", "vocoder"):
        assert written[section] == base[section], section
    assert written["dataset"] == {"bpe_model": "am_bpe.model", "sample_rate": 24000, "squeeze": False}
    assert written["version"] == base["version"] and written["gpt_checkpoint"] == "gpt_am.pth"
    assert written["gpt"] == {**base["gpt"], "number_text_tokens": 150}
    assert list(torch.load(out, weights_only=True)) == list(official_shapes(load_config(config_out).gpt))


def test_export_reads_the_checkpoint_once(grown_run, tmp_path, monkeypatch) -> None:
    """A real checkpoint is several GB: one CRC pass and one load serve the checks, the stored config,
    the weights, the borrowed-rows notes and the provenance line."""
    reads = CheckpointReads(grown_run["checkpoint"]).install(monkeypatch)
    result = cli("export", grown_run["checkpoint"], "-o", tmp_path / "gpt.pth", "--config-out",
                 tmp_path / "config.yaml")
    assert result.exit_code == 0, result.output
    assert f"exported {grown_run['checkpoint']} (step 2" in result.stdout  # the provenance, from that read
    assert (reads.loads, reads.crc_passes) == (1, 1)


@pytest.mark.parametrize("case", ["onto the checkpoint", "onto its hard link", "config onto gpt.pth",
                                  "missing checkpoint", "unknown dtype", "a checkpoint's name",
                                  "a checkpoint's name for the config"])
def test_export_refusals_change_nothing(grown_run, tmp_path, case) -> None:
    run, checkpoint = grown_run["run"], grown_run["checkpoint"]
    step_file = next(run.glob("model_step*.pth"))
    assert os.path.samefile(step_file, checkpoint)  # latest.pth is a hard link of the newest step file
    args, needles = {
        "onto the checkpoint": ([checkpoint, "-o", checkpoint], ["refusing to overwrite an input"]),
        "onto its hard link": ([checkpoint, "-o", step_file], [step_file.name, "refusing to overwrite an input"]),
        "config onto gpt.pth": ([checkpoint, "-o", tmp_path / "g.pth", "--config-out", tmp_path / "g.pth"],
                                ["--config-out and -o are the same file"]),
        "missing checkpoint": ([run / "nope.pth", "-o", tmp_path / "g.pth"], ["nope.pth", "no such checkpoint"]),
        "unknown dtype": ([checkpoint, "-o", tmp_path / "g.pth", "--dtype", "int8"], ["--dtype int8"]),
        # a run in that folder would take it for one of its own, and refuse to save its step over it
        "a checkpoint's name": ([checkpoint, "-o", tmp_path / "model_step8.pth"],
                                ["-o", "model_step8.pth: a training checkpoint's name", "gpt.pth"]),
        "a checkpoint's name for the config": ([checkpoint, "-o", tmp_path / "g.pth", "--config-out",
                                               tmp_path / "best.pth"], ["--config-out", "best.pth"]),
    }[case]
    before = snapshot(run)
    result = cli("export", *args)
    assert result.exit_code == 2 and result.stdout == "" and "Traceback" not in result.output
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ")
    assert all(needle in lines[0] for needle in needles), lines[0]
    assert snapshot(run) == before
    assert not list(tmp_path.iterdir())


@pytest.mark.slow  # `exported` runs the real entry point
def test_export_without_config_ships_every_section_the_run_was_given(grown_run, exported) -> None:
    written = yaml.safe_load(exported["config"].read_text())
    for section in ("semantic_codec", "s2mel", "vocoder"):
        assert written[section] == INFERENCE_SECTIONS[section], section
    assert written["dataset"] == INFERENCE_SECTIONS["dataset"] and written["gpt_checkpoint"] == "gpt.pth"


def test_a_config_without_inference_sections_is_exported_with_a_note(tiny_data, tmp_path) -> None:
    result = cli("export", tiny_data["base"], "--config", tiny_data["config"], "-o", tmp_path / "gpt.pth",
                 "--config-out", tmp_path / "config.yaml")
    assert result.exit_code == 0, result.output
    assert (f"note: config.yaml has no semantic_codec, s2mel section(s): --config {tiny_data['config']} has none"
            in result.stdout)  # the note names the config given, and does not ask for the flag that was passed


def refused(args: list, *needles: str) -> str:
    result = cli("export", *args)
    assert result.exit_code == 2 and result.stdout == "" and "Traceback" not in result.output, result.output
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), lines
    assert all(needle in lines[0] for needle in needles), lines[0]
    return lines[0]


def test_an_existing_output_is_replaced_only_with_force(grown_run, tmp_path) -> None:
    target = tmp_path / "gpt.pth"
    target.write_bytes(b"the user's file")
    refused([grown_run["checkpoint"], "-o", target], str(target), "already exists", "--force")
    assert target.read_bytes() == b"the user's file" and sorted(p.name for p in tmp_path.iterdir()) == ["gpt.pth"]
    # --force replaces a file of the kind -o writes (a torch file: an earlier export), not any file typed there
    refused([grown_run["checkpoint"], "-o", target, "--force"], f"-o {target} exists and is not a torch file",
            "--force does not replace it")
    assert target.read_bytes() == b"the user's file"
    torch.save({"an earlier": torch.zeros(1)}, target)
    assert cli("export", grown_run["checkpoint"], "-o", target, "--force").exit_code == 0
    assert list(torch.load(target, weights_only=True)) == list(official_shapes(load_config(grown_run["config"]).gpt))


@pytest.mark.parametrize("name", ["mine.pth", "latest.pth"])
def test_a_training_checkpoint_is_never_replaced_even_with_force(grown_run, tmp_path, name) -> None:
    target = tmp_path / name
    target.write_bytes(grown_run["checkpoint"].read_bytes())  # a copy: not the input itself
    before = target.read_bytes()
    line = refused([grown_run["checkpoint"], "-o", target, "--force"], "is a training checkpoint", "even with --force")
    assert str(target.with_name(f"{target.stem}_export.pth")) in line  # another name suggested
    assert target.read_bytes() == before and sorted(p.name for p in tmp_path.iterdir()) == [name]


def test_a_failed_config_write_leaves_no_gpt_pth(grown_run, tmp_path, monkeypatch) -> None:
    (tmp_path / "locked").mkdir()
    FaultyFolder(tmp_path / "locked", read_only=True).install(monkeypatch)
    refused([grown_run["checkpoint"], "-o", tmp_path / "out" / "gpt.pth", "--config-out",
             tmp_path / "locked" / "config.yaml"], "could not write", "config.yaml", "nothing was written")
    assert sorted(p.name for p in tmp_path.rglob("*")) == ["locked"]  # no gpt.pth, no temp, no out/


@pytest.mark.parametrize("case", ["under a file", "a folder", "read-only folder"])
def test_an_output_that_cannot_be_a_file_is_one_line(grown_run, tmp_path, monkeypatch, case) -> None:
    (tmp_path / "plain.txt").write_text("x")
    (tmp_path / "dir").mkdir()
    if case == "read-only folder":
        FaultyFolder(tmp_path / "dir", read_only=True).install(monkeypatch)
    target, needle = {"under a file": (tmp_path / "plain.txt" / "gpt.pth", "is a file, not a folder"),
                      "a folder": (tmp_path / "dir", "is a folder"),
                      "read-only folder": (tmp_path / "dir" / "sub" / "gpt.pth", "could not write")}[case]
    refused([grown_run["checkpoint"], "-o", target], needle)
    assert sorted(str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*")) == ["dir", "plain.txt"]


def test_an_indextts2_tokenizer_is_checked_and_copied_under_the_config_name(grown_run, tmp_path) -> None:
    import sentencepiece as spm

    corpus = tmp_path / "corpus.txt"
    corpus.write_text("\n".join(f"word{i} tok{i * 7} piece{i % 13} text{i * 3}" for i in range(400)))
    for size in (150, 120):
        spm.SentencePieceTrainer.train(input=str(corpus), model_prefix=str(tmp_path / f"bpe{size}"),
                                       vocab_size=size, model_type="bpe", minloglevel=2)
    out = tmp_path / "out"
    refused([grown_run["checkpoint"], "-o", out / "gpt.pth", "--tokenizer", tmp_path / "bpe120.model"],
            "120 pieces", "150 text tokens")
    assert not out.exists()
    result = cli("export", grown_run["checkpoint"], "-o", out / "gpt.pth", "--config-out", out / "config.yaml",
                 "--tokenizer", tmp_path / "bpe150.model", "--tokenizer-name", "am_bpe.model")
    assert result.exit_code == 0, result.output
    assert (out / "am_bpe.model").read_bytes() == (tmp_path / "bpe150.model").read_bytes()
    assert yaml.safe_load((out / "config.yaml").read_text())["dataset"]["bpe_model"] == "am_bpe.model"


def test_a_tokenizer_name_that_would_change_nothing_is_refused(tmp_path) -> None:
    """--tokenizer-name names the --tokenizer copy and config.yaml's dataset.bpe_model (IndexTTS2).
    IndexTTS-2.5 inference opens one fixed name, so another one, or one with nothing to name, would
    change nothing: refused, not ignored. Left out, it is the family's own name."""
    tiktoken, spm, out = tmp_path / "grown.tiktoken", tmp_path / "am.model", tmp_path / "out" / "gpt.pth"
    tiktoken.write_text("")
    spm.write_bytes(b"")
    with pytest.raises(UserError, match=r"^--tokenizer-name am.model: it names .* neither is written"):
        _tokenizer_target(out, None, "am.model", None)
    assert _tokenizer_target(out, None, "am.model", out.parent / "config.yaml") is None
    with pytest.raises(UserError, match=rf"^--tokenizer-name grown.tiktoken: IndexTTS-2.5 inference opens its "
                                        rf"vocabulary as {INDEXTTS25.tokenizer_name}"):
        _tokenizer_target(out, tiktoken, "grown.tiktoken", None)
    for name in (None, INDEXTTS25.tokenizer_name):
        assert _tokenizer_target(out, tiktoken, name, None) == out.parent / INDEXTTS25.tokenizer_name
    assert _tokenizer_target(out, spm, None, None) == out.parent / INDEXTTS2.tokenizer_name == out.parent / "bpe.model"
    assert _tokenizer_target(out, spm, "am_bpe.model", None) == out.parent / "am_bpe.model"


@pytest.mark.slow  # the real entry point on a 2.5 checkpoint
def test_an_indextts25_export_refuses_a_tokenizer_name_before_writing(tiny25_data, tmp_path) -> None:
    """Without --tokenizer, the checkpoint says the family: the name is refused after its one read and
    before any write."""
    out = tmp_path / "out"
    refused([tiny25_data["base"], "--config", tiny25_data["config"], "-o", out / "gpt.pth",
             "--config-out", out / "config.yaml", "--tokenizer-name", "am.tiktoken"],
            "--tokenizer-name am.tiktoken", "leave --tokenizer-name out")
    assert not out.exists()
    result = cli("export", tiny25_data["base"], "--config", tiny25_data["config"], "-o", out / "gpt.pth",
                 "--config-out", out / "config.yaml")
    assert result.exit_code == 0, result.output
    assert "bpe_model" not in yaml.safe_load((out / "config.yaml").read_text()).get("dataset", {})


def test_a_grown_indextts25_export_needs_its_tiktoken() -> None:
    config = Config(gpt=GPTConfig(stated_family=INDEXTTS25))
    grown = {"vocab_plan": {"base_tokens": 320, "tokens": 370}}
    with pytest.raises(UserError, match=r"grew the vocabulary \(320 -> 370 tokens\).*needs --tokenizer"):
        _checked_tokenizer(None, 370, config, grown)
    assert _checked_tokenizer(None, 320, config, {"vocab_plan": {"base_tokens": 320, "tokens": 320}}) is None
    assert _checked_tokenizer(None, 150, Config(), {"vocab_plan": {"base_tokens": 100, "tokens": 150}}) is None


@pytest.mark.slow
def test_an_export_killed_between_its_renames_is_finished_by_the_same_command(grown_run, tmp_path) -> None:
    """A real SIGKILL after gpt.pth is renamed into place, before config.yaml: the same command, rerun
    without --force, ends with the pair an uninterrupted export writes and no temp or marker left."""
    def command(folder: Path, config_name: str = "config.yaml") -> list[object]:
        return ["export", grown_run["checkpoint"], "-o", folder / "gpt.pth", "--config-out", folder / config_name]

    out = tmp_path / "out"
    killed = run_cli(*command(out), env={"INDEXTTS_TRAIN_CRASH_AT": "export_renamed@1"})
    assert killed.returncode == -signal.SIGKILL
    temps = list(out.glob(".config.yaml.tmp-*"))  # the half-published pair this is about
    assert len(temps) == 1 and {p.name for p in out.iterdir()} - {temps[0].name} == {".gpt.pth.publishing", "gpt.pth"}
    before = tree_state(out)
    assert_refused(run_cli(*command(out, "other.yaml")), "killed while it published", "same command")
    assert tree_state(out) == before  # another command does not touch an unfinished export
    rerun = run_cli(*command(out))
    assert rerun.returncode == 0, rerun.stderr
    assert sorted(p.name for p in out.iterdir()) == ["config.yaml", "gpt.pth"]
    whole = run_cli(*command(tmp_path / "whole"))
    assert whole.returncode == 0, whole.stderr
    assert (out / "config.yaml").read_bytes() == (tmp_path / "whole" / "config.yaml").read_bytes()
    exported, reference = (torch.load(p / "gpt.pth", weights_only=True) for p in (out, tmp_path / "whole"))
    assert list(exported) == list(reference) and all(torch.equal(exported[k], reference[k]) for k in reference)


def test_an_export_over_a_killed_export_of_another_source_publishes_nothing_before_its_own_files(tmp_path) -> None:
    """An export of another source, killed among its renames, left gpt.pth renamed into place, config.yaml's new
    bytes in a temp file and the user's config.yaml (it had --force) still there. An export to the same outputs
    that fails, or is refused, publishes none of the killed one's files; one that succeeds writes its own pair."""
    good = save_checkpoint(make_state(2), tmp_path / "run", 2, keep=3)
    state = load_checkpoint(good)
    state["model"]["extra.weight"] = torch.zeros(3)  # read, then refused by the layout check
    bad = tmp_path / "bad.pth"
    torch.save(state, bad)
    out = tmp_path / "out"
    out.mkdir()
    gpt, config = out / "gpt.pth", out / "config.yaml"
    gpt.write_bytes(b"the killed export's gpt.pth")
    config.write_text("gpt: {the user's: config.yaml}\n")  # a YAML config: what --force may replace there
    (out / ".config.yaml.tmp-999999").write_text("the killed export's config.yaml\n")  # pid 999999: gone
    (out / ".gpt.pth.publishing").write_text(json.dumps({"pid": 999999, "files": [str(gpt), str(config)]}))
    before = tree_state(out)

    failed = cli("export", bad, "-o", gpt, "--config-out", config, "--force")
    assert failed.exit_code == 2 and "1 unexpected: extra.weight" in failed.stderr
    assert tree_state(out) == before
    unforced = cli("export", good, "-o", gpt, "--config-out", config)  # the user's config.yaml: --force needed
    assert unforced.exit_code == 2 and f"--config-out {config} already exists; pass --force" in unforced.stderr
    assert tree_state(out) == before
    done = cli("export", good, "-o", gpt, "--config-out", config, "--force")
    assert done.exit_code == 0, done.output
    assert sorted(p.name for p in out.iterdir()) == ["config.yaml", "gpt.pth"]
    whole = tmp_path / "whole"
    assert cli("export", good, "-o", whole / "gpt.pth", "--config-out", whole / "config.yaml").exit_code == 0
    assert config.read_bytes() == (whole / "config.yaml").read_bytes()
    exported, reference = (torch.load(p / "gpt.pth", weights_only=True) for p in (out, whole))
    assert list(exported) == list(reference) and all(torch.equal(exported[k], reference[k]) for k in reference)


@pytest.mark.slow
def test_a_rerun_removes_the_temp_files_of_killed_exports(grown_run, tmp_path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    (out / "mine.txt").write_text("mine")
    stale = [out / ".gpt.pth.tmp-999999", out / ".config.yaml.tmp-999999"]  # a kill while the temps were written
    for path in stale:
        path.write_bytes(b"half")
    done = run_cli("export", grown_run["checkpoint"], "-o", out / "gpt.pth", "--config-out", out / "config.yaml")
    assert done.returncode == 0, done.stderr
    assert sorted(p.name for p in out.iterdir()) == ["config.yaml", "gpt.pth", "mine.txt"]


def test_a_crafted_publishing_marker_is_one_line(tmp_path) -> None:
    """`.gpt.pth.publishing` nested 200,000 deep (json raises RecursionError) or holding a number of 5,000 digits
    was a traceback; it is the marker's one line, and the marker is left as it is."""
    from indextts_train.checkpoint.export import _interrupted, publishing_marker

    marker = publishing_marker(tmp_path / "gpt.pth")
    for text in ("[" * 200_000 + "]" * 200_000, '{"pid": ' + "9" * 5000 + ', "files": []}'):
        marker.write_text(text)
        with pytest.raises(UserError, match=r"\.gpt\.pth\.publishing: not a marker export wrote; remove it and rerun"):
            _interrupted(tmp_path / "gpt.pth", [tmp_path / "gpt.pth"])
        assert marker.read_text() == text


def test_what_export_source_says_of_a_path_that_is_no_checkpoint(tmp_path) -> None:
    """`export nothere --pick cer` said "nothere is a file"; a FIFO latest.pth with --pick latest said there was
    no latest.pth in the folder."""
    import os

    from indextts_train.checkpoint.export import export_source
    from indextts_train.errors import UserError

    with pytest.raises(UserError, match=f"--pick cer chooses a checkpoint inside a run folder, but {tmp_path / 'no'} "
                                        "does not exist"):
        export_source(tmp_path / "no", "cer")
    os.mkfifo(tmp_path / "latest.pth")
    with pytest.raises(UserError, match=f"{tmp_path / 'latest.pth'} is a FIFO \\(named pipe\\), not a file"):
        export_source(tmp_path, "latest")
    with pytest.raises(UserError, match="no best.pth in this folder"):
        export_source(tmp_path, "best")


def test_export_never_replaces_listens_scores(grown_run, tmp_path) -> None:
    """`export RUN --pick cer -o RUN/listen/scores.jsonl --force` replaced the history of what was heard."""
    scores = tmp_path / "listen" / "scores.jsonl"
    scores.parent.mkdir()
    scores.write_text('{"step": 2}\n')
    result = cli("export", grown_run["checkpoint"], "-o", scores, "--force")
    assert result.exit_code == 2 and "listen's scores of the run, which export never replaces" in result.output
    assert scores.read_text() == '{"step": 2}\n'


def test_a_tokenizer_that_is_no_file_is_said_as_what_it_is(grown_run, tmp_path) -> None:
    """A FIFO or a folder given as --tokenizer was "no such file"."""
    fifo, folder = tmp_path / "bpe.model", tmp_path / "tok"
    os.mkfifo(fifo)
    folder.mkdir()
    refused([grown_run["checkpoint"], "-o", tmp_path / "gpt.pth", "--tokenizer", fifo], f"{fifo}", "FIFO")
    refused([grown_run["checkpoint"], "-o", tmp_path / "gpt.pth", "--tokenizer", folder], f"{folder}", "folder")
    refused([grown_run["checkpoint"], "-o", tmp_path / "gpt.pth", "--tokenizer", tmp_path / "none.model"],
            "tokenizer not found; pass the tokenizer the run trained with")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bpe.model", "tok"]
