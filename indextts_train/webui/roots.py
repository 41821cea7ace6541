"""The folders the web page may touch (`webui --root DIR`, repeatable; default: where it was started).

The page runs commands for whoever can reach it, so this module is its boundary:

- every value typed into the page that reaches a command line is checked text (no NUL byte, no
  control character, no line break, no lone surrogate, nothing that starts with '-' and could be read
  as an option), and every path is resolved, symlinks followed, and must lie inside a root; the page
  passes the resolved path on, so what runs is what was checked;
- every file the page finds by itself (a run's train.log, run.yaml, checkpoints, TensorBoard files)
  is read, listed or verified only if its resolved path lies inside a root, and opened without
  following a last symlink (O_NOFOLLOW) and only if it is a regular file (a FIFO would block);
- a folder the page starts a run or an export in must hold no symlink that leads outside the roots
  (the run would write through it).

Refusals are one line (UserError). The `.npy` files a manifest names are the trainer's to read, as on
the command line. No module here imports Gradio.
"""

from __future__ import annotations

import errno
import os
import stat
import unicodedata
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

from indextts_train.data.sampling import parse_manifest_spec
from indextts_train.errors import UserError
from indextts_train.files.bounded import kind_of_mode
from indextts_train.train.listening import is_hub_id

MAX_TEXT = 4096  # longer than any path a user types (PATH_MAX)
MAX_SCAN = 5000  # entries looked at in a folder for links that lead outside (a run folder has a few dozen)
# Unicode categories refused in a value: controls (NUL, line breaks, tabs, ESC), line and paragraph
# separators (they split lines too) and surrogates (not text; a lone one cannot even be a file name).
_REFUSED = {"Cc": "a control character", "Zl": "a line separator", "Zp": "a paragraph separator",
            "Cs": "a lone surrogate (not valid text)"}
# Bidirectional controls reorder what follows them on screen ("Trojan Source"): a value holding one shows
# in the command-line box as another text than the one that runs. No path needs one (right-to-left
# scripts are laid out without them); joiners and other format characters some scripts use are kept.
_BIDI_CONTROLS = frozenset("\u061c\u200e\u200f\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069")


def checked_text(value: Any, what: str, *, may_start_with_dash: bool = False) -> str:
    """`value` as text that a command line takes as one plain value, or one line saying why not."""
    text = "" if value is None else str(value)
    if len(text) > MAX_TEXT:
        raise UserError(f"{what}: {len(text)} characters is not a path or a value; give at most {MAX_TEXT}")
    for char in text:
        kind = ("a NUL byte" if char == "\0" else "a bidirectional control (it reorders the text shown)"
                if char in _BIDI_CONTROLS else _REFUSED.get(unicodedata.category(char)))
        if kind:
            raise UserError(f"{what}: holds {kind} (U+{ord(char):04X}); give one value without it")
    if text.startswith("-") and not may_start_with_dash:
        raise UserError(f"{what} {text!r}: starts with '-', which a command would read as an option; "
                        f"give a path or value (a file whose name starts with '-': ./{text})")
    return text


def shown(text: str) -> str:
    """`text` (a name the page found on disk) fit for one line of the page: what checked_text refuses in a
    value (line breaks, escapes, bidirectional controls, surrogates) written as escapes, so a file's name
    cannot forge a line or reorder the text around it."""
    return "".join(ascii(char)[1:-1] if char in _BIDI_CONTROLS or unicodedata.category(char) in _REFUSED else char
                   for char in text)


def _resolved(text: str, what: str) -> Path:
    """`text` with symlinks followed (relative to the server's folder); one line when they loop, and when the
    path they lead to is not one checked_text would pass (a link to a name holding a line break): what
    runs is that resolved path, so it is held to the same rule as what was typed."""
    real = Path(os.path.realpath(_expanded(text, what)))
    try:
        os.stat(real)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise UserError(f"{what} {shown(text)}: its symbolic links loop (too many levels); "
                            "give a path that resolves") from None
        if exc.errno == errno.ENAMETOOLONG:  # every later look at it (Watch's, once a second) raised it
            raise UserError(f"{what} {shown(text)}: a name in it is longer than the file system allows; "
                            "give a shorter one") from None
    except ValueError:  # an embedded NUL: checked_text refused it already
        pass
    checked_text(str(real), f"{what} {shown(text)} (resolved to {shown(str(real))})")
    return real


def _expanded(text: str, what: str) -> str:
    """`text` with a leading ~ or ~USER expanded, as a shell would. ~USER naming no user of this machine is
    one line (pathlib raised RuntimeError, a traceback in the page), unless a file of that very name is there."""
    expanded = os.path.expanduser(text)
    if expanded == text and text.startswith("~") and not os.path.lexists(text):
        user = text[1:].split("/", 1)[0]
        raise UserError(f"{what} {shown(text)}: there is no user {shown(user)!r} here to expand ~{shown(user)} for; "
                        "give the full path")
    return expanded


def open_regular(path: Path, flags: int = os.O_RDONLY, *, single_link: bool = False,
                 dir_fd: int | None = None) -> BinaryIO:
    """`path` opened without following a symlink in its last part, only if it is a regular file
    (`single_link`: and has no other hard link, for a file the page writes to). `dir_fd`: the folder
    `path` lies in, already open: its name is opened there, so the folder's path is not walked again."""
    name = path.name if dir_fd is not None else path
    try:
        fd = os.open(name, flags | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, 0o644, dir_fd=dir_fd)
    except OSError as exc:
        if exc.errno == errno.ELOOP:  # the last part is a symlink
            raise UserError(f"{path}: a symbolic link; the page reads and writes only files of its own") from None
        if exc.errno == errno.ENXIO:  # opened to write: a FIFO no one reads, a socket ("No such device or address")
            mode = os.stat(name, dir_fd=dir_fd, follow_symlinks=False).st_mode
            raise UserError(f"{path}: {kind_of_mode(mode)}, not a regular file; the page does not use it") from None
        raise
    info = os.fstat(fd)
    why = ("not a regular file" if not stat.S_ISREG(info.st_mode) else
           "has other hard links (writing would change them too)" if single_link and info.st_nlink > 1 else None)
    if why:
        os.close(fd)
        raise UserError(f"{path}: {why}; the page does not use it")
    mode = "ab" if flags & os.O_APPEND else ("r+b" if flags & (os.O_WRONLY | os.O_RDWR) else "rb")
    return os.fdopen(fd, mode)


def _special_kind(path: str) -> str | None:
    """What `path` is when it is, or a link there leads to, neither a regular file nor a folder (None: it is
    one of those). A link that leads nowhere (dangling, a loop) is said too: a reader's stat of it fails."""
    try:
        mode = os.stat(path).st_mode
    except (OSError, ValueError):
        return "a symbolic link that leads nowhere (dangling, or a loop)" if os.path.islink(path) else None
    return None if stat.S_ISREG(mode) or stat.S_ISDIR(mode) else kind_of_mode(mode)


@dataclass(frozen=True)
class LinkScan:
    """What a folder's scan for links leading outside the roots found (Roots.scan_links)."""

    links: tuple[str, ...]  # 'NAME -> TARGET', relative to the folder
    unchecked: str | None = None  # why part of it was not looked at (None: all of it was)
    # 'NAME (a FIFO)': what is, or links to, neither a regular file nor a folder. A reader opening it would
    # wait for a writer that never comes (a FIFO), read without end (a device) or fail (a link to nothing).
    special: tuple[str, ...] = ()


class Roots:
    """The resolved root folders and the checks every path the page uses goes through."""

    def __init__(self, folders: Sequence[Path]) -> None:
        resolved = []
        for folder in folders:
            real = Path(os.path.realpath(os.path.expanduser(folder)))  # ~USER of no user: kept, then not a folder
            if not real.is_dir():
                raise UserError(f"--root {folder}: not a folder; give an existing folder the page may use")
            if real.parent == real:  # every path would be inside: no root at all (a container's shell starts in /)
                raise UserError(f"--root {folder} is the whole file system (the default root is the folder webui "
                                "starts in), so the page could read and write anything on this machine; cd into the "
                                "folder of your data and runs, or pass --root DIR")
            resolved.append(real)
        if not resolved:
            raise UserError("--root: give at least one folder the page may use")
        self.folders = tuple(resolved)

    def holds(self, real: Path) -> bool:
        """Whether a resolved path lies in a root."""
        return any(real == root or real.is_relative_to(root) for root in self.folders)

    def holds_open(self, fd: int) -> bool:
        """Whether the file open on `fd` lies in a root, by where it is (/proc/self/fd), not by the path it was
        opened by: a folder of that path swapped for a link after the check leads elsewhere."""
        try:
            real = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:  # no /proc: the path was checked when it was resolved
            return True
        return self.holds(Path(real.removesuffix(" (deleted)")))

    def inside(self, value: str | Path, what: str) -> Path:
        """`value` resolved (symlinks followed, relative to the server's folder), if inside a root."""
        text = checked_text(("" if value is None else str(value)).strip(), what)  # None: an empty box
        if not text:
            raise UserError(f"{what}: no path given")
        real = _resolved(text, what)
        if os.path.expandvars(text) != text and not os.path.lexists(real):  # typed as in a shell: $HOME/runs
            raise UserError(f"{what} {text}: the page expands no shell variable ($NAME); give the full path")
        if len(text) > 1 and text[0] == text[-1] and text[0] in "'\"" and not os.path.lexists(real):
            raise UserError(f"{what} {text}: drop the quotes; the page takes a path as it is typed")
        if self.holds(real):
            return real
        shown = ", ".join(map(str, self.folders))
        raise UserError(f"{what} {text}: outside the folders this page may touch ({shown}); "
                        "start webui with a --root that holds it")

    def program(self, value: str, what: str) -> Path:
        """A program the page lets a run start (--listen-inference-python): its folder resolved inside a
        root. Its last part may be a link, as a virtual environment's bin/python links to the system's
        Python: a link that the roots' owner made there, since the page makes none."""
        text = checked_text(str(value).strip(), what)
        if not text:
            raise UserError(f"{what}: no path given")
        path = Path(os.path.abspath(_expanded(text, what)))
        folder = _resolved(str(path.parent), what)
        if path.name in ("", ".", "..") or not self.holds(folder):
            raise UserError(f"{what} {text}: not a program in the folders this page may touch "
                            f"({', '.join(map(str, self.folders))}); start webui with a --root that holds it")
        return folder / path.name

    def model(self, value: str, what: str) -> str:
        """A model the run loads (--listen-asr-model): a folder resolved inside a root, or, when no such
        path exists, a Hugging Face model id (ORG/NAME), which the hub serves."""
        text = checked_text(str(value).strip(), what)
        if os.path.lexists(text) or not is_hub_id(text):  # a hub id starts with no ~: inside() expands it
            return str(self.inside(text, what))
        return text

    def manifest_file(self, value: str, what: str) -> Path:
        """The file of a manifest spec (PATH[::lang][@weight]), resolved inside a root."""
        return self.inside(parse_manifest_spec(checked_text(value.strip(), what), what).path, what)

    def manifest(self, value: str, what: str) -> str:
        """A manifest spec (PATH[::lang][@weight]) with its path resolved inside a root."""
        spec = parse_manifest_spec(checked_text(value.strip(), what), what)
        real = self.inside(spec.path, what)
        if "," in value and not real.exists():  # several on one line, as a list would be written
            raise UserError(f"{what} {value.strip()}: one manifest per line; put each of these on a line of its own")
        lang = f"::{spec.lang}" if spec.lang else ""
        weight = f"@{spec.weight!r}" if spec.weight is not None else ""
        return f"{real}{lang}{weight}"

    def found(self, path: Path) -> Path | None:
        """A file the page came across (listed in a run folder): its resolved path if inside a root."""
        real = Path(os.path.realpath(path))
        return real if self.holds(real) else None

    def scan_links(self, folder: Path, limit: int = MAX_SCAN) -> LinkScan:
        """Every symlink under `folder` (links to folders not followed) that resolves outside the roots,
        and every entry that is, or links to, neither a regular file nor a folder (LinkScan.special).

        At most `limit` entries are looked at, each folder listed lazily: past the bound, or where a
        folder below cannot be listed, the scan is incomplete, and what it did not see is not vouched
        for (a link past the bound would otherwise pass). A folder that does not exist holds no link."""
        found: list[str] = []
        special: list[str] = []
        pending, seen = [Path(folder)], 0

        def scan(unchecked: str | None = None) -> LinkScan:
            return LinkScan(tuple(found), unchecked, tuple(special))

        while pending:
            current = pending.pop()
            try:
                with os.scandir(current) as entries:
                    for entry in entries:
                        seen += 1
                        if seen > limit:
                            return scan(f"holds more than {limit} entries")
                        name = shown(os.path.relpath(entry.path, folder))
                        if entry.is_symlink():
                            if self.found(Path(entry.path)) is None:
                                found.append(f"{name} -> {shown(os.path.realpath(entry.path))}")
                                continue
                        elif entry.is_dir(follow_symlinks=False):
                            pending.append(Path(entry.path))
                            continue
                        elif entry.is_file(follow_symlinks=False):
                            continue  # a regular file (from the listing itself: no call per file)
                        kind = _special_kind(entry.path)
                        if kind is not None:
                            special.append(f"{name} ({kind})")
            except (FileNotFoundError, NotADirectoryError):
                continue  # nothing there holds a link
            except OSError as exc:  # a folder it cannot list may hold one
                return scan(f"{shown(os.path.relpath(current, folder))} cannot be listed ({exc.strerror})")
        return scan()

    def leads_outside(self, folder: Path) -> bool:
        """Whether `folder` holds a way out of the roots, a file no reader may open (a FIFO, a device, or a
        link to one or to nothing: reading the folder's files would block or fail on it), or too much to tell
        (see scan_links)."""
        scan = self.scan_links(folder)
        return bool(scan.links) or bool(scan.special) or scan.unchecked is not None

    def refuse_links_outside(self, folder: Path, what: str) -> None:
        """One line when a folder the page writes into holds a way out of the roots, or more than can be checked."""
        scan = self.scan_links(folder)
        if scan.links:
            raise UserError(f"{what} {folder}: holds {len(scan.links)} symbolic link(s) leading outside the folders "
                            f"this page may touch ({scan.links[0]}); remove them, or work in another folder")
        if scan.unchecked is not None:
            raise UserError(f"{what} {folder}: {scan.unchecked}, too much to check for symbolic links leading "
                            "outside the folders this page may touch; work in another folder")
