"""asyncio glue: a byte pipe + (optional) Noise session + Mux = a Connection of Streams.

Used by the TCP transport (with Noise) and the in-memory transport (without: both ends live in
one process). All protocol decisions are in ``mux.py`` and ``noise.py``; this module only moves
bytes, wakes waiting coroutines, batches writes per loop iteration and runs the keepalive timer.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable
from time import monotonic as _monotonic
from typing import Protocol

from lattica._identity import PeerId
from lattica._multiaddr import Multiaddr
from lattica.errors import ConnectionClosed, LatticaError, ProtocolError, StreamClosed, StreamReset
from lattica.logging import get_logger
from lattica.transports.base import GOAWAY_ANSWER, PROBE_TIMEOUT, Connection, OpenGate, Stream, StreamHandler
from lattica.transports.mux import (
    GOAWAY_NORMAL,
    GOAWAY_PROTOCOL,
    DataReceived,
    GoAwayReceived,
    Mux,
    MuxConfig,
    PongReceived,
    StreamEnded,
    StreamOpened,
    StreamRefused,
    StreamWasReset,
    WindowUpdated,
)
from lattica.transports.noise import MAX_PLAINTEXT, NoiseSession, PlainBuffer
from lattica.transports.tcpinfo import tcp_info

log = get_logger("lattica.transport")
# bytes queued for a paused socket before we give up on the peer: stream data within the peer's
# credit goes to the socket at once (credit is bounded by the peer's buffer budget: 64 MiB by
# default, plus 256 KiB a stream, and a tuned window may hold 16 MiB), so this is well above it
_MAX_UNSENT = 256 * 1024 * 1024
_MAX_ANSWERS = 1024 * 1024  # bytes of pongs and refusals queued while the peer does not read its socket
_SPARE_MAX = 1024 * 1024  # a sealed buffer this size or smaller is kept for the next write
FRAME_TIME = 0.001  # a Noise frame holds what the path carries in this long (frame_limit)
_FRAME_OVERHEAD = 2 + 16  # a Noise frame's length prefix and tag
_OPENS_ASKED = 32  # stream opens asked of a metered connection's gate at a time
_HOLD_MIN = 0.02  # s: the shortest a held connection waits before its gate is asked again
_HELD_UNGATED = 1024 * 1024  # bytes held behind a SYN before there is a gate: past this the socket waits unread


def frame_limit(pacing_rate: float | None, mss: float | None) -> int:
    """Plaintext bytes per Noise frame for a path the kernel paces at ``pacing_rate`` bytes/s.

    A receiver opens nothing of a frame until all of it is in, so a 64 KiB frame on a path that
    delivers 300 KB/s holds every message in it for ~200 ms. A frame is therefore what the path
    carries in FRAME_TIME (at least one segment's worth), up to Noise's 64 KiB: on loopback and
    LAN paths frames stay whole, and on slow paths they cost one encryption per millisecond.
    """
    if not pacing_rate:
        return MAX_PLAINTEXT
    floor = max(int(mss or 0) - _FRAME_OVERHEAD, 512)
    return max(floor, min(int(pacing_rate * FRAME_TIME), MAX_PLAINTEXT))


class ByteWriter(Protocol):
    """The part of an asyncio transport the connection writes to."""

    def write(self, data: bytes | bytearray | memoryview) -> None: ...
    def close(self) -> None: ...
    def abort(self) -> None: ...
    def is_closing(self) -> bool: ...
    def get_write_buffer_size(self) -> int: ...


class MuxedStream(Stream):
    __slots__ = (
        "stream_id",
        "_conn",
        "_chunks",
        "_offset",
        "_eof",
        "_error",
        "_waiter",
        "_pending",
        "_pending_bytes",
        "_drain_waiter",
        "_fin_queued",
        "_write_closed",
    )

    def __init__(self, conn: MuxedConnection, stream_id: int) -> None:
        self.stream_id = stream_id
        self._conn = conn
        self._chunks: deque[bytes] = deque()
        self._offset = 0  # read position inside _chunks[0]
        self._eof = False
        self._error: LatticaError | None = None
        self._waiter: asyncio.Future | None = None
        self._pending: deque[memoryview] = deque()  # written, waiting for peer credit
        self._pending_bytes = 0
        self._drain_waiter: asyncio.Future | None = None
        self._fin_queued = False
        self._write_closed = False

    def __repr__(self) -> str:
        return f"<MuxedStream {self.stream_id} to {self._conn.remote_peer.short()}>"

    # -- reading -----------------------------------------------------------------------------

    async def read(self, max_bytes: int = 65536) -> bytes:
        while not self._chunks:
            if self._error is not None:
                raise self._error
            if self._eof:
                return b""
            if self._waiter is not None:
                raise RuntimeError(f"another coroutine is already reading stream {self.stream_id}")
            self._waiter = self._conn._loop.create_future()
            try:
                await self._waiter
            finally:
                self._waiter = None
        chunk = self._chunks[0]
        off = self._offset
        avail = len(chunk) - off
        if avail <= max_bytes:
            self._chunks.popleft()
            self._offset = 0
            data = chunk if off == 0 else chunk[off:]
        else:
            data = chunk[off : off + max_bytes]
            self._offset = off + max_bytes
        self._conn._consumed(self.stream_id, len(data))
        return data

    def _feed(self, data: bytes) -> None:
        self._chunks.append(data)
        w = self._waiter
        if w is not None and not w.done():
            w.set_result(None)

    def _feed_eof(self) -> None:
        self._eof = True
        w = self._waiter
        if w is not None and not w.done():
            w.set_result(None)

    @property
    def aborted(self) -> bool:
        return self._error is not None

    def _fail(self, error: LatticaError) -> None:
        if self._error is None:
            self._error = error
        for w in (self._waiter, self._drain_waiter):
            if w is not None and not w.done():
                w.set_result(None)

    # -- writing -----------------------------------------------------------------------------

    def write(self, data: bytes | bytearray | memoryview) -> None:
        if self._error is not None:
            raise self._error
        if self._write_closed:
            raise StreamClosed(f"stream {self.stream_id} is closed for writing")
        if not data:
            return
        conn = self._conn
        if not self._pending:
            n = conn._mux.send_data(self.stream_id, data)
            conn._schedule_flush()
            if n == len(data):
                return
            data = memoryview(data)[n:]
        else:
            data = memoryview(data)
        self._pending.append(data)
        self._pending_bytes += len(data)

    def _on_credit(self) -> None:
        """The peer granted credit: move pending data into the mux."""
        mux = self._conn._mux
        pending = self._pending
        while pending:
            head = pending[0]
            try:
                n = mux.send_data(self.stream_id, head)
            except StreamReset:  # (reset meanwhile: its reset event ends the stream, never the connection)
                return
            if n == 0:
                break
            self._pending_bytes -= n
            if n == len(head):
                pending.popleft()
            else:
                pending[0] = head[n:]
                break
        self._conn._schedule_flush()
        if not pending:
            if self._fin_queued:
                self._fin_queued = False
                mux.close_stream(self.stream_id)
            w = self._drain_waiter
            if w is not None and not w.done():
                w.set_result(None)

    async def drain(self) -> None:
        while True:
            if self._error is not None:
                raise self._error
            if self._conn._closed:
                raise ConnectionClosed(f"connection to {self._conn.remote_peer} is closed")
            if self._pending_bytes == 0 and not self._conn._write_paused:
                return
            self._drain_waiter = self._conn._loop.create_future()
            if self._pending_bytes == 0:
                self._conn._drain_waiters.append(self._drain_waiter)
            try:
                await self._drain_waiter
            finally:
                self._drain_waiter = None

    def write_buffer_size(self) -> int:
        return self._pending_bytes

    async def close(self) -> None:
        if self._write_closed or self._error is not None:
            return
        self._write_closed = True
        if self._pending:
            self._fin_queued = True
        else:
            self._conn._mux.close_stream(self.stream_id)
            self._conn._schedule_flush()
        await self.drain()
        self._conn._maybe_drop(self)

    def reset(self) -> None:
        if self._error is None:
            conn = self._conn
            conn._mux.reset_stream(self.stream_id)
            conn._schedule_flush()
            conn._streams.pop(self.stream_id, None)
            self._fail(StreamReset(f"stream {self.stream_id} was reset locally"))
            if conn._told_away:
                conn._close_if_drained()


class MuxedConnection(Connection):
    """A Connection over any byte pipe: optional Noise sealing, then the Mux."""

    def __init__(
        self,
        writer: ByteWriter,
        *,
        transport: str,
        direction: str,
        local_peer: PeerId,
        remote_peer: PeerId,
        local_addr: Multiaddr,
        remote_addr: Multiaddr,
        session: NoiseSession | None,
        mux_config: MuxConfig | None = None,
        keepalive_interval: float = 15.0,
        keepalive_timeout: float = 30.0,
        writer_lets_go: bool = False,
        plain: PlainBuffer | None = None,
        hold_opens: bool = False,
        narrow_windows: bool = False,
    ) -> None:
        """``writer_lets_go``: the writer keeps no reference to written data once its write buffer
        is empty (an asyncio socket transport), so a sealed buffer it has fully taken is reused.
        ``plain``: where received frames are opened, shared by the connections of one loop (each
        read is parsed before the next; see ``NoiseSession.open_frames``). ``hold_opens``: the
        peer's stream opens wait unparsed, its socket unread, until ``meter_opens`` gives a gate
        (a writer that can pause reading: the owner meters every open, its first ones too).
        ``narrow_windows``: streams the peer opens get yamux's minimum window until
        ``widen_windows`` (its owner trusts the peer)."""
        self._loop = asyncio.get_running_loop()
        self._writer = writer
        self._reuse = writer_lets_go and session is not None
        self._session = session
        self._plain = plain
        self.transport = transport
        self.direction = direction
        self.local_peer = local_peer
        self.remote_peer = remote_peer
        self.local_addr = local_addr
        self.remote_addr = remote_addr
        self._mux = Mux(direction == "outbound", mux_config)
        self._streams: dict[int, MuxedStream] = {}
        self._handler: StreamHandler | None = None
        self._unhandled: list[MuxedStream] = []
        self._flush_scheduled = False
        self._spare: bytearray | None = None  # the last sealed buffer, reused once fully written
        self._write_paused = False
        self._drain_waiters: list[asyncio.Future] = []
        self._closed = False
        self._close_reason: str | None = None
        self._close_callbacks: list[Callable[[Connection], None]] = []
        self._closed_event = asyncio.Event()
        self._last_recv = self._loop.time()
        self._rtt_ping = 0  # id of the last ping timing the round trip (0 is the keepalive's)
        self._rtt_sent: float | None = None  # loop time it went out; None once answered
        self._rtt_ms: float | None = None
        self._rtt_due = 0.0  # when the mux's round trip and the frame size are next refreshed
        self._frame = MAX_PLAINTEXT  # plaintext bytes per Noise frame (frame_limit)
        self._gate: OpenGate | None = None
        self._hold_timer: asyncio.TimerHandle | None = None
        self._reading_paused = False  # (by us: the peer's opens wait for the gate)
        self._refusals_logged = 0
        if hold_opens and callable(getattr(writer, "pause_reading", None)):
            self._mux.open_credit = 0
        self._mux.generous = not narrow_windows
        self._keepalive_interval = keepalive_interval
        self._keepalive_timeout = keepalive_timeout
        self._keepalive_handle = (
            self._loop.call_later(keepalive_interval, self._keepalive) if keepalive_interval > 0 else None
        )

    def __repr__(self) -> str:
        return f"<{self.transport} {self.direction} connection to {self.remote_peer.short()}>"

    # -- Connection API -------------------------------------------------------------------

    async def open_stream(self) -> Stream:
        if self._closed:
            raise ConnectionClosed(f"connection to {self.remote_peer} is closed ({self._close_reason})")
        if self.going_away:
            raise ConnectionClosed(f"connection to {self.remote_peer} is going away: open streams on another")
        sid = self._mux.open_stream()
        stream = MuxedStream(self, sid)
        self._streams[sid] = stream
        self._schedule_flush()
        return stream

    def set_stream_handler(self, handler: StreamHandler) -> None:
        self._handler = handler
        queued, self._unhandled = self._unhandled, []
        for s in queued:
            handler(s)

    async def close(self) -> None:
        if self._closed:
            return
        self.ended_cleanly = True
        self._mux.go_away()
        self._flush()
        self._teardown("closed locally", graceful=True)
        await self.wait_closed()

    def abort(self, reason: str) -> None:
        self._teardown(reason, graceful=False)

    def go_away(self) -> None:
        if self._closed or self._mux.local_goaway:
            return
        self._mux.go_away(GOAWAY_NORMAL)
        self._schedule_flush()
        self._loop.call_later(GOAWAY_ANSWER, self._goaway_unanswered)
        self._went_away()

    def _goaway_unanswered(self) -> None:
        """The peer did not answer our go-away in time (an older node, or one that will not):
        take it as said, so its new streams are refused and the connection can drain."""
        if not self._closed and not self._mux.remote_goaway:
            self._mux.remote_goaway = True
            self._close_if_drained()

    @property
    def going_away(self) -> bool:
        return self._mux.local_goaway or self._mux.remote_goaway

    def _close_if_drained(self) -> None:
        if self._told_away and not self._closed and not self._streams and not self._unhandled and self._mux.drained:
            # (on the next turn of the loop: this may run inside a stream's close or reset)
            self._loop.call_soon(self._drained_close)

    def _drained_close(self) -> None:
        if not self._closed and not self._streams and not self._unhandled and self._mux.drained:
            self.ended_cleanly = True
            self._flush()
            self._teardown("went away: every stream ended", graceful=True)

    @property
    def is_closed(self) -> bool:
        return self._closed

    @property
    def num_streams(self) -> int:
        return len(self._streams)

    @property
    def last_received(self) -> float | None:
        return self._last_recv

    def path_stats(self) -> dict[str, float] | None:
        """The kernel's figures for a direct TCP path; for a relayed one (its socket, if any, ends
        at the relay) the round trip is timed end to end with a mux ping sent now, so a reading
        shows the previous ping's answer, and the bytes are those of the circuit."""
        info = getattr(self._writer, "get_extra_info", None)  # (a socket transport; a circuit's stream has none)
        stats = tcp_info(info("socket")) if info is not None else None
        if stats is not None and "/p2p-circuit" not in str(self.remote_addr):
            return stats
        stats = {
            k: v for k, v in (stats or {}).items() if k in ("bytes_sent", "bytes_received")
        }  # (not the hop's timing)
        counted = getattr(self._writer, "bytes_counted", None)  # (the circuit's in-stream pipe counts its bytes)
        if counted is not None:
            stats["bytes_sent"], stats["bytes_received"] = counted()
        self._time_round_trip()
        if self._rtt_ms is not None:
            stats["rtt_ms"] = self._rtt_ms
        return stats or None

    def _time_round_trip(self) -> None:
        now = _monotonic()  # (not the loop's clock: uvloop's moves in whole milliseconds)
        if self._closed or (self._rtt_sent is not None and now - self._rtt_sent < PROBE_TIMEOUT):
            return
        self._rtt_ping = self._rtt_ping % 0xFFFFFFFE + 1
        self._rtt_sent = now
        self._mux.ping(self._rtt_ping)
        self._schedule_flush()

    def _refresh_rtt(self, now: float) -> None:
        """Keep the mux's round trip (window tuning) and the Noise frame size current, once a
        second while data flows (sooner until a first figure is in)."""
        stats = self.path_stats()
        rtt = stats.get("rtt_ms") if stats else None
        if rtt is not None:
            self._mux.rtt = rtt / 1000.0
            self._frame = frame_limit(stats.get("pacing_rate"), stats.get("mss"))  # type: ignore[union-attr]
        self._rtt_due = now + (0.1 if rtt is None else 1.0)

    def _pong(self, ping_id: int) -> None:
        if ping_id == self._rtt_ping and self._rtt_sent is not None:
            sample = (_monotonic() - self._rtt_sent) * 1000.0
            self._rtt_ms = sample if self._rtt_ms is None else 0.75 * self._rtt_ms + 0.25 * sample
            self._rtt_sent = None

    def add_close_callback(self, cb: Callable[[Connection], None]) -> None:
        if self._closed:
            self._loop.call_soon(cb, self)
        else:
            self._close_callbacks.append(cb)

    async def wait_closed(self) -> None:
        await self._closed_event.wait()

    # -- bytes in ---------------------------------------------------------------------------

    def receive_plain(self, data: bytes) -> None:
        """Mux bytes that were already opened: what a libp2p peer sent right behind its choice of
        the muxer, which ran over this connection's Noise session before the connection existed."""
        if self._closed:
            return
        self._last_recv = self._loop.time()
        try:
            events = self._mux.receive_data(data)
        except ProtocolError as e:
            self._broke_protocol(e)
            return
        self._take(events)

    def data_received(self, data: bytes | memoryview) -> None:
        """Called by the byte pipe with ciphertext (or plaintext ``bytes`` for in-memory pipes).

        Ciphertext may be a view of the pipe's reusable receive buffer: it is decrypted (copied)
        before this returns.
        """
        if self._closed:
            return
        try:
            if self._session is not None:
                events = None
                for plain in self._session.open_frames(data, self._plain):  # (each parsed before the next is opened)
                    if events is None:
                        events = []
                    events += self._mux.receive_data(plain)
                if events is None:
                    return  # (part of a frame: it counts as news of the peer once it decrypts)
                self._last_recv = self._loop.time()
            else:
                self._last_recv = self._loop.time()
                events = self._mux.receive_data(data)
        except ProtocolError as e:
            self._broke_protocol(e)
            return
        self._take(events)

    def _take(self, events: list) -> None:
        """Act on what the mux parsed; stream opens it held behind the host's gate wait for it
        (``_on_held``), however the bytes came: a held open with no more bytes behind it would
        otherwise wait for ever."""
        self._dispatch(events)
        if self._mux.held and self._hold_timer is None and not self._closed:
            self._on_held()

    def _broke_protocol(self, e: ProtocolError) -> None:
        log.info("closing connection: peer broke the protocol", peer=str(self.remote_peer), reason=str(e))
        self._mux.go_away(GOAWAY_PROTOCOL)
        self._flush()
        self._teardown(f"protocol error: {e}", graceful=True)

    def widen_windows(self) -> None:
        self._mux.generous = True

    @property
    def peer_streams(self) -> int:
        return self._mux.remote_streams

    @property
    def opens_granted(self) -> int:
        return self._mux.open_credit or 0

    def meter_opens(self, gate: OpenGate) -> bool:
        if not callable(getattr(self._writer, "pause_reading", None)):
            return False
        self._gate = gate
        if self._mux.open_credit is None:
            self._mux.open_credit = 0  # (the first SYN asks the gate)
        elif self._mux.held and self._hold_timer is None:  # (opens came before the gate)
            self._hold_timer = self._loop.call_soon(self._unhold)  # type: ignore[assignment]
        return True

    def _on_held(self) -> None:
        """The peer's next SYN waits for credit: take what the gate allows and parse on, or stop
        reading the pipe until the gate is asked again (or given: none yet)."""
        mux = self._mux
        while mux.held and not self._closed:
            if self._gate is None:  # (not adopted yet: its owner gives one soon, or never, as a bare dial's)
                if mux.held_bytes > _HELD_UNGATED:
                    self._pause_reading()
                return
            n, wait = self._gate(_OPENS_ASKED)
            if n <= 0:
                self._pause_reading()
                self._hold_timer = self._loop.call_later(max(wait, _HOLD_MIN), self._unhold)
                return
            mux.grant_opens(n)
            try:
                events = mux.receive_data(b"")
            except ProtocolError as e:
                self._broke_protocol(e)
                return
            self._dispatch(events)

    def _pause_reading(self) -> None:
        if not self._reading_paused:
            self._reading_paused = True
            self._writer.pause_reading()  # type: ignore[attr-defined]

    def _unhold(self) -> None:
        self._hold_timer = None
        if self._closed:
            return
        self._on_held()
        if self._hold_timer is None and not self._closed and not self._mux.held and self._reading_paused:
            self._reading_paused = False
            self._writer.resume_reading()  # type: ignore[attr-defined]

    def _dispatch(self, events: list) -> None:
        """Hand the mux's events to the streams, the handler and the timers."""
        streams = self._streams
        for ev in events:
            t = type(ev)
            if t is DataReceived:
                s = streams.get(ev.stream_id)
                if s is not None:
                    s._feed(ev.data)
            elif t is WindowUpdated:
                s = streams.get(ev.stream_id)
                if s is not None and s._pending:
                    s._on_credit()
            elif t is StreamOpened:
                s = MuxedStream(self, ev.stream_id)
                streams[ev.stream_id] = s
                if self._handler is not None:
                    self._handler(s)
                else:
                    self._unhandled.append(s)
            elif t is StreamEnded:
                s = streams.get(ev.stream_id)
                if s is not None:
                    s._feed_eof()
                    self._maybe_drop(s)
            elif t is StreamWasReset:
                s = streams.pop(ev.stream_id, None)
                if s is not None:
                    s._fail(StreamReset(f"stream {ev.stream_id} was reset by the peer"))
                    if self._told_away:
                        self._close_if_drained()
            elif t is PongReceived:
                if ev.opaque:  # (keepalive pings carry 0: any received bytes already refreshed _last_recv)
                    self._pong(ev.opaque)
            elif t is StreamRefused:
                self._refusals_logged += 1
                if self._refusals_logged == 1:  # (once a connection: a flood of them costs no more than the refusals)
                    log.info("refusing inbound streams", peer=str(self.remote_peer), reason=ev.reason)
            elif t is GoAwayReceived:
                log.debug("peer is going away", peer=str(self.remote_peer), code=ev.code)
                self.ended_cleanly = ev.code == GOAWAY_NORMAL
                if ev.code != GOAWAY_NORMAL:  # (an error: yamux ends the session there)
                    self._teardown(f"the peer went away with error code {ev.code}", graceful=True)
                    return
                if not self._closed:
                    self._mux.go_away(GOAWAY_NORMAL)  # our answer: we open no more either
                    self._went_away()
        if self._mux.has_data_to_send():
            self._flush()

    def connection_lost(self, exc: Exception | None) -> None:
        """Called by the byte pipe when the underlying transport is gone."""
        self._teardown("connection lost" if exc is None else f"connection lost: {exc}", graceful=False)

    def pause_writing(self) -> None:
        self._write_paused = True

    def resume_writing(self) -> None:
        self._write_paused = False
        waiters, self._drain_waiters = self._drain_waiters, []
        for w in waiters:
            if not w.done():
                w.set_result(None)

    # -- bytes out --------------------------------------------------------------------------

    def _consumed(self, sid: int, n: int) -> None:
        now = _monotonic()  # (not the loop's clock: uvloop's moves in whole milliseconds)
        if now >= self._rtt_due:
            self._refresh_rtt(now)
        self._mux.consumed(sid, n, now)
        if self._mux.has_data_to_send():
            self._schedule_flush()
        s = self._streams.get(sid)
        if s is not None and s._eof and not s._chunks:
            self._maybe_drop(s)

    def _maybe_drop(self, s: MuxedStream) -> None:
        if s._eof and s._write_closed and not s._chunks and not s._pending:
            self._streams.pop(s.stream_id, None)
            if self._told_away:
                self._close_if_drained()

    def _schedule_flush(self) -> None:
        if not self._flush_scheduled:
            self._flush_scheduled = True
            self._loop.call_soon(self._flush)

    def _flush(self) -> None:
        self._flush_scheduled = False
        if self._closed:
            return
        pieces = self._mux.pieces_to_send()
        if not pieces:
            return
        if self._session is not None:
            now = _monotonic()
            if now >= self._rtt_due:
                self._refresh_rtt(now)
            spare, self._spare = self._spare, None
            sealed = self._session.seal_pieces(pieces, spare, self._frame)
            self._writer.write(sealed)
            if self._reuse and len(sealed) <= _SPARE_MAX and not self._writer.get_write_buffer_size():
                # all of it went to the kernel (or was copied): the buffer is ours again
                self._spare = sealed.obj if type(sealed) is memoryview else sealed  # type: ignore[assignment]
        else:
            write = self._writer.write
            for piece in pieces:
                write(piece)
        if not self._write_paused:
            self._mux.answered = 0
        elif self._mux.answered > _MAX_ANSWERS or self._writer.get_write_buffer_size() > _MAX_UNSENT:
            # Beyond the peer's credit, stream data waits for drain(); what piles up besides is
            # what the mux says by itself: answers to the peer's pings and refused streams (a
            # peer that sends them and never reads could make us queue them without end), and
            # window updates, bounded by what we read.
            log.info("closing connection: peer stopped reading", peer=str(self.remote_peer))
            self._teardown("peer stopped reading", graceful=False)

    # -- lifecycle --------------------------------------------------------------------------

    def probe(self, timeout: float) -> None:
        if self._closed:
            return
        since = self._loop.time()
        self._mux.ping(0)  # any reply (or any traffic) refreshes _last_recv
        self._flush()

        def check() -> None:
            if not self._closed and self._last_recv < since:
                log.info("closing connection: no answer to a probe", peer=str(self.remote_peer), waited=timeout)
                self._teardown("no answer to a probe", graceful=False)

        self._loop.call_later(timeout, check)

    def _keepalive(self) -> None:
        if self._closed:
            return
        idle = self._loop.time() - self._last_recv
        if idle >= self._keepalive_timeout:
            log.info("closing connection: keepalive timeout", peer=str(self.remote_peer), idle=round(idle, 1))
            self._teardown("keepalive timeout", graceful=False)
            return
        if idle >= self._keepalive_interval * 0.9:
            self._mux.ping(0)  # any reply (or any traffic) refreshes _last_recv
            self._flush()
        self._keepalive_handle = self._loop.call_later(self._keepalive_interval / 3, self._keepalive)

    def _teardown(self, reason: str, graceful: bool) -> None:
        if self._closed:
            return
        self._closed = True
        self._close_reason = reason
        log.debug(
            "connection closed",
            peer=str(self.remote_peer),
            transport=self.transport,
            direction=self.direction,
            reason=reason,
            streams=len(self._streams),
        )
        if self._keepalive_handle is not None:
            self._keepalive_handle.cancel()
        if self._hold_timer is not None:
            self._hold_timer.cancel()
            self._hold_timer = None
        err = ConnectionClosed(f"connection to {self.remote_peer} closed: {reason}")
        for s in list(self._streams.values()) + self._unhandled:
            s._fail(err)
        self._streams.clear()
        self._unhandled.clear()
        self._write_paused = False
        for w in self._drain_waiters:
            if not w.done():
                w.set_result(None)
        try:
            self._writer.close() if graceful else self._writer.abort()
        except Exception:  # the pipe may already be gone; nothing more to do
            pass
        self._closed_event.set()
        callbacks, self._close_callbacks = self._close_callbacks, []
        for cb in callbacks:
            try:
                cb(self)
            except Exception:
                log.exception("connection close callback failed")
