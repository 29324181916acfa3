"""``QuicConn``: one aioquic ``QuicConnection`` driven as a Lattica ``Connection`` (handshake and
certificate check, events to streams, timers, keepalive)."""

from __future__ import annotations

import asyncio
import itertools
import os
from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING

from aioquic.quic import events as qev

from lattica._identity import PeerId
from lattica._multiaddr import Multiaddr
from lattica.errors import (
    ConnectionClosed,
    HandshakeError,
    StreamLimit,
    Timeout,
    TransportError,
)
from lattica.logging import get_logger
from lattica.transports.base import GOAWAY_ANSWER, Connection, Stream, StreamHandler
from lattica.transports.quic import _aioquic
from lattica.transports.quic.stream import QuicStream
from lattica.transports.quic.tlscert import verify_certificate
from lattica.transports.quic.wire import (
    ALPN,
    ALPNS,
    ERR_BAD_CERTIFICATE,
    ERR_INTERNAL,
    ERR_NO_ERROR,
    FRAME_CRYPTO,
    MAX_CONTROL,
    decode_goaway,
    encode_goaway,
)

if TYPE_CHECKING:
    from lattica.transports.quic.endpoint import Endpoint
    from lattica.transports.quic.transport import QuicTransport

log = get_logger("lattica.quic")

_CLOSING_CAP = 2.0  # s: a closed connection's state is dropped by then, whatever aioquic's timer says


class QuicConn(Connection):
    """One QUIC connection: pumps aioquic, routes its events to streams, verifies the peer."""

    transport = "quic"

    def __init__(
        self,
        owner: QuicTransport,
        endpoint: Endpoint,
        quic: _aioquic.LatticaQuicConnection,
        peer_addr: tuple,
        direction: str,
        expected: PeerId | None,
        on_verified: Callable[[QuicConn], None] | None = None,
    ) -> None:
        self._owner = owner
        self._endpoint = endpoint
        self._quic = quic
        self._loop = endpoint.loop
        self._peer_addr = peer_addr
        self.direction = direction
        self.local_peer = owner.keypair.peer_id
        self.remote_peer: PeerId = expected  # type: ignore[assignment]  # set once verified
        self.local_addr = endpoint.local_maddr
        self.remote_addr = Multiaddr.from_sockaddr(peer_addr, "quic-v1")
        self._expected = expected
        self._on_verified = on_verified
        self._stream_window = owner.max_stream_data
        # the connection's window stays at NARROW_WINDOW, however its streams' windows grow,
        # until the owner trusts the peer (``widen_windows``)
        self._wide = not owner.narrow_windows
        # streams retired while narrow whose unread bytes still hold the window: let go if it widens
        # (held here, not weakly: a stream dropped unread must not take its credit with it)
        self._held: set[QuicStream] = set()
        self._max_window = owner.max_stream_window
        self._high_water = owner.send_high_water
        # drain() waits while more than _high_water bytes of a stream were never sent, and while
        # the stream holds more than _high_water in all (sent bytes wait for acknowledgement)
        # when the connection's streams hold more than this together: a peer that grants
        # credit and stops acknowledging cannot make a connection hold more (plus _high_water
        # per stream, the bound before bytes in flight were let out of it).
        self._send_cap = owner.send_high_water + owner.max_stream_window
        self._max_out = owner.max_streams
        # peers open streams with the other parity: client-initiated ids are even
        self._peer_parity = 1 if direction == "outbound" else 0
        self._peer_next_idx = 0
        self._peer_unseen: set[int] = set()
        self._streams: dict[int, QuicStream] = {}
        self._n_out = 0
        self._pending_inbound: deque[QuicStream] = deque()
        # going away (Connection.go_away): we said it; the peer's count of streams it opened (None:
        # it has not said it); its control stream so far; the drained close
        self._away_sent = False
        self._peer_away: int | None = None
        self._control = bytearray()
        self._closing: asyncio.Task | None = None
        self._handler: StreamHandler | None = None
        self._drain_waiting: set[QuicStream] = set()
        self._close_cbs: list[Callable[[Connection], None]] = []
        self._closed_exc: ConnectionClosed | None = None
        self._established = False
        self._dead = False
        self._ready: asyncio.Future[None] = self._loop.create_future()
        self._terminated = asyncio.Event()
        self._linger: asyncio.Future[None] | None = None
        self._cids: set[bytes] = set()
        self._flush_handle: asyncio.Handle | None = None
        self._timer: asyncio.TimerHandle | None = None
        self._timer_at: float | None = None
        self._hs_timer: asyncio.TimerHandle | None = (
            self._loop.call_later(owner.first_flight_timeout, self._first_flight_due)
            if direction == "inbound"
            else self._loop.call_later(owner.handshake_timeout, self._handshake_timed_out)
        )
        self._keepalive: asyncio.TimerHandle | None = None
        self._last_rx = self._loop.time()
        self._ping_ids = itertools.count()
        self._bytes_sent = self._bytes_received = 0  # UDP payload bytes (the dashboard's figures)
        # a server's half-round-trip data: the host says who we are once the client's hello is in
        self._early_push = owner.early_push if direction == "inbound" else None

    def __repr__(self) -> str:
        who = self.remote_peer.short() if self.remote_peer else "?"
        return f"<QuicConn {self.direction} {who} {self.remote_addr}>"

    # -- the pump ---------------------------------------------------------------------------

    def _datagram(self, data: bytes, addr: tuple) -> None:
        """Feed one datagram to aioquic; transmission happens once per batch in _flush."""
        now = self._loop.time()
        self._bytes_received += len(data)
        try:
            self._quic.receive_datagram(data, addr, now)
        except Exception:  # an aioquic bug must not take the endpoint down
            self._endpoint.drops += 1
            log.warning("quic.receive_failed", conn=repr(self), exc_info=True)
        heard = self._quic.last_authenticated()  # (a datagram that did not decrypt proves nothing)
        if heard is not None and heard > self._last_rx:
            self._last_rx = heard
        self._schedule_flush()
        if self._early_push is not None and heard is not None:
            alpn = self._quic.negotiated_alpn()
            if alpn is not None:  # (the ClientHello was read: we know whom we speak to)
                push, self._early_push = self._early_push, None
                self.libp2p = alpn == ALPN
                if not self.libp2p:  # (a libp2p peer asks for our identify instead)
                    push(self)

    def _schedule_flush(self) -> None:
        if self._flush_handle is None and not self._dead:
            self._flush_handle = self._loop.call_soon(self._flush)

    def _flush(self) -> None:
        """Handle aioquic's events, send its datagrams, re-arm its timer."""
        self._flush_handle = None
        if self._dead:
            return
        try:
            self._process_events()
            if not self._dead and not self._endpoint.paused:
                self._bytes_sent += self._endpoint.send_datagrams(self._quic.datagrams_to_send(self._loop.time()))
                self._process_events()  # NEW_CONNECTION_ID frames just written: route those CIDs
            if not self._dead:
                self._after_batch()
        except Exception:
            log.error("quic.pump_failed", conn=repr(self), exc_info=True)
            self.abort("internal error in the QUIC pump")

    def _after_batch(self) -> None:
        quic = self._quic
        if self._closed_exc is None:
            ending = quic.ending()
            if ending is not None:
                self._on_ending(ending)
        if self._drain_waiting:
            for s in list(self._drain_waiting):
                if self._drained(s.stream_id):
                    s._wake_drain()
        if self._linger is not None and quic.total_send_buffered() == 0:
            if not self._linger.done():
                self._linger.set_result(None)
        at = quic.get_timer()
        if at is None:
            if self._timer is not None:
                self._timer.cancel()
                self._timer = self._timer_at = None
        elif self._timer is None or at < self._timer_at:  # type: ignore[operator]
            # a later deadline keeps the earlier timer: firing early is harmless (see _on_timer)
            if self._timer is not None:
                self._timer.cancel()
            self._timer_at = at
            self._timer = self._loop.call_at(at, self._on_timer)

    def _drained(self, stream_id: int) -> bool:
        """Whether a writer of this stream may go on (see _send_cap)."""
        quic = self._quic
        unsent, held = quic.send_backlog(stream_id)
        if unsent > self._high_water:
            return False
        return held <= self._high_water or quic.total_send_buffered() <= self._send_cap

    def _on_timer(self) -> None:
        self._timer = self._timer_at = None
        if self._dead:
            return
        now = self._loop.time()
        at = self._quic.get_timer()
        if at is not None and at <= now + 0.0005:
            try:
                self._quic.handle_timer(max(at, now))
            except Exception:
                log.error("quic.timer_failed", conn=repr(self), exc_info=True)
                self.abort("internal error in the QUIC timer")
                return
        self._flush()

    def _on_keepalive(self) -> None:
        self._keepalive = None
        if self._dead or self._closed_exc is not None:
            return
        interval = self._owner._keepalive_interval
        idle = self._loop.time() - self._last_rx
        if idle >= interval * 0.9:
            self._quic.send_ping(next(self._ping_ids))
            self._schedule_flush()
            delay = interval
        else:
            delay = interval - idle
        self._keepalive = self._loop.call_later(delay, self._on_keepalive)

    # -- events -----------------------------------------------------------------------------

    def _process_events(self) -> None:
        quic = self._quic
        streams = self._streams
        ev = quic.next_event()
        while ev is not None and not self._dead:
            if type(ev) is qev.StreamDataReceived:  # (``type(ev) is``: mypy narrows ev by it)
                s = streams.get(ev.stream_id)
                if s is None and ev.stream_id & 2:
                    self._on_control(ev)
                elif s is None:
                    s = self._new_inbound(ev.stream_id)
                    if s is not None:
                        s._on_data(ev.data, ev.end_stream)
                        self._deliver(s)
                else:
                    s._on_data(ev.data, ev.end_stream)
            elif type(ev) is qev.ConnectionIdIssued:
                self._endpoint.register(self, ev.connection_id)
            elif type(ev) is qev.ConnectionIdRetired:
                self._endpoint.unregister_cid(self, ev.connection_id)
            elif type(ev) is qev.StreamReset:
                s = streams.get(ev.stream_id)
                if s is not None:
                    s._on_reset(ev.error_code)
                elif self._new_inbound_id(ev.stream_id):
                    # opened and reset before any data: never shown to the application; reset
                    # our direction too so aioquic can discard the stream
                    try:
                        quic.reset_stream(ev.stream_id, ERR_NO_ERROR)
                    except (RuntimeError, ValueError):
                        pass
            elif type(ev) is qev.StopSendingReceived:
                s = streams.get(ev.stream_id)
                if s is not None:
                    s._on_stop_sending(ev.error_code)
            elif type(ev) is qev.HandshakeCompleted:
                self._on_handshake_completed(ev)
            elif type(ev) is qev.ConnectionTerminated:
                self._on_ending(ev)
                self._teardown()
            ev = quic.next_event()

    def _new_inbound_id(self, stream_id: int) -> bool:
        """True the first time a peer-initiated bidirectional stream id shows up."""
        if stream_id & 2 or (stream_id & 1) != self._peer_parity:
            return False
        idx = stream_id >> 2
        if idx >= self._peer_next_idx:
            # ids below idx were opened implicitly (RFC 9000 2.1); aioquic's stream limit bounds
            # how far ahead a peer can jump, so this set stays small
            self._peer_unseen.update(range(self._peer_next_idx, idx))
            self._peer_next_idx = idx + 1
            return True
        if idx in self._peer_unseen:
            self._peer_unseen.discard(idx)
            return True
        return False  # a stream we already retired: late data is dropped

    def _new_inbound(self, stream_id: int) -> QuicStream | None:
        if self._closed_exc is not None:
            return None
        if not self._new_inbound_id(stream_id):
            return None
        if self._peer_away is not None and stream_id >> 2 >= self._peer_away:
            # beyond the count the peer's own GOAWAY gave: it said it would open no more
            try:
                self._quic.reset_stream(stream_id, ERR_NO_ERROR)
                self._quic.stop_stream(stream_id, ERR_NO_ERROR)
            except (RuntimeError, ValueError):
                pass
            return None
        s = QuicStream(self, stream_id, outbound=False)
        self._streams[stream_id] = s
        return s

    def _deliver(self, s: QuicStream) -> None:
        if self._handler is None:
            self._pending_inbound.append(s)
            return
        try:
            self._handler(s)
        except Exception:
            log.error("quic.stream_handler_failed", conn=repr(self), exc_info=True)
            s.reset()

    def _maybe_retire(self, s: QuicStream) -> None:
        if s._send_done and s._recv_done and self._streams.get(s.stream_id) is s:
            del self._streams[s.stream_id]
            self._quic.rx_stream_limit.pop(s.stream_id, None)
            if s.outbound:
                self._n_out -= 1
            if self._told_away:
                self._close_if_drained()
            # The peer can send nothing more on it; bytes the app has not read yet stay readable
            # but stop holding connection credit, so a stream the app forgets cannot starve the
            # connection -- once the peer is trusted: until then they hold the narrow window
            # until read (else a peer that ends its streams at once pins what it likes).
            if self._wide:
                self._release(s)
            elif s._buf_len:
                if len(self._held) >= 64:  # (those read out since hold nothing: forgotten)
                    self._held = {h for h in self._held if h._buf_len}
                self._held.add(s)
            if s._window > self._stream_window:
                self._windows_changed()

    def _release(self, s: QuicStream) -> None:
        """A retired stream's unread bytes stop holding connection credit (they stay readable)."""
        if not s._released and s._buf_len:
            self._quic.rx_unread -= s._buf_len
            if self._quic.conn_credit_due():
                self._schedule_flush()
        s._released = True

    def widen_windows(self) -> None:
        self._wide = True
        self._quic.widen_connection_window(self._owner.max_data)
        for s in list(self._held):  # (retired before the peer was trusted: as if retired now)
            self._release(s)
        self._held.clear()
        if self._quic.conn_credit_due():
            self._schedule_flush()

    def _windows_changed(self) -> None:
        """A stream's receive window grew, shrank or left: the connection's window is 1.5x the
        largest one left (never below max_data), so it comes back down with them."""
        if not self._wide:
            return
        largest = max((s._window for s in self._streams.values()), default=0)
        self._quic.set_connection_window(largest + largest // 2)

    # -- going away -------------------------------------------------------------------------

    def go_away(self) -> None:
        if self._closed_exc is not None or self._away_sent or not self._established:
            return
        self._away_sent = True
        quic = self._quic
        opened = quic.get_next_available_stream_id() >> 2  # (our bidirectional streams so far)
        sid = quic.get_next_available_stream_id(is_unidirectional=True)
        quic.send_stream_data(sid, encode_goaway(opened), end_stream=True)
        self._schedule_flush()
        self._loop.call_later(GOAWAY_ANSWER, self._goaway_unanswered)
        self._went_away()

    def _goaway_unanswered(self) -> None:
        """No GOAWAY from the peer in time: take it as said, counting the streams that came."""
        if self._peer_away is None and self._closed_exc is None:
            self._peer_away = self._peer_streams_arrived()
            self._close_if_drained()

    @property
    def going_away(self) -> bool:
        return self._away_sent or self._peer_away is not None

    def _on_control(self, ev: qev.StreamDataReceived) -> None:
        """Data on a unidirectional stream: the peer's control stream (its GOAWAY), or nothing
        we know (dropped: we only grant the peer one such stream)."""
        if (ev.stream_id & 1) != self._peer_parity or ev.stream_id >> 2 or self._peer_away is not None:
            return
        self._control += ev.data
        if len(self._control) > MAX_CONTROL:
            self.abort("protocol error: an oversized control message")
            return
        if not ev.end_stream:
            return
        opened = decode_goaway(bytes(self._control))
        if opened is None:
            self.abort("protocol error: a malformed control message")
            return
        log.debug("quic.peer_going_away", conn=repr(self), streams=opened)
        self._peer_away = opened
        self.ended_cleanly = True
        self.go_away()  # our answer: we open no more either
        self._went_away()

    def _peer_streams_arrived(self) -> int:
        """How many of the peer's bidirectional streams have arrived, counted from its first
        (all of them below that number)."""
        return min(self._peer_unseen) if self._peer_unseen else self._peer_next_idx

    def _close_if_drained(self) -> None:
        if (
            self._away_sent
            and self._peer_away is not None
            and self._closing is None
            and self._closed_exc is None
            and not self._streams
            and not self._pending_inbound
            and self._peer_streams_arrived() >= self._peer_away
        ):
            self.ended_cleanly = True
            self._closing = self._loop.create_task(self.close())

    # -- handshake --------------------------------------------------------------------------

    def _on_handshake_completed(self, ev: qev.HandshakeCompleted) -> None:
        if self._closed_exc is not None:
            return
        try:
            if ev.alpn_protocol not in ALPNS:
                raise HandshakeError(f"peer negotiated ALPN {ev.alpn_protocol!r}, not one of {ALPNS}")
            self.libp2p = ev.alpn_protocol == ALPN  # a libp2p peer: multistream-selected streams
            chain = self._quic.peer_certificate_chain()
            if len(chain) != 1:
                raise HandshakeError(f"peer sent {len(chain)} certificates, expected exactly 1")
            peer = verify_certificate(chain[0], self._expected)
        except HandshakeError as e:
            log.info("quic.peer_rejected", addr=str(self.remote_addr), dir=self.direction, reason=str(e))
            # a transport-level close (frame type CRYPTO) so the peer sees a handshake failure
            self._quic.close(
                error_code=ERR_BAD_CERTIFICATE,
                frame_type=FRAME_CRYPTO,
                reason_phrase=str(e)[:256],
            )
            self._fail_ready(e)
            self._mark_closed(ConnectionClosed(f"peer rejected: {e}"))
            return
        self.remote_peer = peer
        self._established = True
        self._max_out = min(self._owner.max_streams, self._quic.remote_max_streams_bidi())
        if self._hs_timer is not None:
            self._hs_timer.cancel()
            self._hs_timer = None
        if self._owner._keepalive_interval > 0:
            self._keepalive = self._loop.call_later(self._owner._keepalive_interval, self._on_keepalive)
        log.debug("quic.connected", peer=peer.short(), addr=str(self.remote_addr), dir=self.direction)
        if not self._ready.done():
            self._ready.set_result(None)
        self._owner._conns.add(self)
        if self._on_verified is not None:
            cb, self._on_verified = self._on_verified, None
            cb(self)

    def _fail_ready(self, exc: Exception) -> None:
        if not self._ready.done():
            self._ready.set_exception(exc)
            self._ready.exception()  # mark retrieved: nobody awaits inbound handshakes

    def _first_flight_due(self) -> None:
        """An inbound handshake: the client's Handshake flight came (wait for the rest as any
        handshake does), or nothing came after its Initial (drop it: its slot is wanted)."""
        self._hs_timer = None
        if self._established or self._dead:
            return
        if self._quic.heard_handshake():
            left = self._owner.handshake_timeout - self._owner.first_flight_timeout
            self._hs_timer = self._loop.call_later(max(left, 0.0), self._handshake_timed_out)
            return
        self._fail_ready(
            Timeout(
                f"QUIC client at {self.remote_addr} sent nothing after its Initial within {self._owner.first_flight_timeout:g}s"
            )
        )
        self.abort("no handshake flight")

    def _handshake_timed_out(self) -> None:
        self._hs_timer = None
        if self._established or self._dead:
            return
        self._fail_ready(
            Timeout(f"QUIC handshake with {self.remote_addr} timed out after {self._owner.handshake_timeout:g}s")
        )
        self.abort("handshake timeout")

    def _icmp_error(self, err: int) -> None:
        """The kernel reported an ICMP error for our peer's address; fail a pending dial."""
        if self._established or self._dead:
            return
        exc = TransportError(f"cannot reach {self.remote_addr}: {os.strerror(err)}")
        self._fail_ready(exc)
        self.abort(str(exc))

    # -- closing ----------------------------------------------------------------------------

    def _on_ending(self, ev: qev.ConnectionTerminated | None) -> None:
        if self._closed_exc is not None:
            return
        code = ev.error_code if ev is not None else ERR_INTERNAL
        reason = (ev.reason_phrase if ev is not None else "") or "no reason given"
        self.ended_cleanly = code == ERR_NO_ERROR
        if not self._established:
            if 0x100 <= code <= 0x1FF:
                self._fail_ready(
                    HandshakeError(f"QUIC handshake with {self.remote_addr} failed: {reason} (code {code:#x})")
                )
            else:
                self._fail_ready(
                    TransportError(
                        f"QUIC connection to {self.remote_addr} closed during the handshake: {reason} (code {code:#x})"
                    )
                )
        self._mark_closed(ConnectionClosed(f"QUIC connection closed: {reason} (code {code:#x})"))

    def _mark_closed(self, exc: ConnectionClosed) -> None:
        if self._closed_exc is not None:
            return
        self._closed_exc = exc
        log.debug("quic.closed", conn=repr(self), reason=str(exc), streams=len(self._streams))
        if not self._established:
            self._fail_ready(exc)  # a dial still waiting must not hang
        for s in list(self._streams.values()):
            s._wake_reader()
            s._wake_drain()
        for s in self._pending_inbound:
            s._wake_reader()
        if self._linger is not None and not self._linger.done():
            self._linger.set_result(None)
        if self._keepalive is not None:
            self._keepalive.cancel()
            self._keepalive = None
        cbs, self._close_cbs = self._close_cbs, []
        for cb in cbs:
            try:
                cb(self)
            except Exception:
                log.error("quic.close_callback_failed", conn=repr(self), exc_info=True)

    def _teardown(self) -> None:
        """Forget the connection: no more datagrams, timers or events."""
        if self._dead:
            return
        self._dead = True
        self._mark_closed(ConnectionClosed("QUIC connection closed"))
        for h in (self._flush_handle, self._timer, self._hs_timer, self._keepalive):
            if h is not None:
                h.cancel()
        self._flush_handle = self._timer = self._hs_timer = self._keepalive = None
        self._endpoint.forget(self)
        self._owner._conns.discard(self)
        self._terminated.set()

    # -- Connection API ---------------------------------------------------------------------

    async def open_stream(self) -> Stream:
        """Open a bidirectional stream; raises StreamLimit beyond the negotiated stream count."""
        if self._closed_exc is not None:
            raise self._closed_exc
        if self.going_away:
            raise ConnectionClosed(f"QUIC connection to {self.remote_peer} is going away: open streams on another")
        if self._n_out >= self._max_out:
            raise StreamLimit(f"{self._n_out} outbound streams already open (limit {self._max_out})")
        quic = self._quic
        sid = quic.get_next_available_stream_id()
        quic.send_stream_data(sid, b"")  # creates the stream in aioquic; the peer sees it on data
        s = QuicStream(self, sid, outbound=True)
        self._streams[sid] = s
        self._n_out += 1
        return s

    def set_stream_handler(self, handler: StreamHandler) -> None:
        """Install the inbound stream handler and hand it the streams that arrived before."""
        self._handler = handler
        while self._pending_inbound and self._handler is handler:
            self._deliver(self._pending_inbound.popleft())

    async def close(self) -> None:
        """Let written data reach the peer (bounded by close_linger), then send CONNECTION_CLOSE
        and return (the closing period goes on without the caller)."""
        if self._closed_exc is None and not self._dead:
            if self._quic.total_send_buffered() > 0 and self._owner.close_linger > 0:
                self._linger = self._loop.create_future()
                try:
                    await asyncio.wait_for(asyncio.shield(self._linger), self._owner.close_linger)
                except TimeoutError:
                    pass
            if self._closed_exc is None and not self._dead:
                self.ended_cleanly = True
                self._quic.close(error_code=ERR_NO_ERROR, reason_phrase="closed")
                self._mark_closed(ConnectionClosed("QUIC connection closed locally"))
                self._flush()
        # aioquic keeps the connection through its closing period (3 PTO) to answer stragglers:
        # that runs on in the background (waiting for it held a script's exit for ~5 round trips),
        # ended by aioquic's timer, or by this cap (or the transport's close) if that never fires
        if not self._dead:
            self._loop.call_later(_CLOSING_CAP, self._teardown)

    def abort(self, reason: str) -> None:
        """Drop the connection now; one CONNECTION_CLOSE is sent best-effort, without waiting."""
        if self._dead:
            return
        if self._closed_exc is None:
            try:
                self._quic.close(error_code=ERR_INTERNAL, reason_phrase=reason[:256])
                if not self._endpoint.paused:
                    for data, addr in self._quic.datagrams_to_send(self._loop.time()):
                        self._endpoint.sendto(data, addr)
            except Exception:
                pass
            self._mark_closed(ConnectionClosed(f"QUIC connection aborted: {reason}"))
        self._teardown()

    @property
    def is_closed(self) -> bool:
        return self._closed_exc is not None

    @property
    def num_streams(self) -> int:
        return len(self._streams)

    @property
    def peer_streams(self) -> int:
        return len(self._streams) - self._n_out

    @property
    def last_received(self) -> float | None:
        return self._last_rx

    def path_stats(self) -> dict[str, float] | None:
        stats: dict[str, float] = {"bytes_sent": self._bytes_sent, "bytes_received": self._bytes_received}
        loss = getattr(self._quic, "_loss", None)  # (aioquic's recovery state: private, checked against 1.7)
        if loss is not None and getattr(loss, "_rtt_initialized", False):
            stats["rtt_ms"] = loss._rtt_smoothed * 1000.0
        return stats

    def add_close_callback(self, cb: Callable[[Connection], None]) -> None:
        """Call ``cb(conn)`` once when the connection closes (now, if it already has)."""
        if self._closed_exc is not None:
            self._loop.call_soon(cb, self)
        else:
            self._close_cbs.append(cb)

    async def wait_closed(self) -> None:
        await self._terminated.wait()
