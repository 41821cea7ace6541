"""Repair: turn a community or partial checkpoint into one that verifies COMPLETE.

The community `train_gpt_v2.py` saves weights (often DDP-prefixed), optimizer, scheduler, scaler,
step and epoch, but no RNG states, position in the epoch, history, config or vocab plan. A repair
maps the weights onto the official gpt.pth names, keeps the optimizer set only when it provably
matches them, fills every missing part with a stated default and records under `repaired` what was
filled in, not known (`repaired["unknown"]`), and human notes. Storage (files.py), reading (reader.py)
and the rules of a COMPLETE checkpoint (verify.py, state.py) stay where they are; the original file is
kept as a backup before it is replaced.
"""

from __future__ import annotations

import dataclasses
import os
import time
from pathlib import Path
from typing import Any

import torch

from indextts_train.checkpoint.export import remove_stale_temps
from indextts_train.checkpoint.files import CheckpointError, failure_reason, load_checkpoint, write_state
from indextts_train.checkpoint.model_fit import fit_problem, stored_model_problems
from indextts_train.checkpoint.rng import rng_problem, seeded_rng
from indextts_train.checkpoint.run_folder import same_file
from indextts_train.checkpoint.state import (
    FORMAT,
    FORMAT_VERSION,
    OPTIMIZER_SET,
    History,
    Progress,
    migrate,
    optimizer_params,
    optimizer_problems,
    validate,
)
from indextts_train.checkpoint.verify import optimizer_value_problem, resume_value_problems, verify_checkpoint
from indextts_train.config.family import family_of_keys
from indextts_train.config.schema import field_types, is_int
from indextts_train.config.settings import TrainConfig, config_from_dict
from indextts_train.errors import UserError
from indextts_train.files.atomic import link_or_copy
from indextts_train.model.layout import clean_keys
from indextts_train.text.tiktoken_vocab import SPECIAL_TOKENS

# Persistent buffers of UnifiedVoice (tests/data/reference keys json): in the state dict, never in an optimizer.
# The community train_gpt_v2.py hard-codes its base vocabulary: with a larger tokenizer it zeroes the
# gradients of these first text rows (embedding, head weight and bias).
COMMUNITY_BASE_TOKENS = 12000
_BUFFER_SUFFIXES = (".pos_enc.pe",)


def _official_weights(model: dict, notes: list[str]) -> dict:
    """Community key spellings -> the official gpt.pth layout, float32."""
    try:
        cleaned = clean_keys(model)
    except UserError as exc:
        raise CheckpointError(str(exc)) from None
    if cleaned.lora:
        raise CheckpointError(f"it holds LoRA adapter tensors ({cleaned.lora[0]}, ...); merge the adapters into the "
                              "base weights first, dropping them would lose their training")
    if cleaned.aliases:
        notes.append(f"dropped {len(cleaned.aliases)} alias keys (inference_model.*, gpt.wte.weight) that "
                     "duplicate stored tensors")
    mapped = cleaned.state
    if "text_embedding.weight" not in mapped:
        raise CheckpointError("it has no text_embedding.weight, so it is not an IndexTTS2 GPT state dict")
    odd = next((k for k, v in mapped.items() if not v.is_floating_point()), None)
    if odd is not None:  # an int, bool or complex tensor is no trained weight: a cast would invent its values
        raise CheckpointError(f"its weight {odd!r} is {mapped[odd].dtype}, not floating point: not weights a repair "
                              "can recover; use another checkpoint of the run")
    low = [k for k, v in mapped.items() if v.is_floating_point() and v.dtype != torch.float32]
    if low:
        notes.append(f"{len(low)} tensors stored as {mapped[low[0]].dtype} converted to float32 "
                     "(their lost precision cannot come back)")
    return {k: v.float() if v.is_floating_point() else v for k, v in mapped.items()}


def _derive_param_names(model: dict, optimizer: Any) -> tuple[list[str] | None, str]:
    """Names for the community optimizer: model.parameters() order is the state-dict order minus buffers.

    Trusted only if the counts match and every saved moment has its tensor's shape.
    """
    if not (isinstance(optimizer, dict) and isinstance(optimizer.get("state"), dict)
            and isinstance(optimizer.get("param_groups"), list)):
        return None, "no usable optimizer state"
    ids = optimizer_params(optimizer)
    names = [k for k in model if not k.endswith(_BUFFER_SUFFIXES)]
    if len(ids) != len(names):
        return None, f"the optimizer holds {len(ids)} parameters but the weights have {len(names)}"
    for pid, name in zip(ids, names, strict=True):
        for value in optimizer["state"].get(pid, {}).values():
            if isinstance(value, torch.Tensor) and value.dim() and value.shape != model[name].shape:
                return None, (f"optimizer state of parameter {pid} has shape {list(value.shape)} "
                              f"but {name} has {list(model[name].shape)}")
    return names, ""


def _community_source(raw: dict) -> dict:
    """The parts of a community checkpoint that map onto our keys."""
    source = {k: raw.get(k) for k in ("model", *OPTIMIZER_SET)}
    # The community trainer stores epoch + 1 ("next epoch to start") and resumes at that epoch's start.
    source["progress"] = {"step": raw.get("step"), "epoch": raw.get("epoch")}
    return source


def _repair_optimizer(state: dict, unknown: list[str], notes: list[str]) -> None:
    """Keep optimizer + scheduler + scaler when they match the weights by name, else drop all three."""
    keys = (*OPTIMIZER_SET, "optimizer_param_names")
    candidate = {k: state.get(k) for k in keys} | {"model": state["model"]}
    problems = optimizer_problems(candidate)
    if problems:
        names, why = _derive_param_names(state["model"], candidate["optimizer"])
        if names is not None:
            candidate["optimizer_param_names"] = names
            problems = optimizer_problems(candidate)
            if not problems:
                notes.append("optimizer parameter names derived from the weights' order "
                             "(parameter count and every moment's shape match)")
        elif why and not isinstance(candidate["optimizer_param_names"], list):
            problems = [why]  # a file without names (community): why none could be derived is the reason
    # moments torch could not load (another shape, a learning rate of 'x'): dropped as a mismatch is
    problems = problems or [p for p in (optimizer_value_problem(candidate),) if p]
    if problems:
        state.update(optimizer=None, scheduler=None, scaler=None, optimizer_param_names=[])
        unknown.extend(OPTIMIZER_SET)
        notes.append(f"optimizer, scheduler and scaler dropped together ({problems[0]}); "
                     "the optimizer restarts fresh at the stored step")
        return
    state.update({k: candidate[k] for k in keys})


_COUNTERS = {f.name for f in dataclasses.fields(Progress) if f.metadata.get("filled_when_missing")}


def _repair_progress(state: dict, config: dict | None, unknown: list[str], notes: list[str]) -> None:
    """Stored values where valid; else derived (step from the scheduler) or a marked default."""
    stored = state.get("progress") if isinstance(state.get("progress"), dict) else {}
    scheduler_step = state["scheduler"].get("last_epoch") if isinstance(state.get("scheduler"), dict) else None
    defaults = {"sampler_seed": (config or {}).get("train", {}).get("seed", TrainConfig().seed), "world_size": 1}
    progress = {}
    for key in field_types(Progress):
        value = stored.get(key)
        if key == "step" and not is_int(value) and is_int(scheduler_step):
            value = scheduler_step  # LambdaLR steps once per optimizer step
            notes.append(f"step {value} taken from the scheduler")
        if not (is_int(value) and value >= 0):
            value = defaults.get(key, 0)
            if key not in _COUNTERS:  # counters of events the old file predates: 0 is known, not a guess
                unknown.append(f"progress.{key}")
        progress[key] = value
    if "progress.samples_in_epoch" in unknown:
        notes.append(f"position in the epoch unknown: training restarts epoch {progress['epoch']} "
                     "from its first sample")
    state["progress"] = progress


def _repair_rest(state: dict, unknown: list[str], notes: list[str]) -> None:
    progress = state["progress"]
    rng = state.get("rng")
    if not (isinstance(rng, list) and rng and not any(map(rng_problem, rng)) and len(rng) == progress["world_size"]):
        seed = progress["sampler_seed"] + progress["step"]
        state["rng"] = [seeded_rng(seed) for _ in range(progress["world_size"])]
        unknown.append("rng")
        notes.append(f"RNG states were not saved: fresh states seeded with {seed} (dropout draws differ "
                     "from the original run)")
    if History.problems(state.get("history")):
        state["history"] = History().state_dict()
        unknown.append("history")
    if not isinstance(state.get("hparams"), dict):  # empty: the trainer then applies its current settings
        state["hparams"] = {}
        unknown.append("hparams")
    state.setdefault("hardware", {})
    state.setdefault("created", time.strftime("%Y-%m-%dT%H:%M:%S%z"))


def _repair_config(state: dict, config: dict | None, unknown: list[str], notes: list[str]) -> None:
    """The file's own config when it describes the weights; else `config` (--config), else none (not known).

    A given `config` must describe the weights whichever is kept: their family and layout, judged as verify
    and export judge a stored one (model_fit.py). A stored config that does not describe them is replaced by
    `config`; without one it stays, and the check after the repair says why the file cannot be repaired.
    """
    if config is not None:
        given = config_from_dict(config, "--config")
        problem = fit_problem(state["model"], given.gpt, "--config", "; pass the config.yaml it was trained with")
        if problem is not None:
            raise CheckpointError(problem)
    stored = state.get("config")
    stored_problems = stored_model_problems({"model": state["model"], "config": stored})
    if not stored_problems or (config is None and isinstance(stored, dict) and stored):
        return
    if config is None:
        state["config"] = {}
        unknown.append("config")
        return
    state["config"] = {**config, "version": given.gpt.family.version}  # the family, settled from the keys
    if isinstance(stored, dict) and stored:
        notes.append(f"stored config replaced by --config ({stored_problems[0]})")


def _repair_vocab_plan(state: dict, base_vocab: int | None, unknown: list[str], notes: list[str]) -> None:
    """Which text rows are base rows (frozen while training): `base_vocab` when given, else what the
    community trainer did: it froze the first COMMUNITY_BASE_TOKENS rows when the vocabulary was larger.

    IndexTTS-2.5 text rows are tiktoken ranks then the specials, and a grown vocabulary's new ranks sit
    between them (VocabPlan.insert_at): its base rows are the base ranks and the specials. The community
    rule is IndexTTS2's (its train_gpt_v2.py), so a 2.5 file without --base-vocab trains every row.
    """
    tokens = state["model"]["text_embedding.weight"].shape[0] - 1  # text rows = tokenizer size + 1
    family = family_of_keys(state["model"])
    ranks_then_specials = family is not None and family.specials_follow_ranks  # IndexTTS-2.5's tiktoken rows
    if base_vocab is not None:
        if not 1 <= base_vocab <= tokens:
            raise CheckpointError(f"--base-vocab {base_vocab} must be between 1 and the checkpoint's {tokens} "
                                  "text tokens")
        if ranks_then_specials and base_vocab <= len(SPECIAL_TOKENS):
            raise CheckpointError(f"--base-vocab {base_vocab}: an IndexTTS-2.5 vocabulary is its tiktoken ranks and "
                                  f"{len(SPECIAL_TOKENS)} special tokens; pass the base model's number_text_tokens")
        base, how = base_vocab, "--base-vocab"
    elif isinstance(state.get("vocab_plan"), dict):
        return
    else:
        base = COMMUNITY_BASE_TOKENS if tokens > COMMUNITY_BASE_TOKENS and not ranks_then_specials else tokens
        how = "assumed"
        unknown.append("vocab_plan")
    insert_at = base - len(SPECIAL_TOKENS) if ranks_then_specials and base < tokens else None
    state["vocab_plan"] = {"base_tokens": base, "tokens": tokens, "freeze_base": base < tokens, "insert_at": insert_at}
    if insert_at is not None:
        notes.append(f"vocab plan ({how}): IndexTTS-2.5 base of {base} text tokens: its {insert_at} ranks (rows "
                     f"0..{insert_at - 1}) and its specials (rows {insert_at + tokens - base}..{tokens - 1}) are base "
                     f"rows, kept frozen when training resumes; the {tokens - base} ranks between them train")
    elif base < tokens:
        froze = "" if how == "--base-vocab" else " (the community trainer froze them)"
        notes.append(f"vocab plan ({how}): the first {base} of {tokens} text tokens are base tokens, their rows "
                     f"kept frozen when training resumes{froze}; pass --base-vocab N if the base vocabulary had "
                     "another size")
    elif ranks_then_specials:
        notes.append(f"vocab plan ({how}): the rows of all {tokens} text tokens train (no base vocabulary is "
                     "assumed for IndexTTS-2.5); pass --base-vocab N, the base model's number_text_tokens, to "
                     "freeze its rows")
    else:
        notes.append(f"vocab plan ({how}): the rows of all {tokens} text tokens train (the community trainer "
                     f"freezes the first {COMMUNITY_BASE_TOKENS} only in a larger vocabulary); pass --base-vocab N to "
                     "freeze a base")


def _repaired_state(raw: dict, kind: str, config: dict | None, base_vocab: int | None) -> tuple[dict, list[str]]:
    source = _community_source(raw) if kind == "community" else dict(raw)
    notes: list[str] = []
    unknown: list[str] = []
    if kind == "community":
        notes.append("the community trainer stores the next epoch to start as 'epoch' and resumes at its "
                     "first sample; so does this repair")
    state = {**source, "format": FORMAT, "format_version": FORMAT_VERSION}
    state["model"] = _official_weights(source["model"], notes)
    _repair_config(state, config, unknown, notes)
    _repair_optimizer(state, unknown, notes)
    _repair_progress(state, config, unknown, notes)
    _repair_rest(state, unknown, notes)
    _repair_vocab_plan(state, base_vocab, unknown, notes)
    state["repaired"] = {"from": kind, "unknown": unknown, "notes": notes}
    return state, notes


def _backup_path(path: Path) -> Path:
    """PATH.bak, else PATH.bak.N: the first name that is free (a link to nothing holds its name too), or that
    is already a hard link of the original itself: the backup a repair made before it was killed, reused so
    that a rerun adds no second one. Any other file under such a name is someone's, never written."""
    candidate = path.with_name(path.name + ".bak")
    n = 1
    while os.path.lexists(candidate):
        if not candidate.is_symlink() and same_file(candidate, path):
            return candidate
        candidate = path.with_name(f"{path.name}.bak.{n}")
        n += 1
    return candidate


def repair_checkpoint(path: Path, out: Path | None = None, *, config: dict | None = None,
                      base_vocab: int | None = None) -> tuple[Path, list[str]]:
    """Convert a community or partial checkpoint into one that verifies COMPLETE (marked "repaired").

    `config` (config_to_dict form) fills config and the sampler seed when the file lacks them (or replaces a
    stored config that does not describe the weights), and is refused when it describes other weights;
    `base_vocab`, how many text rows are base rows (see _repair_vocab_plan). Without
    `out`, or with out == path, the original is first kept as PATH.bak (or PATH.bak.N) and then replaced
    atomically. Returns the written path and human notes on what was filled in.
    """
    path = Path(path)
    verdict = verify_checkpoint(path)
    if verdict.status == "COMPLETE":
        return path, [f"{path} already verifies COMPLETE; nothing to repair"]
    why = "; ".join(verdict.reasons)
    why = f"cannot repair: {why}" if why.startswith(str(path)) else f"cannot repair {path}: {why}"  # path said once
    if verdict.status == "INCOMPLETE" or verdict.kind not in ("community", "indextts-train"):
        raise CheckpointError(why)
    raw = load_checkpoint(path)
    if verdict.kind == "indextts-train" and raw.get("format_version") != FORMAT_VERSION:
        raise CheckpointError(why)
    try:
        state, notes = _repaired_state(raw, verdict.kind, config, base_vocab)
    except UserError as exc:  # a CheckpointError, or --config that does not read
        raise CheckpointError(f"cannot repair {path}: {exc}") from None
    # migrate adds the parts a community file never had (data); the second check is export's too
    problems = validate(migrate(state)) or resume_value_problems(state)
    fit = [] if problems else stored_model_problems(state)
    if problems or fit:
        advice = "; pass --config with the config.yaml it was trained with" if fit and config is None else ""
        raise CheckpointError(f"cannot repair {path}: {'; '.join(problems + fit)}{advice}")
    target = Path(out) if out is not None else path
    if out is not None and target.is_symlink():  # dangling or a loop: exists() said no, and the rename replaced it
        raise CheckpointError(f"{target} is a symbolic link; pass another output path (repair never writes over "
                              "or through a link)")
    if target.exists() and not same_file(target, path):
        raise CheckpointError(f"{target} already exists; pass another output path or remove it")
    remove_stale_temps(target, [target], None)  # a killed repair's half-written file (a checkpoint's size)
    try:
        if target.exists():
            backup = _backup_path(path)
            if not backup.exists():  # else a killed repair's link of the original: it holds the original already
                link_or_copy(path, backup)  # the original inode keeps its bytes: the rename below makes a new one
            notes.append(f"original kept as {backup}")
        write_state(state, target, step=-1)
    except (OSError, RuntimeError) as exc:
        raise CheckpointError(f"could not write {target}: {failure_reason(exc)}; {path} is unchanged") from exc
    return target, notes
