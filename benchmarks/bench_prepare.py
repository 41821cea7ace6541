"""prepare's throughput against a plain one-clip-at-a-time loop over the same stages, in the same run.

Both sides start from the same corpus (synthetic 16 kHz clips, tones + noise, `--min-seconds` to
`--max-seconds` long) and the same tiny official-layout model folder (random weights; `--width` is
the w2v-BERT hidden size, which the codec and the GPT's encoders take). Each side loads the models,
reads and resamples every clip, computes text ids, w2v-BERT layer 17, codes, the prompt and emotion
features, and saves the arrays:

- pipeline: `run_prepare` as the command runs it (length-sorted padded w2v-BERT batches of
  `--batch-seconds`, audio loaded in threads ahead of the models, atomic writes, manifests);
- loop: for each clip in corpus order, load it, run `Featurizer.features([clip])`, np.save.

    PYTHONPATH=. python benchmarks/bench_prepare.py [--clips 48] [--width 32] [--batch-seconds 60] \
        [--threads N] [--device cpu] [--result benchmarks/results/prepare.json]

Writes the result file (clips/s, audio seconds per second, ratio) and prints it. With the tiny
widths the models are dominated by per-call overhead, which batching removes: the ratio is an upper
bound of what batching gives with real model sizes, where the matrix work itself dominates.

    PYTHONPATH=. python benchmarks/bench_prepare.py --real-size [--no-loop] [--clips 16] \
        [--result benchmarks/results/prepare_real_cpu.json]

`--real-size` measures what `prepare` costs at the released sizes: the model folder has the official
IndexTTS2 layout and every file its real shapes (configs/indextts2.yaml's GPT with its conformer +
perceiver speaker and emotion encoders, w2v-BERT 2.0: width 1024, 24 layers of which 17 run, 16
heads, intermediate 4096; the MaskGCT codec of the `semantic_codec:` defaults), filled with seeded
random weights. The compute of these models does not depend on the weight values (no early exit, no
sparsity, no data-dependent shapes: every clip's lengths come from its audio alone), so random
weights give a fair speed figure; the features themselves are meaningless. The folder (~4 GB) is
written to the temp folder in a child process, so the peak RSS recorded is that of the timed work.
Defaults then: 16 clips of 3-8 s. `--no-loop` skips the one-clip loop (the result says so).

Both modes also time the fixed costs on their own, warm page cache: one model load
(`model_load_seconds`, both sides pay it) and the sha256 of every model file that prepare.json
records (`model_hash_seconds`, the pipeline only); `pipeline_without_load` and `loop_without_load`
leave them out: the rates a long run approaches, and `steady_ratio` compares those.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import platform
import re
import resource
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
import yaml
from report import write_result

from indextts_train.config.family import INDEXTTS25
from indextts_train.model.conditioning import COND_PREFIXES, EMO_PREFIXES
from indextts_train.prepare.corpus import Defaults, read_corpora
from indextts_train.prepare.featurize import Featurizer, load_clip, read_gpt_weights
from indextts_train.prepare.models import Overrides, locate_models, model_hashes
from indextts_train.prepare.pairs import SplitRule
from indextts_train.prepare.pipeline import PrepareOptions, run_prepare
from indextts_train.prepare.tiny import write_synthetic_clips, write_tiny_model_dir

ROOT = Path(__file__).resolve().parents[1]
RESULT = ROOT / "benchmarks" / "results" / "prepare.json"
REAL_RESULT = ROOT / "benchmarks" / "results" / "prepare_real_cpu.json"
TEXT_DIR = ROOT / "tests" / "data" / "reference" / "prepare" / "text"
# family -> (tiny config, real config, tokenizer, language of the clips)
FAMILIES = {"2": (ROOT / "configs" / "tiny.yaml", ROOT / "configs" / "indextts2.yaml", TEXT_DIR / "bpe_tiny.model",
                  None),
            "2.5": (ROOT / "configs" / "tiny_v25.yaml", ROOT / "configs" / "indextts2_5.yaml",
                    TEXT_DIR / "toy_base.tiktoken", "en")}
TEXT = "Hello world, this is a test."


def _write_models(model_dir: Path, config: Path, tokenizer: Path, width: int, real_size: bool) -> None:
    write_tiny_model_dir(model_dir, gpt_config=config, tokenizer=tokenizer, seed=0, width=width, real_size=real_size)


def make_inputs(root: Path, args: argparse.Namespace) -> Path:
    """The config (tiny, fitted to the longest clip; or the real one), its model folder, and the clips;
    returns the corpus. The models are written in a child process: its memory is not the timed run's."""
    tiny, real, tokenizer, language = FAMILIES[args.family]
    if args.real_size:
        config = real
    else:
        raw = yaml.safe_load(tiny.read_text())
        raw["gpt"]["max_mel_tokens"] = int(args.max_seconds * 50) + 10  # 50 codes a second
        config = root / "bench.yaml"
        config.write_text(yaml.safe_dump(raw))
    writer = multiprocessing.get_context("spawn").Process(
        target=_write_models, args=(root / "models", config, tokenizer, args.width, args.real_size))
    writer.start()
    writer.join()
    if writer.exitcode != 0:
        sys.exit(f"writing the model folder failed (exit {writer.exitcode})")
    return write_synthetic_clips(root / "clips", [(TEXT, language)] * args.clips, speakers=4, seed=1,
                                 seconds=(args.min_seconds, args.max_seconds))


def _safetensors_counts(path: Path, skip: re.Pattern[str]) -> tuple[int, int]:
    """(parameters prepare loads, all parameters) of a safetensors file; `skip` matches the unused keys."""
    from safetensors import safe_open

    loaded = total = 0
    with safe_open(str(path), framework="pt") as handle:
        for key in handle.keys():
            n = int(np.prod(handle.get_slice(key).get_shape()))
            total += n
            loaded += 0 if skip.search(key) else n
    return loaded, total


def model_sizes(model_dir: Path) -> dict:
    """Parameter counts of what prepare runs: w2v-BERT as loaded (17 layers), the codec's quantize path,
    the GPT's speaker and emotion encoders (and each file's total)."""
    models = locate_models(model_dir, Overrides())
    w2v, w2v_total = _safetensors_counts(models.w2v_bert / "model.safetensors",
                                         re.compile(r"^encoder\.layers\.(1[7-9]|[2-9]\d)\."))
    unused = re.compile(r"^(decoder|up)\.|out_project")
    if models.family is INDEXTTS25:  # codec.pth {"model": state dict}; the speaker vector comes from CAMPPlus
        codec_state = torch.load(models.codec, map_location="cpu", weights_only=True, mmap=True)["model"]
        codec_total = sum(v.numel() for v in codec_state.values())
        codec = sum(v.numel() for k, v in codec_state.items() if not unused.search(k))
    else:
        codec, codec_total = _safetensors_counts(models.codec, unused)
    gpt = read_gpt_weights(models.gpt)
    keep = (*COND_PREFIXES, *EMO_PREFIXES, "emovec_layer", "emo_layer")
    encoders = sum(v.numel() for k, v in gpt.items() if k.split(".")[0] in keep)
    sizes = {"w2v_bert_loaded": w2v, "w2v_bert_file": w2v_total, "codec_quantize_path": codec,
             "codec_file": codec_total, "gpt_encoders": encoders, "gpt_file": sum(v.numel() for v in gpt.values()),
             "w2v_bert_width": models_width(models.w2v_bert)}
    if models.campplus is not None:
        campplus = torch.load(models.campplus, map_location="cpu", weights_only=True)
        sizes["campplus"] = sum(v.numel() for v in campplus.values() if isinstance(v, torch.Tensor))
    return sizes


def models_width(w2v_dir: Path) -> int:
    return int(json.loads((w2v_dir / "config.json").read_text())["hidden_size"])


def time_pipeline(root: Path, corpus: Path, args: argparse.Namespace) -> float:
    options = PrepareOptions(corpora=[corpus], model_dir=root / "models", out=root / "pipeline", device=args.device,
                             defaults=Defaults(), split=SplitRule(val_fraction=0.1), batch_seconds=args.batch_seconds,
                             min_seconds=0.1, workers=args.workers)
    start = time.perf_counter()
    code = run_prepare(options)
    elapsed = time.perf_counter() - start
    if code != 0:
        sys.exit(f"prepare exited {code}; see {root / 'pipeline' / 'rejected.jsonl'}")
    return elapsed


def time_load(root: Path, args: argparse.Namespace) -> float:
    """Seconds to load every model as prepare does (files already in the page cache): the fixed cost of
    a run, set apart so that the rate of a long run can be read off a short one. The second of two loads:
    the first also pays the one-time imports, which the timed runs after it do not."""
    times = []
    for _ in range(2):
        start = time.perf_counter()
        featurizer = Featurizer.load(locate_models(root / "models", Overrides()), torch.device(args.device))
        times.append(time.perf_counter() - start)
        del featurizer
    return times[-1]


def time_hashes(root: Path) -> float:
    """Seconds for the sha256 of every model file (prepare.json records them; rank 0, once a run)."""
    start = time.perf_counter()
    model_hashes(locate_models(root / "models", Overrides()))
    return time.perf_counter() - start


def time_loop(root: Path, corpus: Path, args: argparse.Namespace) -> float:
    """The plain loop: every stage, one clip at a time, in corpus order, arrays saved."""
    start = time.perf_counter()
    models = locate_models(root / "models", Overrides())
    featurizer = Featurizer.load(models, torch.device(args.device))
    out = root / "loop"
    out.mkdir()
    for utt in read_corpora([corpus], Defaults()):
        clip = load_clip(utt, 15.0)
        text = featurizer.text_ids(utt)
        [arrays] = featurizer.features([clip])
        for name, array in {"text_ids": text.ids, **arrays}.items():
            np.save(out / f"{utt.id}.{name}.npy", array)
    return time.perf_counter() - start


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--real-size", action="store_true",
                        help="the released model sizes (IndexTTS2, random weights); defaults 16 clips of 3-8 s")
    parser.add_argument("--no-loop", action="store_true", help="time the pipeline only")
    parser.add_argument("--family", choices=sorted(FAMILIES), default="2", help="IndexTTS2 (2) or IndexTTS-2.5")
    parser.add_argument("--clips", type=int, default=None, help="default 48 (real size: 16)")
    parser.add_argument("--width", type=int, default=32, help="w2v-BERT hidden size (tiny: 32; --real-size: 1024)")
    parser.add_argument("--min-seconds", type=float, default=None, help="default 1 (real size: 3)")
    parser.add_argument("--max-seconds", type=float, default=None, help="default 6 (real size: 8)")
    parser.add_argument("--batch-seconds", type=float, default=60.0)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--threads", type=int, default=0, help="torch CPU threads (0: torch's default)")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--result", type=Path, default=None,
                        help=f"default {RESULT.relative_to(ROOT)} (real size: {REAL_RESULT.relative_to(ROOT)})")
    args = parser.parse_args()
    real = args.real_size
    for name, tiny, full in (("clips", 48, 16), ("min_seconds", 1.0, 3.0), ("max_seconds", 6.0, 8.0),
                             ("result", RESULT, REAL_RESULT)):
        if getattr(args, name) is None:
            setattr(args, name, full if real else tiny)
    if args.family == "2.5" and args.result in (RESULT, REAL_RESULT):
        args.result = args.result.with_name(args.result.stem + "_v25.json")
    return args


def _rates(seconds: float, clips: int, audio_seconds: float) -> dict:
    return {"seconds": round(seconds, 2), "clips_per_s": round(clips / seconds, 3),
            "audio_s_per_s": round(audio_seconds / seconds, 3)}


def main() -> None:
    args = parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        start = time.perf_counter()
        corpus = make_inputs(root, args)
        setup_s = time.perf_counter() - start
        load_s = time_load(root, args)
        hash_s = time_hashes(root)
        loop_s = None if args.no_loop else time_loop(root, corpus, args)
        pipeline_s = time_pipeline(root, corpus, args)
        kept = [json.loads(line) for line in (root / "pipeline" / "utterances.jsonl").read_text().splitlines()]
        audio_seconds = sum(line["duration"] for line in kept)
        sizes = model_sizes(root / "models")
    result = {
        "device": args.device if args.device == "cpu" else torch.cuda.get_device_name(),
        "cpu_threads": torch.get_num_threads(), "cpu_count": os.cpu_count(), "python": platform.python_version(),
        "torch": torch.__version__, "date": time.strftime("%Y-%m-%d %H:%M"),
        "load_average": [round(x, 2) for x in os.getloadavg()],
        "family": "IndexTTS-2.5" if args.family == "2.5" else "IndexTTS2",
        "model_sizes": "real (random seeded weights)" if args.real_size else "tiny (random weights)",
        "clips": args.clips, "kept": len(kept), "audio_seconds": round(audio_seconds, 2),
        "clip_seconds": [args.min_seconds, args.max_seconds], "w2v_bert_width": sizes.pop("w2v_bert_width"),
        "parameters": sizes, "batch_seconds": args.batch_seconds, "workers": args.workers,
        "setup_seconds": round(setup_s, 1),
        "model_load_seconds": round(load_s, 2), "model_hash_seconds": round(hash_s, 2),
        "pipeline": _rates(pipeline_s, args.clips, audio_seconds),
        "pipeline_without_load": _rates(pipeline_s - load_s - hash_s, args.clips, audio_seconds)
        if pipeline_s > load_s + hash_s else None,
        "loop": "skipped (--no-loop)" if loop_s is None else _rates(loop_s, args.clips, audio_seconds),
        "loop_without_load": None if loop_s is None or loop_s <= load_s
        else _rates(loop_s - load_s, args.clips, audio_seconds),
        "ratio": None if loop_s is None else round(loop_s / pipeline_s, 2),
        "steady_ratio": None if loop_s is None or pipeline_s <= load_s + hash_s or loop_s <= load_s
        else round((loop_s - load_s) / (pipeline_s - load_s - hash_s), 2),
        "peak_rss_mib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
    }
    if not args.real_size:
        del result["parameters"]
    write_result(args.result, result)


if __name__ == "__main__":
    main()
