"""What a careless user or an attacker found in extend-tokenizer, check-tokenizer and check-data, each case
pinned: a long piece or rank that made the tiktoken merge loop quadratic (minutes on a 135 KB file), an
output that was also an input, a sample or corpus read as something it is not, a share of extended tokens
counted at the wrong ids, and a tokenizer of the other family refused line by line for the wrong reason."""

from __future__ import annotations

import base64
import json
import random
import shutil
from pathlib import Path

import numpy as np
import pytest
import typer

from indextts_train.cli import app, run_app
from indextts_train.cli_flags import plain_help
from indextts_train.config.family import INDEXTTS2
from indextts_train.config.settings import GPTConfig
from indextts_train.data.checkdata import (
    check_flags_read,
    check_manifests,
    clean_line,
    render_check_report,
    write_clean_manifest,
)
from indextts_train.errors import UserError
from indextts_train.text.corpus_lines import iter_text_lines
from indextts_train.text.inference_text import TextPath
from indextts_train.text.spm_model import _iter_fields, _len_field, parse_model, read_model
from indextts_train.text.tiktoken_vocab import LEARN_PIECE_CHARS, corpus_pieces, merged_parts

ROOT = Path(__file__).resolve().parents[1]
TEXT = ROOT / "tests" / "data" / "reference" / "prepare" / "text"
SPM = TEXT / "bpe_tiny.model"
TOY = TEXT / "toy_base.tiktoken"  # 100 ranks + 1673 specials
PAIRS = ROOT / "tests" / "data" / "reference" / "v2_5" / "tiny" / "pairs.jsonl"  # made with a 100-rank vocabulary
CLI = typer.main.get_command(plain_help(app))


def one_line(args: list[object], capsys, needle: str) -> str:
    """Run the command in this process: exit 2, one `error:` line holding `needle`, no traceback."""
    assert run_app(CLI, [str(a) for a in args]) == 2, args
    captured = capsys.readouterr()
    lines = [line for line in captured.err.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), (lines, captured.out[-300:])
    assert needle in lines[0], (needle, lines[0])
    return lines[0]


# ---------------------------------------------------------------------------------------------
# the tiktoken merge loop


def _rescanned(table: dict[bytes, int], piece: bytes) -> list[bytes]:
    """tiktoken's rule as the plain loop states it: merge the lowest-ranked adjacent pair, leftmost first."""
    parts = [piece[i:i + 1] for i in range(len(piece))]
    while len(parts) > 1:
        pairs = enumerate(zip(parts, parts[1:], strict=False))
        ranked = [(table[a + b], i) for i, (a, b) in pairs if a + b in table]
        if not ranked:
            break
        _, at = min(ranked)
        parts[at:at + 2] = [parts[at] + parts[at + 1]]
    return parts


def test_the_heap_merge_loop_gives_the_rescanning_loops_parts() -> None:
    rng = random.Random(7)
    for _ in range(1500):
        alphabet = b"abc"[:rng.randint(1, 3)]
        tokens = list({bytes(rng.choice(alphabet) for _ in range(rng.randint(2, 5)))
                       for _ in range(rng.randint(0, 12))})
        rng.shuffle(tokens)
        table = {token: rank for rank, token in enumerate(tokens)}
        piece = bytes(rng.choice(alphabet) for _ in range(rng.randint(0, 30)))
        assert merged_parts(table, piece) == _rescanned(table, piece), (table, piece)


class _Counted(dict):
    lookups = 0

    def get(self, key, default=None):
        type(self).lookups += 1
        return super().get(key, default)


def test_a_long_piece_costs_lookups_in_proportion_to_its_length() -> None:
    """The rescanning loop looked up every pair after every merge: a 100 KB rank (a crafted .tiktoken of
    135 KB) kept check-tokenizer busy past two minutes, a 64 KB corpus word extend-tokenizer too."""
    size = 4000
    table = _Counted({b"aa": 0, b"aaaa": 1})
    assert merged_parts(table, b"a" * size) == [b"aaaa"] * (size // 4)
    assert _Counted.lookups < 10 * size  # the rescanning loop: about size**2 / 4 = 4,000,000


def test_a_corpus_line_without_spaces_is_learned_from_in_slices() -> None:
    pieces = corpus_pieces(["a" * (3 * LEARN_PIECE_CHARS + 5) + " ok"])
    assert max(len(piece) for piece in pieces) == LEARN_PIECE_CHARS
    assert pieces[b"a" * LEARN_PIECE_CHARS] == 3 and pieces[b"aaaaa"] == 1 and pieces[b" ok"] == 1


def test_check_tokenizer_on_a_crafted_long_rank_is_quick_and_shows_it_short(tmp_path, capsys) -> None:
    lines = [base64.b64encode(bytes([i])).decode() + f" {i}" for i in range(256)]
    lines += [base64.b64encode(b"aa").decode() + " 256", base64.b64encode(b"a" * 6000).decode() + " 257"]
    crafted = tmp_path / "crafted.tiktoken"
    crafted.write_text("\n".join(lines) + "\n")
    assert run_app(CLI, ["check-tokenizer", str(crafted)]) == 0
    out = capsys.readouterr().out
    assert "not built by merges: 1 e.g. 257:'aaaa" in out and "(6000 characters)" in out and len(out) < 2000


# ---------------------------------------------------------------------------------------------
# extend-tokenizer


@pytest.mark.parametrize("corpus_name, output_name", [("text.model", "text.model"), ("text.vocab", "text.model"),
                                                      ("text.tiktoken", "text.tiktoken")])
def test_extend_never_writes_over_its_corpus_even_with_force(tmp_path, capsys, corpus_name, output_name) -> None:
    corpus = tmp_path / corpus_name
    corpus.write_text("merhaba dunya\nnasilsin\n", encoding="utf-8")
    base, size = (TOY, 1780) if output_name.endswith(".tiktoken") else (SPM, 151)  # each: a few new pieces
    one_line(["extend-tokenizer", "--base", base, "--corpus", corpus, "--target-size", size, "-o",
              tmp_path / output_name, "--force"], capsys, f"would overwrite the --corpus file {corpus}")
    assert corpus.read_text(encoding="utf-8") == "merhaba dunya\nnasilsin\n"


def test_a_jsonl_corpus_with_a_byte_order_mark_is_read_as_jsonl(tmp_path) -> None:
    """Read as plain text, its braces and `"text":` were learned as pieces."""
    corpus = tmp_path / "am.jsonl"
    corpus.write_bytes(b'\xef\xbb\xbf{"text": "selam"}\n{"text": "dunya"}\n')
    assert list(iter_text_lines(corpus)) == ["selam", "dunya"]


def test_a_language_the_table_lacks_is_said_when_pieces_are_learned_for_it() -> None:
    """`--language eng` keeps the case `en` lowers: extend-tokenizer said nothing, check-tokenizer warned."""
    text_path = TextPath.open(TOY, normalizer="none")
    assert text_path.present_body("Hello", "eng") == "Hello" and text_path.present_body("Hello", "en") == "hello"
    (note,) = text_path.notes()
    assert "language 'eng' (1 text(s)) is not in IndexTTS-2.5's table" in note


# ---------------------------------------------------------------------------------------------
# check-tokenizer


@pytest.mark.parametrize("model", [SPM, TOY])
def test_an_empty_sample_is_refused_not_reported_as_covered(tmp_path, capsys, model) -> None:
    empty = tmp_path / "sample.txt"
    empty.write_text("\n  \n")
    one_line(["check-tokenizer", model, "--sample-text", empty], capsys, f"--sample-text {empty}: no text")


def test_a_model_whose_trainer_spec_is_torn_is_one_line(tmp_path, capsys) -> None:
    model = read_model(SPM)
    rest = [_len_field(2, b"\xff\xff\xff") if next(_iter_fields(raw))[0] == 2 else raw for raw in model.rest]
    torn = tmp_path / "torn.model"
    torn.write_bytes(b"".join(_len_field(1, piece.encode()) for piece in model.pieces) + b"".join(rest))
    with pytest.raises(UserError, match="not a SentencePiece model"):
        parse_model(torn.read_bytes(), str(torn))
    one_line(["check-tokenizer", torn], capsys, f"{torn}: not a SentencePiece model")


# ---------------------------------------------------------------------------------------------
# check-data


def test_the_extended_share_of_25_lines_counts_the_ranks_added_before_the_specials() -> None:
    """A 90-rank base grown by 10: ids 90..99 are new; the specials after them (every line's language tag)
    are not. Counting ids >= --base-vocab gave 0% for the base's number_text_tokens."""
    report = check_manifests([PAIRS], vocab_size=1773, base_vocab=1763)
    ids = []
    for line in map(json.loads, PAIRS.read_text().splitlines()):
        ids += np.load(PAIRS.parent / line["target_text_ids_path"])[:line["target_text_len"]].tolist()
    new = sum(90 <= i < 100 for i in ids)
    assert new and report["extended_token_share"] == new / len(ids) and report["extended_ids"] == [90, 100]
    assert "extended-vocabulary tokens (ids 90..99," in render_check_report(report)


@pytest.mark.parametrize("base_vocab, message", [(100, "has 1673 special tokens after its ranks"),
                                                 (1800, "--base-vocab 1800 is above the 1773 tokens")])
def test_a_base_vocab_that_cannot_be_a_25_base_is_refused(base_vocab, message) -> None:
    with pytest.raises(UserError, match=message):
        check_manifests([PAIRS], vocab_size=1773, base_vocab=base_vocab)


def test_a_tokenizer_of_the_other_family_than_the_config_is_one_refusal() -> None:
    gpt = GPTConfig(model_dim=64, heads=4, layers=2, number_text_tokens=1773)
    gpt.stated_family = INDEXTTS2
    with pytest.raises(UserError, match=r"--tokenizer .*toy_base.tiktoken is an IndexTTS-2.5 .* the config is "
                                        r"IndexTTS2's"):
        check_manifests([PAIRS], gpt_cfg=gpt, text_path=TextPath.open(TOY, normalizer="none"))


def test_write_clean_with_force_never_replaces_a_file_that_is_no_manifest(tmp_path) -> None:
    """The config, the tokenizer, an array the lines name: inputs all, replaced by `--force` before."""
    shutil.copytree(PAIRS.parent, tmp_path / "tiny", ignore=shutil.ignore_patterns("*.pth"))
    manifest = tmp_path / "tiny" / "pairs.jsonl"
    report = check_manifests([manifest], vocab_size=1773)
    for name in ("config.yaml", "codes/tgt0.npy"):
        victim = tmp_path / "tiny" / name
        before = victim.read_bytes()
        with pytest.raises(UserError, match=f"--write-clean {victim} exists and is not a manifest"):
            check_flags_read(force=True, write_clean=victim, normalizer="auto", vocabulary=None)  # before the check
        with pytest.raises(UserError, match=f"--write-clean {victim} exists and is not a manifest"):
            write_clean_manifest(report, victim, force=True)
        assert victim.read_bytes() == before
    earlier = tmp_path / "clean.jsonl"
    earlier.write_text('{"an": "earlier clean manifest"}\n')
    assert write_clean_manifest(report, earlier, force=True) == 3  # a manifest is what --force replaces


def test_an_array_path_that_names_a_folder_says_so(tmp_path) -> None:
    """It said "not found" of a folder that is there."""
    shutil.copytree(PAIRS.parent, tmp_path / "tiny", ignore=shutil.ignore_patterns("*.pth"))
    manifest = tmp_path / "tiny" / "pairs.jsonl"
    lines = manifest.read_text().splitlines()
    manifest.write_text(json.dumps({**json.loads(lines[0]), "target_codes_path": "codes"}) + "\n")
    (error,) = check_manifests([manifest], vocab_size=1773)["errors"]
    assert f"target_codes_path {tmp_path / 'tiny' / 'codes'} is a folder, not a .npy file" in error


def test_a_borrowed_language_that_no_line_is_in_is_said() -> None:
    """`--borrow-language xx=am` where no line is in xx (a typo of the code the lines carry) changed nothing,
    silently."""
    assert not any("--borrow-language" in line for line in render_check_report(
        check_manifests([PAIRS], vocab_size=1773)).splitlines())
    report = check_manifests([PAIRS], vocab_size=1773, borrowed={"xx": 5})
    assert report["languages"] == {"en": 1, "ja": 1, "tr": 1}
    shown = render_check_report(report).splitlines()
    assert "note: --borrow-language xx: no line is in that language, so the flag changed nothing here" in shown


def test_write_clean_with_no_good_line_writes_no_empty_manifest(tmp_path) -> None:
    """Every line bad: it wrote an empty manifest (which training refuses) and said "clean manifest: X"."""
    report = check_manifests([PAIRS], vocab_size=50)  # every line holds ids past 50
    assert report["lines_ok"] == 0
    clean = tmp_path / "clean.jsonl"
    assert write_clean_manifest(report, clean) == 0 and not clean.exists()
    assert clean_line(clean, 0) == f"no clean manifest written to {clean}: no line is good (an empty manifest " \
                                   "trains nothing)"
    assert clean_line(clean, 3) == f"clean manifest: {clean} (3 good lines)"


def test_check_tokenizer_with_an_empty_language_is_refused(tmp_path, capsys) -> None:
    """`--language ''` measured the sample with no language tag at all, silently (494 tokens against 520)."""
    sample = tmp_path / "sample.txt"
    sample.write_text("hello there\n")
    one_line(["check-tokenizer", TOY, "--sample-text", sample, "--language", ""], capsys, "needs a language code")
