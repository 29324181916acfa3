"""libp2p circuit relay v2's messages (libp2p/specs ``relay/circuit-v2.md``), sans-IO.
``/libp2p/circuit/relay/0.2.0/hop`` carries :class:`HopMessage` (RESERVE,
CONNECT, STATUS) and ``/stop`` carries :class:`StopMessage` (CONNECT, STATUS), each a uvarint
length and a protobuf of at most :data:`MAX_MESSAGE` bytes. A reservation's voucher is a signed
envelope (domain ``libp2p-relay-rsvp``, payload type 0x0302) of ``Voucher{relay, peer,
expiration}``, made and checked with :mod:`lattica._envelope`.

What we read is bounded (4 KiB a message, 16 addresses a peer or reservation; addresses we cannot
use are skipped, not counted); an unknown type or status is a ProtocolError.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from lattica._envelope import open_envelope, seal
from lattica._identity import KeyPair, PeerId
from lattica._multiaddr import Multiaddr
from lattica._protobuf import decode_fields, decode_repeated, encode_fields
from lattica.errors import CodecError, InvalidPeerId, MultiaddrError, ProtocolError

__all__ = [
    "HOP",
    "STOP",
    "MAX_MESSAGE",
    "HopType",
    "StopType",
    "Status",
    "Limit",
    "RelayPeer",
    "Reservation",
    "HopMessage",
    "StopMessage",
    "encode_hop",
    "decode_hop",
    "encode_stop",
    "decode_stop",
    "make_voucher",
    "open_voucher",
]

HOP = "/libp2p/circuit/relay/0.2.0/hop"
STOP = "/libp2p/circuit/relay/0.2.0/stop"
MAX_MESSAGE = 4096
MAX_ADDRS = 16
VOUCHER_DOMAIN = "libp2p-relay-rsvp"
VOUCHER_TYPE = b"\x03\x02"  # the multicodec libp2p-relay-rsvp


class HopType(enum.IntEnum):
    RESERVE = 0
    CONNECT = 1
    STATUS = 2


class StopType(enum.IntEnum):
    CONNECT = 0
    STATUS = 1


class Status(enum.IntEnum):
    OK = 100
    RESERVATION_REFUSED = 200
    RESOURCE_LIMIT_EXCEEDED = 201
    PERMISSION_DENIED = 202
    CONNECTION_FAILED = 203
    NO_RESERVATION = 204
    MALFORMED_MESSAGE = 400
    UNEXPECTED_MESSAGE = 401


@dataclass(frozen=True)
class Limit:
    """What a relayed connection may carry: seconds and bytes (each direction); 0 is no limit."""

    duration: int = 0
    data: int = 0


@dataclass(frozen=True)
class RelayPeer:
    peer: PeerId
    addrs: tuple[Multiaddr, ...] = ()


@dataclass(frozen=True)
class Reservation:
    """A relay's answer to RESERVE: until when (unix seconds), the relay's addresses to advertise
    (each followed by ``/p2p-circuit``), and its voucher (an envelope, checked on its own)."""

    expire: int = 0
    addrs: tuple[Multiaddr, ...] = ()
    voucher: bytes = b""


@dataclass(frozen=True)
class HopMessage:
    type: HopType
    peer: RelayPeer | None = None
    reservation: Reservation | None = None
    limit: Limit | None = None
    status: Status | None = None


@dataclass(frozen=True)
class StopMessage:
    type: StopType
    peer: RelayPeer | None = None
    limit: Limit | None = None
    status: Status | None = None


Fields = list[tuple[int, int | bytes]]
_HOP_TYPES = frozenset(int(t) for t in HopType)
_STOP_TYPES = frozenset(int(t) for t in StopType)
_STATUSES = frozenset(int(s) for s in Status)


def _encode_peer(p: RelayPeer) -> bytes:
    fields: Fields = [(1, p.peer.to_bytes())]
    fields += [(2, a.to_bytes()) for a in p.addrs]
    return encode_fields(fields)


def _encode_limit(limit: Limit) -> bytes:
    fields: Fields = []
    if limit.duration:
        fields.append((1, limit.duration))
    if limit.data:
        fields.append((2, limit.data))
    return encode_fields(fields)


def encode_hop(msg: HopMessage) -> bytes:
    fields: Fields = [(1, int(msg.type))]
    if msg.peer is not None:
        fields.append((2, _encode_peer(msg.peer)))
    if msg.reservation is not None:
        r = msg.reservation
        inner: Fields = [(1, r.expire)] + [(2, a.to_bytes()) for a in r.addrs]
        if r.voucher:
            inner.append((3, r.voucher))
        fields.append((3, encode_fields(inner)))
    if msg.limit is not None:
        fields.append((4, _encode_limit(msg.limit)))
    if msg.status is not None:
        fields.append((5, int(msg.status)))
    return _checked(encode_fields(fields))


def encode_stop(msg: StopMessage) -> bytes:
    fields: Fields = [(1, int(msg.type))]
    if msg.peer is not None:
        fields.append((2, _encode_peer(msg.peer)))
    if msg.limit is not None:
        fields.append((3, _encode_limit(msg.limit)))
    if msg.status is not None:
        fields.append((4, int(msg.status)))
    return _checked(encode_fields(fields))


def _checked(data: bytes) -> bytes:
    if len(data) > MAX_MESSAGE:
        raise ValueError(f"a relay message of {len(data)} bytes (at most {MAX_MESSAGE})")
    return data


def _addrs(raw: bytes, number: int) -> tuple[Multiaddr, ...]:
    out: list[Multiaddr] = []
    for a in decode_repeated(raw, number):
        try:
            out.append(Multiaddr.from_bytes(a))
        except (MultiaddrError, CodecError):
            continue
        if len(out) == MAX_ADDRS:
            break
    return tuple(out)


def _peer(raw: object) -> RelayPeer | None:
    if raw is None:
        return None
    if not isinstance(raw, bytes):
        raise ProtocolError("a relay message's peer must be a message")
    f = decode_fields(raw)
    pid = f.get(1)
    if not isinstance(pid, bytes):
        raise ProtocolError("a relay message's peer has no id")
    try:
        return RelayPeer(PeerId.from_bytes(pid), _addrs(raw, 2))
    except InvalidPeerId as e:
        raise ProtocolError(f"a relay message names no valid peer: {e}") from None


def _limit(raw: object) -> Limit | None:
    if raw is None:
        return None
    if not isinstance(raw, bytes):
        raise ProtocolError("a relay limit must be a message")
    f = decode_fields(raw)
    duration, data = f.get(1, 0), f.get(2, 0)
    if not isinstance(duration, int) or not isinstance(data, int):
        raise ProtocolError("a relay limit holds numbers")
    return Limit(duration, data)


def _status(raw: object) -> Status | None:
    if raw is None:
        return None
    if not isinstance(raw, int) or raw not in _STATUSES:
        raise ProtocolError(f"unknown relay status {raw!r}")
    return Status(raw)


def _fields(data: bytes) -> dict[int, int | bytes]:
    if len(data) > MAX_MESSAGE:
        raise ProtocolError(f"a relay message of {len(data)} bytes (at most {MAX_MESSAGE})")
    return decode_fields(data)


def decode_hop(data: bytes) -> HopMessage:
    """A peer's hop message; ProtocolError if over the cap, malformed or of an unknown type."""
    try:
        f = _fields(data)
        kind = f.get(1)
        if not isinstance(kind, int) or kind not in _HOP_TYPES:
            raise ProtocolError(f"unknown hop message type {kind!r}")
        reservation = None
        raw = f.get(3)
        if raw is not None:
            if not isinstance(raw, bytes):
                raise ProtocolError("a reservation must be a message")
            r = decode_fields(raw)
            expire, voucher = r.get(1, 0), r.get(3, b"")
            if not isinstance(expire, int) or not isinstance(voucher, bytes):
                raise ProtocolError("a reservation holds an expiry and a voucher")
            reservation = Reservation(expire, _addrs(raw, 2), voucher)
        return HopMessage(HopType(kind), _peer(f.get(2)), reservation, _limit(f.get(4)), _status(f.get(5)))
    except ValueError as e:  # (the protobuf reader's)
        raise ProtocolError(f"malformed hop message: {e}") from None


def decode_stop(data: bytes) -> StopMessage:
    """A relay's stop message; ProtocolError if over the cap, malformed or of an unknown type."""
    try:
        f = _fields(data)
        kind = f.get(1)
        if not isinstance(kind, int) or kind not in _STOP_TYPES:
            raise ProtocolError(f"unknown stop message type {kind!r}")
        return StopMessage(StopType(kind), _peer(f.get(2)), _limit(f.get(3)), _status(f.get(4)))
    except ValueError as e:
        raise ProtocolError(f"malformed stop message: {e}") from None


def make_voucher(relay: KeyPair, peer: PeerId, expiration: int) -> bytes:
    """The relay's signed voucher that it serves ``peer`` until ``expiration`` (unix seconds)."""
    payload = encode_fields([(1, relay.peer_id.to_bytes()), (2, peer.to_bytes()), (3, expiration)])
    return seal(relay, VOUCHER_DOMAIN, VOUCHER_TYPE, payload)


def open_voucher(data: bytes, relay: PeerId, peer: PeerId) -> int:
    """The expiration a voucher from ``relay`` for ``peer`` states; ProtocolError if it is not
    validly signed by the relay, or names other peers."""
    opened = open_envelope(data, VOUCHER_DOMAIN, VOUCHER_TYPE)
    if opened.signer != relay:
        raise ProtocolError("a relay voucher signed by another peer than the relay")
    try:
        f = decode_fields(opened.payload)
    except ValueError as e:
        raise ProtocolError(f"malformed relay voucher: {e}") from None
    if f.get(1) != relay.to_bytes() or f.get(2) != peer.to_bytes():
        raise ProtocolError("a relay voucher for another relay or peer")
    expiration = f.get(3)
    if not isinstance(expiration, int):
        raise ProtocolError("a relay voucher without an expiration")
    return expiration
