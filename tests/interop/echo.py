"""One stream echoing ``size`` bytes through another implementation, for the interop tests."""

from __future__ import annotations

import asyncio
import hashlib
import os

from lattica.transports.base import Stream


async def echo_through(stream: Stream, size: int, timeout: float) -> tuple[str, str]:
    """Write ``size`` random bytes on ``stream`` while reading the peer's echo; the sha256 of
    what was sent and of what came back."""
    data = os.urandom(1 << 20)
    sent, got = hashlib.sha256(), hashlib.sha256()
    received = 0

    async def reader() -> None:
        nonlocal received
        while received < size:
            chunk = await stream.read(1 << 20)
            assert chunk, "the echo ended early"
            got.update(chunk)
            received += len(chunk)

    task = asyncio.ensure_future(reader())
    for _ in range(size // len(data)):
        stream.write(data)
        sent.update(data)
        await stream.drain()
    await asyncio.wait_for(task, timeout)
    await stream.close()
    return sent.hexdigest(), got.hexdigest()
