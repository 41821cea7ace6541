"""`indextts-train export`: the gpt.pth IndexTTS2 / IndexTTS-2.5 inference loads, plus a matching config.yaml.

IndexTTS2's release loader calls `load_state_dict(strict=True)` on `UnifiedVoice(**cfg.gpt)`, so the
file must hold exactly the official keys in their shapes, and the shipped config must say
`number_text_tokens = text rows - 1` or the extended rows do not fit. IndexTTS-2.5's loader is not
strict: a misnamed tensor would load silently as random weights, so the file holds exactly the 2.5
key set of `layout.official_shapes`. Stock 2.5 inference reads its vocabulary from
`<model_dir>/multilingual_zh_ja_yue_char_del.tiktoken`, so a grown `.tiktoken` is written beside the
export under that name. A --train-scope lora checkpoint is exported with its adapters merged into
the plain weights (base.load_base_checkpoint); `adapters_out` also writes the adapters alone, with
what they apply to.
"""

from __future__ import annotations

import contextlib
import copy
import json
import os
from pathlib import Path

import torch
import yaml

from indextts_train.checkpoint.base import load_base_checkpoint
from indextts_train.checkpoint.export_targets import check_targets
from indextts_train.checkpoint.files import BEST, LATEST, config_for, failure_reason
from indextts_train.checkpoint.run_folder import runs_inside, same_file
from indextts_train.checkpoint.scores import SUMMARY_KEYS, pick_scored
from indextts_train.checkpoint.verify import load_verified
from indextts_train.config.family import TIKTOKEN, Family, family_of_tokenizer
from indextts_train.config.run_inputs import config_beside
from indextts_train.config.schema import is_int
from indextts_train.config.scope_settings import scope_settings
from indextts_train.config.settings import Config, config_from_dict, gpt_to_dict
from indextts_train.errors import UserError
from indextts_train.files.atomic import Writer, atomic_write_bytes, atomic_write_text, fsync_dir, stale_temps, temp_name
from indextts_train.files.bounded import (
    MAX_TOKENIZER_BYTES,
    check_file,
    json_or_none,
    kind_of_path,
    load_yaml,
    read_bounded,
)
from indextts_train.files.faults import crash_point
from indextts_train.files.targets import writer_gone
from indextts_train.model.layout import official_shapes, trained_keys
from indextts_train.model.lora import adapter_file, record_spec
from indextts_train.model.scope import is_trainable, text_rows_trainable
from indextts_train.text.languages import borrow_notes
from indextts_train.text.tiktoken_vocab import read_tiktoken
from indextts_train.text.vocab import VocabPlan, tokenizer_size

DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}
# Sections IndexTTS inference reads besides gpt: (the semantic codec, the s2mel stage, the vocoder).
INFERENCE_SECTIONS = ("semantic_codec", "s2mel")
MAX_MARKER_BYTES = 1 << 16  # a publishing marker lists a few paths


def export_source(checkpoint: Path, pick: str | None) -> tuple[Path, str | None]:
    """The file to export: `checkpoint` itself, or in a run folder best.pth or latest.pth (`pick`), or the
    model_step file that scored best in `listen` (`pick` cer or speaker_sim); with why it was picked (None: asked
    for by name).

    A folder without `pick` gives best.pth, or latest.pth when the run had no validation (no best.pth).
    """
    if not checkpoint.is_dir():
        if pick is not None:
            what = "is a file" if os.path.lexists(checkpoint) else "does not exist"
            raise UserError(f"--pick {pick} chooses a checkpoint inside a run folder, but {checkpoint} {what}; "
                            "drop --pick, or pass the run's --output-dir")
        return checkpoint, None
    if pick in SUMMARY_KEYS:  # what `listen` heard: RUN/listen/scores.jsonl
        return pick_scored(checkpoint, pick)
    names = {"best": [BEST], "latest": [LATEST], None: [BEST, LATEST]}[pick]
    found = next((checkpoint / name for name in names if (checkpoint / name).is_file()), None)
    if found is None:
        there = [name for name in names if os.path.lexists(checkpoint / name)]  # a FIFO, a folder, a dead link
        inside = "" if there else runs_inside(checkpoint)  # the demo's OUT holds its run in OUT/run
        what = (f"{checkpoint / there[0]} is {kind_of_path(checkpoint / there[0])}, not a file" if there
                else f"no {' or '.join(names)} in this folder{inside}")
        raise UserError(f"{checkpoint}: {what}; {'or ' if inside else ''}pass a checkpoint file "
                        "(`indextts-train checkpoints DIR` lists them)")
    return found, None


def provenance(state: dict) -> str:
    """'step N, val loss X' for one of our checkpoints (`state`: what load_verified read), '' for other files."""
    progress, history = state.get("progress"), state.get("history")
    if not isinstance(progress, dict) or not is_int(progress.get("step")):
        return ""
    step = progress["step"]
    rows = history.get("val", []) if isinstance(history, dict) else []
    loss = next((row[1] for row in reversed(rows) if row and row[0] == step), None)
    return f"step {step}" + (f", val loss {loss:.4f}" if loss is not None else "")


def export_checkpoint(checkpoint: Path, output: Path, *, config_out: Path | None = None,
                      base_config: Path | None = None, tokenizer_name: str | None = None,
                      dtype: str = "float32", tokenizer: Path | None = None,
                      adapters_out: Path | None = None, force: bool = False) -> dict:
    """Write `output` (official key order, dtype asked for) and optionally `config_out`, `adapters_out`.

    `tokenizer` is checked against the exported text rows and copied beside `output`: a .tiktoken
    under the name stock 2.5 inference opens (IndexTTS-2.5), a SentencePiece model as `tokenizer_name`
    (IndexTTS2, the name config.yaml gives as dataset.bpe_model; None: the family's own, bpe.model).
    A `tokenizer_name` that would change nothing is refused: one that names neither a copy nor a
    config.yaml, or another name than the one IndexTTS-2.5 inference opens. Notes (borrowed language
    rows, sections config.yaml lacks) go into the summary, the first kind also as comments into `config_out`.

    An existing target is replaced only with `force`, and a training checkpoint never. Every file is
    written under a temp name first and renamed at the end: a failure leaves no final name changed.
    """
    if dtype not in DTYPES:
        raise UserError(f"--dtype {dtype}: choose one of {', '.join(DTYPES)}")
    copy_target = _tokenizer_target(output, tokenizer, tokenizer_name, config_out)
    targets = {"-o": output, "--config-out": config_out, "--adapters-out": adapters_out, "--tokenizer": copy_target}
    named = [path for path in targets.values() if path is not None]
    interrupted = _interrupted(output, named)  # its files are among this command's, which replace them all
    check_targets(checkpoint, base_config, tokenizer, targets, force, _published_by(interrupted))
    # The one read of the checkpoint (several GB): missing/damaged/unsafe/unusable files are refused in
    # the checkpoint module's own words, and everything below uses what it read.
    loaded = load_verified(checkpoint)
    remove_stale_temps(output, named, interrupted)
    payload = _adapter_payload(checkpoint, loaded) if adapters_out is not None else None  # refused before writes
    # a model folder's gpt.pth (no config stored) is sized by the config.yaml beside it, as evaluate takes it
    config = config_for(checkpoint, base_config, fallback=config_beside(checkpoint)[0], loaded=loaded)
    trained, carried, tokens = load_base_checkpoint(checkpoint, config.gpt, loaded=loaded)
    _check_name_read(tokenizer_name, config.gpt.family)  # the checkpoint says the family: before any write
    config.gpt.number_text_tokens = tokens
    vocabulary = _checked_tokenizer(tokenizer, tokens, config, loaded)
    hparams = loaded.get("hparams") if isinstance(loaded.get("hparams"), dict) else {}  # borrowed language rows
    notes = borrow_notes(hparams.get("borrow_languages"))
    merged = {**carried, **trained}
    state = {key: merged[key].to(DTYPES[dtype]) if merged[key].is_floating_point() else merged[key]
             for key in official_shapes(config.gpt)}
    files: list[tuple[Path, Writer]] = [(output, lambda handle: torch.save(state, handle))]
    if vocabulary is not None and not same_file(copy_target, tokenizer):
        files.append((copy_target, lambda handle: handle.write(vocabulary)))
    config_notes = []
    if config_out is not None:
        text, config_notes = _config_text(config, base_config, output.name,
                                          tokenizer_name or config.gpt.family.tokenizer_name, notes)
        files.append((config_out, lambda handle: handle.write(text.encode("utf-8"))))
    if payload is not None:
        files.append((adapters_out, lambda handle: torch.save(payload, handle)))
    _publish(files, interrupted)
    return {"tensors": len(state), "text_rows": tokens + 1, "dtype": dtype, "family": config.gpt.family.name,
            "numel": sum(t.numel() for t in state.values()), "tokenizer": copy_target if vocabulary else None,
            "notes": notes + config_notes, "provenance": provenance(loaded)}


def _publish(files: list[tuple[Path, Writer]], interrupted: tuple[int, list[Path]] | None = None) -> None:
    """Write every file under its temp name, then rename them all into place.

    A failure (disk full, a read-only folder) removes the temp files and the folders made for them,
    and says which file could not be written; no final name was touched. Between the writes and the
    renames a marker beside the first file lists them (`publishing_marker`): a kill among the renames
    leaves it, and the next export to the same -o must write every file it lists (`_interrupted`). That
    export renames none of the killed one's temp files, which may come from another source: its own,
    complete, replace its marker, and only then are the killed export's temp files removed. So the files
    never stay a mix of two exports, and an export refused or failed before this point leaves the killed
    one's files, temp files and marker as they were.
    """
    made: list[Path] = []  # folders created here, outermost first
    temps: list[Path] = []
    final = files[0][0]
    marker = publishing_marker(final)
    previous = _marker_bytes(marker) if interrupted is not None else None  # the killed export's, put back on failure
    try:
        for final, write in files:
            for folder in [p for p in final.parents if not p.exists()][::-1]:
                folder.mkdir()
                made.append(folder)
            temps.append(temp_name(final))
            with open(temps[-1], "wb") as handle:
                write(handle)
                handle.flush()
                os.fsync(handle.fileno())
        atomic_write_text(marker, json.dumps({"pid": os.getpid(), "files": [str(f.absolute()) for f, _ in files]}))
    except BaseException as exc:  # a signal too: no temp file, new folder or marker of this export stays behind
        with contextlib.suppress(OSError):
            _withdraw_marker(marker, previous)
        for temp in temps:
            with contextlib.suppress(OSError):  # a read-only disk refuses the unlink too (EROFS)
                temp.unlink(missing_ok=True)
        for folder in reversed(made):
            with contextlib.suppress(OSError):
                folder.rmdir()
        if not isinstance(exc, (OSError, RuntimeError)):  # torch.save wraps the OSError of a failed write
            raise
        raise UserError(f"could not write {final}: {failure_reason(exc)}; nothing was written") from None
    if interrupted is not None and interrupted[0] != os.getpid():  # superseded by this export's marker: the
        for temp in _temps_of(interrupted):  # killed one's temps are garbage now (its pid's, if not reused)
            temp.unlink(missing_ok=True)
    for i, ((final, _), temp) in enumerate(zip(files, temps, strict=True)):
        os.replace(temp, final)
        crash_point("export_renamed", i + 1)
    for folder in {final.parent for final, _ in files}:
        fsync_dir(folder)
    marker.unlink()
    fsync_dir(marker.parent)


def _marker_bytes(marker: Path) -> bytes:
    with open(marker, "rb") as handle:
        return handle.read(MAX_MARKER_BYTES)  # _interrupted read no more of it


def _withdraw_marker(marker: Path, previous: bytes | None) -> None:
    """Undo this export's marker when a failure or a Ctrl+C cut `_publish` short after writing it (inside its
    atomic write, once renamed): its temp files are gone, and a marker whose temp files are gone says its
    files were published, so a later export would replace them without --force. The killed export's marker
    it replaced (`previous`) is put back, as that export left it."""
    if not marker.is_file():
        return
    record = json_or_none(_marker_bytes(marker))
    if not isinstance(record, dict) or record.get("pid") != os.getpid():  # not this export's: left as it is
        return
    if previous is None:
        marker.unlink()
    else:
        atomic_write_bytes(marker, previous)


def publishing_marker(output: Path) -> Path:
    """`.NAME.publishing` beside -o: present only while an export renames its files into place."""
    return output.with_name(f".{output.name}.publishing")


def _interrupted(output: Path, targets: list[Path]) -> tuple[int, list[Path]] | None:
    """(pid, files) of an export to `output` killed among its renames; None when there was none.

    The marker is data: its files must be among this command's targets (it writes them all anew, whatever
    its source), so no file outside them is ever replaced for it.
    """
    marker = publishing_marker(output)
    if not marker.is_file():
        return None
    try:
        with open(marker, "rb") as handle:
            record = json_or_none(handle.read(MAX_MARKER_BYTES))  # a crafted one nested 100,000 deep: None
        pid, files = int(record["pid"]), [Path(f) for f in record["files"]]
    except (ValueError, TypeError, KeyError, OSError):  # None["pid"] is a TypeError
        raise UserError(f"{marker}: not a marker export wrote; remove it and rerun") from None
    mine = {t.absolute() for t in targets}
    others = [str(f) for f in files if f not in mine]
    if others:
        raise UserError(f"{output}: an earlier export was killed while it published {', '.join(map(str, files))}; "
                        "rerun that same command (its -o and other outputs) to finish it")
    return pid, files


def _temps_of(interrupted: tuple[int, list[Path]]) -> list[Path]:
    """The temp files a killed export had not renamed yet: complete, each the new bytes of its final name."""
    pid, files = interrupted
    return [temp for temp in (temp_name(final, pid) for final in files) if temp.is_file()]


def _published_by(interrupted: tuple[int, list[Path]] | None) -> set[Path]:
    """The files a killed export had renamed into place (their temp file is gone): its own, which this export
    may replace without --force. A file it had not reached yet is still what was there before it."""
    if interrupted is None:
        return set()
    pid, files = interrupted
    return {final.absolute() for final in files if not temp_name(final, pid).is_file()}


def remove_stale_temps(output: Path, targets: list[Path], interrupted: tuple[int, list[Path]] | None) -> None:
    """Remove the temp files that exports of these targets killed while writing them left (their process is
    gone). Those of an export killed among its renames (`interrupted`) stay until this one's are complete."""
    keep = set(_temps_of(interrupted)) if interrupted is not None else set()
    for target in [*targets, publishing_marker(output)]:
        for temp in stale_temps(target):
            if writer_gone(temp) and temp not in keep:
                temp.unlink(missing_ok=True)


def _adapter_payload(checkpoint: Path, loaded: object) -> dict:
    """The adapters-only file of a --train-scope lora checkpoint: adapters, the other tensors the run
    trained (heads, text rows) and the fingerprint of the base weights they apply to."""
    record = loaded.get("lora") if isinstance(loaded, dict) else None
    if not isinstance(record, dict):
        raise UserError(f"{checkpoint}: has no LoRA adapters (not a --train-scope lora checkpoint); "
                        "drop --adapters-out")
    config = config_from_dict(loaded["config"], f"{checkpoint} (stored config)")
    plan = VocabPlan.from_dict(loaded["vocab_plan"])
    rows = text_rows_trainable(bool(plan.new_ids), plan.freeze_base)
    settings = scope_settings(config.train)
    model = loaded["model"]
    # IndexTTS-2.5's spk_emb_proj is a trainable tensor whose rows the run kept frozen without --train-speaker-proj
    frozen = () if config.train.train_speaker_proj else ("spk_emb_proj.",)
    tensors = {k: model[k] for k in trained_keys(config.gpt)
               if is_trainable(k, settings, config.gpt.layers, rows) and not k.startswith(frozen)}
    stated = config.gpt.stated_family
    applies_to = {"family": None if stated is None else stated.key, "model_dim": config.gpt.model_dim,
                  "layers": config.gpt.layers, "text_rows": plan.rows, "base_text_rows": plan.base_tokens + 1,
                  "checkpoint": checkpoint.name}
    return adapter_file(record["adapters"], record_spec(record), model, tensors, applies_to)


def _tokenizer_target(output: Path, tokenizer: Path | None, tokenizer_name: str | None,
                      config_out: Path | None) -> Path | None:
    """Where the tokenizer copy goes: beside `output`, under the name inference opens."""
    if tokenizer_name is not None:  # it names the copy, or config.yaml's dataset.bpe_model: checked without a copy
        if Path(tokenizer_name).name != tokenizer_name or tokenizer_name in ("", ".", "..") \
                or not tokenizer_name.isprintable():
            raise UserError(f"--tokenizer-name {tokenizer_name!r}: give a file name (it goes beside -o), not a path")
        if tokenizer is None and config_out is None:
            raise UserError(f"--tokenizer-name {tokenizer_name}: it names the tokenizer copy (--tokenizer) and "
                            "config.yaml's dataset.bpe_model (--config-out), and neither is written; pass one, or "
                            "leave --tokenizer-name out")
    if tokenizer is None:
        return None
    # a FIFO or a folder there is said as what it is ("no such file" misled)
    check_file(tokenizer, "tokenizer", flag="--tokenizer", missing="pass the tokenizer the run trained with")
    family = family_of_tokenizer(tokenizer)
    _check_name_read(tokenizer_name, family)
    return output.parent / (tokenizer_name if tokenizer_name is not None else family.tokenizer_name)


def _check_name_read(tokenizer_name: str | None, family: Family) -> None:
    """IndexTTS-2.5 inference opens its vocabulary by one fixed name: another one would name nothing it reads."""
    if family.tokenizer_name_fixed and tokenizer_name not in (None, family.tokenizer_name):
        raise UserError(f"--tokenizer-name {tokenizer_name}: {family.name} inference opens its vocabulary as "
                        f"{family.tokenizer_name}, whatever config.yaml says, so the copy takes that name; leave "
                        "--tokenizer-name out")


def _grown(loaded: dict) -> tuple[int, int] | None:
    """(base tokens, tokens) when the run's vocab plan grew the vocabulary, else None."""
    plan = loaded.get("vocab_plan")
    if not isinstance(plan, dict) or not (is_int(plan.get("base_tokens")) and is_int(plan.get("tokens"))):
        return None
    return (plan["base_tokens"], plan["tokens"]) if plan["tokens"] > plan["base_tokens"] else None


def _checked_tokenizer(tokenizer: Path | None, tokens: int, config: Config, loaded: dict) -> bytes | None:
    """The tokenizer bytes to ship beside the export (None: none given), checked against the text rows.

    A 2.5 run that grew its vocabulary must ship its .tiktoken: stock inference would otherwise read
    the stock vocabulary, whose special-token ids are no longer the model's.
    """
    model = config.gpt.family
    if tokenizer is None:
        grown = _grown(loaded) if model.tokenizer_name_fixed else None
        if grown is not None:
            raise UserError(f"the run grew the vocabulary ({grown[0]} -> {grown[1]} tokens), so an IndexTTS-2.5 "
                            "export needs --tokenizer with the run's .tiktoken: stock inference would read its own "
                            "vocabulary, whose special-token ids no longer match the model")
        return None
    given = family_of_tokenizer(tokenizer)
    if given is not model:
        raise UserError(f"--tokenizer {tokenizer}: a {given.tokenizer_noun} is {given.name}'s, but the checkpoint is "
                        f"{model.name}; pass the {model.tokenizer_label} the run trained with")
    if model.tokenizer_kind == TIKTOKEN:
        vocab = read_tiktoken(tokenizer)
        if vocab.n_vocab != tokens:
            raise UserError(f"--tokenizer {tokenizer}: {vocab.n_ranks} ranks + specials = {vocab.n_vocab} tokens, "
                            f"but the checkpoint has {tokens} (number_text_tokens); pass the .tiktoken it was "
                            "trained with")
        return vocab.raw
    size = tokenizer_size(tokenizer)
    if size != tokens:
        raise UserError(f"--tokenizer {tokenizer}: {size} pieces, but the checkpoint has {tokens} text tokens "
                        "(number_text_tokens); pass the tokenizer it was trained with")
    return read_bounded(tokenizer, MAX_TOKENIZER_BYTES, "tokenizer")  # replaced since it was checked: one line


def _config_text(config: Config, base_config: Path | None, gpt_name: str, tokenizer_name: str,
                 notes: list[str]) -> tuple[str, list[str]]:
    """config.yaml for inference and what it lacks: every section of the user's config (--config, else the
    one stored in the checkpoint), with only what the fine-tune changed replaced."""
    data = load_yaml(base_config, "config") if base_config else copy.deepcopy(config.sections)
    data.pop("train", None)
    data["version"] = config.gpt.family.version
    data["gpt"] = gpt_to_dict(config.gpt)
    data["gpt_checkpoint"] = gpt_name
    if not config.gpt.family.tokenizer_name_fixed:  # 2.5 reads its vocabulary from a fixed name, not from here
        data.setdefault("dataset", {})
        data["dataset"]["bpe_model"] = tokenizer_name
    missing = [name for name in INFERENCE_SECTIONS if name not in data]
    source = (f"--config {base_config} has none" if base_config else
              "the run's config had none; pass --config with the model's own config.yaml (IndexTTS2's "
              "checkpoints/config.yaml) to carry them")
    lacks = [f"config.yaml has no {', '.join(missing)} section(s): {source}"] if missing else []
    header = "".join(f"# indextts-train: {note}\n" for note in notes)  # YAML comments: loaders ignore them
    return header + yaml.safe_dump(data, sort_keys=False, allow_unicode=True), lacks
