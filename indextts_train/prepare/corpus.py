"""Corpus readers: every form a user keeps clips and transcripts in, read into one list of `Utterance`.

Forms (several may be mixed in one run):
- JSONL: one `{"audio", "text", "speaker"?, "language"?, "id"?}` object a line, audio relative to the file;
- LJSpeech: `metadata.csv` (`id|text|normalized`), clips in `wavs/<id>.wav`;
- Common Voice: a `*.tsv` with `path`, `sentence`, `client_id`, `locale`, clips in `clips/`;
- a folder of audio files with same-named `.txt` / `.lab` transcripts (speaker = the parent folder);
- lhotse manifests (corpus_lhotse.py) and Hugging Face `datasets` (corpus_hf.py), where those libraries
  are installed.

Every read is bounded (line length, transcript size, file count) so a wrong path (a binary file, a
disk root) ends in one clear line instead of a hang. Ids must be unique across all corpora: a
duplicate is refused before any work, naming both lines.
"""

from __future__ import annotations

import importlib.util
import json
import os
from collections.abc import Iterator
from pathlib import Path

from indextts_train.data.corpus_forms import AUDIO_SUFFIXES, TRANSCRIPT_SUFFIXES
from indextts_train.errors import UserError
from indextts_train.files.bounded import check_regular, open_regular, parse_json, read_bounded
from indextts_train.prepare.corpus_hf import is_hf_corpus, read_hf_corpus
from indextts_train.prepare.corpus_lhotse import is_lhotse_corpus, read_lhotse
from indextts_train.prepare.outputs import MANIFESTS, SETTINGS_FILE
from indextts_train.prepare.utterance import DEFAULT_SPEAKER, Defaults, Utterance, lacking

MAX_LINE_BYTES = 1 << 20  # a transcript line longer than 1 MiB is not a transcript
MAX_TRANSCRIPT_BYTES = 1 << 20
MAX_FOLDERS = 1_000_000  # a folder corpus walk stops here (a disk root passed by mistake)


def read_corpora(paths: list[Path], defaults: Defaults) -> list[Utterance]:
    """Every utterance of every corpus, in the order given; duplicate ids refused naming both lines."""
    if not paths:
        raise UserError("prepare: no CORPUS given; pass a JSONL file, metadata.csv, a Common Voice .tsv or a folder")
    if defaults.text_column is not None and not any(is_hf_corpus(Path(path)) for path in paths):
        raise UserError(f"--text-column {defaults.text_column} names a column of a Hugging Face dataset, and no CORPUS "
                        "is one: the flag would change nothing (the other forms name their text themselves); leave "
                        "it out")
    _refuse_repeats([Path(path) for path in paths])
    utterances: list[Utterance] = []
    seen: dict[str, tuple[str, Path]] = {}  # id -> (where, the CORPUS argument it came from)
    for path in paths:
        for utt in read_corpus(Path(path), defaults):
            if utt.id in seen:
                _refuse_duplicate(utt, *seen[utt.id], Path(path))
            seen[utt.id] = (utt.where, Path(path))
            utterances.append(utt)
    if not utterances:
        raise UserError(f"{', '.join(map(str, paths))}: no utterances found; check the corpus paths")
    _refuse_unused_defaults(utterances, defaults)
    return utterances


def _refuse_duplicate(utt: Utterance, first_where: str, first_corpus: Path, corpus: Path) -> None:
    if first_where == utt.where:  # one line read twice: two CORPUS arguments reach the same manifest
        raise UserError(f"{utt.where}: read through CORPUS {first_corpus} and again through {corpus}; pass only "
                        "one of them (for lhotse: the recordings, the supervisions manifest or their folder)")
    raise UserError(f"{utt.where}: id {utt.id!r} is also at {first_where}; ids must be unique across the corpora "
                    "(give one of them another id)")


def _refuse_repeats(paths: list[Path]) -> None:
    """The same corpus twice (a shell glob that also matches it, a link to it): every id of it would be a
    duplicate, and "give one of them another id" the wrong advice."""
    first: dict[str, Path] = {}
    for path in paths:
        real = os.path.realpath(path)
        if real in first:
            same = "" if str(first[real]) == str(path) else f" (the same file as {first[real]})"
            raise UserError(f"CORPUS {path}: given twice{same}; pass each corpus once")
        first[real] = path


def _refuse_unused_defaults(utterances: list[Utterance], defaults: Defaults) -> None:
    """--speaker / --language only fill in what a source lacks: when every utterance read names its own,
    the flag would change nothing (a script written for another corpus, or a hope that it overrides),
    so it is refused rather than ignored. Known from the corpus alone, before any model or audio."""
    for flag, name, value in (("--speaker", "speaker", defaults.speaker),
                              ("--language", "language", defaults.language)):
        if value is not None and not any(name in utt.lacks for utt in utterances):
            raise UserError(f"{flag} {value}: every CORPUS names its {name}s (each line or clip has its own): "
                            "the flag would change nothing; leave it out")


def read_corpus(path: Path, defaults: Defaults) -> list[Utterance]:
    """One CORPUS argument, its form told by its name (and a .jsonl's first line: ours or a lhotse one)."""
    if not path.exists():
        raise UserError(f"{path}: corpus not found; pass a JSONL file, metadata.csv, a Common Voice .tsv or a folder")
    if not path.is_dir():
        check_regular(path, "corpus")  # before any reader opens it: a FIFO would block, /proc files lie
    name = path.name.lower()
    if is_lhotse_corpus(path):
        _need(path, "lhotse")
        return read_lhotse(path, defaults.speaker, defaults.language)
    if is_hf_corpus(path):
        _need(path, "datasets")
        return read_hf_corpus(path, defaults)
    if path.is_dir():
        if (path / "metadata.csv").is_file():
            return read_ljspeech(path / "metadata.csv", defaults)
        return read_folder(path, defaults)
    if name.endswith((".jsonl", ".json")):
        return read_jsonl(path, defaults)
    if name.endswith(".csv"):
        return read_ljspeech(path, defaults)
    if name.endswith(".tsv"):
        return read_common_voice(path, defaults)
    raise UserError(f"{path}: not a corpus form this command reads (.jsonl, metadata.csv, a Common Voice .tsv, "
                    "a folder of audio with .txt/.lab transcripts, lhotse manifests, a Hugging Face dataset)")


def _need(path: Path, library: str) -> None:
    """lhotse / datasets corpora: only where the library is installed; say so clearly when it is not."""
    if importlib.util.find_spec(library) is None:
        raise UserError(f"{path}: a {library} corpus, but {library} is not installed; "
                        f"`pip install 'indextts-train[corpora]'` (or `pip install {library}`), "
                        "or export the corpus as JSONL ({\"audio\", \"text\", \"speaker\"} lines)")


def bounded_lines(path: Path) -> Iterator[tuple[int, str]]:
    """(line number from 1, decoded line without its newline) of every non-blank line; long lines refused."""
    with open_regular(path, "corpus") as handle:  # a FIFO would block the read: one line instead
        line_no = 0
        while True:
            raw = handle.readline(MAX_LINE_BYTES + 1)
            if not raw:
                return
            line_no += 1
            if len(raw) > MAX_LINE_BYTES:
                raise UserError(f"{path}:{line_no}: line longer than {MAX_LINE_BYTES} bytes; is this a corpus file?")
            try:
                text = raw.decode("utf-8").rstrip("\r\n")
            except UnicodeDecodeError:
                raise UserError(f"{path}:{line_no}: not UTF-8 text; save the file as UTF-8") from None
            if text.strip():
                yield line_no, text.lstrip("\ufeff") if line_no == 1 else text


def _absolute(base: Path, audio: str) -> str:
    return os.path.abspath(os.path.join(base, audio))


# What other manifests (NeMo, ESPnet, Common Voice exports, ...) call the two fields a line must have.
_ALIASES = {"audio": ("audio_filepath", "audio_path", "wav", "path", "file", "filename", "wav_path"),
            "text": ("transcript", "sentence", "transcription", "normalized_text", "txt")}


def _string_field(obj: dict, key: str, where: str, *, required: bool) -> str | None:
    value = obj.get(key)
    if value is None and not required:
        return None
    if key not in obj and key in _ALIASES:  # another tool's manifest: say which of its keys to rename
        alias = next((name for name in _ALIASES[key] if name in obj), None)
        hint = f"rename {alias!r} to {key!r}" if alias else f"the line has {', '.join(map(repr, list(obj)[:6]))}"
        raise UserError(f"{where}: field {key!r} is missing ({hint}); each line is one {{\"audio\", \"text\"}} object")
    if not isinstance(value, str) or (required and key != "text" and not value.strip()):
        raise UserError(f"{where}: field {key!r} must be a non-empty string, got {value!r}")
    return value


def read_jsonl(path: Path, defaults: Defaults) -> list[Utterance]:
    """`{"audio", "text", "speaker"?, "language"?, "id"?}` lines; speaker: the field, --speaker, else the stem."""
    out = []
    for line_no, text in bounded_lines(path):
        where = f"{path}:{line_no}"
        try:
            obj = parse_json(text, where)  # nesting bounded: one line naming the line
        except json.JSONDecodeError as exc:
            raise UserError(f"{where}: not JSON ({exc.msg}){_array_hint(text)}; each line is one "
                            "{\"audio\", \"text\"} object") from None
        if not isinstance(obj, dict):
            raise UserError(f"{where}: expected a JSON object with \"audio\" and \"text\"{_array_hint(text)}")
        audio = _string_field(obj, "audio", where, required=True)
        speaker = _string_field(obj, "speaker", where, required=False)
        language = _string_field(obj, "language", where, required=False)
        uid = _string_field(obj, "id", where, required=False) or Path(audio).stem
        offset, duration = _segment(obj, where)
        out.append(Utterance(uid, _absolute(path.parent, audio), _string_field(obj, "text", where, required=True),
                             speaker or defaults.speaker or path.stem, language or defaults.language, where,
                             offset=offset, duration=duration, lacks=lacking(speaker=speaker, language=language)))
    return out


def _segment(obj: dict, where: str) -> tuple[float, float | None]:
    """(offset, duration) of a line that names a segment of its file by `offset` (seconds), as prepare's own
    manifests name a lhotse segment; read without it, the line would silently take the whole recording.
    Without `offset`, a `duration` is only what many manifests note about the whole file: not read."""
    if "offset" not in obj:
        return 0.0, None
    values = [obj["offset"], obj.get("duration")]
    for key, value in zip(("offset", "duration"), values, strict=True):
        if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float))):
            raise UserError(f"{where}: field {key!r} must be a number of seconds, got {value!r}")
    return float(values[0]), None if values[1] is None else float(values[1])


def _array_hint(line: str) -> str:
    """A .json holding one JSON array (pretty-printed or not) is not JSON Lines: say so."""
    return ": the file looks like one JSON array; write each object on a line of its own (JSONL)" \
        if line.lstrip().startswith("[") else ""


def read_ljspeech(path: Path, defaults: Defaults) -> list[Utterance]:
    """`id|text|normalized` lines (the normalised column is used when present); clips in wavs/<id>.wav."""
    speaker = defaults.speaker or path.parent.name or DEFAULT_SPEAKER
    out = []
    for line_no, text in bounded_lines(path):
        fields = text.split("|")
        if len(fields) < 2 or not fields[0].strip():
            table = ("; a table of other columns (audio,text) is not read as .csv: write it as JSONL "
                     "({\"audio\", \"text\"} lines)") if "," in text or "\t" in text else ""
            raise UserError(f"{path}:{line_no}: expected `id|text|normalized text` (LJSpeech metadata.csv){table}")
        transcript = fields[2] if len(fields) > 2 and fields[2].strip() else fields[1]
        uid = fields[0].strip()
        out.append(Utterance(uid, _absolute(path.parent / "wavs", f"{uid}.wav"), transcript, speaker,
                             defaults.language, f"{path}:{line_no}", lacks=lacking(speaker=None, language=None)))
    return out


def read_common_voice(path: Path, defaults: Defaults) -> list[Utterance]:
    """A Common Voice split (`path`, `sentence`, `client_id`, `locale` columns); clips in clips/."""
    lines = bounded_lines(path)
    header = next(lines, None)
    if header is None:
        raise UserError(f"{path}: empty .tsv; a Common Voice split starts with a header line")
    # Fields are what lies between tabs (Common Voice quotes nothing): a plain split, since the csv module
    # stops with its own traceback on a field past 128 KiB or a lone carriage return inside a line.
    columns = header[1].split("\t")
    missing = [c for c in ("path", "sentence") if c not in columns]
    if missing:
        raise UserError(f"{path}:1: header lacks {', '.join(missing)}; a Common Voice .tsv has path and sentence")
    out = []
    for line_no, text in lines:
        row = dict(zip(columns, text.split("\t"), strict=False))
        clip = row.get("path", "")
        if not clip:
            raise UserError(f"{path}:{line_no}: no `path` value; every row names its clip")
        speaker, language = row.get("client_id"), row.get("locale")
        out.append(Utterance(Path(clip).stem, _absolute(path.parent / "clips", clip), row.get("sentence", ""),
                             speaker or defaults.speaker or DEFAULT_SPEAKER, language or defaults.language,
                             f"{path}:{line_no}", lacks=lacking(speaker=speaker, language=language)))
    return out


def _read_transcript(path: Path) -> str:
    data = read_bounded(path, MAX_TRANSCRIPT_BYTES, "transcript")  # a FIFO swapped in since it was listed: one line
    try:  # utf-8-sig: Windows Notepad starts a file with a BOM, which would become text tokens
        return data.decode("utf-8-sig").strip()
    except UnicodeDecodeError:
        raise UserError(f"{path}: not UTF-8 text; save the transcript as UTF-8") from None


def read_folder(root: Path, defaults: Defaults) -> list[Utterance]:
    """Audio files with a same-named .txt/.lab beside them, sorted by path; id = path below the folder."""
    found = []
    for count, (folder, dirs, files) in enumerate(os.walk(root)):
        dirs.sort()
        if count > MAX_FOLDERS:
            raise UserError(f"{root}: more than {MAX_FOLDERS} folders; pass the corpus folder itself")
        found.extend(Path(folder) / name for name in sorted(files) if name.lower().endswith(AUDIO_SUFFIXES))
    out, untranscribed, clips = [], [], {}
    for audio in found:
        transcript = next((audio.with_suffix(s) for s in TRANSCRIPT_SUFFIXES if audio.with_suffix(s).is_file()), None)
        if transcript is None:
            untranscribed.append(audio)
            continue
        uid = audio.relative_to(root).with_suffix("").as_posix()
        if uid in clips:  # a.wav and a.flac: one transcript, one id; which clip it speaks is not ours to guess
            raise UserError(f"{clips[uid]} and {audio.name} share the transcript {transcript.name} (and the id "
                            f"{uid!r}); keep one of them in the folder, or rename the other with its own transcript")
        clips[uid] = audio
        # A sub-folder names its clips' speaker (spkA/0001.wav); --speaker must not merge those speakers
        # into one. A clip directly in the folder has no such name: --speaker, else the folder's name.
        folder = audio.parent.name if audio.parent != root else None
        out.append(Utterance(uid, os.path.abspath(audio), _read_transcript(transcript),
                             folder or defaults.speaker or root.name or DEFAULT_SPEAKER, defaults.language,
                             str(transcript), lacks=lacking(speaker=folder, language=None)))
    _say_untranscribed(root, untranscribed, kept=len(out))
    return out


def _say_untranscribed(root: Path, audio: list[Path], kept: int) -> None:
    """Audio without a same-named transcript is not part of a folder corpus: said, never silently left out."""
    if not audio:
        return
    ours = set(MANIFESTS) if (root / SETTINGS_FILE).is_file() else set()  # --out was this folder: not a corpus
    manifests = sorted(p.name for p in root.iterdir()
                       if p.is_file() and p.suffix.lower() in (".jsonl", ".csv", ".tsv") and p.name not in ours)
    hint = f"; is the corpus {root / manifests[0]}? pass that file instead" if manifests else ""
    if not kept:
        raise UserError(f"{root}: {len(audio)} audio files, none with a same-named .txt or .lab transcript beside it "
                        f"(e.g. {audio[0].with_suffix('.txt')}){hint}")
    print(f"warning: {root}: {len(audio)} of {len(audio) + kept} audio files have no same-named .txt/.lab transcript "
          f"and are not part of the corpus, e.g. {audio[0]}{hint}")
