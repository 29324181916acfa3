"""The values a Lattica SDK swarm keeps in its Kademlia (issue 49), sans-IO: bincode 2 (standard
configuration) of ``ValueWithTime{value: Vec<u8>, expiration_time: f64}``, i.e. the value's length
as bincode's varint (one byte below 251; 251, 252, 253 then a u16, u32, u64, little-endian), the
bytes, then the expiration in unix seconds as a little-endian f64. The SDK's Python layer pickles
what it stores; its raw calls and ours exchange bytes, and we never unpickle.
"""

from __future__ import annotations

import math
import struct

from lattica.errors import CodecError

__all__ = ["encode_value", "decode_value"]

_F64 = struct.Struct("<d")
_WIDTHS = {251: 2, 252: 4, 253: 8}


def _varint(n: int) -> bytes:
    if n < 251:
        return bytes((n,))
    for tag, width in _WIDTHS.items():
        if n < 1 << (8 * width):
            return bytes((tag,)) + n.to_bytes(width, "little")
    raise ValueError("a length beyond u64")


def encode_value(value: bytes, expiration: float) -> bytes:
    """``value`` as the SDK stores it, to expire at ``expiration`` (unix seconds)."""
    return _varint(len(value)) + bytes(value) + _F64.pack(expiration)


def decode_value(raw: bytes) -> tuple[bytes, float]:
    """(value, expiration) from an SDK record's bytes; CodecError if they are not one."""
    if not raw:
        raise CodecError("an SDK value is empty")
    tag, pos = raw[0], 1
    if tag < 251:
        n = tag
    elif tag in _WIDTHS:
        width = _WIDTHS[tag]
        n = int.from_bytes(raw[1 : 1 + width], "little")
        pos += width
    else:
        raise CodecError(f"an SDK value's length tag {tag} is not bincode's")
    if len(raw) != pos + n + 8:
        raise CodecError(f"an SDK value of {len(raw)} bytes does not hold {n} bytes and an expiration")
    (expiration,) = _F64.unpack_from(raw, pos + n)
    if not math.isfinite(expiration):
        raise CodecError("an SDK value's expiration is not a finite number")
    return raw[pos : pos + n], expiration
