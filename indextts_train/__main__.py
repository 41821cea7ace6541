"""The entry points: `indextts-train`, `train-gpt`, and `python -m indextts_train` (the commands, or
train-gpt flags directly: `torchrun ... -m indextts_train --train-manifest ...` therefore trains).

Kept light: the commands import torch and their own modules first (a second or two), and a Ctrl+C then
ended in a Python traceback. Here it ends in one line and exit 130, as a Ctrl+C anywhere else does.
What a command handles itself (the trainer saves at the next step, prepare keeps its finished clips) it
still handles: only an interrupt that escapes it arrives here.
"""

from __future__ import annotations

import sys

EXIT_SIGINT = 130


def _version() -> str:
    """`--version`: this package's and torch's (the one thing users most often have several of)."""
    from importlib.metadata import PackageNotFoundError, version

    def installed(name: str) -> str:
        try:
            return version(name)
        except PackageNotFoundError:  # a checkout run with PYTHONPATH, never installed
            return "not installed"

    return (f"indextts-train {installed('indextts-train')} (torch {installed('torch')}, "
            f"Python {sys.version.split()[0]})")


def _run(name: str) -> None:
    if sys.argv[1:] in (["--version"], ["-V"]):  # answered without loading the commands
        print(_version())
        sys.exit(0)
    try:
        from indextts_train import cli  # the commands (each loads torch when it runs: seconds)

        getattr(cli, name)()
    except KeyboardInterrupt:
        sys.stderr.write("interrupted (Ctrl+C)\n")
        sys.exit(EXIT_SIGINT)


def main() -> None:
    """`indextts-train`."""
    _run("main")


def train_gpt_main() -> None:
    """`train-gpt`: the train command alone, with the community flag names."""
    _run("train_gpt_main")


def _is_subcommand(argv: list[str]) -> bool:
    """A first word that is not a flag names a command (train-gpt takes no positional argument), so a
    mistyped one is answered as such: "No such command 'trian'. Did you mean 'train'?". Nothing at all lists
    the commands, as `indextts-train` alone does (it was train-gpt's "--train-manifest is required")."""
    return not argv or not argv[0].startswith("-") or argv[0] in ("-h", "--help", "--version", "-V")


if __name__ == "__main__":
    if _is_subcommand(sys.argv[1:]):
        main()
    else:
        train_gpt_main()
