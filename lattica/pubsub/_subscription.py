"""What a subscriber holds: the messages of one topic, read with ``async for`` on any event loop
or ``get(timeout)`` from any thread.

The node loop pushes messages in; a subscription holds at most ``maxsize`` of them for a slow
reader, dropping the oldest (``dropped`` counts them): a reader that stops never grows the node.
"""

from __future__ import annotations

import collections
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from lattica import codec
from lattica._future import Future
from lattica._identity import PeerId
from lattica.errors import CodecError, NodeClosed, Timeout

if TYPE_CHECKING:
    import asyncio

__all__ = ["Message", "Subscription"]


@dataclass(frozen=True, slots=True)
class Message:
    """One message of a topic: its author (who signed it), the author's sequence number, the
    data as published (decoded by the codec) and the peer it reached us through."""

    topic: str
    author: PeerId
    seqno: int
    data: Any
    via: PeerId | None = None  # None: published on this node


def _message_from(raw: Any) -> Message:
    if (
        type(raw) is not list
        or len(raw) != 5
        or type(raw[0]) is not str
        or not isinstance(raw[1], PeerId)
        or type(raw[2]) is not int
        or not (raw[4] is None or isinstance(raw[4], PeerId))
    ):
        raise CodecError("malformed pub-sub message")
    return Message(raw[0], raw[1], raw[2], raw[3], raw[4])


# a message is a value: a handler may be an actor anywhere, and a local one is checked as a remote one would be
codec.register_ext(21, Message, lambda m: [m.topic, m.author, m.seqno, m.data, m.via], _message_from)


def _on(loop: asyncio.AbstractEventLoop) -> bool:
    import asyncio  # (already loaded: the node runs it)

    try:
        return asyncio.get_running_loop() is loop
    except RuntimeError:
        return False


class Subscription:
    """The messages of ``topic`` from the moment of subscribing (see the module docstring)."""

    def __init__(
        self,
        topic: str,
        loop: asyncio.AbstractEventLoop,
        maxsize: int,
        on_close: Callable[[Subscription], object],  # (what it returns is ignored)
        maxbytes: int = 1 << 62,
    ) -> None:
        self.topic = topic
        self.maxsize = maxsize
        self.maxbytes = maxbytes
        self.dropped = 0
        self._bytes = 0
        self._sizes: collections.deque[int] = collections.deque()  # (of the waiting messages' data, as it came)
        self.closed = False
        self._loop = loop
        self._queue: collections.deque[Message] = collections.deque()
        self._lock = threading.Lock()
        self._ready = threading.Condition(self._lock)
        self._waiters: collections.deque[Future] = collections.deque()
        self._on_close = on_close

    def __repr__(self) -> str:
        return f"Subscription({self.topic!r}, waiting={len(self._queue)}, dropped={self.dropped})"

    # -- fed on the node loop -------------------------------------------------------------------

    def _push(self, msg: Message, size: int = 0) -> None:
        with self._lock:
            while self._waiters:
                fut = self._waiters.popleft()
                if not fut.done():
                    fut._resolve(msg)
                    return
            self._queue.append(msg)
            self._sizes.append(size)
            self._bytes += size
            while len(self._queue) > self.maxsize or (self._bytes > self.maxbytes and len(self._queue) > 1):
                self._queue.popleft()
                self._bytes -= self._sizes.popleft()
                self.dropped += 1
            self._ready.notify()

    def _take(self) -> Message:
        self._bytes -= self._sizes.popleft()
        return self._queue.popleft()

    def _end(self) -> None:
        with self._lock:
            self.closed = True
            waiters, self._waiters = list(self._waiters), collections.deque()
            self._ready.notify_all()
        for fut in waiters:
            if not fut.done():
                fut._reject(NodeClosed(f"the subscription to {self.topic!r} is closed"))

    # -- read from anywhere ---------------------------------------------------------------------

    def get(self, timeout: float | None = None) -> Message:
        """The next message; blocks this thread up to ``timeout`` s (Timeout), NodeClosed once
        the subscription or its node is closed. Not on the node loop: there, ``async for``."""
        if _on(self._loop):
            raise RuntimeError(
                "Subscription.get would block the node loop: use `async for` or `await sub.next()` there"
            )
        with self._ready:
            if not self._ready.wait_for(lambda: self._queue or self.closed, timeout):
                raise Timeout(f"no message on {self.topic!r} within {timeout} s")
            if self._queue:
                return self._take()
            raise NodeClosed(f"the subscription to {self.topic!r} is closed")

    def get_nowait(self) -> Message | None:
        """The next message if one is waiting, else None."""
        with self._lock:
            return self._take() if self._queue else None

    def next(self) -> Future:
        """A :class:`lattica.Future` of the next message (awaitable on any loop)."""
        fut = Future(self._loop)
        with self._lock:
            if self._queue:
                msg = self._take()
            elif self.closed:
                msg = None
            else:
                if len(self._waiters) > 64:  # cancelled waiters of a quiet topic: let them go
                    self._waiters = collections.deque(w for w in self._waiters if not w.done())
                self._waiters.append(fut)
                return fut
        if msg is None:
            self._loop.call_soon_threadsafe(fut._reject, NodeClosed(f"the subscription to {self.topic!r} is closed"))
        else:
            self._loop.call_soon_threadsafe(fut._resolve, msg)
        return fut

    def __aiter__(self) -> Subscription:
        return self

    async def __anext__(self) -> Message:
        if self._queue and _on(self._loop):  # (a message waiting, read on the node loop: no hand-over)
            with self._lock:
                if self._queue:
                    return self._take()
        try:
            return await self.next()
        except NodeClosed:
            raise StopAsyncIteration from None

    def close(self) -> None:
        """Unsubscribe (the node leaves the topic when its last subscription closes)."""
        if not self.closed:
            self._on_close(self)

    def __enter__(self) -> Subscription:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
