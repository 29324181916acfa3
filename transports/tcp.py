"""TCP transport: Noise XX for authentication and encryption, then the yamux-format multiplexer.

Between Lattica nodes there is no multistream negotiation: both sides start the Noise handshake
(AES-GCM, identify as early data) at once and, once it completes, speak the mux. A libp2p peer
starts with multistream-select instead (its first bytes are ``/multistream/1.0.0``'s header, which
no Noise message begins with): an accepted socket that opens so is given the standard stack,
``/noise`` (ChaChaPoly) and then ``/yamux/1.0.0``, chosen inside the handshake when the peer offers
it there, else by multistream-select over the encrypted channel (docs/protocols.md, "libp2p").
The handshake has a deadline and a size cap, so a peer that stalls or sends garbage costs one
socket for at most ``handshake_timeout`` seconds.
"""

from __future__ import annotations

import asyncio
import errno
import os
import socket
import time
from collections.abc import Callable
from typing import Any, cast

from lattica._identity import KeyPair, PeerId
from lattica._interfaces import host_key, is_loopback_ip
from lattica._multiaddr import Multiaddr
from lattica.errors import (
    ConnectionRefused,
    HandshakeError,
    LatticaError,
    PeerIdMismatch,
    Timeout,
    TransportError,
)
from lattica.logging import get_logger
from lattica.transports import multistream
from lattica.transports.base import Connection, ConnectionHandler, Listener, Transport
from lattica.transports.mux import MuxConfig
from lattica.transports.muxed import MuxedConnection
from lattica.transports.noise import NoiseHandshake, PlainBuffer
from lattica.transports.splice import PREAMBLE_LEN, PREAMBLE_MAGIC, TOKEN_LEN, SpliceUnreachable
from lattica.transports.upgrade import SECURITY, YAMUX, Libp2pUpgrade, Up

USER_TIMEOUT_MS = 15_000  # TCP_USER_TIMEOUT on every connection (Linux)
log = get_logger("lattica.tcp")

__all__ = ["SECURITY", "YAMUX", "TcpTransport"]


_RECV_BUFFER = 256 * 1024
_LIBP2P_REMEMBERED = 1024  # addresses where a libp2p node answered (dialed with its stack at once)
_MUTE_REMEMBERED_FOR = 60.0  # seconds an endpoint that answered neither stack gets one dial, not two
_MULTISTREAM_START = multistream.encode(multistream.HEADER)[:2]  # a libp2p dialer's first bytes
SPLICE_CONNECT_TIMEOUT = 3.0  # seconds to reach a relay's listener with a spliced socket


class _Unanswered(TransportError):
    """Our Noise handshake was cut off before the peer said a byte (as a libp2p node does)."""


class _Done:
    """What a protocol holds in place of its finished handshake."""

    complete = True


_DONE: Any = _Done()


class _TcpProtocol(asyncio.BufferedProtocol):
    """Runs the Noise handshake, then hands every byte to the MuxedConnection.

    Reads land in one receive buffer per transport (``recv_into``), consumed before the next read:
    a fresh 256 KiB ``bytes`` per ``recv`` would cost an mmap/mremap/munmap round per read.
    """

    def __init__(
        self,
        owner: TcpTransport,
        initiator: bool,
        expected: PeerId | None,
        *,
        inbound: bool | None = None,
        preamble: bytes = b"",
        label: str = "tcp",
        remote_addr: Multiaddr | None = None,
        say_who: bool = True,
        libp2p: bool = False,
    ) -> None:
        self._owner = owner
        self._initiator = initiator  # the Noise role
        self._inbound = not initiator if inbound is None else inbound  # accepted by our listener
        self._preamble = preamble  # sent before the handshake (spliced circuits)
        self._pre: bytearray | None = bytearray() if self._inbound else None  # to spot a splice request
        self._label = label
        self._remote_addr = remote_addr
        self._hs = NoiseHandshake(
            owner.keypair, initiator, expected, early_data=self._early_data if owner.early_data and say_who else None
        )
        self._transport: asyncio.Transport | None = None
        self.conn: MuxedConnection | None = None
        self.ready: asyncio.Future[MuxedConnection] = asyncio.get_running_loop().create_future()
        self._timer: asyncio.TimerHandle | None = None
        self._counted: str | bool = False  # holds one of the owner's handshake slots (True, or the IP's)
        self._silence: asyncio.TimerHandle | None = None  # inbound: no whole handshake message yet
        self.libp2p = False  # a libp2p peer: multistream-select, /noise with ChaChaPoly, yamux
        self._upgrade: Libp2pUpgrade | None = None  # a libp2p peer's, until its muxer is agreed
        # the peer sent a byte, not multistream-select's (a libp2p listener cuts our Noise handshake
        # off before answering, or answers with multistream-select's header)
        self.answered = False
        self._expected_peer = expected
        if libp2p:
            self._become_libp2p()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        transport = cast(asyncio.Transport, transport)  # (a TCP socket's: a read-write transport)
        self._transport = transport
        if self._inbound:
            owner = self._owner
            peer = transport.get_extra_info("peername")
            ip = host_key(peer[0]) if isinstance(peer, tuple) and not is_loopback_ip(peer[0]) else None
            why = None
            if ip is not None and owner._handshaking_at.get(ip, 0) >= owner.max_handshakes_per_ip:
                why = "too many handshakes in progress from this IP address"
            elif owner._handshaking >= owner.max_pending_handshakes:
                # full: the oldest handshake in progress, a silent one first, makes room (an
                # honest one takes a round trip; sockets held open to fill the table wait longest)
                oldest = owner.oldest_handshake()
                if oldest is None:
                    why = "too many handshakes in progress"
                else:
                    oldest._fail(
                        TransportError("the handshake slots are full and this was the oldest handshake in progress")
                    )
            if isinstance(peer, tuple):
                owner.note_dialed_in(peer[0])
            if why is not None:
                log.info(f"refusing connection: {why}", peer_addr=self._peer_addr_text())
                transport.abort()
                self.ready.cancel()
                return
            owner._handshaking += 1
            owner._in_handshake[self] = None
            if ip is not None:
                owner._handshaking_at[ip] = owner._handshaking_at.get(ip, 0) + 1
            self._counted = ip or True
            # a socket that says nothing is dropped sooner than one that is slow to finish
            self._silence = asyncio.get_running_loop().call_later(owner.first_byte_timeout, self._silent_timed_out)
        sock = transport.get_extra_info("socket")
        if sock is not None:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            if hasattr(socket, "TCP_USER_TIMEOUT"):
                # data unacknowledged this long means the path is gone (a NAT forgot it, the host
                # vanished): the kernel then fails the socket instead of retrying for ~15 minutes
                # (a frozen or busy peer's kernel still acknowledges)
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_USER_TIMEOUT, USER_TIMEOUT_MS)
        self._timer = asyncio.get_running_loop().call_later(self._owner.handshake_timeout, self._handshake_timed_out)
        out = self._preamble + (self._upgrade.data_to_send() if self._upgrade is not None else self._hs.start())
        if out:
            transport.write(out)

    @property
    def silent(self) -> bool:
        """Inbound, and no whole handshake message has come yet."""
        return self._silence is not None

    def _early_data(self) -> bytes | None:
        tr, make = self._transport, self._owner.early_data
        assert tr is not None and make is not None
        return make(self._remote_addr or Multiaddr.from_sockaddr(tr.get_extra_info("peername")))

    def _handshake_timed_out(self) -> None:
        self._fail(Timeout(f"Noise handshake did not finish within {self._owner.handshake_timeout} s"))

    def _silent_timed_out(self) -> None:
        self._fail(Timeout(f"no handshake message within {self._owner.first_byte_timeout} s"))

    def _release_slot(self) -> None:
        if self._silence is not None:
            self._silence.cancel()
            self._silence = None
        if self._counted:
            owner, ip = self._owner, self._counted
            self._counted = False
            owner._handshaking -= 1
            owner._in_handshake.pop(self, None)
            if ip is not True:
                left = owner._handshaking_at.pop(ip) - 1
                if left:
                    owner._handshaking_at[ip] = left

    def cancel(self) -> None:
        """The dialer gave up (e.g. lost a race): drop the socket, or the connection if it is up."""
        if self.conn is not None:
            self.conn.abort("dial cancelled")
        else:
            self._fail(TransportError("dial cancelled"))

    def _fail(self, err: LatticaError) -> None:
        self._release_slot()
        if self._timer is not None:
            self._timer.cancel()
        if not self.ready.done():
            self.ready.set_exception(err)
            self.ready.exception()  # mark retrieved: inbound failures have nobody awaiting them
        if self._transport is not None:
            self._transport.abort()
        if self._inbound:
            log.info("inbound handshake failed", peer_addr=self._peer_addr_text(), reason=str(err))

    def _peer_addr_text(self) -> str:
        if self._transport is None:
            return "?"
        return str(self._transport.get_extra_info("peername"))

    def get_buffer(self, sizehint: int) -> memoryview:
        view = self._owner._recv_view
        if view is None:
            view = self._owner._recv_view = memoryview(bytearray(_RECV_BUFFER))
        return view

    def buffer_updated(self, nbytes: int) -> None:
        data = self._owner._recv_view[:nbytes]  # type: ignore[index]
        if self.conn is not None:
            if self._upgrade is not None:
                self._upgrading(data)  # (a lazy muxer proposal's answer comes first)
                return
            self.conn.data_received(data)  # decrypts and parses it before returning; keeps no view of ours
            return
        if not self.answered and self._initiator and not self.libp2p and data[:2] == _MULTISTREAM_START:
            # a libp2p listener's first words (go's says them at once): it will not read Noise
            self._fail(HandshakeError("the peer speaks multistream-select: a libp2p node"))
            return
        self.answered = True
        if self.ready.done():
            return  # handshake already failed; the socket is being aborted
        if self._pre is not None:
            data = self._preamble_check(data)
            if data is None:
                return
        if self._upgrade is not None:
            self._upgrading(data)
            return
        try:
            out = self._hs.receive(bytes(data))
        except LatticaError as e:
            self._fail(e if isinstance(e, HandshakeError) else HandshakeError(str(e)))
            return
        if out:
            self._transport.write(out)  # type: ignore[union-attr]
        if self._silence is not None and (out or self._hs.complete):
            self._heard_a_message()
        if self._hs.complete:
            hs, self._hs = self._hs, _DONE  # (the connection keeps none of the handshake: early data, leftover bytes)
            self._connected(hs, hs.leftover)

    def _heard_a_message(self) -> None:
        """A whole handshake message arrived (a byte or two would not do): the rest of the
        handshake has its own deadline."""
        assert self._silence is not None
        self._silence.cancel()
        self._silence = None

    def _connected(self, hs: NoiseHandshake, leftover: bytes, plain: bytes = b"") -> None:
        """The handshake (and, with a libp2p peer, the muxer's choice) is done: the connection is
        up. ``leftover`` is ciphertext that came behind it, ``plain`` what was already opened."""
        self._release_slot()
        self._timer.cancel()  # type: ignore[union-attr]
        tr = self._transport
        assert tr is not None and hs.remote_peer is not None and hs.session is not None
        self.conn = MuxedConnection(
            tr,
            transport=self._label,
            direction="outbound" if self._initiator else "inbound",
            local_peer=self._owner.keypair.peer_id,
            remote_peer=hs.remote_peer,
            local_addr=Multiaddr.from_sockaddr(tr.get_extra_info("sockname")),
            remote_addr=self._remote_addr or Multiaddr.from_sockaddr(tr.get_extra_info("peername")),
            session=hs.session,
            mux_config=self._owner.mux_config,
            keepalive_interval=self._owner.keepalive_interval,
            keepalive_timeout=self._owner.keepalive_timeout,
            writer_lets_go=True,  # an asyncio socket transport: sends, or holds only while buffered
            plain=self._owner._plain,
            hold_opens=self._owner.hold_opens,  # (the host meters the peer's opens from its first)
            narrow_windows=self._owner.narrow_windows,
        )
        self.conn.early_data = hs.remote_early_data
        self.conn.said_early = hs.remote_early_data is not None
        self.conn.libp2p = self.libp2p
        self._owner._track(self.conn)
        self.ready.set_result(self.conn)
        if plain:
            self.conn.receive_plain(plain)
        if leftover:
            self.conn.data_received(leftover)

    # -- a libp2p peer -------------------------------------------------------------------------

    def _become_libp2p(self) -> None:
        """A libp2p peer: an accepted socket that began with multistream-select, or a dial to a
        peer known to speak libp2p (transports/upgrade.py)."""
        self.libp2p = True
        self._hs = _DONE
        self._upgrade = Libp2pUpgrade(self._owner.keypair, self._initiator, self._expected_peer)
        self._upgrade.start()

    def _upgrading(self, data: memoryview | bytearray) -> None:
        """Feed the libp2p upgrade; make the connection once the peer is authenticated, and hand
        it the bytes behind the muxer's choice."""
        up, tr = self._upgrade, self._transport
        assert up is not None and tr is not None
        try:
            up.receive_data(data)
        except HandshakeError as e:
            if self.conn is not None:
                self.conn.abort(str(e))
            else:
                self._fail(e)
            return
        out = up.data_to_send()
        if out:
            tr.write(out)
        if self._silence is not None and up.heard_a_message:
            self._heard_a_message()
        while (event := up.next_event()) is not None:
            if isinstance(event, Up):
                self._connected(event.handshake, b"")
                continue
            self._upgrade = None
            assert self.conn is not None
            if event.plain:
                self.conn.receive_plain(event.plain)
            if event.cipher:
                self.conn.data_received(event.cipher)

    def _preamble_check(self, data: memoryview) -> bytearray | None:
        """The first bytes of an accepted socket: a Noise handshake (returned, to go on with) or a
        splice request, handed to the relay (None)."""
        pre = self._pre
        assert pre is not None
        pre += data
        if len(pre) < 2:
            return None
        if pre[:2] == _MULTISTREAM_START:
            self._pre = None
            self._become_libp2p()
            return pre
        if pre[:2] != PREAMBLE_MAGIC[:2]:
            self._pre = None
            return pre
        if len(pre) < PREAMBLE_LEN:
            return None
        self._pre = None
        handler = self._owner.on_splice
        if pre[: len(PREAMBLE_MAGIC)] != PREAMBLE_MAGIC or handler is None:
            self._fail(HandshakeError("connection opened with an unknown preamble"))
            return None
        self._release_slot()
        self._timer.cancel()  # type: ignore[union-attr]
        self.ready.cancel()
        tr, self._transport = self._transport, None
        assert tr is not None  # (bytes come after connection_made)
        token = bytes(pre[len(PREAMBLE_MAGIC) : PREAMBLE_LEN])
        if not handler(token, tr, bytes(pre[PREAMBLE_LEN:])):
            log.info("refusing spliced socket: unknown or expired token", peer_addr=str(tr.get_extra_info("peername")))
            tr.abort()
        return None

    def eof_received(self) -> bool:
        return False  # close our side too: a half-open TCP connection has no use here

    def connection_lost(self, exc: Exception | None) -> None:
        if self.conn is not None:
            self.conn.connection_lost(exc)
        elif not self.ready.done():
            self._fail(TransportError(f"connection lost during handshake: {exc or 'EOF'}"))

    def pause_writing(self) -> None:
        if self.conn is not None:
            self.conn.pause_writing()

    def resume_writing(self) -> None:
        if self.conn is not None:
            self.conn.resume_writing()


def _remember(table: dict[tuple[str, int], Any], key: tuple[str, int], value: Any) -> None:
    """Put ``key`` in a table of endpoints as its newest entry, forgetting the oldest beyond
    ``_LIBP2P_REMEMBERED``."""
    table.pop(key, None)
    table[key] = value
    while len(table) > _LIBP2P_REMEMBERED:
        del table[next(iter(table))]


def _refuse_if_taken(addr: Multiaddr, host: str, port: int) -> None:
    """TransportError if another socket holds ``port``. Our listener takes the port with
    SO_REUSEPORT (hole punching dials from it), and Linux would let a second process of the same
    user take it too and split the incoming connections between them: a plain bind first (no
    SO_REUSEPORT) finds the port held by anyone."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    probe = socket.socket(family, socket.SOCK_STREAM)
    try:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # (a port in TIME_WAIT is free)
        if family == socket.AF_INET6:
            probe.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)  # (as asyncio binds ours)
        probe.bind((host, port))
    except OSError as e:
        if e.errno == errno.EADDRINUSE:
            raise TransportError(
                f"cannot listen on {addr}: port {port} is in use (another lattica node or program holds it): "
                "choose another port, or /tcp/0 for any free one"
            ) from None
        raise TransportError(f"cannot listen on {addr}: {e.strerror or e}") from None
    finally:
        probe.close()


class _TcpListener(Listener):
    def __init__(self, server: asyncio.Server) -> None:
        self._server = server
        self.addrs = [Multiaddr.from_sockaddr(s.getsockname()) for s in server.sockets]

    async def close(self) -> None:
        self._server.close()
        await self._server.wait_closed()


class TcpTransport(Transport):
    """Listens and dials ``/ip4|ip6|dns/<host>/tcp/<port>``."""

    name = "tcp"

    def __init__(
        self,
        keypair: KeyPair,
        *,
        mux_config: MuxConfig | None = None,
        handshake_timeout: float = 10.0,
        max_pending_handshakes: int = 256,
        max_handshakes_per_ip: int = 16,
        first_byte_timeout: float = 3.0,
        keepalive_interval: float = 15.0,
        keepalive_timeout: float = 45.0,
        write_buffer_limit: int = 4 * 1024 * 1024,
    ) -> None:
        super().__init__(keypair)
        self.mux_config = mux_config or MuxConfig()
        self.handshake_timeout = handshake_timeout
        self.max_pending_handshakes = max_pending_handshakes
        self.max_handshakes_per_ip = max_handshakes_per_ip  # loopback is exempt (a local peer)
        self.first_byte_timeout = first_byte_timeout
        self._handshaking = 0
        self._handshaking_at: dict[str, int] = {}  # remote IP -> its handshakes in progress
        self._in_handshake: dict[_TcpProtocol, None] = {}  # inbound handshakes in progress, oldest first
        self.keepalive_interval = keepalive_interval
        self.keepalive_timeout = keepalive_timeout
        self.write_buffer_limit = write_buffer_limit
        self._recv_view: memoryview | None = None  # shared: the loop reads one socket at a time
        self._plain = PlainBuffer()  # ... and opens its frames here before the next
        self._libp2p_at: dict[tuple[str, int], None] = {}  # (host, port) where a libp2p node answered (newest last)
        self._mute_until: dict[tuple[str, int], float] = {}  # where neither stack was answered, until when
        # Set by a relay: takes accepted sockets that open with a splice preamble (token, transport,
        # bytes read after the preamble) and says whether it knew the token.
        self.on_splice: Callable[[bytes, asyncio.Transport, bytes], bool] | None = None

    def oldest_handshake(self) -> _TcpProtocol | None:
        """The inbound handshake in progress that gives way to a newcomer when the slots are
        full: the oldest that has not sent a whole handshake message yet, else the oldest."""
        silent = next((p for p in self._in_handshake if p.silent), None)
        return silent if silent is not None else next(iter(self._in_handshake), None)

    def handles(self, addr: Multiaddr) -> bool:
        p = addr.without_peer_id().protocols()
        return len(p) == 2 and p[0] in ("ip4", "ip6", "dns", "dns4", "dns6") and p[1] == "tcp"

    def _protocol(
        self, initiator: bool, expected: PeerId | None, say_who: bool = True, libp2p: bool = False
    ) -> _TcpProtocol:
        return _TcpProtocol(self, initiator, expected, say_who=say_who, libp2p=libp2p)

    async def listen(self, addr: Multiaddr, on_connection: ConnectionHandler) -> Listener:
        host, port = addr.host_port()
        loop = asyncio.get_running_loop()

        def factory() -> _TcpProtocol:
            proto = self._protocol(False, None)
            proto.ready.add_done_callback(lambda f: self._accepted(f, on_connection))
            return proto

        if port:
            _refuse_if_taken(addr, host, port)
        try:
            # reuse_port: hole punching dials from the listening port (see punch)
            server = await loop.create_server(factory, host, port, reuse_address=True, reuse_port=True, backlog=1024)
        except OSError as e:
            raise TransportError(f"cannot listen on {addr}: {e.strerror or e}") from None
        listener = _TcpListener(server)
        self._listeners.append(listener)
        return listener

    def _accepted(self, fut: asyncio.Future, on_connection: ConnectionHandler) -> None:
        if fut.cancelled() or fut.exception() is not None:
            return
        conn = fut.result()
        self._limit_buffers(conn)
        self._hand_over(conn, on_connection)

    async def dial(
        self,
        addr: Multiaddr,
        peer_id: PeerId | None = None,
        *,
        fresh_port: bool = False,
        say_who: bool = True,
        libp2p: bool = False,
    ) -> Connection:
        """Connect from an ephemeral port (``fresh_port`` is therefore always true here), run
        Noise and check the peer's id. A peer that cuts our handshake off before answering, or
        answers with multistream-select, is a libp2p node: dialed again with its stack, and
        remembered. ``say_who=False``: no identify in the handshake and no second dial (an
        AutoNAT dial-back: a connection the peer must never take for one to use). ``libp2p``:
        the peer is known to be a libp2p node: its stack at once."""
        target = addr.peer_id
        if peer_id is not None and target is not None and target != peer_id:
            raise PeerIdMismatch(f"address {addr} names {target}, not the requested {peer_id}")
        expected = peer_id or target
        host, port = addr.without_peer_id().host_port()
        key = (host, port)
        libp2p = libp2p or key in self._libp2p_at
        try:
            return await self._dial_once(addr, host, port, expected, say_who, libp2p)
        except _Unanswered:
            if not say_who or self._mute_until.get(key, 0.0) > time.monotonic():
                # an AutoNAT dial-back (one connection per dial, whatever answers there), or an
                # endpoint that lately answered neither stack: not dialed twice again
                raise
        # the peer cut our Noise handshake off before answering a byte, or answered with
        # multistream-select: a libp2p node; the standard stack, then, and remembered
        try:
            conn = await self._dial_once(addr, host, port, expected, say_who, libp2p=True)
        except LatticaError:
            _remember(self._mute_until, key, time.monotonic() + _MUTE_REMEMBERED_FOR)
            raise
        self._mute_until.pop(key, None)
        _remember(self._libp2p_at, key, None)
        return conn

    async def _dial_once(
        self, addr: Multiaddr, host: str, port: int, expected: PeerId | None, say_who: bool, libp2p: bool
    ) -> MuxedConnection:
        loop = asyncio.get_running_loop()
        try:
            _, proto = await asyncio.wait_for(
                loop.create_connection(lambda: self._protocol(True, expected, say_who, libp2p), host, port),
                self.handshake_timeout,
            )
        except TimeoutError:
            raise Timeout(f"TCP connect to {addr} timed out") from None
        except OSError as e:  # asyncio's text ("Connect call failed") hides the reason: say it
            kind = ConnectionRefused if e.errno == errno.ECONNREFUSED else TransportError
            raise kind(f"cannot connect to {addr}: {os.strerror(e.errno) if e.errno else e}") from None
        try:
            return await self._ready(proto)
        except (HandshakeError, TransportError) as e:
            if proto.answered or proto.libp2p:
                raise
            raise _Unanswered(str(e)) from e

    async def punch(
        self, addr: Multiaddr, peer_id: PeerId, *, initiator: bool, timeout: float = 5.0, libp2p: bool = False
    ) -> Connection:
        """Hole punching: connect to ``addr`` from our listening port (so the NAT reuses the
        mapping peers observed), for a TCP simultaneous open with a peer doing the same towards
        us. Both ends call connect, so the Noise roles are given, not taken from the kernel:
        ``initiator`` on one side only (its connection counts as outbound, the other's inbound).
        ``libp2p``: the peer's stack is libp2p's (DCUtR), whose roles follow ``initiator`` too."""
        host, port = addr.without_peer_id().host_port()
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        local = next(
            (s.getsockname() for lst in self._listeners for s in lst._server.sockets if s.family == family),  # type: ignore[attr-defined]
            None,
        )
        if local is None:
            raise TransportError(f"no listening TCP socket to punch {addr} from")
        loop = asyncio.get_running_loop()
        sock = socket.socket(family, socket.SOCK_STREAM)
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
            sock.setblocking(False)
            sock.bind(local[:2] if family == socket.AF_INET else local)
            async with asyncio.timeout(timeout):
                await loop.sock_connect(sock, (host, port))
        except (TimeoutError, OSError) as e:
            sock.close()
            raise TransportError(
                f"TCP punch to {addr} failed: {getattr(e, 'strerror', None) or e or 'timeout'}"
            ) from None
        except BaseException:
            sock.close()
            raise
        _, proto = await loop.create_connection(lambda: self._protocol(initiator, peer_id, libp2p=libp2p), sock=sock)
        return await self._ready(proto)

    async def dial_spliced(
        self, addr: Multiaddr, token: bytes, peer_id: PeerId, *, initiator: bool, remote_addr: Multiaddr
    ) -> Connection:
        """A relayed connection on its own socket: connect to the relay at ``addr``, present
        ``token`` and run Noise end to end with ``peer_id`` through the relay's splice (see
        ``transports/splice.py``). ``initiator`` is the Noise role; the connection counts as
        relayed, at ``remote_addr`` (the circuit address)."""
        host, port = addr.without_peer_id().host_port()
        loop = asyncio.get_running_loop()
        first = PREAMBLE_MAGIC + token

        def factory() -> _TcpProtocol:
            return _TcpProtocol(
                self, initiator, peer_id, inbound=False, preamble=first, label="relay", remote_addr=remote_addr
            )

        if len(token) != TOKEN_LEN:
            raise TransportError("malformed splice token")
        try:
            # the relay waits a few seconds for both ends' sockets; a port that does not answer
            # by then is of no use
            _, proto = await asyncio.wait_for(
                loop.create_connection(factory, host, port), min(self.handshake_timeout, SPLICE_CONNECT_TIMEOUT)
            )
        except TimeoutError:
            raise SpliceUnreachable(f"TCP connect to relay {addr} timed out") from None
        except OSError as e:
            raise SpliceUnreachable(
                f"cannot connect to relay {addr}: {os.strerror(e.errno) if e.errno else e}"
            ) from None
        return await self._ready(proto)

    async def _ready(self, proto: _TcpProtocol) -> MuxedConnection:
        """The connection once its handshake is done (a cancelled wait cancels the handshake)."""
        try:
            conn = await proto.ready
        except asyncio.CancelledError:
            proto.cancel()
            raise
        self._limit_buffers(conn)
        return conn

    def _limit_buffers(self, conn: MuxedConnection) -> None:
        conn._writer.set_write_buffer_limits(  # type: ignore[attr-defined]
            high=self.write_buffer_limit, low=self.write_buffer_limit // 4
        )
