"""Small files that describe a great deal of work: what the readers must refuse before doing it.

Each builder writes one file (a few KB at most, unless said) and returns its path. Shared by the
reader unit tests and the tests of the public commands (pytest puts this folder on sys.path).
"""

from __future__ import annotations

import io
import os
import zipfile
from pathlib import Path

import numpy as np
import torch

BOMB_INFLATED = 64 << 20  # what the zip bomb's member inflates to; its file is about 64 KB


def _torch_zip(obj: object) -> zipfile.ZipFile:
    buffer = io.BytesIO()
    torch.save(obj, buffer)
    buffer.seek(0)
    return zipfile.ZipFile(buffer)


def _rewrite(source: zipfile.ZipFile, path: Path, replace: dict[str, tuple[bytes, int]]) -> Path:
    """`source`'s members into `path`, those whose name ends with a key of `replace` given new
    (bytes, compression): the zip layout torch reads, with one member swapped."""
    with zipfile.ZipFile(path, "w") as out:
        for info in source.infolist():
            suffix = next((key for key in replace if info.filename.endswith(key)), None)
            if suffix is None:
                out.writestr(info, source.read(info))
                continue
            data, compression = replace[suffix]
            info.compress_type = compression
            out.writestr(info, data)
    return path


def zip_bomb(path: Path) -> Path:
    """A checkpoint whose tensor storage is deflated: ~64 KB on disk, BOMB_INFLATED bytes inflated."""
    source = _torch_zip({"model": {"w": torch.zeros(BOMB_INFLATED // 4)[:1].clone()}})
    return _rewrite(source, path, {"/data/0": (bytes(BOMB_INFLATED), zipfile.ZIP_DEFLATED)})


def strided_view(path: Path, side: int = 10**6) -> Path:
    """A checkpoint of a 4-element storage viewed as side x side elements (stride 0): about 1 KB."""
    view = torch.zeros(4).as_strided((side, side), (0, 0))
    torch.save({"model": {"w": view}}, path)
    return path


def shared_references(path: Path, references: int, *, compressed: bool = False) -> Path:
    """A checkpoint whose pickle is one list of `references` references to one dict (2 bytes each)."""
    pickle = b"\x80\x02]q\x00(}q\x01" + b"h\x01" * (references - 1) + b"e."
    source = _torch_zip({"a": 1})
    compression = zipfile.ZIP_DEFLATED if compressed else zipfile.ZIP_STORED
    return _rewrite(source, path, {"/data.pkl": (pickle, compression)})


def foreign_key(path: Path, state: dict) -> Path:
    """`state` with an int key added to its model dict (a checkpoint no trainer of ours writes)."""
    torch.save({**state, "model": {**state["model"], 7: torch.zeros(1)}}, path)
    return path


def huge_npy(path: Path, elements: int = 10**10) -> Path:
    """An .npy whose header claims `elements` float32 values; the file holds 8 of them."""
    header = {"descr": "<f4", "fortran_order": False, "shape": (elements,)}
    with open(path, "wb") as handle:
        np.lib.format.write_array_header_1_0(handle, header)
        handle.write(np.zeros(8, dtype=np.float32).tobytes())
    return path


def yaml_bomb(path: Path, levels: int = 9) -> Path:
    """Nested anchors, each level nine aliases of the one before: 9^levels values from ~1 KB."""
    lines = ["a0: &a0 [x, x, x, x, x, x, x, x, x]"]
    for level in range(1, levels + 1):
        lines.append(f"a{level}: &a{level} [{', '.join([f'*a{level - 1}'] * 9)}]")
    lines.append(f"gpt: *a{levels}")
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def deep_json(depth: int = 100_000) -> str:
    """One JSON line nested `depth` lists deep."""
    return "[" * depth + "]" * depth


def fifo(path: Path) -> Path:
    """A named pipe: opening it for reading blocks until someone writes."""
    os.mkfifo(path)
    return path
