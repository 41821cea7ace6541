"""torch.load(weights_only=True) that also accepts plain numpy arrays, and nothing more.

The community train_gpt_v2.py puts `np.random.get_state()` (a uint32 array) and `torch.__version__`
(a str subclass) into its latest.pth. A weights-only load refuses both, so `verify` and `repair`
could not read the file users actually have. Allowing `numpy.ndarray` and `numpy.dtype` as plain
safe globals would also admit object arrays and dtypes whose pickled state claims to hold Python
objects (numpy then treats raw bytes as object pointers). So the numpy names a pickle may use are
bound to narrow stand-ins instead:

    numpy.dtype(spec, align, copy)   -> _Dtype: spec must be a plain number type (PLAIN_DTYPES), and
                                        its BUILD state may only choose the byte order
    numpy[._core|.core].multiarray._reconstruct(numpy.ndarray, ...) -> _Array: its BUILD state must
                                        be (1, shape, _Dtype, fortran, bytes of exactly the right size)
    numpy.ndarray                     -> a marker that only _Array accepts (never callable)

After loading, every stand-in is replaced by the real, freshly built `np.ndarray` (or `np.dtype`),
and a TorchVersion by a plain str. Any other global is refused by torch as before.
"""

from __future__ import annotations

import os
import pickle
import zipfile
from contextlib import nullcontext
from math import prod
from pathlib import Path
from typing import Any

import numpy as np
import torch

from indextts_train.errors import CheckpointError

# numpy's own spellings in a pickled dtype: bool, signed/unsigned ints, floats, complex.
PLAIN_DTYPES = frozenset({"b1", "i1", "i2", "i4", "i8", "u1", "u2", "u4", "u8", "f2", "f4", "f8", "c8", "c16"})
REFUSED = "numpy content refused"  # starts every refusal message, so callers can say what happened
NOT_OURS = "not a checkpoint this program wrote"  # starts the refusal of a file past the bounds below
# Far above any checkpoint this program writes (depth ~6; a million logged steps ~ 7M values).
MAX_DEPTH = 32
MAX_NODES = 20_000_000  # values (containers and leaves), counted as often as they are reachable
MAX_BYTES = 1 << 30  # str/bytes/numpy payload, counted the same way
# The pickle torch's weights-only unpickler reads op by op in Python (about a million ops a second, an op
# per 1 to 10 bytes): the bound on its work. Our largest pickles (a long run's loss history) are far below.
MAX_PICKLE_BYTES = 32 << 20
MAX_MEMBERS = 100_000  # zip entries: one per tensor storage (a full IndexTTS2 state with AdamW: ~1,500)
_EOCD_SEARCH = 22 + 0xFFFF  # the end record and the longest comment it may carry
# Tensor data reachable through the file, counted as often as it is reachable, at most this many
# times the bytes the file stores (tied weights share storage; nothing of ours comes near 2).
TENSOR_BYTES_PER_FILE_BYTE = 4


def _refuse(why: str) -> pickle.UnpicklingError:
    return pickle.UnpicklingError(f"{REFUSED}: {why}")


class _Dtype:
    """What `numpy.dtype(...)` in a pickle asks for; becomes a real dtype only if it is plain."""

    dtype: np.dtype | None = None  # also None when a pickle made one without __init__ (NEWOBJ)

    def __init__(self, spec: Any, align: Any = False, copy: Any = False) -> None:
        if not isinstance(spec, str) or spec not in PLAIN_DTYPES:
            raise _refuse(f"numpy dtype {spec!r} is not a plain number type")
        self.dtype = np.dtype(spec)

    def __setstate__(self, state: Any) -> None:
        # (version, byte order, subarray, names, fields, elsize, alignment, flags): for a plain
        # number type everything but the byte order is fixed, and flags 0 means "no objects".
        if self.dtype is None or not (isinstance(state, tuple) and len(state) == 8 and state[0] == 3
                                      and state[1] in ("<", ">", "|") and state[2:] == (None, None, None, -1, -1, 0)):
            raise _refuse("a numpy dtype has an unexpected pickled state")
        if state[1] != "|":
            self.dtype = self.dtype.newbyteorder(state[1])


class _NdarrayName:
    """Stands for `numpy.ndarray` inside a pickle: recognised by _Array, useless anywhere else."""

    __slots__ = ()

    def __call__(self, *args: Any) -> Any:
        raise _refuse("numpy.ndarray may only be rebuilt from its pickled state")


_NDARRAY = _NdarrayName()


class _Array:
    """`_reconstruct(numpy.ndarray, (0,), b'b')` followed by BUILD with the array's state."""

    array: np.ndarray | None = None  # set by __setstate__ only

    def __init__(self, subtype: Any, shape: Any, typecode: Any) -> None:
        if subtype is not _NDARRAY:
            raise _refuse(f"only numpy.ndarray may be rebuilt, not {subtype!r}")

    def __setstate__(self, state: Any) -> None:
        if not (isinstance(state, tuple) and len(state) == 5 and state[0] == 1):
            raise _refuse("a numpy array has an unexpected pickled state")
        _, shape, dtype, fortran, data = state
        if not isinstance(dtype, _Dtype) or dtype.dtype is None:
            raise _refuse("a numpy array's dtype is not a plain number type")
        if not (isinstance(shape, tuple) and all(type(n) is int and n >= 0 for n in shape)
                and isinstance(data, bytes) and len(data) == prod(shape) * dtype.dtype.itemsize):
            raise _refuse("a numpy array's shape does not match its data")
        flat = np.frombuffer(data, dtype=dtype.dtype).copy()  # (prod(shape),), writable, owns its memory
        self.array = flat.reshape(shape, order="F" if fortran else "C")


_RECONSTRUCT_NAMES = ("numpy._core.multiarray._reconstruct", "numpy.core.multiarray._reconstruct")
# (object, name a pickle's GLOBAL uses): torch resolves each name to our object, never to numpy's.
SAFE_GLOBALS: list[tuple[Any, str]] = [
    (_Dtype, "numpy.dtype"),
    (_NDARRAY, "numpy.ndarray"),
    *((_Array, name) for name in _RECONSTRUCT_NAMES),
    (torch.torch_version.TorchVersion, "torch.torch_version.TorchVersion"),  # a str subclass
]


class _BoundedWalk:
    """Stand-ins -> real numpy values, TorchVersion -> str; containers rebuilt only where needed.

    A pickle's memo lets a few hundred bytes describe a list nested 40 deep whose elements are the
    same list twice: 2^40 paths to walk. Each container is therefore converted once (memoised by id),
    and its size counts as often as it is reachable, since that is what any later plain walk of the
    checkpoint (verify's summary, validate, the NaN check) pays. Past MAX_DEPTH, MAX_NODES,
    MAX_BYTES or `tensor_budget` bytes of tensor data the file is refused: none of ours comes near.

    Every tensor must hold no more elements than its storage: a strided view with zero or overlapping
    strides over a 1 KB storage can claim 10^12 elements, which the first read of it would materialise.
    """

    def __init__(self, tensor_budget: int) -> None:
        self.tensor_budget = tensor_budget
        # id -> (plain value, nodes, payload bytes, tensor bytes)
        self.memo: dict[int, tuple[Any, int, int, int]] = {}
        # id -> how many levels a container reaches below itself, so that a memo hit deeper down still
        # counts its whole height against MAX_DEPTH (a chain of shared lists is as deep as it looks)
        self.height: dict[int, int] = {}

    def plain(self, obj: Any, depth: int = 0) -> tuple[Any, int, int, int]:
        """(the plain value of `obj`, the nodes reachable through it, their payload and tensor bytes)."""
        if depth > MAX_DEPTH:
            raise _not_ours(f"data nested deeper than {MAX_DEPTH} levels")
        if not isinstance(obj, (dict, list, tuple, _Array, _Dtype)):
            return _leaf(obj)
        known = self.memo.get(id(obj))
        if known is not None:
            if depth + self.height.get(id(obj), 0) > MAX_DEPTH:
                raise _not_ours(f"data nested deeper than {MAX_DEPTH} levels")
            return known
        if isinstance(obj, (_Array, _Dtype)):
            value = _real(obj)
            result = (value, 1, value.nbytes if isinstance(value, np.ndarray) else 0, 0)
        else:
            result = self._container(obj, depth)
        if result[1] > MAX_NODES or result[2] > MAX_BYTES:
            raise _not_ours(f"more than {MAX_NODES} values or {MAX_BYTES >> 20} MiB of plain data "
                            "(shared references counted as often as they are reachable)")
        if result[3] > self.tensor_budget:
            raise _not_ours(f"its tensors reach more than {self.tensor_budget >> 20} MiB of data, "
                            f"{TENSOR_BYTES_PER_FILE_BYTE} times what the file stores (shared tensors "
                            "counted as often as they are reachable)")
        self.memo[id(obj)] = result
        return result

    def _container(self, obj: dict | list | tuple, depth: int) -> tuple[Any, int, int, int]:
        children = list(obj.values()) if isinstance(obj, dict) else list(obj)
        walked = [self.plain(value, depth + 1) for value in children]
        keys = [_leaf(key) for key in obj] if isinstance(obj, dict) else []
        parts = [*walked, *keys]
        nodes = 1 + sum(part[1] for part in parts)
        size, tensors = sum(part[2] for part in parts), sum(part[3] for part in parts)
        items = [w[0] for w in walked]
        self._note_height(obj, children)
        if isinstance(obj, dict):
            for key, value, new in zip(list(obj), children, items, strict=True):
                if new is not value:
                    obj[key] = new
            return obj, nodes, size, tensors
        if isinstance(obj, list):
            obj[:] = items
            return obj, nodes, size, tensors
        same = type(obj) is not tuple or all(a is b for a, b in zip(items, obj, strict=True))
        return (obj if same else tuple(items)), nodes, size, tensors

    def _note_height(self, obj: Any, children: list) -> None:
        self.height[id(obj)] = max((1 + self.height.get(id(child), 0) for child in children), default=0)


def _not_ours(why: str) -> pickle.UnpicklingError:
    return pickle.UnpicklingError(f"{NOT_OURS}: {why}")


def _leaf(obj: Any) -> tuple[Any, int, int, int]:
    """A value that holds no other: TorchVersion -> str; str and bytes count their length, a tensor
    the bytes of data it claims (checked against its storage)."""
    if isinstance(obj, torch.torch_version.TorchVersion):
        obj = str(obj)
    if isinstance(obj, torch.Tensor):
        return obj, 1, 0, _tensor_bytes(obj)
    return obj, 1, len(obj) if isinstance(obj, (str, bytes)) else 0, 0


def _tensor_bytes(tensor: torch.Tensor) -> int:
    """The bytes a dense CPU tensor claims; refused when that is more than its storage holds."""
    if tensor.layout != torch.strided or tensor.is_nested or tensor.device.type != "cpu":
        raise _not_ours(f"a {tensor.layout} tensor on {tensor.device} (only dense CPU tensors are stored)")
    claimed = tensor.numel() * tensor.element_size()
    stored = tensor.untyped_storage().nbytes()
    if claimed > stored:
        raise _not_ours(f"a tensor of shape {list(tensor.shape)} claims {tensor.numel()} elements but its "
                        f"storage holds {stored} bytes (a strided view that repeats its data)")
    return claimed


def _real(obj: _Array | _Dtype) -> np.ndarray | np.dtype:
    if isinstance(obj, _Array):
        if obj.array is None:
            raise _refuse("a numpy array without its pickled state")
        return obj.array
    if obj.dtype is None:
        raise _refuse("a numpy dtype without its pickled state")
    return obj.dtype


def check_zip_bounds(path: Path, file_bytes: int) -> None:
    """Refuse a zip whose members could inflate past what the file holds, or whose pickle is too big.

    torch.save stores every member uncompressed; a compressed member (a 35 KB zip can inflate to
    gigabytes) or members claiming more bytes than the archive has (overlapping entries) are refused
    from the central directory alone, before anything is read or inflated. Every later read (the
    CRC pass, torch's own) then reads at most the file's own bytes: call this before any of them.
    """
    count = _member_count(path)
    if count is not None and count > MAX_MEMBERS:  # zipfile would parse every entry first (1M: 25 s, 850 MB)
        raise _not_ours(f"its zip directory lists {count} members (a checkpoint of ours holds a few thousand; at "
                        f"most {MAX_MEMBERS})")
    try:
        with zipfile.ZipFile(path) as archive:
            members = archive.infolist()
    except (zipfile.BadZipFile, OSError, EOFError, ValueError):
        return  # the CRC pass and torch.load say what is wrong with it
    packed = [m for m in members if m.compress_type != zipfile.ZIP_STORED or m.file_size != m.compress_size]
    if packed:
        raise _not_ours(f"its member {packed[0].filename} is compressed ({packed[0].compress_size} bytes "
                        f"inflating to {packed[0].file_size}); torch.save stores members uncompressed")
    total = sum(m.file_size for m in members)
    if total > file_bytes:
        raise _not_ours(f"its members claim {total} bytes but the file has {file_bytes}")
    size = sum(m.file_size for m in members if m.filename.endswith("/data.pkl") or m.filename == "data.pkl")
    if size > MAX_PICKLE_BYTES:
        raise _not_ours(f"its pickle holds {size >> 20} MiB of plain data (at most {MAX_PICKLE_BYTES >> 20} MiB)")


def _member_count(path: Path) -> int | None:
    """The number of entries a zip's end record declares (its zip64 record's when the count overflows 16
    bits), read from the file's tail alone; None when there is no end record to read (the readers say why)."""
    with open(path, "rb") as handle:
        size = handle.seek(0, os.SEEK_END)
        tail_start = max(0, size - _EOCD_SEARCH)
        handle.seek(tail_start)
        tail = handle.read()
        at = tail.rfind(b"PK\x05\x06")
        if at < 0 or at + 22 > len(tail):
            return None
        count = int.from_bytes(tail[at + 10:at + 12], "little")
        locator = at - 20  # the zip64 end-record locator sits right before the end record
        if count != 0xFFFF or locator < 0 or tail[locator:locator + 4] != b"PK\x06\x07":
            return count
        handle.seek(int.from_bytes(tail[locator + 8:locator + 16], "little"))
        record = handle.read(40)
        return int.from_bytes(record[32:40], "little") if record[:4] == b"PK\x06\x06" else None


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


def load_weights_only(path: Path, *, mmap: bool = False, check_crc: bool = False) -> Any:
    """torch.load(weights_only=True) on the CPU, plus plain numpy arrays (see the module docstring).

    The work is bounded before it is done where the zip's central directory tells (check_zip_bounds),
    and the plain data and tensors after (_BoundedWalk); a file past the bounds raises an
    UnpicklingError whose message starts with NOT_OURS. `check_crc`: every zip member's CRC-32 is
    checked after the bounds and before torch reads it (torch itself does not notice a flipped byte
    inside tensor data); a failure is a CheckpointError. `mmap` applies to zip files (the old format
    cannot be mapped).

    torch before 2.5 cannot bind a global name to another object: there the numpy allow-list is
    off and such files are refused as before.
    """
    file_bytes = os.stat(path).st_size
    is_zip = zipfile.is_zipfile(path)
    if is_zip:
        check_zip_bounds(path, file_bytes)
        if check_crc:
            _check_zip_crc(path)
    elif file_bytes > MAX_PICKLE_BYTES:  # the old format is one pickle with the tensor data after it
        raise _not_ours(f"an old-format (not zip) torch file of {file_bytes >> 20} MiB is read op by op; "
                        f"at most {MAX_PICKLE_BYTES >> 20} MiB (save it again with torch.save)")
    allow = getattr(torch.serialization, "safe_globals", None)
    with allow(SAFE_GLOBALS) if allow is not None else nullcontext():
        obj = torch.load(path, map_location="cpu", weights_only=True, mmap=mmap and is_zip)
    return _BoundedWalk(TENSOR_BYTES_PER_FILE_BYTE * file_bytes + (1 << 20)).plain(obj)[0]
