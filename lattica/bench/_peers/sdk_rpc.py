"""The Lattica SDK's request-response RPC (``/rpc/req-resp/1.0.0``) on a raw stream, for the
interop tests and ``lattica bench libp2p`` (issue 48): ``call`` writes one request (its data as
it is, never copied into one message) and reads the answer, timing the stream alone. The wire
format is ``lattica.sdk._wire``'s (the product's own codec), with which the node's ``lattica.sdk``
API serves and calls too."""

from __future__ import annotations

from lattica.sdk import _wire as w
from lattica.transports.base import Stream

PROTOCOL = w.REQ_RESP
BLOCK = 1 << 20  # what one write of a request's data carries


async def read_message(stream: Stream, limit: int) -> w.Message:
    """The peer's one message, read to EOF as the SDK writes it; ValueError past ``limit`` bytes."""
    got = bytearray()
    while chunk := await stream.read(BLOCK):
        got += chunk
        if len(got) > limit:
            raise ValueError(f"an RPC message longer than {limit} bytes")
    return w.decode_message(got)


async def call(stream: Stream, request_id: str, method: str, data: bytes | memoryview, limit: int) -> w.Message:
    """One request on ``stream`` (opened on ``PROTOCOL``): ``data`` written in 1 MiB writes, the
    stream half-closed, the answer read to EOF (at most ``limit`` bytes) and decoded."""
    head, tail = w.request_parts(request_id, method, len(data))
    stream.write(head)
    view = memoryview(data)
    for at in range(0, len(view), BLOCK):
        stream.write(view[at : at + BLOCK])
        await stream.drain()
    stream.write(tail)
    await stream.close()  # (half-close: the SDK reads the request to EOF)
    return await read_message(stream, limit)
