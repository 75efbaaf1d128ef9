"""A SentencePiece model file written by hand (the protobuf wire format, a handful of fields), so tests can
run the real sentencepiece library on a vocabulary taken from a GGUF without depending on protobuf."""

from __future__ import annotations

import struct

UNIGRAM = 1


def _varint(value: int) -> bytes:
    out = bytearray()
    while True:
        byte, value = value & 0x7F, value >> 7
        out.append(byte | (0x80 if value else 0))
        if not value:
            return bytes(out)


def _field(number: int, payload: bytes) -> bytes:  # length-delimited (strings, bytes, messages)
    return _varint(number << 3 | 2) + _varint(len(payload)) + payload


def _int(number: int, value: int) -> bytes:
    return _varint(number << 3) + _varint(value)


def model_proto(
    pieces: list[tuple[str, float, int]],
    *,
    model_type: int,
    unk_id: int,
    charsmap: bytes | None,
    add_dummy_prefix: bool,
    remove_extra_whitespaces: bool,
) -> bytes:
    """ModelProto: pieces (1), trainer_spec (2: model_type 3, unk_id 40), normalizer_spec (3)."""
    body = b"".join(
        _field(
            1,
            _field(1, text.encode("utf-8")) + _varint(2 << 3 | 5) + struct.pack("<f", score) + _int(3, kind),
        )
        for text, score, kind in pieces
    )
    trainer = _int(3, model_type) + _int(40, unk_id)
    normalizer = (
        _field(1, b"nmt_nfkc" if charsmap else b"identity")
        + (_field(2, charsmap) if charsmap else b"")
        + _int(3, add_dummy_prefix)
        + _int(4, remove_extra_whitespaces)
        + _int(5, 1)  # escape_whitespaces
    )
    return body + _field(2, trainer) + _field(3, normalizer)
