"""Unsigned varints and the few protobuf messages libp2p formats need (keys, Noise payloads).

Varint (wire type 0) and length-delimited (2) fields are read, which covers every message Lattica
reads but one; fixed 64- and 32-bit fields (1, 5: AutoNAT v2's nonce) only where the caller says
its message has them (``fixed=True``: read as unsigned little-endian integers; elsewhere a field
of the wrong width must not pass for a varint). Anything else is a ValueError for the caller.
"""

from __future__ import annotations

from collections.abc import Iterator


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


_FIXED = {1: 8, 5: 4}  # wire type -> bytes of a fixed64, fixed32


def _field(buf: bytes, pos: int, fixed: bool) -> tuple[int, int, int | bytes, int]:
    """The field at ``pos``: (number, wire type, value, next position). ValueError if malformed."""
    tag, pos = read_uvarint(buf, pos)
    wire = tag & 7
    if wire == 0:
        value, pos = read_uvarint(buf, pos)
        return tag >> 3, wire, value, pos
    if wire == 2:
        n, pos = read_uvarint(buf, pos)
        if pos + n > len(buf):
            raise ValueError("truncated length-delimited field")
        return tag >> 3, wire, bytes(buf[pos : pos + n]), pos + n
    size = _FIXED.get(wire) if fixed else None
    if size is None:
        raise ValueError(f"unsupported protobuf wire type {wire}")
    if pos + size > len(buf):
        raise ValueError("truncated fixed-width field")
    return tag >> 3, wire, int.from_bytes(buf[pos : pos + size], "little"), pos + size


def decode_fields(buf: bytes, fixed: bool = False) -> dict[int, int | bytes]:
    """Decode a message into {field number: value} (last one wins). ValueError if malformed."""
    fields: dict[int, int | bytes] = {}
    pos = 0
    while pos < len(buf):
        number, _, value, pos = _field(buf, pos, fixed)
        fields[number] = value
    return fields


def iter_fields(buf: bytes, fixed: bool = False) -> Iterator[tuple[int, int | bytes]]:
    """Each field of a message in order, as (number, value), read as it is asked for (a caller
    that has what it needs stops reading). ValueError where the message is malformed."""
    pos = 0
    while pos < len(buf):
        number, _, value, pos = _field(buf, pos, fixed)
        yield number, value


def decode_repeated(buf: bytes, number: int, fixed: bool = False) -> list[bytes]:
    """Every length-delimited value of field ``number`` (a repeated field), in order. ValueError if
    the message is malformed."""
    out = []
    pos = 0
    while pos < len(buf):
        n, _, value, pos = _field(buf, pos, fixed)
        if n == number and isinstance(value, bytes):
            out.append(value)
    return out


def fixed64(number: int, value: int) -> bytes:
    """One fixed64 field (unsigned, little-endian), to append to ``encode_fields``' output."""
    return uvarint(number << 3 | 1) + value.to_bytes(8, "little")
