"""The Lattica SDK's RPC on the wire, sans-IO (GradientHQ Lattica SDK 1.0.21, rust-libp2p 0.54):
``/rpc/req-resp/1.0.0`` and ``/rpc/stream/1.0.0``.

Both carry bincode 2 with ``config::standard()``: integers as bincode varints (below 251 one byte,
else a marker byte 251-254 and a little-endian integer of 2, 4, 8 or 16 bytes), strings and byte
strings as a varint length then the bytes, a bool as one byte, an ``Option`` as a tag byte (0
None, 1 Some) then the value, an enum as its variant's index (a varint) then its fields in order.

- **req-resp**: one stream per call; the caller writes ``RpcMessage::Request{id, method, data,
  compression}`` and half-closes, the callee answers ``Response{id, data, compression}`` or
  ``Error{id, error}`` and closes; each side reads the other's message to the end.
- **stream**: one long-lived stream per peer and direction; frames of a 4-byte big-endian length
  then a bincode ``StreamFrame``: ``Request{id, method, data}`` (the SDK sends no data in it), then
  ``Data{id, data, is_end}`` chunks of the request up to one with ``is_end``; the callee answers
  ``Data`` chunks (one per item of a streaming method), then ``Close(id)``, or ``Error{id,
  error}`` then ``Close(id)``; ``Cancel(id)`` from the caller stops a streaming method.

``method`` is ``Service.method``. Payloads are the application's: protobuf, or, from an SDK
method without protobuf types, pickle, which this node never loads (:func:`looks_pickled`).
"""

from __future__ import annotations

from dataclasses import dataclass

from lattica.errors import FrameTooLarge, ProtocolError

__all__ = [
    "REQ_RESP",
    "STREAM",
    "Request",
    "Response",
    "Failure",
    "StreamRequest",
    "Data",
    "Close",
    "Cancel",
    "encode_message",
    "request_parts",
    "message_size",
    "decode_message",
    "encode_frame",
    "decode_frame",
    "Frames",
    "looks_pickled",
    "encode_relay_addr",
    "decode_relay_addr",
]

REQ_RESP = "/rpc/req-resp/1.0.0"
STREAM = "/rpc/stream/1.0.0"
MAX_TEXT = 4096  # bytes of an id, a method name or an error message we read
_WIDTH = {251: 2, 252: 4, 253: 8, 254: 16}  # a varint's marker byte -> the little-endian integer's bytes
_REQUEST, _RESPONSE, _ERROR = 0, 1, 2  # RpcMessage's variants
_S_REQUEST, _S_DATA, _S_ERROR, _S_CLOSE, _S_CANCEL = range(5)  # StreamFrame's


# -- the messages ---------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Request:
    """A call: ``RpcMessage::Request`` (``compression``: the SDK's algorithm's index, or None)."""

    id: str
    method: str
    data: bytes
    compression: int | None = None


@dataclass(frozen=True, slots=True)
class Response:
    id: str
    data: bytes
    compression: int | None = None


@dataclass(frozen=True, slots=True)
class Failure:
    """An error answer: ``RpcMessage::Error`` or ``StreamFrame::Error``."""

    id: str
    error: str


@dataclass(frozen=True, slots=True)
class StreamRequest:
    id: str
    method: str
    data: bytes = b""


@dataclass(frozen=True, slots=True)
class Data:
    id: str
    data: bytes
    is_end: bool


@dataclass(frozen=True, slots=True)
class Close:
    id: str


@dataclass(frozen=True, slots=True)
class Cancel:
    id: str


Message = Request | Response | Failure
Frame = StreamRequest | Data | Failure | Close | Cancel


# -- bincode ----------------------------------------------------------------------------------------


def _varint(n: int) -> bytes:
    if n < 251:
        return bytes([n])
    for marker, width in _WIDTH.items():
        if n < 1 << (8 * width):
            return bytes([marker]) + n.to_bytes(width, "little")
    raise ValueError(f"{n} does not fit in 128 bits")


def _blob(b: bytes) -> bytes:
    return _varint(len(b)) + b


def _text(s: str) -> bytes:
    return _blob(s.encode())


def _option(v: int | None) -> bytes:
    return b"\x00" if v is None else b"\x01" + _varint(v)


class _Reader:
    """Reads bincode values off one whole message; ProtocolError past its end or on bad values."""

    __slots__ = ("buf", "pos")

    def __init__(self, buf: bytes | bytearray | memoryview) -> None:
        self.buf = memoryview(buf)
        self.pos = 0

    def uint(self) -> int:
        buf, pos = self.buf, self.pos
        if pos >= len(buf):
            raise ProtocolError("an SDK RPC message ends before a number")
        marker = buf[pos]
        if marker < 251:
            self.pos = pos + 1
            return marker
        width = _WIDTH.get(marker)
        if width is None or pos + 1 + width > len(buf):
            raise ProtocolError(f"an SDK RPC message has a bad number at byte {pos}")
        self.pos = pos + 1 + width
        return int.from_bytes(buf[pos + 1 : pos + 1 + width], "little")

    def blob(self) -> bytes:
        n = self.uint()
        if self.pos + n > len(self.buf):
            raise ProtocolError(f"an SDK RPC message's field of {n} bytes runs past its end")
        out = bytes(self.buf[self.pos : self.pos + n])
        self.pos += n
        return out

    def text(self) -> str:
        raw = self.blob()
        if len(raw) > MAX_TEXT:
            raise ProtocolError(f"an SDK RPC message's text field is over {MAX_TEXT} bytes")
        try:
            return raw.decode()
        except UnicodeDecodeError:
            raise ProtocolError("an SDK RPC message's text field is not UTF-8") from None

    def byte(self, what: str, allowed: tuple[int, ...]) -> int:
        if self.pos >= len(self.buf):
            raise ProtocolError(f"an SDK RPC message ends before its {what}")
        b = self.buf[self.pos]
        if b not in allowed:
            raise ProtocolError(f"an SDK RPC message's {what} is {b}")
        self.pos += 1
        return b

    def option(self) -> int | None:
        return self.uint() if self.byte("option tag", (0, 1)) else None

    def end(self) -> None:
        if self.pos != len(self.buf):
            raise ProtocolError(f"{len(self.buf) - self.pos} bytes after an SDK RPC message")


# -- req-resp ---------------------------------------------------------------------------------------


def request_parts(request_id: str, method: str, size: int) -> tuple[bytes, bytes]:
    """An uncompressed ``Request``'s bytes before and after its ``size`` bytes of data (so the
    data can be written as it is, never copied into one message)."""
    return bytes([_REQUEST]) + _text(request_id) + _text(method) + _varint(size), _option(None)


def encode_message(m: Message) -> bytes:
    """A ``/rpc/req-resp/1.0.0`` message's bytes."""
    if isinstance(m, Request):
        return bytes([_REQUEST]) + _text(m.id) + _text(m.method) + _blob(m.data) + _option(m.compression)
    if isinstance(m, Response):
        return bytes([_RESPONSE]) + _text(m.id) + _blob(m.data) + _option(m.compression)
    return bytes([_ERROR]) + _text(m.id) + _text(m.error)


_HEAD = 1 + 2 * (5 + MAX_TEXT) + 17  # bytes of a req-resp message before its data, at most


def message_size(buf: bytes | bytearray | memoryview) -> int | None:
    """The size of the whole req-resp message ``buf`` begins, as its head says (its kind, id,
    method and the data's length: what its sender declared), or None while the head is not all
    there; ProtocolError if no message begins so."""
    r = _Reader(buf)
    try:
        variant = r.uint()
        r.text()
        if variant == _REQUEST:
            r.text()
        elif variant not in (_RESPONSE, _ERROR):
            raise ProtocolError(f"an SDK RPC message of unknown kind {variant}")
        n = r.uint()
    except ProtocolError:
        if len(buf) >= _HEAD:
            raise
        return None
    return r.pos + n + (0 if variant == _ERROR else 18)  # (then compression: an option of a number)


def decode_message(buf: bytes | bytearray | memoryview) -> Message:
    """One whole req-resp message; ProtocolError if it is not one."""
    r = _Reader(buf)
    variant = r.uint()
    mid = r.text()
    out: Message
    if variant == _REQUEST:
        method = r.text()
        out = Request(mid, method, r.blob(), r.option())
    elif variant == _RESPONSE:
        out = Response(mid, r.blob(), r.option())
    elif variant == _ERROR:
        out = Failure(mid, r.text())
    else:
        raise ProtocolError(f"an SDK RPC message of unknown kind {variant}")
    r.end()
    return out


# -- stream -------------------------------------------------------------------------------------------


def encode_frame(f: Frame) -> bytes:
    """A ``/rpc/stream/1.0.0`` frame's bytes, its 4-byte length first."""
    if isinstance(f, StreamRequest):
        body = bytes([_S_REQUEST]) + _text(f.id) + _text(f.method) + _blob(f.data)
    elif isinstance(f, Data):
        body = bytes([_S_DATA]) + _text(f.id) + _blob(f.data) + (b"\x01" if f.is_end else b"\x00")
    elif isinstance(f, Failure):
        body = bytes([_S_ERROR]) + _text(f.id) + _text(f.error)
    elif isinstance(f, Close):
        body = bytes([_S_CLOSE]) + _text(f.id)
    else:
        body = bytes([_S_CANCEL]) + _text(f.id)
    return len(body).to_bytes(4, "big") + body


def decode_frame(body: bytes | bytearray | memoryview) -> Frame:
    """One frame's body (without its length); ProtocolError if it is not one."""
    r = _Reader(body)
    variant = r.uint()
    mid = r.text()
    out: Frame
    if variant == _S_REQUEST:
        method = r.text()
        out = StreamRequest(mid, method, r.blob())
    elif variant == _S_DATA:
        data = r.blob()
        out = Data(mid, data, bool(r.byte("end flag", (0, 1))))
    elif variant == _S_ERROR:
        out = Failure(mid, r.text())
    elif variant == _S_CLOSE:
        out = Close(mid)
    elif variant == _S_CANCEL:
        out = Cancel(mid)
    else:
        raise ProtocolError(f"an SDK stream frame of unknown kind {variant}")
    r.end()
    return out


class Frames:
    """Bytes of a stream in, frames out: ``feed(bytes)`` returns the frames completed. A frame
    longer than ``max_frame`` is refused (FrameTooLarge) before its body is kept."""

    def __init__(self, max_frame: int) -> None:
        self.max_frame = max_frame
        self._buf = bytearray()

    def feed(self, data: bytes | bytearray | memoryview) -> list[Frame]:
        self._buf += data
        out: list[Frame] = []
        buf = self._buf
        pos = 0
        while len(buf) - pos >= 4:
            n = int.from_bytes(buf[pos : pos + 4], "big")
            if n > self.max_frame:
                raise FrameTooLarge(f"an SDK stream frame of {n} bytes (at most {self.max_frame})")
            if len(buf) - pos - 4 < n:
                break
            out.append(decode_frame(memoryview(buf)[pos + 4 : pos + 4 + n]))
            pos += 4 + n
        del buf[:pos]
        return out

    @property
    def pending(self) -> int:
        """Bytes held of a frame not complete yet."""
        return len(self._buf)


def looks_pickled(data: bytes) -> bool:
    """Whether ``data`` is a Python pickle (protocol 2 to 5: the PROTO opcode, then its version,
    and the STOP opcode last), as the SDK sends for a method without protobuf types. We never
    load one: such a call is refused, saying why."""
    return len(data) >= 3 and data[0] == 0x80 and 2 <= data[1] <= 5 and data[-1] == 0x2E


# -- the relay-address topic --------------------------------------------------------------------


def encode_relay_addr(addr: str, protocol_version: str) -> bytes:
    """What an SDK node (1.0.21) publishes on ``p2p-circuit-broadcast``: bincode of ``{addr:
    String, protocol_version: String}`` (the swarm it belongs to: others ignore it)."""
    return _text(addr) + _text(protocol_version)


def decode_relay_addr(data: bytes) -> tuple[str, str | None]:
    """The address (and swarm) of a ``p2p-circuit-broadcast`` message: 1.0.21's bincode pair, or
    earlier SDKs' bare UTF-8 address (no swarm named); ProtocolError if neither."""
    if data.startswith(b"/"):
        try:
            return data.decode(), None
        except UnicodeDecodeError:
            raise ProtocolError("a relayed address that is not UTF-8") from None
    r = _Reader(data)
    addr, protocol_version = r.text(), r.text()
    r.end()
    return addr, protocol_version
