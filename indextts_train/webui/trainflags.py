"""The train-gpt flags the page may pass, read from the config schema (the CLI's flags come from the
same fields, so a new flag is known here with nothing else to do), and the checks of their values.

Every value leaves here as `--flag=VALUE`, so nothing a user types can become a flag of its own;
paths are resolved inside the roots (roots.py), other values are checked text. `--from-run` names a
run.yaml whose recorded inputs the trainer would use: each of them must lie inside the roots too.
No module here imports Gradio.
"""

from __future__ import annotations

import dataclasses
import os
import shlex
import threading
import unicodedata
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from indextts_train.config.other_flags import flag_instead
from indextts_train.config.run_inputs import TrainOptions
from indextts_train.config.schema import field_types, near_names
from indextts_train.config.settings import TrainConfig, train_flags
from indextts_train.errors import UserError
from indextts_train.ui.run_record import recorded_options
from indextts_train.webui.roots import Roots, checked_text

MANIFESTS = ("train_manifests", "val_manifests")
_RECORDS: dict[tuple, dict[str, Any] | UserError] = {}  # parsed run.yaml records (--from-run), by version
_RECORDS_LOCK = threading.Lock()  # Gradio calls handlers from several threads
MAX_RECORDED = 1000  # values of one recorded input checked, as many as a manifests box takes (form.MAX_MANIFESTS)


@dataclass(frozen=True)
class Flag:
    """One train-gpt flag: the field it sets and what its value is."""

    name: str  # the TrainOptions / TrainConfig field
    kind: str  # switch (no value), manifest, path, resume ('auto' or a path), record (--from-run), program
    # (a program the run starts), model (a folder or a hub id), value
    on: bool = True  # a switch: the value its spelling sets (--no-compile: False)


def _kind(field: dataclasses.Field, type_text: str) -> str:
    if field.name in MANIFESTS:
        return "manifest"
    if field.name in ("resume", "from_run"):
        return {"resume": "resume", "from_run": "record"}[field.name]
    return "path" if "Path" in type_text else field.metadata.get("names") or "value"


def _flag_table() -> dict[str, Flag]:
    """Every train-gpt flag name (both spellings of a switch) -> Flag."""
    types = {**field_types(TrainOptions), **field_types(TrainConfig)}
    fields = [f for f in dataclasses.fields(TrainOptions) if f.metadata.get("cli", True)] + train_flags()
    table = {}
    for f in fields:
        dashed = "--" + f.name.replace("_", "-")
        declared = f.metadata.get("flag")
        if "bool" in str(types[f.name]):
            on, _, off = (declared or f"{dashed}/--no-{dashed[2:]}").partition("/")
            table[on], table[off] = Flag(f.name, "switch"), Flag(f.name, "switch", on=False)
        else:
            table[declared or dashed] = Flag(f.name, _kind(f, str(types[f.name])))
    return table


FLAGS = _flag_table()
# The flag of each field that takes a value (a recorded option is checked as that flag's value).
VALUE_FLAG = {spec.name: name for name, spec in FLAGS.items() if spec.kind != "switch"}


def checked_value(flag: str, value: str, roots: Roots, what: str) -> str:
    """The value to pass for `flag`: a path resolved inside the roots, or checked text."""
    kind = FLAGS[flag].kind
    if kind == "manifest":
        return roots.manifest(value, what)
    if kind == "resume" and value.strip() == "auto":
        return "auto"
    if kind in ("path", "resume"):
        return str(roots.inside(value, what))
    if kind == "record":
        record = roots.inside(value, what)
        check_record(record, roots)
        return str(record)
    if kind == "program":
        return str(roots.program(value, what))
    if kind == "model":
        return roots.model(value, what)
    return checked_text(value, what)


def _recorded_options(path: Path) -> dict[str, Any]:
    """recorded_options(path), parsed once per version of the file: Preview checks the record on every keystroke,
    and a 2 MB run.yaml took 5 s to parse. Only the parse is kept; its paths are resolved and checked every time."""
    try:
        info = os.stat(path)
    except OSError:
        return recorded_options(path)  # its own line for a missing file
    key = (str(path), info.st_dev, info.st_ino, info.st_size, info.st_mtime_ns)
    with _RECORDS_LOCK:
        found = _RECORDS.get(key)
    if found is None:
        try:
            found = recorded_options(path)
        except UserError as exc:  # a record refused is refused again without a new parse
            found = exc
        with _RECORDS_LOCK:
            if len(_RECORDS) >= 8:
                _RECORDS.clear()
            _RECORDS[key] = found
    if isinstance(found, UserError):
        raise UserError(str(found))
    return found


def check_record(path: Path, roots: Roots) -> None:
    """Refuse a run.yaml (--from-run) whose recorded inputs lie outside the roots: the trainer would use them."""
    recorded = _recorded_options(path)
    for name, value in recorded.items():
        flag = VALUE_FLAG.get(name)
        if flag is None or FLAGS[flag].kind == "value" or value in (None, ""):
            continue
        values = value if isinstance(value, list) else [value]
        if len(values) > MAX_RECORDED:  # each is a path resolved on every keystroke: 60,000 took 13 s
            raise UserError(f"--from-run {path}: its {flag} lists {len(values):,} values; the page checks at most "
                            f"{MAX_RECORDED:,} (merge them into fewer files, or start this run from a terminal)")
        for one in values:
            checked_value(flag, str(one), roots, f"--from-run {path}: its {flag}")


def other_flags(text: str, roots: Roots, own_fields: set[str]) -> list[str]:
    """The "Other train-gpt flags" box: known flags only, each value checked, as `--flag=VALUE`.

    `own_fields`: fields the page has a box for; typed here as well, one would silently win.
    """
    try:
        tokens = shlex.split(checked_text(text or "", "Other flags", may_start_with_dash=True))
    except ValueError as exc:
        raise UserError(f"Other flags: {exc} (quote values the way a shell would)") from None
    out, i = [], 0
    while i < len(tokens):
        token = tokens[i]
        flag, equals, inline = token.partition("=")
        spec = FLAGS.get(flag) if flag.startswith("--") else None
        if spec is None:
            _refuse_look_alike_dash(token)
            instead = flag_instead(flag, sorted(FLAGS)) if flag.startswith("--") else None  # --lr, --device
            near = near_names(flag, sorted(FLAGS)) if flag.startswith("--") and instead is None else []
            meant = f"; {instead}" if instead else f"; did you mean {' or '.join(near)}?" if near else ""
            raise UserError(f"Other flags: {token!r} is not a train-gpt flag{meant} (see train-gpt --help)")
        if spec.name in own_fields:
            raise UserError(f"Other flags: {flag} has its own field on this page; set it there")
        if spec.kind == "switch":
            if equals:
                raise UserError(f"Other flags: {flag} takes no value; write {flag} alone")
            out.append(flag)
            i += 1
            continue
        if not equals and i + 1 >= len(tokens):
            raise UserError(f"Other flags: {flag} needs a value")
        value = inline if equals else tokens[i + 1]
        out.append(f"{flag}={checked_value(flag, value, roots, f'Other flags {flag}')}")
        i += 1 if equals else 2
    return out


def _refuse_look_alike_dash(token: str) -> None:
    """One line naming the character when a flag was typed with a dash that is not '-' (a word processor's en or
    em dash, a minus sign: pasted from a document, '—lr' read as 'not a train-gpt flag' with no hint why)."""
    dash = token[:1]
    if dash != "-" and (unicodedata.category(dash) == "Pd" or dash == "\u2212"):
        raise UserError(f"Other flags: {token!r} starts with {dash!r} (U+{ord(dash):04X}), not '-': type flags with "
                        "the keyboard's hyphen-minus (--flag)")


def flag_settings(flags: list[str]) -> dict[str, Any]:
    """The `train:` settings that checked flags (`--flag=VALUE`, switches; see other_flags) set, typed as
    their fields: what the run of those flags would read, for the page's own plan."""
    types, out = field_types(TrainConfig), {}
    for item in flags:
        flag, _, text = item.partition("=")
        spec = FLAGS[flag]
        if spec.name not in types:
            continue
        tp = types[spec.name]
        if spec.kind == "switch":
            out[spec.name] = spec.on
        elif tp == list[str]:
            out.setdefault(spec.name, []).append(text)
        else:
            out[spec.name] = _typed(flag, text, tp)
    return out


def _typed(flag: str, text: str, tp: Any) -> Any:
    """A flag's text as its field's type; the field's range is checked where the config is built."""
    try:
        return int(text) if tp is int else float(text) if tp is float else text
    except ValueError:
        raise UserError(f"Other flags: {flag} {text!r} is not a {'whole ' if tp is int else ''}number") from None
