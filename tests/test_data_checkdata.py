"""check-data: every bad line found and named, the report's statistics, the clean manifest."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest
from test_data_manifest import DIM, GPT, TINY, read_lines, write_dataset, write_lines

from indextts_train.data.checkdata import check_flags_read, check_manifests, render_check_report, write_clean_manifest
from indextts_train.data.manifest import ManifestDataset, ManifestIndex
from indextts_train.errors import UserError


def make_bad_lines(root: Path) -> tuple[Path, dict[int, str]]:
    """A 12-line manifest whose lines 2..10 each have one kind of fault; line -> expected message.

    Sample i (line i+1) has text_len 3 + i % 5 and code_len 4 + 3i % 7 (see write_dataset).
    """
    manifest = write_dataset(root, 12)
    objs = read_lines(manifest)
    lines = [json.dumps(obj) for obj in objs]
    lines[1] = lines[1][:-3]
    del objs[2]["target_text_len"]
    lines[2] = json.dumps(objs[2])
    (root / "arrays" / "emo3.npy").unlink()
    np.save(root / "arrays" / "cond4.npy", np.zeros((32, DIM + 2), np.float32))
    np.save(root / "arrays" / "text5.npy", np.array([2, 3, 50], np.int32))  # vocabulary is 50
    np.save(root / "arrays" / "codes6.npy", np.array([1, 2, 40, 3, 4, 5, 6, 7], np.int32))  # 40 mel codes
    lines[7] = json.dumps({**objs[7], "target_text_len": 8})  # its array holds 5 ids
    lines[8] = json.dumps({**objs[8], "target_code_len": 31})
    lines[9] = json.dumps({**objs[9], "prompt_speaker": "spk1", "target_speaker": "spk9"})
    write_lines(manifest, lines)
    return manifest, {
        2: "not valid JSON",
        3: "missing field(s) target_text_len",
        4: "emo3.npy not found",
        5: "has D=10 but gpt.model_dim is 8",
        6: "holds id 50, outside [0, 50)",
        7: "holds id 40, outside [0, 40)",
        8: "has 5 ids but the manifest says 8",
        9: "target_code_len 31 > gpt.max_mel_tokens 30",
        10: "prompt and target speakers differ (speaker='spk1', prompt_speaker='spk1', target_speaker='spk9')",
    }


def test_check_manifests_finds_each_kind_of_bad_line(tmp_path: Path) -> None:
    manifest, expected = make_bad_lines(tmp_path)
    report = check_manifests([manifest], gpt_cfg=GPT)
    json.dumps(report)  # JSON-able
    assert report["lines_bad"] == len(expected) == 9 and report["lines_ok"] == 3
    assert report["bad_lines"] == [[str(manifest), line] for line in sorted(expected)]
    for error, (line, message) in zip(report["errors"], sorted(expected.items()), strict=True):
        assert error.startswith(f"{manifest}:{line}: ") and message in error, error
    summary = render_check_report(report)
    assert "9 BAD" in summary and f"{manifest}:10: prompt and target speakers differ" in summary


def test_nonfinite_features_negative_ids_and_mel_specials_are_bad_lines(tmp_path: Path) -> None:
    """Each of these reached the model silently before: NaN/Inf made every loss NaN, a negative id
    was an IndexError traceback, a start/stop code inside a target taught the model to stop early."""
    manifest = write_dataset(tmp_path, 6)
    cond = np.load(tmp_path / "arrays" / "cond1.npy")
    cond[3, 2] = np.nan
    np.save(tmp_path / "arrays" / "cond1.npy", cond)
    emo = np.load(tmp_path / "arrays" / "emo2.npy")
    emo[0] = np.inf
    np.save(tmp_path / "arrays" / "emo2.npy", emo)
    np.save(tmp_path / "arrays" / "text3.npy", np.array([2, -1, 4, 5, 6, 7], np.int32))
    np.save(tmp_path / "arrays" / "codes4.npy", np.array([1, 2, 38, 3, 4, 5, 6, 7, 8, 9], np.int32))
    np.save(tmp_path / "arrays" / "codes5.npy", np.array([1, 39, 3, 4, 5, 6, 7, 8], np.int32)[:4 + 15 % 7])
    expected = {2: "cond1.npy holds NaN or Inf", 3: "emo2.npy holds NaN or Inf", 4: "holds id -1, which is negative",
                5: "start/stop mel token 38 at position 2", 6: "start/stop mel token 39 at position 1"}
    report = check_manifests([manifest], gpt_cfg=GPT)
    assert report["bad_lines"] == [[str(manifest), line] for line in sorted(expected)]
    for error, (line, message) in zip(report["errors"], sorted(expected.items()), strict=True):
        assert error.startswith(f"{manifest}:{line}: ") and message in error, error
    dataset = ManifestDataset(ManifestIndex.build([manifest]), model_dim=DIM)  # training loads the same way
    for i in (1, 2):
        with pytest.raises(UserError, match=rf"^{re.escape(str(manifest))}:{i + 1}: .*NaN or Inf"):
            dataset[i]


def test_check_manifests_refuses_an_empty_manifest(tmp_path: Path) -> None:
    (tmp_path / "empty.jsonl").write_text("\n", encoding="utf-8")
    with pytest.raises(UserError, match=r"empty\.jsonl: manifest is empty"):
        check_manifests([write_dataset(tmp_path, 2), tmp_path / "empty.jsonl"], gpt_cfg=GPT)


def test_check_manifests_statistics_and_extended_share(tmp_path: Path) -> None:
    manifest = write_dataset(tmp_path, 6)
    report = check_manifests([manifest], gpt_cfg=GPT, base_vocab=30)
    assert (report["lines_ok"], report["lines_bad"], report["errors"]) == (6, 0, [])
    texts = [np.load(tmp_path / "arrays" / f"text{i}.npy") for i in range(6)]
    share = sum(int((t >= 30).sum()) for t in texts) / sum(len(t) for t in texts)
    assert report["extended_token_share"] == pytest.approx(share) and 0 < share < 1
    assert report["text_len"] == {"min": 3, "mean": 4.667, "p50": 4.5, "p95": 6.75, "max": 7}
    assert report["code_len"]["max"] == 10
    assert report["speakers"] == {"count": 2, "top": [("spk0", 3), ("spk1", 3)]}
    assert report["languages"] == {"am": 6}
    assert report["durations_s"] == {"target_duration": 9.0}
    assert "extended-vocabulary tokens (id >= 30)" in render_check_report(report)
    # vocab_size overrides the config's number_text_tokens
    assert check_manifests([manifest], gpt_cfg=GPT, vocab_size=10)["lines_bad"] == 6


def test_check_manifests_on_reference_data() -> None:
    report = check_manifests([TINY / "pairs.jsonl"], base_vocab=100)
    assert report["lines_ok"] == 3 and report["extended_token_share"] == 0.0
    assert report["durations_s"] == {"prompt_duration": 9.0}


def test_write_clean_manifest_elsewhere_reindexes_cleanly(tmp_path: Path) -> None:
    manifest, expected = make_bad_lines(tmp_path / "data")
    report = check_manifests([manifest], gpt_cfg=GPT)
    out = tmp_path / "clean" / "deeper" / "train_clean.jsonl"
    out.parent.mkdir(parents=True)
    assert write_clean_manifest(report, out) == 3
    index = ManifestIndex.build([out], max_text_tokens=20, max_mel_tokens=30)
    assert len(index) == 3 and index.skipped == 0
    assert check_manifests([out], gpt_cfg=GPT)["lines_bad"] == 0
    assert [ManifestDataset(index)[i]["text_len"] for i in range(3)] == [3, 3, 4]  # lines 1, 11, 12
    assert read_lines(out)[0]["prompt_condition_path"] == "../../data/arrays/cond0.npy"


def test_write_clean_manifest_in_same_folder_keeps_bytes(tmp_path: Path) -> None:
    manifest, _ = make_bad_lines(tmp_path)
    raw_lines = manifest.read_bytes().splitlines(keepends=True)
    out = tmp_path / "clean.jsonl"
    assert write_clean_manifest([manifest], out, gpt_cfg=GPT) == 3
    assert out.read_bytes() == raw_lines[0] + raw_lines[10] + raw_lines[11]
    with pytest.raises(UserError, match="is an input manifest"):
        write_clean_manifest([manifest], manifest, gpt_cfg=GPT)


def test_a_write_clean_that_cannot_be_written_is_said_before_any_line_is_checked(tmp_path: Path) -> None:
    """The check of a large manifest takes minutes; its report was lost to the refusal that came after it."""
    manifest, _ = make_bad_lines(tmp_path)
    earlier = tmp_path / "clean.jsonl"
    earlier.write_text('{"an": "earlier clean manifest"}\n')
    flags = {"normalizer": "auto", "vocabulary": None, "manifests": [manifest]}
    with pytest.raises(UserError, match=f"{earlier} already exists; pass --force"):
        check_flags_read(force=False, write_clean=earlier, **flags)
    with pytest.raises(UserError, match="is an input manifest"):
        check_flags_read(force=True, write_clean=tmp_path / "." / manifest.name, **flags)
    check_flags_read(force=True, write_clean=earlier, **flags)  # a manifest is what --force replaces
    check_flags_read(force=False, write_clean=tmp_path / "new.jsonl", **flags)


# ---------------------------------------------------------------------------------------------
# text_ids against the line's own text, as official inference encodes it

TEXT_REFERENCE = Path(__file__).parent / "data" / "reference" / "prepare" / "text"


def _text_manifest(tmp_path: Path, texts: list[str], ids: list[list[int]]) -> Path:
    """The reference's tiny paired manifest with these target texts and text ids."""
    import shutil

    folder = tmp_path / "tiny"
    shutil.copytree(TINY, folder, ignore=shutil.ignore_patterns("*.pth"))
    objs = read_lines(folder / "pairs.jsonl")
    for obj, text, row in zip(objs, texts, ids, strict=True):
        np.save(folder / obj["target_text_ids_path"], np.asarray(row, np.int32))
        obj.update(target_text=text, target_text_len=len(row))
    write_lines(folder / "pairs.jsonl", [json.dumps(obj, ensure_ascii=False) for obj in objs])
    return folder / "pairs.jsonl"


def test_check_data_compares_text_ids_with_the_presented_text(tmp_path: Path) -> None:
    import sentencepiece as spm

    from indextts_train.text.inference_text import TextPath

    cases = {c["id"]: c for c in json.loads((TEXT_REFERENCE / "text_cases.json").read_text())["cases"]}
    raw = spm.SentencePieceProcessor(model_file=str(TEXT_REFERENCE / "bpe_tiny.model")).encode("Hello world")
    manifest = _text_manifest(tmp_path, [cases["en_plain"]["text"], "Hello world", cases["zh_digits"]["text"]],
                              [cases["en_plain"]["ids"], raw, cases["zh_digits"]["ids"]])
    path = TextPath.open(TEXT_REFERENCE / "bpe_tiny.model", normalizer="none")
    report = check_manifests([manifest], vocab_size=path.size, text_path=path)
    assert report["bad_lines"] == [[str(manifest), 2]]
    (error,) = report["errors"]
    assert error.startswith(f"{manifest}:2: target_text_ids_path is the raw text's encoding"), error
    assert f"indextts-train tokenize MANIFEST --tokenizer {TEXT_REFERENCE / 'bpe_tiny.model'}" in error
    assert report["text"] == {"normalizer": "character map only", "compared": 2, "not_compared": 1, "notes": []}
    assert "not compared: 1 line(s) with digits" in render_check_report(report)


def test_check_data_shows_both_encodings_when_they_differ(tmp_path: Path) -> None:
    from indextts_train.text.inference_text import TextPath

    cases = {c["id"]: c for c in json.loads((TEXT_REFERENCE / "text_cases.json").read_text())["cases"]}
    ids = cases["en_plain"]["ids"]
    manifest = _text_manifest(tmp_path, [cases["en_plain"]["text"]] * 3, [ids, ids[:3] + [99] + ids[4:], ids])
    report = check_manifests([manifest], text_path=TextPath.open(TEXT_REFERENCE / "bpe_tiny.model",
                                                                   normalizer="none"))
    (error,) = report["errors"]
    assert error == (f"{manifest}:2: target_text_ids_path [26, 54, 20, 99, 42, 64, 63, 66, 6, 4, 17, 11, ...] "
                     "(16 ids) differs at position 3 from its target_text as inference encodes it "
                     "[26, 54, 20, 59, 42, 64, 63, 66, 6, 4, 17, 11, ...] (16 ids); re-encode with `indextts-train "
                     f"tokenize MANIFEST --tokenizer {TEXT_REFERENCE / 'bpe_tiny.model'} --out NEW_DIR` (or pass "
                     "the tokenizer the data was made with)")
def test_duplicate_ids_are_reported_with_both_lines(tmp_path: Path) -> None:
    manifest = write_dataset(tmp_path, 6)
    lines = read_lines(manifest)
    lines[4]["id"] = lines[1]["id"]  # line 5 reuses line 2's id
    lines[5]["id"] = lines[1]["id"]  # and line 6 too
    write_lines(manifest, lines)
    report = check_manifests([manifest], gpt_cfg=GPT)
    assert report["lines_bad"] == 0 and report["duplicate_ids"] == 2  # a warning: the lines still train
    first = f"{manifest}:2"
    assert report["duplicates"] == [f"{manifest}:5: id {lines[1]['id']!r} is also the id of {first}",
                                    f"{manifest}:6: id {lines[1]['id']!r} is also the id of {first}"]
    text = render_check_report(report)
    assert "duplicate ids (first 2 of 2" in text and f"is also the id of {first}" in text
    assert check_manifests([manifest], gpt_cfg=GPT, max_lines=4)["duplicate_ids"] == 0  # only the head read


def test_a_manifest_given_twice_is_refused(tmp_path: Path) -> None:
    """The same file twice (spelled two ways, or a link): no line was a duplicate of another place, so nothing
    was said, and --write-clean wrote every line twice."""
    manifest = write_dataset(tmp_path, 3)
    (tmp_path / "link.jsonl").symlink_to(manifest)
    for twice in ([manifest, manifest], [manifest, tmp_path / "." / manifest.name],
                  [manifest, tmp_path / "link.jsonl"]):
        with pytest.raises(UserError, match=rf"^{twice[1]}: the same file as {manifest}, given before it"):
            check_manifests(twice, gpt_cfg=GPT)


def test_check_data_without_config_uses_the_model_folder_that_prepared_the_manifest_and_says_so(tmp_path) -> None:
    """prepare.json beside the manifest names the model folder's config.yaml: its limits are the ones used
    (a line says so); manifests that prepare did not write are checked without model limits, said too."""
    import yaml
    from typer.testing import CliRunner

    from indextts_train.cli import app
    from indextts_train.config.settings import gpt_to_dict

    manifest = write_dataset(tmp_path / "data", 6)  # text_len 3 + i % 5: lines 4, 5 are 6 and 7 long
    config = tmp_path / "models" / "config.yaml"
    config.parent.mkdir()
    config.write_text(yaml.safe_dump({"gpt": {**gpt_to_dict(GPT), "max_text_tokens": 5}}))
    unprepared = CliRunner().invoke(app, ["check-data", str(manifest)])
    assert unprepared.exit_code == 0 and "are not checked against a model; pass --config" in unprepared.stderr
    (manifest.parent / "prepare.json").write_text(json.dumps({"models": {"config": str(config)}}))
    result = CliRunner().invoke(app, ["check-data", str(manifest)])
    assert result.stderr.splitlines()[0] == (f"--config not given: checking against {config}, the model folder's "
                                             "config named by prepare.json beside the manifest")
    assert result.exit_code == 2 and "6 lines in 1 manifest(s): 4 ok, 2 BAD" in result.stdout
    given = CliRunner().invoke(app, ["check-data", str(manifest), "--config", str(config)])
    assert given.exit_code == 2 and given.stderr == ""  # what the user passed needs no line


def test_the_check_before_training_names_check_data_once(tmp_path) -> None:
    """The head of a manifest is checked before a run starts; its refusal says where every bad line is
    listed once, whether or not the line's own fix already says it."""
    from indextts_train.data.checkdata import check_manifest_sample

    manifest = write_dataset(tmp_path, 4)
    bad_json = tmp_path / "bad_json.jsonl"
    bad_json.write_text("not json\n" + manifest.read_text())
    for path, said in ((bad_json, "bad_json.jsonl:1: not valid JSON"), (manifest, "holds id")):
        with pytest.raises(UserError) as refused:
            check_manifest_sample([path], GPT, 2 if path == manifest else None, {}, skip_bad=False)
        assert said in str(refused.value) and str(refused.value).count("lists every bad line") == 1, refused.value
        assert "checked before training" in str(refused.value)
