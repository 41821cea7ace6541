"""`indextts-train prepare` with the real stages on tiny official-layout model folders of both families.

The oracle's clips and tiny weights (tests/data/reference/prepare) go through the public command:
codes and text ids equal the official code's exactly, the 2.5 speaker vector within the reference
tolerance, and `condition` / `emo_vec` equal the stage functions run one clip at a time (the way
official inference runs them). A changed --batch-seconds keeps everything within tolerance.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml
from typer.testing import CliRunner

from indextts_train.checkpoint.base import load_base_checkpoint
from indextts_train.cli import app
from indextts_train.config.settings import load_config
from indextts_train.errors import UserError
from indextts_train.model.conditioning import ConditioningEncoders
from indextts_train.prepare.audio import emotion_wave, load_audio, speaker_wave
from indextts_train.prepare.featurize import expected_codes, read_gpt_weights
from indextts_train.prepare.tiny import write_tiny_gpt
from indextts_train.prepare.w2vbert import W2vBert

REF = Path(__file__).parent / "data" / "reference" / "prepare"
TINY_V2 = Path(__file__).parent / "data" / "reference" / "tiny" / "config.yaml"
TINY_V25 = Path(__file__).resolve().parents[1] / "configs" / "tiny_v25.yaml"
CLIPS = ("a_44k1_stereo_pcm16", "b_22k05_mono_float", "c_16k_mono_pcm16", "d_16k_mono_float_long")
TEXT_V2 = next(c for c in json.loads((REF / "text" / "text_cases.json").read_text())["cases"] if c["id"] == "en_plain")
TEXT_V25 = next(c for c in json.loads((REF / "text" / "tiktoken_cases.json").read_text())["cases"]
                if c["id"] == "en_case")
FLOAT_ATOL = 1e-4


def reference_model_dir(root: Path, is_v25: bool, max_mel_tokens: int = 200) -> Path:
    """The official layout from the oracle's tiny weights (the GPT: random, its encoders 32 wide)."""
    model_dir = root / "models"
    (model_dir / "hf_cache" / "w2v").mkdir(parents=True)
    raw = yaml.safe_load((TINY_V25 if is_v25 else TINY_V2).read_text())
    raw["gpt"]["max_mel_tokens"] = max_mel_tokens
    raw["semantic_codec"] = json.loads((REF / ("codec25" if is_v25 else "semantic_codec") / "config.json").read_text())
    raw["version"] = 2.5 if is_v25 else 2.0
    raw.pop("train", None)
    (model_dir / "config.yaml").write_text(yaml.safe_dump(raw))
    write_tiny_gpt(model_dir / "config.yaml", model_dir / "gpt.pth", 32, seed=5)
    shutil.copy(REF / "w2vbert" / "wav2vec2bert_stats.pt", model_dir)
    for name in ("config.json", "model.safetensors"):
        shutil.copy(REF / "w2vbert" / name, model_dir / "hf_cache" / "w2v")
    shutil.copy(REF / "features" / "preprocessor_config.json", model_dir / "hf_cache" / "w2v")
    if is_v25:
        shutil.copy(REF / "codec25" / "codec.pth", model_dir)
    return model_dir


def reference_corpus(root: Path, is_v25: bool) -> Path:
    text = TEXT_V25["input"] if is_v25 else TEXT_V2["text"]
    lines = [{"id": clip, "audio": str(REF / "audio" / f"{clip}.wav"), "text": text, "speaker": "s"} for clip in CLIPS]
    corpus = root / "corpus.jsonl"
    corpus.write_text("".join(json.dumps(line) + "\n" for line in lines))
    return corpus


def run_command(root: Path, is_v25: bool, out: str, *extra: str, corpus: str = "corpus.jsonl",
                language: bool = True) -> tuple[int, str]:
    model_dir = root / "models"
    flags = ["--campplus", str(REF / "campplus" / "campplus.pth"), *(["--language", "en"] if language else []),
             "--tokenizer", str(REF / "text" / "toy_base.tiktoken")] if is_v25 else \
        ["--semantic-codec", str(REF / "semantic_codec" / "model.safetensors"),
         "--tokenizer", str(REF / "text" / "bpe_tiny.model")]
    args = ["prepare", str(root / corpus), "--model-dir", str(model_dir), "--out", str(root / out),
            "--w2v-bert", str(model_dir / "hf_cache" / "w2v"), "--device", "cpu", "--val-fraction", "0",
            *flags, *extra]
    result = CliRunner().invoke(app, args)
    return result.exit_code, result.output


def _kept(out: Path) -> dict[str, dict]:
    return {line["id"]: line for line in map(json.loads, (out / "utterances.jsonl").read_text().splitlines())}


def _n_valid(clip: str) -> int:
    return int(np.load(REF / "features" / f"{clip}.spk.attention_mask.npy").sum())


@pytest.mark.slow
@pytest.mark.parametrize("is_v25", [False, True], ids=["indextts2", "indextts2.5"])
def test_public_command_equals_the_official_features(tmp_path, is_v25) -> None:
    reference_model_dir(tmp_path, is_v25)
    reference_corpus(tmp_path, is_v25)
    code, output = run_command(tmp_path, is_v25, "out")
    assert code == 0, output
    kept = _kept(tmp_path / "out")
    assert list(kept) == list(CLIPS)
    expected_ids = TEXT_V25["ids_as_gpt_sees_them"] if is_v25 else TEXT_V2["ids"]
    codec = "codec25" if is_v25 else "semantic_codec"
    for clip, line in kept.items():
        out = tmp_path / "out"
        assert np.load(out / line["text_ids_path"]).tolist() == expected_ids
        official = np.load(REF / codec / f"codes.{clip}.spk.npy")[0]  # every joined frame, the masked one too
        n_codes = math.ceil(_n_valid(clip) / 2) if is_v25 else _n_valid(clip)
        assert np.load(out / line["codes_path"]).tolist() == official[:n_codes].tolist()  # valid frames only
        assert line["code_len"] == n_codes
        if not is_v25 and clip[0] in "ad":  # an odd fbank count: the last joined frame is masked, not stored
            assert n_codes == official.size - 1
        if is_v25:
            spk = np.load(out / line["spk_emb_path"])
            np.testing.assert_allclose(spk, np.load(REF / "campplus" / f"{clip}.spk_emb.npy"), atol=1e-3, rtol=0)
            assert line["lang_id"] == TEXT_V25["lang_id"]


@pytest.mark.slow
def test_parquet_and_lhotse_corpora_give_the_arrays_the_jsonl_corpus_gives(tmp_path) -> None:
    """The oracle's clips as a Parquet dataset with the WAV bytes embedded and as lhotse cuts (each a whole
    recording, stereo included): the real stages write byte-identical arrays and the same text ids."""
    import datasets
    from lhotse import CutSet, Recording, RecordingSet, SupervisionSegment, SupervisionSet

    reference_model_dir(tmp_path, is_v25=False)
    reference_corpus(tmp_path, is_v25=False)
    assert run_command(tmp_path, False, "jsonl")[0] == 0
    rows = {"id": list(CLIPS), "text": [TEXT_V2["text"]] * len(CLIPS), "speaker": ["s"] * len(CLIPS),
            "audio": [{"bytes": (REF / "audio" / f"{clip}.wav").read_bytes(), "path": None} for clip in CLIPS]}
    datasets.Dataset.from_dict(rows).cast_column("audio", datasets.Audio()).to_parquet(str(tmp_path / "clips.parquet"))
    recordings = RecordingSet.from_recordings(Recording.from_file(REF / "audio" / f"{clip}.wav", recording_id=clip)
                                              for clip in CLIPS)
    supervisions = SupervisionSet.from_segments(
        SupervisionSegment(clip, clip, 0.0, recordings[clip].duration, channel=recordings[clip].channel_ids,
                           text=TEXT_V2["text"], speaker="s") for clip in CLIPS)
    CutSet.from_manifests(recordings, supervisions).to_file(tmp_path / "cuts.jsonl.gz")
    want = _kept(tmp_path / "jsonl")
    for corpus, out in (("clips.parquet", "parquet"), ("cuts.jsonl.gz", "lhotse")):
        code, output = run_command(tmp_path, False, out, corpus=corpus)
        assert code == 0, output
        got = _kept(tmp_path / out)
        assert sorted(got) == sorted(want)
        for clip, line in got.items():
            for name in ("text_ids", "codes", "condition", "emo_vec"):
                assert (tmp_path / out / line[f"{name}_path"]).read_bytes() == \
                    (tmp_path / "jsonl" / want[clip][f"{name}_path"]).read_bytes(), (corpus, clip, name)


@pytest.mark.slow
def test_condition_and_emo_vec_equal_the_stages_one_clip_at_a_time(tmp_path) -> None:
    model_dir = reference_model_dir(tmp_path, is_v25=False)
    reference_corpus(tmp_path, is_v25=False)
    assert run_command(tmp_path, False, "out")[0] == 0
    config = load_config(model_dir / "config.yaml")
    # the trainer's own reader of the same file: the encoders prepare used are the base checkpoint's
    encoders = ConditioningEncoders.from_gpt(load_base_checkpoint(model_dir / "gpt.pth", config.gpt)[1], config.gpt,
                                             torch.device("cpu"))
    w2v = W2vBert.load(model_dir / "hf_cache" / "w2v", model_dir / "wav2vec2bert_stats.pt", torch.device("cpu"))
    for clip, line in _kept(tmp_path / "out").items():
        mono, rate = load_audio(REF / "audio" / f"{clip}.wav")
        [(spk_feat, _)] = w2v.layer17([speaker_wave(mono, rate, 15.0)])
        [(emo_feat, _)] = w2v.layer17([emotion_wave(mono, rate, 15.0)])
        np.testing.assert_allclose(np.load(tmp_path / "out" / line["condition_path"]),
                                   encoders.condition(spk_feat).numpy(), atol=FLOAT_ATOL, rtol=0)
        np.testing.assert_allclose(np.load(tmp_path / "out" / line["emo_vec_path"]),
                                   encoders.emo_vec(emo_feat).numpy(), atol=FLOAT_ATOL, rtol=0)
    # Prompt features from the first --prompt-seconds (clips a and d are longer than 1 s); the target's
    # codes still come from the whole clip.
    assert run_command(tmp_path, False, "cut", "--prompt-seconds", "1")[0] == 0
    cut_lines = _kept(tmp_path / "cut")
    for clip, line in cut_lines.items():
        mono, rate = load_audio(REF / "audio" / f"{clip}.wav")
        [(spk_feat, _)] = w2v.layer17([speaker_wave(mono, rate, 1.0)])
        [(emo_feat, _)] = w2v.layer17([emotion_wave(mono, rate, 1.0)])
        np.testing.assert_allclose(np.load(tmp_path / "cut" / line["condition_path"]),
                                   encoders.condition(spk_feat).numpy(), atol=FLOAT_ATOL, rtol=0)
        np.testing.assert_allclose(np.load(tmp_path / "cut" / line["emo_vec_path"]),
                                   encoders.emo_vec(emo_feat).numpy(), atol=FLOAT_ATOL, rtol=0)
        full_line = _kept(tmp_path / "out")[clip]
        assert np.array_equal(np.load(tmp_path / "cut" / line["codes_path"]),
                              np.load(tmp_path / "out" / full_line["codes_path"]))
    long_clip, uncut = cut_lines["a_44k1_stereo_pcm16"], _kept(tmp_path / "out")["a_44k1_stereo_pcm16"]
    assert not np.array_equal(np.load(tmp_path / "cut" / long_clip["condition_path"]),
                              np.load(tmp_path / "out" / uncut["condition_path"]))


@pytest.mark.slow
def test_batch_seconds_keeps_codes_exact_and_floats_those_of_one_clip_at_a_time(tmp_path) -> None:
    """Clips of 1 to 2 s (four rates and channel layouts), each alone, in twos and in one padded batch:
    condition and emo_vec are those of the clip alone bit for bit (their w2v-BERT pass never sees
    padding), which is within the reference tolerance of official inference by construction."""
    reference_model_dir(tmp_path, is_v25=False)
    reference_corpus(tmp_path, is_v25=False)
    runs = {"alone": "1", "pairs": "3", "together": "100"}  # every clip its own batch ... one padded batch
    for out, seconds in runs.items():
        code, output = run_command(tmp_path, False, out, "--batch-seconds", seconds)
        assert code == 0
        # --val-fraction 0 (run_command's): prepare says that val.jsonl is empty, and what to do
        assert ("warning: 0 validation pairs (no clip of a speaker with two clips or more fell in --val-fraction 0; "
                "4 clips kept, 1 speakers): val.jsonl is empty and train-gpt refuses it as --val-manifest; rerun "
                "with a larger --val-fraction (e.g. 0.2) or --val-speakers 1") in output
    kept = {out: _kept(tmp_path / out) for out in runs}
    for clip in CLIPS:
        for out in ("pairs", "together"):
            for name in ("codes", "text_ids", "condition", "emo_vec"):
                np.testing.assert_array_equal(np.load(tmp_path / "alone" / kept["alone"][clip][f"{name}_path"]),
                                              np.load(tmp_path / out / kept[out][clip][f"{name}_path"]),
                                              err_msg=f"{clip} {name} --batch-seconds {runs[out]}")


@pytest.mark.slow
@pytest.mark.parametrize("is_v25", [False, True], ids=["indextts2", "indextts2.5"])
def test_what_the_text_or_path_rejects_is_rejected_before_any_audio_and_the_top_reasons_shown(tmp_path,
                                                                                               is_v25) -> None:
    """Every clip rejected: the summary shows each kind of reason with its count and a rejected.jsonl line.
    The texts are refused before their audio is opened: the audio here is not readable, and reading it
    would have been the reason."""
    reference_model_dir(tmp_path, is_v25)
    (tmp_path / "noise.wav").write_bytes(b"RIFF....WAVEfmt garbage")
    text = TEXT_V25["input"] if is_v25 else "Hello \u1240 world"  # 2.5: no language; IndexTTS2: a piece it lacks
    lines = [{"id": f"u{i}", "audio": "noise.wav", "text": text, "speaker": "s"} for i in range(3)]
    lines.append({"id": "gone", "audio": "nope.wav", "text": TEXT_V25["input"] if is_v25 else "HI", "speaker": "s"})
    (tmp_path / "bad.jsonl").write_text("".join(json.dumps(line, ensure_ascii=False) + "\n" for line in lines))
    code, output = run_command(tmp_path, is_v25, "out", corpus="bad.jsonl", language=False)
    assert code == 2 and "prepared 0/4 utterances" in output, output
    rejected = [json.loads(line) for line in (tmp_path / "out" / "rejected.jsonl").read_text().splitlines()]
    kind = "text: no language (IndexTTS-2.5 needs one; pass --language or a language field)" if is_v25 else \
        "text: characters the tokenizer does not know"
    count = 4 if is_v25 else 3  # 2.5: the missing file has no language either, and the text is checked first
    assert f"  {count} x {kind}, e.g. {json.dumps(rejected[0], ensure_ascii=False)}" in output.splitlines()
    if not is_v25:
        assert "  1 x audio: file not found, e.g. " + json.dumps(rejected[3], ensure_ascii=False) in output
    assert not any("unreadable" in line["reason"] for line in rejected)
    report = json.loads((tmp_path / "out" / "prepare.json").read_text())
    assert report["counts"]["rejected_top"][0] == {"reason": kind, "count": count, "example": rejected[0]}


@pytest.mark.slow
def test_bad_inputs_are_rejected_with_reasons_and_exit_codes(tmp_path) -> None:
    reference_model_dir(tmp_path, is_v25=False, max_mel_tokens=60)  # clips a (67 codes) and d (101) do not fit
    corpus = reference_corpus(tmp_path, is_v25=False)
    (tmp_path / "noise.wav").write_bytes(b"RIFF....WAVEfmt garbage")
    (tmp_path / "silent.wav").write_bytes((REF / "audio" / "c_16k_mono_pcm16.wav").read_bytes()[:44] + bytes(32000))
    extra = [{"id": "missing", "audio": "nope.wav", "text": "HI"},
             {"id": "garbage", "audio": "noise.wav", "text": "HI"},
             {"id": "silent", "audio": "silent.wav", "text": "HELLO"},
             {"id": "unknown", "audio": str(REF / "audio" / "c_16k_mono_pcm16.wav"), "text": "Hello ቀ world"},
             {"id": "empty", "audio": str(REF / "audio" / "b_22k05_mono_float.wav"), "text": " "}]
    with open(corpus, "a") as handle:
        handle.write("".join(json.dumps(line, ensure_ascii=False) + "\n" for line in extra))
    code, output = run_command(tmp_path, False, "out")
    assert code == 1, output
    reasons = {r["id"]: r["reason"] for r in map(json.loads, (tmp_path / "out" / "rejected.jsonl").read_text()
                                                 .splitlines())}
    assert reasons["a_44k1_stereo_pcm16"] == "too long: 67 codes > gpt.max_mel_tokens 60"
    assert reasons["d_16k_mono_float_long"] == "too long: 101 codes > gpt.max_mel_tokens 60"
    assert reasons["missing"] == "audio: file not found"
    assert reasons["garbage"].startswith("audio: unreadable")
    assert reasons["silent"].startswith("audio: silent")
    assert reasons["unknown"].startswith("text: characters the tokenizer does not know: ቀ")
    assert reasons["empty"] == "text: empty"
    assert set(_kept(tmp_path / "out")) == {"b_22k05_mono_float", "c_16k_mono_pcm16"}
    assert '  2 x too long: N codes > gpt.max_mel_tokens N, e.g. {"id": "a_44k1_stereo_pcm16"' in output
    corpus.write_text(json.dumps({"id": "x", "audio": "nope.wav", "text": "HI"}) + "\n")
    code, output = run_command(tmp_path, False, "none_kept")
    assert code == 2 and "prepared 0/1" in output


def test_missing_model_files_are_listed_with_where_to_put_them(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "empty_cache"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    (tmp_path / "models").mkdir()
    shutil.copy(TINY_V2, tmp_path / "models" / "config.yaml")
    reference_corpus(tmp_path, is_v25=False)
    result = CliRunner().invoke(app, ["prepare", str(tmp_path / "corpus.jsonl"), "--model-dir",
                                      str(tmp_path / "models"), "--out", str(tmp_path / "out")])
    assert result.exit_code == 2
    for name in ("gpt.pth", "wav2vec2bert_stats.pt", "bpe.model", "semantic_codec/model.safetensors",
                 "w2v-BERT", "--download", "CC-BY-NC-4.0"):
        assert name in result.output, (name, result.output)
    assert "Traceback" not in result.output and not (tmp_path / "out").exists()


@pytest.mark.parametrize(("flags", "message"), [
    (["--batch-seconds", "0"], "--batch-seconds 0.0: must be > 0"),
    (["--val-fraction", "1"], "--val-fraction 1.0: must be >= 0 and < 1"),
    (["--min-seconds", "3", "--max-seconds", "2"], "need 0 <= min < max"),
    (["--semantic-codec", "nope.safetensors"], "--semantic-codec nope.safetensors: semantic codec (MaskGCT "
                                               "semantic_codec/model.safetensors) not found"),
    (["--device", "potato"], "--device potato: not a device"),
])
def test_bad_flags_are_one_line_and_exit_2(tmp_path, flags, message) -> None:
    (tmp_path / "models").mkdir()
    shutil.copy(TINY_V2, tmp_path / "models" / "config.yaml")
    reference_corpus(tmp_path, is_v25=False)
    result = CliRunner().invoke(app, ["prepare", str(tmp_path / "corpus.jsonl"), "--model-dir",
                                      str(tmp_path / "models"), "--out", str(tmp_path / "out"), *flags])
    assert result.exit_code == 2 and message in result.output, result.output
    assert len(result.output.strip().splitlines()) == 1 and not (tmp_path / "out").exists()


@pytest.mark.parametrize(("is_v25", "flag"), [(False, "--campplus"), (True, "--semantic-codec")])
def test_a_model_file_flag_of_the_other_family_is_refused_not_ignored(tmp_path, is_v25, flag) -> None:
    """--campplus given for IndexTTS2 (or --semantic-codec for 2.5) was silently ignored: a script of the other
    family's. One line before any work, naming the flag and the family of the model folder."""
    (tmp_path / "models").mkdir()
    shutil.copy(TINY_V25 if is_v25 else TINY_V2, tmp_path / "models" / "config.yaml")
    reference_corpus(tmp_path, is_v25=is_v25)
    (tmp_path / "theirs.bin").write_bytes(b"a model file")
    result = CliRunner().invoke(app, ["prepare", str(tmp_path / "corpus.jsonl"), "--model-dir",
                                      str(tmp_path / "models"), "--out", str(tmp_path / "out"), flag,
                                      str(tmp_path / "theirs.bin")])
    family = "IndexTTS-2.5" if is_v25 else "IndexTTS2"
    assert result.exit_code == 2 and f"{flag} {tmp_path / 'theirs.bin'}: " in result.output, result.output
    assert f"is {family}'s, whose features take no such file; leave {flag} out" in result.output
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(("is_v25", "tokenizer", "given"), [
    (True, "bpe.model", "an IndexTTS2 SentencePiece model"),
    (False, "grown.tiktoken", "an IndexTTS-2.5 .tiktoken vocabulary")])
def test_a_tokenizer_of_the_other_family_is_refused_before_any_work(tmp_path, is_v25, tokenizer, given) -> None:
    """An IndexTTS2 .model for an IndexTTS-2.5 folder ran the whole job and exited 0 with lines check-data
    refuses (`lang_id -1`); the reverse was refused only by chance, after the models were hashed. Both are
    one line naming the flag and the folder's family, before --out is made."""
    (tmp_path / "models").mkdir()
    shutil.copy(TINY_V25 if is_v25 else TINY_V2, tmp_path / "models" / "config.yaml")
    reference_corpus(tmp_path, is_v25=is_v25)
    (tmp_path / tokenizer).write_bytes(b"a tokenizer")
    result = CliRunner().invoke(app, ["prepare", str(tmp_path / "corpus.jsonl"), "--model-dir",
                                      str(tmp_path / "models"), "--out", str(tmp_path / "out"), "--tokenizer",
                                      str(tmp_path / tokenizer), *(["--language", "en"] if is_v25 else [])])
    family = "IndexTTS-2.5" if is_v25 else "IndexTTS2"
    assert result.exit_code == 2 and len(result.output.strip().splitlines()) == 1, result.output
    assert result.output.startswith(f"error: --tokenizer {tmp_path / tokenizer}: {given}, but ")
    assert f"config.yaml is {family}'s" in result.output
    assert not (tmp_path / "out").exists()


@pytest.mark.slow
def test_train_gpt_reads_the_prepared_manifests_unchanged(tmp_path) -> None:
    """The public train-gpt, in its own process, on prepare's train.jsonl / val.jsonl as written."""
    model_dir = reference_model_dir(tmp_path, is_v25=False)
    reference_corpus(tmp_path, is_v25=False)
    code, output = run_command(tmp_path, False, "out", "--val-speakers", "0", "--val-fraction", "0.5")
    assert code == 0, output
    out = tmp_path / "out"
    assert (out / "val.jsonl").read_text() and (out / "train.jsonl").read_text()
    root = Path(__file__).resolve().parents[1]
    result = subprocess.run(
        [sys.executable, "-m", "indextts_train", "--train-manifest", str(out / "train.jsonl"), "--val-manifest",
         str(out / "val.jsonl"), "--tokenizer", str(REF / "text" / "bpe_tiny.model"), "--config",
         str(model_dir / "config.yaml"), "--base-checkpoint", str(model_dir / "gpt.pth"), "--output-dir",
         str(tmp_path / "run"), "--max-steps", "2", "--batch-size", "2", "--grad-accumulation", "1",
         "--val-interval", "2", "--save-interval", "2"],
        cwd=root, env={**os.environ, "PYTHONPATH": str(root)}, capture_output=True, text=True,
        timeout=600)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    assert (tmp_path / "run" / "latest.pth").is_file() and "val step 2" in result.stdout


def test_an_unreadable_gpt_pth_is_one_line(tmp_path) -> None:
    (tmp_path / "gpt.pth").write_bytes(b"not a torch file")
    with pytest.raises(UserError, match=r"gpt\.pth is not a readable checkpoint: .*the model folder's gpt\.pth$"):
        read_gpt_weights(tmp_path / "gpt.pth")
    torch.save([1, 2], tmp_path / "gpt.pth")
    with pytest.raises(UserError, match="holds a list, not a checkpoint dict"):
        read_gpt_weights(tmp_path / "gpt.pth")


@pytest.mark.parametrize("clip", CLIPS)
def test_code_counts_from_the_header_equal_the_official_valid_frames(clip) -> None:
    """plan() rejects too-long clips before any model, from the header and the length rules alone."""
    import soundfile

    info = soundfile.info(REF / "audio" / f"{clip}.wav")
    assert expected_codes(info.frames, info.samplerate, 1) == _n_valid(clip)
    assert expected_codes(info.frames, info.samplerate, 2) == math.ceil(_n_valid(clip) / 2)
