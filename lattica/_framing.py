"""Length-prefixed codec messages on a Stream: a 4-byte big-endian length, then one codec frame."""

from __future__ import annotations

from typing import Any

from lattica import codec
from lattica.errors import FrameTooLarge, StreamClosed
from lattica.transports.base import Stream

__all__ = ["write_message", "read_message"]


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
