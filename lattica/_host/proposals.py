"""A stream whose protocol we proposed to a libp2p peer without waiting for its answer
(multistream-select's lazy dialer): what we write goes right behind the proposal, and the first
read takes the peer's answer off the stream before any of the protocol's bytes. A refusal
(``na``) surfaces there, as UnsupportedProtocol, and resets the stream."""

from __future__ import annotations

import asyncio

from lattica._framing import read_delimited
from lattica._identity import PeerId
from lattica._protobuf import uvarint
from lattica.errors import Timeout, UnsupportedProtocol
from lattica.transports import multistream
from lattica.transports.base import Stream

ANSWER_TIMEOUT = 10.0  # seconds the peer has to answer a proposal, counted from our first read


class ProposedStream(Stream):
    """``inner`` with ``select``'s proposal already written on it."""

    __slots__ = ("_inner", "_select", "_peer", "stream_id")

    def __init__(self, inner: Stream, select: multistream.Dialer, peer: PeerId) -> None:
        self._inner = inner
        self._select: multistream.Dialer | None = select
        self._peer = peer
        self.stream_id = inner.stream_id

    async def _settle(self, select: multistream.Dialer) -> None:
        try:
            async with asyncio.timeout(ANSWER_TIMEOUT):
                while (event := select.next_event()) is None:
                    body = await read_delimited(self._inner, multistream.MAX_MESSAGE)
                    select.receive(uvarint(len(body)) + body)
        except TimeoutError:
            self._inner.reset()
            raise Timeout(f"{self._peer} did not answer our protocol proposal") from None
        except BaseException:
            self._inner.reset()
            raise
        if not isinstance(event, multistream.Agreed):
            self._inner.reset()
            raise UnsupportedProtocol(f"{self._peer} does not speak {', '.join(event.tried)}")  # type: ignore[union-attr]
        self._select = None

    async def read(self, max_bytes: int = 65536) -> bytes:
        if self._select is not None:
            await self._settle(self._select)
        return await self._inner.read(max_bytes)

    def write(self, data: bytes | bytearray | memoryview) -> None:
        self._inner.write(data)

    async def drain(self) -> None:
        await self._inner.drain()

    def write_buffer_size(self) -> int:
        return self._inner.write_buffer_size()

    async def close(self) -> None:
        await self._inner.close()

    def reset(self) -> None:
        self._inner.reset()

    @property
    def aborted(self) -> bool:
        return self._inner.aborted
