"""Where every benchmark puts its figures: one JSON file under benchmarks/results/, also printed."""

from __future__ import annotations

import json
from pathlib import Path


def write_result(path: Path, result: dict, *, echo: bool = True) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    text = json.dumps(result, indent=2)
    path.write_text(text + "\n", encoding="utf-8")
    if echo:
        print(text)
