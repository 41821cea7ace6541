"""`indextts-train tokenize`: re-encode the text of existing manifest lines with a (new) tokenizer.

After `extend-tokenizer`, or to repair data made by the raw-text path, every line's text is encoded
again through the official text path (inference_text.TextPath). New text-id `.npy` files and new
manifests are written under the output folder; the original manifests and arrays are never touched.
The new manifests point at the original codes and speaker features (relative paths re-written).

Text fields, per manifest form: single `text` -> `text_ids_path` / `text_len`; paired `target_text`
-> `target_text_ids_path` / `target_text_len`, and `prompt_text` -> `prompt_text_ids_path` /
`prompt_text_len` where a line has them. IndexTTS-2.5 lines are encoded with their `language` (or
the code of their `lang_id`).

Kill and rerun: each ids folder holds `tokenize.json`, written before its first array, naming what made
it (the input manifest's path and hash, the tokenizer's hash, the normaliser and language settings). A
rerun of the same command redoes a folder whose record names the same inputs and whose manifest was not
published, and skips a manifest it finished (the record holds its counts and its hash). A folder or a
manifest it cannot prove it wrote is refused, as are those of other inputs.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO

import numpy as np

from indextts_train.config.constants import LANG_ROWS
from indextts_train.data.checkdata import relocate_paths
from indextts_train.data.corpus_forms import refuse_corpus
from indextts_train.data.lines import check_strings, language_code
from indextts_train.errors import UserError
from indextts_train.files.atomic import atomic_write, atomic_write_text, stale_temps
from indextts_train.files.bounded import (
    MAX_TOKENIZER_BYTES,
    check_file,
    iter_lines,
    json_or_none,
    parse_json,
    read_bounded,
    sha256_lines,
)
from indextts_train.files.targets import check_output_folder, make_output_folder, same_path, writer_gone
from indextts_train.text.inference_text import CHARMAP_ONLY, WETEXT_INSTALL, WETEXT_PACKAGE, TextPath

# (text field, ids path field, length field)
TEXT_SLOTS = (("text", "text_ids_path", "text_len"),
              ("target_text", "target_text_ids_path", "target_text_len"),
              ("prompt_text", "prompt_text_ids_path", "prompt_text_len"))
_SHOW = 20  # bad lines listed in the report
RECORD = "tokenize.json"  # in each ids folder: what made it (module docstring)
RECORD_FORMAT = "indextts-train tokenize 1"
_INPUT_NAMES = {"manifest": "manifest path", "manifest_sha256": "manifest's lines", "tokenizer_sha256": "tokenizer",
                "normalizer": "normaliser", "strict_language": "--strict-language", "borrowed": "--borrow-language"}
_ARRAY = re.compile(r"\d+\.(text|target_text|prompt_text)\.npy")  # _new_line's names


@dataclass
class _Tally:
    """What one run counts: lines written, lines left out (first messages), per manifest."""

    written: int = 0
    bad: int = 0
    errors: list[str] = field(default_factory=list)
    manifests: list[dict] = field(default_factory=list)

    def refuse(self, message: str) -> None:
        self.bad += 1
        if len(self.errors) < _SHOW:
            self.errors.append(message)


@dataclass
class _Target:
    """One input manifest and where its re-encoding goes; `earlier`: the record of a finished run, skipped."""

    manifest: Path
    new: Path
    ids_dir: Path
    inputs: dict
    earlier: dict | None = None


def _sha256(path: Path) -> str:
    """sha256 of a manifest, read within the line reader's bounds: a crafted one (100 GB of holes) is one
    line at its first line, not minutes of hashing before any line is read."""
    return sha256_lines(path, "manifest")


def _written_sha256(path: Path) -> str | None:
    """sha256 of a manifest tokenize wrote, or None when the file there cannot be one (past the bounds)."""
    try:
        return _sha256(path)
    except UserError:
        return None


def _read_record(ids_dir: Path) -> dict | None:
    """The folder's record, or None when it has none that tokenize wrote."""
    path = ids_dir / RECORD
    if path.is_symlink() or not path.is_file():
        return None
    try:
        record = json_or_none(read_bounded(path, 1 << 20, "tokenize record"))
    except UserError:  # larger than any record tokenize writes, or swapped since: not one of ours
        return None
    return record if isinstance(record, dict) and record.get("format") == RECORD_FORMAT else None


def _foreign(ids_dir: Path) -> list[str]:
    """What in the ids folder is not tokenize's: besides its record, arrays and the temp files of killed writers."""
    return sorted(entry.name for entry in ids_dir.iterdir() if not (
        entry.name == RECORD or _ARRAY.fullmatch(entry.name) or _dead_record_temp(entry)))


def _dead_record_temp(path: Path) -> bool:
    """A temp file of the record whose writer was killed (an empty folder but for it is a fresh one)."""
    return path.name.startswith(f".{RECORD}.tmp-") and writer_gone(path)


def _earlier(target: _Target) -> dict | None:
    """How an earlier tokenize left this target: None (nothing, or unfinished: redo it) or its finished record.
    Refuses what it cannot prove that a tokenize of the same inputs wrote."""
    new, ids_dir = target.new, target.ids_dir
    if ids_dir.is_symlink() or (ids_dir.exists() and not ids_dir.is_dir()):
        raise UserError(f"{ids_dir}: already exists and is not a folder tokenize made; pass a new --out "
                        "folder or remove it")
    record = _read_record(ids_dir) if ids_dir.is_dir() else None
    if ids_dir.is_dir() and record is None and any(not _dead_record_temp(p) for p in ids_dir.iterdir()):
        raise UserError(f"{ids_dir}: already exists and holds no {RECORD} (not an earlier tokenize's); pass a "
                        "new --out folder or remove it")
    if record is not None and record.get("inputs") != target.inputs:
        earlier = record.get("inputs") if isinstance(record.get("inputs"), dict) else {}
        changed = [_INPUT_NAMES.get(key, key) for key in target.inputs if earlier.get(key) != target.inputs[key]]
        raise UserError(f"{ids_dir}: made by a tokenize of other inputs ({', '.join(changed)} not the same); pass "
                        "a new --out folder or remove it")
    foreign = _foreign(ids_dir) if record is not None else []
    if foreign:  # listed once: the folder may hold every line's arrays
        raise UserError(f"{ids_dir}: holds {foreign[0]}, which tokenize did not write; remove it or pass a new "
                        "--out folder")
    if not (new.is_symlink() or new.exists()):
        return None
    done = (record or {}).get("done")
    if (not isinstance(done, dict) or new.is_symlink() or not new.is_file()
            or _written_sha256(new) != done.get("sha256")):
        raise UserError(f"{new}: already exists (an earlier tokenize?) and is not the manifest this tokenize "
                        "wrote; pass a new --out folder or remove it")
    return record


def _outputs(manifests: Sequence[Path], out_dir: Path, settings: dict) -> list[_Target]:
    """A target per input manifest; refuses clashes and outputs that no tokenize of these inputs wrote."""
    planned, names = [], set()
    for manifest in manifests:
        refuse_corpus(manifest)  # a corpus for prepare is said as such
        check_file(manifest, "manifest")  # a FIFO would block the first read: one line instead
        new, ids_dir = out_dir / manifest.name, out_dir / "text_ids" / manifest.stem
        # the new manifest is named after the input, its ids folder after the input's stem: train.jsonl and
        # train.json would share text_ids/train, where the second's arrays would meet the first's
        clash = next((name for name in (manifest.name, manifest.stem) if name in names), None)
        if clash is not None:
            raise UserError(f"{manifest}: another manifest has the name {clash} (its new manifest or its "
                            f"{out_dir / 'text_ids' / manifest.stem} folder); tokenize them into different --out "
                            "folders")
        names.update((manifest.name, manifest.stem))
        if same_path(new, manifest):
            raise UserError(f"{manifest}: --out {out_dir} is the manifest's own folder; pass a new folder "
                            "(the originals stay untouched)")
        inputs = {"manifest": os.path.abspath(manifest), "manifest_sha256": _sha256(manifest), **settings}
        target = _Target(manifest, new, ids_dir, inputs)
        target.earlier = _earlier(target)
        planned.append(target)
    return planned


def _start_over(target: _Target) -> None:
    """Make the ids folder ready for a fresh pass: created, or emptied of what an unfinished tokenize left;
    then the record that makes it this command's, before any array."""
    make_output_folder("--out", target.ids_dir)
    for name in os.listdir(target.ids_dir):
        if name != RECORD:  # _earlier checked: only arrays and dead temp files are left
            (target.ids_dir / name).unlink()
    for temp in stale_temps(target.new):  # a manifest a killed run was renaming into place
        if writer_gone(temp):
            temp.unlink()
    _write_record(target, None)


def _write_record(target: _Target, done: dict | None) -> None:
    record = {"format": RECORD_FORMAT, "inputs": target.inputs, "done": done}
    atomic_write_text(target.ids_dir / RECORD, json.dumps(record, ensure_ascii=False, indent=1) + "\n")


def _language(obj: dict, text_path: TextPath, where: str) -> str | None:
    """The code a 2.5 line's text is presented with: its `language`, else the code of its `lang_id`
    (the two must agree, as check-data and training require)."""
    if not text_path.family.language_rows:
        return None
    language, lang_id = obj.get("language"), obj.get("lang_id")
    if lang_id is not None and (type(lang_id) is not int or not 0 <= lang_id < LANG_ROWS):
        raise UserError(f"{where}: lang_id {lang_id!r} must be a whole number in 0..{LANG_ROWS - 1}; fix the line")
    if isinstance(language, str) and language.strip():
        if lang_id is not None and text_path.lang_id(language) != lang_id:
            raise UserError(f"{where}: lang_id {lang_id} disagrees with language {language!r} (row "
                            f"{text_path.lang_id(language)}); fix one of them")
        return language
    if lang_id is not None:
        return language_code(lang_id)
    raise UserError(f"{where}: an IndexTTS-2.5 line needs `language` (or `lang_id`) to be encoded")


def _encode_slot(text: object, text_path: TextPath, language: str | None, where: str, name: str) -> np.ndarray:
    if not isinstance(text, str) or not text.strip():
        raise UserError(f"{where}: {name} must be a non-empty string, got {text!r}; fix or drop the line")
    if text_path.inexact(text, language):
        raise UserError(f"{where}: {name} has digits, which official inference spells out with {WETEXT_PACKAGE} "
                        f"(here: {CHARMAP_ONLY}); {WETEXT_INSTALL}, or write the numbers in words")
    try:
        ids = text_path.encode(text, language)
    except UserError as exc:  # its language or bytes: the line is what the user fixes
        raise UserError(f"{where}: {name}: {exc}") from None
    unknown = text_path.unknown(text, language) if text_path.unknown_id in ids else []
    if unknown:
        raise UserError(f"{where}: {name} has {len(unknown)} run(s) the tokenizer cannot encode "
                        f"({', '.join(map(repr, unknown[:5]))}); grow the tokenizer on text with them, or drop "
                        "the line")
    if not ids:
        raise UserError(f"{where}: {name} {text!r} encodes to no ids; fix or drop the line")
    return np.asarray(ids, dtype=np.int32)


def _new_line(obj: dict, where: str, text_path: TextPath, ids_dir: Path, line_no: int, to_dir: str) -> dict:
    """The line with new ids written for every text slot it has; their paths relative to `to_dir`."""
    language = _language(obj, text_path, where)
    slots = [slot for slot in TEXT_SLOTS if slot[1] in obj]
    if not slots:
        raise UserError(f"{where}: no text_ids_path / target_text_ids_path field; not a manifest line")
    encoded = {}
    for text_field, ids_field, len_field in slots:
        if text_field not in obj:
            raise UserError(f"{where}: no `{text_field}` field, so {ids_field} cannot be re-encoded; add the text")
        encoded[(ids_field, len_field)] = _encode_slot(obj[text_field], text_path, language, where, text_field)
    new = dict(obj)
    for (ids_field, len_field), ids in encoded.items():
        path = ids_dir / f"{line_no}.{ids_field.removesuffix('_ids_path')}.npy"
        with open(path, "xb") as handle:  # exclusive: never over a file this run did not just create
            try:
                np.save(handle, ids, allow_pickle=False)
            except OSError as exc:  # a full disk: no half array stays, and the error names it
                handle.close()
                path.unlink(missing_ok=True)
                raise OSError(exc.errno, exc.strerror, str(path)) from exc
        new[ids_field], new[len_field] = os.path.relpath(path, to_dir), len(ids)
    return new


def _write_manifest(manifest: Path, new: Path, ids_dir: Path, text_path: TextPath, tally: _Tally,
                    handle: BinaryIO) -> int:
    """Stream the re-encoded lines of one manifest into `handle`; returns how many were written."""
    from_dir, to_dir = os.path.dirname(os.path.abspath(manifest)), os.path.dirname(os.path.abspath(new))
    written = 0
    for line_no, _, raw in iter_lines(str(manifest), "manifest"):
        where = f"{manifest}:{line_no}"
        try:
            obj = parse_json(raw, where)  # nesting bounded: one line, not a RecursionError
            if not isinstance(obj, dict):
                raise UserError(f"{where}: expected a JSON object")
            check_strings(obj, where)
            line = _new_line(relocate_paths(obj, from_dir, to_dir), where, text_path, ids_dir, line_no, to_dir)
        except ValueError:  # not JSON, or not UTF-8
            tally.refuse(f"{where}: not valid JSON; fix or drop the line")
            continue
        except UserError as exc:
            tally.refuse(str(exc))
            continue
        handle.write((json.dumps(line, ensure_ascii=False) + "\n").encode("utf-8"))
        written += 1
    return written


def tokenize_manifests(manifests: Sequence[str | Path], tokenizer: Path, out_dir: Path, *,
                       normalizer: str = "auto", strict_language: bool = False,
                       borrowed: dict[str, int] | None = None) -> dict:
    """Re-encode every manifest's text into `out_dir`; a report with counts, bad lines and notes.

    A new manifest is published (atomically, after its arrays are on disk) only when at least one
    of its lines could be encoded.
    """
    check_output_folder("--out", Path(out_dir))
    text_path = TextPath.open(Path(tokenizer), normalizer=normalizer, strict_language=strict_language,
                              borrowed=borrowed)
    tokenizer_sha256 = hashlib.sha256(read_bounded(tokenizer, MAX_TOKENIZER_BYTES, "tokenizer")).hexdigest()
    settings = {"tokenizer_sha256": tokenizer_sha256, "normalizer": text_path.normalizer_name,
                "strict_language": strict_language, "borrowed": dict(sorted((borrowed or {}).items()))}
    tally = _Tally()
    made = [folder for folder in (Path(out_dir), Path(out_dir) / "text_ids") if not folder.exists()]
    for target in _outputs([Path(m) for m in manifests], Path(out_dir), settings):
        done = target.earlier["done"] if target.earlier is not None else _tokenize_one(target, text_path)
        tally.written += done["written"]
        tally.bad += done["bad"]
        tally.errors += done["errors"][:_SHOW - len(tally.errors)]
        tally.manifests.append({"manifest": str(target.manifest), "out": str(target.new) if done["written"] else None,
                                "written": done["written"], "earlier": target.earlier is not None})
    for folder in reversed(made):  # nothing written at all: the folders this command made go too
        if tally.written == 0 and folder.is_dir() and not any(folder.iterdir()):
            folder.rmdir()
    return {"tokenizer": str(tokenizer), "normalizer": text_path.normalizer_name, "written": tally.written,
            "bad": tally.bad, "errors": tally.errors, "manifests": tally.manifests, "notes": text_path.notes()}


def _tokenize_one(target: _Target, text_path: TextPath) -> dict:
    """Re-encode one manifest: arrays, then the record of what was done, then the manifest (so a published
    manifest always has its record). What is recorded is what a rerun reports when it skips this one."""
    _start_over(target)
    tally, buffer = _Tally(), io.BytesIO()  # a manifest is small next to its arrays; arrays are written one by one
    written = _write_manifest(target.manifest, target.new, target.ids_dir, text_path, tally, buffer)
    data = buffer.getvalue()
    done = {"written": written, "bad": tally.bad, "errors": tally.errors,
            "sha256": hashlib.sha256(data).hexdigest()}
    if written:
        _write_record(target, done)
        atomic_write(target.new, lambda handle: handle.write(data), before_rename=os.sync)
    else:  # nothing to publish: the folder goes, its record last (an empty folder is a fresh one to a rerun)
        (target.ids_dir / RECORD).unlink()
        target.ids_dir.rmdir()
    return done


def tokenize_exit_code(report: dict) -> int:
    """0: every line re-encoded; 1: some lines could not be; 2: none could."""
    return 2 if not report["written"] else 1 if report["bad"] else 0


def render_tokenize_report(report: dict) -> str:
    lines = [f"re-encoded with {report['tokenizer']} (normaliser: {report['normalizer']})"]
    for item in report["manifests"]:
        target = item["out"] or "nothing written (no line could be encoded)"
        earlier = " (finished by an earlier run of this command; kept)" if item.get("earlier") else ""
        lines.append(f"  {item['manifest']} -> {target}: {item['written']} line(s){earlier}")
    lines.append(f"{report['written']} line(s) written, {report['bad']} could not be encoded")
    if report["errors"]:
        lines.append(f"lines left out (first {len(report['errors'])} of {report['bad']}):")
        lines += [f"  {error}" for error in report["errors"]]
    return "\n".join(lines)
