"""Dataclasses as schemas: the one loader that rejects unknown keys and wrong types by name.

Config sections (`gpt:`, `train:`) and checkpoint components (progress, history) are dataclasses;
`build` makes one from a mapping and says which key is wrong and what it expected, in one line.
"""

from __future__ import annotations

import dataclasses
import difflib
import functools
import re
import types
import typing
from typing import Any, TypeVar, Union, get_args, get_origin, get_type_hints

from indextts_train.errors import UserError

T = TypeVar("T")


def is_int(value: Any) -> bool:
    """An int that is not a bool (True would pass as a step count otherwise)."""
    return isinstance(value, int) and not isinstance(value, bool)


def _fits(value: Any, tp: Any) -> bool:
    origin = get_origin(tp)
    if origin in (Union, types.UnionType):
        return any(_fits(value, arg) for arg in get_args(tp))
    if tp is type(None):
        return value is None
    if tp is int:
        return is_int(value)
    if tp is float:
        return is_int(value) or isinstance(value, float)
    if tp in (typing.Any,):
        return True
    if origin is tuple:
        return isinstance(value, (list, tuple)) and all(_fits(v, a) for v, a in zip(value, get_args(tp), strict=False))
    if origin is list and get_args(tp):  # each element too: `borrow_languages: [1]` would fail deep in the run
        return isinstance(value, list) and all(_fits(v, get_args(tp)[0]) for v in value)
    if origin is not None:
        return isinstance(value, origin)
    return isinstance(value, tp)


def type_name(tp: Any) -> str:
    """`int`, `float or None`, `list`: how a message names an expected type."""
    if get_origin(tp) in (Union, types.UnionType):
        return " or ".join(type_name(arg) for arg in get_args(tp))
    if tp is type(None):
        return "None"
    origin = get_origin(tp)
    if origin is tuple:
        return f"a list of {len(get_args(tp))} numbers"
    if origin is list and get_args(tp):
        return f"a list of {type_name(get_args(tp)[0])}"
    return getattr(origin or tp, "__name__", str(tp))


@functools.cache
def field_types(cls: type) -> dict[str, Any]:
    """Resolved annotations of a dataclass (the modules use `from __future__ import annotations`).

    Cached: resolving evaluates every annotation string (milliseconds), and every config, record and
    checkpoint read builds its dataclasses through here. The dict is shared: read it, never change it.
    """
    return get_type_hints(cls)


def field_default(f: dataclasses.Field) -> Any:
    """A dataclass field's default value (a fresh one from its factory)."""
    return f.default_factory() if f.default is dataclasses.MISSING else f.default


# A number YAML 1.1 (PyYAML) reads as text: `1e-4` (an exponent without a dot) or a quoted number.
_NUMBER_TEXT = re.compile(r"\s*[-+]?(\d+\.?\d*|\.\d+)([eE][-+]?\d+)?\s*")


def type_problem(value: Any, tp: Any) -> str | None:
    """'expected int, got 'twenty'' when `value` does not fit `tp`, else None."""
    if _fits(value, tp):
        return None
    if isinstance(value, str) and _NUMBER_TEXT.fullmatch(value) and _fits(1, tp):
        # `learning_rate: 1e-4` looks like a number to a person; say why it is text and how to write it
        mantissa, e, exponent = value.strip().lower().partition("e")
        number = mantissa + (".0" if e and "." not in mantissa else "") + e + exponent
        return (f"expected {type_name(tp)}, got the text {value!r}: YAML reads a quoted number, and one with an "
                f"exponent but no dot, as text; write {number}, without quotes")
    return f"expected {type_name(tp)}, got {value!r}"


def build(cls: type[T], data: Any, where: str) -> T:
    """Build dataclass `cls` from a mapping: unknown keys and wrong types are named; nested dataclasses built too."""
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise UserError(f"{where}: expected a mapping, got {type(data).__name__}")
    types_of = field_types(cls)
    known = [f.name for f in dataclasses.fields(cls) if f.init and f.metadata.get("config_key", True)]
    unknown = sorted(set(data) - set(known), key=str)
    if unknown:
        meant = {key: near_names(key, known) for key in map(str, unknown)}  # found as a mistyped flag's are
        guesses = [f"{' or '.join(names)}" + (f" for {key}" if len(unknown) > 1 else "")
                   for key, names in meant.items() if names]
        hint = f" (did you mean {'; '.join(guesses)}?)" if guesses else ""
        raise UserError(f"{where}: unknown key(s) {', '.join(map(str, unknown))}{hint}; known keys: {', '.join(known)}")
    kwargs = {}
    for name, value in data.items():
        tp = types_of[name]
        if dataclasses.is_dataclass(tp):
            value = build(tp, value, f"{where}.{name}")
        else:
            problem = type_problem(value, tp)
            if problem:
                raise UserError(f"{where}.{name}: {problem}")
            if tp is float and is_int(value):
                value = _as_float(value, f"{where}.{name}")
        kwargs[name] = value
    try:
        return cls(**kwargs)
    except UserError as exc:
        raise UserError(_within(where, str(exc))) from None
    except (TypeError, ValueError) as exc:
        raise UserError(f"{where}: {exc}") from None


def _as_float(value: int, where: str) -> float:
    """An int where a float belongs; one past the float range (`1` and 400 zeros) is named, not an OverflowError."""
    try:
        return float(value)
    except OverflowError:
        raise UserError(f"{where}: {len(str(abs(value)))} digits is beyond any number a setting takes "
                        "(at most about 1.8e308)") from None


def _within(where: str, message: str) -> str:
    """`where: message`, said once: a message that already names the section's key (`train.seed ...`)
    keeps only the file part of `where`, never `train: train.seed`."""
    section = where.rpartition(": ")[2]
    if message.startswith(f"{section}."):
        return where[: len(where) - len(section)] + message
    return f"{where}: {message}"


def near_names(typed: str, names: list[str]) -> list[str]:
    """The names (flags `--max-steps` or keys `max_steps`) a mistyped `typed` may have meant, closest kind
    first: the same words with `_` for `-` (--learning_rate), its initials (--lr), one of its words (--steps:
    --max-steps), then spelling. Dashes and underscores between words count as one."""
    def words(name: str) -> list[str]:
        return name.lstrip("-").lower().replace("_", "-").split("-")

    wanted = words(typed)
    found = [name for name in names if words(name) == wanted]
    if len(wanted) == 1:  # one word: the initials of a name's words, or one of them
        found += [name for name in names if "".join(word[:1] for word in words(name)) == wanted[0]]
        found += [name for name in names if wanted[0] in words(name)]
    spelled = {"--" + "-".join(words(name)): name for name in names}  # spelt as flags, whichever was given
    found += [spelled[close] for close in difflib.get_close_matches("--" + "-".join(wanted), spelled, n=3,
                                                                     cutoff=0.75)]
    return list(dict.fromkeys(found))[:3]
