"""The page's form as the train command it runs (webui/form.py): every main field is sent, except what the
run would refuse typed: the validation fields without a validation manifest, and a batch the run would
not train with."""

from __future__ import annotations

from enum import Enum

import pytest
import typer
from helpers import ROOT

from indextts_train.cli import app
from indextts_train.config.unread_settings import check_start_settings
from indextts_train.errors import UserError
from indextts_train.ui.run_settings import RunSettings, resolve_settings
from indextts_train.webui import form as forms
from indextts_train.webui.roots import Roots

TINY = str(ROOT / "configs" / "tiny.yaml")


def _run_form(tmp_path, **fields) -> forms.RunForm:
    return forms.RunForm(train_manifests=f"{tmp_path}/a.jsonl", output_dir=str(tmp_path / "out"), config=TINY,
                         hparams=forms.defaults_for(TINY), **fields)


def _settings(flags: list[str]) -> RunSettings:
    """What a train command of `flags` resolves to, as the CLI reads it (the flags typed: named)."""
    command = typer.main.get_command(app).commands["train"]
    context = command.make_context("train", list(flags))
    typed = {name for name in context.params if getattr(context.get_parameter_source(name), "name", "") ==
             "COMMANDLINE"}
    values = {name: value.value if isinstance(value, Enum) else list(value) if isinstance(value, tuple) else value
              for name, value in context.params.items()}  # as Typer hands them to the command
    return resolve_settings(typed=typed, **values)


def test_without_validation_manifests_the_page_sends_no_validation_field(tmp_path) -> None:
    """--val-interval sent without --val-manifest is refused by the run (it would change nothing): the page,
    which shows the box for every run, leaves it out then; the command it runs starts."""
    roots = Roots([tmp_path, ROOT])
    alone = forms.flags(_run_form(tmp_path), roots)
    assert not [flag for flag in alone if flag.startswith(("--val-interval", "--val-manifest"))]
    assert "--save-interval=50" in alone  # the config's value, sent as every other main field
    settings = _settings(alone)
    assert {"save_interval", "effective_batch_size"} <= settings.named
    check_start_settings(settings.config.train, settings.named, has_validation=False, world_size=1)
    validated = forms.flags(_run_form(tmp_path, val_manifests=f"{tmp_path}/v.jsonl"), roots)
    assert f"--val-interval={forms.defaults_for(TINY)['val_interval']}" in validated


def test_a_batch_the_run_would_not_train_with_is_refused_on_the_page(tmp_path) -> None:
    """The page sends the micro-batch, the accumulation and the effective batch it shows: when the first two
    make another batch, the run would refuse them; the page says so before it starts anything."""
    roots = Roots([tmp_path, ROOT])
    hparams = {**forms.defaults_for(TINY), "batch_size": 4, "grad_accumulation": 4, "effective_batch_size": 8}
    with pytest.raises(UserError, match=r"^--effective-batch-size 8 does not match --batch-size 4 x "
                                        r"--grad-accumulation 4 x 1 process\(es\) = 16"):
        forms.flags(forms.RunForm(f"{tmp_path}/a.jsonl", str(tmp_path / "out"), TINY, hparams=hparams), roots)
    agreed = forms.flags(forms.RunForm(f"{tmp_path}/a.jsonl", str(tmp_path / "out"), TINY,
                                       hparams={**hparams, "effective_batch_size": 16}), roots)
    assert {"--batch-size=4", "--grad-accumulation=4", "--effective-batch-size=16"} <= set(agreed)
