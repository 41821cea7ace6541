"""Small files that describe a great deal of work: what the readers must refuse before doing it.

Each builder writes one file (a few KB at most, unless said) and returns its path. Shared by the
reader unit tests and the tests of the public commands (pytest puts this folder on sys.path).
"""

from __future__ import annotations

import io
import os
import zipfile
import zlib
from pathlib import Path

import numpy as np
import torch

BOMB_INFLATED_MIB = 2047  # what the zip bomb's member inflates to (2 GiB); its file is about 2 MB


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


def _deflated_zeros(mib: int) -> bytes:
    """A raw deflate stream of `mib` MiB of zeros, built from one fully flushed 1 MiB block repeated
    (a flushed block refers to nothing before it): a 2 GiB member costs milliseconds to build."""
    packer = zlib.compressobj(9, zlib.DEFLATED, -15)
    block = packer.compress(bytes(1 << 20)) + packer.flush(zlib.Z_FULL_FLUSH)
    return block * mib + packer.flush()


def _patch_member(data: bytearray, suffix: str, method: int, size: int) -> None:
    """Set a member's compression method and inflated size in its local header and central entry."""
    for signature, name_at, fields in ((b"PK\x03\x04", 26, (8, 22)), (b"PK\x01\x02", 28, (10, 24))):
        at = data.find(signature)
        while at != -1:
            name_len = int.from_bytes(data[at + name_at:at + name_at + 2], "little")
            start = at + (30 if signature == b"PK\x03\x04" else 46)
            if bytes(data[start:start + name_len]).decode().endswith(suffix):
                data[at + fields[0]:at + fields[0] + 2] = method.to_bytes(2, "little")
                data[at + fields[1]:at + fields[1] + 4] = size.to_bytes(4, "little")
            at = data.find(signature, at + 4)


def zip_bomb(path: Path, inflated_mib: int = BOMB_INFLATED_MIB) -> Path:
    """A checkpoint whose tensor storage is a deflated member: ~2 MB on disk, inflating to 2 GiB.

    Its CRC is not that of the inflated bytes: a reader must refuse it before inflating anything."""
    source = _torch_zip({"model": {"w": torch.zeros(1)}})
    _rewrite(source, path, {"/data/0": (_deflated_zeros(inflated_mib), zipfile.ZIP_STORED)})
    data = bytearray(path.read_bytes())
    _patch_member(data, "/data/0", zipfile.ZIP_DEFLATED, inflated_mib << 20)
    path.write_bytes(bytes(data))
    return path


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


def claimed_sizes(path: Path, member_suffix: str, claimed: int) -> Path:
    """Patch the zip's central directory so that the member ending with `member_suffix` claims
    `claimed` bytes (stored, uncompressed): what a 240 MB pickle's entry says, in a file of a few KB."""
    data = bytearray(path.read_bytes())
    at = data.find(b"PK\x01\x02")
    while at != -1:
        name_len = int.from_bytes(data[at + 28:at + 30], "little")
        name = bytes(data[at + 46:at + 46 + name_len]).decode()
        if name.endswith(member_suffix):
            data[at + 20:at + 28] = claimed.to_bytes(4, "little") * 2  # compressed and uncompressed size
        at = data.find(b"PK\x01\x02", at + 46)
    path.write_bytes(bytes(data))
    return path
