"""libp2p AutoNAT v2's messages (libp2p/specs ``autonat/autonat-v2.md``), sans-IO.

``/libp2p/autonat/2/dial-request`` carries ``Message`` (one of DialRequest, DialResponse,
DialDataRequest, DialDataResponse); ``/libp2p/autonat/2/dial-back`` carries ``DialBack`` one way
and ``DialBackResponse`` the other. Each is a uvarint length and a protobuf; the nonce is a
fixed64. What we read is bounded: 8 KiB a message, 16 usable addresses a request, 4,096 bytes of
dial data a message (the spec's cap).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from lattica._multiaddr import Multiaddr
from lattica._protobuf import decode_fields, decode_repeated, encode_fields, fixed64
from lattica.errors import CodecError, MultiaddrError, ProtocolError

__all__ = [
    "DIAL_REQUEST",
    "DIAL_BACK",
    "MAX_MESSAGE",
    "MAX_DIAL_DATA",
    "DialStatus",
    "ResponseStatus",
    "DialRequest",
    "DialResponse",
    "DialDataRequest",
    "DialDataResponse",
    "encode",
    "decode",
    "encode_dial_back",
    "decode_dial_back",
    "DIAL_BACK_OK",
    "dialable",
    "transport_of",
]

DIAL_REQUEST = "/libp2p/autonat/2/dial-request"
DIAL_BACK = "/libp2p/autonat/2/dial-back"
MAX_MESSAGE = 8192
MAX_ADDRS = 16
MAX_DIAL_DATA = 4096  # bytes of data in one DialDataResponse
DIAL_BACK_OK = encode_fields([(1, 0)])  # DialBackResponse{status: OK} (proto3 would leave the 0 out)


class DialStatus(enum.IntEnum):
    UNUSED = 0
    E_DIAL_ERROR = 100
    E_DIAL_BACK_ERROR = 101
    OK = 200


class ResponseStatus(enum.IntEnum):
    E_INTERNAL_ERROR = 0
    E_REQUEST_REJECTED = 100
    E_DIAL_REFUSED = 101
    OK = 200


@dataclass(frozen=True)
class DialRequest:
    addrs: tuple[Multiaddr, ...]
    nonce: int


@dataclass(frozen=True)
class DialResponse:
    status: ResponseStatus
    addr_idx: int = 0
    dial_status: DialStatus = DialStatus.UNUSED


@dataclass(frozen=True)
class DialDataRequest:
    addr_idx: int
    num_bytes: int


@dataclass(frozen=True)
class DialDataResponse:
    data: bytes


Message = DialRequest | DialResponse | DialDataRequest | DialDataResponse


def transport_of(addr: Multiaddr) -> str | None:
    """The transport an AutoNAT dial-back to ``addr`` takes ("tcp" or "quic"), None if it is no
    address AutoNAT dials (TCP or QUIC v1 straight over IPv4 or IPv6)."""
    p = addr.without_peer_id().protocols()
    if p in (["ip4", "tcp"], ["ip6", "tcp"]):
        return "tcp"
    if p in (["ip4", "udp", "quic-v1"], ["ip6", "udp", "quic-v1"]):
        return "quic"
    return None


def dialable(addr: Multiaddr) -> bool:
    """Whether AutoNAT (ours or libp2p's, client or server) deals with ``addr`` at all."""
    return transport_of(addr) is not None


def encode(msg: Message) -> bytes:
    """A ``Message`` with ``msg`` set."""
    if isinstance(msg, DialRequest):
        inner = encode_fields([(1, a.to_bytes()) for a in msg.addrs]) + fixed64(2, msg.nonce)
        return encode_fields([(1, inner)])
    if isinstance(msg, DialResponse):
        fields: list[tuple[int, int | bytes]] = [(1, int(msg.status)), (2, msg.addr_idx), (3, int(msg.dial_status))]
        return encode_fields([(2, encode_fields(fields))])
    if isinstance(msg, DialDataRequest):
        return encode_fields([(3, encode_fields([(1, msg.addr_idx), (2, msg.num_bytes)]))])
    return encode_fields([(4, encode_fields([(1, msg.data)]))])


def _int(f: dict[int, int | bytes], n: int) -> int:
    v = f.get(n, 0)
    if not isinstance(v, int):
        raise ProtocolError("an AutoNAT v2 number field holds bytes")
    return v


def decode(data: bytes) -> Message:
    """A peer's ``Message``; ProtocolError if over the cap, malformed, or of a kind we do not know."""
    if len(data) > MAX_MESSAGE:
        raise ProtocolError(f"an AutoNAT v2 message of {len(data)} bytes (at most {MAX_MESSAGE})")
    try:
        outer = decode_fields(data)
        kinds = [n for n in (1, 2, 3, 4) if n in outer]
        if len(kinds) != 1 or not isinstance(outer[kinds[0]], bytes):
            raise ProtocolError("an AutoNAT v2 message holds exactly one of its kinds")
        raw = outer[kinds[0]]
        assert isinstance(raw, bytes)
        if kinds[0] == 1:
            f = decode_fields(raw, fixed=True)
            nonce = f.get(2)
            if not isinstance(nonce, int):
                raise ProtocolError("a DialRequest without its nonce")
            addrs: list[Multiaddr] = []
            for a in decode_repeated(raw, 1, fixed=True):
                try:
                    addrs.append(Multiaddr.from_bytes(a))
                except (MultiaddrError, CodecError):
                    continue  # (one we cannot use: skipped, not counted)
                if len(addrs) == MAX_ADDRS:
                    break
            return DialRequest(tuple(addrs), nonce)
        f = decode_fields(raw)
        if kinds[0] == 2:
            status, dial = _int(f, 1), _int(f, 3)
            if status not in ResponseStatus.__members__.values() or dial not in DialStatus.__members__.values():
                raise ProtocolError(f"an AutoNAT v2 response with an unknown status ({status}, {dial})")
            return DialResponse(ResponseStatus(status), _int(f, 2), DialStatus(dial))
        if kinds[0] == 3:
            return DialDataRequest(_int(f, 1), _int(f, 2))
        data_ = f.get(1, b"")
        if not isinstance(data_, bytes) or len(data_) > MAX_DIAL_DATA:
            raise ProtocolError(f"dial data comes in messages of at most {MAX_DIAL_DATA} bytes")
        return DialDataResponse(data_)
    except ValueError as e:  # (the protobuf reader's)
        raise ProtocolError(f"malformed AutoNAT v2 message: {e}") from None


def encode_dial_back(nonce: int) -> bytes:
    return fixed64(1, nonce)


def decode_dial_back(data: bytes) -> int:
    """The nonce of a ``DialBack``; ProtocolError if it has none (its only field, a fixed64)."""
    if data[:1] != b"\x09":
        raise ProtocolError("an AutoNAT v2 dial-back starts with its fixed64 nonce")
    try:
        nonce = decode_fields(data, fixed=True).get(1)
    except ValueError as e:
        raise ProtocolError(f"malformed AutoNAT v2 dial-back: {e}") from None
    if not isinstance(nonce, int) or len(data) > 64:
        raise ProtocolError("an AutoNAT v2 dial-back carries its nonce only")
    return nonce
