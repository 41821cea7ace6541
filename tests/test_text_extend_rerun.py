"""`extend-tokenizer` killed between its two files (.model, then .vocab) is finished by the same command:
a file that already holds exactly what the run writes is left as it is; any other is still refused."""

from __future__ import annotations

from pathlib import Path

from typer.testing import CliRunner

from indextts_train.cli import app
from tests.conftest import REFERENCE

BASE = REFERENCE / "prepare" / "text" / "bpe_tiny.model"  # 150 pieces
TURKISH = ["Bugün hava çok güzel, Ayşe ile parka gidiyoruz.", "Öğretmenimiz yarın sınavı erteleyeceğini söyledi."]


def _extend(tmp_path: Path, out: Path, size: int = 160):
    corpus = tmp_path / "turkish.txt"
    corpus.write_text("\n".join(TURKISH) + "\n", encoding="utf-8")
    return CliRunner().invoke(app, ["extend-tokenizer", "--base", str(BASE), "--corpus", str(corpus),
                                    "--target-size", str(size), "--normalizer", "none", "-o", str(out)])


def test_a_kill_between_model_and_vocab_is_finished_by_the_same_command(tmp_path: Path):
    assert _extend(tmp_path, tmp_path / "ref" / "tr.model").exit_code == 0
    out = tmp_path / "run" / "tr.model"
    out.parent.mkdir()
    out.write_bytes((tmp_path / "ref" / "tr.model").read_bytes())  # killed: the .model in place, the .vocab not
    again = _extend(tmp_path, out)
    assert again.exit_code == 0, again.output
    said = again.stdout.splitlines()[0]  # what was done with the output: kept, not "wrote" (it was not written)
    assert said.startswith(f"kept {out} (an earlier run of this command wrote the same bytes) (150 base + 10 new")
    assert "already held" not in again.stderr  # the .vocab was written: nothing else to say
    twice = _extend(tmp_path, out)  # both files there: the output's line, and the .vocab's warning
    assert twice.stdout.startswith(f"kept {out} ") and f"{out.with_suffix('.vocab')} already held" in twice.stderr
    for name in ("tr.model", "tr.vocab"):
        assert (tmp_path / "run" / name).read_bytes() == (tmp_path / "ref" / name).read_bytes()
    assert sorted(p.name for p in out.parent.iterdir()) == ["tr.model", "tr.vocab"]  # no temp file left


def test_a_tiktoken_rerun_says_it_kept_its_output(tiny25_data, tmp_path: Path):
    corpus = tmp_path / "am.txt"
    corpus.write_text("ሰላም ነው። እንዴት ነህ?\n", encoding="utf-8")
    args = ["extend-tokenizer", "--base", str(tiny25_data["base_tokenizer"]), "--corpus", str(corpus),
            "--target-size", "1996", "-o", str(tmp_path / "am.tiktoken")]
    first, again = CliRunner().invoke(app, args), CliRunner().invoke(app, args)
    assert first.exit_code == again.exit_code == 0, again.output
    assert first.stdout.startswith(f"wrote {tmp_path / 'am.tiktoken'} (")
    assert again.stdout.startswith(f"kept {tmp_path / 'am.tiktoken'} (an earlier run of this command wrote")


def test_another_tokenizer_under_the_name_is_still_refused_whole(tmp_path: Path):
    out = tmp_path / "tr.model"
    assert _extend(tmp_path, out).exit_code == 0
    out.with_suffix(".vocab").unlink()
    before = out.read_bytes()
    refused = _extend(tmp_path, out, 170)  # another size: another tokenizer, not this command's
    assert refused.exit_code == 2 and "tr.model already exists; pass --force" in refused.stderr
    assert out.read_bytes() == before and not out.with_suffix(".vocab").exists()  # nothing written, not even the vocab
