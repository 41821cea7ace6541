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
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
import yaml
from report import write_result

from indextts_train.prepare.corpus import Defaults, read_corpora
from indextts_train.prepare.featurize import Featurizer, load_clip
from indextts_train.prepare.models import Overrides, locate_models
from indextts_train.prepare.pairs import SplitRule
from indextts_train.prepare.pipeline import PrepareOptions, run_prepare
from indextts_train.prepare.tiny import write_synthetic_clips, write_tiny_model_dir

ROOT = Path(__file__).resolve().parents[1]
RESULT = ROOT / "benchmarks" / "results" / "prepare.json"
TOKENIZER = ROOT / "tests" / "data" / "reference" / "prepare" / "text" / "bpe_tiny.model"
TEXT = "Hello world, this is a test."


def make_inputs(root: Path, args: argparse.Namespace) -> Path:
    """A tiny config that fits the longest clip, its model folder, and the clips; returns the corpus."""
    raw = yaml.safe_load((ROOT / "configs" / "tiny.yaml").read_text())
    raw["gpt"]["max_mel_tokens"] = int(args.max_seconds * 50) + 10  # 50 codes a second
    config = root / "bench.yaml"
    config.write_text(yaml.safe_dump(raw))
    write_tiny_model_dir(root / "models", gpt_config=config, tokenizer=TOKENIZER, seed=0, width=args.width)
    return write_synthetic_clips(root / "clips", [(TEXT, None)] * args.clips, speakers=4, seed=1,
                                 seconds=(args.min_seconds, args.max_seconds))


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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clips", type=int, default=48)
    parser.add_argument("--width", type=int, default=32, help="w2v-BERT hidden size (tiny: 32; real: 1024)")
    parser.add_argument("--min-seconds", type=float, default=1.0)
    parser.add_argument("--max-seconds", type=float, default=6.0)
    parser.add_argument("--batch-seconds", type=float, default=60.0)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--threads", type=int, default=0, help="torch CPU threads (0: torch's default)")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--result", type=Path, default=RESULT)
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        corpus = make_inputs(root, args)
        loop_s = time_loop(root, corpus, args)
        pipeline_s = time_pipeline(root, corpus, args)
        kept = [json.loads(line) for line in (root / "pipeline" / "utterances.jsonl").read_text().splitlines()]
        audio_seconds = sum(line["duration"] for line in kept)
    result = {
        "device": args.device if args.device == "cpu" else torch.cuda.get_device_name(),
        "cpu_threads": torch.get_num_threads(), "cpu_count": os.cpu_count(), "python": platform.python_version(),
        "torch": torch.__version__, "clips": args.clips, "audio_seconds": round(audio_seconds, 2),
        "w2v_bert_width": args.width, "batch_seconds": args.batch_seconds, "workers": args.workers,
        "pipeline": {"seconds": round(pipeline_s, 2), "clips_per_s": round(args.clips / pipeline_s, 2),
                     "audio_s_per_s": round(audio_seconds / pipeline_s, 2)},
        "loop": {"seconds": round(loop_s, 2), "clips_per_s": round(args.clips / loop_s, 2),
                 "audio_s_per_s": round(audio_seconds / loop_s, 2)},
        "ratio": round(loop_s / pipeline_s, 2),
    }
    write_result(args.result, result)


if __name__ == "__main__":
    main()
