"""libp2p rendezvous's messages (libp2p/specs ``rendezvous/README.md``, rust-libp2p
``protocols/rendezvous/src/generated/rpc.proto``), sans-IO.

``/rendezvous/1.0.0`` carries uvarint-length protobuf (proto2) ``Message``s: a request, then its
answer (none for an UNREGISTER). Our client and rust-libp2p's send one request a stream (rust runs
it over request-response); js's sends a REGISTER and a DISCOVER on one, which our point serves::

    Message { type = 1 (REGISTER 0, REGISTER_RESPONSE 1, UNREGISTER 2, DISCOVER 3, DISCOVER_RESPONSE 4),
              register = 2 { ns = 1, signedPeerRecord = 2, ttl = 3 },
              registerResponse = 3 { status = 1, statusText = 2, ttl = 3 },
              unregister = 4 { ns = 1, id = 2 },
              discover = 5 { ns = 1, limit = 2, cookie = 3 },
              discoverResponse = 6 { registrations = 1 (repeated Register), cookie = 2,
                                     status = 3, statusText = 4 } }

Fields are written in field-number order and only when set, as rust's prost codec writes them.
Read as proto2 reads them: an absent ``type`` or ``status`` is its enum's first value (``REGISTER``,
``OK``), which is how the npm ``@canvas-js/libp2p-rendezvous`` (protons, proto3 rules) sends them:
it writes no field that holds 0. rust-libp2p refuses such messages; the spec's proto2 does not.
What we read is bounded by the caller (a request: :data:`MAX_REQUEST`; an answer:
:data:`MAX_MESSAGE`, rust's cap). A message we cannot read is :class:`BadMessage`, which says,
when the request's type is known, which status the server answers it with.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import TYPE_CHECKING, NamedTuple

from lattica._protobuf import decode_fields, decode_repeated, encode_fields
from lattica.errors import ProtocolError

if TYPE_CHECKING:
    from lattica._identity import PeerId
    from lattica._multiaddr import Multiaddr

__all__ = [
    "PROTOCOL",
    "MAX_MESSAGE",
    "MAX_REQUEST",
    "MAX_NAMESPACE",
    "MAX_RECORD",
    "MAX_TEXT",
    "DEFAULT_TTL",
    "MIN_TTL",
    "MAX_TTL",
    "MAX_DISCOVER",
    "MessageType",
    "Status",
    "Register",
    "RegisterResponse",
    "Unregister",
    "Discover",
    "DiscoverResponse",
    "Message",
    "BadMessage",
    "Registration",
    "encode",
    "decode",
    "check_namespace",
    "status_name",
]

PROTOCOL = "/rendezvous/1.0.0"
MAX_MESSAGE = 1024 * 1024  # bytes of an answer we read and write (rust's codec refuses more)
MAX_REQUEST = 16 * 1024  # bytes of a request a rendezvous point reads (a register is ~0.5-5 KiB)
MAX_NAMESPACE = 255  # bytes of a namespace (the spec's recommendation, rust's MAX_NAMESPACE)
MAX_RECORD = 4096  # bytes of a signed peer record a rendezvous point keeps
MAX_TEXT = 256  # characters of a status text kept
HOUR = 3600
DEFAULT_TTL = 2 * HOUR  # a registration without a TTL (the spec's and rust's)
MIN_TTL = 2 * HOUR  # the spec's recommended lower bound (rust's MIN_TTL)
MAX_TTL = 72 * HOUR  # and upper bound (rust's MAX_TTL)
MAX_DISCOVER = 1000  # registrations one answer holds at most (the spec's recommendation)


class MessageType(enum.IntEnum):
    REGISTER = 0
    REGISTER_RESPONSE = 1
    UNREGISTER = 2
    DISCOVER = 3
    DISCOVER_RESPONSE = 4


class Status(enum.IntEnum):
    OK = 0
    E_INVALID_NAMESPACE = 100
    E_INVALID_SIGNED_PEER_RECORD = 101
    E_INVALID_TTL = 102
    E_INVALID_COOKIE = 103
    E_POW_REQUIRED = 104  # (the spec's proof of work: neither rust nor we ask for it)
    E_DIFFICULTY_TOO_LOW = 105
    E_NOT_AUTHORIZED = 200
    E_INTERNAL_ERROR = 300
    E_UNAVAILABLE = 400


def status_name(status: int) -> str:
    """``E_INVALID_TTL`` for 102; the number itself for a status the spec does not name."""
    try:
        return Status(status).name
    except ValueError:
        return str(status)


@dataclass(frozen=True)
class Register:
    """A registration: ``record`` is the registering peer's signed peer record (an envelope,
    ``libp2p-peer-record``); ``ttl`` in seconds (None: the default, 2 h). Discovery answers carry
    the same message, one per registration."""

    ns: str
    record: bytes
    ttl: int | None = None


@dataclass(frozen=True)
class RegisterResponse:
    status: int
    text: str = ""
    ttl: int | None = None  # the TTL granted (with OK)


@dataclass(frozen=True)
class Unregister:
    ns: str
    id: bytes | None = None  # (in the spec's message; rust sends none and ignores it, as we do)


@dataclass(frozen=True)
class Discover:
    """Ask for the registrations of ``ns`` (None: of every namespace), at most ``limit``,
    those after ``cookie`` (an earlier answer's)."""

    ns: str | None = None
    limit: int | None = None
    cookie: bytes | None = None


@dataclass(frozen=True)
class DiscoverResponse:
    registrations: tuple[Register, ...] = ()
    cookie: bytes | None = None
    status: int = Status.OK
    text: str = ""


Message = Register | RegisterResponse | Unregister | Discover | DiscoverResponse


class Registration(NamedTuple):
    """What a discovery gives the application (``lattica.rendezvous.discover``): a peer found through
    a rendezvous point, its addresses (from its own signed peer record), the namespace it
    registered in, and the seconds its registration has left."""

    peer: PeerId
    addrs: list[Multiaddr]
    namespace: str
    ttl: int


class BadMessage(ProtocolError):
    """A message we cannot read. ``kind``: its type when that much was readable (a server then
    answers a REGISTER or a DISCOVER with ``status``; anything else loses its stream)."""

    def __init__(self, text: str, kind: MessageType | None = None, status: Status = Status.E_INTERNAL_ERROR) -> None:
        super().__init__(text)
        self.kind = kind
        self.status = status


def check_namespace(ns: str) -> bytes:
    """``ns`` as the bytes on the wire; ValueError unless it is 1 to 255 bytes of UTF-8."""
    raw = ns.encode()
    if not raw or len(raw) > MAX_NAMESPACE:
        raise ValueError(f"a rendezvous namespace is 1 to {MAX_NAMESPACE} bytes of UTF-8, not {len(raw)}")
    return raw


# -- encoding -------------------------------------------------------------------------------------


def _register_fields(r: Register) -> bytes:
    fields: list[tuple[int, int | bytes]] = [(1, r.ns.encode()), (2, r.record)]
    if r.ttl is not None:
        fields.append((3, r.ttl))
    return encode_fields(fields)


def _status_fields(status: int, text: str, n_status: int, n_text: int) -> list[tuple[int, int | bytes]]:
    fields: list[tuple[int, int | bytes]] = [(n_status, int(status))]
    if text:
        fields.append((n_text, text[:MAX_TEXT].encode()))
    return sorted(fields, key=lambda f: f[0])


def encode(msg: Message) -> bytes:
    """``msg`` as the protobuf bytes (without the length prefix)."""
    if isinstance(msg, Register):
        return encode_fields([(1, MessageType.REGISTER), (2, _register_fields(msg))])
    if isinstance(msg, RegisterResponse):
        sub = _status_fields(msg.status, msg.text, 1, 2)
        if msg.ttl is not None:
            sub.append((3, msg.ttl))
        return encode_fields([(1, MessageType.REGISTER_RESPONSE), (3, encode_fields(sub))])
    if isinstance(msg, Unregister):
        body: list[tuple[int, int | bytes]] = [(1, msg.ns.encode())]
        if msg.id is not None:
            body.append((2, msg.id))
        return encode_fields([(1, MessageType.UNREGISTER), (4, encode_fields(body))])
    if isinstance(msg, Discover):
        fields: list[tuple[int, int | bytes]] = []
        if msg.ns is not None:
            fields.append((1, msg.ns.encode()))
        if msg.limit is not None:
            fields.append((2, msg.limit))
        if msg.cookie is not None:
            fields.append((3, msg.cookie))
        return encode_fields([(1, MessageType.DISCOVER), (5, encode_fields(fields))])
    sub = [(1, _register_fields(r)) for r in msg.registrations]
    if msg.cookie is not None:
        sub.append((2, msg.cookie))
    sub += _status_fields(msg.status, msg.text, 3, 4)
    return encode_fields([(1, MessageType.DISCOVER_RESPONSE), (6, encode_fields(sub))])


# -- decoding -------------------------------------------------------------------------------------


def _fields(data: bytes, kind: MessageType | None = None) -> dict[int, int | bytes]:
    try:
        return decode_fields(data)
    except ValueError as e:
        raise BadMessage(f"malformed rendezvous message: {e}", kind) from None


def _text(value: int | bytes | None, kind: MessageType, what: str, status: Status) -> str | None:
    if value is None:
        return None
    if not isinstance(value, bytes):
        raise BadMessage(f"a rendezvous {what} is a string, not a number", kind, status)
    try:
        return value.decode()
    except UnicodeDecodeError:
        raise BadMessage(f"a rendezvous {what} is not UTF-8", kind, status) from None


def _int(value: int | bytes | None, kind: MessageType, what: str, status: Status) -> int | None:
    if value is not None and not isinstance(value, int):
        raise BadMessage(f"a rendezvous {what} is a number, not bytes", kind, status)
    return value


def _bytes(value: int | bytes | None, kind: MessageType, what: str, status: Status) -> bytes | None:
    if value is not None and not isinstance(value, bytes):
        raise BadMessage(f"a rendezvous {what} is bytes, not a number", kind, status)
    return value


def _sub(fields: dict[int, int | bytes], number: int, kind: MessageType) -> bytes:
    raw = fields.get(number, b"")  # (a missing sub-message reads as an empty one)
    if not isinstance(raw, bytes):
        raise BadMessage(f"a rendezvous {kind.name} carries a number for its body", kind)
    return raw


def _register(data: bytes, kind: MessageType) -> Register:
    f = _fields(data, kind)
    ns = _text(f.get(1), kind, "namespace", Status.E_INVALID_NAMESPACE)
    record = _bytes(f.get(2), kind, "signed peer record", Status.E_INVALID_SIGNED_PEER_RECORD)
    ttl = _int(f.get(3), kind, "TTL", Status.E_INVALID_TTL)
    return Register(ns or "", record or b"", ttl)


def _text_of(value: int | bytes | None) -> str:
    if not isinstance(value, bytes):
        return ""
    return value[: 4 * MAX_TEXT].decode(errors="replace")[:MAX_TEXT]


def _status(value: int | bytes | None, kind: MessageType) -> int:
    if value is None:  # (proto2: an absent enum is its first value, OK; js's protons writes no 0)
        return Status.OK
    if not isinstance(value, int):
        raise BadMessage(f"a rendezvous {kind.name} carries bytes for its status", kind)
    return value


def decode(data: bytes) -> Message:
    """The message in ``data``; :class:`BadMessage` if it is not one."""
    f = _fields(data)
    t = f.get(1, MessageType.REGISTER)  # (proto2: an absent enum is its first value)
    if not isinstance(t, int):
        raise BadMessage("a rendezvous message carries bytes for its type")
    try:
        kind = MessageType(t)
    except ValueError:
        raise BadMessage(f"unknown rendezvous message type {t}") from None
    if kind is MessageType.REGISTER:
        return _register(_sub(f, 2, kind), kind)
    if kind is MessageType.REGISTER_RESPONSE:
        r = _fields(_sub(f, 3, kind), kind)
        return RegisterResponse(_status(r.get(1), kind), _text_of(r.get(2)), _int(r.get(3), kind, "TTL", Status.OK))
    if kind is MessageType.UNREGISTER:
        u = _fields(_sub(f, 4, kind), kind)
        ns = _text(u.get(1), kind, "namespace", Status.E_INVALID_NAMESPACE)
        return Unregister(ns or "", _bytes(u.get(2), kind, "id", Status.E_INTERNAL_ERROR))
    if kind is MessageType.DISCOVER:
        d = _fields(_sub(f, 5, kind), kind)
        return Discover(
            _text(d.get(1), kind, "namespace", Status.E_INVALID_NAMESPACE),
            _int(d.get(2), kind, "limit", Status.E_INTERNAL_ERROR),
            _bytes(d.get(3), kind, "cookie", Status.E_INVALID_COOKIE),
        )
    body = _sub(f, 6, kind)
    r = _fields(body, kind)
    try:
        regs = tuple(_register(raw, kind) for raw in decode_repeated(body, 1))
    except ValueError as e:
        raise BadMessage(f"malformed rendezvous registration: {e}", kind) from None
    return DiscoverResponse(
        regs,
        _bytes(r.get(2), kind, "cookie", Status.E_INTERNAL_ERROR),
        _status(r.get(3), kind),
        _text_of(r.get(4)),
    )
