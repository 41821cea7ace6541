"""The ASR model listen loads: one line for a model that is not there, naming a command that exists."""

from __future__ import annotations

import logging

import pytest

from indextts_train.errors import UserError
from indextts_train.listen import asr

pytestmark = pytest.mark.slow  # imports transformers: seconds to tens of seconds on a loaded machine


def test_a_model_not_there_is_one_line_with_a_command_that_exists(monkeypatch, capsys) -> None:
    """With no network huggingface_hub said two lines per retry (`... thrown while requesting HEAD`,
    `Retrying in 8s`) before listen's line, and that line advised `huggingface-cli download`, a command
    huggingface_hub 1.0 removed (`hf download`)."""
    import transformers

    def offline(*args, **kwargs):
        logging.getLogger("huggingface_hub.utils._http").warning("'[Errno -2]' thrown while requesting HEAD")
        raise OSError("We couldn't connect to 'https://huggingface.co'")

    monkeypatch.setattr(transformers, "pipeline", offline)
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    with pytest.raises(UserError) as refused:
        asr.load_recogniser("someone/model", "cpu")
    assert str(refused.value).endswith("or download it first: hf download someone/model")
    captured = capsys.readouterr()
    assert "thrown while requesting" not in captured.err + captured.out


def test_a_file_given_as_the_model_folder_is_said_as_such(tmp_path) -> None:
    (tmp_path / "model.bin").write_bytes(b"weights")
    with pytest.raises(UserError, match=r"model.bin: not a folder; pass a transformers ASR model folder"):
        asr.load_recogniser(str(tmp_path / "model.bin"), "cpu")
