"""The one exception type that means "the user gave us something wrong".

The CLI turns it into a single line on stderr and exit code 2; everything else is a bug and keeps
its traceback. Messages name the file, line or key and say what to do.
"""


class UserError(Exception):
    """Bad input: a file, a flag, a manifest line or a checkpoint the user must fix."""


class CheckpointError(UserError):
    """A checkpoint file that cannot be used: unreadable, truncated, corrupt, unsafe or unrepairable."""


def user_line(exc: BaseException) -> str:
    """The message of a UserError, also when a DataLoader worker re-raised it with its traceback inside."""
    message = str(exc)
    if "Original Traceback" in message:
        last = [line for line in message.splitlines() if line.strip()][-1]
        return last.split("UserError: ", 1)[-1]
    return message


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

