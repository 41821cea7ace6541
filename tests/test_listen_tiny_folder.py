"""The stand-in inference folder (the demo's OUT/listen_model): a failure in the inference environment is
one line."""

from __future__ import annotations

import pytest

from indextts_train.config.family import INDEXTTS25
from indextts_train.errors import UserError
from indextts_train.listen.tiny_folder import _make_parts


@pytest.mark.slow  # starts the stand-in interpreter
def test_an_environment_without_the_official_classes_is_one_line(tmp_path) -> None:
    """An interpreter that imports indextts25.api (so the demo chose it) but not the s2mel classes: the demo
    ended in two tracebacks (the child's and CalledProcessError)."""
    python = tmp_path / "python"
    python.write_text("#!/bin/sh\necho 'Traceback (most recent call last):' >&2\n"
                      "echo \"ModuleNotFoundError: No module named 'indextts25.s2mel'\" >&2\nexit 1\n")
    python.chmod(0o755)
    family = INDEXTTS25
    with pytest.raises(UserError) as refused:
        _make_parts(python, family, tmp_path / "model", 4)
    assert str(refused.value) == (
        f"{python} could not make the s2mel and BigVGAN weights of {tmp_path / 'model'} with the official "
        "IndexTTS-2.5 classes (exit 1: ModuleNotFoundError: No module named 'indextts25.s2mel'); install "
        "indextts25-inference whole into that environment (bash scripts/install_inference.sh indextts2.5 VENV), "
        "or use another one")
    with pytest.raises(UserError, match=r"could not be started"):
        _make_parts(tmp_path / "no-python", family, tmp_path / "model", 4)
