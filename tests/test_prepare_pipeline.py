"""The prepare pipeline around the stages: batches, records, resumability, manifests, rejections, exit codes.

The stages run on the tiny model folder `prepare/tiny.py` writes (conftest `tiny_models`; their outputs
are checked against the official code in test_prepare_e2e.py); everything is the shipped code, and
`feature_batches` only counts what the stages compute.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from helpers import FaultyFolder, feature_batches

from indextts_train.errors import UserError
from indextts_train.prepare.corpus import Defaults
from indextts_train.prepare.pairs import SplitRule
from indextts_train.prepare.pipeline import PrepareOptions, plan, run_prepare
from indextts_train.prepare.tiny import TINY_W2V_WIDTH, write_synthetic_clips, write_tiny_gpt

TEXTS = [("hello there", None), ("good day", None), ("bad § text", None), ("", None), ("one more", None),
         ("and again", None), ("last one", None), ("fine", None)]


@pytest.fixture
def models(tmp_path, tiny_models) -> Path:
    """The shared tiny model folder, linked where `_options` looks for it."""
    (tmp_path / "models").symlink_to(tiny_models, target_is_directory=True)
    return tmp_path / "models"


@pytest.fixture
def batches(monkeypatch) -> list[int]:
    return feature_batches(monkeypatch)


def _options(tmp_path: Path, corpus: Path, **kw) -> PrepareOptions:
    return PrepareOptions(corpora=[corpus], model_dir=tmp_path / "models", device="cpu",
                          split=SplitRule(val_fraction=0.0, prompts_per_target=1),
                          **{"min_seconds": 0.3, "out": tmp_path / "out", **kw})


def _corpus(tmp_path: Path) -> Path:
    corpus = write_synthetic_clips(tmp_path / "clips", TEXTS, speakers=2, seed=0, seconds=(0.4, 1.2))
    (tmp_path / "clips" / "utt0007.wav").write_bytes(b"RIFF not audio")
    return corpus


def _outputs(out: Path) -> dict[str, bytes]:
    return {p.relative_to(out).as_posix(): p.read_bytes() for p in sorted(out.rglob("*")) if p.is_file()}


@pytest.mark.slow  # the real model stages: seconds a run
def test_rejections_have_reasons_and_exit_1(tmp_path, models) -> None:
    corpus = _corpus(tmp_path)
    assert run_prepare(_options(tmp_path, corpus)) == 1
    out = tmp_path / "out"
    rejected = [json.loads(line) for line in (out / "rejected.jsonl").read_text().splitlines()]
    assert [(r["id"], r["reason"].split(":")[0]) for r in rejected] == [
        ("utt0002", "text"), ("utt0003", "text"), ("utt0007", "audio")]
    kept = [json.loads(line) for line in (out / "utterances.jsonl").read_text().splitlines()]
    assert [k["id"] for k in kept] == ["utt0000", "utt0001", "utt0004", "utt0005", "utt0006"]  # corpus order
    for line in kept:
        codes = np.load(out / line["codes_path"])
        assert codes.dtype == np.int32 and codes.size == line["code_len"]
        assert np.load(out / line["text_ids_path"]).size == line["text_len"]
    train = [json.loads(line) for line in (out / "train.jsonl").read_text().splitlines()]
    assert len(train) == 5 and all(t["target_id"] != t["prompt_id"] for t in train)
    report = json.loads((out / "prepare.json").read_text())
    assert report["counts"]["kept"] == 5 and report["counts"]["rejected_by_reason"] == {"audio": 1, "text": 2}


@pytest.mark.slow  # the real model stages: seconds a run
def test_rerun_skips_complete_work_and_gives_the_same_bytes(tmp_path, models, batches) -> None:
    corpus = _corpus(tmp_path)
    run_prepare(_options(tmp_path, corpus))
    first = _outputs(tmp_path / "out")
    batches.clear()
    assert run_prepare(_options(tmp_path, corpus)) == 1
    assert batches == []  # nothing recomputed
    assert _outputs(tmp_path / "out") == first
    record = next((tmp_path / "out" / "records").glob("utt0004.json"))
    record.unlink()  # as if killed after the arrays, before the record
    assert run_prepare(_options(tmp_path, corpus)) == 1
    assert len(batches) == 1  # only that utterance's batch
    assert _outputs(tmp_path / "out") == first


@pytest.mark.slow  # the real model stages: seconds a run
def test_a_rerun_recomputes_what_changed_in_the_corpus_and_ends_as_a_fresh_run(tmp_path, models, batches) -> None:
    """A fixed transcript (rejected before, kept now), an edited one and a replaced clip are recomputed on
    the rerun; the rest is skipped; the folder ends with the manifests a fresh run on the new corpus writes."""
    import soundfile

    corpus = _corpus(tmp_path)
    assert run_prepare(_options(tmp_path, corpus)) == 1
    old_condition = np.load(tmp_path / "out" / "condition" / "utt0004.npy")
    lines = [json.loads(line) for line in corpus.read_text().splitlines()]
    lines[2]["text"], lines[1]["text"] = "fixed text", "a better day"
    corpus.write_text("".join(json.dumps(line) + "\n" for line in lines))
    clip = tmp_path / "clips" / "utt0004.wav"
    wave, rate = soundfile.read(clip, dtype="float32")
    soundfile.write(clip, np.roll(wave, 1000) * 0.5, rate)  # another recording of the same length
    batches.clear()
    assert run_prepare(_options(tmp_path, corpus)) == 1  # utt0003 (empty text) and utt0007 stay rejected
    assert sum(batches) < 7  # batches without a changed member were skipped
    fresh = tmp_path / "fresh"
    assert run_prepare(_options(tmp_path, corpus, out=fresh)) == 1
    for name in ("utterances.jsonl", "train.jsonl", "val.jsonl", "rejected.jsonl", "prepare.json"):
        assert (tmp_path / "out" / name).read_text().replace(str(tmp_path / "out"), "") == \
            (fresh / name).read_text().replace(str(fresh), ""), name
    lines = (tmp_path / "out" / "utterances.jsonl").read_text().splitlines()
    kept = {line["id"]: line for line in map(json.loads, lines)}
    assert kept["utt0002"]["text"] == "fixed text" and kept["utt0001"]["text"] == "a better day"
    assert not np.array_equal(np.load(tmp_path / "out" / "condition" / "utt0004.npy"), old_condition)
    assert np.array_equal(np.load(tmp_path / "out" / "condition" / "utt0004.npy"),
                          np.load(fresh / "condition" / "utt0004.npy"))


def test_batches_depend_only_on_corpus_and_budget(tmp_path) -> None:
    corpus = _corpus(tmp_path)
    from indextts_train.prepare.corpus import read_corpora

    utts = read_corpora([corpus], Defaults())
    small = plan(utts, _options(tmp_path, corpus, batch_seconds=1.5))
    large = plan(utts, _options(tmp_path, corpus, batch_seconds=100.0))
    assert len(large.batches) == 1 and len(small.batches) > 1
    for batch in small.batches:
        assert len(batch) * small.durations[batch[0]] <= 1.5 or len(batch) == 1
    assert sorted(i for b in small.batches for i in b) == sorted(i for b in large.batches for i in b)
    assert small.early == {7: small.early[7]} and small.early[7].startswith("audio: unreadable")


@pytest.mark.slow  # the real model stages: seconds a run
def test_other_settings_or_models_refuse_to_mix(tmp_path, models) -> None:
    corpus = _corpus(tmp_path)
    run_prepare(_options(tmp_path, corpus))
    with pytest.raises(UserError, match="prepared with other prompt_seconds; rerun with --restart"):
        run_prepare(_options(tmp_path, corpus, prompt_seconds=5.0))
    shared = models.resolve()
    models.unlink()
    shutil.copytree(shared, models)  # this test's own copy, with other GPT weights
    write_tiny_gpt(models / "config.yaml", models / "gpt.pth", TINY_W2V_WIDTH, seed=2)
    with pytest.raises(UserError, match=r"prepared with other models \(gpt\); rerun"):  # which model file changed
        run_prepare(_options(tmp_path, corpus))
    (tmp_path / "out" / "mine.txt").write_text("user file")
    assert run_prepare(_options(tmp_path, corpus, restart=True)) == 1
    assert (tmp_path / "out" / "mine.txt").read_text() == "user file"  # not ours: kept


@pytest.mark.slow  # the real model stages: seconds a run
def test_foreign_output_folder_and_nothing_usable(tmp_path, models) -> None:
    corpus = _corpus(tmp_path)
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "train.jsonl").write_text("theirs\n")
    with pytest.raises(UserError, match="train.jsonl was not written by prepare"):
        run_prepare(_options(tmp_path, corpus))
    assert (tmp_path / "out" / "train.jsonl").read_text() == "theirs\n"
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"audio": "missing.wav", "text": "x"}\n')
    options = _options(tmp_path, bad)
    options.out = tmp_path / "out2"
    assert run_prepare(options) == 2


@pytest.mark.slow  # the real model stages: seconds a run
def test_a_rerun_removes_temp_files_a_killed_run_left(tmp_path, models) -> None:
    corpus = _corpus(tmp_path)
    run_prepare(_options(tmp_path, corpus))
    stale = tmp_path / "out" / "codes" / ".utt0000.npy.tmp-99999"
    stale.write_bytes(b"half")
    beside = tmp_path / "out" / ".train.jsonl.tmp-99999"  # a kill while the manifests were written
    beside.write_bytes(b"half")
    foreign = tmp_path / "out" / ".notes.txt.tmp-99999"  # not a name prepare writes: not its to remove
    foreign.write_bytes(b"mine")
    assert run_prepare(_options(tmp_path, corpus)) == 1
    assert not stale.exists() and not beside.exists() and foreign.read_bytes() == b"mine"


@pytest.mark.slow  # the real model stages: seconds a run
def test_a_clip_too_short_for_w2v_bert_is_rejected_not_a_crash(tmp_path, models) -> None:
    import soundfile

    corpus = _corpus(tmp_path)
    soundfile.write(tmp_path / "clips" / "utt0000.wav", np.full(300, 0.1, np.float32), 16000)  # 19 ms
    assert run_prepare(_options(tmp_path, corpus, min_seconds=0.0)) == 1
    reasons = {r["id"]: r["reason"] for r in map(json.loads, (tmp_path / "out" / "rejected.jsonl").read_text()
                                                 .splitlines())}
    assert reasons["utt0000"] == "too short: 300 samples at 16 kHz, w2v-BERT needs 560"


@pytest.mark.slow  # the real model stages: seconds a run
def test_a_rerun_may_change_batch_seconds(tmp_path, models, batches) -> None:
    """After running out of GPU memory, a smaller --batch-seconds continues instead of starting over."""
    corpus = _corpus(tmp_path)
    run_prepare(_options(tmp_path, corpus))
    first = _outputs(tmp_path / "out")
    batches.clear()
    assert run_prepare(_options(tmp_path, corpus, batch_seconds=1.0)) == 1
    assert batches == []  # everything was complete: nothing recomputed
    again = _outputs(tmp_path / "out")
    assert {k for k in first if first[k] != again[k]} == {"prepare.json"}  # only the recorded setting


def test_token_count_reports_the_grown_pieces_share_and_records_of_earlier_versions_are_recomputed(tmp_path) -> None:
    """Ids 10..14 are grown pieces. A record without a source (an earlier version wrote it, before the
    extended count existed) is stale: the utterance is recomputed, never counted from the old record."""
    from indextts_train.prepare.outputs import OutputFolder
    from indextts_train.prepare.pipeline import TokenCount
    from indextts_train.prepare.progress import text_coverage

    folder = OutputFolder(tmp_path)
    folder.write_record("old", {"id": "old", "kept": {"text_len": 5}, "tokens": [3, 10, 11, 20]})
    assert folder.read_record("old", "any source") is None and not folder.has_record("old", "any source")
    count = TokenCount(range(10, 15))
    count.add({"kept": {"text_len": 4}, "tokens": [1, 2, 12], "extended": 1})
    count.add({"kept": {"text_len": 5}, "tokens": [3, 10, 11, 20], "extended": 3})  # ids 3, 10, 10, 11, 20
    assert count.counts() == {"distinct_text_tokens": 7, "text_tokens": 9, "extended_pieces": 5,
                              "extended_pieces_used": 3, "extended_text_tokens": 4, "extended_token_share": 0.4444}
    line = text_coverage(count.counts())
    assert line.startswith("text tokens: 9 (7 distinct); extended pieces: 4 tokens (44.4% of the text), 3 of the 5 "
                           "grown pieces occur\nwarning: 2 grown pieces never occur in these texts")
    plain = TokenCount(range(0))
    plain.add({"kept": {"text_len": 2}, "tokens": [1, 2], "extended": 0})
    assert text_coverage(plain.counts()) == ("text tokens: 2 (2 distinct); the tokenizer has no pieces beyond the "
                                            "base model's vocabulary")


@pytest.mark.parametrize("fault", [{"capacity": 3000}, {"read_only": True}])
@pytest.mark.slow  # the real model stages: seconds a run
def test_a_full_or_read_only_out_is_one_line_and_a_rerun_goes_on(tmp_path, models, monkeypatch, fault) -> None:
    corpus = _corpus(tmp_path)
    (tmp_path / "out").mkdir()
    with monkeypatch.context() as patch:
        FaultyFolder(tmp_path / "out", **fault).install(patch)
        with pytest.raises(UserError, match="cannot write .*rerun the same command"):
            run_prepare(_options(tmp_path, corpus))
    assert run_prepare(_options(tmp_path, corpus)) == 1  # room again: the same command finishes
    assert not list((tmp_path / "out").rglob(".*.tmp-*"))


def test_a_reason_naming_unknown_characters_is_bounded() -> None:
    """A transcript of 100,000 CJK characters the tokenizer lacks made a 400 KB reason, printed whole in the
    summary and written into rejected.jsonl: now the first 20 distinct characters and how many there are."""
    import torch

    from indextts_train.config.settings import load_config
    from indextts_train.prepare.featurize import Featurizer
    from indextts_train.prepare.utterance import Utterance
    from indextts_train.text.inference_text import TextPath

    ref = Path(__file__).parent / "data" / "reference"
    featurizer = Featurizer(gpt_cfg=load_config(ref / "tiny" / "config.yaml").gpt,
                            text=TextPath.open(ref / "prepare" / "text" / "bpe_tiny.model"), w2v=None, codec=None,
                            encoders=None, campplus=None, device=torch.device("cpu"), allow_unk=False)
    unknown = [chr(0x3400 + i) for i in range(2000)]  # CJK extension A: none in the tiny vocabulary
    reason = featurizer.text_ids(Utterance("u", "/a.wav", "".join(unknown) * 50, "s", None, "c.jsonl:1"))
    assert reason == (f"text: characters the tokenizer does not know: {' '.join(unknown[:20])}, 2000 distinct in "
                      "all (pass the extended --tokenizer that has them; --allow-unk keeps them as unknown)")
    few = featurizer.text_ids(Utterance("v", "/a.wav", "Hello \u1240\u1241 world", "s", None, "c.jsonl:2"))
    assert few == ("text: characters the tokenizer does not know: \u1240 \u1241 (pass the extended --tokenizer "
                   "that has them; --allow-unk keeps them as unknown)")
