"""The one exception type that means "the user gave us something wrong".

The CLI turns it into a single line on stderr and exit code 2; everything else is a bug and keeps
its traceback. Messages name the file, line or key and say what to do.
"""

import errno


class UserError(Exception):
    """Bad input: a file, a flag, a manifest line or a checkpoint the user must fix."""


class CheckpointError(UserError):
    """A checkpoint file that cannot be used: unreadable, truncated, corrupt, unsafe or unrepairable."""


class ListedError(UserError):
    """A refusal that lists what it is about, a line each (the files of a run folder none of which resumes):
    its line breaks are its own, so each line is escaped alone (`user_line`). The message is the lines
    joined, so it pickles and prints as any UserError."""


class WrongKindOfFile(UserError):
    """A line that shows its whole file is another kind than the one asked for (prepare's corpus line where a
    manifest line belongs): on a file's first line, check-data says it once, not once a line."""


class LoaderDied(UserError):
    """A data-loader worker that ended while loading samples (the out-of-memory killer, most often): not a bad
    line of the data, so the run's line says how to go on without blaming one (train/steps.bad_data)."""


class NotOwnFile(PermissionError):
    """A name this program writes to holds a link, a FIFO, a device or a file with another hard link:
    not its own to write (files/atomic.open_own). Its strerror says which."""


# A line break or another control character in a message (a path or a value typed with one) is written as
# its escape: a refusal is one line, and a terminal shows no control sequence from a file name.
_CONTROL = {code: f"\\x{code:02x}" for code in (*range(32), 127) if code != ord("\t")} | {
    ord("\n"): "\\n", ord("\r"): "\\r"}


def one_line(text: str) -> str:
    """`text` with its line breaks and other control characters escaped (tabs kept)."""
    return text.translate(_CONTROL)


def error_line(message: str) -> str:
    """The line a refusal is said as: `error: MESSAGE`, on one line whatever the message holds."""
    return f"error: {_clipped(one_line(message))}"


MOST_LINE_CHARS = 2000  # a refusal naming a value of 100,000 characters (a path, a flag's) was a line that long


def _clipped(line: str) -> str:
    """`line` with the middle of an overlong one left out (its start names the flag, its end says what to do)."""
    if len(line) <= MOST_LINE_CHARS:
        return line
    left_out = len(line) - MOST_LINE_CHARS
    return f"{line[:MOST_LINE_CHARS - 500]}...[{left_out:,} characters left out]...{line[-500:]}"


def refusal(exc: UserError) -> str:
    """What a UserError is said as: its `error:` line (a ListedError's list under it, a line each)."""
    return f"error: {user_line(exc)}"


def user_line(exc: BaseException) -> str:
    """The message of a UserError, also when a DataLoader worker re-raised it with its traceback inside;
    one line."""
    message = str(exc)
    if isinstance(exc, ListedError):
        return "\n".join(map(one_line, message.split("\n")))
    if "Original Traceback" in message:
        last = [line for line in message.splitlines() if line.strip()][-1]
        message = last.split("UserError: ", 1)[-1]
    return _clipped(one_line(message))


# What a JSON or YAML number of thousands of digits is called (Python refuses to convert more than 4300).
TOO_LONG_NUMBER = "a number with thousands of digits, which no setting or field takes"


def text_problem(value: str) -> str | None:
    """Why a string from the user (a flag, a path, an id, a transcript) cannot be used, else None.

    A NUL byte cannot be in a path (the OS refuses it) and is never meant in a name or a transcript; a
    lone surrogate is bytes that are not UTF-8 (a file name in another encoding, or a `\\ud800` escape
    in JSON) and cannot be written to a UTF-8 manifest, a log or the console.
    """
    if "\0" in value:
        return "holds a NUL byte"
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return "is not UTF-8 text (a lone surrogate, or bytes in another encoding)"
    return None



# A write the disk refused is the user's to fix (room, a writable folder), never a bug: said in one line.
# A write() that fails for space names no file, so those are known by their number alone; a refused
# permission only where the error names the file.
_DISK_FULL = {errno.ENOSPC: "disk full", errno.EDQUOT: "disk quota exceeded", errno.EROFS: "read-only file system"}
_NOT_PERMITTED = {errno.EACCES: "permission denied", errno.EPERM: "operation not permitted"}


def disk_problem(exc: OSError) -> str | None:
    """'disk full', 'read-only file system', ... for a write the disk refused; None for any other OSError."""
    if exc.errno in _DISK_FULL:
        return _DISK_FULL[exc.errno]
    return _NOT_PERMITTED.get(exc.errno) if exc.filename is not None else None


def disk_line(exc: OSError) -> str | None:
    """The one line for an OSError `disk_problem` knows, or a path name too long, naming the file when the
    error does; None for any other OSError (a bug: it keeps its traceback)."""
    where = f"{exc.filename}: " if exc.filename else ""
    if isinstance(exc, NotOwnFile):
        return f"{where}{exc.strerror}; move it away, or write somewhere else"
    if exc.errno == errno.ENAMETOOLONG:  # a path the user typed: too long for any file system to hold
        return f"{where}a name in this path is longer than the file system allows (255 bytes); use a shorter path"
    reason = disk_problem(exc)
    if reason is None:
        return None
    if exc.errno in _NOT_PERMITTED:
        return f"{where}{reason}; use a path this user may write to"
    room = "free some space or " if exc.errno != errno.EROFS else ""
    return f"{where}cannot write ({reason}); {room}write somewhere else"
