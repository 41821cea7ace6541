"""lhotse manifests and Hugging Face datasets as corpora: built with the libraries' own APIs from synthetic
WAV files, read through the shipped readers and audio path, and compared with the same clips written as
their own WAV files and read through a JSONL corpus (the arrays must be equal, not close).

The model stages are replaced by a featurizer that stores the waveforms themselves (the real stages
are deterministic functions of them, tested in test_prepare_e2e.py), so equal arrays here mean the
stages see exactly the same samples.
"""

from __future__ import annotations

import io
import json
import os
from pathlib import Path

# datasets and lhotse are imported, not skipped when missing: scripts/test.sh installs the `corpora`
# extra, and readers that CI cannot test must fail loudly there.
import datasets
import lhotse  # noqa: F401 (used through `from lhotse import ...` below; a missing library fails here)
import numpy as np
import pytest
import soundfile

from indextts_train.errors import UserError
from indextts_train.prepare.clip_source import audio_header
from indextts_train.prepare.corpus import Defaults, read_corpora
from indextts_train.prepare.featurize import Clip, load_clip
from indextts_train.prepare.pairs import SplitRule
from indextts_train.prepare.pipeline import PrepareOptions, run_prepare

RATE = 16_000
# (id, recording, start s, duration s, speaker, language): exact binary fractions, so offsets add exactly
SEGMENTS = [("s1", "rec1", 0.5, 1.0, "A", None), ("s2", "rec1", 1.75, 1.0, "B", "am"),
            ("s3", "rec2", 0.0, 2.0, "A", None)]
RECORDING_SECONDS = {"rec1": 3.0, "rec2": 2.0}


def _samples(seconds: float, seed: int) -> np.ndarray:
    """int16 samples: tones under a slow envelope plus noise, different per seed."""
    rng = np.random.default_rng(seed)
    t = np.arange(int(seconds * RATE)) / RATE
    wave = 0.3 * np.sin(2 * np.pi * (120 + 40 * seed) * t) * (0.6 + 0.4 * np.sin(2 * np.pi * 0.7 * t))
    return np.round((wave + 0.01 * rng.standard_normal(t.size)) * 32767).astype(np.int16)


def _wav_bytes(samples: np.ndarray) -> bytes:
    buffer = io.BytesIO()
    soundfile.write(buffer, samples, RATE, format="WAV", subtype="PCM_16")
    return buffer.getvalue()


def _jsonl(path: Path, lines: list[dict]) -> Path:
    path.write_text("".join(json.dumps(line) + "\n" for line in lines), encoding="utf-8")
    return path


def _recordings(root: Path) -> tuple[dict[str, np.ndarray], Path]:
    """Long recordings, and a JSONL corpus of each segment written as its own WAV file (the reference)."""
    root.mkdir(parents=True, exist_ok=True)
    samples = {}
    for seed, (rec, seconds) in enumerate(RECORDING_SECONDS.items()):
        samples[rec] = _samples(seconds, seed)
        soundfile.write(root / f"{rec}.wav", samples[rec], RATE, subtype="PCM_16")
    lines = []
    for sid, rec, start, duration, speaker, language in SEGMENTS:
        first = int(start * RATE)
        soundfile.write(root / f"seg_{sid}.wav", samples[rec][first:first + int(duration * RATE)], RATE,
                        subtype="PCM_16")
        lines.append({"id": sid, "audio": f"seg_{sid}.wav", "text": f"text {sid}", "speaker": speaker}
                     | ({"language": language} if language else {}))
    return samples, _jsonl(root / "segments.jsonl", lines)


def _lhotse_manifests(root: Path) -> tuple[object, object]:
    from lhotse import Recording, RecordingSet, SupervisionSegment, SupervisionSet

    recordings = RecordingSet.from_recordings(
        Recording.from_file(root / f"{rec}.wav", recording_id=rec) for rec in RECORDING_SECONDS)
    supervisions = SupervisionSet.from_segments(
        SupervisionSegment(sid, rec, start, duration, text=f"text {sid}", speaker=speaker, language=language)
        for sid, rec, start, duration, speaker, language in SEGMENTS)
    return recordings, supervisions


def _assert_same_clips(utts, reference) -> None:
    by_id = {u.id: u for u in reference}
    assert sorted(u.id for u in utts) == sorted(by_id)
    for utt in utts:
        ref = by_id[utt.id]
        assert audio_header(utt) == audio_header(ref)
        assert (utt.text, utt.speaker, utt.language) == (ref.text, ref.speaker, ref.language)
        got, want = load_clip(utt, 0.6), load_clip(ref, 0.6)  # 0.6 s prompt: the cut is exercised too
        assert isinstance(got, Clip) and isinstance(want, Clip)
        for name in ("speaker_full", "speaker_prompt", "emotion"):
            np.testing.assert_array_equal(getattr(got, name), getattr(want, name), err_msg=f"{utt.id} {name}")


def test_lhotse_cuts_give_exactly_the_segments_samples(tmp_path) -> None:
    from lhotse import CutSet

    _, reference = _recordings(tmp_path)
    recordings, supervisions = _lhotse_manifests(tmp_path)
    whole = CutSet.from_manifests(recordings=recordings, supervisions=supervisions)  # cut.start 0
    whole.to_file(tmp_path / "cuts.jsonl.gz")
    whole.trim_to_supervisions(keep_overlapping=False).to_file(tmp_path / "trimmed_cuts.jsonl")  # cut.start > 0
    ref = read_corpora([reference], Defaults())
    for manifest in ("cuts.jsonl.gz", "trimmed_cuts.jsonl"):
        utts = read_corpora([tmp_path / manifest], Defaults())
        assert {u.id: (u.offset, u.duration) for u in utts} == {s[0]: (s[2], s[3]) for s in SEGMENTS}
        assert utts[0].audio == str((tmp_path / "rec1.wav").resolve())
        _assert_same_clips(utts, ref)


def test_lhotse_recordings_and_supervisions_by_either_file_or_folder(tmp_path) -> None:
    _, reference = _recordings(tmp_path)
    recordings, supervisions = _lhotse_manifests(tmp_path)
    manifests = tmp_path / "manifests"
    manifests.mkdir()
    recordings.to_file(manifests / "corpus_recordings_train.jsonl.gz")
    supervisions.to_file(manifests / "corpus_supervisions_train.jsonl.gz")
    ref = read_corpora([reference], Defaults())
    for given in ("corpus_recordings_train.jsonl.gz", "corpus_supervisions_train.jsonl.gz", ""):
        utts = read_corpora([manifests / given], Defaults())
        assert [u.id for u in utts] == ["s1", "s2", "s3"]
        _assert_same_clips(utts, ref)
    (manifests / "corpus_supervisions_train.jsonl.gz").unlink()
    with pytest.raises(UserError, match=r"its supervisions manifest .*corpus_supervisions_train\.jsonl\.gz is missing"):
        read_corpora([manifests / "corpus_recordings_train.jsonl.gz"], Defaults())


@pytest.mark.slow  # 144 MiB of text compressed and read back: seconds
def test_a_lhotse_manifest_is_read_within_bounds_before_lhotse_reads_it(tmp_path) -> None:
    """A 1 MB .jsonl.gz holding one line of a gigabyte took 27 s and 3 GB of memory in lhotse's reader (a
    larger one, all the memory there is); a FIFO among a folder's manifests blocked it for good."""
    import gzip

    from indextts_train.prepare import corpus_lhotse

    _recordings(tmp_path)
    recordings, supervisions = _lhotse_manifests(tmp_path)
    bomb = tmp_path / "cuts.jsonl.gz"
    first = tmp_path / "first.jsonl"
    from lhotse import CutSet

    CutSet.from_manifests(recordings=recordings, supervisions=supervisions).to_file(first)
    with gzip.open(bomb, "wb", compresslevel=9) as handle:
        handle.write(first.read_bytes().splitlines(keepends=True)[0])
        handle.write(b" " * ((64 << 20) + 1) + b"\n")  # one line past files/bounded's bound
    with pytest.raises(UserError, match=r"cuts\.jsonl\.gz:2: a line longer than 64 MiB"):
        read_corpora([bomb], Defaults())
    with gzip.open(bomb, "wb", compresslevel=9) as handle:  # each line within bounds, the whole 80 MiB
        for _ in range(2):
            handle.write(b" " * (40 << 20) + b"\n")
    with pytest.raises(UserError, match=r"gz:2: more than 67108864 bytes of lhotse manifest once decompressed"):
        read_corpora([bomb], Defaults())
    manifests = tmp_path / "manifests"
    manifests.mkdir()
    recordings.to_file(manifests / "corpus_recordings_train.jsonl.gz")
    os.mkfifo(manifests / "corpus_supervisions_train.jsonl.gz")
    with pytest.raises(UserError, match=r"corpus_supervisions_train\.jsonl\.gz: lhotse manifest is a FIFO"):
        read_corpora([manifests], Defaults())  # the folder's supervisions, each read with its recordings
    (manifests / "not_gzip_supervisions.jsonl.gz").write_bytes(b"plain text\n")
    with pytest.raises(UserError, match=r"not_gzip_supervisions\.jsonl\.gz: not a readable \.jsonl\.gz"):
        corpus_lhotse._check_manifest(manifests / "not_gzip_supervisions.jsonl.gz")


def test_lhotse_defaults_fill_speaker_and_language(tmp_path) -> None:
    from lhotse import CutSet, Recording, RecordingSet, SupervisionSegment, SupervisionSet

    _recordings(tmp_path)
    recording = Recording.from_file(tmp_path / "rec1.wav")
    sup = SupervisionSegment("only", recording.id, 0.25, 1.0, text="hi")
    CutSet.from_manifests(recordings=RecordingSet.from_recordings([recording]),
                          supervisions=SupervisionSet.from_segments([sup])).to_file(tmp_path / "c.jsonl.gz")
    (utt,) = read_corpora([tmp_path / "c.jsonl.gz"], Defaults(speaker="spk", language="en"))
    assert (utt.id, utt.speaker, utt.language, utt.offset, utt.duration) == ("only", "spk", "en", 0.25, 1.0)
    assert utt.audio_fields() == {"audio": str((tmp_path / "rec1.wav").resolve()), "offset": 0.25, "duration": 1.0}
    assert audio_header(utt) == (RATE, RATE)


@pytest.mark.parametrize(("change", "message"), [
    ("url", r"recording 'rec1' has a 'url' audio source; only 'file' sources are read"),
    ("two_sources", r"recording 'rec1' has 2 audio sources"),
    ("channel", r"selects channel\(s\) \[1\] of the 2-channel recording 'rec1'"),
])
def test_lhotse_sources_other_than_one_file_are_refused_in_one_line(tmp_path, change, message) -> None:
    from lhotse import CutSet, Recording, RecordingSet, SupervisionSegment, SupervisionSet
    from lhotse.audio import AudioSource

    _recordings(tmp_path)
    recording = Recording.from_file(tmp_path / "rec1.wav", recording_id="rec1")
    path = str(tmp_path / "rec1.wav")
    channel = 0
    if change == "url":
        recording.sources = [AudioSource(type="url", channels=[0], source="https://example.org/rec1.wav")]
    elif change == "two_sources":
        recording.sources = [AudioSource("file", [0], path), AudioSource("file", [1], path)]
        recording.channel_ids = [0, 1]
    else:
        recording.sources = [AudioSource("file", [0, 1], path)]
        recording.channel_ids, channel = [0, 1], 1
    sup = SupervisionSegment("x", "rec1", 0.0, 1.0, channel=channel, text="hi")
    CutSet.from_manifests(recordings=RecordingSet.from_recordings([recording]),
                          supervisions=SupervisionSet.from_segments([sup])).to_file(tmp_path / "c.jsonl.gz")
    with pytest.raises(UserError, match=message) as info:
        read_corpora([tmp_path / "c.jsonl.gz"], Defaults())
    assert "\n" not in str(info.value) and str(tmp_path / "c.jsonl.gz") in str(info.value)


def _hf_dataset(root: Path) -> tuple[object, Path]:
    """A dataset of embedded WAV bytes (and the same clips as a JSONL corpus of files)."""
    root.mkdir(parents=True, exist_ok=True)
    rows = {"id": [], "audio": [], "sentence": [], "speaker_id": [], "locale": []}
    lines = []
    for i, seconds in enumerate((1.0, 1.5, 0.75)):
        samples = _samples(seconds, 10 + i)
        soundfile.write(root / f"clip{i}.wav", samples, RATE, subtype="PCM_16")
        rows["id"].append(f"clip{i}")
        rows["audio"].append({"bytes": _wav_bytes(samples), "path": None})
        rows["sentence"].append(f"sentence {i}")
        rows["speaker_id"].append(i % 2)
        rows["locale"].append("am")
        lines.append({"id": f"clip{i}", "audio": f"clip{i}.wav", "text": f"sentence {i}", "speaker": str(i % 2),
                      "language": "am"})
    dataset = datasets.Dataset.from_dict(rows).cast_column("audio", datasets.Audio())
    return dataset, _jsonl(root / "clips.jsonl", lines)


def test_hf_save_to_disk_and_parquet_rows_read_lazily(tmp_path) -> None:
    dataset, reference = _hf_dataset(tmp_path / "clips")
    dataset.save_to_disk(str(tmp_path / "saved"))
    (tmp_path / "pq").mkdir()
    dataset.to_parquet(str(tmp_path / "pq" / "train.parquet"), batch_size=1)  # a row group a row
    import pyarrow.parquet as pq

    assert pq.ParquetFile(str(tmp_path / "pq" / "train.parquet")).num_row_groups == 3
    ref = read_corpora([reference], Defaults())
    for corpus in (tmp_path / "saved", tmp_path / "pq" / "train.parquet", tmp_path / "pq"):
        utts = read_corpora([corpus], Defaults())
        assert [u.row for u in utts] == [0, 1, 2]
        assert utts[1].audio_fields() == {"audio": f"{utts[1].audio}#1"}
        _assert_same_clips(utts, ref)


def test_lhotse_defaults_every_supervision_has_no_use_for_are_refused(tmp_path) -> None:
    from lhotse import CutSet, Recording, RecordingSet, SupervisionSegment, SupervisionSet

    _recordings(tmp_path)
    recording = Recording.from_file(tmp_path / "rec1.wav")
    sup = SupervisionSegment("only", recording.id, 0.25, 1.0, text="hi", speaker="A", language="am")
    CutSet.from_manifests(recordings=RecordingSet.from_recordings([recording]),
                          supervisions=SupervisionSet.from_segments([sup])).to_file(tmp_path / "c.jsonl.gz")
    for defaults, flag in ((Defaults(speaker="spk"), "--speaker spk"), (Defaults(language="en"), "--language en")):
        with pytest.raises(UserError, match=f"^{flag}: every CORPUS names its .*would change nothing"):
            read_corpora([tmp_path / "c.jsonl.gz"], defaults)


def test_hf_audio_given_as_a_path_and_ids_from_rows(tmp_path, monkeypatch) -> None:
    samples = _samples(1.0, 3)
    (tmp_path / "pq" / "clips").mkdir(parents=True)
    soundfile.write(tmp_path / "pq" / "clips" / "a.wav", samples, RATE, subtype="PCM_16")
    monkeypatch.chdir(tmp_path / "pq")  # datasets looks at the file while writing
    datasets.Dataset.from_dict({"audio": [{"bytes": None, "path": "clips/a.wav"}], "text": ["hello"]}) \
        .cast_column("audio", datasets.Audio()).to_parquet(str(tmp_path / "pq" / "part.parquet"))
    monkeypatch.chdir(tmp_path)  # read from the dataset's folder, not the current one
    (utt,) = read_corpora([tmp_path / "pq" / "part.parquet"], Defaults(speaker="me"))
    assert (utt.id, utt.text, utt.speaker, utt.language) == ("part-0", "hello", "me", None)
    ref = read_corpora([_jsonl(tmp_path / "r.jsonl", [{"id": "part-0", "audio": "pq/clips/a.wav", "text": "hello",
                                                      "speaker": "me"}])], Defaults())
    _assert_same_clips([utt], ref)


def test_a_parquet_file_is_measured_before_its_values_are_read(tmp_path, monkeypatch) -> None:
    """A dictionary-encoded column holds a long value once and repeats it per row: a Parquet file of 1.3 KB
    held a gigabyte of text, and reading it took 2.8 GB of memory (ten times the rows, ten times that).
    The values are measured with their dictionaries unexpanded, against bounds made small here."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from indextts_train.prepare import corpus_hf
    from indextts_train.prepare.corpus_hf import RowAudioError, read_dataset, row_audio

    audio = pa.array([{"bytes": b"\x01" * 1000, "path": "a.wav"}] * 40,
                     type=pa.struct([("bytes", pa.binary()), ("path", pa.string())]))
    for name, text in (("long.parquet", "a" * 2000), ("many.parquet", "b" * 900)):
        pq.write_table(pa.table({"text": [text] * 40, "audio": audio}), tmp_path / name, compression="zstd")
        assert (tmp_path / name).stat().st_size < 20_000  # its rows hold 76,000-120,000 bytes: each value stored once
    monkeypatch.setattr(corpus_hf, "MAX_VALUE_BYTES", 1000)
    monkeypatch.setattr(corpus_hf, "MAX_COLUMN_BYTES", 30_000)
    monkeypatch.setattr(corpus_hf, "MAX_GROUP_BYTES", 30_000)
    with pytest.raises(UserError, match=r"long\.parquet: column 'text' holds a value of 2000 bytes"):
        read_dataset(tmp_path / "long.parquet", Defaults())
    with pytest.raises(UserError, match=r"many\.parquet: column 'text' holds more than 30000 bytes in all"):
        read_dataset(tmp_path / "many.parquet", Defaults())
    monkeypatch.setattr(corpus_hf, "MAX_COLUMN_BYTES", 1 << 20)
    utts = read_dataset(tmp_path / "many.parquet", Defaults())
    assert len(utts) == 40 and utts[0].text == "b" * 900
    with pytest.raises(RowAudioError, match=r"row group 0 of .*many\.parquet holds 40000 bytes of audio"):
        row_audio(utts[0].audio, utts[0].row)
    monkeypatch.setattr(corpus_hf, "MAX_GROUP_BYTES", 1 << 20)
    corpus_hf._OPEN.clear()
    assert row_audio(utts[3].audio, utts[3].row).read() == b"\x01" * 1000


def test_hf_without_a_text_column_is_one_line(tmp_path) -> None:
    datasets.Dataset.from_dict({"audio": [{"bytes": _wav_bytes(_samples(0.5, 1)), "path": None}],
                                "words": ["x"]}).cast_column("audio", datasets.Audio()) \
        .save_to_disk(str(tmp_path / "ds"))
    with pytest.raises(UserError, match=r"ds: no text column \(looked for text, sentence, .*columns: audio, words\); "
                                         "name the transcript column with --text-column"):
        read_corpora([tmp_path / "ds"], Defaults())
    [utt] = read_corpora([tmp_path / "ds"], Defaults(text_column="words"))
    assert utt.text == "x"
    with pytest.raises(UserError, match=r"ds: no text column \(--text-column wrds; columns: audio, words\)"):
        read_corpora([tmp_path / "ds"], Defaults(text_column="wrds"))
    datasets.Dataset.from_dict({"text": ["x"]}).to_parquet(str(tmp_path / "t.parquet"))
    with pytest.raises(UserError, match=r"t\.parquet: no audio column"):
        read_corpora([tmp_path / "t.parquet"], Defaults())
    (tmp_path / "broken.parquet").write_bytes(b"PAR1 not parquet")
    with pytest.raises(UserError, match=r"broken\.parquet: not a Hugging Face dataset datasets can open"):
        read_corpora([tmp_path / "broken.parquet"], Defaults())


@pytest.fixture
def wave_models(tmp_path, tiny_models) -> None:
    """The real stages on the tiny models (conftest): equal arrays mean equal waveforms went in."""
    (tmp_path / "models").symlink_to(tiny_models, target_is_directory=True)


def _prepare(tmp_path: Path, corpus: Path, out: str) -> dict[str, np.ndarray]:
    options = PrepareOptions(corpora=[corpus], model_dir=tmp_path / "models", out=tmp_path / out, device="cpu",
                             split=SplitRule(val_fraction=0.0, prompts_per_target=1), min_seconds=0.3,
                             prompt_seconds=0.6, batch_seconds=3.0, allow_unk=True)  # the tiny BPE knows no digits
    assert run_prepare(options) == 0
    return {p.relative_to(tmp_path / out).as_posix(): np.load(p) for p in sorted((tmp_path / out).rglob("*.npy"))}


def _same_arrays(got: dict[str, np.ndarray], want: dict[str, np.ndarray]) -> None:
    assert sorted(got) == sorted(want) and len(got) >= 9
    for name, array in want.items():
        np.testing.assert_array_equal(got[name], array, err_msg=name)


@pytest.mark.slow  # the real model stages: seconds a run
def test_prepare_of_lhotse_and_hf_corpora_equals_the_jsonl_of_the_same_clips(tmp_path, wave_models) -> None:
    from lhotse import CutSet

    _, segments = _recordings(tmp_path / "lh")
    recordings, supervisions = _lhotse_manifests(tmp_path / "lh")
    CutSet.from_manifests(recordings=recordings, supervisions=supervisions).to_file(tmp_path / "lh" / "cuts.jsonl.gz")
    _same_arrays(_prepare(tmp_path, tmp_path / "lh" / "cuts.jsonl.gz", "out_cuts"),
                 _prepare(tmp_path, segments, "out_segments"))
    kept = [json.loads(line) for line in (tmp_path / "out_cuts" / "utterances.jsonl").read_text().splitlines()]
    assert {(k["id"], k["offset"], k["duration"]) for k in kept} == {(s[0], s[2], s[3]) for s in SEGMENTS}
    assert all(k["audio"].endswith(("rec1.wav", "rec2.wav")) for k in kept)

    dataset, clips = _hf_dataset(tmp_path / "hf")
    dataset.to_parquet(str(tmp_path / "hf" / "train.parquet"))
    _same_arrays(_prepare(tmp_path, tmp_path / "hf" / "train.parquet", "out_hf"),
                 _prepare(tmp_path, clips, "out_clips"))
    kept = [json.loads(line) for line in (tmp_path / "out_hf" / "utterances.jsonl").read_text().splitlines()]
    assert [k["audio"] for k in kept] == [f"{(tmp_path / 'hf' / 'train.parquet').resolve()}#{i}" for i in range(3)]


@pytest.mark.slow  # the real model stages: seconds a run
def test_a_row_without_audio_is_rejected_with_its_reason(tmp_path, wave_models) -> None:
    dataset, _ = _hf_dataset(tmp_path / "hf")
    rows = dataset.to_dict()
    rows["audio"][1] = {"bytes": None, "path": None}
    rows["audio"][2] = {"bytes": b"not audio", "path": None}
    datasets.Dataset.from_dict(rows).to_parquet(str(tmp_path / "bad.parquet"))
    options = PrepareOptions(corpora=[tmp_path / "bad.parquet"], model_dir=tmp_path / "models", out=tmp_path / "o",
                             device="cpu", split=SplitRule(val_fraction=0.0), min_seconds=0.3, allow_unk=True)
    assert run_prepare(options) == 1
    rejected = [json.loads(line) for line in (tmp_path / "o" / "rejected.jsonl").read_text().splitlines()]
    assert [(r["id"], r["audio"].rsplit("#", 1)[1]) for r in rejected] == [("clip1", "1"), ("clip2", "2")]
    assert rejected[0]["reason"] == "audio: row 1 has no audio (neither bytes nor a path)"
    assert rejected[1]["reason"].startswith("audio: unreadable")


def test_a_missing_library_is_named_with_the_extra_to_install(tmp_path, monkeypatch) -> None:
    from indextts_train.prepare import corpus

    (tmp_path / "cuts.jsonl.gz").write_bytes(b"")
    (tmp_path / "train.parquet").write_bytes(b"")
    monkeypatch.setattr(corpus.importlib.util, "find_spec", lambda name: None)
    for path, library in (("cuts.jsonl.gz", "lhotse"), ("train.parquet", "datasets")):
        with pytest.raises(UserError, match=rf"a {library} corpus, but {library} is not installed; "
                                            r"`pip install 'indextts-train\[corpora\]'`"):
            read_corpora([tmp_path / path], Defaults())
