"""Helpers shared by several test files (pytest puts this folder on sys.path)."""

from __future__ import annotations

import builtins
import errno
import io
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import torch
import yaml
from torch import nn
from torch.nn.utils.rnn import pad_sequence

from indextts_train.checkpoint.base import load_base_checkpoint
from indextts_train.config.settings import load_config
from indextts_train.model.gpt import Batch, UnifiedVoiceGPT
from indextts_train.ui.text_log import unstamp

ROOT = Path(__file__).resolve().parents[1]
TINY_REFERENCE = ROOT / "tests" / "data" / "reference" / "tiny"


def reference_batch(lines: list[dict] | None = None) -> Batch:
    """Collate tiny/pairs.jsonl the reference way: pad with 0, lengths from the manifest."""
    if lines is None:
        lines = [json.loads(line) for line in (TINY_REFERENCE / "pairs.jsonl").read_text().splitlines()]

    def load(line: dict, key: str) -> torch.Tensor:
        return torch.from_numpy(np.load(TINY_REFERENCE / line[key]))

    return Batch(
        text_ids=pad_sequence([load(x, "target_text_ids_path").long() for x in lines], batch_first=True),
        codes=pad_sequence([load(x, "target_codes_path").long() for x in lines], batch_first=True),
        text_lengths=torch.tensor([x["target_text_len"] for x in lines]),
        code_lengths=torch.tensor([x["target_code_len"] for x in lines]),
        condition=torch.stack([load(x, "prompt_condition_path") for x in lines]),
        emo_vec=torch.stack([load(x, "prompt_emo_vec_path") for x in lines]),
    )


def reference_model(folder: Path) -> UnifiedVoiceGPT:
    """The trained part of a reference folder's gpt.pth, sized by its config.yaml, in eval mode."""
    cfg = load_config(folder / "config.yaml").gpt
    trained_weights, _, _ = load_base_checkpoint(folder / "gpt.pth", cfg)
    net = UnifiedVoiceGPT(cfg)
    net.load_state_dict(trained_weights)
    return net.eval()


def start(args: list[str], env: dict | None = None) -> subprocess.Popen:
    """The real CLI in its own session, output unbuffered so the test sees each line as it comes."""
    return subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=ROOT,
                            env={**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})}, start_new_session=True)


def wait_for_training(proc: subprocess.Popen) -> bool:
    """Read output until the loop starts; False when the process ended first (run complete)."""
    for line in proc.stdout:
        if unstamp(line).startswith("training "):
            return True
    proc.wait()
    return False


# ---- small checkpoints for the checkpoint and repair tests -------------------------------------


class TinyGPT(nn.Module):
    """A few official key names, including a persistent buffer that no optimizer holds."""

    def __init__(self) -> None:
        super().__init__()
        self.conditioning_encoder = nn.Module()
        self.conditioning_encoder.embed = nn.Module()
        self.conditioning_encoder.embed.pos_enc = nn.Module()
        self.conditioning_encoder.embed.pos_enc.register_buffer("pe", torch.randn(1, 5, 8))
        self.text_embedding = nn.Embedding(13, 8)  # 12 tokens + the extra row
        self.final_norm = nn.LayerNorm(8)
        self.text_head = nn.Linear(8, 13)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.text_head(self.final_norm(self.text_embedding(ids)))  # (B, T, 13)


def trained(steps: int) -> tuple[TinyGPT, torch.optim.AdamW, torch.optim.lr_scheduler.LambdaLR]:
    torch.manual_seed(0)
    model = TinyGPT()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: min(1.0, (s + 1) / 4))
    for _ in range(steps):
        model(torch.randint(0, 12, (2, 5))).square().mean().backward()
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad()
    return model, optimizer, scheduler


def community_state(step: int = 3) -> dict:
    """What the community train_gpt_v2.py saves: DDP-prefixed keys, one param group over model.parameters()."""
    model, optimizer, scheduler = trained(step)
    return {"model": {f"module.{k}": v for k, v in model.state_dict().items()},
            "optimizer": optimizer.state_dict(), "scheduler": scheduler.state_dict(), "scaler": None,
            "epoch": 2, "step": step, "recent_checkpoints": ["runs/model_step3.pth"],
            "extra": {"type": "step"}}


def names(output_dir: Path) -> set[str]:
    return {p.name for p in output_dir.iterdir()}


class CheckpointReads:
    """How often one checkpoint file is read: unpickled (`torch.load`) and CRC-checked (the pass over
    every byte), counted from `install(monkeypatch)` on. Hard links of the file count as the file."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.loads = 0
        self.crc_passes = 0

    def _is_it(self, file) -> bool:
        return isinstance(file, (str, os.PathLike)) and os.path.isfile(file) and os.path.samefile(file, self.path)

    def install(self, monkeypatch) -> CheckpointReads:
        import indextts_train.files.numpy_pickle as ckpt  # the bounded load owns the CRC pass

        real_load, real_crc = torch.load, ckpt._check_zip_crc

        def load(file, *args, **kwargs):
            self.loads += self._is_it(file)
            return real_load(file, *args, **kwargs)

        def crc(path):
            self.crc_passes += self._is_it(path)
            return real_crc(path)

        monkeypatch.setattr(torch, "load", load)
        monkeypatch.setattr(ckpt, "_check_zip_crc", crc)
        return self


# ---- file-system faults without privileges -----------------------------------------------------


class _MeteredFile:
    """A file opened for writing on a simulated disk: each write takes its bytes from the disk's free
    space, and one that does not fit fails whole, as ENOSPC does."""

    def __init__(self, handle, disk: FaultyFolder) -> None:
        self._handle = handle
        self._disk = disk

    def write(self, data) -> int:
        size = len(data) if isinstance(data, (bytes, bytearray, str)) else memoryview(data).nbytes
        if size > self._disk.free:
            self._disk.failures += 1
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        self._disk.free -= size
        return self._handle.write(data)

    def __getattr__(self, name: str):
        return getattr(self._handle, name)

    def __enter__(self) -> _MeteredFile:
        return self

    def __exit__(self, *exc: object) -> None:
        self._handle.close()

    def __iter__(self):
        return iter(self._handle)


class FaultyFolder:
    """A folder of this process that behaves as a full or a read-only file system, for tests that must
    run anywhere: no mount, no user namespace, and root-proof (as root, chmod stops no write).

    The fault sits in the calls every writer here goes through (`open` in builtins and io, which
    pathlib, torch.save's file handle and TensorBoard's writer use; `os.open`, and `os.fdopen` of a
    descriptor it opened for writing there, as atomic_write does; `os.mkdir`), for
    paths inside `folder`, and raises the OSError the kernel would: ENOSPC once `capacity` bytes are
    written (`capacity=None`: unlimited), EROFS for any write, create, mkdir or unlink when `read_only`.
    Install with `install(monkeypatch)`; monkeypatch undoes it after the test.
    """

    def __init__(self, folder: Path, *, capacity: int | None = None, read_only: bool = False) -> None:
        self.folder = os.path.abspath(folder)
        self.free = capacity if capacity is not None else float("inf")
        self.read_only = read_only
        self.failures = 0  # writes refused as a full disk refuses them
        self._writing: set[int] = set()  # descriptors os.open gave for a write inside the folder

    def inside(self, path) -> bool:
        if isinstance(path, int):  # a file descriptor, not a path
            return False
        return os.path.abspath(os.fsdecode(path)).startswith(self.folder + os.sep)  # TensorBoard passes bytes

    def _refuse(self, path) -> None:
        raise OSError(errno.EROFS, os.strerror(errno.EROFS), os.fsdecode(path))

    def install(self, monkeypatch) -> FaultyFolder:
        self._real = {"open": builtins.open, "os_open": os.open, "fdopen": os.fdopen, "mkdir": os.mkdir,
                      "unlink": os.unlink}
        monkeypatch.setattr(builtins, "open", self._open)
        monkeypatch.setattr(io, "open", self._open)
        monkeypatch.setattr(os, "open", self._os_open)
        monkeypatch.setattr(os, "fdopen", self._fdopen)
        monkeypatch.setattr(os, "mkdir", self._mkdir)
        monkeypatch.setattr(os, "unlink", self._unlink)
        return self

    def _open(self, file, mode="r", *args, **kwargs):
        writes = any(flag in mode for flag in "wax+")
        if writes and self.read_only and self.inside(file):
            self._refuse(file)
        handle = self._real["open"](file, mode, *args, **kwargs)
        return _MeteredFile(handle, self) if writes and self.inside(file) else handle

    def _os_open(self, path, flags, *args, **kwargs):
        writes = flags & (os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND)
        if writes and self.read_only and self.inside(path):
            self._refuse(path)
        fd = self._real["os_open"](path, flags, *args, **kwargs)
        if writes and self.inside(path):
            self._writing.add(fd)
        else:  # a number the kernel gave again
            self._writing.discard(fd)
        return fd

    def _fdopen(self, fd, mode="r", *args, **kwargs):
        handle = self._real["fdopen"](fd, mode, *args, **kwargs)
        return _MeteredFile(handle, self) if fd in self._writing and any(f in mode for f in "wax+") else handle

    def _mkdir(self, path, *args, **kwargs):
        if self.read_only and (self.inside(path) or os.path.abspath(os.fsdecode(path)) == self.folder):
            if os.path.isdir(path):
                raise FileExistsError(errno.EEXIST, os.strerror(errno.EEXIST), os.fspath(path))
            if not os.path.isdir(os.path.dirname(os.path.abspath(path))):  # lookup fails first
                raise FileNotFoundError(errno.ENOENT, os.strerror(errno.ENOENT), os.fspath(path))
            self._refuse(path)
        return self._real["mkdir"](path, *args, **kwargs)

    def _unlink(self, path, *args, **kwargs):
        if self.read_only and self.inside(path):  # a read-only mount says EROFS even for a missing file
            self._refuse(path)
        return self._real["unlink"](path, *args, **kwargs)


# ---- prepare on the real tiny models -------------------------------------------------------------


def feature_batches(monkeypatch) -> list[int]:
    """The size of each batch the real model stages compute from now on (the real method runs; this
    only counts), so a test sees what a rerun recomputed."""
    from indextts_train.prepare.featurize import Featurizer

    sizes: list[int] = []
    real = Featurizer.features

    def counted(self, clips):
        sizes.append(len(clips))
        return real(self, clips)

    monkeypatch.setattr(Featurizer, "features", counted)
    return sizes


def run_cli(*args: object, cwd: Path | None = None, env: dict | None = None) -> subprocess.CompletedProcess:
    """`indextts-train ARGS` in a subprocess (the code of this checkout), its output as text."""
    return subprocess.run([sys.executable, "-m", "indextts_train", *map(str, args)], cwd=cwd or ROOT, text=True,
                          capture_output=True, timeout=600,
                          env={**os.environ, "PYTHONPATH": str(ROOT), **(env or {})})


def assert_refused(result: subprocess.CompletedProcess, *needles: str) -> str:
    """Exit 2, no traceback, and one line on stderr that holds every needle; returns that line."""
    assert result.returncode == 2, (result.stdout, result.stderr)
    assert "Traceback" not in result.stdout + result.stderr, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    for needle in needles:
        assert needle in lines[0], (needle, lines[0])
    return lines[0]


def tree_state(folder: Path) -> dict[str, bytes | str]:
    """Every entry under `folder`: a file's bytes, a link's target (never followed), a folder's name."""
    state: dict[str, bytes | str] = {}
    for path in sorted(folder.rglob("*")):
        key = str(path.relative_to(folder))
        state[key] = (f"link -> {os.readlink(path)}" if path.is_symlink() else
                      path.read_bytes() if path.is_file() else "folder")
    return state


# ---- stand-ins for the official inference -------------------------------------------------------------

def fake_inference_python(folder: Path, module: str, source: str, marker: Path | None = None) -> Path:
    """An interpreter (a script running this Python) whose path holds the dotted `module` (e.g.
    "indextts25.api") with `source` as its code; with `marker`, the script touches it first (which program
    ran is then known)."""
    package, _, name = module.rpartition(".")
    folder_of = folder / "site" / package.replace(".", "/")
    folder_of.mkdir(parents=True)
    (folder_of / "__init__.py").write_text("")
    (folder_of / f"{name}.py").write_text(source)
    script = folder / "python"
    touch = f"touch '{marker}'\n" if marker else ""
    script.write_text(f"#!/bin/sh\n{touch}PYTHONPATH='{folder / 'site'}' exec '{sys.executable}' \"$@\"\n")
    script.chmod(0o755)
    return script


def stand_in_inference_folder(model_dir: Path, config: Path) -> Path:
    """An IndexTTS2 model folder with every key and file the official inference reads (stand-in bytes):
    what listen's folder check accepts. The GPT sizes are `config`'s."""
    model_dir.mkdir(parents=True, exist_ok=True)
    raw = yaml.safe_load(Path(config).read_text())
    raw.update(s2mel={}, semantic_codec={}, w2v_stat="w2v_stats.pt", s2mel_checkpoint="s2mel.pth",
               emo_matrix="feat2.pt", spk_matrix="feat1.pt", emo_num=[1], qwen_emo_path="qwen/",
               vocoder={"name": "bigvgan"})
    (model_dir / "config.yaml").write_text(yaml.safe_dump(raw))
    for name in ("w2v_stats.pt", "s2mel.pth", "feat1.pt", "feat2.pt"):
        (model_dir / name).write_bytes(b"stand-in")
    (model_dir / "qwen").mkdir(exist_ok=True)
    return model_dir


def train_tiny_run(tiny_data: dict, out: Path, *, max_steps: int, **extra) -> Path:
    """A tiny run with validation, a checkpoint every 2 steps, no TensorBoard: the run listen and the checkpoint
    table are tried on. Returns `out`."""
    from indextts_train.train.loop import resolve_settings, train

    options = resolve_settings(train_manifests=[tiny_data["train"]], val_manifests=[tiny_data["val"]], output_dir=out,
                               config=tiny_data["config"], base_checkpoint=tiny_data["base"], batch_size=4,
                               grad_accumulation=1, effective_batch_size=4, num_workers=0, max_steps=max_steps,
                               epochs=100, val_interval=2, save_interval=2, tensorboard=False, **extra)
    assert train(options) == 0
    return out
