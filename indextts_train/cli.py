"""Command line: thin Typer wrappers over plain functions.

Every command turns a `UserError` into one line on stderr and exit code 2; tracebacks are left for
bugs. `train-gpt` is `indextts-train train`, with the flag names of the community train_gpt_v2.py so
existing scripts keep working.
"""

# No `from __future__ import annotations` here (nor in listen/command.py): Typer reads every command's
# annotations each time it builds the command line, and annotations kept as strings are evaluated
# anew each time, which made a build (paid once per command run, once per in-process test run) ~4x
# slower; evaluated once at definition, they are read as they are.
import inspect
import json
import sys
from enum import Enum
from pathlib import Path
from typing import Annotated, Any

import typer

from indextts_train import cli_flags
from indextts_train.cli_flags import NORMALIZER_HELP, ClickException, say_text_path, train_parameters
from indextts_train.config.settings import DEFAULT_CONFIG
from indextts_train.errors import UserError, disk_line, error_line, one_line, refusal
from indextts_train.listen.command import listen  # the command's module imports the work lazily
from indextts_train.prepare.utterance import MAX_SECONDS
from indextts_train.webui import AUTH_ENV

app = typer.Typer(add_completion=False, no_args_is_help=True, pretty_exceptions_enable=False, rich_markup_mode=None,
                  help="Fine-tune the IndexTTS2 / IndexTTS-2.5 GPT with an extended tokenizer; kill it anytime, resume exactly.")


def fail(message: str) -> None:
    """Bad input: one line on stderr, exit 2."""
    typer.echo(error_line(message), err=True)
    raise typer.Exit(2)


def run_guarded(fn, *args, **kwargs):
    """Call fn; a UserError becomes one line and exit 2 (an OSError the user must fix, a full disk or a path
    too long, is said by run_app for every command)."""
    try:
        return fn(*args, **kwargs)
    except UserError as exc:
        typer.echo(refusal(exc), err=True)
        raise typer.Exit(2) from None


def train(**values: Any) -> None:
    """Train the IndexTTS2 / IndexTTS-2.5 GPT. Exit 0 done, 2 bad input, 3 diverged, 130/143/129 stopped by
    Ctrl+C/SIGTERM/SIGHUP after a safe save."""
    from indextts_train.ui.run_settings import resolve_settings

    ctx = values.pop("ctx")
    # By name: Typer may carry its own copy of click, whose ParameterSource is another enum.
    typed = {name for name in values if getattr(ctx.get_parameter_source(name), "name", "") == "COMMANDLINE"}
    plain = {name: value.value if isinstance(value, Enum) else value for name, value in values.items()}
    settings = run_guarded(resolve_settings, typed=typed, **plain)  # refusals come before torch is loaded
    from indextts_train.train.loop import train as run_train

    raise typer.Exit(run_guarded(run_train, settings) or 0)


train.__signature__ = inspect.Signature(train_parameters())  # what Typer reads to build the command
train.__annotations__ = {p.name: p.annotation for p in train.__signature__.parameters.values()}
app.command("train", short_help="Train the GPT (the same as train-gpt).")(train)


@app.command(short_help="Demo data, tiny weights, train and export on CPU.")
def demo(
    out_dir: Annotated[Path, typer.Argument(help="Folder for the demo dataset, tokenizers, base checkpoint and run.")],
    max_steps: Annotated[int, typer.Option(min=1, max=1_000_000, help="Optimizer steps to train.")] = 150,
    resume: Annotated[str | None, typer.Option(help="'auto' continues the demo run in OUT_DIR/run where it stopped (a new OUT_DIR starts fresh); or a checkpoint path.")] = "auto",
    family: Annotated[str, typer.Option(help="Model family: 2 (IndexTTS2, SentencePiece) or 2.5 (IndexTTS-2.5, tiktoken).")] = "2",
    train_scope: Annotated[str, typer.Option(help="What trains: full, partial or lora (see `train --help`).")] = "full",
) -> None:
    """Make a small well-formed dataset (real base + Ethiopic-extended vocabulary), train on it, export, listen (docs/listen.md)."""
    from indextts_train.demo import run_demo

    raise typer.Exit(run_guarded(run_demo, out_dir, max_steps=max_steps, resume=resume, family=family,
                                 train_scope=train_scope) or 0)


PREPARE_EXTRA = ("transformers", "soundfile", "soxr", "safetensors", "huggingface_hub")


@app.command()
def prepare(
    corpus: Annotated[list[Path], typer.Argument(metavar="CORPUS", help="JSONL, LJSpeech metadata.csv, Common "
                                                 "Voice .tsv, a folder of audio with .txt/.lab transcripts, a lhotse "
                                                 "manifest or a Hugging Face dataset (Parquet, save_to_disk); several "
                                                 "may be mixed.")],
    model_dir: Annotated[Path, typer.Option(help="The official model folder (config.yaml, gpt.pth, ...).")],
    out: Annotated[Path, typer.Option(help="Output folder: arrays, utterances/train/val/rejected.jsonl, prepare.json.")],
    tokenizer: Annotated[Path | None, typer.Option(help="Tokenizer file (an extended one); default: the model folder's.")] = None,
    w2v_bert: Annotated[Path | None, typer.Option(help="facebook/w2v-bert-2.0 folder (HF layout).")] = None,
    semantic_codec: Annotated[Path | None, typer.Option(help="IndexTTS2: MaskGCT semantic_codec/model.safetensors.")] = None,
    campplus: Annotated[Path | None, typer.Option(help="IndexTTS-2.5: campplus_cn_common.bin.")] = None,
    download: Annotated[bool, typer.Option(help="Fetch missing hub files (size and licence printed first).")] = False,
    speaker: Annotated[str | None, typer.Option(help="Speaker for sources that name none.")] = None,
    language: Annotated[str | None, typer.Option(help="Language code for sources that name none (2.5 needs one).")] = None,
    text_column: Annotated[str | None, typer.Option(help="Hugging Face datasets: the transcript column [default: text, sentence, transcription, normalized_text or transcript].")] = None,
    device: Annotated[str | None, typer.Option(help="cpu, cuda, cuda:1 [default: the GPU when there is one].")] = None,
    batch_seconds: Annotated[float, typer.Option(min=0, max=MAX_SECONDS, help="Padded audio seconds per w2v-BERT batch (above 0).")] = 120.0,
    prompt_seconds: Annotated[float, typer.Option(min=0.1, max=MAX_SECONDS, help="Prompt features from the first seconds (as inference).")] = 15.0,
    min_seconds: Annotated[float, typer.Option(min=0, max=MAX_SECONDS, help="Shorter clips are rejected.")] = 0.5,
    max_seconds: Annotated[float | None, typer.Option(min=0, max=MAX_SECONDS, help="Longer clips are rejected (targets are never cut).")] = None,
    prompts_per_target: Annotated[int, typer.Option(min=1, max=10_000, help="Prompts of the same speaker per target.")] = 2,
    val_fraction: Annotated[float, typer.Option(min=0, max=1, help="Validation share, by a stable hash of the id.")] = 0.05,
    val_speakers: Annotated[int, typer.Option(min=0, max=1_000_000, help="Hold out this many whole speakers instead.")] = 0,
    seed: Annotated[int, typer.Option(min=0, max=2**64 - 1, help="Seed of the prompt choice.")] = 0,
    allow_unk: Annotated[bool, typer.Option(help="Keep texts with characters the tokenizer does not know.")] = False,
    workers: Annotated[int, typer.Option(min=1, max=256, help="Threads that load and resample audio ahead of the models.")] = 2,
    restart: Annotated[bool, typer.Option(help="Remove what prepare wrote in --out and start over.")] = False,
) -> None:
    """Audio clips + transcripts -> the arrays and manifests train-gpt reads. Exit 0 all kept, 1 some rejected, 2 none, 130/143/129 stopped."""
    import importlib.util

    missing = [name for name in PREPARE_EXTRA if importlib.util.find_spec(name) is None]
    if missing:
        fail(f"prepare needs {', '.join(missing)}: pip install 'indextts-train[prepare]'")
    from indextts_train.prepare.corpus import Defaults
    from indextts_train.prepare.models import Overrides
    from indextts_train.prepare.pairs import SplitRule
    from indextts_train.prepare.pipeline import PrepareOptions, run_prepare

    def build() -> PrepareOptions:
        return PrepareOptions(
            corpora=corpus, model_dir=model_dir, out=out, device=device,
            overrides=Overrides(w2v_bert=w2v_bert, semantic_codec=semantic_codec, campplus=campplus,
                                tokenizer=tokenizer),
            defaults=Defaults(speaker=speaker, language=language, text_column=text_column),
            split=SplitRule(val_fraction=val_fraction, val_speakers=val_speakers,
                            prompts_per_target=prompts_per_target, seed=seed),
            batch_seconds=batch_seconds, prompt_seconds=prompt_seconds, min_seconds=min_seconds,
            max_seconds=max_seconds, allow_unk=allow_unk, restart=restart, download=download, workers=workers)

    raise typer.Exit(run_guarded(lambda: run_prepare(build())))


@app.command(short_help="Losses of a checkpoint on manifests.")
def evaluate(
    checkpoint: Annotated[Path, typer.Option(help="Our checkpoint, a community checkpoint or a gpt.pth.")],
    manifest: Annotated[list[str], typer.Option(metavar="PATH", help="Manifest JSONL; repeatable.")],
    config: Annotated[Path | None, typer.Option(help="Config whose gpt: section built the checkpoint (default: the one stored in it; for a bare gpt.pth the official config.yaml beside it, else configs/indextts2.yaml).")] = None,
    batch_size: Annotated[int, typer.Option(min=1, max=65_536, help="Examples per batch, in manifest order. The model takes no padding mask (as the official one): mel losses move slightly with it; the run's micro-batch gives its validation's numbers.")] = 8,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
) -> None:
    """Losses of a checkpoint on a manifest (eval mode, token-weighted over the whole manifest)."""
    from indextts_train.checkpoint.verify import load_verified
    from indextts_train.data.corpus_forms import refuse_corpus
    from indextts_train.data.sampling import parse_manifest_specs
    from indextts_train.train.evaluate import evaluate_checkpoint

    # The one read; a missing, damaged or unsafe file stops here, in the checkpoint module's words
    # (loaders further down only know "a base checkpoint", so their wording would mislead).
    loaded = run_guarded(load_verified, checkpoint)
    specs = run_guarded(parse_manifest_specs, manifest, "--manifest", weights=False, labels=False)
    for spec in specs:  # a corpus for prepare is said as such
        run_guarded(refuse_corpus, spec.path, "--manifest")
    result = run_guarded(evaluate_checkpoint, checkpoint, [s.path for s in specs], config, batch_size=batch_size,
                         loaded=loaded)
    if as_json:
        typer.echo(json.dumps(result, indent=1))
    else:
        typer.echo(f"{checkpoint}: text_loss {result['text_loss']:.6f} mel_loss {result['mel_loss']:.6f} "
                   f"mel_top1 {result['mel_top1']:.6f} loss {result['loss']:.6f} ({result['samples']} samples)")


@app.command(short_help="COMPLETE, PARTIAL or INCOMPLETE, and why.")
def verify(
    checkpoint: Annotated[Path, typer.Argument(help="Checkpoint file to inspect.")],
    verbose: Annotated[bool, typer.Option("-v", "--verbose", help="Step, epoch, samples, vocab plan, precision, hyperparameters, sizes.")] = False,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
) -> None:
    """COMPLETE (exit 0: exact resume possible), PARTIAL (exit 1: weights only, says what is missing), INCOMPLETE (exit 2)."""
    from indextts_train.checkpoint.verify import verify_checkpoint

    verdict = verify_checkpoint(checkpoint)
    if as_json:
        typer.echo(json.dumps(verdict.to_dict(), indent=1, default=str))
    else:
        typer.echo(one_line(f"{checkpoint}: {verdict.status} ({verdict.kind})"))  # a name's line break escaped
        for reason in verdict.reasons:
            typer.echo(f"  - {one_line(reason)}")
        if verbose:
            for key, value in verdict.summary.items():
                typer.echo(f"  {key}: {value}")
    raise typer.Exit(verdict.exit_code)


@app.command(short_help="Every checkpoint of a run, in one table.")
def checkpoints(
    output_dir: Annotated[Path, typer.Argument(help="A run's --output-dir.")],
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
) -> None:
    """Every checkpoint of a run: step, epoch, val losses, status, size, which is latest/best/milestone."""
    from indextts_train.checkpoint.table import checkpoint_rows, render_table

    rows = run_guarded(checkpoint_rows, output_dir)
    typer.echo(json.dumps(rows, indent=1) if as_json else render_table(rows, output_dir))


@app.command(short_help="Bring a community or older checkpoint to this format.")
def repair(
    checkpoint: Annotated[Path, typer.Argument(help="Community or older checkpoint.")],
    output: Annotated[Path | None, typer.Option("-o", "--output", help="Write here (default: in place, after a .bak backup).")] = None,
    config: Annotated[Path | None, typer.Option(help="Config to record in the repaired checkpoint.")] = None,
    base_vocab: Annotated[int | None, typer.Option(min=1, max=cli_flags.MAX_VOCAB, help="Text tokens of the base vocabulary, kept frozen on resume (default: 12000 when an IndexTTS2 vocabulary is larger, as the community trainer froze them; else none).")] = None,
) -> None:
    """Bring a community/older checkpoint to this format so --resume accepts it (backup first)."""
    from indextts_train.checkpoint.repair import repair_checkpoint
    from indextts_train.checkpoint.verify import verify_checkpoint
    from indextts_train.config.settings import config_to_dict, load_config

    config_dict = config_to_dict(run_guarded(load_config, config)) if config else None  # a typo said first
    if verify_checkpoint(checkpoint).status == "COMPLETE":
        typer.echo(f"{checkpoint}: already COMPLETE; nothing to repair, nothing written")
        raise typer.Exit(0)
    path, notes = run_guarded(repair_checkpoint, checkpoint, output, config=config_dict, base_vocab=base_vocab)
    typer.echo(f"repaired checkpoint written to {path}")
    for note in notes:
        typer.echo(f"  - {note}")


@app.command("check-data", short_help="Check every manifest line before training.")
def check_data(
    manifest: Annotated[list[Path], typer.Argument(metavar="MANIFEST...", help="Manifest JSONL file(s).")],
    config: Annotated[Path | None, typer.Option(help="Config for shapes, vocab and length limits.")] = None,
    tokenizer: Annotated[Path | None, typer.Option(help="SentencePiece .model or .tiktoken: text ids must be below its size (2.5: and start with the language tag).")] = None,
    base_vocab: Annotated[int | None, typer.Option(min=1, max=cli_flags.MAX_VOCAB, help="Base vocabulary size, to report the share of extended tokens.")] = None,
    borrow_language: Annotated[list[str] | None, typer.Option(metavar="NEW=CODE", help="IndexTTS-2.5: NEW=CODE lets untagged language NEW use the row of CODE; repeatable.")] = None,
    normalizer: Annotated[str, typer.Option(help=NORMALIZER_HELP + " With --tokenizer, a line's text_ids must be its text (text / target_text) as inference encodes it.")] = "auto",
    strict_language: Annotated[bool, typer.Option(help="IndexTTS-2.5: refuse language codes the official table lacks instead of using its `common` row.")] = False,
    write_clean: Annotated[Path | None, typer.Option(help="Write a manifest of only the good lines here.")] = None,
    force: Annotated[bool, typer.Option("--force", help="Let --write-clean replace an existing file.")] = False,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
) -> None:
    """Check every line: fields, files, dtypes, shapes, id ranges, lengths, speakers. Exit 2 if any line is bad."""
    from indextts_train.data import checkdata

    limits, vocabulary, notes = checkdata.prepared_with(manifest, config, tokenizer)  # without --config: prepare.json's
    run_guarded(checkdata.check_flags_read, force=force, write_clean=write_clean, normalizer=normalizer,
                vocabulary=vocabulary, manifests=manifest)

    def run() -> dict:
        from indextts_train.config.settings import load_config
        from indextts_train.text.inference_text import TextPath
        from indextts_train.text.languages import parse_borrowed

        gpt_cfg = load_config(limits).gpt if limits else None
        borrowed = parse_borrowed(borrow_language)
        text_path = (TextPath.open(vocabulary, normalizer=normalizer, strict_language=strict_language,
                                   borrowed=borrowed) if vocabulary else None)
        report = checkdata.check_manifests(manifest, gpt_cfg=gpt_cfg,
                                           vocab_size=text_path.size if text_path else None,
                                           base_vocab=base_vocab, borrowed=borrowed, text_path=text_path)
        if write_clean is not None:
            report["clean_lines"] = checkdata.write_clean_manifest(report, write_clean, force=force)
        return report

    report = run_guarded(run)  # a refusal is its one line; what was checked against comes with a report
    for note in notes:
        typer.echo(note, err=True)
    typer.echo(json.dumps(report, indent=1, default=str) if as_json else checkdata.render_check_report(report))
    if write_clean is not None and not as_json:
        typer.echo(checkdata.clean_line(write_clean, report["clean_lines"]))
    if report["text"] and not as_json:
        for note in report["text"]["notes"]:
            typer.echo(f"warning: {note}", err=True)
    raise typer.Exit(2 if report["lines_bad"] else 0)


@app.command("check-tokenizer", short_help="Check an extended tokenizer against its base.")
def check_tokenizer(
    model: Annotated[Path, typer.Argument(help="SentencePiece .model or IndexTTS-2.5 .tiktoken ranks file to check.")],
    base: Annotated[Path | None, typer.Option(help="The base file it was extended from.")] = None,
    base_vocab: Annotated[int | None, typer.Option(min=1, max=cli_flags.MAX_VOCAB, help="Base vocabulary size, when the base model is not at hand (SentencePiece).")] = None,
    sample_text: Annotated[Path | None, typer.Option(help="Text file to measure coverage on (as official inference presents it).")] = None,
    normalizer: Annotated[str, typer.Option(help=NORMALIZER_HELP)] = "auto",
    language: Annotated[str | None, typer.Option(help="IndexTTS-2.5: language of --sample-text (its tag and case rule).")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
) -> None:
    """Vocab size, base ids kept, extended-piece coverage, duplicate or unreachable pieces."""
    from indextts_train.config.family import TIKTOKEN, family_of_tokenizer
    from indextts_train.text.inference_text import TextPath, check_normalizer_choice
    from indextts_train.text.tiktoken_vocab import check_tiktoken, render_tiktoken_report
    from indextts_train.text.tokenizer import check_tokenizer as run_check
    from indextts_train.text.tokenizer import render_tokenizer_report, tokenizer_exit_code

    tiktoken = family_of_tokenizer(model).tokenizer_kind == TIKTOKEN
    if language is not None and not tiktoken:
        fail("--language is for IndexTTS-2.5 .tiktoken files; IndexTTS2 text has no language tag")
    run_guarded(check_normalizer_choice, normalizer)  # a typo first: it is said even where nothing is normalised
    unread = next((f"{flag} {value}" for flag, value, default in (("--normalizer", normalizer, "auto"),
                   ("--language", language, None)) if sample_text is None and value != default), None)
    if unread:
        fail(f"{unread} is read to present --sample-text, and none is given: the flag would change nothing")
    if tiktoken:
        if base_vocab is not None:
            fail("--base-vocab is for SentencePiece models; for a .tiktoken file pass --base BASE.tiktoken")
        text_path = run_guarded(TextPath.open, model, normalizer=normalizer)

        def present(text: str) -> str:
            return text_path.present(text, language) if language is not None else text_path.present_body(text)

        report = run_guarded(check_tiktoken, model, base=base, sample_text=sample_text, present=present)
        if sample_text is not None:
            report["normalizer"] = text_path.normalizer_name
            report["warnings"] += text_path.notes()
        render = render_tiktoken_report
    else:
        report = run_guarded(run_check, model, base=base, base_vocab=base_vocab, sample_text=sample_text,
                             normalizer=normalizer)
        render = render_tokenizer_report
    typer.echo(json.dumps(report, indent=1, default=str) if as_json else render(report))
    raise typer.Exit(tokenizer_exit_code(report))


@app.command("extend-tokenizer", short_help="Grow a tokenizer with pieces from a corpus.")
def extend_tokenizer(
    base: Annotated[Path, typer.Option(help="Base SentencePiece .model or .tiktoken ranks file (its ids are kept).")],
    corpus: Annotated[list[Path], typer.Option(metavar="PATH", help="Text or JSONL ('text' field) file; repeatable.")],
    target_size: Annotated[int, typer.Option(min=1, max=10_000_000, help="Tokens in the extended vocabulary (>= base size; for .tiktoken: ranks + 1673 specials, the new number_text_tokens).")],
    output: Annotated[Path, typer.Option("-o", "--output", help="New .model (.vocab written beside it) or .tiktoken path.")],
    normalizer: Annotated[str, typer.Option(help=NORMALIZER_HELP)] = "auto",
    language: Annotated[str | None, typer.Option(help="IndexTTS-2.5: the corpus language; its case rule applies (zh/en/ja lower, es upper, others kept).")] = None,
    force: Annotated[bool, typer.Option("--force", help="Replace an existing --output (and the .vocab beside it).")] = False,
) -> None:
    """Learn new pieces (tiktoken: byte-pair merges) from the corpus as inference presents it, and append them to the base."""
    from indextts_train.config.family import TIKTOKEN, grown_tokenizer_family
    from indextts_train.text.inference_text import TextPath
    from indextts_train.text.tiktoken_vocab import extend_tiktoken
    from indextts_train.text.tokenizer import extend_tokenizer as run_extend

    if run_guarded(grown_tokenizer_family, base, output).tokenizer_kind == TIKTOKEN:
        text_path = run_guarded(TextPath.open, base, normalizer=normalizer)
        summary = run_guarded(extend_tiktoken, base, corpus, target_size, output,
                              lambda text: text_path.present_body(text, language), force=force)
        short = f"; the corpus gave only {summary['added']} merges" if summary["short_by"] else ""
        typer.echo(f"{summary['said']} ({summary['base_ranks']} base ranks + {summary['added']} new = "
                   f"{summary['new_ranks']} ranks, {summary['new_size']} tokens with the specials{short}; "
                   f"special ids move up by {summary['added']})")
        notes = text_path.notes()
        if language is None:
            notes.append("no --language: the corpus kept its case; inference lower-cases zh/en/ja and upper-cases "
                         "es, so pass --language CODE for those")
        say_text_path(text_path.normalizer_name, notes)
        return
    if language is not None:
        fail("--language is for IndexTTS-2.5 .tiktoken files; IndexTTS2 upper-cases every language")
    summary = run_guarded(run_extend, base, corpus, target_size, output, normalizer=normalizer, force=force)
    typer.echo(f"{summary['said']} ({summary['base_size']} base + {summary['added']} new = {summary['new_size']} pieces)")
    say_text_path(summary["normalizer"], summary["warnings"])


@app.command()
def tokenize(
    manifest: Annotated[list[Path], typer.Argument(help="Manifest JSONL file(s) whose lines carry their text (text / target_text / prompt_text).")],
    tokenizer: Annotated[Path, typer.Option(help="SentencePiece .model (IndexTTS2) or .tiktoken (IndexTTS-2.5) to encode with.")],
    out: Annotated[Path, typer.Option(help="New folder for the re-encoded manifests and text-id arrays (the originals stay untouched).")],
    normalizer: Annotated[str, typer.Option(help=NORMALIZER_HELP)] = "auto",
    strict_language: Annotated[bool, typer.Option(help="IndexTTS-2.5: refuse language codes the official table lacks instead of using its `common` row.")] = False,
    borrow_language: Annotated[list[str] | None, typer.Option(help="IndexTTS-2.5: NEW=CODE encodes language NEW with the tag of CODE; repeatable.")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
) -> None:
    """Re-encode the text of manifest lines as inference does (run it after extend-tokenizer). Exit 1 when some lines cannot be encoded, 2 when none can."""
    from indextts_train.data.retokenize import render_tokenize_report, tokenize_exit_code, tokenize_manifests
    from indextts_train.text.languages import parse_borrowed

    borrowed = run_guarded(parse_borrowed, borrow_language)
    report = run_guarded(tokenize_manifests, manifest, tokenizer, out, normalizer=normalizer,
                         strict_language=strict_language, borrowed=borrowed)
    typer.echo(json.dumps(report, indent=1) if as_json else render_tokenize_report(report))
    if not as_json:
        say_text_path(report["normalizer"], report["notes"])
    raise typer.Exit(tokenize_exit_code(report))


Pick = Enum("Pick", {name: name for name in ("best", "latest", "cer", "speaker_sim")}, type=str)  # export --pick
app.command(short_help="Synthesize, transcribe and score lines from checkpoints.")(listen)


@app.command(short_help="Write the gpt.pth + config.yaml inference loads.")
def export(
    checkpoint: Annotated[Path, typer.Argument(help="Training checkpoint (ours, community or gpt.pth), or a run's --output-dir (then --pick).")],
    output: Annotated[Path, typer.Option("-o", "--output", help="The gpt.pth to write, as IndexTTS2 / IndexTTS-2.5 inference loads it.")],
    config_out: Annotated[Path | None, typer.Option(help="Also write an IndexTTS2 config.yaml with the new number_text_tokens.")] = None,
    config: Annotated[Path | None, typer.Option(help="Base IndexTTS2 config.yaml to update (default: the config stored in the checkpoint).")] = None,
    tokenizer_name: Annotated[str | None, typer.Option(help="IndexTTS2: the tokenizer's file name in config.yaml (dataset.bpe_model) and of the --tokenizer copy [default: bpe.model]. IndexTTS-2.5 opens a fixed name.")] = None,
    dtype: Annotated[str, typer.Option(help="float32, float16 or bfloat16.")] = "float32",
    pick: Annotated[Pick | None, typer.Option(help="In a run folder: best.pth or latest.pth, or the checkpoint `listen` scored best: cer (lowest) or speaker_sim (highest) [default: best.pth, else latest.pth].")] = None,
    tokenizer: Annotated[Path | None, typer.Option(help="The tokenizer the run trained with, copied beside the export: IndexTTS-2.5's .tiktoken as multilingual_zh_ja_yue_char_del.tiktoken (required when the run grew the vocabulary), IndexTTS2's .model as --tokenizer-name.")] = None,
    adapters_out: Annotated[Path | None, typer.Option(help="--train-scope lora checkpoints: also write the adapters alone (with the heads/text rows the run trained and the sha256 of the base weights they apply to).")] = None,
    force: Annotated[bool, typer.Option("--force", help="Replace existing output files (never a training checkpoint).")] = False,
) -> None:
    """Write the gpt.pth IndexTTS2 / IndexTTS-2.5 inference loads (full official key set, extended text rows, LoRA merged)."""
    from indextts_train.checkpoint.export import export_checkpoint, export_source

    source, why = run_guarded(export_source, checkpoint, pick.value if pick else None)
    summary = run_guarded(export_checkpoint, source, output, config_out=config_out, base_config=config,
                          tokenizer_name=tokenizer_name, dtype=dtype, tokenizer=tokenizer,
                          adapters_out=adapters_out, force=force)
    origin = summary["provenance"]
    typer.echo(f"exported {source}{f' ({origin})' if origin else ''}{f'; --pick: {why}' if why else ''}")
    family = f" ({summary['family']} layout)" if summary["family"] != "IndexTTS2" else ""
    typer.echo(f"wrote {output}: {summary['tensors']} tensors, text rows {summary['text_rows']} "
               f"(number_text_tokens {summary['text_rows'] - 1}), {summary['dtype']}{family}")
    if summary["tokenizer"]:
        typer.echo(f"wrote {summary['tokenizer']}")
    for note in summary["notes"]:
        typer.echo(f"note: {note}")
    for extra in (config_out, adapters_out):
        if extra:
            typer.echo(f"wrote {extra}")


@app.command(short_help="What auto mode picks here or on a named GPU.")
def hardware(
    config: Annotated[Path, typer.Option(help="Config to size the estimate for.")] = DEFAULT_CONFIG,
    assume: Annotated[str | None, typer.Option(help="Plan for a named GPU instead of this machine: A100-80GB, A100-40GB, H100-80GB, H200, L4, V100-16GB, V100-32GB, T4, RTX-4090, RTX-3090, A10G, L40S, RTX-A6000; or any GPU as MEMORY@CAPABILITY, e.g. 24GiB@8.9.")] = None,
    effective_batch_size: Annotated[int | None, typer.Option(min=1, max=1 << 24, help="Effective batch (default: the config's).")] = None,
    grad_checkpointing: Annotated[bool | None, typer.Option("--grad-checkpointing/--no-grad-checkpointing", help="Plan with activation checkpointing (default: the config's).")] = None,
    train_scope: Annotated[cli_flags.choices_of("train_scope") | None, typer.Option(help="What trains: full, partial or lora; gradients and AdamW state count only for those tensors (default: the config's train.train_scope).")] = None,
    tokenizer: Annotated[Path | None, typer.Option(help="The run's --tokenizer: the model has its text rows (default: the config's gpt.number_text_tokens).")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
) -> None:
    """What auto mode picks on this machine (or an assumed GPU), and why."""
    from indextts_train.train.plan import command_plan

    given = {"effective_batch_size": effective_batch_size, "activation_checkpointing": grad_checkpointing,
             "train_scope": train_scope and train_scope.value}
    plan = run_guarded(command_plan, config, assume, given, tokenizer)
    typer.echo(json.dumps(plan.to_dict(), indent=1) if as_json else plan.describe())


@app.command(short_help="The training page in the browser.")
def webui(
    host: Annotated[str, typer.Option(help="Address to listen on (0.0.0.0: every interface).")] = "127.0.0.1",
    port: Annotated[int, typer.Option(min=1, max=65535, help="Port to listen on.")] = 7860,
    share: Annotated[bool, typer.Option(help="Also publish a public gradio.live link (needs --auth).")] = False,
    auth: Annotated[str | None, typer.Option(envvar=AUTH_ENV, show_envvar=True, help="USER:PASS asked by the page (required with --share); set it in the environment variable: on the command line other users see it (ps).")] = None,
    root: Annotated[list[Path] | None, typer.Option(help="A folder the page may read and write in (every path it is given must resolve inside one); repeatable [default: the current folder].")] = None,
    no_auth_on_network: Annotated[bool, typer.Option("--no-auth-on-network", help="Serve a --host other machines can reach without --auth: anyone who reaches the port can start runs.")] = False,
) -> None:
    """The training page in the browser: set up, start, watch, stop, resume, export (pip install 'indextts-train[webui]')."""
    from indextts_train.webui import serve

    raise typer.Exit(run_guarded(serve, host, port, share=share, auth=auth, roots=root,
                                 no_auth_on_network=no_auth_on_network) or 0)


def run_app(command: typer.Typer, args: list[str] | None = None) -> int:
    """Run `command` as its entry point does and return the exit code.

    Click prints a usage error (an unknown flag, `--seed 1e20` for an integer) as a usage block; here
    it is one line on stderr like every other refusal, with the same exit code 2.
    """
    bad = cli_flags.unusable_argument(sys.argv[1:] if args is None else args)
    if bad:
        typer.echo(error_line(bad), err=True)
        return 2
    from indextts_train.cli_flags import empty_output, folder_for_a_file, plain_help, refused_usage
    given = sys.argv[1:] if args is None else args  # plain help and refusals, in one line each
    if empty_output(given) or folder_for_a_file(given):
        return 2
    try:
        code = plain_help(command)(args=args, standalone_mode=False)
    except ClickException as exc:
        typer.echo(refused_usage(exc, given), err=True)
        return exc.exit_code
    except typer.Abort:  # Ctrl+C outside a command's own handling
        typer.echo("Aborted!", err=True)
        return 130
    except OSError as exc:  # a path too long, a full or read-only disk, in a command that does not say it itself
        line = disk_line(exc)
        if line is None:
            raise
        typer.echo(error_line(line), err=True)
        return 2
    return code if isinstance(code, int) else 0


def main() -> None:
    """`indextts-train` entry point."""
    sys.exit(run_app(app))


def train_gpt_main() -> None:
    """`train-gpt` entry point: the train command alone, with the community flag names."""
    single = typer.Typer(add_completion=False, pretty_exceptions_enable=False, rich_markup_mode=None)
    single.command()(train)
    sys.exit(run_app(single))


if __name__ == "__main__":  # `python -m indextts_train.cli ...` (torchrun -m takes it) ran nothing, exit 0: it is
    __import__("runpy").run_module("indextts_train", run_name="__main__")  # `python -m indextts_train ...`
