"""libp2p AutoNAT v1's messages (libp2p/specs ``autonat/autonat-v1.md``, go-libp2p
``p2p/host/autonat/pb/autonat.proto``), sans-IO.

``/libp2p/autonat/1.0.0`` carries one uvarint-length protobuf (proto2) ``Message`` each way::

    Message { type = 1 (DIAL = 0, DIAL_RESPONSE = 1),
              dial = 2 { peer = 1 { id = 1, addrs = 2 (repeated bytes) } },
              dialResponse = 3 { status = 1, statusText = 2, addr = 3 } }

with ``status`` OK = 0, E_DIAL_ERROR = 100, E_DIAL_REFUSED = 101, E_BAD_REQUEST = 200,
E_INTERNAL_ERROR = 300. What we read is bounded: 8 KiB a message, 16 usable addresses, a status
text of 256 characters. Anything malformed is a ProtocolError, never another exception.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from lattica._multiaddr import Multiaddr
from lattica._protobuf import decode_fields, decode_repeated, encode_fields
from lattica.errors import CodecError, MultiaddrError, ProtocolError

__all__ = ["PROTOCOL", "MAX_MESSAGE", "MAX_ADDRS", "Status", "Dial", "DialResponse", "encode", "decode"]

PROTOCOL = "/libp2p/autonat/1.0.0"
MAX_MESSAGE = 8192
MAX_ADDRS = 16  # usable addresses read from a request (the rest are not looked at)
MAX_TEXT = 256  # characters of a status text kept
_DIAL, _DIAL_RESPONSE = 0, 1


class Status(enum.IntEnum):
    OK = 0
    E_DIAL_ERROR = 100
    E_DIAL_REFUSED = 101
    E_BAD_REQUEST = 200
    E_INTERNAL_ERROR = 300


@dataclass(frozen=True)
class Dial:
    """A request: dial ``peer_id`` (the requester's own, as its bytes) at ``addrs``."""

    peer_id: bytes
    addrs: tuple[Multiaddr, ...]


@dataclass(frozen=True)
class DialResponse:
    status: Status
    text: str = ""
    addr: Multiaddr | None = None  # the address that worked (with OK)


Message = Dial | DialResponse


def encode(msg: Message) -> bytes:
    if isinstance(msg, Dial):
        peer = encode_fields([(1, msg.peer_id), *((2, a.to_bytes()) for a in msg.addrs)])
        return encode_fields([(1, _DIAL), (2, encode_fields([(1, peer)]))])
    fields: list[tuple[int, int | bytes]] = [(1, int(msg.status))]
    if msg.text:
        fields.append((2, msg.text.encode()))
    if msg.addr is not None:
        fields.append((3, msg.addr.to_bytes()))
    return encode_fields([(1, _DIAL_RESPONSE), (3, encode_fields(fields))])


def _sub(f: dict[int, int | bytes], n: int, what: str) -> bytes:
    v = f.get(n)
    if not isinstance(v, bytes):
        raise ProtocolError(f"an AutoNAT v1 message without its {what}")
    return v


def decode(data: bytes) -> Message:
    """A peer's ``Message``; ProtocolError if over the cap, malformed or incomplete."""
    if len(data) > MAX_MESSAGE:
        raise ProtocolError(f"an AutoNAT v1 message of {len(data)} bytes (at most {MAX_MESSAGE})")
    try:
        outer = decode_fields(data)
        kind = outer.get(1, _DIAL)  # (proto2's default: DIAL)
        if kind == _DIAL:
            raw_peer = _sub(decode_fields(_sub(outer, 2, "dial")), 1, "peer")
            peer = decode_fields(raw_peer)
            addrs: list[Multiaddr] = []
            for raw in decode_repeated(raw_peer, 2):
                try:
                    addrs.append(Multiaddr.from_bytes(raw))
                except (MultiaddrError, CodecError):
                    continue  # (one we cannot use: skipped, not counted)
                if len(addrs) == MAX_ADDRS:
                    break
            pid = peer.get(1, b"")
            if not isinstance(pid, bytes):
                raise ProtocolError("an AutoNAT v1 peer id that is not bytes")
            return Dial(pid, tuple(addrs))
        if kind != _DIAL_RESPONSE:
            raise ProtocolError(f"an AutoNAT v1 message of unknown type ({kind!r})")
        f = decode_fields(_sub(outer, 3, "dialResponse"))
        status, text, addr = f.get(1, 0), f.get(2, b""), f.get(3)
        if not isinstance(status, int) or status not in Status.__members__.values():
            raise ProtocolError(f"an AutoNAT v1 response with an unknown status ({status!r})")
        if not isinstance(text, bytes) or (addr is not None and not isinstance(addr, bytes)):
            raise ProtocolError("an AutoNAT v1 response's text and address are bytes")
        try:
            where = Multiaddr.from_bytes(addr) if addr else None
        except (MultiaddrError, CodecError) as e:
            raise ProtocolError(f"an AutoNAT v1 response with a malformed address: {e}") from None
        return DialResponse(Status(status), text.decode("utf-8", "replace")[:MAX_TEXT], where)
    except ValueError as e:  # (the protobuf reader's; MultiaddrError and CodecError are caught above)
        raise ProtocolError(f"malformed AutoNAT v1 message: {e}") from None
