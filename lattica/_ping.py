"""The ping protocol (libp2p's /ipfs/ping/1.0.0): the dialer sends 32 random bytes, the peer echoes
them; repeat on the same stream to measure round-trip times."""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Awaitable, Callable
from typing import Any

from lattica.errors import ProtocolError
from lattica.transports.base import Stream

PROTOCOL = "/ipfs/ping/1.0.0"
_SIZE = 32
IDLE_TIMEOUT = 60.0  # a ping stream silent this long is closed (it holds a stream slot)
# A peer that sends pings and does not take the echoes (withholds stream credit) pins its
# unread pings in our receive window: once echoes pile up unsent it has this long to take them.
DRAIN_TIMEOUT = 10.0
_BACKLOG = 4096  # echoes unsent beyond this: the peer is not taking them (a sequential pinger has 32)
_BATCH = 4  # pings echoed between turns of the loop when they come faster than one per turn


async def serve(stream: Stream, turn: Callable[[], Awaitable[Any]] | None = None) -> None:
    """Echo 32-byte pings until the peer closes the stream, leaves it idle, or leaves its echoes
    unsent for DRAIN_TIMEOUT (then the stream is reset: its unread pings are dropped). ``turn``
    (a stranger's stream): awaited before each echo, until the echo may go (charged to a share
    it has with others); meanwhile nothing more of the stream is read."""
    loop = asyncio.get_running_loop()
    stalled_at: float | None = None  # when the unsent echoes last grew past _BACKLOG
    echoed = 0
    while True:
        try:
            async with asyncio.timeout(IDLE_TIMEOUT):
                data = await stream.read(_SIZE)
                if data and len(data) < _SIZE:
                    data += await stream.readexactly(_SIZE - len(data))
        except TimeoutError:
            stream.reset()
            return
        if not data:
            await stream.close()
            return
        if turn is not None:
            await turn()
        stream.write(data)
        echoed += 1
        if not echoed % _BATCH:  # pings already buffered: let the loop run (and send the echoes)
            await asyncio.sleep(0)
        # no further ping is read until drain() returns, and a trickle of credit that never
        # brings the unsent echoes back under _BACKLOG does not restart the clock
        now = loop.time()
        if stream.write_buffer_size() <= _BACKLOG:
            stalled_at = None
        elif stalled_at is None:
            stalled_at = now
        elif now - stalled_at >= DRAIN_TIMEOUT:
            stream.reset()
            return
        try:
            async with asyncio.timeout_at((now if stalled_at is None else stalled_at) + DRAIN_TIMEOUT):
                await stream.drain()
        except TimeoutError:
            stream.reset()
            return


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
