"""Round 5 of probes on the text and data commands and the data a run reads, each finding pinned:
`extend-tokenizer --force` replacing notes saved under the output's name, check-tokenizer's sample
crashing tiktoken on a cut-down vocabulary, tokenize's two manifests of one stem sharing an ids folder,
a crafted .npy header that passed every size check and then failed to reshape (a traceback, even under
--skip-bad-lines), a data worker killed mid-run (a traceback, the completed steps unsaved), and evaluate
counting a manifest given twice."""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path

import numpy as np
import pytest
import torch
from test_e2e_tokenizer_probes import CLI, SPM, TEXT, one_line
from torch.utils.data import Dataset

from indextts_train.cli import run_app
from indextts_train.data.manifest import make_loader, sequential_batches
from indextts_train.errors import UserError

TOY = TEXT / "toy_base.tiktoken"  # 100 ranks, 95 of them single (ASCII) bytes: a cut-down vocabulary


# ---------------------------------------------------------------------------------------------
# extend-tokenizer --force


def _corpus(tmp_path: Path) -> Path:
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("merhaba dunya\nnasilsin bugun\nguzel bir gun\n", encoding="utf-8")
    return corpus


@pytest.mark.parametrize("base, output, size, victim", [
    (SPM, "am.model", 151, "am.model"),  # the model's name: notes saved there
    (SPM, "am.model", 151, "am.vocab"),  # the .vocab written beside it
    (TOY, "am.tiktoken", 1780, "am.tiktoken"),
])
def test_force_never_replaces_a_file_that_is_no_tokenizer(tmp_path, capsys, base, output, size, victim) -> None:
    notes = tmp_path / victim
    notes.write_text("my notes on the corpus\n", encoding="utf-8")
    one_line(["extend-tokenizer", "--base", base, "--corpus", _corpus(tmp_path), "--target-size", size, "-o",
              tmp_path / output, "--force"], capsys, f"--output {notes} exists and is not a")
    assert notes.read_text(encoding="utf-8") == "my notes on the corpus\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted({"corpus.txt", victim})


@pytest.mark.parametrize("base, output, size", [(SPM, "am.model", 151), (TOY, "am.tiktoken", 1780)])
def test_force_replaces_an_earlier_output_and_a_link_itself(tmp_path, capsys, base, output, size) -> None:
    args = ["extend-tokenizer", "--base", base, "--corpus", _corpus(tmp_path), "--target-size", size]
    assert run_app(CLI, [str(a) for a in [*args, "-o", tmp_path / output]]) == 0
    earlier = (tmp_path / output).read_bytes()
    assert run_app(CLI, [str(a) for a in [*args, "-o", tmp_path / output, "--force"]]) == 0
    assert (tmp_path / output).read_bytes() == earlier  # same corpus, same seed: the same file again
    target = tmp_path / "elsewhere.txt"
    target.write_text("not touched\n")
    link = tmp_path / f"link{Path(output).suffix}"
    link.symlink_to(target)
    assert run_app(CLI, [str(a) for a in [*args, "-o", link, "--force"]]) == 0
    assert not link.is_symlink() and link.read_bytes() == earlier and target.read_text() == "not touched\n"
    capsys.readouterr()


# ---------------------------------------------------------------------------------------------
# check-tokenizer --sample-text on a vocabulary without every byte


def test_a_sample_with_bytes_the_ranks_lack_is_one_line(tmp_path, capsys) -> None:
    sample = tmp_path / "am.txt"
    sample.write_text("hello\nሰላም ነው\n", encoding="utf-8")  # Ethiopic: bytes no rank of the toy file holds
    line = one_line(["check-tokenizer", TOY, "--sample-text", sample, "--language", "am"], capsys,
                    f"--sample-text {sample}: text 2")
    assert "has no rank for" in line and "all 256 single bytes" in line


# ---------------------------------------------------------------------------------------------
# tokenize: two manifests whose ids would share a folder


def test_tokenize_refuses_two_manifests_of_one_stem_before_writing(tmp_path, capsys, tiny_data) -> None:
    lines = [json.loads(line) for line in Path(tiny_data["train"]).read_text().splitlines()]
    folder = Path(tiny_data["train"]).parent
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    for name in ("a/train.jsonl", "b/train.json"):
        with open(tmp_path / name, "w", encoding="utf-8") as out:
            for line in lines[:3]:
                absolute = {k: str(folder / v) if k.endswith("_path") else v for k, v in line.items()}
                out.write(json.dumps({**absolute, "target_text": "HELLO"}) + "\n")
    out = tmp_path / "out"
    one_line(["tokenize", tmp_path / "a" / "train.jsonl", tmp_path / "b" / "train.json", "--tokenizer", SPM,
              "--out", out], capsys, "another manifest has the name train")
    assert not out.exists()


# ---------------------------------------------------------------------------------------------
# an .npy header with two negative sizes: its claimed bytes match the file, its shape is no shape


def negative_shape_npy(path: Path) -> Path:
    """An int32 .npy whose header says shape (-2, -2): 4 elements by the product, as the file holds."""
    with open(path, "wb") as handle:
        np.lib.format.write_array_header_1_0(handle, {"descr": "<i4", "fortran_order": False, "shape": (-2, -2)})
        handle.write(np.arange(4, dtype="<i4").tobytes())
    return path


SHAPE_NO_ARRAY_HAS = "target_text_ids_path's header claims the shape [-2, -2], which no array has"


def manifest_with_bad_line(tiny_data, folder: Path, count: int, bad_at: int) -> Path:
    """`count` lines (tiny_data's, repeated, absolute paths), line `bad_at` naming the crafted array."""
    lines = [json.loads(line) for line in Path(tiny_data["train"]).read_text().splitlines()]
    data = Path(tiny_data["train"]).parent
    crafted = negative_shape_npy(folder / "crafted.npy")
    manifest = folder / "train.jsonl"
    with open(manifest, "w", encoding="utf-8") as out:
        for i in range(count):
            line = {k: str(data / v) if k.endswith("_path") else v for k, v in lines[i % len(lines)].items()}
            line["id"] = f"line{i + 1}"
            if i + 1 == bad_at:
                line["target_text_ids_path"] = str(crafted)
            out.write(json.dumps(line) + "\n")
    return manifest


def test_check_data_names_a_shape_no_array_has(tmp_path, capsys, tiny_data) -> None:
    manifest = manifest_with_bad_line(tiny_data, tmp_path, 3, bad_at=2)
    assert run_app(CLI, ["check-data", str(manifest)]) == 2
    out = capsys.readouterr().out
    assert f"{manifest}:2: {tmp_path / 'crafted.npy'}: {SHAPE_NO_ARRAY_HAS}" in out


def test_evaluate_refuses_the_crafted_array_in_one_line(tmp_path, capsys, tiny_data) -> None:
    manifest = manifest_with_bad_line(tiny_data, tmp_path, 3, bad_at=3)
    one_line(["evaluate", "--checkpoint", tiny_data["base"], "--config", tiny_data["config"], "--manifest", manifest],
             capsys, f"{manifest}:3: {tmp_path / 'crafted.npy'}: {SHAPE_NO_ARRAY_HAS}")


@pytest.mark.slow  # two short training runs in this process
def test_a_crafted_array_past_the_checked_head_is_skipped_or_stops_the_run_in_one_line(tmp_path, capsys,
                                                                                      tiny_data) -> None:
    from indextts_train.data.checkdata import SAMPLE_LINES

    bad_at = SAMPLE_LINES + 8  # past the head checked before the start: found when the sample is loaded
    manifest = manifest_with_bad_line(tiny_data, tmp_path, SAMPLE_LINES + 16, bad_at)
    steps = (SAMPLE_LINES + 16) // 8  # one epoch: every line is loaded
    args = ["train", "--train-manifest", manifest, "--config", tiny_data["config"], "--base-checkpoint",
            tiny_data["base"], "--max-steps", steps, "--effective-batch-size", 8, "--num-workers", 0,
            "--learning-rate", "3e-3"]
    assert run_app(CLI, [str(a) for a in [*args, "--output-dir", tmp_path / "skip", "--skip-bad-lines"]]) == 0
    captured = capsys.readouterr()
    said = captured.out + captured.err
    assert f"{manifest}:{bad_at}: " in said and SHAPE_NO_ARRAY_HAS in said
    assert run_app(CLI, [str(a) for a in [*args, "--output-dir", tmp_path / "stop"]]) == 2
    errors = [line for line in capsys.readouterr().err.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1 and f"{manifest}:{bad_at}: " in errors[0] and SHAPE_NO_ARRAY_HAS in errors[0], errors


# ---------------------------------------------------------------------------------------------
# a data worker killed (the out-of-memory killer's SIGKILL)


class _KillsItsWorker(Dataset):
    """Samples 0..n-1; the worker that loads sample `fatal` is killed as the out-of-memory killer kills."""

    def __init__(self, n: int, fatal: int) -> None:
        self.n, self.fatal = n, fatal

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> torch.Tensor:
        if i == self.fatal and torch.utils.data.get_worker_info() is not None:
            os.kill(os.getpid(), signal.SIGKILL)
        return torch.tensor([i])


@pytest.mark.slow  # starts worker processes
def test_a_killed_worker_is_a_user_error_from_the_next_batch() -> None:
    loader = make_loader(_KillsItsWorker(12, fatal=7), sequential_batches(range(12), 2), num_workers=2,
                         collate_fn=torch.cat)
    seen = []
    with pytest.raises(UserError, match=r"data-loader worker pid \d+ \(killed by SIGKILL\).*--num-workers"):
        for batch in loader:
            seen += batch.tolist()
    assert seen == list(range(len(seen))) and len(seen) <= 6  # the batches before the dead worker's, in order


def test_a_dead_worker_ends_the_run_without_blaming_a_line_of_the_data() -> None:
    """The run's line after a dead worker said to fix or remove "the line" or pass --skip-bad-lines: no line was
    bad. A bad line still gets that advice."""
    from indextts_train.errors import LoaderDied
    from indextts_train.train.steps import bad_data

    died = bad_data(LoaderDied("data-loader worker pid 7 (killed by SIGKILL) ended while loading samples"))
    assert died.then == "then rerun with --resume auto" and died.line.startswith("data-loader worker pid 7")
    assert "--skip-bad-lines" in bad_data(UserError("t.jsonl:3: codes_path not found")).then


# ---------------------------------------------------------------------------------------------
# evaluate: one manifest twice


def test_evaluate_refuses_a_manifest_given_twice(tmp_path, capsys, tiny_data) -> None:
    link = tmp_path / "same.jsonl"
    link.symlink_to(tiny_data["train"])
    one_line(["evaluate", "--checkpoint", tiny_data["base"], "--config", tiny_data["config"], "--manifest",
              tiny_data["train"], "--manifest", link], capsys, "the same file as")
