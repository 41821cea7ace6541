"""Checkpoints: atomic save, safe load, verify, find the newest complete one, rotate.

The promise is that a trainer killed at any instant (kill -9 mid-save included) resumes bit-exactly
with `--resume auto`. This module is the storage half of it:

- a checkpoint is written to a temp file, fsynced, renamed into place and the directory fsynced;
  `latest.pth` moves (hard link, or copy) only after that, and rotation deletes old files last, so
  every name on disk always refers to a complete file;
- files are read with `torch.load(weights_only=True)`, so a checkpoint from a stranger cannot run
  code, and the zip CRC-32 of every member is checked first, because torch itself does not notice a
  flipped byte inside tensor data;
- nothing that fails to verify is ever deleted or renamed: `--resume auto` says what it skipped.

Checkpoint layout (a plain dict; the trainer builds it):
    format, format_version, model {key: float32 Tensor} (full official gpt.pth layout),
    optimizer (AdamW state_dict), optimizer_param_names (param names in optimizer order),
    scheduler (LambdaLR state_dict), scaler (GradScaler state_dict or None),
    progress {step, epoch, samples_in_epoch, samples_total, sampler_seed, micro_batch,
              grad_accumulation, world_size}  (epoch is the 0-based epoch in progress),
    rng [one capture_rng() dict per rank], history {train, val, best_val_loss},
    hparams, config, vocab_plan, hardware, created, and after a repair: repaired.
A repaired checkpoint whose optimizer could not be matched to the weights holds None for
optimizer, scheduler and scaler together (one matched set, reset together) and lists them in
`repaired["unknown"]`; the trainer then starts a fresh optimizer at the stored step.

repair.py builds repaired checkpoints from the public checks and writers here; verify reads them.
"""

from __future__ import annotations

import errno
import io
import json
import os
import pickle
import random
import re
import shutil
import zipfile
from collections import OrderedDict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from indextts_train.errors import UserError
from indextts_train.faults import crash_armed, crash_point

FORMAT = "indextts-train-checkpoint"
FORMAT_VERSION = 1
REQUIRED_KEYS = (
    "format", "format_version", "model", "optimizer", "optimizer_param_names", "scheduler", "scaler",
    "progress", "rng", "history", "hparams", "config", "vocab_plan",
)
PROGRESS_KEYS = (
    "step", "epoch", "samples_in_epoch", "samples_total", "sampler_seed", "micro_batch",
    "grad_accumulation", "world_size",
)
LATEST = "latest.pth"
EXIT_CODES = {"COMPLETE": 0, "PARTIAL": 1, "INCOMPLETE": 2}
OPTIMIZER_SET = ("optimizer", "scheduler", "scaler")

_STEP_FILE = re.compile(r"^model_step(\d+)\.pth$")
_TEMP_FILE = re.compile(r"^\.(model_step\d+|latest)\.pth\.tmp-\d+$")  # only names this module writes
_PYTHON_RNG_WORDS = 625  # random.getstate(): 624 Mersenne Twister words + position
_NUMPY_RNG_WORDS = 624


class CheckpointError(UserError):
    """A checkpoint file that cannot be used: unreadable, truncated, corrupt, unsafe or unrepairable."""


class CheckpointSaveError(UserError):
    """A save that did not happen (disk full, ...); the previous checkpoints are untouched."""


# ----------------------------------------------------------------------------- RNG


def _plain_python_rng(state: tuple) -> list:
    version, words, gauss_next = state
    return [version, list(words), gauss_next]


def _plain_numpy_rng(state: tuple) -> dict:
    # numpy arrays and scalars are not weights_only-safe: store plain ints and floats.
    name, words, pos, has_gauss, cached = state
    return {"bit_generator": str(name), "key": [int(w) for w in words], "pos": int(pos),
            "has_gauss": int(has_gauss), "cached_gaussian": float(cached)}


def capture_rng() -> dict:
    """This process's RNG states (python, numpy global, torch CPU, every CUDA device), weights_only-safe."""
    cuda = torch.cuda.get_rng_state_all() if torch.cuda.is_available() else []
    return {"python": _plain_python_rng(random.getstate()),
            "numpy": _plain_numpy_rng(np.random.get_state(legacy=True)),
            "torch_cpu": torch.get_rng_state(), "cuda": list(cuda)}


def seeded_rng(seed: int) -> dict:
    """RNG states as `capture_rng()` would return right after seeding with `seed`; globals untouched."""
    return {"python": _plain_python_rng(random.Random(seed).getstate()),
            "numpy": _plain_numpy_rng(np.random.RandomState(seed % 2**32).get_state(legacy=True)),
            "torch_cpu": torch.Generator().manual_seed(seed).get_state(), "cuda": []}


def is_int(value: Any) -> bool:
    """An int that is not a bool (True would pass as a step count otherwise)."""
    return isinstance(value, int) and not isinstance(value, bool)


def rng_problem(state: Any) -> str | None:
    """Why `state` is not a capture_rng() dict, or None."""
    if not isinstance(state, dict):
        return f"expected a dict, got {type(state).__name__}"
    missing = [k for k in ("python", "numpy", "torch_cpu", "cuda") if k not in state]
    if missing:
        return f"missing {', '.join(missing)}"
    py = state["python"]
    if not (isinstance(py, (list, tuple)) and len(py) == 3 and isinstance(py[1], (list, tuple))
            and len(py[1]) == _PYTHON_RNG_WORDS and all(is_int(w) for w in py[1])):
        return "python: not a random.getstate() triple"
    np_state = state["numpy"]
    if not (isinstance(np_state, dict) and np_state.get("bit_generator") == "MT19937"
            and isinstance(np_state.get("key"), list) and len(np_state["key"]) == _NUMPY_RNG_WORDS
            and is_int(np_state.get("pos")) and is_int(np_state.get("has_gauss"))
            and isinstance(np_state.get("cached_gaussian"), float)):
        return "numpy: not an MT19937 state"
    tensors = [state["torch_cpu"], *state["cuda"]] if isinstance(state["cuda"], list) else None
    if tensors is None or not all(isinstance(t, torch.Tensor) and t.dtype == torch.uint8 for t in tensors):
        return "torch_cpu/cuda: expected uint8 tensors (cuda: a list of them)"
    return None


def restore_rng(state: dict) -> None:
    """Put back a `capture_rng()` state. CUDA devices beyond those saved (or present) are left alone."""
    problem = rng_problem(state)
    if problem:
        raise CheckpointError(f"checkpoint RNG state is malformed ({problem}); repair the checkpoint")
    version, words, gauss_next = state["python"]
    random.setstate((version, tuple(words), gauss_next))
    np_state = state["numpy"]
    np.random.set_state((np_state["bit_generator"], np.asarray(np_state["key"], dtype=np.uint32),
                         np_state["pos"], np_state["has_gauss"], np_state["cached_gaussian"]))
    torch.set_rng_state(state["torch_cpu"])
    devices = torch.cuda.device_count() if torch.cuda.is_available() else 0
    for device, cuda_state in enumerate(state["cuda"][:devices]):
        torch.cuda.set_rng_state(cuda_state, device)


# ----------------------------------------------------------------------------- validation


def _unsafe_value(obj: Any, where: str) -> str | None:
    """Where `obj` holds something torch.load(weights_only=True) would refuse, or None."""
    if isinstance(obj, torch.Tensor):
        return None if type(obj) in (torch.Tensor, torch.nn.Parameter) else f"{where} is a {type(obj).__name__}"
    if isinstance(obj, (torch.Size, torch.dtype, torch.device)):
        return None
    if type(obj) in (dict, OrderedDict):
        for key, value in obj.items():
            if type(key) not in (str, int):
                return f"{where} has a key of type {type(key).__name__}"
            found = _unsafe_value(value, f"{where}[{key!r}]")
            if found:
                return found
        return None
    if type(obj) in (list, tuple):
        for i, value in enumerate(obj):
            found = _unsafe_value(value, f"{where}[{i}]")
            if found:
                return found
        return None
    # Exact types: numpy scalars subclass float/int but are pickled as numpy objects.
    if type(obj) in (str, int, float, bool, type(None)):
        return None
    return f"{where} is a {type(obj).__module__}.{type(obj).__name__}"


def _model_problem(model: Any) -> str | None:
    if not isinstance(model, dict) or not model:
        return "model: expected a non-empty dict of tensors"
    bad = [k for k, v in model.items() if not isinstance(k, str) or not isinstance(v, torch.Tensor)]
    return f"model: {bad[0]!r} is not a named tensor" if bad else None


def optimizer_params(optimizer: dict) -> list:
    """The parameter ids of an optimizer state_dict, in optimizer order (groups flattened)."""
    return [p for group in optimizer["param_groups"] for p in group["params"]]


def _repaired_unknown(state: dict) -> list:
    """What a repair marked as not known (empty for a checkpoint the trainer wrote)."""
    repaired = state.get("repaired")
    unknown = repaired.get("unknown") if isinstance(repaired, dict) else None
    return unknown if isinstance(unknown, list) else []


def optimizer_problems(state: dict) -> list[str]:
    """What is wrong with the optimizer set (optimizer, names, scheduler, scaler); empty when usable."""
    optimizer, names = state["optimizer"], state["optimizer_param_names"]
    if "optimizer" in _repaired_unknown(state):
        if any(state[k] is not None for k in OPTIMIZER_SET) or names != []:
            return ["optimizer, scheduler and scaler are marked reset by repair but are not all None"]
        return []
    problems = []
    if not (isinstance(optimizer, dict) and isinstance(optimizer.get("state"), dict)
            and isinstance(optimizer.get("param_groups"), list)
            and all(isinstance(g, dict) and isinstance(g.get("params"), list) for g in optimizer["param_groups"])):
        problems.append("optimizer: expected an optimizer state_dict with 'state' and 'param_groups'")
    elif not (isinstance(names, list) and all(isinstance(n, str) for n in names)):
        problems.append("optimizer_param_names: expected a list of parameter names")
    elif len(names) != len(optimizer_params(optimizer)):
        problems.append(f"optimizer_param_names has {len(names)} names but the optimizer holds "
                        f"{len(optimizer_params(optimizer))} parameters")
    elif isinstance(state["model"], dict) and set(names) - set(state["model"]):
        problems.append(f"optimizer_param_names: {sorted(set(names) - set(state['model']))[0]!r} is not in model")
    if not isinstance(state["scheduler"], dict):
        problems.append("scheduler: expected a scheduler state_dict")
    if state["scaler"] is not None and not isinstance(state["scaler"], dict):
        problems.append("scaler: expected a GradScaler state_dict or None")
    return problems


def _progress_problems(state: dict) -> list[str]:
    progress = state["progress"]
    if not isinstance(progress, dict):
        return ["progress: expected a dict"]
    bad = [k for k in PROGRESS_KEYS if not (is_int(progress.get(k)) and progress[k] >= 0)]
    if bad:
        return [f"progress: {', '.join(bad)} missing or not a non-negative int"]
    rng = state["rng"]
    if not isinstance(rng, list) or not rng:
        return ["rng: expected a non-empty list with one RNG state per rank"]
    problems = [f"rng[{i}]: {p}" for i, p in enumerate(map(rng_problem, rng)) if p]
    if len(rng) != progress["world_size"]:
        problems.append(f"rng has {len(rng)} rank states but progress.world_size is {progress['world_size']}")
    return problems


def history_problem(history: Any) -> str | None:
    """Why `history` is not {train: list, val: list, best_val_loss}, or None."""
    if not (isinstance(history, dict) and isinstance(history.get("train"), list)
            and isinstance(history.get("val"), list) and "best_val_loss" in history
            and (history["best_val_loss"] is None or isinstance(history["best_val_loss"], (int, float)))):
        return "history: expected {train: list, val: list, best_val_loss: float or None}"
    return None


def resume_problems(state: dict) -> list[str]:
    """What keeps a checkpoint of our format from an exact resume (empty when COMPLETE)."""
    missing = [k for k in REQUIRED_KEYS if k not in state]
    if missing:
        return [f"missing {', '.join(missing)} (needed for an exact resume)"]
    version = state["format_version"]
    if version != FORMAT_VERSION:
        return [f"format_version {version!r} is not {FORMAT_VERSION}; this indextts-train reads version "
                f"{FORMAT_VERSION} (a newer file needs a newer indextts-train)"]
    model = state["model"]
    problems = [p for p in (_model_problem(model), history_problem(state["history"])) if p]
    if not _model_problem(model):
        not_fp32 = [k for k, v in model.items() if v.is_floating_point() and v.dtype != torch.float32]
        if not_fp32:
            problems.append(f"model: {not_fp32[0]!r} is {model[not_fp32[0]].dtype}; "
                            "an exact resume needs float32 weights")
    problems += optimizer_problems(state) + _progress_problems(state)
    problems += [f"{k}: expected a dict" for k in ("hparams", "config", "vocab_plan") if not isinstance(state[k], dict)]
    return problems


# ----------------------------------------------------------------------------- reading


def _first_line(exc: BaseException) -> str:
    text = next((line.strip() for line in str(exc).splitlines() if line.strip()), "")
    return (text[:160] + "...") if len(text) > 160 else (text or type(exc).__name__)


def _check_zip_crc(path: Path) -> None:
    """Raise CheckpointError when a zip member fails its CRC-32 (torch.load would not notice)."""
    try:
        with zipfile.ZipFile(path) as archive:
            members = [m for m in archive.infolist() if m.file_size]
            if members and all(m.CRC == 0 for m in members):
                return  # written with torch's compute_crc32 off: nothing to check against
            bad = archive.testzip()
    except (zipfile.BadZipFile, OSError, EOFError, ValueError) as exc:
        raise CheckpointError(f"{path} is corrupt: its zip structure is damaged ({_first_line(exc)})") from None
    if bad:
        raise CheckpointError(f"{path} is corrupt: {bad} fails its CRC-32 checksum "
                              "(damaged on disk or in a copy); it is left on disk")


def _read(path: Path, *, mmap: bool, check_crc: bool = True) -> Any:
    """torch.load(weights_only=True) with every failure turned into a one-line CheckpointError."""
    if not path.is_file():
        raise CheckpointError(f"{path}: no such checkpoint file")
    is_zip = zipfile.is_zipfile(path)
    if is_zip and check_crc:
        _check_zip_crc(path)
    try:
        return torch.load(path, map_location="cpu", weights_only=True, mmap=mmap and is_zip)
    except pickle.UnpicklingError as exc:
        unsafe = re.search(r"GLOBAL ([\w.]+)", str(exc))
        if unsafe:
            raise CheckpointError(
                f"refusing to load {path}: it contains pickled Python objects that could run code "
                f"({unsafe.group(1)}); only tensors and plain containers are accepted") from None
        raise CheckpointError(f"{path} is not a readable checkpoint: {_unpickle_reason(exc)}") from None
    except EOFError:
        raise CheckpointError(f"{path} is not a readable checkpoint: the file ends early "
                              "(empty or truncated)") from None
    except Exception as exc:  # anything else a hostile or damaged file provokes means "unreadable"
        if not is_zip and _starts_like_zip(path):
            reason = "the zip archive has no end record: the file is truncated (an interrupted save or copy)"
        else:
            reason = f"truncated, corrupt or not written by torch.save ({_first_line(exc)})"
        raise CheckpointError(f"{path} is not a readable checkpoint: {reason}") from None


def _starts_like_zip(path: Path) -> bool:
    with open(path, "rb") as f:
        return f.read(4) == b"PK\x03\x04"


def _unpickle_reason(exc: BaseException) -> str:
    detail = re.search(r"Unsupported operand \S+", str(exc))
    return f"not written by torch.save, or damaged ({detail.group(0) if detail else 'unpickling failed'})"


def load_checkpoint(path: Path, *, mmap: bool = False, crc_checked: bool = False) -> dict:
    """Load a checkpoint on the CPU, refusing anything that would need code to unpickle. Deletes nothing.

    `mmap` leaves tensor data on disk until touched (enough to read a stored config); `crc_checked`
    skips the checksum pass when verify_checkpoint just read the whole file, as resume does.
    """
    path = Path(path)
    obj = _read(path, mmap=mmap, check_crc=not crc_checked)
    if not isinstance(obj, dict):
        raise CheckpointError(f"{path} holds a {type(obj).__name__}, not a checkpoint dict")
    return obj


# ----------------------------------------------------------------------------- verify


@dataclass
class Verdict:
    """What `verify` says about one file. exit_code: 0 COMPLETE, 1 PARTIAL, 2 INCOMPLETE."""

    status: str  # COMPLETE | PARTIAL | INCOMPLETE
    kind: str  # indextts-train | community | gpt.pth | unknown
    reasons: list[str] = field(default_factory=list)
    summary: dict = field(default_factory=dict)

    @property
    def exit_code(self) -> int:
        return EXIT_CODES[self.status]

    def to_dict(self) -> dict:
        """JSON-ready (`verify --json`)."""
        return json.loads(json.dumps({"status": self.status, "kind": self.kind, "exit_code": self.exit_code,
                                      "reasons": self.reasons, "summary": self.summary}, default=str))


def _kind(obj: Any) -> str:
    if not isinstance(obj, dict):
        return "unknown"
    if obj.get("format") == FORMAT:
        return "indextts-train"
    if isinstance(obj.get("model"), dict) and {"optimizer", "step", "epoch"} & obj.keys():
        return "community"
    weights = obj["model"] if set(obj) == {"model"} else obj  # IndexTTS2 also accepts {"model": sd}
    if isinstance(weights, dict) and weights and all(isinstance(v, torch.Tensor) for v in weights.values()):
        return "gpt.pth"
    return "unknown"


def _weights(obj: dict, kind: str) -> Any:
    return obj if kind == "gpt.pth" and "model" not in obj else obj.get("model")


def _summary(obj: dict, kind: str, path: Path) -> dict:
    weights = _weights(obj, kind)
    tensors = list(weights.values()) if isinstance(weights, dict) else []
    sizes = {"file_bytes": path.stat().st_size, "tensors": len(tensors),
             "params": sum(t.numel() for t in tensors if isinstance(t, torch.Tensor))}
    if kind == "community":
        return {"step": obj.get("step"), "epoch": obj.get("epoch"), "sizes": sizes}
    if kind != "indextts-train":
        return {"sizes": sizes}
    progress = obj.get("progress") if isinstance(obj.get("progress"), dict) else {}
    hparams = obj.get("hparams") if isinstance(obj.get("hparams"), dict) else {}
    summary = {k: progress.get(k) for k in ("step", "epoch", "samples_in_epoch", "samples_total")}
    summary.update(vocab_plan=obj.get("vocab_plan"), precision=hparams.get("precision"),
                   hardware=obj.get("hardware"), hparams=hparams, created=obj.get("created"),
                   format_version=obj.get("format_version"), sizes=sizes)
    return summary


def _community_reasons(obj: dict) -> list[str]:
    have = [k for k in ("optimizer", "scheduler", "scaler", "step", "epoch") if obj.get(k) is not None]
    return [f"community train_gpt_v2.py checkpoint with {', '.join(['model', *have])}",
            "lacks RNG states, the sample position in the epoch, loss history, config and vocab plan, "
            "so it cannot resume exactly; `indextts-train repair` converts it"]


def verify_checkpoint(path: Path) -> Verdict:
    """COMPLETE (exact resume possible), PARTIAL (weights usable, resume state missing) or INCOMPLETE."""
    path = Path(path)
    try:
        obj = _read(path, mmap=True)  # mmap: shapes and types are enough, tensor data stays on disk
    except CheckpointError as exc:
        return Verdict("INCOMPLETE", "unknown", [str(exc)])
    kind = _kind(obj)
    if kind == "unknown":
        what = f"a dict with keys {sorted(map(str, obj))[:8]}" if isinstance(obj, dict) else f"a {type(obj).__name__}"
        return Verdict("INCOMPLETE", kind, [f"{path} is not a checkpoint: it holds {what}"])
    summary = _summary(obj, kind, path)
    problem = _model_problem(_weights(obj, kind))
    if problem:
        return Verdict("INCOMPLETE", kind, [f"no usable weights: {problem}"], summary)
    if kind == "community":
        return Verdict("PARTIAL", kind, _community_reasons(obj), summary)
    if kind == "gpt.pth":
        return Verdict("PARTIAL", kind, ["bare gpt.pth weights: no optimizer, scheduler, RNG or progress; "
                                         "use it as --base-checkpoint to start a run"], summary)
    problems = resume_problems(obj)
    if problems:
        return Verdict("PARTIAL", kind, problems, summary)
    notes = []
    if isinstance(obj.get("repaired"), dict):
        unknown = ", ".join(map(str, _repaired_unknown(obj))) or "nothing"
        notes.append(f"repaired from a {obj['repaired'].get('from')} checkpoint; filled in, not known: {unknown}")
    return Verdict("COMPLETE", kind, notes, summary)


# ----------------------------------------------------------------------------- save


def _fsync_dir(directory: Path) -> None:
    """Make a rename durable. Some filesystems cannot fsync a directory; the rename is still atomic there."""
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    except OSError as exc:
        if exc.errno not in (errno.EINVAL, errno.ENOTSUP, errno.EBADF):
            raise
    finally:
        os.close(fd)


def _write_and_sync(state: dict, path: Path, step: int) -> None:
    with open(path, "wb") as f:
        if crash_armed("save_partial", step):  # crash tests: die with half the bytes on disk
            buffer = io.BytesIO()
            torch.save(state, buffer)
            f.write(buffer.getvalue()[: buffer.tell() // 2])
            f.flush()
            os.fsync(f.fileno())
            crash_point("save_partial", step)
        torch.save(state, f)
        f.flush()
        os.fsync(f.fileno())


def _temp_name(final: Path) -> Path:
    return final.with_name(f".{final.name}.tmp-{os.getpid()}")


def atomic_write(state: dict, final: Path, step: int) -> None:
    """Write to a temp name, fsync, rename over `final`, fsync the directory. No half file ever has `final`'s name."""
    tmp = _temp_name(final)
    try:
        _write_and_sync(state, tmp, step)
        crash_point("save_tmp_written", step)
        os.replace(tmp, final)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    _fsync_dir(final.parent)


def link_or_copy(source: Path, dest: Path) -> None:
    """`dest` becomes a complete copy of `source`: a hard link, or a synced copy where links fail."""
    try:
        os.link(source, dest)
    except OSError:
        with open(source, "rb") as src, open(dest, "wb") as dst:
            shutil.copyfileobj(src, dst, 16 * 2**20)
            dst.flush()
            os.fsync(dst.fileno())


def _publish_latest(output_dir: Path, target: Path) -> None:
    latest = output_dir / LATEST
    tmp = _temp_name(latest)
    try:
        link_or_copy(target, tmp)
        os.replace(tmp, latest)
    finally:
        # Also covers rename(2) between two links of one inode, which succeeds without removing tmp.
        tmp.unlink(missing_ok=True)
    _fsync_dir(output_dir)


def _step_of(path: Path) -> int | None:
    match = _STEP_FILE.match(path.name)
    return int(match.group(1)) if match else None


def list_checkpoints(output_dir: Path) -> list[Path]:
    """Checkpoint files in `output_dir`: model_step*.pth oldest step first, then latest.pth if present."""
    output_dir = Path(output_dir)
    if not output_dir.is_dir():
        return []
    steps = sorted((p for p in output_dir.iterdir() if _step_of(p) is not None and p.is_file()), key=_step_of)
    latest = output_dir / LATEST
    return steps + [latest] if latest.is_file() else steps


def same_file(a: Path, b: Path) -> bool:
    """Whether `a` and `b` are one file (hard links included); False when either is missing."""
    try:
        return os.path.samefile(a, b)
    except OSError:
        return False


def _latest_target(output_dir: Path) -> Path | None:
    """The model_step file latest.pth is a hard link of, if any."""
    latest = output_dir / LATEST
    steps = [p for p in list_checkpoints(output_dir) if p.name != LATEST]
    return next((p for p in steps if same_file(p, latest)), None) if latest.is_file() else None


def _rotate(output_dir: Path, keep: int, protected: Path) -> None:
    """Delete the oldest model_step files beyond `keep`; never `protected` nor latest.pth's target."""
    steps = [p for p in list_checkpoints(output_dir) if p.name != LATEST]
    spared = {protected, _latest_target(output_dir)}
    for path in steps[:-keep]:
        if path not in spared:
            path.unlink(missing_ok=True)


def _remove_stale_temps(output_dir: Path) -> None:
    for path in output_dir.iterdir():
        if _TEMP_FILE.match(path.name):
            path.unlink(missing_ok=True)


def failure_reason(exc: BaseException) -> str:
    """A short cause; torch wraps the OSError of a failed write in a RuntimeError, so follow the chain."""
    seen: BaseException | None = exc
    while seen is not None:
        if isinstance(seen, OSError) and seen.errno in (errno.ENOSPC, errno.EDQUOT):
            return "disk full" if seen.errno == errno.ENOSPC else "disk quota exceeded"
        if isinstance(seen, OSError) and seen.strerror:
            return seen.strerror.lower()
        seen = seen.__cause__ or seen.__context__
    return _first_line(exc)


def _previous_description(output_dir: Path) -> str:
    previous = _latest_target(output_dir)
    if previous is None and (output_dir / LATEST).is_file():
        previous = output_dir / LATEST
    if previous is None:
        steps = [p for p in list_checkpoints(output_dir) if p.name != LATEST]
        previous = steps[-1] if steps else None
    return f"the previous checkpoint {previous.name} is intact" if previous else "no earlier checkpoint exists"


def _check_state(state: dict, step: int) -> None:
    """A state the trainer built wrong is a bug: say which key, before anything touches the disk."""
    problems = resume_problems(state) if state.get("format") == FORMAT else [f"format is not {FORMAT!r}"]
    unsafe = _unsafe_value(state, "state")
    if unsafe:
        problems.append(f"{unsafe}, which torch.load(weights_only=True) refuses; store plain values")
    if not problems and state["progress"]["step"] != step:
        problems.append(f"progress.step is {state['progress']['step']} but the file is for step {step}")
    if problems:
        raise ValueError(f"checkpoint state for step {step} is invalid: {'; '.join(problems)}")


def save_checkpoint(state: dict, output_dir: Path, step: int, *, keep: int) -> Path:
    """Publish `output_dir/model_step{step}.pth` atomically, point latest.pth at it, then rotate to `keep`.

    A failure (disk full, ...) leaves every earlier checkpoint and latest.pth as they were, removes the
    temp file and raises CheckpointSaveError.
    """
    if keep < 1:
        raise UserError(f"--keep-checkpoints must be >= 1, got {keep}")
    _check_state(state, step)
    output_dir = Path(output_dir)
    final = output_dir / f"model_step{step}.pth"
    try:
        output_dir.mkdir(parents=True, exist_ok=True)
        _remove_stale_temps(output_dir)
        atomic_write(state, final, step)
    except (OSError, RuntimeError) as exc:
        raise CheckpointSaveError(
            f"could not save checkpoint step {step} to {output_dir}: {failure_reason(exc)}; "
            f"{_previous_description(output_dir)}; free space or fix the directory, then rerun "
            "with --resume auto") from exc
    crash_point("save_before_latest", step)
    try:
        _publish_latest(output_dir, final)
        crash_point("save_before_rotate", step)
        _rotate(output_dir, keep, final)
    except OSError as exc:
        raise CheckpointSaveError(
            f"saved {final}, but could not update latest.pth or remove old checkpoints: "
            f"{failure_reason(exc)}; --resume auto still finds the newest complete checkpoint") from exc
    return final


# ----------------------------------------------------------------------------- find


def find_resume_checkpoint(output_dir: Path) -> tuple[Path | None, list[tuple[Path, str]]]:
    """The newest checkpoint that verifies COMPLETE (latest.pth first) and what was skipped, with why.

    Skipped files stay on disk untouched.
    """
    files = list_checkpoints(output_dir)
    # latest.pth first, then step files newest first. A kill between publishing model_step{N}.pth and
    # moving latest.pth leaves a complete step file newer than latest.pth: prefer it.
    latest = [p for p in files if p.name == LATEST]
    steps = sorted((p for p in files if p.name != LATEST), key=_step_of, reverse=True)
    newer = [p for p in steps if latest and same_file(p, latest[0])]
    if newer:
        steps = steps[: steps.index(newer[0])] + latest + steps[steps.index(newer[0]):]
    candidates = steps if newer else latest + steps
    skipped: list[tuple[Path, str]] = []
    failures: dict[Path, str] = {}
    for path in candidates:
        twin = next((bad for bad in failures if same_file(path, bad)), None)
        if twin is not None:  # a hard link of a file that already failed
            skipped.append((path, f"same file as {twin.name}, {failures[twin]}"))
            continue
        verdict = verify_checkpoint(path)
        if verdict.status == "COMPLETE":
            return path, skipped
        failures[path] = reason = f"{verdict.status}: {'; '.join(verdict.reasons)}"
        skipped.append((path, reason))
    return None, skipped
