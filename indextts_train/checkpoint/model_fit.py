"""Whether a checkpoint's weights are the model its config describes: the one check every command shares.

A config must read (config_from_dict: known keys, every value in range), state no other family than the
weights' keys show (config/family.py) and give the official keys and shapes of the weights (model/layout.py),
with text rows enough for the start/stop text tokens. `verify` calls a file of ours COMPLETE only when its
stored config passes (`stored_model_problems`); `export` and a run's --base-checkpoint refuse a file by the
same functions (reader.config_for, base.py), and `repair --config` holds the config it is given to them, so a
file verify passes always exports and resumes.
"""

from __future__ import annotations

from collections.abc import Mapping

from torch import Tensor

from indextts_train.checkpoint.state import repaired_unknown
from indextts_train.config.family import family_of_keys, settle_family
from indextts_train.config.settings import Config, GPTConfig, config_from_dict
from indextts_train.errors import UserError
from indextts_train.model.layout import layout_problems


def stored_config(state: Mapping, source: str) -> Config | None:
    """The config stored in a checkpoint (None: it stores none with a gpt: section); one line naming `source`
    when a value is unknown or out of range."""
    stored = state.get("config")
    return config_from_dict(stored, source) if isinstance(stored, dict) and "gpt" in stored else None


def fit_problem(weights: Mapping[str, Tensor], cfg: GPTConfig, source: str, advice: str = "") -> str | None:
    """Why `weights` (official key names) are not the GPT `cfg` describes, one line naming `source` and ending
    in `advice` (another family's line has its own); None when they are. A config that states no family takes
    the one the keys show (settle_family)."""
    stated = cfg.stated_family
    other = settle_family(cfg, family_of_keys(weights), source)
    if other is not None:
        return other
    problems = layout_problems(weights, cfg)
    if problems:
        settled = "" if stated is not None or cfg.stated_family is None else (
            " (the family of the weights' keys: the config states no version)")
        return (f"{source}: does not match the {cfg.family.name} GPT layout{settled} of the config (model_dim "
                f"{cfg.model_dim}, layers {cfg.layers}): {'; '.join(problems)}{advice}")
    rows = weights["text_embedding.weight"].shape[0]
    if rows - 1 <= max(cfg.start_text_token, cfg.stop_text_token):
        return (f"{source}: text_embedding.weight has only {rows} rows; it cannot hold the start/stop text "
                f"tokens{advice}")
    return None


def stored_model_problems(state: dict) -> list[str]:
    """What keeps the `model` of a checkpoint of ours from being the GPT its stored config describes (empty:
    it is). A repaired file whose config a repair could not tell stores none to check: export asks for --config."""
    if "config" in repaired_unknown(state) and state.get("config") == {}:
        return []
    try:
        config = stored_config(state, "config")
    except UserError as exc:
        return [str(exc)]
    if config is None:
        return ["config: none with a gpt: section is stored, so the model the weights are is not known"]
    problem = fit_problem(state["model"], config.gpt, "model")
    return [problem] if problem else []
