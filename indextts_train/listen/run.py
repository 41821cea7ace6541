"""`indextts-train listen RUN`: every chosen checkpoint speaks the lines through the official inference
code, and each WAV is transcribed and scored.

Everything that can be wrong with the input is found before anything is written: the lines, the
checkpoints (COMPLETE), the model folder, the inference environment, the ASR model. Then, per
checkpoint in step order: a temporary official model folder (RUN/listen/.model-PID, removed after),
the missing lines synthesized into RUN/listen/step{N}/ (wav_folder), each scored and appended to
scores.jsonl, TensorBoard (RUN/logs/listen) and index.html updated. A rerun hears only the
(checkpoint, line) pairs without a score, so a killed listen loses nothing and redoes nothing
scored; lines are seeded one by one (synthesize.line_seed), so the WAVs do not depend on which
lines were spoken together.
"""

from __future__ import annotations

import os
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path

from indextts_train import __version__
from indextts_train.checkpoint.scores import (
    LISTEN_DIR,
    RECORD_FORMAT,
    Heard,
    append_record,
    check_scores_file,
    is_scored,
    read_records,
    scored_keys,
    scores_path,
)
from indextts_train.config.family import Family
from indextts_train.config.settings import load_config
from indextts_train.distributed import DistInfo
from indextts_train.errors import UserError
from indextts_train.files.bounded import load_yaml
from indextts_train.listen.asr import DEFAULT_ASR_MODEL, Recogniser, load_recogniser
from indextts_train.listen.board import ListenBoard
from indextts_train.listen.choose import Chosen, choose_checkpoints, model_dir_of, run_inputs
from indextts_train.listen.lines import Line, check_audio, default_lines, read_lines_file
from indextts_train.listen.lock import ListenLock
from indextts_train.listen.model_folder import MARKER, check_inference_folder, make_model_folder
from indextts_train.listen.page import check_page, write_page
from indextts_train.listen.score import Voice, find_campplus, score_wav
from indextts_train.listen.synthesize import SynthesisLine, SynthesisResult, resolve_inference_python, synthesize
from indextts_train.text.vocab import tokenizer_size
from indextts_train.ui.run_record import RECORD_NAME

MODEL_FOLDER = ".model-"  # RUN/listen/.model-PID: each process's temporary official folder (links + the export)


@dataclass
class ListenOptions:
    run_dir: Path
    checkpoints: str = "all"
    lines: Path | None = None
    asr_model: str = DEFAULT_ASR_MODEL
    inference_python: Path | None = None
    model_dir: Path | None = None
    device: str = "auto"
    seed: int = 0
    say: object = print  # where progress lines go


@dataclass
class Plan:
    """What was checked before any work, and what is left to do."""

    lines: list[Line]
    todo: list[tuple[Chosen, list[Line]]]
    model_dir: Path
    family: Family
    device: str
    python: Path | None = None  # resolved only when there is something to hear
    recogniser: Recogniser | None = None
    notes: list[str] = field(default_factory=list)
    chosen: list[Chosen] = field(default_factory=list)  # the checkpoints to hear, heard or not
    failed: int = 0  # lines whose synthesis or scoring failed (recorded; a rerun tries them again)
    folders: dict[int, str] = field(default_factory=dict)  # step -> its WAVs' folder under RUN/listen (wav_folder)
    records: list[dict] = field(default_factory=list)  # scores.jsonl as read, and what this listen appends to it


def resolve_device(device: str) -> str:
    """auto: the first GPU when there is one, else the CPU. A named device is checked before any model loads
    (a typo, or cuda on a machine without one, ended in a traceback inside the ASR pipeline)."""
    import torch

    from indextts_train.prepare.pipeline import check_device_name, pick_device  # prepare's rule, its models'

    if device == "auto":
        return "cuda:0" if torch.cuda.is_available() else "cpu"
    check_device_name(device)
    return str(pick_device(device, DistInfo()))


def wav_folder(step: int, branch: str | None, records: list[dict]) -> str:
    """The folder of a checkpoint's WAVs under RUN/listen: step{N}, or step{N}.{branch} when records of another
    branch's file of that step are there: after a rollback the new branch's WAVs replaced the abandoned file's,
    which its records still name. (A branch is a plain name: state.Lineage refuses any other.)"""
    other = branch is not None and any(r["step"] == step and r.get("branch") not in (None, branch) for r in records)
    return f"step{step}.{branch}" if other else f"step{step}"


def check_folders(run_dir: Path, names: list[str]) -> None:
    """RUN/listen and the step folders the WAVs go into: none yet, or folders of their own. A file there (a
    traceback once, after the checkpoint was heard) or a link (the WAVs would replace files elsewhere) is refused."""
    listen_dir = run_dir / LISTEN_DIR
    for folder in [listen_dir, *(listen_dir / name for name in names)]:
        if folder.is_symlink() or (folder.exists() and not folder.is_dir()):
            raise UserError(f"{folder}: is {'a link' if folder.is_symlink() else 'not a folder'}, and listen writes "
                            "only into folders of its own there; move it aside and rerun")
        if folder == listen_dir and not folder.exists():
            return  # none of its step folders either


def check_families(chosen: list[Chosen], family: Family, model_dir: Path) -> None:
    """Each checkpoint is of the model folder's family: the export into that folder refused it only after the
    work began (a temporary folder left behind), advising a --config that listen does not have."""
    for c in chosen:
        if c.family is not None and c.family != family.name:
            raise UserError(f"{c.path} is an {c.family} checkpoint, but the model folder {model_dir} is "
                            f"{family.name} (its config.yaml); pass --model-dir with the {c.family} model folder "
                            "the run was trained from")


def check_tokenizer(run_dir: Path, chosen: list[Chosen]) -> None:
    """The tokenizer run.yaml names (each checkpoint is exported with it) is there and has each checkpoint's
    tokens: otherwise the export fell back to the model folder's base vocabulary (or read another), failed
    after the work began, and advised a --tokenizer that listen does not have."""
    tokenizer = run_inputs(run_dir)["tokenizer"]
    if tokenizer is None:
        return
    where = f"{run_dir / RECORD_NAME}: the run trained with the tokenizer {tokenizer}"
    if not tokenizer.is_file():
        raise UserError(f"{where}, which is not there any more (listen exports each checkpoint with it); put it back "
                        "at that path")
    size = _tokenizer_tokens(tokenizer)
    odd = next((c for c in chosen if None not in (size, c.tokens) and c.tokens != size), None)
    if odd is not None:
        raise UserError(f"{where}, which has {size} tokens now, but {odd.path} has {odd.tokens}; put the tokenizer "
                        "the run trained with back at that path")


def _tokenizer_tokens(path: Path) -> int | None:
    """How many tokens a tokenizer file holds; None when it cannot be read (the export then says why)."""
    try:
        return tokenizer_size(path)  # either family's (text/vocab.py)
    except (UserError, OSError, ValueError):
        return None


def check_line_ids(run_dir: Path, lines: list[Line], records: list[dict], lines_file: Path | None) -> None:
    """A line id names a line's WAVs and scores in every checkpoint: one heard before with another text, language
    or prompt was taken as heard, so the new line was never spoken (--lines files number their lines line001,
    ... alike), and its scores were compared with the old line's."""
    heard: dict[str, dict] = {}
    for record in records:
        if is_scored(record):
            heard.setdefault(str(record.get("line_id")), record)
    for line in lines:
        before = heard.get(line.line_id)
        if before is None or _same_line(before, line):
            continue
        where = f"--lines {lines_file}" if lines_file else "the run's validation lines"
        raise UserError(f"{where}: line id {line.line_id!r} was heard before with another text, language or prompt "
                        f"({str(before.get('text'))[:60]!r}, {scores_path(run_dir)}); give this line an 'id' of its "
                        f"own in a --lines file, or move {run_dir / LISTEN_DIR} aside to start over")


def _same_line(record: dict, line: Line) -> bool:
    prompt = record.get("prompt_audio")  # a path as typed then: the same file may be named from another folder
    return (record.get("text") == line.text and record.get("language") == line.language
            and isinstance(prompt, str) and Path(prompt).name == line.prompt_audio.name)


def plan(options: ListenOptions) -> Plan:
    """Every input checked, the ASR model loaded (one UserError line for the first problem); nothing written."""
    run_dir = options.run_dir
    chosen, notes = choose_checkpoints(run_dir, options.checkpoints)
    lines = read_lines_file(options.lines) if options.lines else default_lines(run_dir, options.seed)
    model_dir = model_dir_of(run_dir, options.model_dir)
    family = load_config(model_dir / "config.yaml").gpt.family  # no version: IndexTTS2
    check_inference_folder(model_dir, family)
    check_families(chosen, family, model_dir)
    check_tokenizer(run_dir, chosen)
    records = read_records(scores_path(run_dir))  # none from a file that is not ours (refused below)
    folders = {c.step: wav_folder(c.step, c.branch, records) for c in chosen}
    check_folders(run_dir, list(folders.values()))
    check_scores_file(scores_path(run_dir))
    check_page(run_dir)
    check_audio(lines, options.lines)
    check_line_ids(run_dir, lines, records, options.lines)
    todo = _unheard(chosen, lines, records)
    work = Plan(lines, todo, model_dir, family, resolve_device(options.device), notes=notes, folders=folders,
                chosen=chosen, records=records)
    if todo and find_campplus(model_dir) is None:  # said up front: the records, the table and --pick lacked it
        work.notes.append(f"no CAMPPlus weights (campplus_cn_common.bin) in {model_dir / 'hf_cache'} nor the Hugging "
                          "Face cache: speaker similarity is not scored; put the file there to score it")
    if todo:  # the inference environment first: a few seconds, where the ASR model may be gigabytes to fetch
        work.python = resolve_inference_python(family, options.inference_python, say=options.say)
        work.recogniser = load_recogniser(options.asr_model, work.device)
    return work


def _unheard(chosen: list[Chosen], lines: list[Line], records: list[dict]) -> list[tuple[Chosen, list[Line]]]:
    """Each checkpoint with the lines it has no score for yet (a rollback's new files are not heard yet)."""
    done = scored_keys(records, {c.step: c.branch for c in chosen})
    return [(c, missing) for c in chosen if (missing := [ln for ln in lines if (c.step, ln.line_id) not in done])]


def listen(options: ListenOptions) -> tuple[Path, int]:
    """Hear, score and record every chosen checkpoint; returns (RUN/listen/index.html, how many lines failed)."""
    say = options.say
    work = plan(options)
    for note in work.notes:
        say(f"note: {note}")
    lock = ListenLock(options.run_dir)
    if work.todo and lock.acquire(say):  # waited for another listen: what it heard meanwhile is not heard again
        work.records = read_records(scores_path(options.run_dir))
        work.todo = _unheard(work.chosen, work.lines, work.records)
    board = None
    try:
        _remove_stale_folders(options.run_dir / LISTEN_DIR)
        if not work.todo:
            say(f"every chosen checkpoint was already heard ({len(work.lines)} lines); nothing to do")
        board = ListenBoard(options.run_dir, say) if work.todo else None
        for chosen, missing in work.todo:
            _hear(options, work, chosen, missing, board)
            write_page(options.run_dir)  # after each checkpoint: the page is worth opening while the rest runs
    finally:
        if board is not None:
            board.close()
        lock.release()
    return write_page(options.run_dir), work.failed


def _synthesis_lines(listen_dir: Path, name: str, lines: list[Line]) -> list[SynthesisLine]:
    folder = listen_dir / name
    folder.mkdir(parents=True, exist_ok=True)
    for stale in folder.glob(".*.tmp.wav"):  # a WAV half-written by an inference child that was killed
        pid = stale.name.removesuffix(".tmp.wav").rpartition(".")[2]  # child_infer's `.LINE.PID.tmp.wav`
        if pid.isdigit() and not _alive(int(pid)) and not stale.is_symlink():
            stale.unlink(missing_ok=True)
    return [SynthesisLine(line.line_id, line.text, line.prompt_audio, folder / f"{line.line_id}.wav", line.language)
            for line in lines]


def _speak(options: ListenOptions, work: Plan, chosen: Chosen,
           lines: list[Line]) -> tuple[list[SynthesisResult], int | None]:
    """Synthesize `lines` from one checkpoint: (the results, the GPT's width, from the exported config)."""
    listen_dir = options.run_dir / LISTEN_DIR
    folder = listen_dir / f"{MODEL_FOLDER}{os.getpid()}"
    wavs = work.folders.get(chosen.step, f"step{chosen.step}")  # the folder its WAVs go into (wav_folder)
    try:  # a failed export is removed too: only a killed listen leaves the folder (for the next one to remove)
        make_model_folder(chosen.path, work.model_dir, folder, tokenizer=_tokenizer(options.run_dir))
        width = (load_yaml(folder / "config.yaml", "the exported config.yaml").get("gpt") or {}).get("model_dim")
        results = synthesize(folder, work.family, _synthesis_lines(listen_dir, wavs, lines), seed=options.seed,
                             device=work.device, inference_python=work.python, log_path=listen_dir / "synthesis.log")
    finally:
        if not folder.is_symlink() and (folder / MARKER).is_file():  # a link is never ours (model_folder._clear)
            shutil.rmtree(folder)
    return results, width


def _remove_stale_folders(listen_dir: Path) -> None:
    """The temporary folders of listen processes that were killed (ours: they carry the marker)."""
    for folder in listen_dir.glob(f"{MODEL_FOLDER}*"):
        pid = folder.name[len(MODEL_FOLDER):]
        ours = not folder.is_symlink() and (folder / MARKER).is_file()
        if pid.isdigit() and int(pid) != os.getpid() and ours and not _alive(int(pid)):
            shutil.rmtree(folder, ignore_errors=True)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _tokenizer(run_dir: Path) -> Path | None:
    tokenizer = run_inputs(run_dir)["tokenizer"]
    return tokenizer if tokenizer is not None and tokenizer.is_file() else None


def _hear(options: ListenOptions, work: Plan, chosen: Chosen, lines: list[Line], board: ListenBoard) -> None:
    say, recogniser = options.say, work.recogniser
    say(f"step {chosen.step} ({chosen.path.name}): synthesizing {len(lines)} line(s) with the official "
        f"{load_config(work.model_dir / 'config.yaml').gpt.family.name} inference on {work.device}")
    started = time.monotonic()
    results, width = _speak(options, work, chosen, lines)
    synthesis_s = time.monotonic() - started
    voice = _voice(work)
    common = {"format": RECORD_FORMAT, "step": chosen.step, "checkpoint": chosen.path.name, "branch": chosen.branch,
              "seed": options.seed,
              "family": work.family.key, "device": work.device, "gpt_model_dim": width,
              "asr": recogniser.label, "speaker_model": voice.label if voice else None,
              "indextts_train": __version__}
    by_id = {line.line_id: line for line in lines}
    records = []
    for result in results:
        record = common | by_id[result.line_id].record() | _scored(result, by_id[result.line_id], recogniser, voice)
        append_record(scores_path(options.run_dir), record)
        board.line(record, result.out_wav)
        records.append(record)
        work.failed += not record["ok"]
    work.records += records  # the file as it is now (this listen holds its lock): read once, not per checkpoint
    board.checkpoint(chosen.step, Heard(work.records).summary(chosen.step, chosen.branch))  # every line heard
    say(_summary_line(chosen.step, records, synthesis_s, time.monotonic() - started - synthesis_s))


def _voice(work: Plan) -> Voice | None:
    """CAMPPlus from the model folder (the official code fetches it into hf_cache/ for IndexTTS2), if present."""
    path = find_campplus(work.model_dir)
    return Voice.load(path, work.device) if path is not None else None


def _scored(result: SynthesisResult, line: Line, recogniser: Recogniser, voice: Voice | None) -> dict:
    base = {"wav": f"{result.out_wav.parent.name}/{result.out_wav.name}", "ok": result.ok,
            "error": result.error, "line_seed": result.seed, "synthesis_seconds": round(result.seconds, 3),
            "inference": result.versions, "scored_at": time.strftime("%Y-%m-%dT%H:%M:%S%z")}
    if not result.ok:
        return base
    try:
        return base | score_wav(line, result.out_wav, recogniser, voice)
    except Exception as exc:  # an unreadable WAV or an ASR failure is this line's failure, not the run's
        return base | {"ok": False, "error": f"scoring failed: {type(exc).__name__}: {str(exc)[:300]}"}


def _summary_line(step: int, records: list[dict], synthesis_s: float, scoring_s: float) -> str:
    ok = [r for r in records if r.get("ok")]
    parts = [f"step {step}: {len(ok)}/{len(records)} line(s) scored"]
    for key, name in (("cer", "CER"), ("speaker_sim", "speaker similarity")):
        values = [r[key] for r in ok if isinstance(r.get(key), (int, float))]
        if values:
            parts.append(f"{name} {sum(values) / len(values):.3f}")
    failed = next((r["error"] for r in records if not r.get("ok")), None)
    text = ", ".join(parts) + f" (synthesis {synthesis_s:.1f} s, scoring {scoring_s:.1f} s)"
    return text + (f"; first failure: {failed}" if failed else "")
