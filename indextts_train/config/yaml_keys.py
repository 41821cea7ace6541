"""A config file read as YAML, with a key written twice in one mapping refused.

PyYAML keeps the last of two equal keys without a word, so `epochs: 2` and, further down, `epochs: 30`
train 30 epochs while the reader of the file sees 2. The YAML spec calls such a file invalid; the
config is refused with both lines named, so the user decides which one was meant.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from indextts_train.errors import UserError
from indextts_train.files.bounded import MAX_YAML_BYTES, read_bounded, yaml_text

MERGE_TAG = "tag:yaml.org,2002:merge"  # `<<: *base`, which may repeat by design


def load_config_yaml(path: Path, what: str = "config") -> Any:
    """The file's one YAML document, read as files/bounded.load_yaml reads it (size, nesting and aliases
    bounded, safe tags only), refused in one line when a mapping gives a key twice (in the same parse)."""
    data = read_bounded(path, MAX_YAML_BYTES, what)
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise UserError(f"{path}: not UTF-8 text ({exc.reason} at byte {exc.start}); save it as UTF-8") from None

    def refuse_repeats(root: yaml.Node) -> None:
        twice = repeated_key_of(root)
        if twice is not None:
            key, first, again = twice
            raise UserError(f"{path} line {again}: key {key!r} is given twice (lines {first} and {again}) in one "
                            "mapping, and YAML would keep only the last; remove the one you did not mean")

    return yaml_text(text, str(path), check_node=refuse_repeats)  # composed once: bounded first, then this


def repeated_key(text: str) -> tuple[str, int, int] | None:
    """repeated_key_of the document `text` composes to."""
    root = yaml.compose(text, Loader=yaml.SafeLoader)
    return None if root is None else repeated_key_of(root)


def repeated_key_of(root: yaml.Node) -> tuple[str, int, int] | None:
    """(key, first line, repeated line) of the first key written twice in one mapping under `root`, or None.

    The node graph is walked once per node: an alias shares its anchor's node, so a document of aliases
    that would expand to billions of values is still only as many nodes as it has text."""
    stack, seen = [root], set()
    while stack:
        node = stack.pop()
        if id(node) in seen:
            continue
        seen.add(id(node))
        if isinstance(node, yaml.MappingNode):
            lines: dict[tuple[str, str], int] = {}
            for key, value in node.value:
                if isinstance(key, yaml.ScalarNode) and key.tag != MERGE_TAG:
                    name, line = (key.tag, key.value), key.start_mark.line + 1
                    if name in lines:
                        return key.value, lines[name], line
                    lines[name] = line
                stack += [key, value]
        elif isinstance(node, yaml.SequenceNode):
            stack += node.value
    return None
