"""Hugging Face `datasets` corpora: a `save_to_disk` folder, an `.arrow` file, Parquet files (or a folder of them).

Columns (first match wins; `id`, speaker and language are optional):
- audio: the column of `datasets.Audio` type, else one named `audio` ({"bytes", "path"} structs);
- text: `--text-column`, else the first of `text`, `sentence`, `transcription`, `normalized_text`, `transcript`;
- speaker: `speaker_id`, `speaker`, `client_id` (else --speaker, else the dataset's name);
- language: `language`, `locale` (else --language); id: `id`, else `<dataset name>-<row>`.

`datasets` never decodes audio here (its decoder needs torchcodec): the audio column is read as its
stored {"bytes", "path"} and soundfile decodes the bytes. The reader keeps only the text columns;
an utterance names its row (`Utterance.row`), and the loader threads fetch that one row's bytes from a
per-process cached, opened dataset (Arrow is memory-mapped; a Parquet row group is read at a time,
two kept), so no more than a few clips' audio is ever in memory. Audio given only as a path is read
from that file, relative to the dataset's folder.
"""

from __future__ import annotations

import bisect
import io
import os
import threading
from collections import OrderedDict
from pathlib import Path

from indextts_train.errors import UserError
from indextts_train.files.bounded import parse_json, read_bounded
from indextts_train.prepare.utterance import Defaults, Utterance, lacking

TEXT_COLUMNS = ("text", "sentence", "transcription", "normalized_text", "transcript")
SPEAKER_COLUMNS = ("speaker_id", "speaker", "client_id")
LANGUAGE_COLUMNS = ("language", "locale")
AUDIO_COLUMN = "audio"
ID_COLUMN = "id"
DATASET_JSON = ("state.json", "dataset_info.json")  # what save_to_disk writes beside the Arrow files
MAX_DATASET_JSON_BYTES = 64 << 20  # a file list and the features: kilobytes
MAX_ROWS = 10_000_000  # more rows than any TTS corpus: a wrong file
ROW_GROUPS_KEPT = 2  # Parquet row groups (audio column only) kept per opened file
# A dictionary-encoded column can hold one long value once and repeat it in every row: a Parquet file of a
# kilobyte held a gigabyte of text. What is read is measured (values' lengths, dictionaries unexpanded) first.
MAX_VALUE_BYTES = 1 << 20  # one transcript, speaker or id
MAX_COLUMN_BYTES = 1 << 31  # a whole text column: 10 million transcripts of 200 bytes
MAX_GROUP_BYTES = 1 << 31  # the audio of one Parquet row group (HF writes groups of about 100 clips)
BATCH_ROWS = 4096

_LOCK = threading.Lock()
_OPEN: dict[str, _Rows] = {}


class RowAudioError(Exception):
    """A row whose audio cannot be found; str() is the reason."""


def is_hf_corpus(path: Path) -> bool:
    """A Parquet / Arrow file, a `save_to_disk` folder, or a folder holding Parquet files."""
    if path.is_file():
        return path.name.lower().endswith((".parquet", ".arrow"))
    if not path.is_dir():
        return False
    if any((path / name).is_file() for name in ("dataset_info.json", "state.json", "dataset_dict.json")):
        return True
    return any(path.glob("*.parquet"))


class _Rows:
    """One dataset file or folder: its features, row count, whole columns and single rows' audio."""

    def __init__(self, path: Path) -> None:
        import datasets

        self.path, self.folder = path, path if path.is_dir() else path.parent
        self._parquet, self._groups = None, OrderedDict()
        if path.name.lower().endswith(".parquet"):
            import pyarrow.parquet as pq

            meta = pq.read_metadata(str(path))  # read once: string and binary columns kept as dictionaries
            self._parquet = pq.ParquetFile(str(path), metadata=meta, read_dictionary=[
                meta.schema.column(i).path for i in range(meta.num_columns)
                if meta.schema.column(i).physical_type == "BYTE_ARRAY"])
            self.features = datasets.Features.from_arrow_schema(self._parquet.schema_arrow)
            self.num_rows = self._parquet.metadata.num_rows
            sizes = [self._parquet.metadata.row_group(g).num_rows for g in range(self._parquet.num_row_groups)]
            self._starts = [sum(sizes[:g]) for g in range(len(sizes) + 1)]
        else:
            if path.is_dir() and (path / "dataset_dict.json").is_file():
                splits = sorted(p.name for p in path.iterdir() if (p / "state.json").is_file())
                raise UserError(f"{path}: a DatasetDict (splits {', '.join(splits) or 'none'}); pass one split's "
                                f"folder, e.g. {path / (splits[0] if splits else 'train')}")
            if path.is_dir():
                _check_dataset_json(path)
            dataset = datasets.load_from_disk(str(path)) if path.is_dir() else datasets.Dataset.from_file(str(path))
            if not isinstance(dataset, datasets.Dataset):
                raise UserError(f"{path}: not one dataset (a DatasetDict?); pass one split's folder")
            self.features, self.num_rows = dataset.features, dataset.num_rows
            self._table = dataset.data.table  # memory-mapped pyarrow Table; datasets' decoding is bypassed

    def column(self, name: str) -> list:
        """Every row's value, each measured before it becomes a Python object (see MAX_VALUE_BYTES)."""
        values: list = []
        total = 0
        try:
            arrays = ((batch.column(0) for batch in self._parquet.iter_batches(BATCH_ROWS, columns=[name]))
                      if self._parquet is not None else iter(self._table.column(name).chunks))
            for array in arrays:
                size, longest = _text_bytes(array)
                total += size
                if longest > MAX_VALUE_BYTES or total > MAX_COLUMN_BYTES:
                    held = (f"a value of {longest} bytes" if longest > MAX_VALUE_BYTES else
                            f"more than {MAX_COLUMN_BYTES} bytes in all")
                    raise UserError(f"{self.path}: column {name!r} holds {held}, which no transcript, speaker or id "
                                    "column does; check the file")
                values += array.to_pylist()
            return values
        except UserError:
            raise
        except Exception as exc:  # pyarrow raises several types for a damaged page or a truncated file
            detail = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
            raise UserError(f"{self.path}: column {name!r} cannot be read ({type(exc).__name__}: {detail}); the "
                            "file is damaged: copy or download it again") from None

    def audio(self, name: str, row: int) -> dict:
        """The stored {"bytes", "path"} of one row (nothing else is read)."""
        if self._parquet is None:
            return self._table.column(name)[row].as_py() or {}
        group = bisect.bisect_right(self._starts, row) - 1
        with _LOCK:  # one reader of the file at a time; two row groups kept for neighbouring rows
            if (name, group) not in self._groups:
                self._groups[(name, group)] = self._audio_group(name, group)
                while len(self._groups) > ROW_GROUPS_KEPT:
                    self._groups.popitem(last=False)
            chunk = self._groups[(name, group)]
        return chunk[row - self._starts[group]].as_py() or {}

    def _audio_group(self, name: str, group: int):
        """One row group's audio column, its bytes measured (dictionaries unexpanded) against MAX_GROUP_BYTES."""
        meta = self._parquet.metadata.row_group(group)
        stored = sum(meta.column(i).total_uncompressed_size for i in range(meta.num_columns)
                     if meta.column(i).path_in_schema.split(".")[0] == name)
        column = self._parquet.read_row_group(group, columns=[name]).column(0) if stored <= MAX_GROUP_BYTES else None
        held = stored if column is None else sum(_text_bytes(chunk.field("bytes"))[0] for chunk in column.chunks
                                                 if chunk.type.get_field_index("bytes") >= 0)
        if held > MAX_GROUP_BYTES:
            raise RowAudioError(f"row group {group} of {self.path} holds {held} bytes of audio, more than "
                                f"{MAX_GROUP_BYTES}; check the file")
        return column


def _text_bytes(array) -> tuple[int, int]:
    """(all, longest) bytes of a string or binary array's values, a dictionary's counted for each row that
    uses it (nothing is expanded); (0, 0) for other types."""
    import pyarrow as pa
    import pyarrow.compute as pc

    kind = array.type.value_type if pa.types.is_dictionary(array.type) else array.type
    if not (pa.types.is_string(kind) or pa.types.is_binary(kind) or pa.types.is_large_string(kind)
            or pa.types.is_large_binary(kind)):
        return 0, 0
    lengths = (pc.binary_length(array.dictionary).take(array.indices) if pa.types.is_dictionary(array.type)
               else pc.binary_length(array))
    return pc.sum(lengths).as_py() or 0, pc.max(lengths).as_py() or 0


def _check_dataset_json(folder: Path) -> None:
    """The JSON files datasets.load_from_disk reads whole (json.load), read first within bounds: a 100 GB
    state.json of holes would be read into memory, one nested 100,000 deep recurses past the limit."""
    for name in DATASET_JSON:
        path = folder / name
        if path.is_file():
            parse_json(read_bounded(path, MAX_DATASET_JSON_BYTES, f"dataset {name}"), str(path))


def _open(path: Path) -> _Rows:
    """The dataset at `path`, opened once per process (readers and loader threads share it)."""
    key = os.path.abspath(path)
    with _LOCK:
        rows = _OPEN.get(key)
    if rows is None:
        try:
            rows = _Rows(Path(key))
        except UserError:
            raise
        except Exception as exc:  # datasets / pyarrow raise many types for an unreadable file
            detail = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
            raise UserError(f"{path}: not a Hugging Face dataset datasets can open ({detail}); pass a "
                            "save_to_disk folder (one split) or .parquet files") from None
        with _LOCK:
            rows = _OPEN.setdefault(key, rows)
    return rows


def audio_column(rows: _Rows) -> str:
    """The column of `datasets.Audio` type, else the one named `audio`."""
    import datasets

    typed = [name for name, feature in rows.features.items() if isinstance(feature, datasets.Audio)]
    if typed:
        return typed[0]
    if AUDIO_COLUMN in rows.features:
        return AUDIO_COLUMN
    raise UserError(f"{rows.path}: no audio column (none of datasets.Audio type, none named 'audio'; columns: "
                    f"{', '.join(rows.features)}); cast the audio column with datasets.Audio()")


def _first(rows: _Rows, names: tuple[str, ...]) -> str | None:
    return next((name for name in names if name in rows.features), None)


def _strings(rows: _Rows, name: str | None, kind: str) -> list:
    if name is None:
        return [None] * rows.num_rows
    values = rows.column(name)
    for row, value in enumerate(values):
        if value is not None and not isinstance(value, (str, int)):
            raise UserError(f"{rows.path}#{row}: column {name!r} ({kind}) holds {type(value).__name__}, "
                            "expected a string")
    return [None if v is None else str(v) for v in values]


def dataset_name(path: Path) -> str:
    return path.name if path.is_dir() else path.name.split(".")[0]


def read_dataset(path: Path, defaults: Defaults) -> list[Utterance]:
    """Every row as an Utterance naming its row; the audio is not read here."""
    rows = _open(path)
    if rows.num_rows > MAX_ROWS:
        raise UserError(f"{path}: {rows.num_rows} rows, more than {MAX_ROWS}; is this a TTS corpus?")
    audio_column(rows)  # named now: a dataset without one is refused before any work
    text = defaults.text_column or _first(rows, TEXT_COLUMNS)
    if text is None or text not in rows.features:
        looked = f"--text-column {text}" if text else f"looked for {', '.join(TEXT_COLUMNS)}"
        raise UserError(f"{path}: no text column ({looked}; columns: {', '.join(rows.features)}); name the "
                        "transcript column with --text-column")
    texts = _strings(rows, text, "text")
    speakers = _strings(rows, _first(rows, SPEAKER_COLUMNS), "speaker")
    languages = _strings(rows, _first(rows, LANGUAGE_COLUMNS), "language")
    ids = _strings(rows, ID_COLUMN if ID_COLUMN in rows.features else None, "id")
    name, where = dataset_name(path), os.path.abspath(path)
    return [Utterance(ids[row] or f"{name}-{row}", where, texts[row] or "",
                      speakers[row] or defaults.speaker or name, languages[row] or defaults.language,
                      f"{where}#{row}", row=row, lacks=lacking(speaker=speakers[row], language=languages[row]))
            for row in range(rows.num_rows)]


def read_hf_corpus(path: Path, defaults: Defaults) -> list[Utterance]:
    """A dataset file or folder; a folder of Parquet files is read file by file, in name order."""
    if path.is_dir() and not any((path / n).is_file() for n in ("dataset_info.json", "state.json",
                                                                 "dataset_dict.json")):
        out = []
        for file in sorted(path.glob("*.parquet")):
            out.extend(read_dataset(file, defaults))
        return out
    return read_dataset(path, defaults)


def row_audio(path: str, row: int) -> io.BytesIO | str:
    """What soundfile opens for one row: its embedded bytes, else its file (relative to the dataset's folder)."""
    rows = _open(Path(path))
    stored = rows.audio(audio_column(rows), row)
    if stored.get("bytes"):
        return io.BytesIO(stored["bytes"])
    if stored.get("path"):
        return os.path.abspath(os.path.join(rows.folder, stored["path"]))
    raise RowAudioError(f"row {row} has no audio (neither bytes nor a path)")
