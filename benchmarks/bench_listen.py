"""What hearing a checkpoint costs: seconds per line and per checkpoint, through the official inference code.

    PYTHONPATH=. python benchmarks/bench_listen.py --family 2.5 --python VENV/bin/python \
        [--real-size] [--lines 3] [--seconds 5] [--threads N] [--device cpu] [--work DIR] \
        [--result benchmarks/results/listen_tiny_cpu_v25.json]

One checkpoint is heard the way `listen` hears it: its export into a temporary official model folder
(`make_model_folder`: gpt.pth, config.yaml and tokenizer written, the rest linked), then one child process
of the inference interpreter that loads every model once and speaks `--lines` lines, each seeded.
Reported: the export's seconds, the child's wall time (process start, imports, model load, lines) and CPU
time (on a shared machine the wall time says more about the neighbours), each line's synthesis seconds
(as the child measured it; the first line of a prompt also pays its conditioning, w2v-BERT + CAMPPlus,
and the first line of a language the NeMo normaliser's grammar, cached on disk after the first run),
and their sum per checkpoint.

The model folder is a stand-in with seeded random weights (listen/tiny_folder.py): tiny, or with
`--real-size` every file at the released shapes (w2v-BERT 2.0, the codec, CAMPPlus, the family's GPT
config, IndexTTS2's s2mel section, BigVGAN v2 22 kHz 80-band 256x; ~5-8 GB, written once into `--work`
and reused). The compute does not depend on the weight values, with one exception: a random GPT almost
never emits its stop code, so each line generates exactly the cap, set here to `--seconds` of speech
(25 codes a second for IndexTTS-2.5, 50 for IndexTTS2) -- the cost of a line of that length.
"""

from __future__ import annotations

import argparse
import base64
import multiprocessing
import os
import platform
import resource
import sys
import tempfile
import time
import wave
from pathlib import Path

import torch
import yaml
from report import write_result

from indextts_train.config.family import INDEXTTS2, INDEXTTS25
from indextts_train.config.settings import load_config
from indextts_train.data.demo_data import _make_base_tokenizer, _make_base_vocabulary
from indextts_train.listen.model_folder import make_model_folder
from indextts_train.listen.synthesize import SynthesisLine, resolve_inference_python, synthesize
from indextts_train.listen.tiny_folder import W2V_WIDTH, add_inference_parts, tiny_gpt_config
from indextts_train.prepare.tiny import write_synthetic_clips, write_tiny_model_dir

ROOT = Path(__file__).resolve().parents[1]
# --family -> (family, real config, codes per second of speech)
FAMILIES = {"2.5": (INDEXTTS25, ROOT / "configs" / "indextts2_5.yaml", 25),
            "2": (INDEXTTS2, ROOT / "configs" / "indextts2.yaml", 50)}
FILLER = b"\xff\xfe"  # never in UTF-8 text: filler ranks no text encodes to
TEXTS = ["Hello world, this is a test of the model.", "The quick brown fox jumps over the lazy dog.",
         "Every line is spoken in the voice of its prompt.", "Numbers and names are read as written."]


def _write_models(model_dir: Path, config: Path, tokenizer: Path, python: Path, real_size: bool) -> None:
    write_tiny_model_dir(model_dir, gpt_config=config, tokenizer=tokenizer, seed=0, width=W2V_WIDTH,
                         real_size=real_size, inference=True)
    add_inference_parts(model_dir, inference_python=python, seed=0, real_size=real_size)


def tokenizer_for(config: Path, work: Path) -> Path:
    """A base vocabulary of exactly the config's text tokens: the demo's (IndexTTS2: with filler pieces;
    IndexTTS-2.5: its English merges, then filler ranks up to the released 58,836)."""
    gpt = load_config(config).gpt
    if gpt.family is INDEXTTS2:
        return _make_base_tokenizer(work / "bpe.model", gpt, seed=0)
    tiny = load_config(ROOT / "configs" / "tiny_v25.yaml").gpt
    base = _make_base_vocabulary(work, tiny)
    lines = base.read_bytes().splitlines()
    fillers = gpt.number_text_tokens - tiny.number_text_tokens
    lines += [base64.b64encode(FILLER + i.to_bytes(3, "big")) + b" %d" % (len(lines) + i) for i in range(fillers)]
    vocabulary = work / "vocabulary.tiktoken"
    vocabulary.write_bytes(b"\n".join(lines) + b"\n")
    return vocabulary


def model_folder(work: Path, args: argparse.Namespace, python: Path) -> Path:
    """The stand-in model folder, written once (in a child process: its memory is not the timed work's)."""
    family, real_config, _ = FAMILIES[args.family]
    model_dir = work / ("real" if args.real_size else "tiny") / family
    if (model_dir / "s2mel.pth").is_file():
        return model_dir
    config = real_config if args.real_size else tiny_gpt_config(family, work)
    tokenizer = tokenizer_for(config, work)
    writer = multiprocessing.get_context("spawn").Process(
        target=_write_models, args=(model_dir, config, tokenizer, python, args.real_size))
    writer.start()
    writer.join()
    if writer.exitcode != 0:
        sys.exit(f"writing the model folder failed (exit {writer.exitcode})")
    return model_dir


def _duration(path: Path) -> float:
    with wave.open(str(path)) as handle:
        return handle.getnframes() / handle.getframerate()


def measure(model_dir: Path, work: Path, args: argparse.Namespace, python: Path) -> dict:
    family, _, rate = FAMILIES[args.family]
    clips = work / "clips"
    if not (clips / "utt0000.wav").is_file():
        write_synthetic_clips(clips, [("a prompt", "en")], speakers=1, seed=0, seconds=(4.0, 4.0))
    with tempfile.TemporaryDirectory(dir=work) as scratch:
        started = time.perf_counter()
        folder = make_model_folder(model_dir / "gpt.pth", model_dir, Path(scratch) / "folder", tokenizer=None)
        export_s = time.perf_counter() - started
        out = Path(scratch) / "wavs"
        lines = [SynthesisLine(f"line{i}", TEXTS[i % len(TEXTS)], clips / "utt0000.wav", out / f"line{i}.wav", "en")
                 for i in range(args.lines)]
        started, cpu_before = time.perf_counter(), resource.getrusage(resource.RUSAGE_CHILDREN)
        results = synthesize(folder, family, lines, seed=0, device=args.device, inference_python=python,
                             log_path=work / "child.log", threads=args.threads,
                             max_mel_tokens=int(args.seconds * rate))
        child_s = time.perf_counter() - started
        cpu_after = resource.getrusage(resource.RUSAGE_CHILDREN)
        child_cpu_s = (cpu_after.ru_utime + cpu_after.ru_stime) - (cpu_before.ru_utime + cpu_before.ru_stime)
        failed = [r.error for r in results if not r.ok]
        if failed:
            sys.exit(f"synthesis failed: {failed[0]} (log: {work / 'child.log'})")
        audio = [round(_duration(r.out_wav), 2) for r in results]
    per_line = [round(r.seconds, 2) for r in results]
    return {"export_seconds": round(export_s, 2), "child_seconds": round(child_s, 2),
            "child_cpu_seconds": round(child_cpu_s, 2),
            "load_and_start_seconds": round(child_s - sum(r.seconds for r in results), 2),
            "line_seconds": per_line, "line_audio_seconds": audio,
            "seconds_per_line": round(sum(per_line) / len(per_line), 2),
            "seconds_per_checkpoint": round(export_s + child_s, 2), "versions": results[0].versions}


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--family", choices=sorted(FAMILIES), default="2.5")
    parser.add_argument("--python", type=Path, default=None, help="the inference interpreter (default: this one)")
    parser.add_argument("--real-size", action="store_true", help="every model file at its released shapes")
    parser.add_argument("--lines", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=5.0, help="speech per line: the GPT's code cap")
    parser.add_argument("--threads", type=int, default=None, help="torch threads in the child (default: torch's)")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--work", type=Path, default=None, help="keeps the model folder for the next run")
    parser.add_argument("--result", type=Path, default=None)
    return parser.parse_args()


def main() -> None:
    args = parse_args()
    family = FAMILIES[args.family][0]
    python = resolve_inference_python(family, args.python)
    work = args.work or Path(tempfile.mkdtemp(prefix="bench-listen-"))
    work.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    model_dir = model_folder(work, args, python)
    written_s = time.perf_counter() - started
    figures = measure(model_dir, work, args, python)
    gpt = load_config(model_dir / "config.yaml").gpt
    size = "real" if args.real_size else "tiny"
    result = {"family": family, "size": size, "device": args.device, "threads": args.threads,
              "torch_threads_default": torch.get_num_threads(), "cpu_count": os.cpu_count(),
              "lines": args.lines, "speech_seconds_cap": args.seconds,
              "gpt": {"model_dim": gpt.model_dim, "layers": gpt.layers},
              "model_bytes": sum(p.stat().st_size for p in model_dir.rglob("*") if p.is_file()),
              "folder_written_seconds": round(written_s, 2), **figures,
              "machine": platform.platform(), "python": platform.python_version(),
              "s2mel": yaml.safe_load((model_dir / "config.yaml").read_text())["s2mel"]["DiT"]["depth"]}
    suffix = "v25" if family is INDEXTTS25 else "v2"
    write_result(args.result or ROOT / "benchmarks" / "results" / f"listen_{size}_{args.device}_{suffix}.json",
                 result)


if __name__ == "__main__":
    main()
