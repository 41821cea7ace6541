"""Flags shared by commands (the text normaliser's), and the `train-gpt` flags, derived from the
config schema: TrainOptions' inputs, then every `train:` setting of TrainConfig, each with its name,
type, help and default taken from the dataclass field.
One edit site: a new TrainConfig field is a new flag (and a web-form field) with nothing else to do.
"""

from __future__ import annotations

import dataclasses
import inspect
from enum import Enum
from typing import Annotated, Any

import typer

from indextts_train.config.schema import field_types
from indextts_train.config.settings import TrainConfig, TrainOptions, train_flags

KEYWORD = inspect.Parameter.KEYWORD_ONLY


def _shown(value: Any) -> str:
    """A default as the user would type it; an empty one (no list, no text) is 'not set'."""
    if isinstance(value, bool):
        return "on" if value else "off"
    if value in ("", [], ()):
        return "not set"
    return f"{value:g}" if isinstance(value, float) else str(value)


def _default_of(f: dataclasses.Field) -> Any:
    return f.default_factory() if f.default is dataclasses.MISSING else f.default


# The inputs a run cannot do without; not required by the parser, so that --from-run can supply them.
REQUIRED_INPUTS = {"train_manifests": "--train-manifest", "output_dir": "--output-dir"}


def _option(f: dataclasses.Field, tp: Any, *, from_config: bool) -> inspect.Parameter:
    """One `train-gpt` flag from a dataclass field: name, type, help and default all come from it."""
    meta = f.metadata
    decls = (meta["flag"],) if meta.get("flag") else ()
    extra: dict[str, Any] = {"metavar": meta["metavar"]} if meta.get("metavar") else {}
    if meta.get("choices"):  # Typer shows and checks choices through an Enum type
        tp = Enum(f.name, {choice: choice for choice in meta["choices"]}, type=str)
    if from_config:  # None = not given: the config's train: section decides, else the field default
        info = typer.Option(*decls, help=f"{meta['help']} [default: train.{f.name} from --config, else "
                                         f"{_shown(_default_of(f))}]", show_default=False, **extra)
        return inspect.Parameter(f.name, KEYWORD, default=None, annotation=Annotated[tp | None, info])
    help_text = meta["help"]
    if f.name in REQUIRED_INPUTS:
        help_text += " [required, unless --from-run gives it]"
    if tp == list[str]:
        extra.setdefault("metavar", "PATH")
    default = _default_of(f) if f.name not in REQUIRED_INPUTS else None
    info = typer.Option(*decls, help=help_text, show_default=default not in (None, [], ()), **extra)
    return inspect.Parameter(f.name, KEYWORD, default=default, annotation=Annotated[tp | None, info])


def train_parameters() -> list[inspect.Parameter]:
    """The flags of `train-gpt`: TrainOptions' inputs, then every `train:` setting of TrainConfig."""
    option_types, config_types = field_types(TrainOptions), field_types(TrainConfig)
    inputs = [_option(f, option_types[f.name], from_config=False)
              for f in dataclasses.fields(TrainOptions) if f.metadata.get("cli", True)]
    context = inspect.Parameter("ctx", KEYWORD, annotation=typer.Context)  # which flags were typed
    return [context, *inputs, *[_option(f, config_types[f.name], from_config=True) for f in train_flags()]]


NORMALIZER_HELP = ("Text normaliser: auto (WeTextProcessing when installed, else the character map alone), "
                   "wetext (required) or none (the character map alone).")


def say_text_path(normalizer_name: str, notes: list[str]) -> None:
    """Every command that turns text into ids says which normaliser it used, and what that means."""
    typer.echo(f"text presented as official inference does; normaliser: {normalizer_name}")
    for note in notes:
        typer.echo(f"warning: {note}", err=True)


# Flags naming where a command writes. An empty value would become the current folder (Path("") is
# "."), so `--output-dir ''` would train into wherever the shell happens to be.
OUTPUT_FLAGS = ("-o", "--out", "--output", "--output-dir", "--write-clean", "--config-out", "--adapters-out")


def empty_output(args: list[str]) -> bool:
    """Whether an output flag is given an empty value (`demo ''` names its folder empty too); says so."""
    empty = next(("OUT_DIR" if flag == "demo" else flag for flag, value in zip(args, args[1:], strict=False)
                  if value == "" and (flag in OUTPUT_FLAGS or flag == "demo")), None)
    empty = empty or next((arg[:-1] for arg in args if arg.endswith("=") and arg[:-1] in OUTPUT_FLAGS), None)
    if empty is not None:
        typer.echo(f"error: {empty} is empty; give the path to write to (empty is the current folder)", err=True)
    return empty is not None
