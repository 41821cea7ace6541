"""Bad values, typed or read from a file, through the public commands (issue 29): one `error:` line naming
the flag, file, line or key, exit 2, no traceback, and nothing on disk created or changed.

The numeric cases are generated from the commands themselves: every int and float flag of every command
gets nan, inf, a negative and an absurdly large value (a new flag is covered without a new line here).
Text cases hold a NUL byte or a lone surrogate in a command-line word, a corpus field or a manifest
line; file cases hold NaN times (lhotse), a damaged Parquet page or a `run.yaml` with wrong types.
The tables run in this process through the entry point's own `run_app` (fast); a sample of each kind
runs in a fresh interpreter as a shell would start it (slow).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Annotated, get_args, get_origin, get_type_hints

import pytest
import typer
import yaml
from helpers import FaultyFolder

from indextts_train.cli import app, run_app
from indextts_train.cli_flags import plain_help
from indextts_train.prepare.tiny import write_synthetic_clips
from indextts_train.ui.run_record import RECORD_FORMAT

ROOT = Path(__file__).resolve().parents[1]
TINY_CONFIG = ROOT / "configs" / "tiny.yaml"
# Flags whose range has no upper end by design (config/settings.py says why): any finite learning rate is
# a valid request, and more data workers than CPUs are lowered with a warning.
NO_UPPER_END = {"--learning-rate", "--num-workers"}


def files_and_bytes(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


# The commands as the entry point builds them, built once: run_app takes it as it takes the Typer app
# (which builds this same group on every call, a quarter of a second each).
CLI = typer.main.get_command(plain_help(app))


def one_line(args: list[str], capsys, needle: str) -> str:
    """Run the command in this process: exit 2, exactly one `error:` line holding `needle`, no traceback."""
    assert run_app(CLI, [str(a) for a in args]) == 2, args
    captured = capsys.readouterr()
    lines = [line for line in captured.err.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), (args, lines, captured.out[-500:])
    assert needle in lines[0], (args[:2], needle, lines[0])
    return lines[0]


# ----------------------------------------------------------------------------- every numeric flag


def _flag(name: str, info) -> str:
    decls = [d for d in (info.param_decls or ()) if d.startswith("--")]
    return decls[0].split("/")[0] if decls else "--" + name.replace("_", "-")


def numeric_flags() -> list[tuple[str, str, type]]:
    """(command, flag, int or float) for every numeric flag of every command."""
    out = []
    for command in app.registered_commands:
        name = command.name or command.callback.__name__.replace("_", "-")
        hints = get_type_hints(command.callback, include_extras=True)  # cli.py's annotations are strings
        for parameter, annotation in hints.items():
            if get_origin(annotation) is not Annotated:
                continue
            kind, info = get_args(annotation)[:2]
            bare = {t for t in (get_args(kind) or (kind,)) if t is not type(None)}
            if bare in ({int}, {float}) and isinstance(info, typer.models.OptionInfo):
                out.append((name, _flag(parameter, info), bare.pop()))
    return out


def required_args(command: str, tmp: Path, tiny_data: dict) -> list[str]:
    """What each command needs besides the flag under test; outputs under `tmp/out`, which must stay absent."""
    out, manifest = tmp / "out", str(tiny_data["train"])
    return {
        "demo": [out],
        "prepare": [manifest, "--model-dir", tmp / "models", "--out", out, "--device", "cpu"],
        "evaluate": ["--checkpoint", tiny_data["base"], "--manifest", manifest],
        "repair": [tiny_data["base"], "-o", out / "r.pth"],
        "check-data": [manifest],
        "check-tokenizer": [tmp / "x.model"],
        "extend-tokenizer": ["--base", tmp / "x.model", "--corpus", manifest, "--target-size", "100",
                            "-o", out / "y.model"],
        "hardware": ["--config", TINY_CONFIG],
        "webui": ["--root", tmp],
        "listen": [tmp / "run"],
        "train": ["--train-manifest", manifest, "--config", TINY_CONFIG, "--output-dir", out, "--max-steps", "1"],
    }[command]


NUMERIC = numeric_flags()


def test_the_numeric_table_holds_every_command_with_numbers() -> None:
    commands = {command for command, _, _ in NUMERIC}
    assert {"prepare", "train", "demo", "evaluate", "hardware", "webui"} <= commands
    assert ("prepare", "--prompt-seconds", float) in NUMERIC and ("train", "--seed", int) in NUMERIC


@pytest.mark.parametrize(("command", "flag", "kind"), NUMERIC, ids=[f"{c} {f}" for c, f, _ in NUMERIC])
def test_every_numeric_flag_refuses_nan_inf_negative_and_huge(command, flag, kind, tiny_data, tmp_path,
                                                             capsys) -> None:
    base = [command, *required_args(command, tmp_path, tiny_data)]
    values = ["nan", "inf", "-1", "1e400", ""] if kind is float else ["-1", "nan", "1e3", "", "9" * 5000]
    if flag not in NO_UPPER_END:
        values.append(str(10**30))
    before = files_and_bytes(tmp_path)
    for value in values:
        line = one_line([*base, flag, value], capsys, flag)
        if kind is float and value in ("nan", "inf"):  # said as such, not as a bound it fails
            assert "finite number" in line, line
    assert files_and_bytes(tmp_path) == before and not (tmp_path / "out").exists()


# ----------------------------------------------------------------------------- text and files


def _jsonl(path: Path, lines: list[dict]) -> Path:
    path.write_text("".join(json.dumps(line) + "\n" for line in lines), encoding="utf-8")
    return path


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> Path:
    """Three real clips: a JSONL corpus whose lines the cases below spoil one field at a time."""
    folder = tmp_path_factory.mktemp("clips")
    return write_synthetic_clips(folder, [("one two", None), ("three four", None), ("five six", None)],
                                 speakers=2, seed=1, seconds=(0.6, 0.8))


def bad_corpora(corpus: Path, folder: Path) -> dict[str, tuple[Path, str]]:
    """Corpus files a careless or hostile source gives: (path, needle of the one line)."""
    folder.mkdir(parents=True, exist_ok=True)
    lines = [json.loads(line) for line in corpus.read_text().splitlines()]
    for line in lines:
        line["audio"] = str(corpus.parent / line["audio"])
    out = {}
    for field in ("id", "audio", "text", "speaker", "language"):
        for label, spoiled in (("NUL", "a\0b"), ("surrogate", "a\ud800b")):
            changed = [dict(line) for line in lines]
            changed[1][field] = changed[1].get(field, "") + spoiled
            out[f"{field} {label}"] = (_jsonl(folder / f"{field}_{label}.jsonl", changed), f":2: {field} ")
    lj = folder / "lj"
    (lj / "wavs").mkdir(parents=True)
    (lj / "metadata.csv").write_text("a|one two\0|\n", encoding="utf-8")
    out["LJSpeech NUL"] = (lj / "metadata.csv", "metadata.csv:1: text")
    return out


def library_corpora(corpus: Path, folder: Path) -> dict[str, tuple[Path, str]]:
    """lhotse manifests with NaN, infinite or negative times and a Parquet file with a damaged page."""
    folder.mkdir(parents=True, exist_ok=True)
    lines = [json.loads(line) for line in corpus.read_text().splitlines()]
    for line in lines:
        line["audio"] = str(corpus.parent / line["audio"])
    return {**_lhotse(lines, folder),
            "Parquet damaged page": (_damaged_parquet(lines, folder), "column 'text' cannot be read")}


def _lhotse(lines: list[dict], folder: Path) -> dict[str, tuple[Path, str]]:
    import soundfile

    recordings = []
    for line in lines:
        info = soundfile.info(line["audio"])
        recordings.append({"id": line["id"], "sources": [{"type": "file", "channels": [0], "source": line["audio"]}],
                           "sampling_rate": info.samplerate, "num_samples": info.frames,
                           "duration": info.frames / info.samplerate, "channel_ids": [0]})
    out = {}
    for key, value, needle in (("start", float("nan"), "start nan"), ("duration", float("inf"), "duration inf"),
                               ("start", -2.0, "start -2.0"), ("duration", float("nan"), "duration nan")):
        name = f"{key}_{value}"
        supervisions = [{"id": f"{line['id']}-s", "recording_id": line["id"], "start": 0.0, "duration": 0.5,
                         "channel": 0, "text": line["text"], "speaker": line["speaker"]} for line in lines]
        supervisions[1][key] = value
        _jsonl(folder / f"{name}_recordings.jsonl", recordings)
        out[f"lhotse {key} {value}"] = (_jsonl(folder / f"{name}_supervisions.jsonl", supervisions), needle)
    return out


def _damaged_parquet(lines: list[dict], folder: Path) -> Path:
    """A Parquet file whose `text` page header is garbage (its footer and the audio column intact)."""
    import datasets
    import pyarrow.parquet as pq

    path = folder / "damaged.parquet"
    audio = [{"bytes": Path(line["audio"]).read_bytes(), "path": None} for line in lines]
    datasets.Dataset.from_dict({"audio": audio, "text": [line["text"] for line in lines]}) \
        .cast_column("audio", datasets.Audio()).to_parquet(str(path))
    meta = pq.ParquetFile(str(path)).metadata.row_group(0)
    start = next(meta.column(i).data_page_offset for i in range(meta.num_columns)
                 if meta.column(i).path_in_schema == "text")
    data = bytearray(path.read_bytes())
    data[start + 2:start + 12] = bytes(b ^ 0x5A for b in data[start + 2:start + 12])
    path.write_bytes(bytes(data))
    return path


def prepare_refuses(cases: dict[str, tuple[Path, str]], tmp_path: Path, capsys) -> None:
    capsys.readouterr()  # datasets' progress bar while a Parquet file was written
    before = files_and_bytes(tmp_path)
    for name, (path, needle) in cases.items():
        line = one_line(["prepare", path, "--model-dir", tmp_path / "models", "--out", tmp_path / "out",
                         "--device", "cpu"], capsys, needle)
        assert str(path) in line, name
    assert files_and_bytes(tmp_path) == before and not (tmp_path / "out").exists()


def test_bad_corpus_values_are_named_by_file_line_and_field(corpus, tmp_path, capsys) -> None:
    prepare_refuses(bad_corpora(corpus, tmp_path / "in"), tmp_path, capsys)


@pytest.mark.slow  # lhotse and datasets take seconds to import
def test_nan_times_and_a_damaged_parquet_page_are_one_line(corpus, tmp_path, capsys) -> None:
    prepare_refuses(library_corpora(corpus, tmp_path / "in"), tmp_path, capsys)


@pytest.mark.parametrize("device", ["meta", "mps", "xla", "cuda:x", "cuda:-1", "", "cpu:0", "CUDA", "cuda:01",
                                    "cuda:99999999999999999999"])
def test_prepare_refuses_devices_it_cannot_run_on(device, corpus, tmp_path, capsys) -> None:
    one_line(["prepare", corpus, "--model-dir", tmp_path / "models", "--out", tmp_path / "out", "--device", device],
             capsys, "--device")
    assert list(tmp_path.iterdir()) == []


def test_undecodable_or_nul_words_on_the_command_line_are_named_by_flag(tiny_data, tmp_path, capsys) -> None:
    manifest = str(tiny_data["train"])
    cases = {
        ("prepare", f"{tmp_path}/\udcff.jsonl", "--model-dir", tmp_path, "--out", tmp_path / "o"): "argument 2",
        ("train", "--train-manifest", manifest, f"--output-dir={tmp_path}/\udcffrun"): "--output-dir",
        ("check-data", manifest, "--write-clean", "a\0b"): "--write-clean",
        ("tokenize", manifest, "--tokenizer", "t.model", "--out", "o\ud800"): "--out",
        ("prepare", manifest, "--model-dir", tmp_path, "--out", tmp_path / "o", "--speaker", "\udce9"): "--speaker",
    }
    for args, needle in cases.items():
        one_line(list(args), capsys, needle)
    assert list(tmp_path.iterdir()) == []


def test_bad_manifest_strings_stop_train_and_tokenize_names_the_line(tiny_data, tmp_path, capsys) -> None:
    lines = [json.loads(line) for line in Path(tiny_data["train"]).read_text().splitlines()]
    for line in lines:
        for key in [k for k in line if k.endswith("_path")]:
            line[key] = str(Path(tiny_data["train"]).parent / line[key])
    spoils = {"path NUL": ("target_codes_path", "x\0.npy"), "id surrogate": ("id", "\ud800"),
              "key surrogate": ("\udcff", 1), "text NUL": ("text", "a\0b")}
    for name, (key, value) in spoils.items():
        changed = [dict(line) for line in lines]
        changed[2][key] = value
        manifest = _jsonl(tmp_path / f"{name.replace(' ', '_')}.jsonl", changed)
        before = files_and_bytes(tmp_path)
        one_line(["train", "--train-manifest", manifest, "--config", TINY_CONFIG, "--output-dir", tmp_path / "run"],
                 capsys, f"{manifest}:3: field {key!r}")
        assert files_and_bytes(tmp_path) == before and not (tmp_path / "run").exists()


def test_tokenize_leaves_out_a_line_whose_text_is_not_utf8_and_says_which(tmp_path, capsys) -> None:
    lines = [{"id": f"u{i}", "target_text": text, "target_text_ids_path": "x.npy", "target_text_len": 1}
             for i, text in enumerate(["hello", "world", "a\ud800b", "again"])]
    manifest = _jsonl(tmp_path / "m.jsonl", lines)
    tokenizer = ROOT / "tests" / "data" / "reference" / "prepare" / "text" / "bpe_tiny.model"
    assert run_app(app, ["tokenize", str(manifest), "--tokenizer", str(tokenizer), "--out", str(tmp_path / "o"),
                         "--normalizer", "none"]) == 1  # some lines could not be encoded
    captured = capsys.readouterr()
    assert f"{manifest}:3: field 'target_text'" in captured.out and "Traceback" not in captured.err
    written = (tmp_path / "o" / "m.jsonl").read_text(encoding="utf-8").splitlines()
    assert [json.loads(line)["id"] for line in written] == ["u0", "u1", "u3"]


def test_bad_text_flags_are_refused_before_any_work(tiny_data, corpus, tmp_path, capsys) -> None:
    spm = ROOT / "tests" / "data" / "reference" / "prepare" / "text" / "bpe_tiny.model"
    export = ["export", tiny_data["base"], "--config", TINY_CONFIG, "-o", tmp_path / "out" / "gpt.pth"]
    cases = {
        (*export, "--tokenizer-name", "../bpe.model"): "--tokenizer-name '../bpe.model'",
        (*export, "--tokenizer-name", ""): "--tokenizer-name ''",
        (*export, "--tokenizer-name", "bpe\n.model"): "--tokenizer-name",
        (*export, "--tokenizer-name", "am.model"): "--tokenizer-name am.model: it names the tokenizer copy",
        ("check-tokenizer", spm, "--normalizer", "wetxt"): "--normalizer 'wetxt'",
        ("demo", tmp_path / "out", "--train-scope", "lroa"): "--train-scope 'lroa': choose one of full, partial, lora",
        ("demo", tmp_path / "out", "--resume", tmp_path / "nothing.pth"): "--resume",
        ("demo", tmp_path / "out", "--resume", ROOT / "configs"): "is a folder; pass the checkpoint file in it",
        ("hardware", "--config", TINY_CONFIG, "--assume", ""): "--assume",
        # IndexTTS-2.5's language flags for IndexTTS2 text: they changed nothing
        ("check-data", tiny_data["train"], "--tokenizer", spm, "--borrow-language", "kab=yo"):
            f"--borrow-language is for IndexTTS-2.5 .tiktoken text; {spm} is IndexTTS2's",
        ("tokenize", tiny_data["train"], "--tokenizer", spm, "--out", tmp_path / "tok", "--strict-language"):
            "--strict-language is for IndexTTS-2.5 .tiktoken text",
        # a flag read only beside another one, or for another form, would change nothing
        ("check-data", tiny_data["train"], "--force"): "--force lets --write-clean replace an existing file, and "
                                                       "no --write-clean is given",
        ("check-data", tiny_data["train"], "--normalizer", "none"): "--normalizer none presents text for a "
                                                                    "tokenizer's encoding, and none is at hand",
        ("check-tokenizer", spm, "--normalizer", "none"): "--normalizer none is read to present --sample-text",
        ("prepare", corpus, "--model-dir", tmp_path / "models", "--out", tmp_path / "p", "--text-column", "s"):
            "--text-column s names a column of a Hugging Face dataset, and no CORPUS is one",
        ("prepare", corpus, "--model-dir", tmp_path / "models", "--out", tmp_path / "p", "--val-speakers", "1",
         "--val-fraction", "0.3"): "--val-fraction 0.3 and --val-speakers 1: whole speakers are held out instead",
        # more speakers held out than the corpus names: refused before any model or audio is read (no model
        # folder here), where it was said only after every clip's features were computed
        ("prepare", corpus, "--model-dir", tmp_path / "models", "--out", tmp_path / "p", "--val-speakers", "5"):
            "--val-speakers 5: the corpus has only 1 speakers with two or more utterances",
        # a train: setting typed as a flag is named as the range checks name it: key, then flag
        ("train", "--train-manifest", tiny_data["train"], "--output-dir", tmp_path / "run", "--lora-targets",
         "foo"): "error: train.lora_targets (--lora-targets) foo: choose one or more of",
        ("train", "--train-manifest", tiny_data["train"], "--output-dir", tmp_path / "run", "--forgetting-limit",
         "foo"): "error: train.forgetting_limit (--forgetting-limit) foo: expected a percentage",
    }
    for args, needle in cases.items():
        one_line(list(args), capsys, needle)
    assert list(tmp_path.iterdir()) == []


def test_a_text_corpus_line_that_is_not_utf8_is_one_line(tmp_path, capsys) -> None:
    spm = ROOT / "tests" / "data" / "reference" / "prepare" / "text" / "bpe_tiny.model"
    corpus = _jsonl(tmp_path / "text.jsonl", [{"text": "hello"}, {"text": "a\ud800b"}, {"text": "x\0y"}])
    one_line(["extend-tokenizer", "--base", spm, "--corpus", corpus, "--target-size", "160", "-o",
              tmp_path / "out" / "new.model"], capsys, f'{corpus}:2: "text"')
    one_line(["check-tokenizer", spm, "--sample-text", corpus], capsys, f'{corpus}:2: "text"')
    assert not (tmp_path / "out").exists()


def test_a_number_of_thousands_of_digits_is_one_line(tiny_data, corpus, tmp_path, capsys) -> None:
    """Python refuses to convert an integer literal of more than 4300 digits (a ValueError, not a JSON or
    YAML error): in a manifest, a config, a run.yaml, a corpus or a text corpus it is one line."""
    huge = "9" * 5000
    line = Path(tiny_data["train"]).read_text().splitlines()[0]
    manifest = tmp_path / "m.jsonl"
    manifest.write_text(line.replace('"target_text_len": ', f'"target_text_len": {huge}, "x": ') + "\n")
    config = tmp_path / "c.yaml"
    config.write_text(TINY_CONFIG.read_text() + f"version: {huge}\n")
    record = tmp_path / "run.yaml"
    record.write_text(f"format: {RECORD_FORMAT}\noptions: {{}}\nseed: {huge}\n")
    clips = tmp_path / "clips.jsonl"
    clips.write_text(f'{{"audio": "{corpus.parent}/utt0000.wav", "text": "hi", "n": {huge}}}\n')
    texts = tmp_path / "texts.jsonl"
    texts.write_text(f'{{"text": "hello"}}\n{{"text": "world", "n": {huge}}}\n')
    spm = ROOT / "tests" / "data" / "reference" / "prepare" / "text" / "bpe_tiny.model"
    out = tmp_path / "out"
    cases = {
        ("train", "--train-manifest", manifest, "--config", TINY_CONFIG, "--output-dir", out): f"{manifest}:1",
        ("check-data", tiny_data["train"], "--config", config): str(config),
        ("train", "--from-run", record): str(record),
        ("prepare", clips, "--model-dir", tmp_path / "models", "--out", out, "--device", "cpu"): f"{clips}:1",
        ("extend-tokenizer", "--base", spm, "--corpus", texts, "--target-size", "160", "-o", out / "x.model"):
            f"{texts}:2",
    }
    before = files_and_bytes(tmp_path)
    for args, needle in cases.items():
        one_line(list(args), capsys, needle)
    assert files_and_bytes(tmp_path) == before and not out.exists()


# ----------------------------------------------------------------------------- --from-run


def run_record(tiny_data, tmp_path: Path) -> dict:
    return {"format": RECORD_FORMAT, "cwd": str(tmp_path),
            "options": {"train_manifests": [str(tiny_data["train"])], "output_dir": str(tmp_path / "run"),
                        "config": str(TINY_CONFIG), "resume": None, "amp": None, "on_vocab_change": "keep"},
            "config": {"train": {"epochs": 1, "max_steps": 1, "seed": 3}}}


FROM_RUN_SPOILS = {
    "a list for a number": (("config", "train", "epochs"), [1, 2], "config.train.epochs: expected int"),
    "a string for a bool": (("options", "amp"), "yes", "options.amp: expected bool"),
    "a number for the manifests": (("options", "train_manifests"), 5, "options.train_manifests"),
    "a mapping in the manifests": (("options", "train_manifests"), [{"a": 1}], "options.train_manifests"),
    "a number for resume": (("options", "resume"), 5, "options.resume"),
    "an unknown option": (("options", "overrides"), [1], "options.overrides: not a train-gpt setting"),
    "an unknown setting": (("config", "train", "epoch"), 1, "config.train.epoch: not a train-gpt setting"),
    "a list for the config": (("config",), [1], "config.train is not a mapping"),
    "a list for train": (("config", "train"), [1], "config.train is not a mapping"),
    "a list for cwd": (("cwd",), [1], "cwd not a folder name"),
    "a NUL in cwd": (("cwd",), "/tmp\0", "cwd not a folder name"),
    "a NaN seed": (("config", "train", "seed"), float("nan"), "config.train.seed: expected int"),
    "a NUL in a path": (("options", "config"), "a\0b", "options.config"),
    "a string for the betas": (("config", "train", "adam_betas"), "x", "config.train.adam_betas"),
}


def test_from_run_with_wrong_types_names_the_key(tiny_data, tmp_path, capsys) -> None:
    for name, (keys, value, needle) in FROM_RUN_SPOILS.items():
        record = run_record(tiny_data, tmp_path)
        holder = record
        for key in keys[:-1]:
            holder = holder[key]
        holder[keys[-1]] = value
        path = tmp_path / f"{len(list(tmp_path.iterdir()))}.yaml"
        path.write_text(yaml.safe_dump(record, allow_unicode=False))
        before = files_and_bytes(tmp_path)
        line = one_line(["train", "--from-run", path], capsys, needle)
        assert str(path) in line and files_and_bytes(tmp_path) == before, name
        assert not (tmp_path / "run").exists(), name


# ----------------------------------------------------------------------------- a full or read-only disk


@pytest.mark.slow  # the real model stages (conftest `tiny_models`): seconds a run
@pytest.mark.parametrize("fault", ["full at once", "full after a few files", "read-only"])
def test_prepare_on_a_full_or_read_only_disk_is_one_line_and_a_rerun_goes_on(fault, corpus, tmp_path, capsys,
                                                                             monkeypatch, tiny_models) -> None:
    disk = tmp_path / "disk"
    disk.mkdir()
    faulty = FaultyFolder(disk, capacity={"full at once": 0, "full after a few files": 3000}.get(fault),
                          read_only=fault == "read-only").install(monkeypatch)
    args = ["prepare", corpus, "--model-dir", tiny_models, "--out", disk / "prepared", "--device", "cpu",
            "--min-seconds", "0.1", "--prompt-seconds", "0.5", "--val-fraction", "0"]
    line = one_line(args, capsys, f"--out {disk / 'prepared'}: cannot ")  # write, or create it
    assert ("read-only" if fault == "read-only" else "no space left") in line.lower()
    assert not [p for p in disk.rglob("*") if ".tmp-" in p.name]  # no temp file left behind
    faulty.free, faulty.read_only = float("inf"), False  # room again
    assert run_app(app, [str(a) for a in args]) == 0, capsys.readouterr()
    assert len((disk / "prepared" / "utterances.jsonl").read_text().splitlines()) == 3


def writers(tiny_data, tmp_path: Path, disk: Path) -> dict[str, list]:
    """Every command that writes a file the user names, pointed into `disk`."""
    spm = ROOT / "tests" / "data" / "reference" / "prepare" / "text" / "bpe_tiny.model"
    corpus = tmp_path / "text.txt"
    corpus.write_text("hello world\nanother line of text\n", encoding="utf-8")
    texts = _jsonl(tmp_path / "texts.jsonl", [{"id": "u0", "target_text": "hello", "target_text_len": 1,
                                                "target_text_ids_path": "x.npy"}])
    return {
        "export": ["export", tiny_data["base"], "--config", TINY_CONFIG, "-o", disk / "gpt.pth"],
        "extend-tokenizer": ["extend-tokenizer", "--base", spm, "--corpus", corpus, "--target-size", "160",
                             "-o", disk / "new.model"],
        "tokenize": ["tokenize", texts, "--tokenizer", spm, "--out", disk / "tok"],
        "check-data --write-clean": ["check-data", tiny_data["train"], "--write-clean", disk / "clean.jsonl"],
        "demo": ["demo", disk / "demo"],
    }


@pytest.mark.parametrize("fault", ["full", "read-only"])
def test_every_writer_on_a_full_or_read_only_disk_is_one_line(fault, tiny_data, tmp_path, capsys,
                                                              monkeypatch) -> None:
    disk = tmp_path / "disk"
    disk.mkdir()
    commands = writers(tiny_data, tmp_path, disk)
    FaultyFolder(disk, capacity=0 if fault == "full" else None, read_only=fault == "read-only").install(monkeypatch)
    for name, args in commands.items():
        line = one_line(args, capsys, str(disk))  # the file or folder that could not be written
        words = ("read-only", "Read-only") if fault == "read-only" else ("disk full", "No space left")
        assert any(word in line for word in words), (name, line)
        assert not [p for p in disk.rglob("*") if p.is_file()], name  # no temp or half file left


# ----------------------------------------------------------------------------- as a shell starts it


def real_cli(args: list, cwd: Path) -> subprocess.Popen:
    """`indextts-train ARGS` started in a fresh interpreter; the caller collects it (`communicate`)."""
    return subprocess.Popen([sys.executable, "-m", "indextts_train", *args], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, cwd=cwd, env={**os.environ, "PYTHONUNBUFFERED": "1"})


@pytest.mark.slow
def test_a_sample_of_each_kind_in_a_fresh_interpreter(tiny_data, corpus, tmp_path) -> None:
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    bad = library_corpora(corpus, tmp_path / "in")
    prepare = ["prepare", "--model-dir", str(tmp_path / "models"), "--out", str(tmp_path / "out"), "--device"]
    train_args = ["train", "--train-manifest", str(tiny_data["train"]), "--config", str(TINY_CONFIG),
                  "--output-dir", str(tmp_path / "run")]
    cases = [  # refused by the parser, by the command, and (two) after the heavy imports
        ([*prepare, "cpu", str(corpus), "--prompt-seconds", "inf"], "--prompt-seconds"),
        ([*prepare, "cpu", str(corpus), "--min-seconds", "nan"], "--min-seconds"),
        ([*prepare, "cpu", str(corpus), "--seed", "-1"], "--seed"),
        ([*prepare, "cpu", str(bad["lhotse start nan"][0])], "start nan"),
        ([*prepare, "cpu", os.fsencode(str(tmp_path)) + b"/\xff.jsonl"], "not UTF-8"),
        ([*train_args, "--lora-alpha", "inf"], "--lora-alpha"),
        (["demo", str(tmp_path / "demo"), "--max-steps", "-1"], "--max-steps"),
        (["evaluate", "--checkpoint", str(tiny_data["base"]), "--manifest", str(tiny_data["train"]),
          "--batch-size", str(10**30)], "--batch-size"),
    ]
    before = files_and_bytes(tmp_path)
    started = [(real_cli(args, cwd), args, needle) for args, needle in cases]  # side by side: each is mostly imports
    for proc, args, needle in started:
        stderr = proc.communicate(timeout=300)[1].decode("utf-8", "replace")
        lines = [line for line in stderr.splitlines() if line.strip()]
        assert proc.returncode == 2 and len(lines) == 1 and "Traceback" not in stderr, (args, stderr[-800:])
        assert lines[0].startswith("error: ") and needle in lines[0], (needle, lines[0])
    assert files_and_bytes(tmp_path) == before
