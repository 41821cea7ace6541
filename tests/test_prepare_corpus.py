"""Corpus readers: each form, defaults, duplicate ids refused naming both lines, bounded reads."""

from __future__ import annotations

import json
import os

import pytest

from indextts_train.errors import UserError
from indextts_train.prepare import corpus
from indextts_train.prepare.corpus import Defaults, read_corpora


def _jsonl(path, lines) -> None:
    path.write_text("".join(json.dumps(line, ensure_ascii=False) + "\n" for line in lines), encoding="utf-8")


def test_jsonl_paths_relative_to_the_file_and_defaults(tmp_path) -> None:
    (tmp_path / "sub").mkdir()
    _jsonl(tmp_path / "sub" / "am.jsonl", [{"audio": "clips/a.wav", "text": "ሰላም", "id": "x1", "speaker": "s1"},
                                           {"audio": "clips/b.wav", "text": "ደህና"}])
    utts = read_corpora([tmp_path / "sub" / "am.jsonl"], Defaults(language="am"))
    assert [u.id for u in utts] == ["x1", "b"]
    assert utts[0].audio == os.path.abspath(tmp_path / "sub" / "clips" / "a.wav")
    assert [u.speaker for u in utts] == ["s1", "am"]  # no speaker, no --speaker: the file's stem
    assert [u.language for u in utts] == ["am", "am"]
    assert read_corpora([tmp_path / "sub" / "am.jsonl"], Defaults(speaker="S"))[1].speaker == "S"


def test_ljspeech_common_voice_and_folder_forms(tmp_path, capsys) -> None:
    lj = tmp_path / "LJ"
    lj.mkdir()
    (lj / "metadata.csv").write_text("LJ001|Hello 1|Hello one\nLJ002|Bye|\n", encoding="utf-8")
    cv = tmp_path / "cv"
    cv.mkdir()
    (cv / "train.tsv").write_text("client_id\tpath\tsentence\tlocale\nabc\tc1.mp3\tSelam\tam\n", encoding="utf-8")
    folder = tmp_path / "folder" / "spkA"
    folder.mkdir(parents=True)
    (folder / "u1.wav").write_bytes(b"")
    (folder / "u1.lab").write_text("Hi there\n", encoding="utf-8")
    (folder / "u2.wav").write_bytes(b"")  # no transcript: not part of the corpus
    utts = read_corpora([lj, cv / "train.tsv", tmp_path / "folder"], Defaults())
    assert [(u.id, u.text, u.speaker, u.language) for u in utts] == [
        ("LJ001", "Hello one", "LJ", None), ("LJ002", "Bye", "LJ", None),
        ("c1", "Selam", "abc", "am"), ("spkA/u1", "Hi there", "spkA", None)]
    assert utts[0].audio == os.path.abspath(lj / "wavs" / "LJ001.wav")
    assert utts[2].audio == os.path.abspath(cv / "clips" / "c1.mp3")
    assert capsys.readouterr().out == (
        f"warning: {tmp_path / 'folder'}: 1 of 2 audio files have no same-named .txt/.lab transcript and are not "
        f"part of the corpus, e.g. {folder / 'u2.wav'}\n")


def test_a_folder_of_audio_without_transcripts_names_the_manifest_beside_it(tmp_path) -> None:
    """The demo's clips folder: wav files and the corpus.jsonl that names them, no .txt beside any clip."""
    (tmp_path / "clips").mkdir()
    for name in ("a.wav", "b.wav"):
        (tmp_path / "clips" / name).write_bytes(b"")
    (tmp_path / "clips" / "corpus.jsonl").write_text('{"audio": "a.wav", "text": "x"}\n', encoding="utf-8")
    with pytest.raises(UserError) as caught:
        read_corpora([tmp_path / "clips"], Defaults())
    assert str(caught.value) == (f"{tmp_path / 'clips'}: 2 audio files, none with a same-named .txt or .lab "
                                 f"transcript beside it (e.g. {tmp_path / 'clips' / 'a.txt'}); is the corpus "
                                 f"{tmp_path / 'clips' / 'corpus.jsonl'}? pass that file instead")


def test_duplicate_ids_refused_naming_both_lines(tmp_path) -> None:
    _jsonl(tmp_path / "a.jsonl", [{"audio": "1.wav", "text": "a", "id": "same"}])
    _jsonl(tmp_path / "b.jsonl", [{"audio": "x.wav", "text": "b"}, {"audio": "2.wav", "text": "b", "id": "same"}])
    with pytest.raises(UserError, match=r"b\.jsonl:2: id 'same' is also at .*a\.jsonl:1"):
        read_corpora([tmp_path / "a.jsonl", tmp_path / "b.jsonl"], Defaults())


@pytest.mark.parametrize(("content", "message"), [
    ('{"audio": "a.wav"}\n', r"x\.jsonl:1: field 'text'"),
    ("not json\n", r"x\.jsonl:1: not JSON"),
    ('{"audio": "", "text": "t"}\n', r"field 'audio' must be a non-empty string"),
])
def test_bad_jsonl_lines_name_the_line(tmp_path, content, message) -> None:
    (tmp_path / "x.jsonl").write_text(content, encoding="utf-8")
    with pytest.raises(UserError, match=message):
        read_corpora([tmp_path / "x.jsonl"], Defaults())


def test_reads_are_bounded(tmp_path, monkeypatch) -> None:
    monkeypatch.setattr(corpus, "MAX_LINE_BYTES", 64)
    (tmp_path / "x.jsonl").write_bytes(b'{"audio": "a.wav", "text": "' + b"a" * 100 + b'"}\n')
    with pytest.raises(UserError, match=r"x\.jsonl:1: line longer than 64 bytes"):
        read_corpora([tmp_path / "x.jsonl"], Defaults())


def test_unknown_forms_and_missing_libraries_say_what_to_do(tmp_path) -> None:
    (tmp_path / "a.txt").write_text("x", encoding="utf-8")
    with pytest.raises(UserError, match="not a corpus form"):
        read_corpora([tmp_path / "a.txt"], Defaults())
    with pytest.raises(UserError, match="corpus not found"):
        read_corpora([tmp_path / "nope.jsonl"], Defaults())
    (tmp_path / "cuts.jsonl.gz").write_bytes(b"")
    with pytest.raises(UserError, match="lhotse"):
        read_corpora([tmp_path / "cuts.jsonl.gz"], Defaults())


def test_a_folder_transcript_saved_with_a_bom_is_read_without_it(tmp_path) -> None:
    """Windows Notepad starts a UTF-8 file with EF BB BF: the BOM became text ('\\ufeffThe cat sat.')."""
    (tmp_path / "folder" / "spkA").mkdir(parents=True)
    (tmp_path / "folder" / "spkA" / "x0.wav").write_bytes(b"")
    (tmp_path / "folder" / "spkA" / "x0.txt").write_bytes(b"\xef\xbb\xbfThe cat sat.\r\n")
    [utt] = read_corpora([tmp_path / "folder"], Defaults())
    assert utt.text == "The cat sat."


def _speaker_folders(root) -> None:
    for name in ("spkA/a1", "spkA/a2", "spkB/b1", "loose"):
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / f"{name}.wav").write_bytes(b"")
        (root / f"{name}.txt").write_text("Hello", encoding="utf-8")


def test_speaker_fills_only_the_folder_clips_no_sub_folder_names(tmp_path) -> None:
    """--speaker turned every clip of spkA/ and spkB/ into one speaker; it is for what the layout lacks:
    a clip directly in the corpus folder (else named after that folder)."""
    _speaker_folders(tmp_path / "corpus")
    speakers = {u.id: u.speaker for u in read_corpora([tmp_path / "corpus"], Defaults(speaker="bob"))}
    assert speakers == {"loose": "bob", "spkA/a1": "spkA", "spkA/a2": "spkA", "spkB/b1": "spkB"}
    assert read_corpora([tmp_path / "corpus"], Defaults())[0].speaker == "corpus"  # "loose", sorted first


def test_speaker_or_language_that_would_change_nothing_is_refused(tmp_path) -> None:
    """Every utterance names its own speaker (or language): the flag is a mistake, said in one line."""
    _speaker_folders(tmp_path / "corpus")
    (tmp_path / "corpus" / "loose.wav").unlink()
    with pytest.raises(UserError) as caught:
        read_corpora([tmp_path / "corpus"], Defaults(speaker="bob"))
    assert str(caught.value) == ("--speaker bob: every CORPUS names its speakers (each line or clip has its own): "
                                 "the flag would change nothing; leave it out")
    _jsonl(tmp_path / "named.jsonl", [{"audio": "a.wav", "text": "a", "speaker": "s", "language": "am"}])
    with pytest.raises(UserError, match=r"^--language en: every CORPUS names its languages \(each"):
        read_corpora([tmp_path / "named.jsonl"], Defaults(language="en"))
    with pytest.raises(UserError, match=r"^--speaker x: every CORPUS names its speakers"):
        read_corpora([tmp_path / "named.jsonl"], Defaults(speaker="x", language="en"))  # speaker said first
    # one source that lacks it is enough: the flag fills it in, the named ones keep theirs
    _jsonl(tmp_path / "some.jsonl", [{"audio": "b.wav", "text": "b", "language": ""}])
    utts = read_corpora([tmp_path / "named.jsonl", tmp_path / "some.jsonl"], Defaults(speaker="x", language="en"))
    assert [(u.speaker, u.language) for u in utts] == [("s", "am"), ("x", "en")]
    assert [u.speaker for u in read_corpora([tmp_path / "corpus", tmp_path / "some.jsonl"],
                                            Defaults(speaker="x"))] == ["spkA", "spkA", "spkB", "x"]
