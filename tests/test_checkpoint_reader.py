"""checkpoint/reader.py: a small hostile checkpoint is refused in one line before the work it describes.

The three kinds of issue 29 (inflation, elements, pickle work) and foreign structure, each built small
by tests/hostile.py; a legitimate view or shared tensor still loads.
"""

from __future__ import annotations

import time
from pathlib import Path

import hostile
import pytest
import torch

from indextts_train.checkpoint.reader import load_checkpoint, read_unchecked
from indextts_train.errors import CheckpointError
from indextts_train.files.numpy_pickle import MAX_PICKLE_BYTES, NOT_OURS


def refused(path: Path, needle: str) -> str:
    started = time.perf_counter()
    for read in (load_checkpoint, read_unchecked):
        with pytest.raises(CheckpointError) as info:
            read(path)
        message = str(info.value)
        assert needle in message and str(path) in message and "\n" not in message, message
    assert time.perf_counter() - started < 2.0
    return message


def test_a_zip_bomb_is_refused_from_its_central_directory(tmp_path: Path) -> None:
    path = hostile.zip_bomb(tmp_path / "bomb.pth")
    assert path.stat().st_size * 500 < hostile.BOMB_INFLATED_MIB << 20
    refused(path, f"inflating to {hostile.BOMB_INFLATED_MIB << 20})")  # refused in milliseconds: nothing inflated


def test_a_strided_view_claiming_10_to_the_12_elements_is_refused(tmp_path: Path) -> None:
    path = hostile.strided_view(tmp_path / "view.pth")
    assert path.stat().st_size < 4096
    refused(path, "claims 1000000000000 elements but its storage holds 16 bytes")


@pytest.mark.parametrize("how", ["compressed", "claimed"])
def test_a_pickle_of_120_million_shared_references_is_refused_unread(tmp_path: Path, how: str) -> None:
    if how == "compressed":  # 240 MB of pickle deflated into a few hundred KB
        path = hostile.shared_references(tmp_path / "refs.pth", 120_000_000 // 100, compressed=True)
        needle = f"{NOT_OURS}: its member archive/data.pkl is compressed"
    else:  # stored, its entry claiming the 240 MB
        path = hostile.claimed_sizes(hostile.shared_references(tmp_path / "refs.pth", 1000), "data.pkl", 240_000_000)
        needle = "its members claim"
    refused(path, needle)


def test_a_stored_pickle_past_the_bound_is_refused_before_torch_reads_it(tmp_path: Path) -> None:
    path = hostile.shared_references(tmp_path / "refs.pth", MAX_PICKLE_BYTES // 2 + 1)  # just past, stored
    refused(path, f"its pickle holds {MAX_PICKLE_BYTES >> 20} MiB")


def test_tensor_data_reached_through_shared_lists_is_bounded(tmp_path: Path) -> None:
    weight = torch.zeros(1024)  # 4 KB, referenced 2^20 times through 20 levels of shared lists
    nested: list = [weight]
    for _ in range(20):
        nested = [nested, nested]
    torch.save({"model": {"w": weight}, "history": {"train": nested}}, tmp_path / "shared.pth")
    refused(tmp_path / "shared.pth", "its tensors reach more than")


def test_a_non_string_key_in_the_model_dict_is_one_line(tmp_path: Path) -> None:
    path = hostile.foreign_key(tmp_path / "keys.pth", {"model": {"w": torch.zeros(2)}, "step": 3})
    refused(path, "its model dict has a key of type int (7)")
    torch.save({"model": {"w": [1, 2]}}, tmp_path / "values.pth")
    refused(tmp_path / "values.pth", "its model dict's 'w' is a list, not a tensor")


def test_not_regular_files_are_refused_without_blocking(tmp_path: Path) -> None:
    refused(hostile.fifo(tmp_path / "model_step1.pth"), "is a FIFO")
    with pytest.raises(CheckpointError, match="system pseudo-file"):
        load_checkpoint(Path("/proc/self/mem"))


def test_views_and_shared_storage_of_a_real_state_dict_still_load(tmp_path: Path) -> None:
    base = torch.arange(12.0)
    state = {"model": {"a": base, "tied": base, "half": base[6:], "grid": base.view(3, 4).t()}}
    torch.save(state, tmp_path / "ok.pth")
    loaded = load_checkpoint(tmp_path / "ok.pth")["model"]
    assert all(torch.equal(loaded[k], v) for k, v in state["model"].items())
