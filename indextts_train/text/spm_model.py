"""The SentencePiece model file: read, edit and write a `ModelProto` without generated protobuf code.

We read and write it with a small wire-format codec instead of generated protobuf modules, so there
is no protobuf version to match. Top-level field 1 is the repeated `SentencePiece {1: piece,
2: score (float32), 3: type}`; every other field (trainer spec, normalizer spec, ...) is carried
byte-for-byte, and so is every base piece. tokenizer.py builds the extend and check tools on it.
"""

from __future__ import annotations

import struct
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import sentencepiece as spm

from indextts_train.errors import UserError
from indextts_train.files.bounded import MAX_TOKENIZER_BYTES, read_checked
from indextts_train.text.outputs import write_outputs

# SentencePiece.Type
NORMAL, UNKNOWN, CONTROL, USER_DEFINED, UNUSED, BYTE = 1, 2, 3, 4, 5, 6
TYPE_NAMES = {NORMAL: "normal", UNKNOWN: "unknown", CONTROL: "control", USER_DEFINED: "user_defined",
              UNUSED: "unused", BYTE: "byte"}
# TrainerSpec.ModelType
MODEL_TYPES = {1: "unigram", 2: "bpe", 3: "word", 4: "char"}
UNIGRAM, BPE = 1, 2

_PIECES, TRAINER_SPEC, NORMALIZER_SPEC = 1, 2, 3  # ModelProto field numbers
_VARINT, _I64, _LEN, _I32 = 0, 1, 2, 5  # protobuf wire types


# ---------------------------------------------------------------------------------------------
# protobuf wire format


class _WireError(ValueError):
    """The bytes are not a well-formed protobuf message."""


def _read_varint(buf: bytes, pos: int) -> tuple[int, int]:
    value, shift = 0, 0
    while True:
        if pos >= len(buf) or shift > 63:
            raise _WireError("truncated varint")
        byte = buf[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return value, pos
        shift += 7


def _varint(value: int) -> bytes:
    value &= (1 << 64) - 1  # negative int32/int64 are sent as 10-byte two's complement
    out = bytearray()
    while True:
        low = value & 0x7F
        value >>= 7
        if value:
            out.append(low | 0x80)
        else:
            out.append(low)
            return bytes(out)


def _iter_fields(buf: bytes) -> Iterator[tuple[int, int, int | bytes, bytes]]:
    """Yield (field number, wire type, value, raw bytes of the whole field) in file order.

    value is an int for varints and the payload bytes otherwise.
    """
    pos = 0
    while pos < len(buf):
        start = pos
        key, pos = _read_varint(buf, pos)
        number, wire = key >> 3, key & 7
        if number == 0:
            raise _WireError("field number 0")
        if wire == _VARINT:
            value, pos = _read_varint(buf, pos)
        elif wire in (_I64, _I32):
            size = 8 if wire == _I64 else 4
            if pos + size > len(buf):
                raise _WireError("truncated fixed-width field")
            value, pos = buf[pos:pos + size], pos + size
        elif wire == _LEN:
            size, pos = _read_varint(buf, pos)
            if pos + size > len(buf):
                raise _WireError("length runs past the end")
            value, pos = buf[pos:pos + size], pos + size
        else:
            raise _WireError(f"unsupported wire type {wire}")
        yield number, wire, value, buf[start:pos]


def _len_field(number: int, payload: bytes) -> bytes:
    return _varint(number << 3 | _LEN) + _varint(len(payload)) + payload


def _varint_field(number: int, value: int) -> bytes:
    return _varint(number << 3 | _VARINT) + _varint(value)


def float32(value: float) -> float:
    """Round to the float32 the file can hold, so comparisons see what will be written."""
    return struct.unpack("<f", struct.pack("<f", value))[0]


# ---------------------------------------------------------------------------------------------
# ModelProto


@dataclass(frozen=True)
class Piece:
    """One vocabulary entry; its id is its position in `SpmModel.pieces`."""

    text: str
    score: float
    kind: int = NORMAL
    # The message as read, reused on write while text/score/kind still match, so base pieces stay
    # byte-identical (including an explicit default type or extension fields).
    raw: bytes = field(default=b"", repr=False, compare=False)

    def encode(self) -> bytes:
        if self.raw and _decode_piece(self.raw) == self:
            return self.raw
        out = _len_field(1, self.text.encode("utf-8")) + bytes([2 << 3 | _I32]) + struct.pack("<f", self.score)
        if self.kind != NORMAL:  # NORMAL is the default; spm's trainer leaves it unset too
            out += _varint_field(3, self.kind)
        return out


def _decode_piece(raw: bytes) -> Piece:
    text, score, kind = None, 0.0, NORMAL
    for number, wire, value, _ in _iter_fields(raw):
        if number == 1 and wire == _LEN:
            text = value.decode("utf-8")
        elif number == 2 and wire == _I32:
            score = struct.unpack("<f", value)[0]
        elif number == 3 and wire == _VARINT:
            kind = value
    if text is None:
        raise _WireError("a piece without text")
    if kind not in TYPE_NAMES:
        raise _WireError(f"piece {text!r} has unknown type {kind}")
    return Piece(text, score, kind, raw)


@dataclass
class SpmModel:
    """A SentencePiece model: its pieces plus every other top-level field, kept as raw bytes."""

    pieces: list[Piece]
    rest: list[bytes]  # raw top-level fields other than pieces, in file order

    def to_bytes(self) -> bytes:
        # Pieces first, as protobuf serializers order fields by number (pieces are field 1).
        return b"".join([_len_field(_PIECES, p.encode()) for p in self.pieces] + self.rest)

    def spec(self, number: int) -> dict[int, int | bytes]:
        """Fields of the trainer spec (2) or normalizer spec (3); the last occurrence wins, as in protobuf."""
        fields: dict[int, int | bytes] = {}
        for raw in self.rest:
            top, _, payload, _ = next(_iter_fields(raw))
            if top == number:
                fields.update((n, v) for n, _, v, _ in _iter_fields(payload))
        return fields

    def with_normalizer_flag(self, number: int, value: bool) -> SpmModel:
        """A copy whose normalizer spec has bool field `number` set (appended: last one wins)."""
        rest, done = [], False
        for raw in self.rest:
            top, _, payload, _ = next(_iter_fields(raw))
            if top == NORMALIZER_SPEC:
                raw, done = _len_field(top, payload + _varint_field(number, int(value))), True
            rest.append(raw)
        if not done:
            rest.append(_len_field(NORMALIZER_SPEC, _varint_field(number, int(value))))
        return SpmModel(list(self.pieces), rest)

    @property
    def model_type(self) -> int:
        return int(self.spec(TRAINER_SPEC).get(3, UNIGRAM))


def parse_model(data: bytes, source: str = "<bytes>") -> SpmModel:
    """Decode a .model file's bytes; UserError when they are not a SentencePiece model."""
    pieces, rest = [], []
    try:
        for number, wire, value, raw in _iter_fields(data):
            if number == _PIECES and wire == _LEN:
                pieces.append(_decode_piece(value))
            elif number in (TRAINER_SPEC, NORMALIZER_SPEC) and wire != _LEN:
                raise _WireError(f"field {number} has wire type {wire}")
            elif number in (TRAINER_SPEC, NORMALIZER_SPEC):
                # SpmModel.spec decodes these later, outside this try: a malformed one is said here, as one line
                rest.append(raw)
                for _ in _iter_fields(value):
                    pass
            else:
                rest.append(raw)
    except (_WireError, UnicodeDecodeError) as exc:
        raise UserError(f"{source}: not a SentencePiece model ({exc}); pass the tokenizer's .model file") from None
    if not pieces:
        raise UserError(f"{source}: not a SentencePiece model (no pieces); pass the tokenizer's .model file")
    return SpmModel(pieces, rest)


def read_model(path: Path) -> SpmModel:
    path = Path(path)
    missing = "pass an existing SentencePiece .model file"
    return parse_model(read_checked(path, MAX_TOKENIZER_BYTES, "tokenizer model", missing=missing), str(path))


def load_spm_file(path: Path | str, hint: str) -> spm.SentencePieceProcessor:
    """A SentencePiece .model file loaded by sentencepiece from its bytes, read through the bounded reader:
    a file past MAX_TOKENIZER_BYTES, a FIFO or a pseudo-file is one line before anything is read
    (sentencepiece's own `model_file=` reads a file of any size whole). `hint`: what to pass instead."""
    path = Path(path)
    return spm_from_bytes(path, read_checked(path, MAX_TOKENIZER_BYTES, "tokenizer", missing=hint), hint)


def spm_from_bytes(path: Path, raw: bytes, hint: str) -> spm.SentencePieceProcessor:
    """A SentencePiece model from a .model file's bytes (`path` names it in messages)."""
    if not raw:  # sentencepiece takes empty bytes for a model of no pieces, without a word
        raise UserError(f"{path}: an empty file, not a SentencePiece model; {hint}")
    try:
        return spm.SentencePieceProcessor(model_proto=raw)
    except RuntimeError:
        model = path.with_suffix(".model")
        if path.suffix == ".vocab" and model.is_file():  # the pieces' list written beside a model: a common slip
            hint = f"that is the list of pieces sentencepiece writes beside its model; pass {model}"
        raise UserError(f"{path}: not a SentencePiece model (sentencepiece cannot parse it); {hint}") from None


def vocab_text(model: SpmModel) -> str:
    """The .vocab file spm writes: `piece<TAB>score` per line (C++ ostream float format, like %g)."""
    return "".join(f"{p.text}\t{p.score:g}\n" for p in model.pieces)


def write_model(model: SpmModel, path: Path, *, force: bool = True) -> tuple[Path, list[Path]]:
    """Write `path` (.model) and the .vocab beside it, each atomically; returns the .vocab path and the files
    left as they were, already holding these bytes (text/outputs.py: without --force no other file is replaced)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    vocab = path.with_suffix(".vocab")
    kept = write_outputs([(path, model.to_bytes()), (vocab, vocab_text(model).encode("utf-8"))], force=force)
    return vocab, kept


def load_processor(model: SpmModel, source: str) -> spm.SentencePieceProcessor:
    """Load with sentencepiece itself: the check that matters is whether spm accepts the file."""
    try:
        return spm.SentencePieceProcessor(model_proto=model.to_bytes())
    except RuntimeError as exc:
        raise UserError(f"{source}: sentencepiece cannot load it ({exc})") from None
