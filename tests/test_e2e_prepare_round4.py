"""prepare, probe round 4: what users and attackers still broke, each one line now (or the right data).

- two prepares on one --out: the second removed the first's temp files (the first died in a traceback,
  FileNotFoundError) or, with --restart, its finished arrays; now the second is refused, naming the PID;
- prepare's own utterances.jsonl of a lhotse corpus, prepared again (another tokenizer, say), took the
  whole recording for each segment: its `offset` / `duration` were not read;
- a record that is prepare's but damaged (a key missing) was a KeyError, an array removed by hand a
  manifest naming no file: both are recomputed now;
- a Common Voice field past 128 KiB or with a carriage return was the csv module's traceback;
- a.wav and a.flac with one a.txt were refused naming a.txt twice; a folder corpus whose --out was the
  folder itself suggested prepare's own rejected.jsonl as the corpus; `--language ''` rejected every clip
  after the models loaded; a FIFO, folder or device as a clip was "file not found"; a NeMo manifest, a JSON
  array, an audio,text .csv or our JSONL gzipped were refused without saying what to change;
- the same corpus given twice (or a lhotse recordings manifest with its supervisions) was "give one of
  them another id"; an unreadable dataset row's reason held a memory address (no rerun gave the same
  bytes); --prompt-seconds 0.1, the least its --help names, was refused;
- a --restart stopped half-way left arrays of no listed stem, refused by every later run as the user's;
- a float WAV of finite but absurd samples (1e37) was kept with NaN features, exit 0;
- Ctrl+C said "interrupted (Ctrl+C)", neither what was kept nor what to do.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from indextts_train.errors import UserError
from indextts_train.prepare import corpus
from indextts_train.prepare.clip_source import audio_header
from indextts_train.prepare.corpus import Defaults, read_corpora
from indextts_train.prepare.outputs import SETTINGS_FILE, OutputFolder
from indextts_train.prepare.tiny import write_synthetic_clips, write_tiny_model_dir
from indextts_train.prepare.utterance import Utterance

ROOT = Path(__file__).resolve().parents[1]
REF = ROOT / "tests" / "data" / "reference" / "prepare"
MANIFESTS = ("utterances.jsonl", "train.jsonl", "val.jsonl", "rejected.jsonl", "prepare.json")
TEXT = "Hello world, this is a test."


def _jsonl(path: Path, lines: list[dict]) -> Path:
    path.write_text("".join(json.dumps(line) + "\n" for line in lines), encoding="utf-8")
    return path


# ---- fast: the readers, the record check, the flags ----


def test_a_jsonl_line_with_an_offset_is_that_segment_of_its_file(tmp_path) -> None:
    corpus_file = _jsonl(tmp_path / "c.jsonl", [
        {"id": "a", "audio": "r.wav", "text": "x", "offset": 0.0, "duration": 0.25},  # as utterances.jsonl has it
        {"id": "b", "audio": "r.wav", "text": "x", "offset": 1.5},
        {"id": "c", "audio": "r.wav", "text": "x", "duration": 3.0}])  # a NeMo-style note of the file's length
    a, b, c = read_corpora([corpus_file], Defaults())
    assert (a.offset, a.duration, a.is_segment) == (0.0, 0.25, True)
    assert (b.offset, b.duration) == (1.5, None)
    assert (c.offset, c.duration, c.is_segment) == (0.0, None, False)
    _jsonl(corpus_file, [{"audio": "r.wav", "text": "x", "offset": "1.5"}])
    with pytest.raises(UserError, match=r"c\.jsonl:1: field 'offset' must be a number of seconds"):
        read_corpora([corpus_file], Defaults())
    _jsonl(corpus_file, [{"audio": "r.wav", "text": "x", "offset": -1}])
    with pytest.raises(UserError, match=r"c\.jsonl:1: start -1\.0 is not a time"):
        read_corpora([corpus_file], Defaults())


@pytest.mark.parametrize(("content", "needle"), [
    ('{"audio_filepath": "a.wav", "text": "x", "duration": 1.0}\n', "field 'audio' is missing (rename "
                                                                     "'audio_filepath' to 'audio')"),
    ('{"audio": "a.wav", "sentence": "x"}\n', "field 'text' is missing (rename 'sentence' to 'text')"),
    ('{"clip": "a.wav", "text": "x"}\n', "field 'audio' is missing (the line has 'clip', 'text')"),
    ('[\n {"audio": "a.wav", "text": "x"}\n]\n', "looks like one JSON array; write each object on a line"),
    ('[{"audio": "a.wav", "text": "x"}]\n', "looks like one JSON array; write each object on a line"),
])
def test_another_tools_manifest_says_what_to_change(tmp_path, content, needle) -> None:
    (tmp_path / "m.json").write_text(content, encoding="utf-8")
    with pytest.raises(UserError) as caught:
        read_corpora([tmp_path / "m.json"], Defaults())
    assert needle in str(caught.value) and "\n" not in str(caught.value)


def test_an_audio_text_csv_is_told_to_become_jsonl(tmp_path) -> None:
    (tmp_path / "list.csv").write_text("audio,text\na.wav,hello\n", encoding="utf-8")
    with pytest.raises(UserError, match=r"list\.csv:1: expected `id\|text\|normalized text` .*write it as JSONL"):
        read_corpora([tmp_path / "list.csv"], Defaults())


def test_a_gzipped_jsonl_of_ours_is_told_to_be_decompressed(tmp_path) -> None:
    """Every .jsonl.gz is read as a lhotse manifest: ours gzipped was "check the file", naming lhotse's error."""
    import gzip

    with gzip.open(tmp_path / "corpus.jsonl.gz", "wt", encoding="utf-8") as handle:
        handle.write('{"audio": "a.wav", "text": "x", "speaker": "s"}\n')
    with pytest.raises(UserError) as caught:
        read_corpora([tmp_path / "corpus.jsonl.gz"], Defaults())
    assert str(caught.value).endswith("; it holds {\"audio\", \"text\"} lines, not lhotse's: decompress it "
                                      "(gunzip) and pass the .jsonl")


def test_a_common_voice_field_past_128_kib_or_with_a_carriage_return_is_read(tmp_path) -> None:
    tsv = tmp_path / "train.tsv"
    tsv.write_text("client_id\tpath\tsentence\tlocale\n"
                   f"c1\ta.mp3\t{'x' * 200_000}\tam\nc2\tb.mp3\tone\rtwo\tam\n", encoding="utf-8")
    a, b = corpus.read_common_voice(tsv, Defaults())
    assert (a.id, len(a.text), b.text, b.speaker, b.language) == ("a", 200_000, "one\rtwo", "c2", "am")


def test_a_corpus_given_twice_is_named_not_called_duplicate_ids(tmp_path, monkeypatch) -> None:
    corpus_file = _jsonl(tmp_path / "a.jsonl", [{"audio": "a.wav", "text": "x"}])
    (tmp_path / "alias.jsonl").symlink_to("a.jsonl")
    with pytest.raises(UserError, match=r"^CORPUS .*a\.jsonl: given twice; pass each corpus once$"):
        read_corpora([corpus_file, corpus_file], Defaults())
    with pytest.raises(UserError, match=r"^CORPUS .*alias\.jsonl: given twice \(the same file as .*a\.jsonl\)"):
        read_corpora([corpus_file, tmp_path / "alias.jsonl"], Defaults())
    # a lhotse recordings manifest and its supervisions: two arguments, one manifest read twice
    line = Utterance("u1", "/r.wav", "x", "s", None, "x_supervisions.jsonl.gz: supervision 'u1'")
    monkeypatch.setattr(corpus, "read_corpus", lambda path, defaults: [line])
    with pytest.raises(UserError) as caught:
        read_corpora([Path("x_recordings.jsonl.gz"), Path("x_supervisions.jsonl.gz")], Defaults())
    assert str(caught.value) == ("x_supervisions.jsonl.gz: supervision 'u1': read through CORPUS "
                                 "x_recordings.jsonl.gz and again through x_supervisions.jsonl.gz; pass only one of "
                                 "them (for lhotse: the recordings, the supervisions manifest or their folder)")


def test_two_clips_sharing_one_transcript_are_named(tmp_path) -> None:
    folder = tmp_path / "clips"
    folder.mkdir()
    for name in ("a.flac", "a.wav", "b.wav"):
        (folder / name).write_bytes(b"")
    (folder / "a.txt").write_text("hello", encoding="utf-8")
    (folder / "b.txt").write_text("bye", encoding="utf-8")
    with pytest.raises(UserError) as caught:
        read_corpora([folder], Defaults())
    assert str(caught.value) == (f"{folder / 'a.flac'} and a.wav share the transcript a.txt (and the id 'a'); "
                                 "keep one of them in the folder, or rename the other with its own transcript")


def test_a_folder_that_was_its_own_out_never_suggests_prepares_manifests(tmp_path, capsys) -> None:
    (tmp_path / "a.wav").write_bytes(b"")
    (tmp_path / "a.txt").write_text("hello", encoding="utf-8")
    (tmp_path / "b.wav").write_bytes(b"")  # no transcript
    for name in ("rejected.jsonl", "train.jsonl", "utterances.jsonl", SETTINGS_FILE):
        (tmp_path / name).write_text("")
    read_corpora([tmp_path], Defaults())
    assert capsys.readouterr().out == (f"warning: {tmp_path}: 1 of 2 audio files have no same-named .txt/.lab "
                                       f"transcript and are not part of the corpus, e.g. {tmp_path / 'b.wav'}\n")
    (tmp_path / SETTINGS_FILE).unlink()  # not prepare's folder: a train.jsonl beside clips may be the corpus
    read_corpora([tmp_path], Defaults())
    assert "is the corpus" in capsys.readouterr().out


@pytest.mark.parametrize(("flag", "defaults"), [("--language ''", {"language": ""}),
                                                ("--speaker ' '", {"speaker": " "}),
                                                ("--text-column ''", {"text_column": ""})])
def test_an_empty_speaker_language_or_text_column_is_refused(flag, defaults) -> None:
    with pytest.raises(UserError) as caught:
        Defaults(**defaults)
    assert str(caught.value).startswith(f"{flag}: empty; give a value (e.g. ")
    assert str(caught.value).endswith("or leave the flag out")


def test_a_clip_that_is_a_folder_fifo_or_device_is_named_as_such(tmp_path) -> None:
    os.mkfifo(tmp_path / "pipe.wav")
    (tmp_path / "dir.wav").mkdir()
    reasons = {name: audio_header(Utterance(name, str(path), "x", "s", None, "c:1"))
               for name, path in (("pipe", tmp_path / "pipe.wav"), ("dir", tmp_path / "dir.wav"),
                                  ("null", Path("/dev/null")), ("gone", tmp_path / "gone.wav"))}
    assert reasons == {"pipe": "audio: not a regular file, but a FIFO (named pipe); name an audio file",
                       "dir": "audio: not a regular file, but a folder; name an audio file",
                       "null": "audio: not a regular file, but a device; name an audio file",
                       "gone": "audio: file not found"}


def test_an_unreadable_dataset_row_has_the_same_reason_in_every_run(monkeypatch) -> None:
    """libsndfile named the row's in-memory bytes by their repr (`<_io.BytesIO object at 0x7f...>`): each
    run wrote another address into rejected.jsonl, so a rerun never gave the same bytes."""
    import io

    monkeypatch.setattr("indextts_train.prepare.clip_source.row_audio", lambda path, row: io.BytesIO(b"garbage"))
    utt = Utterance("d-1", "/data/train.parquet", "x", "s", None, "train.parquet#1", row=1)
    [reason] = {audio_header(utt) for _ in range(3)}  # one reason: the same bytes each time
    assert reason.startswith("audio: unreadable (Error opening (embedded bytes)") and "0x" not in reason


def test_prompt_seconds_takes_the_least_its_help_names() -> None:
    """--help says 0.1<=x; 0.1 itself was refused ("must be > 0.1"), contradicting it."""
    from indextts_train.prepare.pipeline import PrepareOptions

    options = PrepareOptions(corpora=[Path("c.jsonl")], model_dir=Path("m"), out=Path("o"), prompt_seconds=0.1)
    assert options.prompt_seconds == 0.1
    with pytest.raises(UserError, match=r"^--prompt-seconds 0\.09: must be >= 0\.1$"):
        PrepareOptions(corpora=[Path("c.jsonl")], model_dir=Path("m"), out=Path("o"), prompt_seconds=0.09)


def _kept_record(folder: OutputFolder, stem: str) -> dict:
    paths = {}
    for name in ("text_ids", "codes", "condition", "emo_vec"):
        folder.array_path(name, stem).parent.mkdir(parents=True, exist_ok=True)
        np.save(folder.array_path(name, stem), np.zeros(2, dtype=np.int32))
        paths[f"{name}_path"] = f"{name}/{stem}.npy"
    kept = {"id": stem, "audio": "a.wav", "text": "x", "speaker": "s", "language": None, "duration": 1.0,
            **paths, "text_len": 2, "code_len": 2}
    return {"id": stem, "source": "src", "kept": kept, "tokens": [0], "extended": 0}


def test_a_damaged_record_or_a_removed_array_is_computed_again(tmp_path) -> None:
    folder = OutputFolder(tmp_path / "out")
    record = _kept_record(folder, "a")
    folder.write_record("a", record)
    assert folder.read_record("a", "src") == record
    for damage in ({"tokens": None}, {"kept": {"id": "a"}}, {"extended": "2"},
                   {"kept": record["kept"] | {"codes_path": "../../etc/passwd"}}):
        folder.write_record("a", record | damage)
        assert not folder.has_record("a", "src"), damage
    folder.write_record("a", record)
    folder.array_path("codes", "a").unlink()
    assert not folder.has_record("a", "src")
    folder.write_record("a", {"id": "a", "source": "src", "rejected": "text: empty"})
    assert folder.has_record("a", "src")


def _prepared(out: Path) -> OutputFolder:
    folder = OutputFolder(out)
    folder.guard_settings({"models": {}}, restart=False)
    for stem in ("a", "b"):
        folder.claim([stem])
        record = _kept_record(folder, stem)
        folder.write_record(stem, record)
    folder.lock.release()
    return folder


def test_a_restart_stopped_half_way_leaves_a_folder_the_next_run_takes(tmp_path, monkeypatch) -> None:
    """--restart removed the ledger first: stopped right after (Ctrl+C, a kill), the arrays it had not
    removed yet were no listed stem's, and every later run refused the folder as holding the user's files."""
    files = len(list(_prepared(tmp_path / "count").root.rglob("*.*"))) - 1  # all but the settings file
    real_unlink = os.unlink
    for stop_after in range(files):
        out = tmp_path / f"out{stop_after}"
        _prepared(out)
        removed = []

        def unlink(path, *args, _removed=removed, _stop=stop_after, **kwargs):
            if len(_removed) == _stop:
                raise KeyboardInterrupt
            _removed.append(path)
            return real_unlink(path, *args, **kwargs)

        monkeypatch.setattr("indextts_train.prepare.ownership.os.unlink", unlink)
        with pytest.raises(KeyboardInterrupt):
            OutputFolder(out).guard_settings({"models": {}}, restart=True)
        monkeypatch.setattr("indextts_train.prepare.ownership.os.unlink", real_unlink)
        again = OutputFolder(out)
        again.guard_settings({"models": {}}, restart=True)  # refused before as "not written by prepare"
        again.lock.release()
        assert sorted(p.name for p in out.rglob("*")) == [SETTINGS_FILE], stop_after


def test_a_second_prepare_on_a_locked_out_is_refused(tmp_path) -> None:
    first, second = OutputFolder(tmp_path / "out"), OutputFolder(tmp_path / "out")
    first.guard_settings({"models": {}}, restart=False)  # makes the folder and takes its lock
    with pytest.raises(UserError) as caught:
        second.check_and_lock()
    assert str(caught.value).startswith(f"--out {tmp_path / 'out'}: another prepare")
    assert str(caught.value).endswith("wait for it to finish, or use another --out")  # this process: no kill hint
    first.lock.release()
    second.check_and_lock()
    second.lock.release()


# ---- slow: the real command ----


@pytest.fixture(scope="module")
def setup(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("round4")
    write_tiny_model_dir(root / "models", gpt_config=ROOT / "configs" / "tiny.yaml",
                         tokenizer=REF / "text" / "bpe_tiny.model", seed=1)
    write_synthetic_clips(root / "clips", [(TEXT, None)] * 8, speakers=2, seed=4, seconds=(0.6, 1.1))
    return root


def _env(**extra: str) -> dict[str, str]:
    return {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT), **extra}


def _command(root: Path, corpus_file: Path, out: str, *extra: str) -> list[str]:
    return [sys.executable, "-m", "indextts_train", "prepare", str(corpus_file), "--model-dir", str(root / "models"),
            "--out", str(root / out), "--device", "cpu", "--batch-seconds", "1", "--val-fraction", "0.3", *extra]


def _stopped(pid: int) -> bool:
    with open(f"/proc/{pid}/stat") as handle:
        return handle.read().rsplit(")", 1)[1].split()[0] == "T"


@pytest.mark.slow
def test_a_second_prepare_while_one_runs_is_refused_and_the_first_ends_whole(setup) -> None:
    corpus_file = setup / "clips" / "corpus.jsonl"
    whole = subprocess.run(_command(setup, corpus_file, "whole"), env=_env(), cwd=ROOT, capture_output=True,
                           timeout=600)
    assert whole.returncode == 0, whole.stderr[-2000:]
    first = subprocess.Popen(_command(setup, corpus_file, "busy"), env=_env(INDEXTTS_TRAIN_PAUSE_AT="prepare_batch@1"),
                             cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 300
    while first.poll() is None and not _stopped(first.pid) and time.monotonic() < deadline:
        time.sleep(0.05)  # the first batch written, its process stopped (faults.py)
    try:
        second = subprocess.run(_command(setup, corpus_file, "busy", "--restart"), env=_env(), cwd=ROOT,
                                capture_output=True, text=True, timeout=600)
    finally:
        if first.poll() is None:
            first.send_signal(signal.SIGCONT)
    _, err = first.communicate(timeout=600)
    assert second.returncode == 2, second.stdout[-2000:]
    assert second.stderr == (f"error: --out {setup / 'busy'}: another prepare (PID {first.pid}) is writing there "
                             f"now; wait for it to finish, stop it (kill {first.pid}), or use another --out\n")
    assert first.returncode == 0, err[-3000:]
    for name in MANIFESTS:
        assert (setup / "busy" / name).read_bytes() == (setup / "whole" / name).read_bytes(), name


@pytest.mark.slow
def test_prepares_own_manifest_of_segments_prepared_again_keeps_the_segments(setup) -> None:
    """utterances.jsonl names a lhotse segment by `offset` and `duration`: as a corpus again (another
    --tokenizer, another folder) each line is still its segment, never the whole recording."""
    lines = [json.loads(line) for line in (setup / "clips" / "corpus.jsonl").read_text().splitlines()]
    halves = [line | {"id": f"{line['id']}-{part}", "audio": str(setup / "clips" / line["audio"]),
                      "offset": 0.3 * part, "duration": 0.3} for line in lines for part in (0, 1)]
    segments = _jsonl(setup / "segments.jsonl", halves)
    first = subprocess.run(_command(setup, segments, "segments", "--min-seconds", "0.2"), env=_env(), cwd=ROOT,
                           capture_output=True, text=True, timeout=600)
    assert first.returncode == 0, first.stderr[-2000:]
    again = subprocess.run(_command(setup, setup / "segments" / "utterances.jsonl", "again", "--min-seconds", "0.2"),
                           env=_env(), cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert again.returncode == 0, again.stderr[-2000:]
    kept = [json.loads(line) for line in (setup / "again" / "utterances.jsonl").read_text().splitlines()]
    assert len(kept) == len(halves) and all(line["offset"] in (0.0, 0.3) for line in kept)
    for line in kept:
        assert np.array_equal(np.load(setup / "again" / line["codes_path"]),
                              np.load(setup / "segments" / line["codes_path"])), line["id"]


@pytest.mark.slow
def test_a_float_clip_of_absurd_samples_is_rejected_not_stored_as_nan(setup) -> None:
    """A float WAV whose samples are finite but 1e37 (another sample format read as float, a damaged file)
    overflowed inside the models: its NaN condition and emo_vec were kept, and the run said exit 0."""
    import soundfile

    lines = [json.loads(line) for line in (setup / "clips" / "corpus.jsonl").read_text().splitlines()]
    wave, rate = soundfile.read(setup / "clips" / lines[0]["audio"], dtype="float32")
    soundfile.write(setup / "clips" / "loud.wav", wave / np.abs(wave).max() * np.float32(1e37), rate, subtype="FLOAT")
    loud = _jsonl(setup / "clips" / "loud.jsonl", [*lines[:4], {"id": "loud", "audio": "loud.wav", "text": TEXT,
                                                                "speaker": lines[0]["speaker"]}])
    result = subprocess.run(_command(setup, loud, "loud"), env=_env(), cwd=ROOT, capture_output=True, text=True,
                            timeout=600)
    assert result.returncode == 1, result.stderr[-2000:]
    [rejected] = [json.loads(line) for line in (setup / "loud" / "rejected.jsonl").read_text().splitlines()]
    assert rejected["id"] == "loud"
    assert rejected["reason"].startswith("audio: NaN or infinite codes, condition, emo_vec from samples peaking "
                                         "at 1e+37")
    for line in map(json.loads, (setup / "loud" / "utterances.jsonl").read_text().splitlines()):
        for key in ("condition_path", "emo_vec_path"):
            assert np.isfinite(np.load(setup / "loud" / line[key])).all()


@pytest.mark.slow
@pytest.mark.parametrize(("signum", "name", "code"), [(signal.SIGINT, "Ctrl+C", 130), (signal.SIGTERM, "SIGTERM", 143),
                                                      (signal.SIGHUP, "SIGHUP", 129)])
def test_a_stop_signal_says_the_finished_work_is_kept_and_the_rerun_ends_whole(setup, signum, name, code) -> None:
    """Ctrl+C was "interrupted (Ctrl+C)", which said neither what was kept nor what to do; SIGTERM (a preempted
    machine) and SIGHUP (a closed terminal) ended it without a word (-15, -1)."""
    corpus_file = setup / "clips" / "corpus.jsonl"
    out = f"stopped_{name}"
    if not (setup / "whole" / "prepare.json").is_file():
        assert subprocess.run(_command(setup, corpus_file, "whole"), env=_env(), cwd=ROOT, timeout=600).returncode == 0
    # SIGINT as a terminal's foreground job has it: a suite started in the background (`... &` in a script)
    # passes it on ignored, and Python then never raises KeyboardInterrupt
    run = subprocess.Popen(_command(setup, corpus_file, out), env=_env(INDEXTTS_TRAIN_PAUSE_AT="prepare_batch@2"),
                           cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                           preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    deadline = time.monotonic() + 300
    while run.poll() is None and not _stopped(run.pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    run.send_signal(signum)  # delivered when it goes on
    run.send_signal(signal.SIGCONT)
    _, err = run.communicate(timeout=600)
    assert (run.returncode, err) == (code, f"prepare: interrupted ({name}); the finished utterances in "
                                           f"{setup / out} are kept: rerun the same command to go on\n")
    again = subprocess.run(_command(setup, corpus_file, out), env=_env(), cwd=ROOT, capture_output=True,
                           text=True, timeout=600)
    assert again.returncode == 0 and "clips complete from an earlier run, skipped" in again.stderr, again.stderr
    for manifest in MANIFESTS:
        assert (setup / out / manifest).read_bytes() == (setup / "whole" / manifest).read_bytes(), manifest
