"""A run folder that explains itself: `run.yaml` beside `train.log` (text_log.py).

Every start writes OUTPUT_DIR/run.yaml: the exact command line, the options and the fully resolved
configuration, library versions and the hardware plan. `train-gpt --from-run OUT/run.yaml` reads the
options back (`recorded_options`), so a run started in tmux last week can be rerun as it was.
"""

from __future__ import annotations

import dataclasses
import functools
import os
import platform
import sys
import time
from importlib import metadata
from pathlib import Path
from typing import Any

import yaml

from indextts_train.config.run_inputs import TrainOptions
from indextts_train.config.schema import field_types, type_problem
from indextts_train.config.settings import Config, TrainConfig
from indextts_train.config.yaml_keys import load_config_yaml
from indextts_train.errors import UserError, text_problem
from indextts_train.files.atomic import atomic_write_text
from indextts_train.files.bounded import kind_of_path
from indextts_train.ui.text_log import command_line

RECORD_NAME = "run.yaml"
RECORD_FORMAT = "indextts-train run record 1"  # marks run.yaml as ours: a foreign file is never replaced
LIBRARIES = ("torch", "numpy", "sentencepiece", "tiktoken", "typer", "pyyaml", "tensorboard", "rich")
MAX_RECORD_BYTES = 4 * 1024 * 1024  # a run.yaml is a few KiB; anything bigger is not one


def library_versions() -> dict[str, str]:
    """Python, this package and the libraries that decide the numbers."""
    return dict(_installed_versions())


@functools.cache
def _installed_versions() -> dict[str, str]:
    """Looked up once a process: each lookup scans every installed distribution (milliseconds each), and
    the libraries a running process has imported do not change under it."""
    versions = {"python": platform.python_version(), "indextts-train": _version("indextts-train")}
    versions.update({name: _version(name) for name in LIBRARIES})
    return versions


def _version(name: str) -> str:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return "not installed"


def write_run_record(output_dir: Path, options: dict[str, Any], config: dict, plan: dict,
                     started: float) -> Path | None:
    """OUTPUT_DIR/run.yaml for this start (atomic); None when a run.yaml that is not ours is in the way."""
    path = Path(output_dir) / RECORD_NAME
    if path.exists() and not _is_ours(path):
        return None
    record = {
        "format": RECORD_FORMAT,
        "started": time.strftime("%Y-%m-%dT%H:%M:%S%z", time.localtime(started)),
        "command_line": command_line(sys.argv),
        "argv": list(sys.argv),
        "cwd": os.getcwd(),
        "host": platform.node(),
        "options": options,
        "config": config,
        "hardware": plan,
        "versions": library_versions(),
    }
    atomic_write_text(path, yaml.safe_dump(record, sort_keys=False, allow_unicode=True))
    return path


def _is_ours(path: Path) -> bool:
    try:
        return path.stat().st_size <= MAX_RECORD_BYTES and _read(path).get("format") == RECORD_FORMAT
    except (OSError, UserError):
        return False


def _read(path: Path) -> dict:
    if path.stat().st_size > MAX_RECORD_BYTES:
        raise UserError(f"--from-run {path}: {path.stat().st_size} bytes is not a run.yaml; pass OUT/run.yaml")
    try:
        data = load_config_yaml(path, "run record")  # safe and bounded, as a config; no key given twice
    except UserError as exc:
        raise UserError(f"--from-run {exc}; pass the run.yaml a run wrote") from None
    if not isinstance(data, dict):
        raise UserError(f"--from-run {path}: not a run record; pass the run.yaml a run wrote")
    return data


def read_record(path: Path) -> dict | None:
    """A run.yaml this trainer wrote, or None (missing, foreign, unreadable): for readers that only show it."""
    try:
        data = _read(Path(path))
    except (OSError, UserError):
        return None
    return data if data.get("format") == RECORD_FORMAT else None


def recorded_options(path: Path) -> dict[str, Any]:
    """The `train-gpt` values a run.yaml recorded, ready for TrainOptions: its inputs and every
    resolved `train:` setting (so the config file's train: section no longer matters). Relative
    paths are taken from the folder the run was started in."""
    path = Path(path)
    if path.is_dir():
        raise UserError(f"--from-run {path} is a folder; pass the run.yaml in it ({path / 'run.yaml'})")
    if not path.is_file():  # a FIFO or a device under the name is said as what it is
        what = f"is {kind_of_path(path)}, not a file" if os.path.lexists(path) else "no such file"
        raise UserError(f"--from-run {path}: {what}; pass OUTPUT_DIR/run.yaml of an earlier run")
    data = _read(path)
    if data.get("format") != RECORD_FORMAT or not isinstance(data.get("options"), dict):
        raise UserError(f"--from-run {path}: not a run record of this trainer (no format: {RECORD_FORMAT!r})")
    where = f"--from-run {path}"
    config = data.get("config") or {}
    train = config.get("train") or {} if isinstance(config, dict) else None
    cwd = data.get("cwd") or "."
    if not isinstance(train, dict) or not isinstance(cwd, str) or text_problem(cwd):
        raise UserError(f"{where}: its config.train is not a mapping or its cwd not a folder name; pass the "
                        "run.yaml a run wrote")
    _check_types(data["options"], _recorded_types(), f"{where}: options")
    _check_types(train, field_types(TrainConfig), f"{where}: config.train")
    cwd = Path(cwd)
    options = {name: _absolute(value, cwd) if name in PATH_OPTIONS else value
               for name, value in data["options"].items()}
    if options.get("resume") not in (None, "auto"):  # a checkpoint's path, from the same folder as the others
        options["resume"] = str(_absolute(options["resume"], cwd))
    return {**options, **train}


def _recorded_types() -> dict[str, Any]:
    """The type each recorded option has in run.yaml: TrainOptions' own, with paths written as text."""
    types = field_types(TrainOptions)
    recorded = {f.name: types[f.name] for f in dataclasses.fields(TrainOptions)
                if f.metadata.get("cli", True) and f.name != "from_run"}
    for name in PATH_OPTIONS:
        recorded[name] = list[str] if name.endswith("manifests") else str if name == "output_dir" else str | None
    recorded["amp"] = bool | None  # a record written before amp became a train: setting holds it here
    return recorded


def _check_types(values: dict, types: dict[str, Any], where: str) -> None:
    """Each recorded value has its setting's type (an edited run.yaml is named by key, never a traceback)."""
    for name, value in values.items():
        if name not in types:
            raise UserError(f"{where}.{name}: not a train-gpt setting; known: {', '.join(types)}")
        problem = type_problem(value, types[name])
        if problem is None and types[name] == list[str] and not all(isinstance(v, str) for v in value):
            problem = f"expected a list of paths, got {value!r}"
        for text in value if isinstance(value, list) and not problem else [value]:
            if isinstance(text, str) and text_problem(text):
                problem = f"{text!r} {text_problem(text)}"
        if problem:
            raise UserError(f"{where}.{name}: {problem}; fix it or pass the flag beside --from-run")


# TrainOptions fields that hold paths (a manifest spec keeps its ::lang / @weight suffix).
PATH_OPTIONS = ("train_manifests", "val_manifests", "output_dir", "config", "tokenizer", "base_checkpoint")


def _absolute(value: Any, cwd: Path) -> Any:
    """A recorded path as the run meant it: manifest specs stay text (they carry suffixes), files are Paths."""
    if value is None:
        return None
    if isinstance(value, list):
        return [str(_absolute(v, cwd)) for v in value]
    return Path(value) if os.path.isabs(str(value)) else cwd / str(value)


def recordable_options(options: TrainOptions, config: Config) -> dict:
    """The inputs of this start for run.yaml (the train: settings are in the resolved config)."""
    skip = ("tensorboard", "from_run")
    values = {f.name: getattr(options, f.name) for f in dataclasses.fields(options) if f.name not in skip}
    values["config"] = config.source
    return {name: [str(v) for v in value] if isinstance(value, list) else
            (str(value) if isinstance(value, Path) else value) for name, value in values.items()}
