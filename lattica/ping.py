"""The ping protocol (libp2p's /ipfs/ping/1.0.0): the dialer sends 32 random bytes, the peer echoes
them; repeat on the same stream to measure round-trip times."""

from __future__ import annotations

import asyncio
import os
import time

from lattica.errors import ProtocolError
from lattica.transports.base import Stream

PROTOCOL = "/ipfs/ping/1.0.0"
_SIZE = 32
IDLE_TIMEOUT = 60.0  # a ping stream silent this long is closed (it holds a stream slot)


async def serve(stream: Stream) -> None:
    """Echo 32-byte pings until the peer closes the stream (or leaves it idle)."""
    while True:
        try:
            data = await asyncio.wait_for(stream.read(_SIZE), IDLE_TIMEOUT)
        except asyncio.TimeoutError:
            stream.reset()
            return
        if not data:
            await stream.close()
            return
        if len(data) < _SIZE:
            data += await stream.readexactly(_SIZE - len(data))
        stream.write(data)
        await stream.drain()  # a peer that never reads its echoes stops getting them


async def measure(stream: Stream, count: int) -> list[float]:
    """Send ``count`` pings in sequence; return each round trip in seconds."""
    rtts = []
    for _ in range(count):
        payload = os.urandom(_SIZE)
        t0 = time.perf_counter()
        stream.write(payload)
        echo = await stream.readexactly(_SIZE)
        rtts.append(time.perf_counter() - t0)
        if echo != payload:
            raise ProtocolError("ping reply does not match what was sent")
    return rtts
