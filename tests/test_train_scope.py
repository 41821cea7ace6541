"""--train-scope partial / lora through the real trainer, for IndexTTS2 and IndexTTS-2.5: exact resume
after SIGKILL, frozen tensors bit-identical to the base, the loss falling, the scope fixed for a run,
and the merged export in the family's official layout (evaluate equal to the adapter checkpoint's).

Each (family, scope) trains once uninterrupted (`reference`, 8 steps over an epoch boundary) and the
tests share those runs. Only the run that is killed is a process of its own (SIGKILL needs one); the
reference and the resume run the same CLI in this process, which saves a torch import per run and
shows the trainer gives the same bits in or out of a fresh process.
"""

from __future__ import annotations

import math
import shutil
import signal
from pathlib import Path

import pytest
import test_train_loop_v25
import torch
from helpers import start
from test_train_resume import assert_same_final_state, cli_args, finish
from typer.testing import CliRunner

import indextts_train.demo as demo
from indextts_train.checkpoint.export import export_checkpoint
from indextts_train.checkpoint.files import load_checkpoint
from indextts_train.checkpoint.verify import verify_checkpoint
from indextts_train.cli import app
from indextts_train.config.constants import TEXT_ROW_KEYS
from indextts_train.config.family import INDEXTTS2, INDEXTTS25
from indextts_train.config.scope_settings import ScopeSettings
from indextts_train.config.settings import load_config
from indextts_train.model.layout import official_shapes
from indextts_train.model.lora import apply_adapter_file
from indextts_train.train.evaluate import evaluate_checkpoint

pytestmark = pytest.mark.slow  # every test here trains a tiny run or starts the CLI: seconds each

ROOT = Path(__file__).resolve().parents[1]
STEPS = 8  # 24 samples / effective batch 4: 6 steps an epoch, so a run crosses into epoch 1
SCOPE_FLAGS = {"partial": ("--train-scope", "partial"),  # the tiny configs: partial_layers 1 of 2 blocks
               "lora": ("--train-scope", "lora", "--lora-rank", "4", "--lora-dropout", "0.1")}
CASES = [("2", "lora"), ("2", "partial"), ("2.5", "lora"), ("2.5", "partial")]
# (family, scope) -> where the one kill lands: mid-save, past the epoch boundary (with adapter dropout),
# mid-step. IndexTTS2 partial is left out to keep the file short (a kill costs a fresh process): its
# freezing is 2.5 partial's, and test_resume kills IndexTTS2 runs at every point.
KILLS = {("2", "lora"): "save_before_latest@4", ("2.5", "lora"): "accumulation@7",
         ("2.5", "partial"): "accumulation@3"}
R, K = 320, 50  # IndexTTS-2.5 tiny: base tiktoken ranks and the ranks the grown vocabulary adds


@pytest.fixture(scope="module")
def grown(tmp_path_factory) -> Path:
    """Tiny IndexTTS2 config with 150 text tokens over the 100-token base: new rows train, base rows freeze."""
    text = (ROOT / "configs" / "tiny.yaml").read_text()
    path = tmp_path_factory.mktemp("cfg") / "grown.yaml"
    path.write_text(text.replace("number_text_tokens: 100", "number_text_tokens: 150"))
    return path


@pytest.fixture(scope="module")
def family_data(tiny_data, tiny25_data, grown) -> dict:
    return {"2": {**tiny_data, "config": grown}, "2.5": tiny25_data}


def run_here(args: list[str]) -> str:
    """`args` (a `python -m indextts_train train ...` command) run to the end in this process."""
    result = CliRunner().invoke(app, [str(a) for a in args[3:]])
    assert result.exit_code == 0, result.output
    return result.output


def scoped_args(data: dict, family: str, out: Path, scope: str) -> list[str]:
    if family == "2.5":
        return test_train_loop_v25.cli_args(data, out, max_steps=STEPS, extra=SCOPE_FLAGS[scope])
    args = cli_args(data, data["config"], out, 0)
    args[args.index("--max-steps") + 1] = str(STEPS)
    return args + list(SCOPE_FLAGS[scope])


@pytest.fixture(scope="module")
def reference(family_data, tmp_path_factory):
    """The uninterrupted run of a (family, scope), trained on first use."""
    runs: dict[tuple[str, str], Path] = {}

    def get(family: str, scope: str) -> Path:
        if (family, scope) not in runs:
            out = tmp_path_factory.mktemp(f"ref{family}{scope}")
            output = run_here(scoped_args(family_data[family], family, out, scope))
            assert f"train scope: {scope}" in output
            runs[family, scope] = out
        return runs[family, scope]

    return get


def gpt_config(family: str, data: dict):
    return load_config(data["config"]).gpt


def frozen_keys(family: str, scope: str, data: dict) -> list[str]:
    """Tensors the scope never trains (the tiny models have 2 blocks; partial trains block 1)."""
    never = ("mel_embedding.", "text_pos_embedding.", "mel_pos_embedding.", "speed_emb.", "gpt.h.0.",
             "conditioning_encoder.", "emo_layer.", "emo_perceiver_encoder.")
    if scope == "lora":
        never += ("gpt.h.1.", "gpt.ln_f.", "final_norm.")
    if family == "2.5":
        never += ("spk_emb_proj.",)  # in the optimizer, frozen by the row freezer (no --train-speaker-proj)
    return [k for k in official_shapes(gpt_config(family, data)) if k.startswith(never)]


def base_rows_equal(family: str, got: dict, base: dict) -> bool:
    if family == "2":
        return all(torch.equal(got[k][:100], base[k][:100]) for k in TEXT_ROW_KEYS)
    return all(torch.equal(got[k][:R], base[k][:R]) and torch.equal(got[k][R + K:], base[k][R:])
               for k in TEXT_ROW_KEYS)  # 2.5: ranks, then the specials moved up by K


@pytest.mark.parametrize(("family", "scope"), list(KILLS), ids=[f"{f}-{s}" for f, s in KILLS])
def test_sigkill_then_resume_is_bit_identical(family_data, reference, tmp_path, family, scope) -> None:
    data, whole = family_data[family], reference(family, scope)
    killed = tmp_path / "killed"
    code, output = finish(start(scoped_args(data, family, killed, scope),
                                env={"INDEXTTS_TRAIN_CRASH_AT": KILLS[family, scope]}))
    assert code == -signal.SIGKILL, f"{KILLS[family, scope]} did not fire:\n{output}"
    assert "resuming from" in run_here(scoped_args(data, family, killed, scope))
    assert_same_final_state(killed, whole)
    got, want = load_checkpoint(killed / "latest.pth"), load_checkpoint(whole / "latest.pth")
    if scope == "lora":
        assert got["lora"]["adapters"].keys() == want["lora"]["adapters"].keys()
        assert all(torch.equal(got["lora"]["adapters"][k], v) for k, v in want["lora"]["adapters"].items())
    else:
        assert got["lora"] is None


@pytest.mark.parametrize(("family", "scope"), CASES, ids=[f"{f}-{s}" for f, s in CASES])
def test_the_scope_trains_and_the_rest_stays_bit_identical(family_data, reference, family, scope) -> None:
    data = family_data[family]
    got = load_checkpoint(reference(family, scope) / "latest.pth")
    losses = [row[1] for row in got["history"]["train"]]
    assert sum(losses[-3:]) < 0.95 * sum(losses[:3]), losses  # it trains
    base = torch.load(data["base"], weights_only=True)
    frozen = frozen_keys(family, scope, data)
    for key in frozen:
        assert torch.equal(got["model"][key], base[key]), key
    assert base_rows_equal(family, got["model"], base)
    names = got["optimizer_param_names"]  # only what trains has optimizer state
    assert not set(names) & {k for k in frozen if not k.startswith("spk_emb_proj.")}
    assert any(".lora_A" in n for n in names) == (scope == "lora")
    if family == "2.5":  # the languages of the data learn their rows under every scope
        unused = [row for row in range(107) if row not in (0, 75)]
        lang, base_lang = got["model"]["lang_embedding.weight"], base["lang_embedding.weight"]
        assert torch.equal(lang[unused], base_lang[unused]) and not torch.equal(lang[[0, 75]], base_lang[[0, 75]])


@pytest.mark.parametrize(("family", "scope"), CASES, ids=[f"{f}-{s}" for f, s in CASES])
def test_export_merges_into_the_official_layout(family_data, reference, tmp_path, family, scope) -> None:
    data, run = family_data[family], reference(family, scope) / "latest.pth"
    export = tmp_path / "export"
    tokenizer = Path(data["tokenizer"]) if family == "2.5" else None
    export_checkpoint(run, export / "gpt.pth", config_out=export / "config.yaml", tokenizer=tokenizer)
    exported = torch.load(export / "gpt.pth", weights_only=True)
    shipped = load_config(export / "config.yaml").gpt
    assert shipped.family is (INDEXTTS25 if family == "2.5" else INDEXTTS2)
    assert list(exported) == list(official_shapes(shipped))  # exactly the official keys, in release order
    assert {k: tuple(v.shape) for k, v in exported.items()} == official_shapes(shipped)
    # what export makes of the plain base gpt.pth: the same keys in the same order and shapes, but text rows
    export_checkpoint(data["base"], tmp_path / "base_export.pth", base_config=Path(data["config"]))
    plain = torch.load(tmp_path / "base_export.pth", weights_only=True)
    assert list(plain) == list(exported)
    for key, tensor in plain.items():
        rows = 1 if key in TEXT_ROW_KEYS else 0  # only the text rows grew
        assert tensor.shape[rows:] == exported[key].shape[rows:], key
    if family == "2.5":
        assert (export / INDEXTTS25.tokenizer_name).read_bytes() == tokenizer.read_bytes()
    manifest = [Path(data["val"])]
    adapted = evaluate_checkpoint(run, manifest)
    merged = evaluate_checkpoint(export / "gpt.pth", manifest, export / "config.yaml")
    for key in ("text_loss", "mel_loss", "loss"):
        assert math.isclose(adapted[key], merged[key], rel_tol=0, abs_tol=1e-5), key
    base = torch.load(data["base"], weights_only=True)
    trunk = "gpt.h.0.attn.c_attn.weight"  # frozen by partial; lora's merge changes it
    assert torch.equal(exported[trunk], base[trunk]) == (scope == "partial")
    if scope == "lora":  # the adapters-only file reproduces the merged export from the base
        grown = ["--tokenizer", str(tokenizer)] if tokenizer else []  # a grown 2.5 vocabulary ships with it
        result = CliRunner().invoke(app, ["export", str(run), "-o", str(tmp_path / "again.pth"),
                                          "--adapters-out", str(tmp_path / "lora.pth"), *grown])
        assert result.exit_code == 0, result.output
        payload = torch.load(tmp_path / "lora.pth", weights_only=True)
        assert payload["applies_to"]["family"] == shipped.family.key
        assert (tmp_path / "lora.pth").stat().st_size < (tmp_path / "again.pth").stat().st_size / 2
        applied = apply_adapter_file(base, payload, "lora.pth")
        assert all(torch.allclose(applied[k], exported[k], rtol=0, atol=1e-6) for k in exported)
    assert verify_checkpoint(run).status == "COMPLETE"


@pytest.mark.parametrize("family", ["2", "2.5"])
def test_the_scope_cannot_change_on_resume(family_data, reference, tmp_path, family) -> None:
    out = tmp_path / "run"
    shutil.copytree(reference(family, "lora"), out, ignore=shutil.ignore_patterns("logs"))
    args = scoped_args(family_data[family], family, out, "lora")[3:-len(SCOPE_FLAGS["lora"])]
    before = {p.name: p.stat().st_mtime_ns for p in out.glob("*.pth")}  # checkpoints untouched (the lock aside)
    for flags, needle in ((["--train-scope", "full"], "this run asks for full"),
                          (["--train-scope", "lora", "--lora-rank", "8"], "asks for lora (rank 8")):
        result = CliRunner().invoke(app, args + flags)
        assert result.exit_code == 2, result.output
        line = result.stderr.strip()
        assert "\n" not in line and "was trained with --train-scope lora (rank 4" in line and needle in line
        assert "export" in line  # says how to switch
    assert {p.name: p.stat().st_mtime_ns for p in out.glob("*.pth")} == before
    state = load_checkpoint(out / "latest.pth")  # a lora checkpoint without its adapters cannot resume
    del state["lora"]
    torch.save(state, tmp_path / "no_adapters.pth")
    verdict = verify_checkpoint(tmp_path / "no_adapters.pth")
    assert verdict.status != "COMPLETE" and any("lora: missing" in r for r in verdict.reasons), verdict.reasons


@pytest.mark.parametrize("family", ["2", "2.5"])
def test_demo_trains_the_scope_it_is_given(family_data, tmp_path, monkeypatch, family) -> None:
    """`demo --train-scope` reaches the trainer (the runs above train each scope on the demo's data). The
    demo's data (the real prepare, test_train_demo.py checks it) is this file's: the flag is the point."""
    seen = []
    data = family_data[family]
    monkeypatch.setattr(demo, "make_prepared_demo", lambda out_dir, config_path, **_: {
        "base_tokenizer": data.get("base_tokenizer", data["base"]), "tokenizer": data.get("tokenizer", data["base"]),
        "model_dir": data["folder"], "normalizer": "none", "base_checkpoint": data["base"],
        "train_manifest": data["train"], "val_manifest": data["val"], "inference_widths": False})
    monkeypatch.setattr(demo, "train", lambda options: seen.append(options) or 2)
    assert demo.run_demo(tmp_path, max_steps=3, family=family, train_scope="lora") == 2
    assert seen[0].config.train.train_scope == "lora"
    config = load_config(seen[0].inputs.config)  # and `demo --train-scope partial` fits the tiny model
    ScopeSettings("partial", partial_layers=config.train.partial_layers).check_fits(config.gpt.layers)
