"""Verifying checkpoint files (checkpoint/verify.py, checkpoint/kinds.py): crafted, truncated or
damaged files are refused or skipped and left on disk; each kind gets its status and reasons."""

from __future__ import annotations

import os
import zipfile
from pathlib import Path

import pytest
import torch
from helpers import community_state, names, trained
from test_checkpoint_files import make_state, save_steps

from indextts_train.checkpoint import reader
from indextts_train.checkpoint.files import CheckpointError, load_checkpoint, save_checkpoint
from indextts_train.checkpoint.lineage import resume_order
from indextts_train.checkpoint.manager import select_resume
from indextts_train.checkpoint.rng import capture_rng
from indextts_train.checkpoint.run_folder import list_checkpoints
from indextts_train.checkpoint.verify import choose_resume, verdict_of, verify_checkpoint


def largest_member_offset(path: Path) -> int:
    """Byte offset of the middle of the largest tensor storage (zip members named .../data/N)."""
    with zipfile.ZipFile(path) as archive:
        info = max((m for m in archive.infolist() if "/data/" in m.filename), key=lambda m: m.file_size)
    with open(path, "rb") as f:
        f.seek(info.header_offset + 26)
        name_len, extra_len = int.from_bytes(f.read(2), "little"), int.from_bytes(f.read(2), "little")
    return info.header_offset + 30 + name_len + extra_len + info.file_size // 2



# ----------------------------------------------------------------------------- unsafe / damaged files


class Payload:
    """Unpickling this creates the marker file: proof that code ran."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (open, (str(self.marker), "w"))


def test_malicious_pickle_is_refused_without_running_code(tmp_path: Path) -> None:
    marker = tmp_path / "PWNED"
    evil = tmp_path / "evil.pth"
    torch.save({"model": {"w": torch.zeros(2)}, "optimizer": Payload(marker)}, evil)
    with pytest.raises(CheckpointError, match="contains pickled Python objects that could run code"):
        load_checkpoint(evil)
    verdict = verify_checkpoint(evil)
    assert (verdict.status, verdict.exit_code) == ("INCOMPLETE", 2)
    assert not marker.exists()
    torch.load(evil, weights_only=False)  # control: the payload is live when unpickled unsafely
    assert marker.exists()


def test_truncated_latest_is_skipped_and_left_on_disk(tmp_path: Path) -> None:
    save_steps(tmp_path, [1, 2])
    latest = tmp_path / "latest.pth"
    data = latest.read_bytes()
    for cut in (0, 1, 100, len(data) // 3, len(data) // 2, len(data) - 100, len(data) - 1):
        replacement = tmp_path / "cut.tmp"
        replacement.write_bytes(data[:cut])  # a non-atomic writer killed mid-write (new inode)
        os.replace(replacement, latest)
        choice = choose_resume(resume_order(list_checkpoints(tmp_path)))
        chosen, skipped = choice.path, choice.skipped
        assert chosen == tmp_path / "model_step2.pth", cut
        assert [p for p, _ in skipped] == [latest]
        assert "INCOMPLETE" in skipped[0][1] and "\n" not in skipped[0][1]
        assert latest.read_bytes() == data[:cut]
        with pytest.raises(CheckpointError):
            load_checkpoint(latest)


def test_truncated_in_place_skips_its_hard_link_too(tmp_path: Path) -> None:
    save_steps(tmp_path, [1, 2])
    with open(tmp_path / "latest.pth", "r+b") as f:  # damage to the inode shared with model_step2.pth
        f.truncate(f.seek(0, os.SEEK_END) // 2)
    choice = choose_resume(resume_order(list_checkpoints(tmp_path)))
    chosen, skipped = choice.path, choice.skipped
    assert chosen == tmp_path / "model_step1.pth"
    assert [p.name for p, _ in skipped] == ["latest.pth", "model_step2.pth"]
    assert skipped[1][1].startswith("same file as latest.pth")
    assert names(tmp_path) == {"model_step1.pth", "model_step2.pth", "latest.pth"}


def test_byte_flipped_tensor_data_is_detected(tmp_path: Path) -> None:
    save_steps(tmp_path, [1, 2], keep=3)
    latest = tmp_path / "latest.pth"
    flipped = bytearray(latest.read_bytes())
    flipped[largest_member_offset(latest)] ^= 0xFF
    replacement = tmp_path / "flip.tmp"
    replacement.write_bytes(bytes(flipped))
    os.replace(replacement, latest)
    torch.load(latest, weights_only=True)  # control: torch alone loads the damaged tensor silently
    choice = choose_resume(resume_order(list_checkpoints(tmp_path)))
    chosen, skipped = choice.path, choice.skipped
    assert chosen == tmp_path / "model_step2.pth"
    assert "CRC-32" in skipped[0][1]
    assert latest.read_bytes() == bytes(flipped)


def test_no_complete_checkpoint_means_none(tmp_path: Path) -> None:
    (tmp_path / "model_step5.pth").write_bytes(b"garbage")
    assert choose_resume(resume_order(list_checkpoints(tmp_path))).path is None
    empty = choose_resume(resume_order(list_checkpoints(tmp_path / "missing")))
    assert (empty.path, empty.state, empty.skipped) == (None, None, [])
    assert (tmp_path / "model_step5.pth").read_bytes() == b"garbage"


def test_resuming_asks_for_the_verdict_alone(tmp_path: Path) -> None:
    """Choosing a file to resume needs its status and reasons; the summary is what `verify` prints."""
    path = save_checkpoint(make_state(2), tmp_path, 2, keep=3)
    full, alone = verify_checkpoint(path), verdict_of(path)
    assert (alone.status, alone.kind, alone.reasons) == (full.status, full.kind, full.reasons) == (
        "COMPLETE", "indextts-train", [])
    assert alone.summary == {} and full.summary["step"] == 2


def test_the_file_a_run_resumes_from_is_read_once_in_full(tmp_path: Path, monkeypatch) -> None:
    """Its verification reads it into memory; that read, migrated, is what resumes (no second load).
    (The lineage order takes a cheap look at each file first: mmap, tensor data left on disk; the same
    look tells which files are not ours.)"""
    save_steps(tmp_path, [1, 2])
    reads: list[tuple[str, bool]] = []
    real = reader.load_weights_only

    def counting(path, **kw):
        reads.append((Path(path).name, kw["mmap"]))
        return real(path, **kw)

    monkeypatch.setattr(reader, "load_weights_only", counting)
    resumed, protected = select_resume(tmp_path, "auto", warn=print, notice=print)
    assert [mmap for name, mmap in reads if name == "latest.pth"] == [True, False]  # the look, then the one read
    for other in ("model_step1.pth", "model_step2.pth"):  # one look orders them and says they are ours
        assert [mmap for name, mmap in reads if name == other] == [True], other
    saved = load_checkpoint(tmp_path / "latest.pth")
    assert resumed.step == 2 and set(resumed.model) == set(saved["model"])
    assert all(torch.equal(resumed.model[k], v) for k, v in saved["model"].items())
    assert protected == frozenset()


def test_verify_statuses_and_exit_codes(tmp_path: Path) -> None:
    complete = save_checkpoint(make_state(2), tmp_path / "run", 2, keep=3)
    community = tmp_path / "community.pth"
    torch.save(community_state(), community)
    bare = tmp_path / "gpt.pth"
    torch.save(trained(0)[0].state_dict(), bare)
    garbage = tmp_path / "garbage.pth"
    garbage.write_bytes(os.urandom(4096))
    got = {p.name: verify_checkpoint(p) for p in (complete, community, bare, garbage)}
    assert {n: (v.status, v.kind, v.exit_code) for n, v in got.items()} == {
        "model_step2.pth": ("COMPLETE", "indextts-train", 0),
        "community.pth": ("PARTIAL", "community", 1),
        "gpt.pth": ("PARTIAL", "gpt.pth", 1),
        "garbage.pth": ("INCOMPLETE", "unknown", 2),
    }
    # a folder, or no file: not a damaged checkpoint of unknown kind, nothing there to judge
    for path in (tmp_path, tmp_path / "missing.pth"):
        verdict = verify_checkpoint(path)
        assert (verdict.status, verdict.kind, verdict.exit_code) == ("INCOMPLETE", "not a file", 2)
    summary = got["model_step2.pth"].to_dict()["summary"]
    assert (summary["step"], summary["samples_in_epoch"], summary["precision"]) == (2, 8, "fp32")
    weights = load_checkpoint(complete)["model"]  # the official keys of MICRO_GPT (test_checkpoint_files)
    assert summary["sizes"]["tensors"] == len(weights)
    assert summary["sizes"]["params"] == sum(t.numel() for t in weights.values())
    assert "lacks RNG states" in " ".join(got["community.pth"].reasons)
    assert "--base-checkpoint" in got["gpt.pth"].reasons[0]


def test_verify_names_what_a_resume_lacks(tmp_path: Path) -> None:
    state = make_state(1)
    del state["rng"]
    state["progress"]["samples_in_epoch"] = -1
    path = tmp_path / "old.pth"
    torch.save(state, path)
    verdict = verify_checkpoint(path)
    assert verdict.status == "PARTIAL" and verdict.reasons == ["missing rng (needed for an exact resume)"]
    state["rng"] = [capture_rng()]
    torch.save(state, path)
    assert verify_checkpoint(path).reasons == ["progress: samples_in_epoch missing or not a non-negative int"]
