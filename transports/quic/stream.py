"""``QuicStream``: one QUIC stream as a Lattica ``Stream`` (buffers, flow-control credit, reset)."""

from __future__ import annotations

import asyncio
from collections import deque
from typing import TYPE_CHECKING

from lattica.errors import (
    StreamClosed,
    StreamReset,
)
from lattica.transports.base import Stream
from lattica.transports.quic.wire import ERR_NO_ERROR

if TYPE_CHECKING:
    from lattica.transports.quic.connection import QuicConn


class QuicStream(Stream):
    """A QUIC bidirectional stream: buffered reads, writes queued into aioquic."""

    def __init__(self, conn: QuicConn, stream_id: int, outbound: bool) -> None:
        self.stream_id = stream_id
        self._conn = conn
        self._quic = conn._quic
        self.outbound = outbound
        self._buf: deque[bytes] = deque()
        self._off = 0  # read position inside _buf[0]: a short read never copies the rest of it
        self._buf_len = 0  # unread bytes (_buf less _off)
        self._eof = False
        self._recv_done = False  # FIN or RESET received, or reset locally
        self._send_done = False  # FIN queued, reset locally, or STOP_SENDING received
        self._read_exc: Exception | None = None
        self._write_exc: Exception | None = None
        self._read_waiter: asyncio.Future[None] | None = None
        self._drain_waiter: asyncio.Future[None] | None = None
        self._consumed = 0
        self._advertised = self._window = conn._stream_window
        self._credit_at = 0.0  # loop time of the last credit update (0: none yet)
        self._grown_at = float("-inf")
        self._released = False  # retired: buffered bytes no longer count as connection credit

    def __repr__(self) -> str:
        return f"<QuicStream {self.stream_id} of {self._conn!r}>"

    # -- fed by the connection ------------------------------------------------------------

    def _on_data(self, data: bytes, fin: bool) -> None:
        if data and not self._recv_done:
            self._buf.append(data)
            self._buf_len += len(data)
            self._quic.rx_unread += len(data)
        if fin and not self._recv_done:
            self._eof = True
            self._recv_done = True
            self._quic.rx_stream_limit.pop(self.stream_id, None)
            self._conn._maybe_retire(self)
        self._wake_reader()

    @property
    def aborted(self) -> bool:
        return self._read_exc is not None or self._conn.is_closed

    def _on_reset(self, error_code: int) -> None:
        if self._recv_done:
            return
        self._recv_done = True
        self._read_exc = StreamReset(f"stream {self.stream_id} reset by peer (code {error_code})")
        self._discard_buffer()
        self._wake_reader()
        self._conn._maybe_retire(self)

    def _on_stop_sending(self, error_code: int) -> None:
        if self._send_done:
            return
        # aioquic already answered with RESET_STREAM (RFC 9000 3.5)
        self._send_done = True
        self._write_exc = StreamReset(f"peer stopped reading stream {self.stream_id} (code {error_code})")
        self._wake_drain()
        self._conn._maybe_retire(self)

    def _discard_buffer(self) -> None:
        if not self._released:
            self._quic.rx_unread -= self._buf_len
        self._buf.clear()
        self._off = 0
        self._buf_len = 0
        self._quic.rx_stream_limit.pop(self.stream_id, None)

    def _wake_reader(self) -> None:
        w = self._read_waiter
        if w is not None and not w.done():
            w.set_result(None)

    def _wake_drain(self) -> None:
        w = self._drain_waiter
        if w is not None and not w.done():
            w.set_result(None)

    # -- reading ------------------------------------------------------------------------------

    def _take(self, n: int) -> bytes:
        """Up to ``n`` buffered bytes (there are some), in O(bytes returned): a short read moves
        ``_off`` on inside the head chunk, so a huge chunk read in small pieces costs no more."""
        buf = self._buf
        first = buf[0]
        off = self._off
        avail = len(first) - off
        if avail > n:
            out = first[off : off + n]
            self._off = off + n
        else:
            buf.popleft()
            if off:
                out = first[off:]
                self._off = 0
            else:
                out = first
            if buf and avail < n:
                parts = [out]
                taken = avail
                while buf and taken < n:
                    c = buf[0]
                    room = n - taken
                    if len(c) <= room:
                        buf.popleft()
                        parts.append(c)
                        taken += len(c)
                    else:
                        parts.append(c[:room])
                        self._off = room
                        taken = n
                out = b"".join(parts)
        k = len(out)
        self._buf_len -= k
        self._consumed += k
        if self._released:
            return out
        quic = self._quic
        quic.rx_unread -= k
        conn = self._conn
        if not self._recv_done and self._consumed + self._window - self._advertised >= self._window >> 2:
            target = self._consumed + self._tune()
            if target > self._advertised:
                quic.rx_stream_limit[self.stream_id] = target
                self._advertised = target
                conn._schedule_flush()
        if quic.conn_credit_due():
            conn._schedule_flush()
        return out

    def _tune(self) -> int:
        """This stream's receive window as of a credit update (the rule of the mux's windows,
        transports/mux.py): a quarter window read in under half a round trip since the last
        update means the peer sends a window per round trip and is held back by it: double (at
        most once a round trip); over four round trips means the window is far larger than the
        stream needs: halve, not below the configured one."""
        conn = self._conn
        now = conn._loop.time()
        last, self._credit_at = self._credit_at, now
        rtt = self._quic.smoothed_rtt()
        window = self._window
        if rtt <= 0.0 or last == 0.0:  # (no round trip measured yet, or the first update)
            return window
        elapsed = now - last
        if elapsed < 0.5 * rtt:
            if now - self._grown_at >= rtt and window < conn._max_window:
                window = min(2 * window, conn._max_window)
                self._grown_at = now
        elif elapsed > 4.0 * rtt and window > conn._stream_window:
            window = max(window // 2, conn._stream_window)
        if window != self._window:
            self._window = window
            conn._windows_changed()
        return window

    async def read(self, max_bytes: int = 65536) -> bytes:
        """Up to ``max_bytes`` buffered bytes (waits for some); b"" after the peer's FIN."""
        if max_bytes <= 0:
            raise ValueError("max_bytes must be positive")
        while True:
            if self._buf:
                return self._take(max_bytes)
            if self._read_exc is not None:
                raise self._read_exc
            if self._eof:
                return b""
            if self._conn._closed_exc is not None:
                raise self._conn._closed_exc
            if self._read_waiter is not None:
                raise RuntimeError("another coroutine is already reading this stream")
            self._read_waiter = self._conn._loop.create_future()
            try:
                await self._read_waiter
            finally:
                self._read_waiter = None

    # -- writing ------------------------------------------------------------------------------

    def _check_writable(self) -> None:
        if self._write_exc is not None:
            raise self._write_exc
        if self._send_done:
            raise StreamClosed(f"stream {self.stream_id} is closed for writing")
        if self._conn._closed_exc is not None:
            raise self._conn._closed_exc

    def write(self, data: bytes | bytearray | memoryview) -> None:
        """Queue ``data`` in aioquic's send buffer; ``await drain()`` bounds that buffer."""
        self._check_writable()
        if not data:
            return
        try:
            self._quic.send_stream_data(self.stream_id, data)  # type: ignore[arg-type]
        except (RuntimeError, ValueError) as e:  # reset by STOP_SENDING not yet processed
            raise StreamReset(f"stream {self.stream_id} cannot be written: {e}") from None
        self._conn._schedule_flush()

    def write_buffer_size(self) -> int:
        """Bytes written and not yet sent (sent ones awaiting acknowledgement are in flight)."""
        return self._quic.send_backlog(self.stream_id)[0]

    async def drain(self) -> None:
        """Wait while more than the high-water mark of this stream's data was never sent, or while
        the connection holds more than its send cap awaiting acknowledgement (QuicConn._drained)."""
        conn = self._conn
        while True:
            if self._write_exc is not None:
                raise self._write_exc
            if conn._closed_exc is not None:
                raise conn._closed_exc
            if conn._drained(self.stream_id):
                return
            if self._drain_waiter is not None:
                raise RuntimeError("another coroutine is already draining this stream")
            self._drain_waiter = conn._loop.create_future()
            conn._drain_waiting.add(self)
            try:
                await self._drain_waiter
            finally:
                self._drain_waiter = None
                conn._drain_waiting.discard(self)

    async def close(self) -> None:
        """Half-close: queue FIN after the data already written; reading stays possible."""
        if self._send_done or self._conn._closed_exc is not None:
            return
        self._send_done = True
        try:
            self._quic.send_stream_data(self.stream_id, b"", end_stream=True)
        except (RuntimeError, ValueError):
            pass  # already reset by the peer's STOP_SENDING
        self._conn._schedule_flush()
        self._conn._maybe_retire(self)

    def reset(self) -> None:
        """Abort both directions (RESET_STREAM + STOP_SENDING); the peer sees StreamReset."""
        exc = StreamReset(f"stream {self.stream_id} was reset locally")
        quic = self._quic
        if self._write_exc is None:  # also after our FIN: data not yet delivered is abandoned
            self._send_done = True
            self._write_exc = exc
            try:
                quic.reset_stream(self.stream_id, ERR_NO_ERROR)
            except (RuntimeError, ValueError):
                pass
        if not self._recv_done:
            self._recv_done = True
            self._read_exc = exc
            try:
                quic.stop_stream(self.stream_id, ERR_NO_ERROR)
            except (RuntimeError, ValueError):
                pass  # aioquic has not created the stream yet or already forgot it
        self._discard_buffer()  # (also after the peer's FIN: what nobody will read holds no credit)
        self._wake_reader()
        self._wake_drain()
        self._conn._schedule_flush()
        self._conn._maybe_retire(self)
