"""`indextts-train demo OUT_DIR [--family 2.5]`: the whole pipeline on a small built-in dataset, on CPU.

It makes a real base vocabulary and an Ethiopic-extended one (IndexTTS2: SentencePiece models;
IndexTTS-2.5: tiktoken ranks files, where the growth moves every special token), synthetic clips
(tones + noise) with transcripts, and a tiny official-layout model folder of random weights
(w2v-BERT, codec, CAMPPlus, a base gpt.pth at the base vocabulary); runs the real `prepare` on them;
then trains with the extended vocabulary (so it grows and the base rows stay frozen), and exports
the result for inference. Rerunning it resumes (`--resume auto`), like any run."""

from __future__ import annotations

from pathlib import Path

import torch

from indextts_train.checkpoint.export import export_checkpoint
from indextts_train.config.family import INDEXTTS2, INDEXTTS25, family_of_version
from indextts_train.config.schema import build
from indextts_train.config.scope_settings import TRAIN_SCOPES
from indextts_train.config.settings import TrainConfig, load_config
from indextts_train.errors import UserError
from indextts_train.files.atomic import atomic_write, atomic_write_bytes
from indextts_train.files.bounded import check_file
from indextts_train.files.targets import make_output_folder
from indextts_train.listen.demo import demo_listener, listen_to_demo
from indextts_train.model.gpt import UnifiedVoiceGPT
from indextts_train.model.layout import full_state_dict, init_carried
from indextts_train.prepare.demo_corpus import make_prepared_demo
from indextts_train.train.loop import resolve_settings, train

ROOT = Path(__file__).resolve().parents[1]
TINY_CONFIG = ROOT / INDEXTTS2.tiny_config
FAMILIES = ("2", "2.5")  # --family, as the official config.yaml's `version:` names them
MARKER = ".indextts-train-demo"  # OUT_DIR is the demo's: it writes and replaces files there (export/ with --force)


def claim_demo_folder(out_dir: Path) -> None:
    """Make OUT_DIR the demo's, or refuse it: the demo writes config.yaml, data/, models/, run/ and export/
    there, replacing what it wrote before, so a folder holding anything else is not its to use.

    Its own: new, empty, marked by an earlier demo, or made by a demo before the mark (its config.yaml is a
    bundled tiny config, byte for byte)."""
    make_output_folder("OUT_DIR", out_dir)
    if (out_dir / MARKER).is_file():
        return
    entries = sorted(entry.name for entry in out_dir.iterdir())
    config = out_dir / "config.yaml"
    earlier_demo = config.is_file() and not config.is_symlink() and config.stat().st_size < 1 << 20 and any(
        config.read_bytes() == (ROOT / family.tiny_config).read_bytes() for family in (INDEXTTS2, INDEXTTS25))
    if entries and not earlier_demo:
        shown = ", ".join(entries[:3]) + (", ..." if len(entries) > 3 else "")
        raise UserError(f"OUT_DIR {out_dir}: holds files the demo did not make ({shown}); the demo writes and "
                        "replaces config.yaml, data/, models/, run/ and export/ there: give a new or empty folder")
    atomic_write_bytes(out_dir / MARKER, b"made by indextts-train demo: its files here are replaced on a rerun\n")


def make_base_checkpoint(config_path: Path, path: Path, seed: int = 0) -> None:
    """A stand-in for IndexTTS2's gpt.pth at the tiny size: same keys, random weights."""
    gpt = load_config(config_path).gpt
    torch.manual_seed(seed)
    model = UnifiedVoiceGPT(gpt)
    state = full_state_dict(model, init_carried(gpt, torch.Generator().manual_seed(seed)))
    atomic_write(path, lambda handle: torch.save(state, handle))


def run_demo(out_dir: Path, *, max_steps: int = 150, resume: str | None = "auto", family: str = "2",
             train_scope: str = "full") -> int:
    if family not in FAMILIES:
        raise UserError(f"--family {family}: choose 2 (IndexTTS2) or 2.5 (IndexTTS-2.5)")
    # The flags the training part takes are checked now: minutes of demo data are not made for a typo.
    if train_scope not in TRAIN_SCOPES:  # said by its flag, as train's own --train-scope is
        raise UserError(f"--train-scope {train_scope!r}: choose one of {', '.join(TRAIN_SCOPES)}")
    build(TrainConfig, {"max_steps": max_steps, "train_scope": train_scope}, "train")
    if resume not in (None, "auto"):
        check_file(resume, "checkpoint", flag="--resume", missing="use --resume auto to continue the demo run")
    chosen = family_of_version(family, "--family")
    tiny = ROOT / chosen.tiny_config
    if not tiny.is_file():
        raise UserError(f"{tiny} not found: run the demo from a checkout of indextts-train (pip install -e .)")
    claim_demo_folder(out_dir)
    config_path = out_dir / "config.yaml"
    if not config_path.exists():
        atomic_write_bytes(config_path, tiny.read_bytes())
    config = load_config(config_path)
    if config.gpt.family is not chosen:
        raise UserError(f"{out_dir} holds a demo of the other family ({config.gpt.family.name}); use another OUT_DIR")
    listener, why_not = demo_listener(chosen)  # found first: a demo that can be heard is built wide enough
    paths = make_prepared_demo(out_dir, config_path, inference_widths=listener is not None)
    base = paths["base_checkpoint"]
    print(f"demo data prepared in {out_dir / 'data' / 'prepared'} from synthetic clips by tiny random models in "
          f"{paths['model_dir']}: base tokenizer {paths['base_tokenizer']}, extended tokenizer {paths['tokenizer']}, "
          f"base checkpoint {base}; text presented as official inference does, normaliser: {paths['normalizer']}")
    run_dir = out_dir / "run"
    try:
        code = train(resolve_settings(
            train_manifests=[Path(paths["train_manifest"])], val_manifests=[Path(paths["val_manifest"])],
            output_dir=run_dir, config=config_path, tokenizer=Path(paths["tokenizer"]), base_checkpoint=base,
            resume=resume, max_steps=max_steps, epochs=10_000, val_interval=50, save_interval=50, log_interval=10,
            train_scope=train_scope,
        ))
    except UserError as exc:  # the trainer's advice names its flags, which the demo's user never typed
        if "--accept-data-change" in str(exc):  # a demo folder moved or edited since its run began
            raise UserError(f"{exc} (the demo has no --accept-data-change: run the demo into a new OUT_DIR)") from None
        if "--output-dir" not in str(exc):
            raise
        raise UserError(f"{exc} (the demo trains in OUT_DIR/run: for --output-dir read OUT_DIR, and run the demo "
                        "into another OUT_DIR)") from None
    if code != 0:
        return code
    summary = export_checkpoint(run_dir / "latest.pth", out_dir / "export" / "gpt.pth",
                                config_out=out_dir / "export" / "config.yaml",
                                tokenizer=Path(paths["tokenizer"]),
                                force=True)  # the demo's own export folder: a rerun replaces it
    print(f"exported {out_dir / 'export' / 'gpt.pth'} ({summary['tensors']} tensors, "
          f"{summary['text_rows']} text rows) and {out_dir / 'export' / 'config.yaml'}")
    return listen_to_demo(out_dir, chosen, listener, why_not, wide=paths["inference_widths"])  # docs/listen.md
