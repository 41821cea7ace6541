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

import pickle
from contextlib import nullcontext
from math import prod
from pathlib import Path
from typing import Any

import numpy as np
import torch

# numpy's own spellings in a pickled dtype: bool, signed/unsigned ints, floats, complex.
PLAIN_DTYPES = frozenset({"b1", "i1", "i2", "i4", "i8", "u1", "u2", "u4", "u8", "f2", "f4", "f8", "c8", "c16"})
REFUSED = "numpy content refused"  # starts every refusal message, so callers can say what happened


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


def _plain(obj: Any) -> Any:
    """Stand-ins -> real numpy values, TorchVersion -> str; containers rebuilt only where needed."""
    if isinstance(obj, _Array):
        if obj.array is None:
            raise _refuse("a numpy array without its pickled state")
        return obj.array
    if isinstance(obj, _Dtype):
        if obj.dtype is None:
            raise _refuse("a numpy dtype without its pickled state")
        return obj.dtype
    if isinstance(obj, torch.torch_version.TorchVersion):
        return str(obj)
    if isinstance(obj, dict):
        for key, value in obj.items():
            new = _plain(value)
            if new is not value:
                obj[key] = new
        return obj
    if isinstance(obj, list):
        obj[:] = [_plain(value) for value in obj]
        return obj
    if type(obj) is tuple:
        items = tuple(_plain(value) for value in obj)
        return obj if all(a is b for a, b in zip(items, obj, strict=True)) else items
    return obj


def load_weights_only(path: Path, *, mmap: bool = False) -> Any:
    """torch.load(weights_only=True) on the CPU, plus plain numpy arrays (see the module docstring).

    torch before 2.5 cannot bind a global name to another object: there the numpy allow-list is
    off and such files are refused as before.
    """
    allow = getattr(torch.serialization, "safe_globals", None)
    with allow(SAFE_GLOBALS) if allow is not None else nullcontext():
        obj = torch.load(path, map_location="cpu", weights_only=True, mmap=mmap)
    return _plain(obj)
