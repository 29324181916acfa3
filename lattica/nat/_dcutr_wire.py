"""libp2p DCUtR's message (libp2p/specs ``relay/DCUtR.md``), sans-IO (issue 50): on
``/libp2p/dcutr``, ``HolePunch{type = 1 (CONNECT 100, SYNC 300), ObsAddrs = 2}`` behind a uvarint
length, at most 4 KiB. What we read keeps at most :data:`MAX_ADDRS` usable addresses (a peer that
names hundreds gets the first few probed, as our own hole punching does)."""

from __future__ import annotations

import enum
from dataclasses import dataclass

from lattica._multiaddr import Multiaddr
from lattica._protobuf import decode_fields, decode_repeated, encode_fields
from lattica.errors import CodecError, MultiaddrError, ProtocolError

__all__ = ["PROTOCOL", "MAX_MESSAGE", "MAX_ADDRS", "PunchType", "HolePunch", "encode", "decode"]

PROTOCOL = "/libp2p/dcutr"
MAX_MESSAGE = 4096
MAX_ADDRS = 16


class PunchType(enum.IntEnum):
    CONNECT = 100
    SYNC = 300


_TYPES = frozenset(int(t) for t in PunchType)


@dataclass(frozen=True)
class HolePunch:
    type: PunchType
    addrs: tuple[Multiaddr, ...] = ()


def encode(msg: HolePunch) -> bytes:
    fields: list[tuple[int, int | bytes]] = [(1, int(msg.type))]
    fields += [(2, a.to_bytes()) for a in msg.addrs]
    data = encode_fields(fields)
    if len(data) > MAX_MESSAGE:
        raise ValueError(f"a DCUtR message of {len(data)} bytes (at most {MAX_MESSAGE})")
    return data


def decode(data: bytes) -> HolePunch:
    """A peer's message; ProtocolError if over the cap, malformed or of an unknown type."""
    if len(data) > MAX_MESSAGE:
        raise ProtocolError(f"a DCUtR message of {len(data)} bytes (at most {MAX_MESSAGE})")
    try:
        kind = decode_fields(data).get(1)
        if not isinstance(kind, int) or kind not in _TYPES:
            raise ProtocolError(f"unknown DCUtR message type {kind!r}")
        addrs: list[Multiaddr] = []
        for raw in decode_repeated(data, 2):
            try:
                addrs.append(Multiaddr.from_bytes(raw))
            except (MultiaddrError, CodecError):
                continue  # (one we cannot use: skipped, not counted)
            if len(addrs) == MAX_ADDRS:
                break
        return HolePunch(PunchType(kind), tuple(addrs))
    except ValueError as e:
        raise ProtocolError(f"malformed DCUtR message: {e}") from None
