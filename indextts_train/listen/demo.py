"""The end of `indextts-train demo`: hear the demo run's checkpoints, when an inference environment is there.

The demo's model folder holds only what `prepare` reads; synthesis needs the whole official stack, so a
second tiny folder of the run's family is made beside it (OUT/listen_model: s2mel and BigVGAN made by
the official classes in the inference environment, tiny_folder.py) with a tiny random speech recogniser
(OUT/asr). Only IndexTTS-2.5 can be heard at the demo's size: the official IndexTTS2 s2mel takes a
1280-wide GPT, and the demo's is a few dozen wide. The interpreter: this one, or the one
INDEXTTS_INFERENCE_PYTHON names, when it imports the package; otherwise one line says how to enable it.
"""

from __future__ import annotations

import os
from pathlib import Path

from indextts_train.config.family import Family
from indextts_train.errors import UserError
from indextts_train.listen.run import ListenOptions, listen
from indextts_train.listen.synthesize import resolve_inference_python
from indextts_train.listen.tiny_folder import write_tiny_inference_dir
from indextts_train.prepare.tiny_asr import write_tiny_asr

PYTHON_VARIABLE = "INDEXTTS_INFERENCE_PYTHON"


def demo_listener(family: Family) -> tuple[Path | None, str]:
    """The inference interpreter that can hear the demo (None when none can), and why not."""
    if family.inference_gpt_width is not None:
        return None, (f"listening: the {family.name} demo's GPT is too small for the official {family.name} inference "
                      f"(its s2mel takes a {family.inference_gpt_width}-wide GPT); `indextts-train demo OUT "
                      "--family 2.5` ends by listening")
    named = os.environ.get(PYTHON_VARIABLE)
    try:
        return resolve_inference_python(family, Path(named) if named else None,
                                        named_by=f"{PYTHON_VARIABLE}={{}}"), ""
    except UserError as exc:
        return None, (f"listening skipped: {exc}; then run the demo into a new OUT_DIR to hear its checkpoints")


def listen_to_demo(out_dir: Path, family: Family, python: Path | None, why_not: str, *, wide: bool) -> int:
    """Hear the demo run's best and latest checkpoints; returns 0 (a demo that cannot listen says why)."""
    if python is None:
        print(why_not)
        return 0
    if not wide:
        print(f"listening skipped: {out_dir / 'models'} was made before an inference environment was found, at "
              "the tiny width official inference cannot take; run the demo into a new OUT_DIR to hear it")
        return 0
    model_dir = out_dir / "listen_model"
    if not (model_dir / "s2mel.pth").is_file():
        work = out_dir / "listen_work"
        write_tiny_inference_dir(model_dir, family, tokenizer=out_dir / "models" / family.tokenizer_name,
                                 inference_python=python, seed=0, work=work)
    asr = out_dir / "asr"
    if not (asr / "config.json").is_file():
        write_tiny_asr(asr)
    page, failed = listen(ListenOptions(run_dir=out_dir / "run", checkpoints="best,latest", asr_model=str(asr),
                                inference_python=python, model_dir=model_dir, device="cpu"))
    # scores.jsonl holds every failed line's reason; synthesis.log only a synthesis failure's (not a scoring one)
    failures = (f"; {failed} line(s) failed, why: {page.parent / 'scores.jsonl'} (a synthesis failure also in "
                f"{page.parent / 'synthesis.log'})" if failed else "")
    print(f"listen to the demo's checkpoints: {page} (tiny random models: they speak noise){failures}")
    return 0
