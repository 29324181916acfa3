"""The Lattica SDK's RPC (rust-libp2p 0.54, GradientHQ Lattica SDK 1.0.21), spoken by our node:
its ``/rpc/req-resp/1.0.0`` request-response protocol, for the interop tests and ``lattica bench
libp2p`` (issue 48). The codec is sans-IO; ``call`` and ``serve_sink`` run it on a stream.

The wire format (``GradientHQ/lattica@98318ba:lattica/src/rpc/protocol.rs``, ``RpcCodec``; the
1.0.21 wheel answered it byte for byte): one message per direction on a fresh stream, the
initiator half-closing after its request; each side reads the other's with ``read_to_end``, so
neither caps it. A message is bincode 2 with ``config::standard()`` (varint integers, little
endian, no size limit) of ``enum RpcMessage { Request{id: String, method: String, data: Vec<u8>,
compression: Option<CompressionAlgorithm>}, Response{id, data, compression}, Error{id, error:
String} }``; an enum is its variant's index (a varint), then its fields in order. The SDK
compresses only when configured (``compression_algorithm`` defaults to None and its Python API
cannot set it); its request times out after 3 minutes (``behaviour.rs``). The method is
``Service.method``, a ``ConnectionHandler`` subclass's name and its ``rpc_method``; the data is
what that method's Python gets (pickled, unless its type is one with protobuf's two methods:
sdk_peer.py's ``Raw`` takes the bytes as they are, so nothing is pickled on either side)."""

from __future__ import annotations

from typing import Any

import structlog

from lattica.transports.base import Connection, Stream

log = structlog.get_logger(__name__)

PROTOCOL = "/rpc/req-resp/1.0.0"
BLOCK = 1 << 20  # what one write of a request's data carries
SERVE_LIMIT = 1 << 30  # the largest request serve_sink reads (it holds it whole, as the SDK does)
_REQUEST, _RESPONSE, _ERROR = 0, 1, 2  # RpcMessage's variants
_WIDTH = {251: 2, 252: 4, 253: 8, 254: 16}  # a varint's marker byte -> the little-endian integer's bytes


# -- bincode 2 (standard config), only what RpcMessage needs --------------------------------------


def _varint(n: int) -> bytes:
    """bincode's varint: below 251 one byte, else a marker byte and the integer, little endian."""
    if n < 251:
        return bytes([n])
    for marker, width in _WIDTH.items():
        if n < 1 << (8 * width):
            return bytes([marker]) + n.to_bytes(width, "little")
    raise ValueError(f"{n} does not fit in 128 bits")


def _text(s: str) -> bytes:
    """A String: its UTF-8 length, then the bytes."""
    raw = s.encode()
    return _varint(len(raw)) + raw


def request_frame(request_id: str, method: str, size: int) -> tuple[bytes, bytes]:
    """``RpcMessage::Request`` without compression, as the bytes before ``size`` bytes of data and
    the bytes after them (so the data is written as it is, never copied into one message)."""
    return bytes([_REQUEST]) + _text(request_id) + _text(method) + _varint(size), b"\x00"  # (data; None)


def response_frame(request_id: str, data: bytes) -> bytes:
    """``RpcMessage::Response`` carrying ``data``, without compression."""
    return bytes([_RESPONSE]) + _text(request_id) + _varint(len(data)) + data + b"\x00"


def _uint(buf: memoryview, pos: int) -> tuple[int, int]:
    """A varint at ``pos``: (its value, the position after it)."""
    if pos >= len(buf):
        raise ValueError(f"the message ends at {pos}, before a varint")
    marker = buf[pos]
    if marker < 251:
        return marker, pos + 1
    width = _WIDTH.get(marker)
    if width is None or pos + 1 + width > len(buf):
        raise ValueError(f"bad varint at {pos}")
    return int.from_bytes(buf[pos + 1 : pos + 1 + width], "little"), pos + 1 + width


def _blob(buf: memoryview, pos: int) -> tuple[memoryview, int]:
    """A length-prefixed String or Vec<u8> at ``pos``: (a view of it, the position after it)."""
    n, pos = _uint(buf, pos)
    if pos + n > len(buf):
        raise ValueError(f"a field of {n} bytes at {pos} runs past the message's end")
    return buf[pos : pos + n], pos + n


def decode_message(buf: bytes | bytearray) -> dict[str, Any]:
    """One whole ``RpcMessage`` (a stream read to EOF): ``{"kind", "id", ...}``; data stays a view."""
    view = memoryview(buf)
    variant, pos = _uint(view, 0)
    raw_id, pos = _blob(view, pos)
    out: dict[str, Any] = {"id": bytes(raw_id).decode()}
    if variant == _ERROR:
        error, pos = _blob(view, pos)
        out.update(kind="error", error=bytes(error).decode())
    elif variant in (_REQUEST, _RESPONSE):
        if variant == _REQUEST:
            method, pos = _blob(view, pos)
            out["method"] = bytes(method).decode()
        data, pos = _blob(view, pos)
        if pos >= len(view):
            raise ValueError("the message ends before its compression")
        tag, pos, compression = view[pos], pos + 1, None
        if tag == 1:  # Some(CompressionAlgorithm): its variant, of None, Gzip, Zstd, Lz4, Brotli
            compression, pos = _uint(view, pos)
        elif tag != 0:
            raise ValueError(f"bad Option tag {tag}")
        out.update(kind="request" if variant == _REQUEST else "response", data=data, compression=compression)
    else:
        raise ValueError(f"unknown RpcMessage variant {variant}")
    if pos != len(view):
        raise ValueError(f"{len(view) - pos} bytes after the message")
    return out


# -- on a stream ----------------------------------------------------------------------------------


async def read_message(stream: Stream, limit: int) -> dict[str, Any]:
    """The peer's one message, read to EOF as the SDK writes it; ValueError past ``limit`` bytes."""
    got = bytearray()
    while chunk := await stream.read(BLOCK):
        got += chunk
        if len(got) > limit:
            raise ValueError(f"an RPC message longer than {limit} bytes")
    return decode_message(got)


async def call(stream: Stream, request_id: str, method: str, data: bytes | memoryview, limit: int) -> dict[str, Any]:
    """One request on ``stream`` (opened on ``PROTOCOL``): ``data`` written in 1 MiB writes, the
    stream half-closed, the answer read to EOF (at most ``limit`` bytes) and decoded."""
    head, tail = request_frame(request_id, method, len(data))
    stream.write(head)
    view = memoryview(data)
    for at in range(0, len(view), BLOCK):
        stream.write(view[at : at + BLOCK])
        await stream.drain()
    stream.write(tail)
    await stream.close()  # (half-close: the SDK reads the request to EOF)
    return await read_message(stream, limit)


async def serve_sink(stream: Stream, conn: Connection) -> None:
    """A ``/rpc/req-resp/1.0.0`` responder whose every method is a sink: it reads the request
    whole (as the SDK's responder does) and answers one byte, ``k``, under the request's id."""
    try:
        request = await read_message(stream, SERVE_LIMIT)
        if request["kind"] != "request":
            raise ValueError(f"a {request['kind']} where a request was due")
    except ValueError as e:
        log.info("sdk rpc: bad request", error=str(e))
        stream.reset()
        return
    stream.write(response_frame(request["id"], b"k"))
    await stream.close()
