"""Messages on a Stream: ours (a 4-byte big-endian length, then one codec frame) and libp2p's
(a uvarint length, then the bytes: protobuf messages, multistream-select's)."""

from __future__ import annotations

from typing import Any

from lattica import codec
from lattica._protobuf import uvarint
from lattica.errors import FrameTooLarge, ProtocolError, StreamClosed
from lattica.transports.base import Stream

__all__ = ["write_message", "read_message", "write_delimited", "read_delimited", "read_length"]


def write_message(stream: Stream, obj: Any) -> None:
    """Queue ``obj`` as one message (call ``await stream.drain()`` for backpressure)."""
    chunks = codec.encode(obj)
    stream.write(sum(map(len, chunks)).to_bytes(4, "big"))
    for c in chunks:
        stream.write(c)


async def read_message(stream: Stream, max_size: int) -> Any:
    """Read one message; raises FrameTooLarge past ``max_size``, StreamClosed at a clean EOF."""
    head = await stream.read(4)
    if not head:
        raise StreamClosed("stream ended before a message")
    if len(head) < 4:
        head += await stream.readexactly(4 - len(head))
    n = int.from_bytes(head, "big")
    if n > max_size:
        raise FrameTooLarge(f"message of {n} bytes exceeds the limit of {max_size}")
    return codec.decode(await stream.readexactly(n))


def write_delimited(stream: Stream, data: bytes) -> None:
    """Queue ``data`` as one uvarint-length-prefixed message (libp2p's framing)."""
    stream.write(uvarint(len(data)) + data)


async def read_length(stream: Stream) -> int:
    """The uvarint length that starts a libp2p message (its bytes are the caller's to read);
    StreamClosed at a clean EOF before it."""
    n = shift = 0
    while True:
        b = await stream.readexactly(1) if shift else await stream.read(1)
        if not b:
            raise StreamClosed("stream ended before a message")
        n |= (b[0] & 0x7F) << shift
        if not b[0] & 0x80:
            return n
        shift += 7
        if shift > 28:
            raise ProtocolError("message length is not a valid varint")


async def read_delimited(stream: Stream, max_size: int) -> bytes:
    """Read one uvarint-length-prefixed message, never a byte past it (what follows is the
    protocol's). FrameTooLarge past ``max_size``, StreamClosed at a clean EOF before it."""
    n = await read_length(stream)
    if n > max_size:
        raise FrameTooLarge(f"message of {n} bytes exceeds the limit of {max_size}")
    return await stream.readexactly(n) if n else b""
