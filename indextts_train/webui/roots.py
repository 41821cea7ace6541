"""The folders the web page may touch (`webui --root DIR`, repeatable; default: where it was started).

The page runs commands for whoever can reach it, so every path it is given (output folders,
manifests, config, checkpoints, tokenizer, export folder, the paths inside `Other flags`) must
resolve, symlinks followed, inside a root; anything else is refused with one line before any
command runs. The files a manifest names are the trainer's to read, as on the command line. No
module here imports Gradio.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Sequence
from pathlib import Path

from indextts_train.config.schema import field_types
from indextts_train.config.settings import TrainOptions
from indextts_train.data.sampling import parse_manifest_spec
from indextts_train.errors import UserError

MANIFEST_FLAGS = ("--train-manifest", "--val-manifest")
# train-gpt flags whose value is a path (TrainOptions' inputs); --resume also takes 'auto'.
def _path_flags() -> tuple[str, ...]:
    """Every TrainOptions input that holds a path, read from the schema so a new path flag (such as
    --from-run) cannot slip past the roots; --resume (a path or 'auto') too."""
    types = field_types(TrainOptions)
    named = [f.metadata.get("flag") or "--" + f.name.replace("_", "-") for f in dataclasses.fields(TrainOptions)
             if f.metadata.get("cli", True) and "Path" in str(types[f.name])]
    return (*MANIFEST_FLAGS, *named, "--resume")


PATH_FLAGS = _path_flags()


class Roots:
    """The resolved root folders; `inside` checks one path, `check_flags` every path of a train-gpt argv."""

    def __init__(self, folders: Sequence[Path]) -> None:
        resolved = []
        for folder in folders:
            real = Path(os.path.realpath(Path(folder).expanduser()))
            if not real.is_dir():
                raise UserError(f"--root {folder}: not a folder; give an existing folder the page may use")
            resolved.append(real)
        if not resolved:
            raise UserError("--root: give at least one folder the page may use")
        self.folders = tuple(resolved)

    def inside(self, value: str | Path, what: str) -> Path:
        """`value` resolved (symlinks followed, relative to the server's folder), if inside a root."""
        text = str(value).strip()
        if not text:
            raise UserError(f"{what}: no path given")
        real = Path(os.path.realpath(Path(text).expanduser()))
        if any(real == root or real.is_relative_to(root) for root in self.folders):
            return real
        shown = ", ".join(map(str, self.folders))
        raise UserError(f"{what} {text}: outside the folders this page may touch ({shown}); "
                        "start webui with a --root that holds it")

    def check_flags(self, argv: Sequence[str]) -> None:
        """Refuse an argv naming a path outside every root (`--flag VALUE` and `--flag=VALUE` alike)."""
        for i, arg in enumerate(argv):
            flag, equals, inline = arg.partition("=")
            if flag not in PATH_FLAGS:
                continue
            value = inline if equals else (argv[i + 1] if i + 1 < len(argv) else "")
            if flag == "--resume" and value == "auto":
                continue
            if flag in MANIFEST_FLAGS:  # PATH::lang@weight: the path alone
                value = str(parse_manifest_spec(value, flag).path)
            self.inside(value, flag)
