"""The lines a checkpoint speaks: from `--lines FILE.jsonl`, or a fixed seeded choice from the run's
validation manifests.

`--lines`: one object a line, `text` and `prompt_audio` (required), `language`, `reference_audio`
and `id` (optional); paths relative to the file's folder. Every line is checked before any work:
one message naming the file, the line and the key.

Default: the run's `run.yaml` names its validation manifests; from each, the paired lines that
prepare wrote (`prompt_audio_path`, `target_text`, `target_audio_path`) are ranked by a hash of
(seed, id) and the first LINES_PER_LANGUAGE of each language are taken, so the choice is the same
on every rerun and does not depend on the manifest's order. The real target audio is the reference.
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass
from pathlib import Path

from indextts_train.data.sampling import parse_manifest_spec
from indextts_train.errors import UserError
from indextts_train.files.bounded import iter_lines, kind_of_path, parse_json
from indextts_train.listen.choose import run_inputs
from indextts_train.listen.text_score import normalise
from indextts_train.prepare.audio import MAX_LOAD_SECONDS
from indextts_train.prepare.outputs import file_stem
from indextts_train.ui.run_record import RECORD_NAME

LINES_PER_LANGUAGE = 4
MAX_LINES = 1000  # a listening set, not a corpus: each line is synthesized for every checkpoint
MAX_LINES_FILE_BYTES = 16 << 20
MAX_TEXT_CHARS = 1000
MAX_MANIFEST_LINES = 1_000_000  # lines read from one validation manifest when choosing


@dataclass(frozen=True)
class Line:
    """One line to speak and what to score it against."""

    line_id: str
    text: str
    prompt_audio: Path
    language: str | None = None
    reference_audio: Path | None = None

    def record(self) -> dict:
        return {"line_id": self.line_id, "text": self.text, "prompt_audio": str(self.prompt_audio),
                "language": self.language,
                "reference_audio": str(self.reference_audio) if self.reference_audio else None}


def _string(obj: dict, key: str, where: str, *, required: bool) -> str | None:
    value = obj.get(key)
    if value is None and not required:
        return None
    if not isinstance(value, str) or not value.strip():
        raise UserError(f"{where}: key {key!r} must be a non-empty string; add it (lines need "
                        "'text' and 'prompt_audio')")
    if not _is_unicode(value):  # each value goes into scores.jsonl as UTF-8, after the line was synthesized
        raise UserError(f"{where}: key {key!r} holds a lone surrogate (a \\ud800-style escape with no pair), which is "
                        "no text; write the character itself")
    return value


def _is_unicode(text: str) -> bool:
    """Whether `text` encodes as UTF-8: JSON's "\\ud800" decodes to a lone surrogate, which does not (the record
    of a line whose text, id or language held one ended listen in a traceback once its WAV was made)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _audio(obj: dict, key: str, base: Path, where: str, *, required: bool) -> Path | None:
    value = _string(obj, key, where, required=required)
    if value is None:
        return None
    path = (base / value).expanduser()
    if not path.is_file():  # a FIFO, a folder or /dev/zero is there, and "not found" sent the user looking
        what = f"is {kind_of_path(path)}, not an audio file" if os.path.lexists(path) else "not found"
        raise UserError(f"{where}: {key} {path} {what}; fix the path (relative paths are taken from the "
                        "lines file's folder)")
    return path


def check_audio(lines: list[Line], lines_file: Path | None) -> None:
    """Each line's clips read as audio (their headers), before any work: a prompt that is no audio (or an
    empty or hour-long one, which scoring refuses) failed each line only after every checkpoint's export
    and synthesis."""
    for line in lines:
        where = f"--lines {lines_file}" if lines_file else "the run's validation lines"
        for key, path in (("prompt_audio", line.prompt_audio), ("reference_audio", line.reference_audio)):
            if path is not None:
                _check_audio(path, key, f"{where}: line {line.line_id!r}")


def _check_audio(path: Path, key: str, where: str) -> None:
    import soundfile

    try:
        info = soundfile.info(str(path))
    except Exception as exc:  # soundfile raises LibsndfileError, RuntimeError, TypeError, ...
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        raise UserError(f"{where}: {key} {path} is no audio file this reads ({first[:200]}); give a WAV, FLAC or "
                        "OGG clip") from None
    seconds = info.frames / info.samplerate if info.samplerate else 0.0
    if not 0 < seconds <= MAX_LOAD_SECONDS:
        raise UserError(f"{where}: {key} {path} holds {seconds:.1f} s of audio; give a clip of a few seconds "
                        f"(at most {MAX_LOAD_SECONDS:g} s)")


# Lines of the two other JSONL files a run has at hand, given as --lines: what each is, and what to do.
_OTHER_LINES = (("target_text", "a manifest line (target_text, prompt_audio_path); leave --lines out to hear lines "
                                "the run's validation manifests hold, or write {'text', 'prompt_audio'} lines"),
                ("audio", "a corpus line (audio, text); a line to hear names the voice to speak in as "
                          "'prompt_audio': rename 'audio' to it"))


def _line(obj: object, base: Path, where: str, number: int) -> Line:
    if not isinstance(obj, dict):
        raise UserError(f"{where}: expected a JSON object with 'text' and 'prompt_audio'")
    other = next((what for key, what in _OTHER_LINES if key in obj and "prompt_audio" not in obj), None)
    if other is not None:
        raise UserError(f"{where}: {other}")
    text = _string(obj, "text", where, required=True)
    if not normalise(text) or len(text) > MAX_TEXT_CHARS:
        raise UserError(f"{where}: text must have letters or digits and at most {MAX_TEXT_CHARS} characters")
    raw_id = _string(obj, "id", where, required=False) or f"line{number:03d}"
    return Line(file_stem(raw_id), text, _audio(obj, "prompt_audio", base, where, required=True),
                _string(obj, "language", where, required=False),
                _audio(obj, "reference_audio", base, where, required=False))


def read_lines_file(path: Path) -> list[Line]:
    """Every line of a `--lines` file, checked; one message for the first bad one."""
    if not path.is_file():  # a FIFO or a folder is there, but no file to read: "no such file" misled
        what = f"{kind_of_path(path)}, not a file" if os.path.lexists(path) else "no such file"
        raise UserError(f"--lines {path}: {what}; pass a JSONL file of {{'text', 'prompt_audio'}} lines")
    if path.stat().st_size > MAX_LINES_FILE_BYTES:
        raise UserError(f"--lines {path}: larger than {MAX_LINES_FILE_BYTES >> 20} MiB; a listening set is a few lines")
    lines: list[Line] = []
    for number, _, raw in iter_lines(str(path), "--lines file"):
        where = f"--lines {path} line {number}"
        try:
            obj = parse_json(raw, where)
        except ValueError:
            raise UserError(f"{where}: not valid JSON; write one object a line") from None
        lines.append(_line(obj, path.parent, where, len(lines) + 1))
        if len(lines) > MAX_LINES:
            raise UserError(f"--lines {path}: more than {MAX_LINES} lines; pick fewer")
    if not lines:
        raise UserError(f"--lines {path}: no lines; write one {{'text', 'prompt_audio'}} object a line")
    seen = {}
    for line in lines:
        if line.line_id in seen:
            raise UserError(f"--lines {path}: id {line.line_id!r} appears twice; ids name the WAV files")
        seen[line.line_id] = line
    return lines


def _rank(seed: int, uid: str) -> str:
    return hashlib.sha256(f"{seed}\0{uid}".encode()).hexdigest()


def _candidates(spec: str, where: str) -> list[tuple[str, dict, Path]]:
    """(id, paired line, its folder) of every validation line that names its prompt audio and target."""
    manifest = parse_manifest_spec(spec, "--val-manifest")
    out = []
    for number, _, raw in iter_lines(str(manifest.path), "manifest"):
        if number > MAX_MANIFEST_LINES:
            break
        try:
            obj = parse_json(raw, str(manifest.path))
        except (ValueError, UserError):
            continue  # training checks its manifests; a bad line is simply not a candidate here
        if isinstance(obj, dict) and all(isinstance(obj.get(k), str) and obj[k]
                                         for k in ("prompt_audio_path", "target_text")):
            obj.setdefault("language", manifest.lang)
            uid = str(obj.get("id") or f"{manifest.path.stem}-{number}")
            if all(_is_unicode(v) for v in (uid, *obj.values()) if isinstance(v, str)):  # as --lines refuses
                out.append((uid, obj, manifest.path.parent))
    if not out:
        raise UserError(f"{where}: {manifest.path} has no line with prompt_audio_path and target_text (a manifest "
                        "`indextts-train prepare` wrote has them); pass --lines FILE.jsonl")
    return out


def default_lines(run_dir: Path, seed: int) -> list[Line]:
    """LINES_PER_LANGUAGE lines per language from the run's validation manifests (see the module doc)."""
    specs = run_inputs(run_dir)["val_manifests"]
    where = f"{run_dir / RECORD_NAME}"
    if not specs:
        raise UserError(f"{where}: the run was started without --val-manifest (or no run.yaml records it), so "
                        "there are no held-out lines to hear; pass --lines FILE.jsonl")
    candidates = [c for spec in specs for c in _candidates(spec, where)]
    chosen: dict[str | None, list[Line]] = {}
    for uid, obj, base in sorted(candidates, key=lambda c: _rank(seed, c[0])):
        group = chosen.setdefault(obj.get("language"), [])
        prompt, reference = base / obj["prompt_audio_path"], base / str(obj.get("target_audio_path") or "")
        if len(group) >= LINES_PER_LANGUAGE or not prompt.is_file() or not normalise(obj["target_text"]):
            continue
        group.append(Line(file_stem(uid), obj["target_text"], prompt, obj.get("language"),
                          reference if obj.get("target_audio_path") and reference.is_file() else None))
    lines = [line for group in chosen.values() for line in group]
    if not lines:
        raise UserError(f"{where}: none of the validation lines' prompt audio files exists any more; "
                        "pass --lines FILE.jsonl")
    return lines
