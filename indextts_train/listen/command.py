"""The `indextts-train listen` command (registered in cli.py; kept here so the command line stays thin)."""

# Annotations evaluated at definition, not kept as strings: see the note atop cli.py.
from pathlib import Path
from typing import Annotated

import typer

from indextts_train.errors import UserError, refusal
from indextts_train.listen.asr import DEFAULT_ASR_MODEL


def listen(
    run_dir: Annotated[Path, typer.Argument(help="A run's --output-dir.")],
    checkpoints: Annotated[str, typer.Option(help="Which checkpoints: comma list of best, latest, stepN, all.")] = "all",
    lines: Annotated[Path | None, typer.Option(help="JSONL of {text, prompt_audio, language?, reference_audio?, id?} lines [default: a fixed seeded choice from the run's validation manifests, per language].")] = None,
    asr_model: Annotated[str, typer.Option(help="Speech recogniser: a Hugging Face id or a local folder (Whisper, or MMS/wav2vec2 CTC; see docs/listen.md).")] = DEFAULT_ASR_MODEL,
    inference_python: Annotated[Path | None, typer.Option(help="Python of the environment with the official inference package [default: this one].")] = None,
    model_dir: Annotated[Path | None, typer.Option(help="The official model folder the run was trained from [default: the one prepare.json names].")] = None,
    device: Annotated[str, typer.Option(help="auto, cpu, cuda or cuda:N: where synthesis and scoring run.")] = "auto",
    seed: Annotated[int, typer.Option(min=0, max=2**32 - 1, help="Seed of the default line choice and of each line's synthesis.")] = 0,
) -> None:
    """Synthesize fixed lines from checkpoints with the official inference code, transcribe and score them;
    RUN/listen/scores.jsonl and index.html. A rerun hears only what has no score yet. Exit 0, 1 when a line
    failed, 2 bad input."""
    from indextts_train.listen.run import ListenOptions
    from indextts_train.listen.run import listen as run_listen

    options = ListenOptions(run_dir=run_dir, checkpoints=checkpoints, lines=lines, asr_model=asr_model,
                            inference_python=inference_python, model_dir=model_dir, device=device, seed=seed,
                            say=lambda line: typer.echo(line))
    try:
        page, failed = run_listen(options)
    except UserError as exc:
        typer.echo(refusal(exc), err=True)
        raise typer.Exit(2) from None
    typer.echo(f"wrote {page}")
    if failed:  # exit 1: --listen-every turns it into a warning in train.log
        typer.echo(f"{failed} line(s) failed (why: {', '.join(map(str, _why(page.parent)))}); a rerun tries them "
                   "again", err=True)
        raise typer.Exit(1)


def _why(listen_dir: Path) -> list[Path]:
    """Where a failure is told: scores.jsonl, and synthesis.log when listen could write it (a link or a FIFO
    in its place is left as it is, and holds nothing of this run: naming it sent the user to a file without it)."""
    from indextts_train.files.atomic import own_file_problem

    log = listen_dir / "synthesis.log"
    return [listen_dir / "scores.jsonl"] + ([log] if log.is_file() and own_file_problem(log) is None else [])
