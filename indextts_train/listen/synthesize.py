"""Synthesize lines with the official inference code, in a child process of the inference interpreter.

The official packages (`indextts25-inference`, `indextts2-inference`, an index-tts checkout) may live in
another environment with another torch (IndexTTS2's needs torchaudio, which pins its own), so they are
never imported here: `child_infer.py` runs under that interpreter by file path, reads a job JSON and
writes the WAVs and a result JSON. A line that fails is reported as failed; the others go on.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

from indextts_train.config.family import Family
from indextts_train.errors import UserError
from indextts_train.files.atomic import open_append
from indextts_train.train.listening import interpreter_path

CHILD_SCRIPT = Path(__file__).with_name("child_infer.py")
PROBE_TIMEOUT_S = 300  # importing torch + transformers on a cold, loaded machine
KEPT_OUTPUT_BYTES = 100_000  # of each stream of a child: what synthesis.log keeps of a job, and the probe's answer
PROBE_BROKEN = 4  # the package is there but its import fails (e.g. a torchaudio built for another torch)
# Imports the inference module for real (a package that is installed but broken must be refused too),
# printing one line instead of a traceback.
PROBE_OK = "indextts-train probe: imported"  # the answer of a Python that ran the probe (an exit 0 alone: /bin/true)
PROBE = """import importlib, importlib.util, sys
try:
    found = importlib.util.find_spec({module!r}) is not None
    if found:  # find_spec imports the parent package only: the module itself may still fail
        importlib.import_module({module!r})
except Exception as exc:
    print(type(exc).__name__ + ": " + " ".join(str(exc).split())[:300])
    sys.exit(4)
if found:
    print({ok!r})
sys.exit(0 if found else 3)
"""


@dataclass(frozen=True)
class SynthesisLine:
    """One line to speak: `text` in the voice of `prompt_audio`, written to `out_wav`."""

    line_id: str
    text: str
    prompt_audio: Path
    out_wav: Path
    language: str | None


@dataclass(frozen=True)
class SynthesisResult:
    """What became of one line: `seconds` of synthesis (model loading not included), or the error."""

    line_id: str
    out_wav: Path
    seconds: float
    ok: bool
    error: str | None
    seed: int = 0
    versions: dict[str, str] = field(default_factory=dict)  # package -> version, as the child imported them


def line_seed(seed: int, line_id: str) -> int:
    """The seed of one line: fixed by the run's seed and the line's id, not by the order or the batch."""
    digest = hashlib.sha256(f"{seed}\0{line_id}".encode()).digest()
    return int.from_bytes(digest[:4], "little") & 0x7FFFFFFF


FLAG = "--inference-python {}"  # how `listen` is told the interpreter (the demo: an environment variable)


def _install_hint(family: Family, named_by: str) -> str:
    return (f"pip install {family.inference_package} (or: bash scripts/install_inference.sh {family.key} VENV), "
            f"or {'pass' if named_by.startswith('-') else 'set'} {named_by.format('VENV/bin/python')} of an "
            "environment that has it")


def resolve_inference_python(family: Family, flag_value: Path | None,
                             say: Callable[[str], object] | None = None, named_by: str = FLAG) -> Path:
    """The interpreter that runs the official code: `--inference-python` or this one; one line when it
    cannot import the family's inference package, cannot be run, or does not answer in PROBE_TIMEOUT_S.
    `say`: where the line announcing the probe goes (None: no line). `named_by`: how the user names the
    interpreter, as the lines say it (the demo has no --inference-python: `INDEXTTS_INFERENCE_PYTHON={}`)."""
    module, name = family.inference_module, family.name
    if flag_value is None:
        python = Path(sys.executable)
        where = f"this Python ({python})"
    else:
        python = interpreter_path(flag_value)
        where = named_by.format(flag_value)
        if not python.is_file() or not os.access(python, os.X_OK):
            raise UserError(f"{where}: not an executable file; pass the python of the environment where "
                            f"{family.inference_package} is installed")
    if say is not None:  # the import takes seconds to minutes, and a program that never exits is waited for
        say(f"checking that {where} imports {module} (waiting up to {PROBE_TIMEOUT_S} s)")
    try:
        done = run_bounded([str(python), "-c", PROBE.format(module=module, ok=PROBE_OK)], PROBE_TIMEOUT_S)
    except OSError as exc:  # the file is there (checked above): its #! line names a missing program, or none
        why = "its #! line names a program that is not there" if isinstance(exc, FileNotFoundError) else (
            exc.strerror or type(exc).__name__)
        raise UserError(f"{where}: cannot run it ({why}); {_install_hint(family, named_by)}") from None
    if done.returncode is None:
        raise UserError(f"{where}: did not finish importing {module} in {PROBE_TIMEOUT_S} s (is it a python?); "
                        f"{_install_hint(family, named_by)}")
    if done.returncode == 0 and PROBE_OK not in done.stdout:
        raise UserError(f"{where}: exited without running the import check (is it a python?); "
                        f"{_install_hint(family, named_by)}")
    if done.returncode != 0:
        found = _tail_line(done.stdout) if done.returncode == PROBE_BROKEN else "not installed"
        raise UserError(f"{where} cannot import {module}, the {name} inference code ({found}): "
                        f"{_install_hint(family, named_by)}")
    return python


@dataclass(frozen=True)
class Finished:
    """What a child process left: its exit code (None: killed at its time limit) and the last KEPT_OUTPUT_BYTES
    of each of its streams."""

    returncode: int | None
    stdout: str
    stderr: str


def run_bounded(args: list[str], timeout_s: float | None) -> Finished:
    """Run a child to its end (killed at `timeout_s`), keeping only the tail of its output: capture_output held
    all of it, and a program that prints without end (`--inference-python` naming one) took gigabytes a minute."""
    child = subprocess.Popen(args, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             env=_child_env())
    tails = [bytearray(), bytearray()]
    readers = [threading.Thread(target=_keep_tail, args=(stream, tail), daemon=True)
               for stream, tail in zip((child.stdout, child.stderr), tails, strict=True)]
    try:
        for reader in readers:
            reader.start()
        try:
            code: int | None = child.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            code = None
    finally:  # a timeout, or Ctrl+C here: the child goes too
        if child.poll() is None:
            child.kill()
            child.wait()
        for reader in readers:
            reader.join(timeout=5)  # a grandchild holding the pipe open must not keep us
    out, err = (bytes(tail).decode("utf-8", "replace") for tail in tails)
    return Finished(code, out, err)


def _keep_tail(stream: IO[bytes], tail: bytearray) -> None:
    while chunk := stream.read1(1 << 16):
        tail += chunk
        if len(tail) > 2 * KEPT_OUTPUT_BYTES:
            del tail[:-KEPT_OUTPUT_BYTES]
    stream.close()


def _child_env() -> dict[str, str]:
    """The child's environment: ours, minus what would make it import this project's own interpreter state."""
    env = dict(os.environ)
    env.pop("PYTHONHOME", None)
    env.setdefault("PYTHONUNBUFFERED", "1")
    return env


def _job(model_dir: Path, family: Family, lines: list[SynthesisLine], seed: int, device: str, result: Path,
         threads: int | None, max_mel_tokens: int | None) -> dict:
    return {
        "family": family.key,
        "parent_pid": os.getpid(),
        "threads": threads,
        "max_mel_tokens": max_mel_tokens,
        "model_dir": str(model_dir.resolve()),
        "device": device,
        "result": str(result),
        "lines": [{"line_id": line.line_id, "text": line.text, "prompt_audio": str(line.prompt_audio.resolve()),
                   # absolute, not resolved: a link at the WAV's name is replaced as a name, its target kept
                   "out_wav": os.path.abspath(line.out_wav), "language": line.language,
                   "seed": line_seed(seed, line.line_id)} for line in lines],
    }


def _read_results(path: Path) -> dict:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}


def _tail_line(text: str) -> str:
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return lines[-1][:300] if lines else "no output"


def synthesize(model_dir: Path, family: Family, lines: list[SynthesisLine], *, seed: int, device: str,
               inference_python: Path | None, log_path: Path | None = None,
               timeout_s: float | None = None, threads: int | None = None,
               max_mel_tokens: int | None = None) -> list[SynthesisResult]:
    """Speak every line with the official code of `family` from the official-layout `model_dir`.

    One child process loads the models once and synthesizes the lines in order, each seeded by
    `line_seed(seed, line_id)`. `inference_python`: as `resolve_inference_python` returned it (None:
    resolve the default now). The child's output goes to `log_path` (appended) when given. Returns one
    result per line, in order; a line the child never reached (crash, timeout) is failed with its reason.
    """
    if not lines:
        return []  # no model load for nothing
    python = inference_python or resolve_inference_python(family, None)
    with tempfile.TemporaryDirectory(prefix="indextts-listen-") as tmp:
        job_path, result_path = Path(tmp) / "job.json", Path(tmp) / "result.json"
        job = _job(model_dir, family, lines, seed, device, result_path, threads, max_mel_tokens)
        job_path.write_text(json.dumps(job), encoding="utf-8")
        started = time.monotonic()
        try:
            done = run_bounded([str(python), str(CHILD_SCRIPT), str(job_path)], timeout_s)
        except OSError as exc:  # the interpreter went away since its check: every line fails with the reason
            done = Finished(1, "", f"cannot start {python}: {exc.strerror or type(exc).__name__}")
        failure = None
        if done.returncode is None:
            failure = f"inference process killed after {time.monotonic() - started:.0f} s (timeout)"
        elif done.returncode != 0:
            failure = f"inference process exited with code {done.returncode}: {_tail_line(done.stderr)}"
        if log_path is not None:
            _keep_log(log_path, (done.stdout + done.stderr)[-KEPT_OUTPUT_BYTES:])
        report = _read_results(result_path)
    return _results(lines, seed, report, failure)


def _keep_log(path: Path, text: str) -> None:
    """The child's output, appended beside the wavs; a path that is no file of ours keeps nothing."""
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        fd = open_append(path)
    except OSError:
        return
    with os.fdopen(fd, "a", encoding="utf-8") as log:
        log.write(text)


def _results(lines: list[SynthesisLine], seed: int, report: dict, failure: str | None) -> list[SynthesisResult]:
    by_id = {entry.get("line_id"): entry for entry in report.get("lines", []) if isinstance(entry, dict)}
    versions = {str(k): str(v) for k, v in (report.get("versions") or {}).items()}
    general = report.get("error") or failure or "the inference process did not report this line"
    results = []
    for line in lines:
        entry = by_id.get(line.line_id)
        ok = bool(entry and entry.get("ok")) and line.out_wav.is_file()
        error = None if ok else (entry or {}).get("error") or general
        results.append(SynthesisResult(line_id=line.line_id, out_wav=line.out_wav,
                                       seconds=float((entry or {}).get("seconds") or 0.0), ok=ok, error=error,
                                       seed=line_seed(seed, line.line_id), versions=versions))
    return results
