"""`python -m indextts_train`: the indextts-train commands, or train-gpt flags directly.

`torchrun ... -m indextts_train --train-manifest ...` therefore trains, like `train-gpt`.
"""

import sys

from indextts_train.cli import main, train_gpt_main


def _is_subcommand(argv: list[str]) -> bool:
    """A first word that is not a flag names a command (train-gpt takes no positional argument), so a
    mistyped one is answered as such: "No such command 'trian'. Did you mean 'train'?"."""
    return bool(argv) and (not argv[0].startswith("-") or argv[0] in ("-h", "--help"))


if __name__ == "__main__":
    if _is_subcommand(sys.argv[1:]):
        main()
    else:
        train_gpt_main()
