"""Spliced circuits: a relay joins two raw TCP sockets and copies their bytes, nothing more.

A circuit negotiated over the relay's secured connections (``transports/circuit.py``) may move its
data onto a fresh TCP connection from each end to the relay. Each end opens it with
``PREAMBLE_MAGIC`` and the one-time token the relay gave it; the relay pairs the two sockets by
token and copies bytes between them. The ends then run Noise and the mux end to end as on any TCP
connection, so the relay still sees only ciphertext and cannot forge traffic, but it no longer
decrypts and re-encrypts every byte on each hop, and the ends encrypt once instead of twice.

``PREAMBLE_MAGIC`` starts with a zero length, which no Noise handshake message has, so a TCP
listener tells a splice request from a normal connection by its first two bytes.

The copy loop works on the sockets themselves (taken over from their asyncio transports): each
direction reads into one reused buffer and writes from it, so a relayed byte costs two system
calls' copies and no allocation. A buffer starts at 16 KiB and grows (to 256 KiB) only while reads
fill it, so a circuit carrying small calls holds 32 KiB, not 512. A direction whose destination is full stops reading its source
until the destination drains (backpressure end to end).
"""

from __future__ import annotations

import asyncio
import socket
import struct
from collections.abc import Callable

from lattica.errors import TransportError

__all__ = ["PREAMBLE_MAGIC", "PREAMBLE_LEN", "TOKEN_LEN", "preamble", "Splice", "SpliceUnreachable"]

PREAMBLE_MAGIC = b"\x00\x00LSPL"
TOKEN_LEN = 16
PREAMBLE_LEN = len(PREAMBLE_MAGIC) + TOKEN_LEN
_FIRST = 16 * 1024  # a direction's first copy buffer; it grows while reads fill it
_CHUNK = 256 * 1024  # ... up to this
_RESET = struct.pack("ii", 1, 0)  # SO_LINGER on, 0 s: close() sends a reset


class SpliceUnreachable(TransportError):
    """The relay's TCP listener could not be reached for a spliced socket."""


def preamble(token: bytes) -> bytes:
    """The first bytes an end sends on its spliced socket."""
    if len(token) != TOKEN_LEN:
        raise ValueError(f"a splice token has {TOKEN_LEN} bytes")
    return PREAMBLE_MAGIC + token


def _take_socket(transport: asyncio.Transport) -> socket.socket:
    """The transport's connection as a non-blocking socket of our own; the transport is closed
    (its file descriptor only: the connection lives on in the duplicate)."""
    sock = transport.get_extra_info("socket")
    own = socket.socket(sock.family, sock.type, sock.proto, fileno=socket.dup(sock.fileno()))
    own.setblocking(False)
    transport.pause_reading()
    transport.abort()
    return own


class _Pipe:
    """One direction: bytes read from ``src`` are written to ``dst``."""

    def __init__(self, splice: Splice, src: socket.socket, dst: socket.socket, early: bytes) -> None:
        self.splice = splice
        self.src = src
        self.dst = dst
        self.view = memoryview(bytearray(max(_FIRST, len(early))))
        self.view[: len(early)] = early
        self.start = 0  # unsent bytes are view[start:end]
        self.end = len(early)
        self.eof = False
        self.reading = False

    def begin(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        if self.end:
            self._send()
        else:
            self._reading(True)

    def _readable(self) -> None:
        try:
            n = self.src.recv_into(self.view)
        except (BlockingIOError, InterruptedError):
            return
        except OSError as e:
            self.splice.close(f"an end failed: {e.strerror or e}")
            return
        if n == 0:
            self._reading(False)
            self.eof = True
            self.splice._half_closed(self)
            return
        if not self.splice._count(n):
            return
        if n == len(self.view) < _CHUNK:  # bulk traffic: a bigger buffer, fewer wake-ups
            grown = memoryview(bytearray(min(_CHUNK, 4 * n)))
            grown[:n] = self.view[:n]
            self.view = grown
        self.start, self.end = 0, n
        self._send()

    def _send(self) -> None:
        try:
            sent = self.dst.send(self.view[self.start : self.end])
        except (BlockingIOError, InterruptedError):
            sent = 0
        except OSError as e:
            self.splice.close(f"an end failed: {e.strerror or e}")
            return
        self.start += sent
        if self.start < self.end:  # destination full: stop reading until it drains
            self._reading(False)
            self.loop.add_writer(self.dst.fileno(), self._writable)
        else:
            self._reading(True)

    def _reading(self, on: bool) -> None:
        if on != self.reading:
            self.reading = on
            if on:
                self.loop.add_reader(self.src.fileno(), self._readable)
            else:
                self.loop.remove_reader(self.src.fileno())

    def _writable(self) -> None:
        self.loop.remove_writer(self.dst.fileno())
        self._send()

    def stop(self) -> None:
        for remove, sock in ((self.loop.remove_reader, self.src), (self.loop.remove_writer, self.dst)):
            try:
                remove(sock.fileno())
            except (ValueError, OSError):
                pass  # already closed


class Splice:
    """Two TCP connections joined both ways, under a byte budget and a time limit.

    The first socket may arrive before the second: it is not read (beyond what arrived with its
    preamble, kept as ``early``) until its partner is attached.
    """

    def __init__(
        self,
        *,
        budget: int | None = None,
        duration: float | None = None,
        on_bytes: Callable[[int], None] | None = None,
        on_end: Callable[[str], None] | None = None,
    ) -> None:
        self._socks: list[tuple[socket.socket, bytes]] = []
        self._pipes: list[_Pipe] = []
        self._budget = budget
        self._duration = duration
        self._on_bytes = on_bytes
        self._on_end = on_end
        self._timer: asyncio.TimerHandle | None = None
        self._settled = asyncio.Event()  # joined, or ended before that
        self.ended: str | None = None
        self.bytes = 0

    @property
    def joined(self) -> bool:
        return len(self._pipes) == 2

    async def wait_joined(self) -> bool:
        """True once both sockets are attached; False if the splice ended first."""
        await self._settled.wait()
        return self.ended is None

    def attach(self, transport: asyncio.Transport, early: bytes = b"") -> None:
        """Take over ``transport``'s connection; ``early`` is data already read from it."""
        if self.ended is not None or len(self._socks) >= 2:
            transport.abort()
            return
        self._socks.append((_take_socket(transport), early))
        if len(self._socks) < 2:
            return
        (a, early_a), (b, early_b) = self._socks
        self._pipes = [_Pipe(self, a, b, early_a), _Pipe(self, b, a, early_b)]
        self._settled.set()
        loop = asyncio.get_running_loop()
        for p in self._pipes:
            p.begin(loop)
        if self._duration is not None and self.ended is None:
            self._timer = loop.call_later(self._duration, self.close, "duration limit")

    def _count(self, n: int) -> bool:
        """Account ``n`` relayed bytes; False (and the splice closed) past the budget."""
        self.bytes += n
        if self._budget is not None and self.bytes > self._budget:
            self.close(f"byte limit of {self._budget} reached")
            return False
        if self._on_bytes is not None:
            self._on_bytes(n)
        return True

    def _half_closed(self, pipe: _Pipe) -> None:
        """``pipe``'s source finished sending: pass the end on; close once both have."""
        try:
            pipe.dst.shutdown(socket.SHUT_WR)
        except OSError:
            pass
        if all(p.eof for p in self._pipes):
            self.close("both ends finished", clean=True)

    def close(self, why: str = "closed", *, clean: bool = False) -> None:
        """End the splice and close both sockets (reset them unless it ended ``clean``)."""
        if self.ended is not None:
            return
        self.ended = why
        self._settled.set()
        if self._timer is not None:
            self._timer.cancel()
        for p in self._pipes:
            p.stop()
        for sock, _ in self._socks:
            if not clean:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, _RESET)
            sock.close()
        if self._on_end is not None:
            self._on_end(why)
