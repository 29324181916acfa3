"""Unsigned varints and the few protobuf messages libp2p formats need (keys, Noise payloads).

Only length-delimited (wire type 2) and varint (wire type 0) fields are supported, which covers
every message Lattica reads; anything else is a ValueError for the caller to translate.
"""

from __future__ import annotations


def uvarint(n: int) -> bytes:
    """Encode a non-negative integer as an unsigned LEB128 varint."""
    out = bytearray()
    while True:
        b = n & 0x7F
        n >>= 7
        if not n:
            out.append(b)
            return bytes(out)
        out.append(b | 0x80)


def read_uvarint(buf: bytes, pos: int) -> tuple[int, int]:
    """Decode a varint at ``pos``; return (value, next position). ValueError if truncated."""
    n = shift = 0
    while True:
        if pos >= len(buf) or shift > 63:
            raise ValueError("truncated varint")
        b = buf[pos]
        pos += 1
        n |= (b & 0x7F) << shift
        if not b & 0x80:
            return n, pos
        shift += 7


def encode_fields(fields: list[tuple[int, int | bytes]]) -> bytes:
    """Encode (field number, value) pairs: ints as varints, bytes as length-delimited."""
    out = bytearray()
    for number, value in fields:
        if isinstance(value, int):
            out += uvarint(number << 3) + uvarint(value)
        else:
            out += uvarint(number << 3 | 2) + uvarint(len(value)) + value
    return bytes(out)


def decode_fields(buf: bytes) -> dict[int, int | bytes]:
    """Decode a message into {field number: value} (last one wins). ValueError if malformed."""
    fields: dict[int, int | bytes] = {}
    pos = 0
    while pos < len(buf):
        tag, pos = read_uvarint(buf, pos)
        wire = tag & 7
        if wire == 0:
            fields[tag >> 3], pos = read_uvarint(buf, pos)
        elif wire == 2:
            n, pos = read_uvarint(buf, pos)
            if pos + n > len(buf):
                raise ValueError("truncated length-delimited field")
            fields[tag >> 3] = bytes(buf[pos : pos + n])
            pos += n
        else:
            raise ValueError(f"unsupported protobuf wire type {wire}")
    return fields


def decode_repeated(buf: bytes, number: int) -> list[bytes]:
    """Every length-delimited value of field ``number`` (a repeated field), in order. ValueError if
    the message is malformed."""
    out = []
    pos = 0
    while pos < len(buf):
        tag, pos = read_uvarint(buf, pos)
        wire = tag & 7
        if wire == 0:
            _, pos = read_uvarint(buf, pos)
        elif wire == 2:
            n, pos = read_uvarint(buf, pos)
            if pos + n > len(buf):
                raise ValueError("truncated length-delimited field")
            if tag >> 3 == number:
                out.append(bytes(buf[pos : pos + n]))
            pos += n
        else:
            raise ValueError(f"unsupported protobuf wire type {wire}")
    return out
