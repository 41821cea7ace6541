"""Flags shared by commands (the text normaliser's), and the `train-gpt` flags, derived from the
config schema: TrainOptions' inputs, then every `train:` setting of TrainConfig, each with its name,
type, help and default taken from the dataclass field.
One edit site: a new TrainConfig field is a new flag (and a web-form field) with nothing else to do.

Also how flags read to a user: `--help` without the parser's internals (`<list[Path]>`, `{CORPUS}...`)
and a refused value in plain words ("--train-scope: 'lroa' is not one of full, partial, lora"), not in
the validation library's ("Value error, ...", "Input should be ...").
"""

from __future__ import annotations

import contextlib
import dataclasses
import inspect
import os
import re
from collections.abc import Iterator
from enum import Enum
from pathlib import Path
from typing import Annotated, Any

import typer
from typer.core import TyperArgument, TyperCommand, TyperGroup, TyperOption
from typer.models import DefaultPlaceholder

try:  # typer 0.2x carries its own copy of click; older releases use click itself
    from typer._click.core import Context
    from typer._click.exceptions import BadParameter, ClickException, MissingParameter, NoSuchOption
except ImportError:
    from click import BadParameter, ClickException, Context, MissingParameter, NoSuchOption

from indextts_train.config.other_flags import flag_instead
from indextts_train.config.run_inputs import TrainOptions
from indextts_train.config.schema import field_default, field_types, near_names
from indextts_train.config.settings import TrainConfig, train_flags
from indextts_train.errors import error_line, text_problem
from indextts_train.ui.run_settings import REQUIRED_INPUTS

KEYWORD = inspect.Parameter.KEYWORD_ONLY


def _shown(value: Any) -> str:
    """A default as the user would type it; an empty one (no list, no text) is 'not set'."""
    if isinstance(value, bool):
        return "on" if value else "off"
    if value is None or value in ("", [], ()):
        return "not set"
    return f"{value:g}" if isinstance(value, float) else str(value)


def choices_of(f: dataclasses.Field | str) -> type[Enum]:
    """A `train:` field's choices as the Enum type Typer checks a flag with: a wrong value is refused naming
    the flag (`hardware --train-scope` too, not only train's)."""
    f = f if isinstance(f, dataclasses.Field) else {g.name: g for g in dataclasses.fields(TrainConfig)}[f]
    return Enum(f.name, {choice: choice for choice in f.metadata["choices"]}, type=str)


def _option(f: dataclasses.Field, tp: Any, *, from_config: bool) -> inspect.Parameter:
    """One `train-gpt` flag from a dataclass field: name, type, help and default all come from it."""
    meta = f.metadata
    decls = (meta["flag"],) if meta.get("flag") else ()
    extra: dict[str, Any] = {"metavar": meta["metavar"]} if meta.get("metavar") else {}
    if meta.get("choices"):  # Typer shows and checks choices through an Enum type
        tp = choices_of(f)
    if from_config:  # None = not given: the config's train: section decides, else the field default
        info = typer.Option(*decls, help=f"{meta['help']} [default: train.{f.name} from --config, else "
                                         f"{_shown(field_default(f))}]", show_default=False, **extra)
        return inspect.Parameter(f.name, KEYWORD, default=None, annotation=Annotated[tp | None, info])
    help_text = meta["help"]
    if f.name in REQUIRED_INPUTS:
        help_text += " [required, unless --from-run gives it]"
    if tp == list[str]:
        extra.setdefault("metavar", "PATH")
    default = field_default(f) if f.name not in REQUIRED_INPUTS else None
    info = typer.Option(*decls, help=help_text, show_default=default not in (None, [], ()), **extra)
    return inspect.Parameter(f.name, KEYWORD, default=default, annotation=Annotated[tp | None, info])


def train_parameters() -> list[inspect.Parameter]:
    """The flags of `train-gpt`: TrainOptions' inputs, then every `train:` setting of TrainConfig."""
    option_types, config_types = field_types(TrainOptions), field_types(TrainConfig)
    inputs = [_option(f, option_types[f.name], from_config=False)
              for f in dataclasses.fields(TrainOptions) if f.metadata.get("cli", True)]
    context = inspect.Parameter("ctx", KEYWORD, annotation=typer.Context)  # which flags were typed
    return [context, *inputs, *[_option(f, config_types[f.name], from_config=True) for f in train_flags()]]


# Upper ends of numeric flags besides train's (TrainConfig holds those; prepare's seconds are
# utterance.MAX_SECONDS): far beyond any real use, so that a typo is one line before any work.
MAX_VOCAB = 10_000_000  # as gpt.number_text_tokens

NORMALIZER_HELP = ("Text normaliser: auto (WeTextProcessing when installed, else the character map alone), "
                   "wetext (required) or none (the character map alone).")


def say_text_path(normalizer_name: str, notes: list[str]) -> None:
    """Every command that turns text into ids says which normaliser it used, and what that means."""
    typer.echo(f"text presented as official inference does; normaliser: {normalizer_name}")
    for note in notes:
        typer.echo(f"warning: {note}", err=True)


def unusable_argument(args: list[str]) -> str | None:
    """The first command-line word no command can use (a NUL byte, bytes that are not UTF-8), named by its
    flag: refused before any work, as no path, name or text holding it can be written or printed."""
    for at, arg in enumerate(args):
        problem = text_problem(arg)
        if problem:
            flag, equals, value = arg.partition("=")
            if not (equals and flag.startswith("--")):
                before = args[at - 1] if at else ""
                flag, value = (before if before.startswith("-") else f"argument {at + 1}"), arg
            return f"{flag} {value!r} {problem}; pass UTF-8 text (rename such a file)"
    return None


INTERRUPTED = "interrupted (Ctrl+C)"  # the line of a Ctrl+C no command handles (__main__ says it too)


class _PlainArgument(TyperArgument):
    """An argument as the usage line names it: CHECKPOINT, CORPUS... (repeatable), [OUT_DIR] (optional)."""

    def _plain_name(self) -> str:
        return (self.metavar or self.name or "").upper().removesuffix("...")

    def _usage_display_name(self) -> str:
        name = self._plain_name() + ("..." if self.nargs != 1 else "")
        return name if self.required else f"[{name}]"

    def _rich_display_name(self) -> str:
        return self._plain_name() + ("..." if self.nargs != 1 else "")

    def display_type(self, ctx: Context) -> str:
        return ""  # the name says what it is; the help line says the rest


class _PlainOption(TyperOption):
    """An option's value as the user types one: `<path>`, not `<list[Path]>` (the help says "repeatable")."""

    def display_type(self, ctx: Context) -> str:
        shown = super().display_type(ctx)
        listed = re.fullmatch(r"<list\[(.+)\]>", shown or "")
        shown = f"<{listed.group(1).lower()}>" if listed else shown
        return shown.replace("<str>", "<text>").replace(" range>", ">")


class PlainCommand(TyperCommand):
    """A command whose help shows its arguments and options in the user's words (see the classes above)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        for param in self.params:  # typer builds them; only the way they are shown changes
            if type(param) is TyperArgument:
                param.__class__ = _PlainArgument
            elif type(param) is TyperOption:
                param.__class__ = _PlainOption

    def parse_args(self, ctx: Context, args: list[str]) -> list[str]:
        """The command's flags; a refusal carries the command (click leaves `--resume` typed without its value
        without one), so that its line can say what the flag takes."""
        try:
            rest = super().parse_args(ctx, args)
        except ClickException as exc:
            if getattr(exc, "ctx", False) is None:
                exc.ctx = ctx
            raise
        for param in self.params:
            if param.name in ctx.params:
                ctx.params[param.name] = _paths_as_meant(ctx, param, ctx.params[param.name])
        return rest

    def make_context(self, *args: Any, **kwargs: Any) -> Context:
        with _interrupt_said():
            return super().make_context(*args, **kwargs)

    def invoke(self, ctx: Context) -> Any:
        """The command; a Ctrl+C it does not handle itself (the trainer does: it saves, then says so) is said
        in one line with exit 130, where Typer ended the command silently with that code."""
        with _interrupt_said():
            return super().invoke(ctx)


# Values typed as text that name a file or folder (a manifest spec PATH::lang@w, --resume's checkpoint, a
# program or a model folder); the others are Paths.
_TEXT_PATHS = frozenset({"train_manifests", "val_manifests", "manifest", "resume", "listen_inference_python",
                         "listen_asr_model", "asr_model"})


def _paths_as_meant(ctx: Context, param: Any, value: Any) -> Any:
    """A path value as the user meant it: `~/runs` or `~USER/runs` expanded as a shell would (bash leaves the ~
    of `--output-dir=~/runs` as it is, and the run then wrote into a folder named `~` here); a blank one or a
    ~USER of no user here is refused by its flag, before anything is read or written."""
    if isinstance(value, (list, tuple)):
        return type(value)(_paths_as_meant(ctx, param, item) for item in value)
    if not isinstance(value, Path) and not (isinstance(value, str) and param.name in _TEXT_PATHS):
        return value
    text = str(value)
    if text and not text.strip() and param.name != "resume":  # a blank --resume is said by resolve_settings
        raise BadParameter(f"{text!r} is blank; give the path (a name of spaces alone is no file's)", ctx=ctx,
                           param=param)
    if not text.startswith("~"):
        return value
    expanded = os.path.expanduser(text)
    if expanded == text and not os.path.lexists(text):
        user = text[1:].split(os.sep, 1)[0]
        raise BadParameter(f"{text!r}: there is no user {user!r} here for ~{user} to name; give the full path",
                           ctx=ctx, param=param)
    return type(value)(expanded)


class PlainGroup(TyperGroup):
    """`indextts-train`'s commands: a Ctrl+C while the command line is read, before a command runs (about 0.3 s
    after the start on a busy machine), is said as one inside a command is; Typer ended it with 130, silently."""

    def make_context(self, *args: Any, **kwargs: Any) -> Context:
        with _interrupt_said():
            return super().make_context(*args, **kwargs)

    def invoke(self, ctx: Context) -> Any:
        with _interrupt_said():  # the command's own (PlainCommand.invoke) is said there, once
            return super().invoke(ctx)


@contextlib.contextmanager
def _interrupt_said() -> Iterator[None]:
    try:
        yield
    except KeyboardInterrupt:
        typer.echo(INTERRUPTED, err=True)
        raise typer.Exit(130) from None


def plain_help(app: typer.Typer) -> typer.Typer:
    """Every command of `app` shown with PlainCommand, the commands' group with PlainGroup."""
    info = getattr(app, "info", None)  # None: a click group already built (tests build one to call it)
    if info is not None and (isinstance(info.cls, DefaultPlaceholder) or info.cls in (None, TyperGroup)):
        info.cls = PlainGroup
    for command in getattr(app, "registered_commands", ()):  # a click group built from it is shown as built
        if command.cls in (None, TyperCommand):  # typer's default, not a class a command chose
            command.cls = PlainCommand
    return app


# The validation library's wording -> the user's (first match wins; the value is named by the caller).
_PLAIN_REASONS = (
    (r"^Input should be a valid integer.*", "is not a whole number"),
    (r"^Input should be a valid number.*", "is not a number"),
    (r"^Input should be a valid boolean.*", "is not on/off (true, false, 1, 0)"),
    (r"^Input should be less than or equal to (\S+)", r"is above \1, the most allowed"),
    (r"^Input should be greater than or equal to (\S+)", r"is below \1, the least allowed"),
    (r"^Input should be less than (\S+)", r"must be below \1"),
    (r"^Input should be greater than (\S+)", r"must be above \1"),
    (r"^Input should be (.*)", r"should be \1"),
)


def _given(flags: list[str], args: list[str]) -> str | None:
    """The value typed after one of `flags` (--flag VALUE or --flag=VALUE), last one wins."""
    value = None
    for i, arg in enumerate(args):
        for flag in flags:
            if arg == flag and i + 1 < len(args):
                value = args[i + 1]
            elif arg.startswith(flag + "="):
                value = arg[len(flag) + 1:]
    return value


def _command_flags(command: Any) -> list[str]:
    return sorted({opt for param in (command.params if command is not None else []) for opt in
                   (*param.opts, *getattr(param, "secondary_opts", [])) if opt.startswith("--") and opt != "--help"})


def _no_such_option(exc: NoSuchOption) -> str:
    flags = _command_flags(exc.ctx.command if exc.ctx is not None else None)
    instead = flag_instead(exc.option_name, flags)
    if instead is not None:
        return f"no such flag {exc.option_name}; {instead}"
    near = near_names(exc.option_name, flags)
    return f"no such flag {exc.option_name}" + (f"; did you mean {' or '.join(near)}?" if near else "")


# Words newcomers try as commands -> the command that does it, and why (click's spelling guess misses these).
_OTHER_COMMANDS = {
    **dict.fromkeys(("finetune", "fine-tune", "fit", "train-gpt"), ("train", "")),
    "resume": ("train", "the same train command again, with --resume auto, continues a run"),
    **dict.fromkeys(("infer", "inference", "synthesize", "synthesise", "tts", "generate", "speak"),
                    ("listen", "it speaks lines with a run's checkpoints; `export` writes the gpt.pth inference "
                               "loads")),
    **dict.fromkeys(("status", "list", "ls", "logs"), ("checkpoints", "it lists a run's checkpoints; the run folder "
                                                                     "holds train.log")),
    **dict.fromkeys(("extend", "grow", "vocab"), ("extend-tokenizer", "")),
    **dict.fromkeys(("convert", "merge"), ("export", "")),
    **dict.fromkeys(("ui", "web", "gui", "serve"), ("webui", "")),
    **dict.fromkeys(("help", "commands"), ("--help", "")),
    **dict.fromkeys(("version",), ("--version", "")),
}


def _no_such_command(name: str, message: str) -> str:
    meant, why = _OTHER_COMMANDS.get(name.lower(), (None, ""))
    if meant is None:
        return message
    return f"No such command {name!r}. Did you mean {meant!r}?" + (f" ({why})" if why else "")


def refused_usage(exc: ClickException, args: list[str]) -> str:
    """What the parser's refusal is said as: one `error:` line; the command alone (no arguments) shows its help,
    whose lines would read as one line of literal "\\n"."""
    if type(exc).__name__ == "NoArgsIsHelpError":  # click's: `indextts-train` typed alone
        return exc.format_message()
    return error_line(f"{plain_usage_error(exc, args)} (see --help)")


def plain_usage_error(exc: ClickException, args: list[str]) -> str:
    """One line for a value the parser refused: the flag, the value typed, and what it should be."""
    if isinstance(exc, NoSuchOption):  # click's own guess offers --help for --lr
        return _no_such_option(exc)
    message = exc.format_message().rstrip(".")
    plain = _usage_line(exc, message, args)
    if plain is not None:
        return plain
    param = getattr(exc, "param", None)
    if not isinstance(exc, BadParameter) or param is None:
        return message
    is_option = getattr(param, "param_type_name", "") == "option"
    flag = max(param.opts, key=len) if is_option and param.opts else \
        (param.metavar or param.name or "").upper().removesuffix("...")  # MANIFEST... takes several
    if isinstance(exc, MissingParameter):  # its message is built in format_message: exc.message is empty
        what = _what_it_is(getattr(param, "help", None))  # a newcomer may not know what to give
        return f"{flag} is missing{f': {what}' if what else ''}; this command needs it"
    reason = re.sub(r"^Value error, ", "", exc.message.rstrip("."))
    reason = re.sub(r"is not one of (.*)", lambda m: "is not one of " + m.group(1).replace("'", ""), reason)
    for pattern, plain in _PLAIN_REASONS:
        if re.match(pattern, reason):
            value = _given(list(param.opts), args) if is_option else None
            reason = re.sub(pattern, plain, reason)
            if value is not None and value.strip().lstrip("+-").lower() in ("nan", "inf", "infinity"):
                reason = "is not a finite number"  # a range's bound says nothing about a NaN or an inf
            reason = f"{value!r} {reason}" if value is not None and not reason.startswith("should") else reason
            break
    return f"{flag}: {reason}"


def _usage_line(exc: ClickException, message: str, args: list[str]) -> str | None:
    """Click's other usage errors in the user's terms: a command word it does not know, a flag typed without its
    value, a word no argument takes; None for the rest."""
    command = exc.ctx.command if getattr(exc, "ctx", None) is not None else None
    if (unknown := re.match(r"No such command '(.+)'", message)) is not None:
        return _no_such_command(unknown.group(1), message)
    if command is None:
        return None
    if (bare := re.match(r"Option '(.+)' requires an? ?\S* arguments?", message)) is not None:
        flag = bare.group(1)
        param = next((p for p in command.params if flag in p.opts), None)
        what = _what_it_is(getattr(param, "help", None), stops=".")
        return f"{flag} needs a value{f': {what}' if what else ''}; give it after the flag"
    if (valued := re.match(r"Option '(.+)' does not take a value", message)) is not None:  # `--amp=true`
        switch = next((p for p in command.params if valued.group(1) in (*p.opts, *p.secondary_opts)), None)
        pair = " / ".join((*switch.opts, *switch.secondary_opts)) if switch is not None else valued.group(1)
        return f"{valued.group(1)} takes no value: {pair} alone turns it on / off"
    if (extra := re.match(r"Got unexpected extra argument(?:\(s\)|s)? \((.*)\)", message)) is not None:
        return _extra_argument(command, extra.group(1).split(" ")[0], args)
    return None


def _extra_argument(command: Any, word: str, args: list[str]) -> str:
    """A word no argument of `command` takes: a value given to an on/off flag, a path with a space, a manifest or
    GPU name typed without its flag, or one argument too many."""
    at = max((i for i, arg in enumerate(args) if arg == word), default=0)
    before = args[at - 1] if at > 0 else ""
    takes = {opt: param for param in command.params for opt in (*param.opts, *getattr(param, "secondary_opts", []))}
    switch = takes.get(before)
    if switch is not None and getattr(switch, "is_flag", False):
        pair = " / ".join((*switch.opts, *switch.secondary_opts))
        return f"{before} takes no value ({word!r} is left over): {pair} alone turns it on / off"
    option = takes.get(args[at - 2]) if at > 1 else None
    if option is not None and not getattr(option, "is_flag", False) and before in takes:  # `--resume --max-steps 5`
        what = _what_it_is(getattr(option, "help", None), stops=".")
        return (f"{args[at - 2]} took the flag {before} as its value, leaving {word!r}; give {args[at - 2]} its value"
                + (f" ({what})" if what else ""))
    if option is not None and getattr(option, "multiple", False):
        return (f"{args[at - 2]} takes one value ({word!r} is left over); repeat the flag for each: "
                f"{args[at - 2]} {before} {args[at - 2]} {word}")
    if option is not None and not getattr(option, "is_flag", False):
        return (f"{word!r} is left over after {args[at - 2]} {before}: a value holding a space needs quotes, "
                f"{args[at - 2]} '{before} {word}'")
    if "--train-manifest" in takes:
        return (f"unexpected argument {word!r}: train takes flags only; pass a manifest as --train-manifest {word} "
                "(audio clips or a corpus go to `indextts-train prepare` first, which writes train.jsonl)")
    if "--assume" in takes:
        return f"unexpected argument {word!r}: hardware takes flags only; for a named GPU pass --assume '{word}'"
    names = [(param.metavar or param.name or "").upper() for param in command.params
             if param.param_type_name == "argument"]
    takes_what = f"one {' and one '.join(names)} (a path holding a space needs quotes)" if names else "flags only"
    return f"unexpected argument {word!r}: {command.name} takes {takes_what}"


def _what_it_is(help_text: str | None, stops: str = ".;") -> str | None:
    """A flag's help as the rest of a sentence: its first sentence (or phrase, ending at one of `stops`),
    lower-cased where it starts a phrase."""
    text = " ".join((help_text or "").split())
    first = re.split(f"(?<=[{re.escape(stops)}])\\s", text, maxsplit=1)[0].rstrip(".;")
    if not first or len(first) > 220:
        return None
    word = first.split()[0]
    return first[0].lower() + first[1:] if len(word) == 1 or not word[1:].isupper() else first  # not JSONL


# Flags naming where a command writes. An empty value would become the current folder (Path("") is
# "."), so `--output-dir ''` would train into wherever the shell happens to be.
OUTPUT_FLAGS = ("-o", "--out", "--output", "--output-dir", "--write-clean", "--config-out", "--adapters-out")


# Flags naming a file or folder a command reads: empty, each would read the current folder (`--config ''` was
# refused as `. is a folder`, `checkpoints ''` listed the working directory).
INPUT_FLAGS = ("--config", "--tokenizer", "--base-checkpoint", "--from-run", "--checkpoint", "--manifest", "--base",
               "--corpus", "--sample-text", "--model-dir", "--w2v-bert", "--semantic-codec", "--campplus", "--lines",
               "--inference-python")


# Commands whose arguments are paths to read: an empty one names the current folder (an unset shell variable).
PATH_ARGUMENT_COMMANDS = ("checkpoints", "verify", "export", "listen", "repair", "check-data", "check-tokenizer",
                          "prepare", "tokenize")


# Flags naming a file a command writes (the others name folders), and a file name an example gives, by flag
# or by command.
FILE_OUTPUT_FLAGS = ("-o", "--output", "--write-clean", "--config-out", "--adapters-out")
_EXAMPLE_NAMES = {"--write-clean": "clean.jsonl", "--config-out": "config.yaml", "--adapters-out": "adapters.pth",
                  "export": "gpt.pth", "extend-tokenizer": "bpe.model", "repair": "repaired.pth"}


def _names_a_folder(value: str) -> bool:
    """`out/`, `.`, `..`, `out/.`, `/`: a folder whatever is there (Path drops a trailing slash and `.`, so a file
    would be written under the folder's own name)."""
    return value.endswith(("/", os.sep)) or value.rsplit(os.sep, 1)[-1] in (".", "..")


def folder_for_a_file(args: list[str]) -> bool:
    """Whether a file-output flag is given a folder's path (`-o out/`, `-o .`); says so."""
    pairs = [*zip(args, args[1:], strict=False), *(arg.split("=", 1) for arg in args if "=" in arg)]
    given = next(((flag, value) for flag, value in pairs if flag in FILE_OUTPUT_FLAGS and _names_a_folder(value)),
                 None)
    if given is not None:
        flag, value = given
        name = _EXAMPLE_NAMES.get(flag) or _EXAMPLE_NAMES.get(args[0], "FILE")
        example = f"{value}{'' if value.endswith(('/', os.sep)) else os.sep}{name}"
        typer.echo(error_line(f"{flag} {value} names a folder; give the path of the file to write (e.g. {example})"),
                   err=True)
    return given is not None


def empty_output(args: list[str]) -> bool:
    """Whether a path flag is given an empty value (`demo ''` names its folder empty too), or an output flag a
    value that reads as a flag (`--output-dir --compile`: the value was forgotten, and the run would write into
    a folder named `--compile` without compiling); says so."""
    pairs = [*zip(args, args[1:], strict=False), *(arg.split("=", 1) for arg in args if "=" in arg)]
    named = (*OUTPUT_FLAGS, *INPUT_FLAGS)
    empty = next(("OUT_DIR" if flag == "demo" else flag for flag, value in zip(args, args[1:], strict=False)
                  if value == "" and (flag in named or flag == "demo")), None)
    empty = empty or next((arg[:-1] for arg in args if arg.endswith("=") and arg[:-1] in named), None)
    if empty is None and args and args[0] in PATH_ARGUMENT_COMMANDS:  # `checkpoints ''` listed the working folder
        empty = next((f"{args[0]}: an argument" for before, value in zip(args, args[1:], strict=False)
                      if value == "" and not before.startswith("-")), None)
    if empty is not None:
        what = "to read" if empty in INPUT_FLAGS or empty.endswith(": an argument") else "to write to"
        typer.echo(error_line(f"{empty} is empty; give the path {what} (empty is the current folder)"), err=True)
        return True
    flag_like = next(((flag, value) for flag, value in pairs if flag in OUTPUT_FLAGS and value.startswith("-")), None)
    if flag_like is not None:
        flag, value = flag_like
        typer.echo(error_line(f"{flag} {value}: a flag, not a path (was the value left out?); give the path to write "
                              f"to (a name that starts with '-' is written ./{value})"), err=True)
    return flag_like is not None
