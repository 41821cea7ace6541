"""A run folder that explains itself: `train.log` (the console, timestamped) and `run.yaml`.

Every start appends its console lines to OUTPUT_DIR/train.log, each with the wall-clock time and the
time since the start, and writes OUTPUT_DIR/run.yaml: the exact command line, the options and the
fully resolved configuration, library versions and the hardware plan. `train-gpt --from-run
OUT/run.yaml` reads the options back (`recorded_options`), so a run started in tmux last week can be
rerun as it was.

Lines are kept in memory until the output folder has been claimed (`TextLog.attach`): a start that
fails its checks creates nothing on disk.
"""

from __future__ import annotations

import dataclasses
import functools
import os
import platform
import re
import shlex
import sys
import time
from importlib import metadata
from pathlib import Path
from typing import Any

import yaml

from indextts_train.config.schema import field_types, type_problem
from indextts_train.config.settings import Config, TrainConfig, TrainOptions
from indextts_train.errors import UserError, text_problem
from indextts_train.files.atomic import atomic_write_text
from indextts_train.files.bounded import load_yaml
from indextts_train.ui.events import EVENTS_NAME, AppendOnlyFile, EventFile, event

LOG_NAME = "train.log"
RECORD_NAME = "run.yaml"
RECORD_FORMAT = "indextts-train run record 1"  # marks run.yaml as ours: a foreign file is never replaced
LIBRARIES = ("torch", "numpy", "sentencepiece", "tiktoken", "typer", "pyyaml", "tensorboard", "rich")
MAX_RECORD_BYTES = 4 * 1024 * 1024  # a run.yaml is a few KiB; anything bigger is not one


# The stamp TextLog.stamp puts before each console line: `13:02:41 +0:04:10 `.
STAMP = re.compile(r"^\d\d:\d\d:\d\d \+\d+:\d\d:\d\d ", re.M)


def unstamp(text: str) -> str:
    """Console text without the stamps, for readers that match what a line says (the web page, tests)."""
    return STAMP.sub("", text)


def elapsed_text(seconds: float) -> str:
    """`0:04:10`: hours are not wrapped, so a week-long run reads `170:02:11`."""
    whole = int(max(seconds, 0))
    return f"{whole // 3600}:{whole % 3600 // 60:02d}:{whole % 60:02d}"


class TextLog:
    """Timestamps for console lines, and their copy in OUTPUT_DIR/train.log once the folder is ours,
    with each line's event in OUTPUT_DIR/events.jsonl (events.py)."""

    def __init__(self, started: float | None = None) -> None:
        self.started = time.time() if started is None else started
        self._log = AppendOnlyFile()  # train.log: lines before attach() are written then, or never
        self.events = EventFile()
        self.events.record(event("start", f"=== start {self._when()}: {command_line(sys.argv)}",
                                 command_line=command_line(sys.argv), started=self.started))

    def _when(self) -> str:
        return time.strftime("%Y-%m-%d %H:%M:%S %z", time.localtime(self.started))

    def record(self, line: str, kind: str, **fields: Any) -> None:
        """A stamped line (write) and its event: what `text` says, as data."""
        self.write(line)
        self.events.record(event(kind, unstamp(line), **fields))

    def stamp(self, message: str, now: float | None = None) -> str:
        """`13:02:41 +0:04:10 message`: the time of day and the time since this start."""
        now = time.time() if now is None else now
        return f"{time.strftime('%H:%M:%S', time.localtime(now))} +{elapsed_text(now - self.started)} {message}"

    def write(self, line: str) -> None:
        """One stamped line (may hold several text lines); a failing disk ends the copy, never the run."""
        self._log.write(line)

    def attach(self, output_dir: Path) -> None:
        """Start appending to OUTPUT_DIR/train.log and events.jsonl, with the lines said so far.

        When stdout already appends to that very file (the web page starts runs that way), the lines
        reach it through stdout and are not written twice.
        """
        self.events.attach(Path(output_dir) / EVENTS_NAME)
        path = Path(output_dir) / LOG_NAME
        if _stdout_is(path):
            self._log.discard()
            return
        self._log.attach(path, head=f"=== start {self._when()}: {command_line(sys.argv)}")

    def close(self) -> None:
        self.events.close()
        self._log.close()


def command_line(argv: list[str]) -> str:
    """The command as the user typed it: `train-gpt ...`, or `python -m indextts_train ...` (whose argv[0]
    is the package's __main__.py path)."""
    program = "python -m indextts_train" if Path(argv[0]).name == "__main__.py" else Path(argv[0]).name
    return " ".join([program, *map(shlex.quote, argv[1:])])


def _stdout_is(path: Path) -> bool:
    try:
        return path.exists() and os.path.samestat(os.fstat(sys.stdout.fileno()), os.stat(path))
    except (OSError, ValueError, AttributeError):  # no real stdout (captured by a test, closed)
        return False


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
        data = load_yaml(path, "run record")  # safe and bounded: size, nesting, anchors expanded
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
    if not path.is_file():
        raise UserError(f"--from-run {path}: no such file; pass OUTPUT_DIR/run.yaml of an earlier run")
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
