"""`python -m indextts_train`: the indextts-train commands, or train-gpt flags directly.

`torchrun ... -m indextts_train --train-manifest ...` therefore trains, like `train-gpt`.
"""

import sys

from indextts_train.cli import app, main, train_gpt_main


def _is_subcommand(argv: list[str]) -> bool:
    names = {command.name or command.callback.__name__.replace("_", "-") for command in app.registered_commands}
    return bool(argv) and (argv[0] in names or argv[0] in ("-h", "--help"))


if __name__ == "__main__":
    if _is_subcommand(sys.argv[1:]):
        main()
    else:
        train_gpt_main()
