"""GPU names as users type them: `RTX4090`, `rtx 4090`, `NVIDIA GeForce RTX 4090` and `4090` all name the
RTX-4090 of the table; a name that fits several cards or none is answered with the closest ones."""

from __future__ import annotations

import difflib
import re

_VENDOR_WORDS = re.compile(r"\b(nvidia|geforce|tesla|quadro)\b")


def normal_gpu_name(name: str) -> str:
    """Lower case without spaces, dashes, underscores and vendor words: `RTX_4090` -> `rtx4090`."""
    return re.sub(r"[\s_-]+", "", _VENDOR_WORDS.sub(" ", name.strip().lower()))


def known_gpu_key(name: str, known: dict[str, str]) -> tuple[str | None, list[str]]:
    """The key of `known` (table key -> the card's name as torch reports it) that `name` means, else None
    and the closest keys: the normal form equal to a key's or a card name's, else part of exactly one
    key's ("4090", "H100"); several such keys ("A100") are the answer's closest ones."""
    query = normal_gpu_name(name)
    forms = {normal_gpu_name(key): key for key in known} | {normal_gpu_name(card): key for key, card in known.items()}
    if query in forms:
        return forms[query], []
    order = list(known)
    containing = sorted({key for form, key in forms.items() if query and query in form}, key=order.index)
    if len(containing) == 1:
        return containing[0], []
    close = difflib.get_close_matches(query, list(forms), n=3, cutoff=0.5)
    return None, containing or list(dict.fromkeys(forms[form] for form in close))
