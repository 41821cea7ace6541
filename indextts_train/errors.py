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
