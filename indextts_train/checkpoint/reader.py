"""Reading a checkpoint file safely and within bounds.

Files are read with `torch.load(weights_only=True)` through the allow-list unpickler, so a checkpoint
from a stranger cannot run code; the plain-data walk is bounded (depth, values, bytes), so a crafted
file cannot hang a reader; and the zip CRC-32 of every member is checked first, because torch itself
does not notice a flipped byte inside tensor data (zip bounds, CRC and the bounded load are one call
into files/numpy_pickle.py). A checkpoint of our format comes back migrated.
"""

from __future__ import annotations

import pickle
import re
import zipfile
from pathlib import Path
from typing import Any

import torch

from indextts_train.checkpoint.adapter_file import missing_reason
from indextts_train.checkpoint.model_fit import stored_config
from indextts_train.checkpoint.state import FORMAT, migrate
from indextts_train.config.settings import Config, load_config
from indextts_train.errors import CheckpointError, UserError
from indextts_train.files.bounded import check_regular
from indextts_train.files.numpy_pickle import NOT_OURS, load_weights_only
from indextts_train.files.numpy_pickle import REFUSED as NUMPY_REFUSED


def _first_line(exc: BaseException) -> str:
    text = next((line.strip() for line in str(exc).splitlines() if line.strip()), "")
    return (text[:160] + "...") if len(text) > 160 else (text or type(exc).__name__)


def _check_file(path: Path) -> None:
    """What is refused before torch reads a byte: a missing file, a folder, not a regular file."""
    if not path.exists() or path.is_dir():
        raise CheckpointError(f"{path}: {missing_reason(path)}")
    try:
        check_regular(path, "checkpoint")  # a FIFO would block, a /proc file's size is not its content
    except UserError as exc:
        raise CheckpointError(str(exc)) from None


def _unpickling_error(path: Path, exc: pickle.UnpicklingError) -> CheckpointError:
    if str(exc).startswith(NOT_OURS):
        return CheckpointError(f"refusing to load {path}: {exc}")
    refused = re.search(rf"{NUMPY_REFUSED}: ([^\n]+)", str(exc))
    if refused:
        return CheckpointError(f"refusing to load {path}: {refused.group(1)}; only tensors, plain containers "
                               "and numpy arrays of plain number types are accepted")
    unsafe = re.search(r"GLOBAL ([\w.]+)", str(exc))
    if unsafe:
        return CheckpointError(f"refusing to load {path}: it contains pickled Python objects that could run code "
                               f"({unsafe.group(1)}); only tensors and plain containers are accepted")
    return CheckpointError(f"{path} is not a readable checkpoint: {_unpickle_reason(exc)}")


def _read(path: Path, *, mmap: bool, check_crc: bool = True) -> Any:
    """torch.load(weights_only=True) with every failure turned into a one-line CheckpointError."""
    _check_file(path)
    try:  # zip bounds and CRC first, then the bounded load (files/numpy_pickle.py)
        obj = load_weights_only(path, mmap=mmap, check_crc=check_crc)
    except CheckpointError:
        raise
    except pickle.UnpicklingError as exc:
        raise _unpickling_error(path, exc) from None
    except EOFError:
        raise CheckpointError(f"{path} is not a readable checkpoint: the file ends early "
                              "(empty or truncated)") from None
    except Exception as exc:  # anything else a hostile or damaged file provokes means "unreadable"
        if not zipfile.is_zipfile(path) and _starts_like_zip(path):
            reason = "the zip archive has no end record: the file is truncated (an interrupted save or copy)"
        else:
            reason = f"truncated, corrupt or not written by torch.save ({_first_line(exc)})"
        raise CheckpointError(f"{path} is not a readable checkpoint: {reason}") from None
    foreign = _foreign_structure(obj) if isinstance(obj, dict) else None
    if foreign:
        raise CheckpointError(f"{path} is not a checkpoint this program or torch's state_dict writes: {foreign}")
    return obj


def _starts_like_zip(path: Path) -> bool:
    with open(path, "rb") as f:
        return f.read(4) == b"PK\x03\x04"


def _unpickle_reason(exc: BaseException) -> str:
    detail = re.search(r"Unsupported operand \S+", str(exc))
    return f"not written by torch.save, or damaged ({detail.group(0) if detail else 'unpickling failed'})"


def _key_problem(mapping: dict, where: str) -> str | None:
    odd = next((key for key in mapping if not isinstance(key, str)), None)
    if odd is not None:
        return f"{where} has a key of type {type(odd).__name__} ({repr(odd)[:40]}); names are strings"
    return None


def _foreign_structure(obj: dict) -> str | None:
    """Why `obj` cannot be a checkpoint (ours, the community's or a bare state dict), or None: every
    reader below names weights by their string keys, so a file that breaks that is refused here."""
    model = obj.get("model") if isinstance(obj.get("model"), dict) else None
    problem = _key_problem(obj, "the file's dict") or (model is not None and _key_problem(model, "its model dict"))
    if problem:
        return problem
    if model is not None:
        odd = next((k for k, v in model.items() if not isinstance(v, torch.Tensor)), None)
        if odd is not None:
            return f"its model dict's {odd[:80]!r} is a {type(model[odd]).__name__}, not a tensor"
    return None


def read_unchecked(path: Path) -> Any:
    """The file's objects with tensor data left on disk and no CRC pass: cheap, for a quick look."""
    return _read(path, mmap=True, check_crc=False)


def load_checkpoint(path: Path, *, mmap: bool = False, crc_checked: bool = False) -> dict:
    """Load a checkpoint on the CPU, refusing anything that would need code to unpickle. Deletes nothing.

    A checkpoint of our format comes back migrated to the current format_version (state.migrate).

    `mmap` leaves tensor data on disk until touched (enough to read a stored config); `crc_checked`
    skips the checksum pass when verify_checkpoint just read the whole file, as resume does.
    """
    path = Path(path)
    obj = _read(path, mmap=mmap, check_crc=not crc_checked)
    if not isinstance(obj, dict):
        raise CheckpointError(f"{path} holds a {type(obj).__name__}, not a checkpoint dict")
    return migrate(obj) if obj.get("format") == FORMAT else obj


def config_for(path: Path, explicit: Path | None, *, fallback: Path | None = None,
               loaded: dict | None = None) -> Config:
    """The config a checkpoint was trained with: `explicit` if given, else the one stored in it.

    `loaded` is the file's contents when the caller has read it already (load_verified); otherwise
    it is read by mmap: only the small config is touched, not the tensors. `fallback` serves files
    that store none (a bare gpt.pth); without one, such a file is a one-line error.
    """
    if explicit is not None:
        return load_config(explicit)
    state = loaded if loaded is not None else load_checkpoint(path, mmap=True)
    stored = stored_config(state, f"{path} (stored config)")  # read as verify reads it (model_fit.py)
    if stored is not None:
        return stored
    if fallback is not None:
        return load_config(fallback)
    raise UserError(f"{path} stores no config; pass --config with the IndexTTS2 config.yaml it was trained with")
