"""lhotse manifests: a cut manifest, or recordings + supervisions; each supervision is one utterance.

Forms (lhotse loads the manifests; our `load_audio` reads the samples, so the official audio path holds):
- a cut manifest (`*.jsonl.gz`, or a `.jsonl` whose first line is a cut): each supervision of each cut
  is a segment of the cut's recording, at `cut.start + supervision.start`, `supervision.duration` long;
- recordings + supervisions: pass either `*recordings*.jsonl.gz` or `*supervisions*.jsonl.gz` (its
  partner is the same name with the other word), or the folder holding them (every
  `*supervisions*.jsonl.gz` there with its partner); a supervision starts at `supervision.start`
  of its recording.

id = supervision id; speaker = supervision.speaker, else --speaker, else "speaker"; language =
supervision.language, else --language. Only recordings with one `file` source are read (a relative
path: from the current directory, as lhotse reads it, else from the manifest's folder); url,
command, memory or several sources, audio transforms (speed perturbation, resampling), a selection
of some channels of a multi-channel file, and mixed cuts are refused with one line naming the
manifest and the recording or cut: such a corpus is first exported to files (`cut.save_audio`).
"""

from __future__ import annotations

import os
import zlib
from pathlib import Path

from indextts_train.errors import UserError
from indextts_train.files.bounded import iter_lines, open_regular, parse_json
from indextts_train.prepare.utterance import DEFAULT_SPEAKER, Utterance, lacking

MAX_GZIP_GROWTH = 100  # decompressed / compressed size of a manifest .jsonl.gz: JSON text compresses 5-10x

RECORDINGS, SUPERVISIONS = "recordings", "supervisions"


def is_lhotse_corpus(path: Path) -> bool:
    """A `.jsonl.gz` manifest, a `.jsonl` whose first line is a lhotse object, or a folder of supervisions."""
    name = path.name.lower()
    if path.is_dir():
        return any(SUPERVISIONS in p.name.lower() for p in path.glob("*.jsonl.gz"))
    if name.endswith(".jsonl.gz"):
        return True
    return name.endswith(".jsonl") and _lhotse_line(path)


def _lhotse_line(path: Path) -> bool:
    """The first line is a cut, a recording or a supervision (and not one of our JSONL lines)."""
    try:
        with open_regular(path, "corpus") as handle:  # swapped for a FIFO since it was checked: not lhotse's
            first = parse_json(handle.readline(1 << 20).decode("utf-8"), str(path))
    except (OSError, ValueError, UserError):  # not lhotse's: the JSONL reader says what is wrong
        return False
    if not isinstance(first, dict) or "audio" in first:
        return False
    return str(first.get("type", "")).endswith("Cut") or {"sources", "sampling_rate"} <= first.keys() \
        or {"recording_id", "start", "duration"} <= first.keys()


def _check_manifest(path: Path) -> None:
    """What lhotse will read is read first within bounds: a regular file, no line past files/bounded's
    bound, and a .gz that decompresses to at most MAX_GZIP_GROWTH times its size (JSON text compresses
    5-10x; lhotse would read a crafted megabyte that grows into gigabytes whole, into memory)."""
    gzipped = path.name.lower().endswith(".gz")
    limit = max(1 << 26, MAX_GZIP_GROWTH * path.stat().st_size) if gzipped else None
    try:
        for _ in iter_lines(path, "lhotse manifest", gzipped=gzipped, max_bytes=limit):
            pass
    except (OSError, EOFError, zlib.error) as exc:  # gzip.BadGzipFile is an OSError
        raise UserError(f"{path}: not a readable .jsonl.gz ({type(exc).__name__}: {exc}); check the file") from None


def _load(kind: str, path: Path) -> list:
    import lhotse

    _check_manifest(path)

    loader = {"cuts": lhotse.CutSet, RECORDINGS: lhotse.RecordingSet, SUPERVISIONS: lhotse.SupervisionSet}[kind]
    try:
        loaded = list(loader.from_file(path) or [])  # lhotse reads .jsonl lazily: parse errors come here
    except Exception as exc:  # lhotse raises many types for a file that is not its manifest
        detail = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        raise UserError(f"{path}: not a lhotse {kind} manifest lhotse can read ({type(exc).__name__}: "
                        f"{detail}); {_gzipped_jsonl_hint(path)}") from None
    if not loaded:
        raise UserError(f"{path}: an empty lhotse {kind} manifest; check the path")
    return loaded


def _gzipped_jsonl_hint(path: Path) -> str:
    """Every `.jsonl.gz` is read as lhotse's; one of prepare's own {"audio", "text"} lines gzipped is not."""
    try:
        _, _, raw = next(iter_lines(path, "lhotse manifest", gzipped=path.name.lower().endswith(".gz")))
        first = parse_json(raw.decode("utf-8"), str(path))
    except (OSError, EOFError, zlib.error, ValueError, UserError, StopIteration):
        return "check the file"
    if isinstance(first, dict) and "audio" in first:
        return "it holds {\"audio\", \"text\"} lines, not lhotse's: decompress it (gunzip) and pass the .jsonl"
    return "check the file"


def _partner(path: Path) -> tuple[Path, Path]:
    """(recordings, supervisions) manifests of the pair `path` belongs to."""
    name = path.name
    low = name.lower()
    mine, other = (RECORDINGS, SUPERVISIONS) if RECORDINGS in low else (SUPERVISIONS, RECORDINGS)
    at = low.rindex(mine)
    partner = path.with_name(name[:at] + other + name[at + len(mine):])
    if not partner.is_file():
        raise UserError(f"{path}: its {other} manifest {partner} is missing; lhotse {RECORDINGS} and "
                        f"{SUPERVISIONS} are read as a pair of same-named files")
    return (path, partner) if mine == RECORDINGS else (partner, path)


def read_lhotse(path: Path, default_speaker: str | None, default_language: str | None) -> list[Utterance]:
    """Every supervision of the manifest(s) at `path`, in manifest order."""
    defaults = (default_speaker, default_language)
    if path.is_dir():
        out = []
        for sups in sorted(p for p in path.glob("*.jsonl.gz") if SUPERVISIONS in p.name.lower()):
            out.extend(_read_pair(*_partner(sups), defaults))
        return out
    low = path.name.lower()
    if RECORDINGS in low or SUPERVISIONS in low:
        return _read_pair(*_partner(path), defaults)
    return _read_cuts(path, defaults)


def _file_source(recording, manifest: Path) -> str:
    """The one audio file of a recording, absolute; anything else refused naming the recording."""
    where = f"{manifest}: recording {recording.id!r}"
    if recording.transforms:
        raise UserError(f"{where} has audio transforms (speed perturbation, resampling); they are not applied "
                        "here: save the transformed audio to files first (lhotse cut.save_audio)")
    if len(recording.sources) != 1:
        raise UserError(f"{where} has {len(recording.sources)} audio sources; only recordings of one file are "
                        "read (save each channel's cut to its own file first)")
    source = recording.sources[0]
    if source.type != "file":
        raise UserError(f"{where} has a {source.type!r} audio source; only 'file' sources are read: save the "
                        "audio to files first (lhotse cut.save_audio / Recording.from_file)")
    audio = str(source.source)
    if os.path.isabs(audio):
        return audio
    here = os.path.abspath(audio)
    beside = os.path.abspath(manifest.parent / audio)
    return here if os.path.exists(here) or not os.path.exists(beside) else beside


def _check_channels(channel, recording, where: str) -> None:
    """A selection of some channels of a multi-channel file cannot be read as its channel mean."""
    chosen = set(channel if isinstance(channel, list) else [channel])
    if len(recording.channel_ids) > 1 and chosen != set(recording.channel_ids):
        raise UserError(f"{where} selects channel(s) {sorted(chosen)} of the {len(recording.channel_ids)}-channel "
                        f"recording {recording.id!r}; only whole files are read (their channels averaged): "
                        "save the selected channel to its own file first")


def _utterance(sup, audio: str, offset: float, where: str, defaults: tuple) -> Utterance:
    return Utterance(sup.id, audio, sup.text or "", sup.speaker or defaults[0] or DEFAULT_SPEAKER,
                     sup.language or defaults[1], where, offset=float(offset), duration=float(sup.duration),
                     lacks=lacking(speaker=sup.speaker, language=sup.language))


def _read_cuts(path: Path, defaults: tuple) -> list[Utterance]:
    from lhotse.cut import PaddingCut
    from lhotse.cut.data import DataCut

    out = []
    for cut in _load("cuts", path):
        where = f"{path}: cut {cut.id!r}"
        if isinstance(cut, PaddingCut):
            continue  # silence padding carries no supervision
        if not isinstance(cut, DataCut) or not cut.has_recording:
            raise UserError(f"{where} is a {type(cut).__name__} without one recording (mixed or feature-only); "
                            "only cuts of one recording are read: save mixed cuts' audio to files first")
        audio = _file_source(cut.recording, path)
        _check_channels(cut.channel, cut.recording, where)
        for sup in cut.supervisions:
            _check_channels(sup.channel, cut.recording, f"{path}: supervision {sup.id!r}")
            out.append(_utterance(sup, audio, cut.start + sup.start, f"{where} supervision {sup.id!r}", defaults))
    return out


def _read_pair(recordings_path: Path, supervisions_path: Path, defaults: tuple) -> list[Utterance]:
    recordings = {recording.id: recording for recording in _load(RECORDINGS, recordings_path)}
    out = []
    for sup in _load(SUPERVISIONS, supervisions_path):
        where = f"{supervisions_path}: supervision {sup.id!r}"
        if sup.recording_id not in recordings:
            raise UserError(f"{where}: recording {sup.recording_id!r} is not in {recordings_path}; pass the "
                            "recordings manifest of the same corpus")
        recording = recordings[sup.recording_id]
        _check_channels(sup.channel, recording, where)
        out.append(_utterance(sup, _file_source(recording, recordings_path), sup.start, where, defaults))
    return out
