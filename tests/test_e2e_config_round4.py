"""Probe round 4 on the inputs a newcomer or an attacker hands over: the `--config` YAML (a key written twice, a
number YAML reads as text, a list of non-text), an output flag whose value was forgotten, `--resume ''`, a
recorded run out of range, an assumed GPU no plan can mean, a bare gpt.pth evaluated beside its official
config, and checkpoints whose optimizer set, scheduler or weights hold values torch cannot resume from (they
loaded, then failed steps later with a traceback, or quietly trained on another schedule)."""

from __future__ import annotations

import copy
import re
from pathlib import Path

import pytest
import torch
import yaml
from helpers import assert_refused, run_cli, train_tiny_run
from test_checkpoint_files import make_state

from indextts_train.checkpoint.files import CheckpointError
from indextts_train.checkpoint.repair import repair_checkpoint
from indextts_train.checkpoint.verify import choose_resume, verify_checkpoint
from indextts_train.cli import app, run_app
from indextts_train.config.settings import load_config
from indextts_train.config.yaml_keys import repeated_key
from indextts_train.errors import UserError
from indextts_train.train.device import assume_device
from indextts_train.train.hardware import choose_plan
from indextts_train.ui.run_record import RECORD_FORMAT
from indextts_train.ui.run_settings import resolve_settings

ROOT = Path(__file__).resolve().parents[1]
TINY = ROOT / "configs" / "tiny.yaml"


def _config(tmp_path: Path, train_text: str) -> Path:
    """configs/tiny.yaml with its train: section replaced by `train_text` (block YAML, indented 2)."""
    data = yaml.safe_load(TINY.read_text())
    data.pop("train", None)
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(data) + "train:\n" + train_text, encoding="utf-8")
    return path


# ----------------------------------------------------------------------------- the config file


def test_a_list_of_non_text_is_refused_by_its_key(tmp_path: Path) -> None:
    """`borrow_languages: [1, 2]` passed the list check and ended in a traceback (`'int' object has no
    attribute 'partition'`) when the run parsed it."""
    for value in ("[1, 2]", "[[kab]]"):
        with pytest.raises(UserError, match=r"train\.borrow_languages: expected a list of str, got"):
            load_config(_config(tmp_path, f"  borrow_languages: {value}\n"))


def test_a_number_yaml_reads_as_text_says_how_to_write_it(tmp_path: Path) -> None:
    """PyYAML reads `1e-4` (no dot) as text: the line said `expected float, got '1e-4'`, which reads as a
    contradiction to whoever wrote a number."""
    with pytest.raises(UserError, match=r"train\.learning_rate: expected float, got the text '1e-4'.*write "
                                        r"1\.0e-4, without quotes"):
        load_config(_config(tmp_path, "  learning_rate: 1e-4\n"))
    with pytest.raises(UserError, match=r"train\.seed: expected int, got the text '12'.*write 12, without quotes"):
        load_config(_config(tmp_path, "  seed: '12'\n"))


def test_a_key_given_twice_is_refused_with_both_lines(tmp_path: Path) -> None:
    """YAML kept the last of two `epochs:` without a word: the file read 2 epochs, the run trained 30."""
    path = _config(tmp_path, "  epochs: 2\n  seed: 5\n  epochs: 30\n")
    lines = path.read_text().splitlines()
    first, again = (i + 1 for i, line in enumerate(lines) if line.startswith("  epochs:"))
    with pytest.raises(UserError, match=rf"config\.yaml line {again}: key 'epochs' is given twice \(lines {first} "
                                        rf"and {again}\)"):
        load_config(path)
    # the same name in two mappings, and a merge key, are not repeats; aliases are walked once each
    data = yaml.safe_load(TINY.read_text())
    data.pop("train", None)
    text = yaml.safe_dump(data) + "dataset:\n  a: &a {epochs: 1}\n  b: {<<: *a, seed: 2}\n  c: {<<: *a}\n"
    (tmp_path / "ok.yaml").write_text(text + "train:\n  epochs: 3\n", encoding="utf-8")
    assert load_config(tmp_path / "ok.yaml").train.epochs == 3
    bomb = "a: &a [x, x]\n" + "".join(f"{chr(98 + i)}: &{chr(98 + i)} [*{chr(97 + i)}, *{chr(97 + i)}]\n"
                                      for i in range(24))
    assert repeated_key(bomb) is None  # 2**25 values expanded, 26 nodes walked


def test_a_field_that_is_no_key_of_the_file_is_unknown(tmp_path: Path) -> None:
    """`gpt: {stated_family: null}` was accepted (an internal field: the family is the top-level `version:`), and
    `stated_family: x` said `expected Family or None`."""
    data = yaml.safe_load(TINY.read_text())
    for value in (None, "x"):
        data["gpt"]["stated_family"] = value
        (tmp_path / "c.yaml").write_text(yaml.safe_dump(data), encoding="utf-8")
        with pytest.raises(UserError, match=r"c\.yaml: gpt: unknown key\(s\) stated_family; known keys: model_dim"):
            load_config(tmp_path / "c.yaml")


def test_one_id_for_start_and_stop_is_refused(tmp_path: Path) -> None:
    """`stop_mel_token: 64` beside `start_mel_token: 64` trained: every target would stop where it starts."""
    for kind, start in (("mel", 64), ("text", 0)):
        data = yaml.safe_load(TINY.read_text())
        data["gpt"][f"stop_{kind}_token"] = start
        (tmp_path / "c.yaml").write_text(yaml.safe_dump(data), encoding="utf-8")
        with pytest.raises(UserError, match=rf"gpt\.start_{kind}_token and gpt\.stop_{kind}_token are both {start}; "
                                            "they must differ"):
            load_config(tmp_path / "c.yaml")


def test_a_forgetting_limit_given_twice_is_refused(tmp_path: Path) -> None:
    """`zh=5,zh=6` kept 6 without a word (and `5,3` kept 3)."""
    for text, who in (("zh=5,zh=6", "zh"), ("5,3", "every language")):
        with pytest.raises(UserError, match=rf"\(--forgetting-limit\) {text}: {who} is given two limits"):
            load_config(_config(tmp_path, f"  forgetting_limit: '{text}'\n"))


# ----------------------------------------------------------------------------- flags


def test_an_output_flag_given_a_flag_is_refused(tmp_path: Path, monkeypatch, capsys) -> None:
    """`--output-dir --skip-bad-lines` (the value left out) trained into a folder named `--skip-bad-lines`,
    without skipping bad lines; `--out=--json` made a folder `--json`."""
    monkeypatch.chdir(tmp_path)
    for args in (["train", "--train-manifest", "t.jsonl", "--output-dir", "--skip-bad-lines"],
                 ["train", "--train-manifest", "t.jsonl", "--output-dir=--resume"],
                 ["tokenize", "t.jsonl", "--tokenizer", "bpe.model", "--out=--json"]):
        assert run_app(app, args) == 2
        line = capsys.readouterr().err.strip()
        assert line.startswith("error: --") and "a flag, not a path (was the value left out?)" in line, line
        assert "\n" not in line
    assert list(tmp_path.iterdir()) == []


def test_an_empty_input_path_is_said_as_empty(tmp_path: Path, monkeypatch, capsys) -> None:
    """`--config ''` was `. is a folder; pass the config file in it`, `--from-run ''` offered the working
    directory's run.yaml: an empty path is the current folder."""
    monkeypatch.chdir(tmp_path)
    for args, flag in ((["train", "--train-manifest", "t.jsonl", "--output-dir", "o", "--config", ""], "--config"),
                       (["train", "--from-run=", "--output-dir", "o"], "--from-run"),
                       (["evaluate", "--checkpoint", "", "--manifest", "m.jsonl"], "--checkpoint")):
        assert run_app(app, args) == 2
        assert capsys.readouterr().err.strip() == (f"error: {flag} is empty; give the path to read (empty is the "
                                                   "current folder)")
    for args in (["checkpoints", ""], ["verify", ""], ["export", "", "-o", "x.pth"], ["check-data", "m.jsonl", ""]):
        assert run_app(app, args) == 2  # `checkpoints ''` listed the working folder, exit 0
        assert capsys.readouterr().err.strip() == (f"error: {args[0]}: an argument is empty; give the path to read "
                                                   "(empty is the current folder)")
    assert list(tmp_path.iterdir()) == []


def test_an_empty_resume_is_said_as_empty(tmp_path: Path, tiny_data: dict) -> None:
    """`--resume ''` was `--resume : checkpoint not found (looked for from ...)`."""
    with pytest.raises(UserError, match=r"^--resume is empty; pass auto"):
        resolve_settings(train_manifests=[str(tiny_data["train"])], output_dir=tmp_path / "run",
                         config=tiny_data["config"], resume="")
    assert not (tmp_path / "run").exists()


def test_a_recorded_value_out_of_range_names_the_record(tmp_path: Path, tiny_data: dict) -> None:
    """A hand-edited run.yaml with `learning_rate: .nan` was refused without naming the record (`train.learning_rate
    ... got nan`), while its wrong types were named by it."""
    record = {"format": RECORD_FORMAT, "cwd": str(tmp_path), "argv": [],
              "options": {"train_manifests": [str(tiny_data["train"])], "output_dir": str(tmp_path / "run"),
                          "config": str(tiny_data["config"])},
              "config": {"train": {"learning_rate": float("nan")}}}
    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump(record), encoding="utf-8")
    with pytest.raises(UserError, match=rf"^--from-run {path}: config\.train\.learning_rate \(--learning-rate\) "
                                        r"must be a finite number, got nan; fix it or pass the flag"):
        resolve_settings(from_run=path, output_dir=tmp_path / "again", typed={"from_run", "output_dir"})


def test_an_assumed_gpu_no_plan_can_mean_is_refused() -> None:
    """`--assume 0GiB@8.9` was told to shrink the model; `99999999999GiB@8.0` and `24GiB@0.0` got plans."""
    gpt = load_config(TINY).gpt
    for spec in ("0GiB@8.9", "99999999999GiB@8.0", "24GiB@0.0", "24GiB@2.9"):
        with pytest.raises(UserError, match=r"not a GPU a plan can be made for .*e\.g\. --assume 24GiB@8\.9"):
            choose_plan(assume_device(spec), gpt, effective_batch=8)
    assert choose_plan(assume_device("24GiB@3.0"), gpt, effective_batch=8).micro_batch >= 1


def test_a_bare_gpt_pth_is_evaluated_with_the_official_config_beside_it(tiny_models: Path, tiny_data: dict) -> None:
    """Without --config, evaluate sized a model folder's gpt.pth by configs/indextts2.yaml (the full-size
    model) and refused it as 481 missing keys; train-gpt takes the folder's config.yaml for the same file."""
    from indextts_train.train.evaluate import evaluate_checkpoint

    result = evaluate_checkpoint(tiny_models / "gpt.pth", [tiny_data["val"]], batch_size=4)
    assert result["samples"] == 8 and result["loss"] > 0


def test_a_bare_gpt_pth_is_exported_with_the_official_config_beside_it(tiny_models: Path, tmp_path: Path) -> None:
    """`export MODELS/gpt.pth` said the file stores no config (pass --config), where evaluate and train-gpt take
    the folder's config.yaml for the same file; now export takes it too."""
    from typer.testing import CliRunner

    result = CliRunner().invoke(app, ["export", str(tiny_models / "gpt.pth"), "-o", str(tmp_path / "gpt.pth")])
    assert result.exit_code == 0, result.output
    exported, base = torch.load(tmp_path / "gpt.pth"), torch.load(tiny_models / "gpt.pth")
    assert exported.keys() == base.keys() and all(torch.equal(exported[k], base[k]) for k in base)


def test_a_folder_holding_a_run_says_so(tmp_path: Path, capsys) -> None:
    """The demo's OUT holds its run in OUT/run: `checkpoints OUT` said "no checkpoints" (exit 0) and `export OUT`
    "no best.pth or latest.pth"; both now name the run inside."""
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "latest.pth").write_bytes(b"")
    (tmp_path / "data").mkdir()
    assert run_app(app, ["checkpoints", str(tmp_path)]) == 0
    assert capsys.readouterr().out.strip() == f"{tmp_path}: no checkpoints; {tmp_path / 'run'} holds a run: pass it"
    assert run_app(app, ["export", str(tmp_path), "-o", str(tmp_path / "x" / "gpt.pth")]) == 2
    assert f"no best.pth or latest.pth in this folder; {tmp_path / 'run'} holds a run: pass it" in \
        capsys.readouterr().err


# ----------------------------------------------------------------------------- checkpoints torch cannot resume


def _group(key: str, value: object):
    def edit(state: dict) -> None:
        state["optimizer"]["param_groups"][0][key] = value
    return edit


def _moment(key: str, value: object):
    def edit(state: dict) -> None:
        state["optimizer"]["state"][0][key] = value
    return edit


def _scheduler(key: str, value: object):
    def edit(state: dict) -> None:
        state["scheduler"][key] = value
    return edit


def _weights(dtype: torch.dtype):
    def edit(state: dict) -> None:
        name = next(iter(state["model"]))
        state["model"][name] = state["model"][name].to(dtype)
    return edit


def _step(state: dict) -> None:
    state["progress"]["step"] = 2**70


def _foreign_state_key(state: dict) -> None:
    state["optimizer"]["state"][999] = {"step": torch.tensor(1.0)}


def _repeated_param(state: dict) -> None:
    params = state["optimizer"]["param_groups"][0]["params"]
    params[1] = params[0]


UNLOADABLE = {  # each loaded, then failed at the first step (traceback) or changed the schedule silently
    "lr text": (_group("lr", "x"), r"param_groups\[0\]\.lr is 'x', not a finite number"),
    "lr nan": (_group("lr", float("nan")), r"param_groups\[0\]\.lr is nan"),
    "betas": (_group("betas", "x"), r"param_groups\[0\]\.betas is 'x', not two numbers in \[0, 1\)"),
    "eps None": (_group("weight_decay", None), r"weight_decay is None"),
    "flag": (_group("foreach", "yes"), r"foreach is 'yes', not true or false"),
    "params twice": (_repeated_param, r"params are not distinct parameter numbers"),
    "moment shape": (_moment("exp_avg", torch.zeros(3)), r"exp_avg is torch\.float32 \[3\], not float32 \["),
    "moment dtype": (None, r"exp_avg is torch\.int64 \[.*\], not float32"),
    "moment step": (_moment("step", "x"), r"step is 'x', not a step count"),
    "state key": (_foreign_state_key, r"state\[999\] is not the state of one of its parameters"),
    "last_epoch": (_scheduler("last_epoch", -7), r"scheduler: last_epoch is -7, not a step count"),
    "lr_lambdas": (_scheduler("lr_lambdas", "x"), r"scheduler: lr_lambdas is 'x'"),
    "base_lrs": (_scheduler("base_lrs", None), r"scheduler: base_lrs is None"),
    "int weights": (_weights(torch.int64), r"is torch\.int64; an exact resume needs float32 weights"),
    "complex weights": (_weights(torch.complex64), r"is torch\.complex64; an exact resume needs float32"),
    "step": (_step, r"progress: step 1,180,591,620,717,411,303,424 is beyond any run"),
}


def _crafted(tmp_path: Path, case: str) -> Path:
    state = make_state(2)
    edit, _ = UNLOADABLE[case]
    if edit is None:  # moments of the parameter's shape, as integers
        moment = state["optimizer"]["state"][0]["exp_avg"]
        state["optimizer"]["state"][0]["exp_avg"] = torch.zeros(moment.shape, dtype=torch.int64)
    else:
        edit(state)
    path = tmp_path / f"model_step2_{case.replace(' ', '_')}.pth"
    torch.save(state, path)
    return path


@pytest.mark.parametrize("case", sorted(UNLOADABLE))
def test_values_torch_cannot_resume_from_make_a_checkpoint_partial(tmp_path: Path, case: str) -> None:
    path = _crafted(tmp_path, case)
    verdict = verify_checkpoint(path)
    assert (verdict.status, verdict.kind) == ("PARTIAL", "indextts-train"), verdict
    assert any(re.search(UNLOADABLE[case][1], reason) for reason in verdict.reasons), verdict.reasons
    with pytest.raises(UserError, match=f"^--resume {path}: PARTIAL: "):
        choose_resume([path], named=True)
    assert choose_resume([path]).path is None  # --resume auto skips it, and the file stays
    assert path.is_file()


def test_repair_drops_an_optimizer_torch_cannot_load_and_refuses_weights_that_are_not(tmp_path: Path) -> None:
    """Repair wrote such files back unchanged and said `repaired`; verify then still said PARTIAL."""
    moments = _crafted(tmp_path, "moment shape")
    target, notes = repair_checkpoint(moments, tmp_path / "repaired.pth")
    assert verify_checkpoint(target).status == "COMPLETE"
    assert any("optimizer, scheduler and scaler dropped together (optimizer: state of" in n for n in notes), notes
    weights = _crafted(tmp_path, "int weights")
    before = weights.read_bytes()
    with pytest.raises(CheckpointError, match=r"is torch\.int64, not floating point: not weights a repair can "
                                              r"recover"):
        repair_checkpoint(weights, tmp_path / "repaired2.pth")
    assert weights.read_bytes() == before and not (tmp_path / "repaired2.pth").exists()


def test_a_genuine_checkpoint_stays_complete(tmp_path: Path) -> None:
    """The checks read what the trainer writes as it writes it (the crafted cases above fail alone)."""
    path = tmp_path / "model_step2.pth"
    state = make_state(2)
    torch.save(copy.deepcopy(state), path)
    assert verify_checkpoint(path).status == "COMPLETE"
    broken = tmp_path / "model_step3.pth"
    state["scheduler"]["_step_count"] = "x"
    torch.save(state, broken)
    assert verify_checkpoint(broken).status == "PARTIAL"


def test_verify_prints_a_files_text_escaped(tmp_path: Path, capsys) -> None:
    """`verify -v` printed a crafted `created: "\\x1b]0;pwned\\x07\\x1b[2J"` raw: the terminal retitled and cleared
    itself, and a line break in `precision` forged a line of the report."""
    state = make_state(2)
    state["created"] = "\x1b]0;pwned\x07\x1b[2J"
    state["hparams"]["precision"] = "fp32\n  status: COMPLETE"
    path = tmp_path / "model_step2.pth"
    torch.save(state, path)
    assert run_app(app, ["verify", str(path), "-v"]) == 0
    out = capsys.readouterr().out
    assert "\x1b" not in out and "  created: \\x1b]0;pwned\\x07\\x1b[2J" in out, out
    assert "  precision: fp32\\n  status: COMPLETE" in out, out


@pytest.mark.slow
def test_resume_from_a_crafted_optimizer_is_one_line_not_a_traceback(tmp_path: Path, tiny_data: dict) -> None:
    """The real CLI: `--resume FILE` whose param group holds `eps: 'x'` ended at the first step in a traceback
    (`add_(): argument 'other' must be Tensor, not str`); now one line before any step, the file untouched."""
    run = train_tiny_run(tiny_data, tmp_path / "run", max_steps=2)
    state = torch.load(run / "model_step2.pth", weights_only=True)
    state["optimizer"]["param_groups"][0]["eps"] = "x"
    crafted = tmp_path / "crafted.pth"
    torch.save(state, crafted)
    before = crafted.read_bytes()
    result = run_cli("train", "--train-manifest", tiny_data["train"], "--config", tiny_data["config"],
                     "--base-checkpoint", tiny_data["base"], "--output-dir", tmp_path / "again", "--batch-size", "4",
                     "--grad-accumulation", "1", "--effective-batch-size", "4", "--max-steps", "3",
                     "--resume", crafted)
    assert result.returncode == 2 and "Traceback" not in result.stdout + result.stderr, result.stderr[-2000:]
    assert_refused(result, f"--resume {crafted}: PARTIAL: optimizer: param_groups[0].eps is 'x'")
    assert crafted.read_bytes() == before
