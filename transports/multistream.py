"""multistream-select 1.0, sans-IO: how libp2p peers agree on a protocol for a connection or a
stream (the security protocol on a raw TCP connection, the muxer inside it, and every stream's
protocol on TCP and QUIC).

Every message is a uvarint length, then UTF-8 text ending in ``\\n`` (counted in the length).
Both sides start with the header ``/multistream/1.0.0``; the dialer proposes a protocol, the
listener echoes it (agreed) or answers ``na`` (not available), and the dialer may propose the
next. ``ls`` asks the listener for its protocols. After agreement the bytes that follow belong to
the protocol.

A dialer that proposes a single protocol sends its first data right behind the proposal without
waiting for the echo (rust-libp2p's ``V1Lazy``, go's lazy client): negotiating costs bytes, not
round trips. A listener therefore hands on whatever follows an accepted proposal, and for such a
dialer a late ``na`` is a refusal of the stream, not an error of the connection.

:class:`Dialer` and :class:`Listener` are fed bytes (``receive``) and return what to send
(``data_to_send``) and events (``next_event``), like h11; they never touch a socket.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass

from lattica._protobuf import uvarint
from lattica.errors import ProtocolError

HEADER = "/multistream/1.0.0"
NA = "na"
LS = "ls"
MAX_MESSAGE = 1024  # bytes in one message (a protocol id and its newline); rust-libp2p's ids are at most 140
MAX_PROPOSALS = 16  # protocols one dialer may propose on one negotiation before the listener gives up
MAX_LISTINGS = 2  # ``ls`` requests answered on one negotiation
MAX_LISTING = 64 * 1024  # bytes of an ``ls`` answer a dialer reads


# -- events ---------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Agreed:
    """Both sides speak ``protocol`` from here on; ``data`` is what the peer sent right behind
    the negotiation (the protocol's first bytes, possibly empty)."""

    protocol: str
    data: bytes


@dataclass(frozen=True, slots=True)
class Refused:
    """The dialer's event: the listener speaks none of the protocols proposed (``tried``)."""

    tried: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class Listed:
    """The dialer's event: the listener's answer to ``ls``."""

    protocols: tuple[str, ...]


Event = Agreed | Refused | Listed


# -- messages ----------------------------------------------------------------------------------


def encode(text: str) -> bytes:
    """One message: uvarint length, the text, a newline."""
    body = text.encode() + b"\n"
    if len(body) > MAX_MESSAGE:
        raise ValueError(f"multistream message of {len(body)} bytes (at most {MAX_MESSAGE})")
    return uvarint(len(body)) + body


def _split(buf: bytearray, limit: int) -> bytes | None:
    """Take one message's body (without its newline) off the front of ``buf``; None if it has
    not all arrived. ProtocolError if it is malformed or longer than ``limit``."""
    n = shift = pos = 0
    while True:
        if pos >= len(buf):
            return None
        b = buf[pos]
        pos += 1
        n |= (b & 0x7F) << shift
        if not b & 0x80:
            break
        shift += 7
        if shift >= 21:  # (a length over 2 MiB: no multistream message is)
            raise ProtocolError("multistream message length is not a valid varint")
    if n > limit:
        raise ProtocolError(f"multistream message of {n} bytes (at most {limit})")
    if len(buf) - pos < n:
        return None
    body = bytes(buf[pos : pos + n])
    del buf[: pos + n]
    if not body.endswith(b"\n"):
        raise ProtocolError("multistream message does not end in a newline")
    return body[:-1]


def _text(body: bytes) -> str:
    try:
        return body.decode()
    except UnicodeDecodeError:
        raise ProtocolError("multistream message is not UTF-8") from None


def encode_listing(protocols: Iterable[str]) -> bytes:
    """The answer to ``ls``: one message holding each protocol as a message of its own, then a
    newline (go-multistream's and rust-libp2p's layout)."""
    inner = b"".join(encode(p) for p in protocols) + b"\n"
    return uvarint(len(inner)) + inner


def _parse_listing(body: bytes) -> tuple[str, ...]:
    buf = bytearray(body)
    out = []
    while buf:
        item = _split(buf, MAX_MESSAGE)
        if item is None:
            raise ProtocolError("truncated multistream listing")
        out.append(_text(item))
    return tuple(out)


# -- the two sides -----------------------------------------------------------------------------


class _Side:
    def __init__(self) -> None:
        self._in = bytearray()
        self._out = bytearray()
        self._events: list[Event] = []
        self._header_seen = False
        self.done = False

    def data_to_send(self) -> bytes:
        """The bytes to write to the peer now (and forget)."""
        out = bytes(self._out)
        self._out.clear()
        return out

    def next_event(self) -> Event | None:
        return self._events.pop(0) if self._events else None

    def _header(self) -> bool:
        """Read the peer's header once; False while it has not arrived."""
        if self._header_seen:
            return True
        body = _split(self._in, MAX_MESSAGE)
        if body is None:
            return False
        if _text(body) != HEADER:
            raise ProtocolError(f"peer does not speak {HEADER} (it sent {body[:64]!r})")
        self._header_seen = True
        return True


class Dialer(_Side):
    """The side that proposes: ``protocols`` in order of preference.

    With one protocol, the header, the proposal and the caller's first data go out together
    (``lazy``): the caller may write protocol data at once, and learns of a refusal as an event.
    With several, each is proposed after the previous one's ``na``. ``ask_listing`` sends ``ls``
    before the first proposal (its answer comes as a :class:`Listed` event)."""

    def __init__(self, protocols: Iterable[str], *, lazy: bool = True, ask_listing: bool = False) -> None:
        super().__init__()
        self._queue = list(protocols)
        if not self._queue:
            raise ValueError("a multistream dialer needs a protocol to propose")
        self.lazy = lazy and len(self._queue) == 1 and not ask_listing
        self._tried: list[str] = []
        self._listing = ask_listing  # ``ls`` first: its answer comes as a Listed event
        self._out += encode(HEADER)
        if ask_listing:
            self._out += encode(LS)
        self._propose()

    def _propose(self) -> None:
        proto = self._queue.pop(0)
        self._tried.append(proto)
        self._out += encode(proto)

    def receive(self, data: bytes) -> None:
        """Feed bytes from the listener. ProtocolError when they are not multistream."""
        if self.done:
            raise ProtocolError("multistream negotiation already ended")
        self._in += data
        if not self._header():
            return
        while not self.done:
            if self._listing:
                body = _split(self._in, MAX_LISTING)
                if body is None:
                    return
                self._listing = False
                self._events.append(Listed(_parse_listing(body)))
                continue
            body = _split(self._in, MAX_MESSAGE)
            if body is None:
                return
            answer = _text(body)
            if answer == self._tried[-1]:
                self.done = True
                self._events.append(Agreed(answer, bytes(self._in)))
                self._in.clear()
            elif answer == NA:
                if self._queue:
                    self._propose()
                else:
                    self.done = True
                    self._events.append(Refused(tuple(self._tried)))
            else:
                raise ProtocolError(f"multistream listener answered {answer[:64]!r} to {self._tried[-1]!r}")


class Listener(_Side):
    """The side that accepts: ``supports(protocol)`` says whether we speak it; ``listing`` is what
    ``ls`` answers (the protocols we are willing to name)."""

    def __init__(self, supports: Callable[[str], bool], listing: Callable[[], Iterable[str]] = tuple) -> None:
        super().__init__()
        self._supports = supports
        self._listing = listing
        self._proposals = 0
        self._listings = 0
        self.refused: list[str] = []  # what the dialer proposed that we do not speak (at most MAX_PROPOSALS)

    def receive(self, data: bytes) -> None:
        """Feed bytes from the dialer. ProtocolError when they are not multistream, or the dialer
        proposes or lists more than a negotiation may."""
        if self.done:
            raise ProtocolError("multistream negotiation already ended")
        self._in += data
        if not self._header_seen:
            if not self._header():
                return
            self._out += encode(HEADER)
        while not self.done:
            body = _split(self._in, MAX_MESSAGE)
            if body is None:
                return
            proposal = _text(body)
            if proposal == LS:
                self._listings += 1
                if self._listings > MAX_LISTINGS:
                    raise ProtocolError(f"more than {MAX_LISTINGS} multistream listings asked")
                self._out += encode_listing(self._listing())
                continue
            self._proposals += 1
            if proposal != HEADER and self._supports(proposal):
                self._out += encode(proposal)
                self.done = True
                self._events.append(Agreed(proposal, bytes(self._in)))
                self._in.clear()
            elif self._proposals >= MAX_PROPOSALS:
                raise ProtocolError(f"more than {MAX_PROPOSALS} multistream proposals refused")
            else:
                self.refused.append(proposal)
                self._out += encode(NA)
