"""Manifest index, dataset, collate, loader, check-data (the data order: test_data_sampling.py)."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import numpy as np
import pytest
import torch

from indextts_train.config.settings import GPTConfig
from indextts_train.data.manifest import ManifestDataset, ManifestIndex, collate, make_loader
from indextts_train.data.sampling import ResumableBatchSampler, SamplerSpec, Source, epoch_order
from indextts_train.errors import UserError

TINY = Path(__file__).resolve().parent / "data" / "reference" / "tiny"
DIM = 8
# A small config the fixture data fits: ids < 50, codes < 40, at most 20 text / 30 code tokens.
GPT = GPTConfig(model_dim=DIM, heads=2, layers=1, max_text_tokens=20, max_mel_tokens=30,
                number_text_tokens=50, number_mel_codes=40, start_mel_token=38, stop_mel_token=39)


def write_dataset(root: Path, n: int, *, form: str = "paired", name: str = "train.jsonl",
                  seed: int = 0) -> Path:
    """N samples (arrays under root/arrays, manifest root/name with relative paths)."""
    rng = np.random.default_rng(seed)
    (root / "arrays").mkdir(parents=True, exist_ok=True)
    lines = []
    for i in range(n):
        text_len, code_len = 3 + i % 5, 4 + (3 * i) % 7
        arrays = {
            "text": rng.integers(2, 50, text_len).astype(np.int32),
            "codes": rng.integers(0, 38, code_len).astype(np.int32),
            "cond": rng.standard_normal((32, DIM)).astype(np.float32),
            "emo": rng.standard_normal(DIM).astype(np.float32),
        }
        for key, arr in arrays.items():
            np.save(root / "arrays" / f"{key}{i}.npy", arr)
        rel = {key: f"arrays/{key}{i}.npy" for key in arrays}
        if form == "paired":
            line = {"id": f"t{i}", "speaker": f"spk{i % 2}", "language": "am",
                    "prompt_condition_path": rel["cond"], "prompt_emo_vec_path": rel["emo"],
                    "target_text_ids_path": rel["text"], "target_codes_path": rel["codes"],
                    "target_text_len": text_len, "target_code_len": code_len,
                    "target_audio_path": f"wavs/t{i}.wav", "target_duration": 1.5}
        else:
            line = {"id": f"t{i}", "text_ids_path": rel["text"], "codes_path": rel["codes"],
                    "condition_path": rel["cond"], "emo_vec_path": rel["emo"],
                    "text_len": text_len, "code_len": code_len}
        lines.append(json.dumps(line))
    manifest = root / name
    manifest.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return manifest


def read_lines(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


def write_lines(path: Path, lines: list) -> Path:
    """Lines given as dicts (dumped), str or raw bytes."""
    def encode(line: dict | str | bytes) -> bytes:
        return line if isinstance(line, bytes) else (line if isinstance(line, str) else json.dumps(line)).encode()
    path.write_bytes(b"".join(encode(line) + b"\n" for line in lines))
    return path


# --------------------------------------------------------------------------------------------- loading


@pytest.mark.parametrize("form", ["paired", "single"])
def test_both_forms_load_with_manifest_lengths(tmp_path: Path, form: str) -> None:
    manifest = write_dataset(tmp_path, 4, form=form)
    index = ManifestIndex.build([manifest])
    dataset = ManifestDataset(index, model_dim=DIM)
    assert len(dataset) == 4
    assert index.text_lengths.tolist() == [3, 4, 5, 6]
    assert index.code_lengths.tolist() == [4, 7, 10, 6]
    item = dataset[2]
    assert item["text_ids"].dtype == torch.int64 and item["codes"].dtype == torch.int64
    assert item["condition"].shape == (32, DIM) and item["condition"].dtype == torch.float32
    assert item["emo_vec"].shape == (DIM,) and item["emo_vec"].dtype == torch.float32
    assert (item["text_len"], item["code_len"], item["index"]) == (5, 10, 2)
    np.testing.assert_array_equal(item["codes"].numpy(), np.load(tmp_path / "arrays" / "codes2.npy"))
    np.testing.assert_array_equal(item["condition"].numpy(), np.load(tmp_path / "arrays" / "cond2.npy"))


def test_relative_paths_resolve_against_the_manifest_folder(tmp_path: Path, monkeypatch) -> None:
    manifest = write_dataset(tmp_path / "data", 2)
    lines = read_lines(manifest)
    lines[1]["target_codes_path"] = str(tmp_path / "data" / "arrays" / "codes1.npy")  # absolute stays
    write_lines(manifest, lines)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    index = ManifestIndex.build([Path("..") / "data" / "train.jsonl"])
    record = index.record(0)
    assert Path(record["prompt_condition_path"]) == tmp_path / "data" / "arrays" / "cond0.npy"
    assert Path(record["target_audio_path"]).is_absolute()
    assert record["_source"] == f"{Path('..') / 'data' / 'train.jsonl'}:1"
    assert Path(index.record(1)["target_codes_path"]) == tmp_path / "data" / "arrays" / "codes1.npy"
    assert ManifestDataset(index)[1]["code_len"] == 7


def test_several_manifests_and_blank_lines(tmp_path: Path) -> None:
    first = write_dataset(tmp_path / "a", 2)
    second = write_dataset(tmp_path / "b", 3, form="single")
    second.write_text("\n" + second.read_text(encoding="utf-8") + "\n\n", encoding="utf-8")
    first.write_bytes(b"\xef\xbb\xbf" + first.read_bytes())  # a BOM, as some editors write
    index = ManifestIndex.build([first, second])
    assert len(index) == 5
    assert index.record(2)["_source"] == f"{second}:2"  # line numbers count the blank line
    assert index.file_ids.tolist() == [0, 0, 1, 1, 1]
    assert index.record(0)["id"] == "t0"


# --------------------------------------------------------------------------------------------- collate


def test_collate_reference_batch() -> None:
    expected = json.loads((TINY / "expected.json").read_text(encoding="utf-8"))["batch"]
    dataset = ManifestDataset(ManifestIndex.build([TINY / "pairs.jsonl"]))
    samples = [dataset[i] for i in range(len(dataset))]
    batch = collate(samples)
    assert list(batch.text_ids.shape) == expected["text_ids_padded_shape"] == [3, 12]
    assert list(batch.codes.shape) == expected["codes_padded_shape"] == [3, 22]
    assert list(batch.condition.shape) == expected["condition_shape"] == [3, 32, 64]
    assert list(batch.emo_vec.shape) == expected["emo_vec_shape"] == [3, 64]
    assert batch.text_lengths.tolist() == expected["text_lengths"] == [7, 12, 4]
    assert batch.code_lengths.tolist() == expected["code_lengths"] == [15, 9, 22]
    assert batch.text_ids.dtype == torch.int64 and batch.condition.dtype == torch.float32
    # Manifest order, arrays copied, padding 0.
    for row, name in enumerate(["tgt0", "tgt1", "tgt2"]):
        text = np.load(TINY / "text_ids" / f"{name}.npy")
        assert batch.text_ids[row, : len(text)].tolist() == text.tolist()
        assert not batch.text_ids[row, len(text):].any()
        np.testing.assert_array_equal(batch.emo_vec[row].numpy(), np.load(TINY / "emo_vec" / f"prm{row}.npy"))


def test_collate_pads_to_longest_array_and_keeps_manifest_lengths(tmp_path: Path) -> None:
    manifest = write_dataset(tmp_path, 2)
    lines = read_lines(manifest)
    lines[0]["target_text_len"] = 2  # the array holds 3 ids
    write_lines(manifest, lines)
    batch = collate([ManifestDataset(ManifestIndex.build([manifest]))[i] for i in (1, 0)])
    assert batch.text_ids.shape == (2, 4) and batch.codes.shape == (2, 7)
    assert batch.text_lengths.tolist() == [4, 2]
    assert batch.text_ids[1, 2] != 0  # the array's 3rd id is kept; the model's padding rule uses the length


# --------------------------------------------------------------------------------------------- loader


def test_loader_batches_do_not_depend_on_worker_count(tmp_path: Path) -> None:
    index = ManifestIndex.build([write_dataset(tmp_path, 12)])
    dataset = ManifestDataset(index)

    def batches(workers: int) -> list:
        order = epoch_order(SamplerSpec(2, 2, 4, 3, (Source("a", 12),)), index.total_lengths, 0)
        sampler = ResumableBatchSampler(order, micro_batch=3, start_sample=2)
        return list(make_loader(dataset, sampler, num_workers=workers))

    serial, parallel = batches(0), batches(2)
    assert len(serial) == len(parallel) == 3
    for a, b in zip(serial, parallel, strict=True):
        for name in ("text_ids", "codes", "text_lengths", "code_lengths", "condition", "emo_vec"):
            assert torch.equal(getattr(a, name), getattr(b, name))


# --------------------------------------------------------------------------------------------- bad input


def paired(**changes) -> dict:
    line = {"id": "x", "prompt_condition_path": "c.npy", "prompt_emo_vec_path": "e.npy",
            "target_text_ids_path": "t.npy", "target_codes_path": "k.npy",
            "target_text_len": 5, "target_code_len": 9}
    line.update(changes)
    return {k: v for k, v in line.items() if v is not None}


BAD_LINES = {
    "bad json": ('{"id": "x", "target_codes_path": ', "not valid JSON (Expecting value at character 33)"),
    "not utf-8": (b'{"id": "\xff"}', "not UTF-8"),
    "not an object": ("[1, 2]", "expected a JSON object"),
    "unknown form": ({"id": "x", "text": "hello"}, "neither the paired form"),
    "missing field": (paired(target_code_len=None), "missing field(s) target_code_len"),
    "negative length": (paired(target_text_len=-3), "target_text_len is -3"),
    "zero length": (paired(target_code_len=0), "target_code_len is 0"),
    "wrong type": (paired(target_text_len="5"), "target_text_len must be a whole number"),
    "float length": (paired(target_code_len=9.0), "target_code_len must be a whole number"),
    "empty path": (paired(target_codes_path=""), "target_codes_path must be a non-empty path"),
    "text too long": (paired(target_text_len=21), "target_text_len 21 > gpt.max_text_tokens 20"),
    "codes too long": (paired(target_code_len=31), "target_code_len 31 > gpt.max_mel_tokens 30"),
}


@pytest.mark.parametrize("case", sorted(BAD_LINES))
def test_every_bad_line_names_file_and_line(tmp_path: Path, case: str) -> None:
    line, message = BAD_LINES[case]
    manifest = write_lines(tmp_path / "m.jsonl", [paired(), line, paired()])
    with pytest.raises(UserError, match=rf"^{re.escape(str(manifest))}:2: ") as info:
        ManifestIndex.build([manifest], max_text_tokens=20, max_mel_tokens=30)
    assert message in str(info.value)
    index = ManifestIndex.build([manifest], skip_bad=True, max_text_tokens=20, max_mel_tokens=30)
    assert len(index) == 2 and index.skipped == 1
    assert index.line_numbers.tolist() == [1, 3]
    assert index.skipped_examples == [str(info.value)]


def test_skip_bad_counts_and_keeps_first_messages(tmp_path: Path) -> None:
    manifest = write_lines(tmp_path / "m.jsonl", [paired()] + ["{"] * 8)
    index = ManifestIndex.build([manifest], skip_bad=True)
    assert (len(index), index.skipped, len(index.skipped_examples)) == (1, 8, 5)
    assert index.skipped_examples[0].startswith(f"{manifest}:2: ")
    write_lines(manifest, ["{"] * 3)
    with pytest.raises(UserError, match="no usable line"):
        ManifestIndex.build([manifest], skip_bad=True)


def test_missing_and_empty_manifests(tmp_path: Path) -> None:
    with pytest.raises(UserError, match="manifest not found"):
        ManifestIndex.build([tmp_path / "nope.jsonl"])
    (tmp_path / "empty.jsonl").write_text("\n\n", encoding="utf-8")
    with pytest.raises(UserError, match="manifest is empty"):
        ManifestIndex.build([tmp_path / "empty.jsonl"])
    with pytest.raises(UserError, match="no manifest given"):
        ManifestIndex.build([])


def break_array(root: Path, case: str) -> str:
    """Damage sample 1's arrays; returns the array file the error must name."""
    arrays = root / "arrays"
    if case == "missing npy":
        (arrays / "codes1.npy").unlink()
        return "codes1.npy"
    if case == "not npy":
        (arrays / "text1.npy").write_bytes(b"not an array")
        return "text1.npy"
    if case == "condition shape":
        np.save(arrays / "cond1.npy", np.zeros((31, DIM), np.float32))
        return "cond1.npy"
    if case == "emo shape":
        np.save(arrays / "emo1.npy", np.zeros(DIM + 1, np.float32))
        return "emo1.npy"
    if case == "float codes":
        np.save(arrays / "codes1.npy", np.zeros(7, np.float32))
        return "codes1.npy"
    if case == "text 2-D":
        np.save(arrays / "text1.npy", np.zeros((1, 4), np.int32))
        return "text1.npy"
    np.save(arrays / "text1.npy", np.zeros(3, np.int32))  # "short array": manifest says 4
    return "text1.npy"


ARRAY_CASES = ["missing npy", "not npy", "condition shape", "emo shape", "float codes", "text 2-D",
               "short array"]


@pytest.mark.parametrize("case", ARRAY_CASES)
def test_bad_array_names_manifest_line_and_array(tmp_path: Path, case: str) -> None:
    manifest = write_dataset(tmp_path, 3)
    array_name = break_array(tmp_path, case)
    dataset = ManifestDataset(ManifestIndex.build([manifest]), model_dim=DIM)
    dataset[0]
    with pytest.raises(UserError, match=rf"^{re.escape(str(manifest))}:2: .*{array_name}"):
        dataset[1]


def test_dataset_checks_model_dim_and_array_maxima(tmp_path: Path) -> None:
    manifest = write_dataset(tmp_path, 2)
    with pytest.raises(UserError, match="gpt.model_dim is 16"):
        ManifestDataset(ManifestIndex.build([manifest]), model_dim=16)[0]
    np.save(tmp_path / "arrays" / "codes0.npy", np.zeros(31, np.int32))  # longer than max_mel_tokens 30
    index = ManifestIndex.build([manifest], max_text_tokens=20, max_mel_tokens=30)
    with pytest.raises(UserError, match=rf"^{re.escape(str(manifest))}:1: .*31 ids > gpt.max_mel_tokens 30"):
        ManifestDataset(index)[0]


# --------------------------------------------------------------------------------------------- check-data


def test_twenty_thousand_lines_index(tmp_path: Path) -> None:
    lines = [json.dumps(paired(id=f"u{i}", target_text_len=1 + i % 600, target_code_len=1 + i % 1815))
             for i in range(20_000)]
    manifest = write_lines(tmp_path / "big.jsonl", lines)
    index = ManifestIndex.build([manifest], max_text_tokens=600, max_mel_tokens=1815)
    assert len(index) == 20_000
    assert index.text_lengths[19_999] == 1 + 19_999 % 600 and index.code_lengths[12_345] == 1 + 12_345 % 1815
    assert index.record(19_999)["id"] == "u19999" and index.record(19_999)["_source"].endswith(":20000")


def test_a_manifest_replaced_after_indexing_is_one_line_not_a_hang(tmp_path, monkeypatch) -> None:
    """A line is read again by its offset when its sample loads. A manifest replaced meanwhile by a FIFO blocked
    that read for good, and one holding an endless line at the offset was read whole."""
    import indextts_train.data.manifest as manifest_module

    manifest = tmp_path / "train.jsonl"
    manifest.write_bytes((TINY / "pairs.jsonl").read_bytes())
    index = ManifestIndex.build([manifest])
    manifest.unlink()
    os.mkfifo(manifest)
    with pytest.raises(UserError, match=r"manifest cannot be read any more \(manifest is a FIFO"):
        index.record(0)
    manifest.unlink()
    monkeypatch.setattr(manifest_module, "MAX_LINE_BYTES", 1000)
    manifest.write_bytes(b"x" * 5000)
    with pytest.raises(UserError, match=rf"^{re.escape(str(manifest))}:1: a line longer than"):
        index.record(0)
