"""A fixed-seed tiny run through the real CLI gives the numbers pinned in `tests/data/fixtures/`.

The kill/resume tests compare two runs of today's code with each other; this one compares today's
code with the numbers an earlier tree computed, so that a refactor that claims to change nothing is
held to it (every trained parameter, every optimizer slot, the param groups and the logged history,
with `torch.equal`). `make_fixtures.py` says when and how the reference may be remade.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent / "data" / "fixtures"))

from make_fixtures import REFERENCE, compare, load_gz, numbers, run  # noqa: E402


@pytest.mark.slow
def test_the_reference_run_gives_the_pinned_numbers(tmp_path: Path) -> None:
    want = load_gz(REFERENCE)
    got = numbers(run(tmp_path, max_steps=12, save_interval=4))
    assert want["model"] and want["optimizer"]["state"], "an empty reference would prove nothing"
    assert compare(got, want) == []
