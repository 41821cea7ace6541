"""Reading the files a user hands us (configs, JSON lines, .npy arrays) within bounds fixed before the work.

A small file can still describe a huge amount of work: YAML anchors that expand a billion times, JSON
nested 100,000 deep, an .npy header claiming 10^10 elements, a FIFO that never ends. Every reader here
checks what the work will cost (bytes, nodes, depth, elements) from what it has already read, and
refuses with one line naming the file before doing it:

- `open_regular`: only a regular file is opened (a FIFO, device or /proc file is refused: a FIFO
  blocks the reader, a /proc file's size is not its content); `iter_lines` reads such a file line by line;
  `check_file` says, before any work, that a path given for a file is missing, a folder or not a file;
- `load_yaml`: at most MAX_YAML_BYTES, and the document with every alias expanded at most
  MAX_YAML_NODES nodes (a recursive alias is refused);
- `parse_json`: one JSON value nested at most MAX_JSON_DEPTH deep;
- `read_npy`: the header's shape times its item size must be exactly what the file holds, and at
  most MAX_NPY_BYTES, before any memory is allocated.
"""

from __future__ import annotations

import contextlib
import gzip
import hashlib
import itertools
import json
import os
import stat
from collections.abc import Callable, Iterator
from math import prod
from pathlib import Path
from typing import IO, Any

import numpy as np
import yaml

from indextts_train.errors import TOO_LONG_NUMBER, UserError

# Far above what this program writes or reads: configs and run records are a few KB, manifest lines
# are flat objects, one utterance's largest array (condition latents, 32 x 1280 float32) is 160 KB.
MAX_YAML_BYTES = 4 << 20
MAX_YAML_NODES = 200_000  # scalars, lists and mappings, each alias counted as the whole value it names
MAX_YAML_DEPTH = 64  # levels of [ ] and { }
MAX_JSON_DEPTH = 64
MAX_LINE_BYTES = 64 << 20  # a manifest, corpus or --lines line: bytes to kilobytes of text
MAX_TOKENIZER_BYTES = 256 << 20  # a SentencePiece model or tiktoken ranks file: a few MB
MAX_NPY_BYTES = 1 << 30
PSEUDO_FILE_SYSTEMS = ("/proc/", "/sys/", "/dev/")  # files whose stat size is not what a read returns

LOOKED_AT = 1000  # entries of a folder given for a file that are looked at for the files meant
_MEANT = {"manifest": (".jsonl",), "corpus": (".txt", ".jsonl"), "tokenizer": (".model", ".tiktoken"),  # what a
          "tokenizer model": (".model",), "checkpoint": (".pth",), "config": (".yaml",)}  # folder there may hold
# Of those, what prepare's output folder holds for each flag, named first; rejected.jsonl lists the clips it
# left out, never a manifest (suggested first by name order, it led a newcomer to "manifest is empty").
_FIRST = {"--train-manifest": ("train.jsonl", "val.jsonl"), "--val-manifest": ("val.jsonl", "train.jsonl")}
_NEVER = {"manifest": ("rejected.jsonl", "events.jsonl", "scores.jsonl")}  # and a run folder's event and score logs

_KINDS = ((stat.S_ISDIR, "a folder"), (stat.S_ISFIFO, "a FIFO (named pipe)"), (stat.S_ISCHR, "a character device"),
          (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"))


def kind_of_mode(mode: int) -> str:
    """What a file's mode (os.stat) says it is, in words: "a folder", "a FIFO (named pipe)", ..."""
    return next((name for test, name in _KINDS if test(mode)), "not a regular file")


def kind_of_path(path: Path | str) -> str:
    """What stands at `path` (links followed), in words; a link that leads to no file says so."""
    try:
        return kind_of_mode(os.stat(path).st_mode)
    except OSError:  # a link to nothing, or a loop of links
        return "a symbolic link that leads to no file"


def open_regular(path: Path | str, what: str = "file") -> IO[bytes]:
    """`path` opened for binary reading, refused in one line unless it is a regular file.

    Opened with O_NONBLOCK, so that a FIFO cannot block the open itself; the kind is then taken from
    the open descriptor (fstat), so a file swapped in between cannot slip past the check.
    """
    path = Path(path)
    real = os.path.realpath(path)
    if any(real.startswith(prefix) for prefix in PSEUDO_FILE_SYSTEMS):
        raise UserError(f"{path}: {what} is a system pseudo-file ({real}), not a regular file; pass a file")
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except FileNotFoundError:
        raise UserError(f"{path}: {what} not found") from None
    except IsADirectoryError:
        raise UserError(f"{path}: {what} is a folder, not a file") from None
    except OSError as exc:
        raise UserError(f"{path}: {what} cannot be opened ({exc.strerror})") from None
    mode = os.fstat(fd).st_mode
    if not stat.S_ISREG(mode):
        os.close(fd)
        raise UserError(f"{path}: {what} is {kind_of_mode(mode)}, not a regular file; pass a file")
    os.set_blocking(fd, True)
    return os.fdopen(fd, "rb")


def check_regular(path: Path | str, what: str = "file") -> None:
    """One line unless `path` is a regular file (see open_regular); nothing is read."""
    open_regular(path, what).close()


def check_file(path: Path | str, what: str, *, flag: str | None = None,
               missing: str = "check the path you passed") -> None:
    """One line unless `path` is a regular file: a folder in its place is said as such, with the files in it
    that could be meant (a newcomer's wrong turn: the model or data folder for a file in it); a missing
    path is `{what} not found; {missing}`; a FIFO or device as open_regular says it. Nothing is read."""
    named = f"{flag} {path}" if flag else f"{path}"
    if os.path.isdir(path):
        found: list[str] = []
        with contextlib.suppress(OSError), os.scandir(path) as entries:  # one it may not list: no example
            for entry in itertools.islice(entries, LOOKED_AT):
                if entry.name.endswith(_MEANT.get(what, ())) and entry.name not in _NEVER.get(what, ()):
                    found.append(entry.name)
        first = _FIRST.get(flag or "", ("train.jsonl", "val.jsonl") if what == "manifest" else ())
        found = sorted(found, key=lambda name: (first.index(name) if name in first else len(first), name))[:3]
        meant = f" (e.g. {' or '.join(str(Path(path) / name) for name in found)})" if found else ""
        raise UserError(f"{named} is a folder; pass the {what} file in it{meant}")
    if not os.path.exists(path):  # a relative path is said with the folder it was looked for from
        where = "" if os.path.isabs(path) else f" (looked for from {os.getcwd()})"
        raise UserError(f"{named}: {what} not found{where}; {missing}")
    try:
        check_regular(path, what)
    except UserError as exc:  # a FIFO, a device, a /proc file: said with the flag that named it
        if flag is None:
            raise
        raise UserError(f"{flag} {exc}") from None


def iter_lines(path: Path | str, what: str, *, gzipped: bool = False,
               max_bytes: int | None = None) -> Iterator[tuple[int, int, bytes]]:
    """(line number from 1, byte offset, raw bytes) of every non-blank line of the regular file `path`
    (a manifest, a corpus: `what` names it in messages).

    Binary, buffered iteration: no decoding of whole files, offsets exact for `seek`. `gzipped`: the
    lines (and offsets) of its decompressed text, each line bounded all the same (a gzip file of a
    megabyte can hold a gigabyte-long line). `max_bytes`: the text, blank lines too, is refused past it.
    """
    check_file(path, what, missing=f"check the {what} path you passed")
    offset = 0
    with open_regular(path, what) as raw_handle:  # a FIFO or /proc file: one line, never a blocked read
        handle = gzip.GzipFile(fileobj=raw_handle, mode="rb") if gzipped else raw_handle
        for line_no, raw in _checked_lines(handle, path, what):
            if max_bytes is not None and offset + len(raw) > max_bytes:
                raise UserError(f"{path}:{line_no}: more than {max_bytes} bytes of {what}"
                                f"{' once decompressed' if gzipped else ''}; is this the right file?")
            if raw.strip():
                yield line_no, offset, raw
            offset += len(raw)


def _checked_lines(handle: IO[bytes], path: Path | str, what: str) -> Iterator[tuple[int, bytes]]:
    """(line number from 1, raw bytes) of every line of `handle`, blank ones too, each refused in one line
    past MAX_LINE_BYTES or when it holds a NUL byte.

    No text we read holds a raw NUL (JSON escapes it), but the holes of a sparse file read as NULs: 100 GB
    of holes with a newline every few MB are lines within the length bound, read whole by a reader that
    skips bad lines, and this refuses them at the first one (UTF-16 text is refused by it too)."""
    line_no = 0
    while raw := handle.readline(MAX_LINE_BYTES + 1):  # a line is never held past its bound
        line_no += 1
        if len(raw) > MAX_LINE_BYTES and not raw.endswith(b"\n"):
            raise UserError(f"{path}:{line_no}: a line longer than {MAX_LINE_BYTES >> 20} MiB, which no {what} "
                            "holds; is this the right file?")
        if b"\0" in raw:
            raise UserError(f"{path}:{line_no}: a NUL byte, which no {what} holds (a binary or UTF-16 file, one with "
                            "holes, or an end that a crash filled with zeros); save it as UTF-8 text, remove the "
                            "line, or check the path")
        yield line_no, raw


def sha256_lines(path: Path | str, what: str) -> str:
    """sha256 of a line file's bytes (a manifest), read as iter_lines reads it: a regular file, each line within
    the same bounds, so a crafted file (100 GB of holes) is refused at its first line, never hashed whole."""
    digest = hashlib.sha256()
    with open_regular(path, what) as handle:
        for _, raw in _checked_lines(handle, path, what):
            digest.update(raw)
    return digest.hexdigest()


def read_checked(path: Path | str, limit: int, what: str, *, missing: str) -> bytes:
    """The bytes of the file a user named, at most `limit`: check_file's one line for a missing path, a folder,
    a FIFO or a /proc file first (`missing`: what to do when there is none)."""
    check_file(path, what, missing=missing)
    return read_bounded(path, limit, what)


def read_bounded(path: Path | str, limit: int, what: str = "file") -> bytes:
    """The bytes of a regular file of at most `limit` bytes (refused before reading when larger)."""
    with open_regular(path, what) as handle:
        size = os.fstat(handle.fileno()).st_size
        data = handle.read(limit + 1) if size <= limit else b""
    if size > limit or len(data) > limit:
        raise UserError(f"{path}: {what} of {max(size, len(data))} bytes is larger than {limit} bytes; "
                        "is this the right file?")
    return data


# ----------------------------------------------------------------------------- YAML


class _PastBound(yaml.YAMLError):
    """A YAML document past a bound: valid, perhaps, but not something this program reads."""


class _BoundedLoader(yaml.SafeLoader):
    """SafeLoader whose composed document is measured, aliases expanded, before anything is built; then
    `check_node`, when given, sees the same composed node (one parse for a caller's own rule)."""

    check_node: Callable[[yaml.Node], None] | None = None

    def compose_document(self) -> yaml.Node | None:
        node = super().compose_document()
        if node is not None:
            _expanded_size(node, {}, set())
            if self.check_node is not None:
                self.check_node(node)
        return node


def _expanded_size(node: yaml.Node, sizes: dict[int, int], open_nodes: set[int]) -> int:
    """Nodes in `node` with every alias counted as what it names; past MAX_YAML_NODES: refused."""
    key = id(node)
    if key in sizes:
        return sizes[key]
    if key in open_nodes:
        raise _PastBound("an alias refers to a value that contains it (recursive alias)")
    open_nodes.add(key)
    if isinstance(node, yaml.MappingNode):
        children = [child for pair in node.value for child in pair]
    else:
        children = node.value if isinstance(node, yaml.SequenceNode) else []
    total = 1
    for child in children:
        total += _expanded_size(child, sizes, open_nodes)
        if total > MAX_YAML_NODES:
            raise _PastBound(f"more than {MAX_YAML_NODES} values with its aliases expanded "
                             "(anchors that multiply)")
    open_nodes.discard(key)
    sizes[key] = total
    return total


def _flow_depth(text: str) -> int:
    """How deep `[ ]` / `{ }` nest (quotes not told apart: an over-count only refuses sooner).

    PyYAML's scanner takes time quadratic in this depth (1,200 levels: seconds), so it is measured
    first, vectorised, in milliseconds for the largest file accepted."""
    codes = np.frombuffer(text.encode("utf-8", "surrogatepass"), dtype=np.uint8)
    steps = np.isin(codes, (ord("["), ord("{"))).astype(np.int32) - np.isin(codes, (ord("]"), ord("}")))
    return int(np.cumsum(steps).max(initial=0))


def yaml_text(text: str, where: str, check_node: Callable[[yaml.Node], None] | None = None) -> Any:
    """One YAML document parsed safely within MAX_YAML_NODES (aliases expanded) and MAX_YAML_DEPTH levels
    of flow nesting; one line when it is not. `check_node` sees the composed document before it is built
    (it raises UserError to refuse it)."""
    if _flow_depth(text) > MAX_YAML_DEPTH:
        raise UserError(f"{where}: YAML nested too deeply (more than {MAX_YAML_DEPTH} levels of [ ] or {{ }}); "
                        "is this the right file?")
    try:
        loader = _BoundedLoader(text)  # what yaml.load does, with the caller's check on the loader
        loader.check_node = check_node
        try:
            return loader.get_single_data()
        finally:
            loader.dispose()
    except _PastBound as exc:
        raise UserError(f"{where}: YAML refused: {exc}; is this the right file?") from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        line = f" line {mark.line + 1}" if mark else ""
        raise UserError(f"{where}{line}: not valid YAML ({getattr(exc, 'problem', None) or exc})") from None
    except RecursionError:  # PyYAML composes nested values recursively
        raise UserError(f"{where}: YAML nested too deeply; is this the right file?") from None
    except ValueError:  # an integer of thousands of digits, which Python refuses to convert
        raise UserError(f"{where}: {TOO_LONG_NUMBER}; is this the right file?") from None


def load_yaml(path: Path | str, what: str = "YAML file") -> Any:
    """A YAML file of at most MAX_YAML_BYTES, parsed by yaml_text: safe and bounded."""
    data = read_bounded(path, MAX_YAML_BYTES, what)
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise UserError(f"{path}: not UTF-8 text ({exc.reason} at byte {exc.start}); save it as UTF-8") from None
    return yaml_text(text, str(path))


# ----------------------------------------------------------------------------- JSON


def json_depth_problem(obj: Any) -> str | None:
    """Why `obj` (parsed JSON) is nested too deeply to be a record of ours, or None."""
    stack = [(obj, 1)]
    while stack:
        value, depth = stack.pop()
        if depth > MAX_JSON_DEPTH:
            return f"JSON nested deeper than {MAX_JSON_DEPTH} levels"
        children = value.values() if isinstance(value, dict) else value if isinstance(value, list) else ()
        stack.extend((child, depth + 1) for child in children if isinstance(child, (dict, list)))
    return None


def json_or_none(text: str | bytes) -> Any:
    """One JSON value, or None when `text` is none: torn, foreign, not UTF-8, nested past the interpreter's
    recursion limit (the C decoder raises RecursionError), or holding a number of thousands of digits. For
    the files a run folder holds (records, markers, scores) whose foreign lines are skipped or refused."""
    try:
        return json.loads(text)
    except (ValueError, RecursionError):  # JSONDecodeError and UnicodeDecodeError are ValueErrors
        return None


def parse_json(text: str | bytes, where: str) -> Any:
    """One JSON value nested at most MAX_JSON_DEPTH deep. json.JSONDecodeError is left to the caller
    (its wording depends on the file); deep nesting is one line naming `where`."""
    try:
        obj = json.loads(text)
    except (json.JSONDecodeError, UnicodeDecodeError):
        raise
    except ValueError:  # an integer of thousands of digits, which Python refuses to convert
        obj, problem = None, TOO_LONG_NUMBER
    except RecursionError:  # the C decoder stops at the interpreter's recursion limit
        obj, problem = None, f"JSON nested deeper than {MAX_JSON_DEPTH} levels"
    else:
        problem = json_depth_problem(obj) if isinstance(obj, (dict, list)) else None
    if problem:
        raise UserError(f"{where}: {problem}; is this the right file?")
    return obj


# ----------------------------------------------------------------------------- .npy


def read_npy(path: Path | str, what: str = ".npy file", max_bytes: int = MAX_NPY_BYTES) -> np.ndarray:
    """A plain .npy array, never unpickled; its header must describe exactly the bytes the file holds.

    Raises UserError naming the file when it is not a regular file, not an .npy, holds Python objects,
    or its header claims more (or less) data than the file has, or more than `max_bytes`.
    """
    with open_regular(path, what) as handle:
        try:
            version = np.lib.format.read_magic(handle)
            header = (np.lib.format.read_array_header_1_0 if version == (1, 0)
                      else np.lib.format.read_array_header_2_0)(handle)
        except (ValueError, OSError, EOFError, SyntaxError) as exc:
            raise UserError(f"{path}: {what} is not a loadable .npy file ({exc}); re-create it") from None
        shape, fortran, dtype = header
        if dtype.hasobject:
            raise UserError(f"{path}: {what} holds Python objects, not numbers; re-create it")
        if any(size < 0 for size in shape):  # (-2, -2) multiplies to the bytes a 4-value array holds
            raise UserError(f"{path}: {what}'s header claims the shape {list(shape)}, which no array has; "
                            "re-create it")
        need = prod(shape) * dtype.itemsize
        have = os.fstat(handle.fileno()).st_size - handle.tell()
        if need != have or need > max_bytes:
            limit = f"; at most {max_bytes} bytes are read" if need > max_bytes else ""
            raise UserError(f"{path}: {what}'s header claims {list(shape)} {dtype} ({need} bytes) but the file "
                            f"holds {have} bytes of data{limit}; re-create it")
        data = np.fromfile(handle, dtype=dtype, count=prod(shape))  # exactly what the header said
    if data.size != prod(shape):
        raise UserError(f"{path}: {what} ended while being read; re-create it")
    return data.reshape(shape, order="F" if fortran else "C")
