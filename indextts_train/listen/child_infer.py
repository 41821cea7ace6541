"""Synthesize a job's lines with the official IndexTTS inference code: `PYTHON child_infer.py JOB.json`.

Run by the inference environment's interpreter, by file path: that environment need not have
indextts-train, and may have another torch. So this file imports only the standard library, the
official package and what the official package itself depends on (torch, numpy, omegaconf).

The job (written by `synthesize.py`) names the family, the official-layout model folder, the device
and the lines (text, prompt audio, output WAV, language, seed). Each line is seeded (Python, NumPy,
torch) just before it is spoken, so a line's WAV depends on the checkpoint, the line and the seed only.
WAVs are written to a temporary name and renamed; the result JSON is rewritten after every line, so a
killed process leaves what it finished. Errors are reported per line, as one line each; nothing here
ends in a traceback.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import sys
import tempfile
import time
import wave
from pathlib import Path

PACKAGE_DEFAULT_MAX_MEL_TOKENS = 1500  # what both packages' infer() use when not told otherwise
# IndexTTS2 loads these by hub id; the project's model folders keep them in hf_cache/ in plain folders
# (repo id -> [(file in the repo, path under hf_cache/)]). The vocoder's id comes from config.yaml.
V2_HUB_FILES = {
    "facebook/w2v-bert-2.0": [(name, f"w2v-bert-2.0/{name}")
                              for name in ("config.json", "preprocessor_config.json", "model.safetensors")],
    "amphion/MaskGCT": [("semantic_codec/model.safetensors", "semantic_codec/model.safetensors")],
    "funasr/campplus": [("campplus_cn_common.bin", "campplus_cn_common.bin")],
}
V2_VOCODER_FILES = [("config.json", "bigvgan/config.json"), ("bigvgan_generator.pt", "bigvgan/bigvgan_generator.pt")]
LOCAL_REVISION = "0" * 40  # the snapshot name of a hub entry made from local files
PR_SET_PDEATHSIG = 1  # linux/prctl.h


def _one_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split())
    return f"{type(exc).__name__}: {text}"[:500]


def _default_hub_cache() -> Path:
    if os.environ.get("HF_HUB_CACHE"):
        return Path(os.environ["HF_HUB_CACHE"])
    home = os.environ.get("HF_HOME") or os.path.join(os.environ.get("XDG_CACHE_HOME") or "~/.cache", "huggingface")
    return Path(home).expanduser() / "hub"


def _hub_entry(cache: Path, repo: str, files: list[tuple[str, Path]]) -> None:
    """A hub-cache entry whose snapshot links to local files (what hf_hub_download finds offline)."""
    entry = cache / f"models--{repo.replace('/', '--')}"
    (entry / "refs").mkdir(parents=True, exist_ok=True)
    (entry / "refs" / "main").write_text(LOCAL_REVISION)
    for name, source in files:
        link = entry / "snapshots" / LOCAL_REVISION / name
        link.parent.mkdir(parents=True, exist_ok=True)
        link.symlink_to(source.resolve())


def _v2_hub_cache(model_dir: Path, vocoder: str, cache: Path) -> bool:
    """Fill `cache` for IndexTTS2's hub downloads: from the model folder's hf_cache/ where it has the
    files, else from the user's own hub cache (linked, so a first download lands there for good).
    Returns whether everything is local (then the child runs offline)."""
    local = model_dir / "hf_cache"
    wanted = dict(V2_HUB_FILES)
    wanted[vocoder] = V2_VOCODER_FILES
    everything_local = True
    user_cache = _default_hub_cache()
    for repo, files in wanted.items():
        entry = f"models--{repo.replace('/', '--')}"
        paths = [(name, local / relative) for name, relative in files]
        if all(path.is_file() for _, path in paths):
            _hub_entry(cache, repo, paths)
        elif (local / entry).is_dir():  # the official web UI points HF_HUB_CACHE at hf_cache/
            (cache / entry).symlink_to((local / entry).resolve())
        else:
            everything_local = False
            (user_cache / entry).mkdir(parents=True, exist_ok=True)
            (cache / entry).symlink_to((user_cache / entry).resolve())
    return everything_local


def _write_wav(path: Path, sample_rate: int, pcm16) -> None:
    """16-bit PCM with the standard library (torchaudio.save needs TorchCodec since 2.9)."""
    import numpy as np

    data = np.asarray(pcm16, dtype=np.int16)
    channels = 1 if data.ndim == 1 else data.shape[1]
    with wave.open(str(path), "wb") as handle:
        handle.setnchannels(channels)
        handle.setsampwidth(2)
        handle.setframerate(int(sample_rate))
        handle.writeframes(np.ascontiguousarray(data).tobytes())


def _max_mel_tokens(model_dir: Path, cap: int | None) -> int:
    """The package's default, but never past the model's own limit (its position table) nor the job's cap."""
    from omegaconf import OmegaConf

    limits = [PACKAGE_DEFAULT_MAX_MEL_TOKENS, int(OmegaConf.load(model_dir / "config.yaml").gpt.max_mel_tokens)]
    return min(limits + ([int(cap)] if cap else []))


class _V25:
    """IndexTTS-2.5 through its public API (`indextts25.IndexTTS25`)."""

    packages = ("indextts25-inference",)  # whose versions the report names
    hub_files = False  # every file it reads is in the model folder

    def __init__(self, model_dir: Path, device: str, cap: int | None) -> None:
        from indextts25 import IndexTTS25

        self.tts = IndexTTS25(model_dir=model_dir, device=device)
        self.max_mel_tokens = _max_mel_tokens(model_dir, cap)

    def speak(self, line: dict, out: Path) -> None:
        if not line.get("language"):
            raise ValueError("IndexTTS-2.5 needs the line's language (an ISO 639-1 code such as en, es, zh)")
        self.tts.synthesize(line["text"], voice=line["prompt_audio"], out=out, lang=line["language"],
                            max_mel_tokens=self.max_mel_tokens)


class _V2:
    """IndexTTS2 through `indextts.infer_v2.IndexTTS2` (the PyPI package or an index-tts checkout)."""

    packages = ("indextts2-inference", "indextts", "torchaudio")
    hub_files = True  # it loads w2v-BERT, MaskGCT and its vocoder by hub id

    def __init__(self, model_dir: Path, device: str, cap: int | None) -> None:
        from indextts.infer_v2 import IndexTTS2

        self.max_mel_tokens = _max_mel_tokens(model_dir, cap)
        self.tts = IndexTTS2(cfg_path=str(model_dir / "config.yaml"), model_dir=str(model_dir), device=device,
                             use_fp16=False)

    def speak(self, line: dict, out: Path) -> None:
        sample_rate, pcm16 = self.tts.infer(spk_audio_prompt=line["prompt_audio"], text=line["text"],
                                            output_path=None, max_mel_tokens=self.max_mel_tokens)
        _write_wav(out, sample_rate, pcm16)


# The job's family key (Family.key) -> its engine: this process runs in the inference environment and
# cannot import indextts_train's Family type.
ENGINES = {"indextts2.5": _V25, "indextts2": _V2}


def _seed(seed: int) -> None:
    import numpy
    import torch

    random.seed(seed)
    numpy.random.seed(seed)
    torch.manual_seed(seed)  # every device's generator, CUDA's included


def _versions(engine: type) -> dict[str, str]:
    from importlib import metadata

    names = ["torch", "transformers", *engine.packages]
    found = {}
    for name in names:
        try:
            found[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    return found


def _publish(report: dict, path: Path) -> None:
    temporary = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    temporary.write_text(json.dumps(report, ensure_ascii=False), encoding="utf-8")
    os.replace(temporary, path)


def _speak_line(engine, line: dict) -> dict:
    out = Path(line["out_wav"])
    temporary = out.with_name(f".{out.stem}.{os.getpid()}.tmp.wav")
    started = time.perf_counter()
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        _seed(int(line["seed"]))
        engine.speak(line, temporary)
        os.replace(temporary, out)
    except Exception as exc:  # the official code's own errors: reported for this line, the next goes on
        temporary.unlink(missing_ok=True)
        return {"line_id": line["line_id"], "ok": False, "seconds": time.perf_counter() - started,
                "error": _one_line(exc)}
    return {"line_id": line["line_id"], "ok": True, "seconds": time.perf_counter() - started, "error": None}


def _engine(job: dict) -> type:
    if job["family"] not in ENGINES:
        raise ValueError(f"unknown family {job['family']!r}")
    return ENGINES[job["family"]]


def _load(job: dict):
    if job.get("threads"):
        import torch

        torch.set_num_threads(int(job["threads"]))
    return _engine(job)(Path(job["model_dir"]), job["device"], job.get("max_mel_tokens"))


def _prepare_environment(job: dict, cache: Path) -> None:
    """Before the official package (and huggingface_hub) is imported: where IndexTTS2 finds its hub files."""
    if not _engine(job).hub_files:
        return
    model_dir = Path(job["model_dir"])
    vocoder = _vocoder_id(model_dir / "config.yaml")
    if _v2_hub_cache(model_dir, vocoder, cache):
        os.environ["HF_HUB_OFFLINE"] = "1"
    os.environ["HF_HUB_CACHE"] = str(cache)


def _vocoder_id(config: Path) -> str:
    from omegaconf import OmegaConf

    return str(OmegaConf.load(config).vocoder.name)


def _die_with_parent(parent: int) -> None:
    """A killed `listen` leaves no child speaking on: on Linux the kernel kills this process with its parent
    (the parent's thread waits in subprocess.run meanwhile, so it outlives us otherwise)."""
    try:
        import ctypes
        import signal

        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    except (OSError, AttributeError):  # not Linux: the parent's timeout still bounds us
        pass
    if parent and os.getppid() != parent:  # the parent died before the call above
        sys.exit(1)


def run(job_path: Path) -> int:
    job = json.loads(job_path.read_text(encoding="utf-8"))
    _die_with_parent(int(job.get("parent_pid") or 0))
    result = Path(job["result"])
    report: dict = {"versions": {}, "lines": [], "error": None, "load_seconds": None}
    cache = Path(tempfile.mkdtemp(prefix="indextts-hub-"))
    try:
        started = time.perf_counter()
        try:
            _prepare_environment(job, cache)
            engine = _load(job)
            report["versions"] = _versions(_engine(job))
        except Exception as exc:  # a model folder the official code cannot load: every line fails with it
            report["error"] = f"loading the model failed: {_one_line(exc)}"
            _publish(report, result)
            print(report["error"], file=sys.stderr)
            return 0
        report["load_seconds"] = time.perf_counter() - started
        _publish(report, result)
        for line in job["lines"]:
            report["lines"].append(_speak_line(engine, line))
            _publish(report, result)
        return 0
    finally:
        shutil.rmtree(cache, ignore_errors=True)  # links only: the files they point to stay


if __name__ == "__main__":
    sys.exit(run(Path(sys.argv[1])))
