"""The weights-only loader accepts plain numpy arrays (the community latest.pth) and nothing more."""

from __future__ import annotations

import pickle
import random
import time
from pathlib import Path

import numpy as np
import pytest
import torch

from indextts_train.checkpoint import files as ckpt
from indextts_train.checkpoint.files import CheckpointError
from indextts_train.checkpoint.verify import verify_checkpoint
from indextts_train.files import numpy_pickle
from indextts_train.files.numpy_pickle import PLAIN_DTYPES, load_weights_only


class Reduces:
    """Pickles as `func(*args)` (then BUILD with `state` when given): how an attacker writes a pickle."""

    def __init__(self, func, args: tuple, state=None) -> None:
        self.func, self.args, self.state = func, args, state

    def __reduce__(self):
        return (self.func, self.args) if self.state is None else (self.func, self.args, self.state)


def saved(tmp_path: Path, obj) -> Path:
    path = tmp_path / "file.pth"
    torch.save(obj, path)
    return path


def test_community_rng_state_loads_as_plain_values(tmp_path: Path) -> None:
    numpy_state = np.random.RandomState(1234).get_state()  # ('MT19937', uint32 (624,), pos, has_gauss, gauss)
    path = saved(tmp_path, {"rng_state": {"torch_cpu": torch.get_rng_state(), "numpy": numpy_state,
                                          "python": random.Random(1234).getstate()},
                            "pytorch_version": torch.__version__, "step": 3})
    with pytest.raises(pickle.UnpicklingError):  # control: a plain weights-only load refuses this file
        torch.load(path, weights_only=True)
    loaded = load_weights_only(path)
    key = loaded["rng_state"]["numpy"][1]
    assert type(key) is np.ndarray and key.dtype == np.uint32 and key.flags.writeable
    assert np.array_equal(key, numpy_state[1]) and loaded["rng_state"]["numpy"][2:] == numpy_state[2:]
    assert type(loaded["pytorch_version"]) is str and loaded["pytorch_version"] == str(torch.__version__)
    restored = np.random.RandomState()
    restored.set_state(loaded["rng_state"]["numpy"])
    assert restored.randint(0, 2**31, 8).tolist() == np.random.RandomState(1234).randint(0, 2**31, 8).tolist()


def test_every_plain_dtype_byte_order_and_layout_round_trips(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    arrays = {}
    for spec in sorted(PLAIN_DTYPES):
        values = rng.integers(0, 100, size=(3, 4)).astype(spec)
        arrays[spec] = values
        arrays[f"{spec} fortran"] = np.asfortranarray(values)
        arrays[f"{spec} swapped"] = values.astype(np.dtype(spec).newbyteorder(">" if spec not in ("b1", "i1", "u1")
                                                                              else "|"))
    loaded = load_weights_only(saved(tmp_path, arrays))
    for name, array in arrays.items():
        assert type(loaded[name]) is np.ndarray, name
        assert loaded[name].dtype == array.dtype and loaded[name].shape == array.shape, name
        assert np.array_equal(loaded[name], array), name


def test_a_file_written_under_numpy_1_loads_too(tmp_path: Path) -> None:
    # numpy 1.x pickles its arrays as numpy.core.multiarray._reconstruct (2.x: numpy._core...).
    path = tmp_path / "legacy.pth"
    key = np.random.RandomState(7).get_state()[1]
    torch.save({"numpy": key}, path, _use_new_zipfile_serialization=False)  # one plain pickle stream
    data = path.read_bytes()
    assert b"numpy._core.multiarray" in data
    path.write_bytes(data.replace(b"numpy._core.multiarray", b"numpy.core.multiarray"))
    loaded = load_weights_only(path)["numpy"]
    assert type(loaded) is np.ndarray and loaded.dtype == np.uint32 and np.array_equal(loaded, key)


@pytest.mark.parametrize("case", ["object array", "structured dtype", "datetime array", "object flags",
                                  "ndarray called", "subclass", "short data"])
def test_numpy_content_beyond_plain_arrays_is_refused(tmp_path: Path, case: str) -> None:
    marker = tmp_path / "PWNED"
    evil = {
        "object array": lambda: np.array([1, Reduces(open, (str(marker), "w"))], dtype=object),
        "structured dtype": lambda: np.zeros(2, dtype=[("a", "i4"), ("b", "f4")]),
        "datetime array": lambda: np.zeros(2, dtype="M8[s]"),
        # a uint32 dtype whose state claims it holds Python objects (flags 63)
        "object flags": lambda: Reduces(np.dtype, ("u4", False, True), (3, "<", None, None, None, -1, -1, 63)),
        "ndarray called": lambda: Reduces(np.ndarray, ((2,), "O")),
        "subclass": lambda: np.ma.masked_array([1, 2], mask=[0, 1]),
        "short data": lambda: Reduces(np.zeros(1).__reduce__()[0], (np.ndarray, (0,), b"b"),
                                      (1, (4,), np.dtype("u4"), False, b"\0" * 8)),
    }[case]()
    path = saved(tmp_path, {"model": {"w": torch.zeros(2)}, "rng_state": {"numpy": evil}})
    with pytest.raises(CheckpointError, match="refusing to load") as refused:
        ckpt.load_checkpoint(path)
    assert str(path) in str(refused.value) and "\n" not in str(refused.value)
    verdict = verify_checkpoint(path)
    assert (verdict.status, verdict.exit_code) == ("INCOMPLETE", 2)
    assert not marker.exists()


def doubled(depth: int) -> list:
    """A list nested `depth` deep whose two elements are one shared list: 2^depth paths, a few bytes."""
    nested: list = []
    for _ in range(depth):
        nested = [nested, nested]
    return nested


@pytest.mark.parametrize(("depth", "says"), [(40, "nested deeper than 32"), (30, "values or")])
def test_shared_references_are_walked_once_and_refused_past_the_bounds(tmp_path: Path, depth: int,
                                                                       says: str) -> None:
    path = saved(tmp_path, {"model": {"w": torch.zeros(2)}, "history": {"train": doubled(depth)}})
    assert path.stat().st_size < 4096  # the pickle memo: a few hundred bytes of data.pkl
    started = time.perf_counter()
    with pytest.raises(CheckpointError, match=f"not a checkpoint this program wrote: .*{says}") as refused:
        ckpt.load_checkpoint(path)
    assert time.perf_counter() - started < 1.0
    assert "\n" not in str(refused.value) and str(path) in str(refused.value)
    verdict = verify_checkpoint(path)
    assert verdict.status == "INCOMPLETE" and "not a checkpoint this program wrote" in verdict.reasons[0]


def test_shared_references_within_the_bounds_load_once_each(tmp_path: Path) -> None:
    array = np.arange(3, dtype=np.uint32)
    shared = [torch.__version__, array]  # converted once, though reachable 2^10 times
    path = saved(tmp_path, {"tree": doubled(10), "a": shared, "b": shared})
    loaded = load_weights_only(path)
    assert loaded["a"] is loaded["b"] and type(loaded["a"][0]) is str and type(loaded["a"][1]) is np.ndarray
    assert np.array_equal(loaded["a"][1], array)
    node = loaded["tree"]
    for _ in range(10):
        assert node[0] is node[1]
        node = node[0]
    assert node == []


def test_a_pickle_past_its_size_bound_is_refused_before_unpickling(tmp_path: Path, monkeypatch) -> None:
    path = saved(tmp_path, {"model": {"w": torch.zeros(2)}, "notes": "x" * 4096})
    monkeypatch.setattr(numpy_pickle, "MAX_PICKLE_BYTES", 1024)
    monkeypatch.setattr(torch, "load", lambda *a, **k: pytest.fail("torch.load reached"))
    with pytest.raises(CheckpointError, match="not a checkpoint this program wrote: its pickle holds"):
        ckpt.load_checkpoint(path)


def test_a_chain_of_shared_lists_first_met_near_the_top_is_still_too_deep(tmp_path: Path) -> None:
    """Each link is first reached at depth 1 (listed in order beside the others), so the deep end is
    only ever reached through the memo: the memo must carry each subtree's height."""
    chain: list = [[]]
    for _ in range(40):
        chain.append([chain[-1]])
    path = saved(tmp_path, {"model": {"w": torch.zeros(2)}, "history": {"train": chain}})
    with pytest.raises(CheckpointError, match="not a checkpoint this program wrote: .*nested deeper than 32"):
        ckpt.load_checkpoint(path)


def test_a_tensor_claiming_more_elements_than_its_storage_is_refused(tmp_path: Path) -> None:
    path = saved(tmp_path, {"w": torch.zeros(4).as_strided((10**6, 10**6), (0, 0))})
    with pytest.raises(pickle.UnpicklingError, match="claims 1000000000000 elements but its storage holds 16"):
        load_weights_only(path)
    overlap = saved(tmp_path, {"w": torch.arange(8.0).as_strided((4, 2), (1, 1))})  # 8 elements of 5 stored
    assert torch.equal(load_weights_only(overlap)["w"], torch.arange(8.0).as_strided((4, 2), (1, 1)))


def test_tensor_data_reachable_past_four_times_the_file_is_refused(tmp_path: Path) -> None:
    weight = torch.zeros(256)
    path = saved(tmp_path, {"w": weight, "again": [weight] * 8, "tree": [doubled(12), weight]})
    assert load_weights_only(path)["again"][0] is not None  # 9 references of 1 KB: within the bound
    many = saved(tmp_path, {"w": weight, "again": [[weight] * 64] * 64})  # 4096 references: 4 MiB
    with pytest.raises(pickle.UnpicklingError, match="its tensors reach more than"):
        load_weights_only(many)


def test_an_old_format_file_past_the_pickle_bound_is_refused_unread(tmp_path: Path) -> None:
    path = tmp_path / "old.pth"
    torch.save({"w": torch.zeros(2)}, path, _use_new_zipfile_serialization=False)
    assert load_weights_only(path)["w"].shape == (2,)
    with open(path, "r+b") as handle:  # sparse: nothing written, the size alone is refused
        handle.truncate(numpy_pickle.MAX_PICKLE_BYTES + 1)
    with pytest.raises(pickle.UnpicklingError, match="old-format"):
        load_weights_only(path)


def test_a_zip_directory_past_its_member_bound_is_refused_from_the_tail(tmp_path: Path, monkeypatch) -> None:
    """A checkpoint with a million empty members appended: zipfile parsed every entry first (25 s, 850 MB).
    The end record's count (the zip64 one past 65,535 entries) is read from the file's tail and bounded."""
    import zipfile

    path = tmp_path / "many.pth"
    torch.save({f"t{i}": torch.zeros(1) for i in range(3)}, path)
    with zipfile.ZipFile(path) as archive:
        own = len(archive.infolist())
    assert numpy_pickle._member_count(path) == own
    monkeypatch.setattr(numpy_pickle, "MAX_MEMBERS", own + 2)
    assert load_weights_only(path)["t0"].shape == (1,)  # within the bound
    with zipfile.ZipFile(path, "a") as archive:
        for i in range(3):
            archive.writestr(f"extra/{i}", b"")
    with pytest.raises(CheckpointError, match=rf"zip directory lists {own + 3} members"):
        ckpt.load_checkpoint(path)
    # past 65,535 entries the count lives in the zip64 end record: its tail as zipfile writes it
    zip64 = (b"PK\x06\x06" + (44).to_bytes(8, "little") + bytes(20) + (70_000).to_bytes(8, "little") * 2
             + bytes(16))
    locator = b"PK\x06\x07" + bytes(4) + (0).to_bytes(8, "little") + (1).to_bytes(4, "little")
    end = b"PK\x05\x06" + bytes(4) + b"\xff\xff" * 2 + b"\xff" * 8 + bytes(2)
    (tmp_path / "zip64.zip").write_bytes(zip64 + locator + end)
    assert numpy_pickle._member_count(tmp_path / "zip64.zip") == 70_000
