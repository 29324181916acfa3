"""QUIC transport (aioquic): TLS 1.3 with libp2p certificates, one UDP socket per address family.

Why one socket: hole punching needs our outbound QUIC packets to leave from the port we listen
on, so that a NAT mapping created by the dial is the one the peer was told about. Each UDP socket
is an ``_Endpoint`` that routes datagrams to connections by destination connection ID; a dial
uses the listening endpoint of its address family when there is one.

Authentication follows the libp2p TLS spec (see ``tlscert.py``): both sides present a
self-signed certificate whose extension carries their Ed25519 host key; after aioquic reports
HandshakeCompleted we verify the peer's certificate ourselves. A dialer whose check fails
closes the connection before its TLS Finished is ever sent, so the listener never completes
the handshake. An inbound connection is handed to ``on_connection`` only once verified.

aioquic is sans-IO: we feed it datagrams and timer ticks and send what ``datagrams_to_send``
returns, once per batch of received datagrams. Everything that touches aioquic's private API
lives in ``_aioquic.py``.
"""

from __future__ import annotations

import asyncio
import datetime
import errno as errno_mod
import ipaddress
import itertools
import os
import socket
import struct
from collections import deque
from collections.abc import Callable
from typing import Any

from aioquic.quic import events as qev
from aioquic.quic.configuration import QuicConfiguration

from lattica.logging import get_logger
from lattica.errors import (
    ConnectionClosed,
    HandshakeError,
    MultiaddrError,
    StreamClosed,
    StreamLimit,
    StreamReset,
    Timeout,
    TransportError,
)
from lattica.identity import KeyPair, PeerId
from lattica.multiaddr import Multiaddr
from lattica.transports import _aioquic
from lattica.transports.base import Connection, ConnectionHandler, Listener, Stream, StreamHandler, Transport
from lattica.transports.tlscert import CertifiedKey, generate_certificate, verify_certificate

__all__ = ["QuicTransport", "QuicConn", "QuicStream", "QuicListener", "ALPN"]

log = get_logger("lattica.quic")

ALPN = "libp2p"
_CID_LEN = 8
_SUPPORTED_VERSIONS = frozenset(QuicConfiguration(is_client=False).supported_versions)  # v1, v2
_MIN_INITIAL = 1200  # RFC 9000 14.1: a client Initial datagram is at least this large
_ERR_NO_ERROR = 0x0
_ERR_INTERNAL = 0x1
_ERR_BAD_CERTIFICATE = 0x100 + 42  # CRYPTO_ERROR + TLS bad_certificate alert (RFC 9001 4.8)
_FRAME_CRYPTO = 0x06
_SOCK_BUF = 4 * 1024 * 1024
_IP_RECVERR = 11  # <linux/in.h>; not exported by the socket module
_IPV6_RECVERR = 25  # <linux/in6.h>
_CERT_RENEW_BEFORE = datetime.timedelta(days=1)
_MAX_DATAGRAM = 16000  # aioquic 1.7.2 writes STREAM frame lengths as 2-byte varints (< 16384)
_READ_BATCH = 63  # extra datagrams read per readiness event
_RECV_SIZE = 65535


def _split_addr(addr: Multiaddr) -> tuple[str, int, socket.AddressFamily]:
    """(ip, port, family) of ``/ip4|ip6/<ip>/udp/<port>/quic-v1[/p2p/..]``."""
    protos = addr.protocols()
    if protos and protos[-1] == "p2p":
        protos = protos[:-1]
    if protos not in (["ip4", "udp", "quic-v1"], ["ip6", "udp", "quic-v1"]):
        raise MultiaddrError(f"not a QUIC address: {addr}")
    host, port = addr.host_port()
    ip = ipaddress.ip_address(host)
    return str(ip), port, socket.AF_INET6 if ip.version == 6 else socket.AF_INET


def _sockaddr(ip: str, port: int, family: socket.AddressFamily) -> tuple:
    # recvfrom on an AF_INET6 socket yields 4-tuples; aioquic compares peer addresses for
    # equality, so a dialed address must have the same shape.
    return (ip, port, 0, 0) if family == socket.AF_INET6 else (ip, port)


# -- streams --------------------------------------------------------------------------------------


class QuicStream(Stream):
    """A QUIC bidirectional stream: buffered reads, writes queued into aioquic."""

    def __init__(self, conn: QuicConn, stream_id: int, outbound: bool) -> None:
        self.stream_id = stream_id
        self._conn = conn
        self._quic = conn._quic
        self.outbound = outbound
        self._buf: deque[bytes] = deque()
        self._buf_len = 0
        self._eof = False
        self._recv_done = False  # FIN or RESET received, or reset locally
        self._send_done = False  # FIN queued, reset locally, or STOP_SENDING received
        self._read_exc: Exception | None = None
        self._write_exc: Exception | None = None
        self._read_waiter: asyncio.Future[None] | None = None
        self._drain_waiter: asyncio.Future[None] | None = None
        self._consumed = 0
        self._advertised = conn._stream_window
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
        self._write_exc = StreamReset(
            f"peer stopped reading stream {self.stream_id} (code {error_code})"
        )
        self._wake_drain()
        self._conn._maybe_retire(self)

    def _discard_buffer(self) -> None:
        if not self._released:
            self._quic.rx_unread -= self._buf_len
        self._buf.clear()
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
        buf = self._buf
        first = buf[0]
        if len(first) > n:
            out = first[:n]
            buf[0] = first[n:]
        else:
            buf.popleft()
            out = first
            if buf and len(out) < n:
                parts = [first]
                taken = len(first)
                while buf and taken < n:
                    c = buf[0]
                    room = n - taken
                    if len(c) <= room:
                        buf.popleft()
                        parts.append(c)
                        taken += len(c)
                    else:
                        parts.append(c[:room])
                        buf[0] = c[room:]
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
        if not self._recv_done:
            target = self._consumed + conn._stream_window
            if target - self._advertised >= conn._stream_window >> 2:
                quic.rx_stream_limit[self.stream_id] = target
                self._advertised = target
                conn._schedule_flush()
        if quic.conn_credit_due():
            conn._schedule_flush()
        return out

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
        return self._quic.send_buffered(self.stream_id)

    async def drain(self) -> None:
        """Wait while more than the high-water mark of this stream's data is unacknowledged."""
        conn = self._conn
        while True:
            if self._write_exc is not None:
                raise self._write_exc
            if conn._closed_exc is not None:
                raise conn._closed_exc
            if self._quic.send_buffered(self.stream_id) <= conn._high_water:
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
                quic.reset_stream(self.stream_id, _ERR_NO_ERROR)
            except (RuntimeError, ValueError):
                pass
        if not self._recv_done:
            self._recv_done = True
            self._read_exc = exc
            self._discard_buffer()
            try:
                quic.stop_stream(self.stream_id, _ERR_NO_ERROR)
            except (RuntimeError, ValueError):
                pass  # aioquic has not created the stream yet or already forgot it
        self._wake_reader()
        self._wake_drain()
        self._conn._schedule_flush()
        self._conn._maybe_retire(self)


# -- connections ----------------------------------------------------------------------------------


class QuicConn(Connection):
    """One QUIC connection: pumps aioquic, routes its events to streams, verifies the peer."""

    transport = "quic"

    def __init__(
        self,
        owner: QuicTransport,
        endpoint: _Endpoint,
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
        self._high_water = owner.send_high_water
        self._max_out = owner.max_streams
        # peers open streams with the other parity: client-initiated ids are even
        self._peer_parity = 1 if direction == "outbound" else 0
        self._peer_next_idx = 0
        self._peer_unseen: set[int] = set()
        self._streams: dict[int, QuicStream] = {}
        self._n_out = 0
        self._pending_inbound: deque[QuicStream] = deque()
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
        self._hs_timer: asyncio.TimerHandle | None = self._loop.call_later(
            owner.handshake_timeout, self._handshake_timed_out
        )
        self._keepalive: asyncio.TimerHandle | None = None
        self._last_rx = self._loop.time()
        self._ping_ids = itertools.count()

    def __repr__(self) -> str:
        who = self.remote_peer.short() if self.remote_peer else "?"
        return f"<QuicConn {self.direction} {who} {self.remote_addr}>"

    # -- the pump ---------------------------------------------------------------------------

    def _datagram(self, data: bytes, addr: tuple) -> None:
        """Feed one datagram to aioquic; transmission happens once per batch in _flush."""
        now = self._loop.time()
        self._last_rx = now
        try:
            self._quic.receive_datagram(data, addr, now)
        except Exception:  # an aioquic bug must not take the endpoint down
            self._endpoint.drops += 1
            log.warning("quic.receive_failed", conn=repr(self), exc_info=True)
        self._schedule_flush()

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
                sendto = self._endpoint.sendto
                for data, addr in self._quic.datagrams_to_send(self._loop.time()):
                    sendto(data, addr)
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
            hw = self._high_water
            for s in list(self._drain_waiting):
                if quic.send_buffered(s.stream_id) <= hw:
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
            t = type(ev)
            if t is qev.StreamDataReceived:
                s = streams.get(ev.stream_id)
                if s is None:
                    s = self._new_inbound(ev.stream_id)
                    if s is not None:
                        s._on_data(ev.data, ev.end_stream)
                        self._deliver(s)
                else:
                    s._on_data(ev.data, ev.end_stream)
            elif t is qev.ConnectionIdIssued:
                self._endpoint.register(self, ev.connection_id)
            elif t is qev.ConnectionIdRetired:
                self._endpoint.unregister_cid(self, ev.connection_id)
            elif t is qev.StreamReset:
                s = streams.get(ev.stream_id)
                if s is not None:
                    s._on_reset(ev.error_code)
                elif self._new_inbound_id(ev.stream_id):
                    # opened and reset before any data: never shown to the application; reset
                    # our direction too so aioquic can discard the stream
                    try:
                        quic.reset_stream(ev.stream_id, _ERR_NO_ERROR)
                    except (RuntimeError, ValueError):
                        pass
            elif t is qev.StopSendingReceived:
                s = streams.get(ev.stream_id)
                if s is not None:
                    s._on_stop_sending(ev.error_code)
            elif t is qev.HandshakeCompleted:
                self._on_handshake_completed(ev)
            elif t is qev.ConnectionTerminated:
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
            # The peer can send nothing more on it; bytes the app has not read yet stay readable
            # but stop holding connection credit, so a stream the app forgets cannot starve the
            # connection.
            if s._buf_len:
                self._quic.rx_unread -= s._buf_len
                if self._quic.conn_credit_due():
                    self._schedule_flush()
            s._released = True

    # -- handshake --------------------------------------------------------------------------

    def _on_handshake_completed(self, ev: qev.HandshakeCompleted) -> None:
        if self._closed_exc is not None:
            return
        try:
            if ev.alpn_protocol != ALPN:
                raise HandshakeError(f"peer negotiated ALPN {ev.alpn_protocol!r}, not {ALPN!r}")
            chain = self._quic.peer_certificate_chain()
            if len(chain) != 1:
                raise HandshakeError(f"peer sent {len(chain)} certificates, expected exactly 1")
            peer = verify_certificate(chain[0], self._expected)
        except HandshakeError as e:
            log.info("quic.peer_rejected", addr=str(self.remote_addr), dir=self.direction,
                     reason=str(e))
            # a transport-level close (frame type CRYPTO) so the peer sees a handshake failure
            self._quic.close(
                error_code=_ERR_BAD_CERTIFICATE,
                frame_type=_FRAME_CRYPTO,
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
            self._keepalive = self._loop.call_later(
                self._owner._keepalive_interval, self._on_keepalive
            )
        log.debug("quic.connected", peer=peer.short(), addr=str(self.remote_addr),
                  dir=self.direction)
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

    def _handshake_timed_out(self) -> None:
        self._hs_timer = None
        if self._established or self._dead:
            return
        self._fail_ready(Timeout(
            f"QUIC handshake with {self.remote_addr} timed out after "
            f"{self._owner.handshake_timeout:g}s"
        ))
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
        code = ev.error_code if ev is not None else _ERR_INTERNAL
        reason = (ev.reason_phrase if ev is not None else "") or "no reason given"
        self.ended_cleanly = code == _ERR_NO_ERROR
        if not self._established:
            if 0x100 <= code <= 0x1FF:
                self._fail_ready(HandshakeError(
                    f"QUIC handshake with {self.remote_addr} failed: {reason} (code {code:#x})"
                ))
            else:
                self._fail_ready(TransportError(
                    f"QUIC connection to {self.remote_addr} closed during the handshake: "
                    f"{reason} (code {code:#x})"
                ))
        self._mark_closed(ConnectionClosed(f"QUIC connection closed: {reason} (code {code:#x})"))

    def _mark_closed(self, exc: ConnectionClosed) -> None:
        if self._closed_exc is not None:
            return
        self._closed_exc = exc
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
        if self._n_out >= self._max_out:
            raise StreamLimit(
                f"{self._n_out} outbound streams already open (limit {self._max_out})"
            )
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
        """Let written data reach the peer (bounded by close_linger), then CONNECTION_CLOSE."""
        if self._closed_exc is None and not self._dead:
            if self._quic.total_send_buffered() > 0 and self._owner.close_linger > 0:
                self._linger = self._loop.create_future()
                try:
                    await asyncio.wait_for(asyncio.shield(self._linger), self._owner.close_linger)
                except TimeoutError:
                    pass
            if self._closed_exc is None and not self._dead:
                self.ended_cleanly = True
                self._quic.close(error_code=_ERR_NO_ERROR, reason_phrase="closed")
                self._mark_closed(ConnectionClosed("QUIC connection closed locally"))
                self._flush()
        # aioquic keeps the connection through its closing period (3 PTO) to answer stragglers
        try:
            await asyncio.wait_for(self._terminated.wait(), 2.0)
        except TimeoutError:
            self._teardown()

    def abort(self, reason: str) -> None:
        """Drop the connection now; one CONNECTION_CLOSE is sent best-effort, without waiting."""
        if self._dead:
            return
        if self._closed_exc is None:
            try:
                self._quic.close(error_code=_ERR_INTERNAL, reason_phrase=reason[:256])
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

    def add_close_callback(self, cb: Callable[[Connection], None]) -> None:
        """Call ``cb(conn)`` once when the connection closes (now, if it already has)."""
        if self._closed_exc is not None:
            self._loop.call_soon(cb, self)
        else:
            self._close_cbs.append(cb)

    async def wait_closed(self) -> None:
        await self._terminated.wait()


# -- UDP endpoints --------------------------------------------------------------------------------


class _Endpoint(asyncio.DatagramProtocol):
    """One UDP socket: routes datagrams to connections by destination CID, accepts Initials."""

    def __init__(self, owner: QuicTransport, sock: socket.socket) -> None:
        self.owner = owner
        self.sock = sock
        self.family = sock.family
        bound = sock.getsockname()
        self.bound_ip = ipaddress.ip_address(bound[0])
        self.local_maddr = Multiaddr.from_sockaddr(bound, "quic-v1")
        self.port: int = bound[1]
        self.loop = asyncio.get_running_loop()
        self.dgram: asyncio.DatagramTransport | None = None
        self.by_cid: dict[bytes, QuicConn] = {}
        self.members: set[QuicConn] = set()
        self.listener: QuicListener | None = None
        self.pending = 0  # inbound handshakes in progress
        self.drops = 0
        self.paused = False
        self.closed = False
        self.close_when_idle = False
        self.on_punch: Callable[[bytes, tuple], None] | None = None  # hole punching: told of 0x00 datagrams

    # -- routing ----------------------------------------------------------------------------

    def register(self, conn: QuicConn, cid: bytes) -> None:
        self.by_cid[cid] = conn
        conn._cids.add(cid)
        self.members.add(conn)

    def unregister_cid(self, conn: QuicConn, cid: bytes) -> None:
        if self.by_cid.get(cid) is conn:
            del self.by_cid[cid]
        conn._cids.discard(cid)

    def forget(self, conn: QuicConn) -> None:
        for cid in conn._cids:
            if self.by_cid.get(cid) is conn:
                del self.by_cid[cid]
        conn._cids.clear()
        if conn in self.members:
            self.members.discard(conn)
            if conn.direction == "inbound" and not conn._established:
                self.pending -= 1
        if self.close_when_idle and not self.members:
            self.close()

    def datagram_received(self, data: bytes, addr: tuple) -> None:  # type: ignore[override]
        """Route this datagram and whatever else is already queued on the socket.

        asyncio's selector loop delivers one datagram per loop iteration, and every delivery
        would cost a flush (aioquic's datagrams_to_send); draining the non-blocking socket here
        turns a burst into one batch, so a connection transmits once per batch.
        """
        self._route(data, addr)
        recvfrom = self.sock.recvfrom
        for _ in range(_READ_BATCH):
            try:
                data, addr = recvfrom(_RECV_SIZE)
            except (BlockingIOError, InterruptedError):
                return
            except OSError as e:  # a pending ICMP error (IP_RECVERR) or a closed socket
                if not self.closed:
                    self.error_received(e)
                return
            self._route(data, addr)

    def _route(self, data: bytes, addr: tuple) -> None:
        """Hand one datagram to its connection; unparsable or unknown ones are dropped, counted."""
        try:
            b0 = data[0]
            if b0 == 0 and self.on_punch is not None:  # not QUIC (fixed bit clear): a punch probe
                self.on_punch(data, addr)
                return
            if not b0 & 0x80:  # short header: fixed bit, then our 8-byte CID
                conn = self.by_cid.get(data[1 : 1 + _CID_LEN]) if b0 & 0x40 else None
                if conn is None:
                    self.drops += 1
                else:
                    conn._datagram(data, addr)
                return
            dcid, initial, version = _aioquic.long_header(data)
            conn = self.by_cid.get(dcid)
            if conn is not None:
                conn._datagram(data, addr)
            elif (
                initial
                and self.listener is not None
                and len(data) >= _MIN_INITIAL
                and version in _SUPPORTED_VERSIONS
                and len(dcid) >= 8
            ):
                self.listener._accept(data, addr, dcid)
            else:
                self.drops += 1
        except Exception:  # junk (IndexError, ValueError) or a bug: never raise into asyncio
            self.drops += 1

    def error_received(self, exc: Exception) -> None:
        """ICMP errors (IP_RECVERR): fail pending dials to the address that bounced."""
        try:
            bounced = self._read_error_queue()
        except Exception:
            log.debug("quic.error_queue_failed", exc=repr(exc), exc_info=True)
            return
        if bounced:
            # React on a later callback: aborting sends a datagram, and re-entering the
            # transport from inside its own error callback crashes uvloop 0.23 (segfault).
            self.loop.call_soon(self._bounced, bounced)

    def _bounced(self, bounced: list[tuple[tuple, int]]) -> None:
        for addr, err in bounced:
            for conn in list(self.members):
                if conn._peer_addr[:2] == addr[:2]:
                    conn._icmp_error(err)

    def _read_error_queue(self) -> list[tuple[tuple, int]]:
        out = []
        for _ in range(64):  # drain it, or level-triggered pollers spin on POLLERR
            try:
                _data, anc, _flags, addr = self.sock.recvmsg(1, 512, socket.MSG_ERRQUEUE)
            except (BlockingIOError, InterruptedError, AttributeError):
                break
            except OSError:
                break
            err = errno_mod.ECONNREFUSED
            for level, _type, payload in anc:
                if level in (socket.IPPROTO_IP, socket.IPPROTO_IPV6) and len(payload) >= 4:
                    err = struct.unpack_from("=I", payload)[0]  # sock_extended_err.ee_errno
            if addr:
                out.append((addr, err))
        return out

    def pause_writing(self) -> None:
        self.paused = True

    def resume_writing(self) -> None:
        self.paused = False
        for conn in list(self.members):
            conn._schedule_flush()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.dgram = transport  # type: ignore[assignment]

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        for conn in list(self.members):
            conn.abort("UDP socket closed")

    def sendto(self, data: bytes, addr: tuple) -> None:
        if self.dgram is not None and not self.closed:
            self.dgram.sendto(data, addr)

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            for conn in list(self.members):
                conn.abort("endpoint closed")
            if self.dgram is not None:
                self.dgram.close()
            self.owner._endpoints.discard(self)


class QuicListener(Listener):
    """A listening UDP endpoint; closing it stops accepting, live connections keep the socket."""

    def __init__(self, endpoint: _Endpoint, on_connection: ConnectionHandler) -> None:
        self._endpoint = endpoint
        self._on_connection = on_connection
        self.addrs = [endpoint.local_maddr]

    def _accept(self, data: bytes, addr: tuple, dcid: bytes) -> None:
        ep = self._endpoint
        owner = ep.owner
        if ep.pending >= owner.max_pending_handshakes:
            ep.drops += 1
            return
        quic = owner._new_quic(is_client=False, peer_addr=addr, odcid=dcid)
        conn = QuicConn(owner, ep, quic, addr, "inbound", None, on_verified=self._verified)
        ep.register(conn, dcid)
        ep.register(conn, quic.host_cid)
        ep.pending += 1
        conn._datagram(data, addr)
        if quic.nothing_decrypted():  # a garbled Initial: no state kept
            ep.drops += 1
            conn._teardown()

    def _verified(self, conn: QuicConn) -> None:
        self._endpoint.pending -= 1
        if self._endpoint.listener is not self:
            conn.abort("listener closed")
            return
        Transport._hand_over(conn, self._on_connection)

    async def close(self) -> None:
        ep = self._endpoint
        if ep.listener is not self:
            return
        ep.listener = None
        for conn in list(ep.members):
            if conn.direction == "inbound" and not conn._established:
                conn.abort("listener closed")
        ep.owner._listen_eps.discard(ep)
        if ep.members:
            ep.close_when_idle = True  # established connections keep using the socket
        else:
            ep.close()


# -- the transport --------------------------------------------------------------------------------


class QuicTransport(Transport):
    """QUIC over UDP with libp2p TLS authentication; one UDP socket serves listening and dialing."""

    name = "quic"

    def __init__(
        self,
        keypair: KeyPair,
        *,
        max_streams: int = 256,
        idle_timeout: float = 60.0,
        handshake_timeout: float = 10.0,
        keepalive_interval: float = 15.0,
        max_stream_data: int = 8 * 1024 * 1024,
        max_data: int = 32 * 1024 * 1024,
        send_high_water: int = 1024 * 1024,
        max_datagram_size: int = 1350,
        loopback_datagram_size: int = _MAX_DATAGRAM,
        congestion_control: str = "reno",
        close_linger: float = 2.0,
        max_pending_handshakes: int = 256,
    ) -> None:
        super().__init__(keypair)
        if not 1200 <= max_datagram_size <= _MAX_DATAGRAM:
            raise ValueError(f"max_datagram_size must be within 1200..{_MAX_DATAGRAM}")
        if not 1200 <= loopback_datagram_size <= _MAX_DATAGRAM:
            raise ValueError(f"loopback_datagram_size must be within 1200..{_MAX_DATAGRAM}")
        self.max_streams = max_streams
        self.idle_timeout = idle_timeout
        self.handshake_timeout = handshake_timeout
        # PINGs keep NAT mappings and the idle timer alive; never slower than idle_timeout / 2
        self._keepalive_interval = min(keepalive_interval, idle_timeout / 2)
        self.max_stream_data = max_stream_data
        self.max_data = max_data
        self.send_high_water = send_high_water
        self.max_datagram_size = max_datagram_size
        self.loopback_datagram_size = loopback_datagram_size
        self.congestion_control = congestion_control
        self.close_linger = close_linger
        self.max_pending_handshakes = max_pending_handshakes
        self._cert: CertifiedKey | None = None
        self._endpoints: set[_Endpoint] = set()
        self._listen_eps: set[_Endpoint] = set()
        self._ephemeral: dict[int, _Endpoint] = {}
        self._conns: set[QuicConn] = set()
        self._closed = False

    def handles(self, addr: Multiaddr) -> bool:
        """True for ``/ip4|ip6/<ip>/udp/<port>/quic-v1`` (optionally ending in /p2p/<id>)."""
        try:
            _split_addr(addr)
            return True
        except (MultiaddrError, ValueError):
            return False

    # -- plumbing ---------------------------------------------------------------------------

    def _certified(self) -> CertifiedKey:
        now = datetime.datetime.now(datetime.UTC)
        if self._cert is None or self._cert.not_valid_after - now < _CERT_RENEW_BEFORE:
            self._cert = generate_certificate(self.keypair)
        return self._cert

    def _new_quic(
        self, *, is_client: bool, peer_addr: tuple, odcid: bytes | None = None
    ) -> _aioquic.LatticaQuicConnection:
        cert = self._certified()
        loopback = ipaddress.ip_address(peer_addr[0]).is_loopback
        config = _aioquic.make_configuration(
            is_client=is_client,
            certificate=cert.certificate,
            private_key=cert.private_key,
            alpn=ALPN,
            idle_timeout=self.idle_timeout,
            max_data=self.max_data,
            max_stream_data=self.max_stream_data,
            max_datagram_size=self.loopback_datagram_size if loopback else self.max_datagram_size,
            congestion_control=self.congestion_control,
            cid_length=_CID_LEN,
        )
        return _aioquic.LatticaQuicConnection(
            configuration=config,
            max_streams=self.max_streams,
            original_destination_connection_id=odcid,
        )

    async def _open_endpoint(self, family: socket.AddressFamily, ip: str, port: int) -> _Endpoint:
        sock = socket.socket(family, socket.SOCK_DGRAM)
        try:
            if family == socket.AF_INET6:
                sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
            for opt in (socket.SO_RCVBUF, socket.SO_SNDBUF):
                try:
                    sock.setsockopt(socket.SOL_SOCKET, opt, _SOCK_BUF)
                except OSError:
                    pass
            try:  # Linux: report ICMP errors (port unreachable) on this unconnected socket
                if family == socket.AF_INET6:
                    sock.setsockopt(socket.IPPROTO_IPV6, _IPV6_RECVERR, 1)
                else:
                    sock.setsockopt(socket.IPPROTO_IP, _IP_RECVERR, 1)
            except OSError:
                pass
            sock.setblocking(False)
            sock.bind((ip, port))
        except OSError as e:
            sock.close()
            raise TransportError(f"cannot bind UDP {ip} port {port}: {e.strerror}") from None
        loop = asyncio.get_running_loop()
        ep = _Endpoint(self, sock)
        await loop.create_datagram_endpoint(lambda: ep, sock=sock)
        self._endpoints.add(ep)
        return ep

    async def _endpoint_for(self, family: socket.AddressFamily, ip: str) -> _Endpoint:
        """The listening endpoint to dial from (shares its NAT mapping), else an ephemeral one."""
        dest_loopback = ipaddress.ip_address(ip).is_loopback
        candidates = [
            ep for ep in self._listen_eps
            if ep.family == family and not ep.closed and ep.listener is not None
        ]
        for ep in candidates:
            if ep.bound_ip.is_unspecified:
                return ep
        for ep in candidates:
            if not ep.bound_ip.is_loopback or dest_loopback:
                return ep
        ep = self._ephemeral.get(family)
        if ep is None or ep.closed:
            wildcard = "::" if family == socket.AF_INET6 else "0.0.0.0"
            ep = await self._open_endpoint(family, wildcard, 0)
            self._ephemeral[family] = ep
        return ep

    # -- Transport API ----------------------------------------------------------------------

    async def listen(self, addr: Multiaddr, on_connection: ConnectionHandler) -> Listener:
        """Bind a UDP socket on ``addr`` and accept authenticated QUIC connections on it."""
        if self._closed:
            raise TransportError("QUIC transport is closed")
        ip, port, family = _split_addr(addr)
        ep = await self._open_endpoint(family, ip, port)
        listener = QuicListener(ep, on_connection)
        ep.listener = listener
        self._listen_eps.add(ep)
        log.debug("quic.listening", addr=str(ep.local_maddr))
        return listener

    async def dial(
        self, addr: Multiaddr, peer_id: PeerId | None = None, *, fresh_port: bool = False, via: Any = None
    ) -> Connection:
        """Connect, run the TLS handshake and verify the peer's key (PeerIdMismatch if wrong).

        ``fresh_port``: dial from a new UDP socket of its own, not the listening one (AutoNAT
        dial-backs must not arrive from the port the peer already talks to). ``via``: dial from
        this socket of a :meth:`spray` (the one a hole-punch probe reached)."""
        if self._closed:
            raise TransportError("QUIC transport is closed")
        ip, port, family = _split_addr(addr)
        expected = peer_id if peer_id is not None else addr.peer_id
        if via is not None:
            ep = via
            if ep.closed or ep.owner is not self:
                raise TransportError("that socket is closed")
        elif fresh_port:
            ep = await self._open_endpoint(family, "::" if family == socket.AF_INET6 else "0.0.0.0", 0)
            ep.close_when_idle = True
        else:
            ep = await self._endpoint_for(family, ip)
        peer_addr = _sockaddr(ip, port, family)
        quic = self._new_quic(is_client=True, peer_addr=peer_addr)
        conn = QuicConn(self, ep, quic, peer_addr, "outbound", expected)
        ep.register(conn, quic.host_cid)
        try:
            quic.connect(peer_addr, now=ep.loop.time())
        except Exception as e:
            conn.abort("connect failed")
            raise TransportError(f"cannot start QUIC connection to {addr}: {e}") from None
        conn._flush()
        try:
            await asyncio.shield(conn._ready)
        except asyncio.CancelledError:
            conn.abort("dial cancelled")
            raise
        except BaseException:
            conn.abort("handshake failed")
            raise
        return conn

    def send_raw(self, addr: tuple, data: bytes) -> None:
        """Send one raw UDP datagram from the listening socket (for hole punching)."""
        ip = str(ipaddress.ip_address(addr[0]))
        family = socket.AF_INET6 if ":" in ip else socket.AF_INET
        for ep in self._listen_eps:
            if ep.family == family and not ep.closed:
                ep.sendto(data, _sockaddr(ip, addr[1], family))
                return
        raise TransportError(f"no listening QUIC socket for {ip}")

    def on_punch(self, callback: Callable[[bytes, tuple], None] | None) -> None:
        """Be told of punch datagrams (first byte 0) arriving at the listening sockets."""
        for ep in self._listen_eps:
            ep.on_punch = callback

    async def spray(self, addrs: list[tuple], count: int, payload: bytes, on_hit: Callable[[Any, bytes, tuple], None]) -> list:
        """Hole punching from behind an endpoint-dependent NAT: open ``count`` UDP sockets, send
        ``payload`` from each to every one of ``addrs`` (each gets its own NAT mapping), and call
        ``on_hit(socket, datagram, sender)`` when a punch datagram reaches one. Returns the sockets: send
        again with :meth:`resend`, dial from a hit one with ``dial(via=...)``, close the rest
        with :meth:`close_spray`."""
        if self._closed:
            raise TransportError("QUIC transport is closed")
        family = socket.AF_INET6 if ":" in addrs[0][0] else socket.AF_INET
        wildcard = "::" if family == socket.AF_INET6 else "0.0.0.0"
        eps = []
        try:
            for _ in range(count):
                ep = await self._open_endpoint(family, wildcard, 0)
                ep.on_punch = lambda data, sender, ep=ep: on_hit(ep, data, sender) if not ep.closed else None
                eps.append(ep)
        except BaseException:
            self.close_spray(eps)
            raise
        self.resend(eps, addrs, payload)
        return eps

    @staticmethod
    def resend(eps: list, addrs: list[tuple], payload: bytes) -> None:
        for ep in eps:
            for a in addrs:
                ep.sendto(payload, _sockaddr(a[0], a[1], ep.family))

    @staticmethod
    def close_spray(eps: list, keep: Any = None) -> None:
        """Close the sprayed sockets, except ``keep`` (it carries a connection now)."""
        for ep in eps:
            if ep is keep:
                ep.on_punch = None
                ep.close_when_idle = True
                if not ep.members:
                    ep.close()
            else:
                ep.close()

    @property
    def dropped_datagrams(self) -> int:
        """Datagrams dropped as junk, unknown-CID or over-limit, over all endpoints."""
        return sum(ep.drops for ep in self._endpoints)

    async def close(self) -> None:
        """Close every connection (gracefully, bounded) and every UDP socket."""
        if self._closed:
            return
        self._closed = True
        for ep in list(self._listen_eps):
            if ep.listener is not None:
                await ep.listener.close()
        conns = list(self._conns)
        if conns:
            await asyncio.gather(*(c.close() for c in conns), return_exceptions=True)
        for ep in list(self._endpoints):
            ep.close()
        self._endpoints.clear()
        self._listen_eps.clear()
        self._ephemeral.clear()
