"""files/bounded.py: each reader refuses a small file that describes a great deal of work, before doing it."""

from __future__ import annotations

import os
import time
from pathlib import Path

import hostile
import numpy as np
import pytest

from indextts_train.errors import UserError
from indextts_train.files.bounded import (
    MAX_JSON_DEPTH,
    MAX_LINE_BYTES,
    MAX_YAML_NODES,
    check_file,
    check_regular,
    iter_lines,
    json_or_none,
    load_yaml,
    parse_json,
    read_bounded,
    read_checked,
    read_npy,
)
from indextts_train.text.corpus_lines import iter_text_lines


def test_a_yaml_bomb_is_refused_before_it_is_built(tmp_path: Path) -> None:
    path = hostile.yaml_bomb(tmp_path / "bomb.yaml")
    assert path.stat().st_size < 2048
    started = time.perf_counter()
    with pytest.raises(UserError, match=f"more than {MAX_YAML_NODES} values with its aliases expanded") as info:
        load_yaml(path, "config")
    assert time.perf_counter() - started < 1.0
    assert str(info.value).startswith(str(path)) and "\n" not in str(info.value)


def test_yaml_aliases_within_the_bound_and_a_recursive_alias(tmp_path: Path) -> None:
    shared = tmp_path / "shared.yaml"
    shared.write_text("base: &b {layers: 2, dim: 8}\ngpt: *b\nother: {<<: *b, dim: 16}\n")
    assert load_yaml(shared) == {"base": {"layers": 2, "dim": 8}, "gpt": {"layers": 2, "dim": 8},
                                 "other": {"layers": 2, "dim": 16}}
    loop = tmp_path / "loop.yaml"
    loop.write_text("a: &a [1, *a]\n")
    with pytest.raises(UserError, match="recursive alias"):
        load_yaml(loop)


def test_yaml_deep_big_and_not_utf8_are_one_line(tmp_path: Path) -> None:
    deep = tmp_path / "deep.yaml"
    deep.write_text("gpt: " + "[" * 100_000 + "]" * 100_000 + "\n")
    with pytest.raises(UserError, match="nested too deeply"):
        load_yaml(deep)
    big = tmp_path / "big.yaml"
    with open(big, "wb") as handle:  # sparse: the size alone is refused, nothing is read
        handle.truncate((4 << 20) + 1)
    with pytest.raises(UserError, match="larger than"):
        load_yaml(big)
    latin = tmp_path / "latin.yaml"
    latin.write_bytes(b"gpt: \xff\n")
    with pytest.raises(UserError, match="not UTF-8"):
        load_yaml(latin)


def test_json_nested_past_the_bound_names_where() -> None:
    for depth in (MAX_JSON_DEPTH + 1, 100_000):
        with pytest.raises(UserError, match=f"^m.jsonl:3: JSON nested deeper than {MAX_JSON_DEPTH}"):
            parse_json(hostile.deep_json(depth), "m.jsonl:3")
    nested = '{"a": ' * MAX_JSON_DEPTH + "1" + "}" * MAX_JSON_DEPTH
    assert parse_json(nested, "x") is not None  # exactly at the bound: accepted
    assert parse_json('{"id": "a", "n": [1, 2]}', "x") == {"id": "a", "n": [1, 2]}


def test_read_checked_says_what_check_file_says_then_reads_within_the_bound(tmp_path) -> None:
    (tmp_path / "t.model").write_bytes(b"pieces")
    assert read_checked(tmp_path / "t.model", 100, "tokenizer", missing="pass one") == b"pieces"
    with pytest.raises(UserError, match=r"x.model: tokenizer not found; pass one"):
        read_checked(tmp_path / "x.model", 100, "tokenizer", missing="pass one")
    with pytest.raises(UserError, match=r"is a folder; pass the tokenizer file in it \(e.g. .*t.model\)"):
        read_checked(tmp_path, 100, "tokenizer", missing="pass one")
    with pytest.raises(UserError, match="larger than"):
        read_checked(tmp_path / "t.model", 3, "tokenizer", missing="pass one")


def test_json_or_none_is_none_for_what_no_record_of_ours_holds() -> None:
    assert json_or_none(b'{"kind": "step"}') == {"kind": "step"}
    for text in (hostile.deep_json(200_000), '{"n": ' + "9" * 5000 + "}", b"\xff{", "not json", ""):
        assert json_or_none(text) is None, text[:20]


def test_a_huge_npy_header_is_refused_before_allocating(tmp_path: Path) -> None:
    path = hostile.huge_npy(tmp_path / "huge.npy")
    assert path.stat().st_size < 256
    with pytest.raises(UserError, match=r"claims \[10000000000\] float32 .* but the file holds 32 bytes"):
        read_npy(path)


def test_npy_round_trip_and_refusals(tmp_path: Path) -> None:
    for array in (np.arange(6, dtype=np.int32).reshape(2, 3), np.asfortranarray(np.ones((3, 2), np.float32)),
                  np.zeros(0, np.float32)):
        np.save(tmp_path / "a.npy", array)
        loaded = read_npy(tmp_path / "a.npy")
        assert loaded.dtype == array.dtype and np.array_equal(loaded, array)
    np.save(tmp_path / "obj.npy", np.array([{"a": 1}], dtype=object), allow_pickle=True)
    with pytest.raises(UserError, match="Python objects"):
        read_npy(tmp_path / "obj.npy")
    np.save(tmp_path / "long.npy", np.zeros(4, np.float32))
    with open(tmp_path / "long.npy", "ab") as handle:
        handle.write(b"tail")
    with pytest.raises(UserError, match="holds 20 bytes"):
        read_npy(tmp_path / "long.npy")
    np.save(tmp_path / "big.npy", np.zeros(64, np.float32))
    with pytest.raises(UserError, match="at most 100 bytes"):
        read_npy(tmp_path / "big.npy", max_bytes=100)
    (tmp_path / "text.npy").write_text("hello")
    with pytest.raises(UserError, match="not a loadable .npy"):
        read_npy(tmp_path / "text.npy")


def test_not_regular_files_are_refused_without_blocking(tmp_path: Path) -> None:
    pipe = hostile.fifo(tmp_path / "corpus.jsonl")
    started = time.perf_counter()
    with pytest.raises(UserError, match="is a FIFO"):
        check_regular(pipe, "corpus")
    with pytest.raises(UserError, match="is a FIFO"):
        read_npy(pipe)
    assert time.perf_counter() - started < 1.0
    with pytest.raises(UserError, match="system pseudo-file"):
        read_bounded("/proc/self/mem", 1 << 20)
    with pytest.raises(UserError, match="is a folder"):
        check_regular(tmp_path)
    with pytest.raises(UserError, match="not found"):
        check_regular(tmp_path / "missing")


def test_a_line_past_its_bound_is_refused_without_being_held(tmp_path: Path) -> None:
    """A sparse file of zeros with no newline (what `truncate -s 3G` makes) is one line of gigabytes: the
    readers of lines (manifests, corpora, --lines) stop at the bound and name the line."""
    path = tmp_path / "sparse.jsonl"
    path.write_bytes(b'{"text": "one"}\n')
    with open(path, "r+b") as handle:
        handle.truncate(MAX_LINE_BYTES + 100)
    lines = iter_lines(path, "manifest")
    assert next(lines)[0] == 1
    with pytest.raises(UserError, match=f"{path}:2: a line longer than 64 MiB, which no manifest holds"):
        next(lines)
    with pytest.raises(UserError, match=f"{path}:2: a line longer than 64 MiB, which no text corpus holds"):
        list(iter_text_lines(path))
    exact = tmp_path / "exact.txt"  # a line of exactly the bound, newline after it, is still a line
    exact.write_bytes(b"a" * (MAX_LINE_BYTES - 1) + b"\nb\n")
    assert [number for number, _, _ in iter_lines(exact, "text corpus")] == [1, 2]


def test_a_corpus_line_that_is_not_utf8_is_named(tmp_path: Path) -> None:
    path = tmp_path / "corpus.txt"
    path.write_bytes(b"fine\n\xff\xfe bad\n")
    with pytest.raises(UserError, match=f"{path}:2: not UTF-8 text"):
        list(iter_text_lines(path))


def test_lines_of_a_gzip_file_are_its_text_s_within_the_same_bounds(tmp_path) -> None:
    import gzip

    path = tmp_path / "m.jsonl.gz"
    with gzip.open(path, "wb") as handle:
        handle.write(b'{"a": 1}\n\n' + b"x" * 100 + b"\n")
    assert [(n, offset, len(raw)) for n, offset, raw in iter_lines(path, "manifest", gzipped=True)] == [
        (1, 0, 9), (3, 10, 101)]
    with pytest.raises(UserError, match=r"m\.jsonl\.gz:3: more than 50 bytes of manifest once decompressed"):
        list(iter_lines(path, "manifest", gzipped=True, max_bytes=50))
    with pytest.raises(UserError, match=r"m\.jsonl\.gz:2: more than 9 bytes of manifest once decompressed"):
        list(iter_lines(path, "manifest", gzipped=True, max_bytes=9))  # a blank line counts too


def test_check_file_says_what_stands_where_a_file_belongs(tmp_path) -> None:
    """A missing path, a folder (with the files in it that could be meant) and a FIFO are one line each."""
    for name in ("train.jsonl", "val.jsonl", "notes.txt"):
        (tmp_path / name).write_text("")
    cases = {(tmp_path, "manifest"): f"{tmp_path} is a folder; pass the manifest file in it (e.g. "
                                     f"{tmp_path / 'train.jsonl'} or {tmp_path / 'val.jsonl'})",
             (tmp_path, "checkpoint"): f"--base-checkpoint {tmp_path} is a folder; pass the checkpoint file in it",
             (tmp_path / "nope.jsonl", "manifest"): f"{tmp_path / 'nope.jsonl'}: manifest not found; check the path "
                                                    "you passed"}
    for (path, what), said in cases.items():
        with pytest.raises(UserError) as refused:
            check_file(path, what, flag="--base-checkpoint" if what == "checkpoint" else None)
        assert str(refused.value) == said
    os.mkfifo(tmp_path / "fifo.jsonl")
    with pytest.raises(UserError, match="manifest is a FIFO"):
        check_file(tmp_path / "fifo.jsonl", "manifest")
    check_file(tmp_path / "train.jsonl", "manifest")  # a regular file passes, unread


def test_a_relative_path_not_found_names_the_folder_it_was_looked_for_from(tmp_path, monkeypatch) -> None:
    """From another folder a newcomer's relative path is not there: the line says where it was looked for."""
    monkeypatch.chdir(tmp_path)
    with pytest.raises(UserError) as refused:
        check_file("data/am/train.jsonl", "manifest", flag="--train-manifest")
    assert str(refused.value) == (f"--train-manifest data/am/train.jsonl: manifest not found (looked for from "
                                  f"{tmp_path}); check the path you passed")


def test_a_prepared_folder_given_for_a_manifest_suggests_the_manifests_for_that_flag(tmp_path: Path) -> None:
    """rejected.jsonl came first by name and led a newcomer to an empty manifest: it is never suggested, and
    the file each flag takes is named first."""
    for name in ("rejected.jsonl", "utterances.jsonl", "train.jsonl", "val.jsonl", "prepare.json"):
        (tmp_path / name).write_text("{}\n")
    expected = {"--train-manifest": ("train", "val", "utterances"), "--val-manifest": ("val", "train", "utterances"),
                None: ("train", "val", "utterances")}
    for flag, names in expected.items():
        with pytest.raises(UserError) as refused:
            check_file(tmp_path, "manifest", flag=flag)
        shown = " or ".join(str(tmp_path / f"{name}.jsonl") for name in names)
        assert str(refused.value).endswith(f"is a folder; pass the manifest file in it (e.g. {shown})")


def test_a_run_folder_given_for_a_manifest_suggests_none_of_its_logs(tmp_path: Path) -> None:
    """--val-manifest RUN suggested RUN/events.jsonl (the run's event log) as the manifest meant."""
    for name in ("events.jsonl", "scores.jsonl"):
        (tmp_path / name).write_text("{}\n")
    with pytest.raises(UserError) as refused:
        check_file(tmp_path, "manifest", flag="--val-manifest")
    assert str(refused.value) == f"--val-manifest {tmp_path} is a folder; pass the manifest file in it"
