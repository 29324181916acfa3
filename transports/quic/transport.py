"""``QuicTransport``: listen and dial over the endpoints (one per address family, shared by
dials so packets leave from the listening port) and the hole-punch packet spraying."""

from __future__ import annotations

import asyncio
import datetime
import ipaddress
import socket
from collections.abc import Callable
from typing import Any

from lattica import _malloc
from lattica._identity import KeyPair, PeerId
from lattica._multiaddr import Multiaddr
from lattica.errors import (
    MultiaddrError,
    TransportError,
)
from lattica.logging import get_logger
from lattica.transports.base import Connection, ConnectionHandler, Listener, Transport
from lattica.transports.quic import _aioquic
from lattica.transports.quic.connection import QuicConn
from lattica.transports.quic.endpoint import Endpoint, QuicListener
from lattica.transports.quic.tlscert import CertifiedKey, generate_certificate
from lattica.transports.quic.wire import (
    ALPNS,
    CERT_RENEW_BEFORE,
    CID_LEN,
    MAX_DATAGRAM,
    NARROW_WINDOW,
    RECVERR_V4,
    RECVERR_V6,
    SOCK_BUF,
    sockaddr,
    split_addr,
)

log = get_logger("lattica.quic")


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
        first_flight_timeout: float = 4.0,
        keepalive_interval: float = 15.0,
        max_stream_data: int = 8 * 1024 * 1024,
        max_data: int = 32 * 1024 * 1024,
        max_stream_window: int = 32 * 1024 * 1024,
        send_high_water: int = 1024 * 1024,
        max_datagram_size: int = 1350,
        loopback_datagram_size: int = MAX_DATAGRAM,
        congestion_control: str = "cubic",
        close_linger: float = 2.0,
        max_pending_handshakes: int = 256,
        max_handshakes_per_ip: int = 16,
        gso: bool = True,
    ) -> None:
        super().__init__(keypair)
        _malloc.tune()  # (datagram-sized buffers churn glibc's heap top: see lattica/_malloc.py)
        if not 1200 <= max_datagram_size <= MAX_DATAGRAM:
            raise ValueError(f"max_datagram_size must be within 1200..{MAX_DATAGRAM}")
        if not 1200 <= loopback_datagram_size <= MAX_DATAGRAM:
            raise ValueError(f"loopback_datagram_size must be within 1200..{MAX_DATAGRAM}")
        self.max_streams = max_streams
        self.idle_timeout = idle_timeout
        self.handshake_timeout = handshake_timeout
        # an inbound handshake whose client sent nothing after its Initial within this (a spoofed
        # or silent sender: an honest one answers within a round trip or two) gives its slot back
        self.first_flight_timeout = min(first_flight_timeout, handshake_timeout)
        # PINGs keep NAT mappings and the idle timer alive; never slower than idle_timeout / 2
        self._keepalive_interval = min(keepalive_interval, idle_timeout / 2)
        self.max_stream_data = max_stream_data
        self.max_data = max_data
        # A stream whose peer sends a whole window per round trip is held back by it: its window
        # doubles (at most once a round trip) up to this while the reader keeps up, and comes
        # back towards max_stream_data once it slows down; the connection's window follows
        # (1.5x the largest stream window, never below max_data). <= max_stream_data: fixed.
        self.max_stream_window = max(max_stream_window, max_stream_data)
        self.send_high_water = send_high_water
        self.max_datagram_size = max_datagram_size
        self.loopback_datagram_size = loopback_datagram_size
        self.congestion_control = congestion_control
        self.close_linger = close_linger
        self.max_pending_handshakes = max_pending_handshakes
        self.max_handshakes_per_ip = max_handshakes_per_ip  # per IPv4 address or IPv6 /64; loopback is exempt
        self.gso = gso  # runs of datagrams leave as UDP GSO sends where the kernel takes them
        self._cert: CertifiedKey | None = None
        self._endpoints: set[Endpoint] = set()
        self._listen_eps: set[Endpoint] = set()
        self._ephemeral: dict[int, Endpoint] = {}
        self._conns = set()  # (of QuicConns; typed in Transport)
        self._closed = False

    @property
    def listening(self) -> bool:
        """True while a listening endpoint is open (hole punching sends from its socket)."""
        return bool(self._listen_eps)

    def handles(self, addr: Multiaddr) -> bool:
        """True for ``/ip4|ip6/<ip>/udp/<port>/quic-v1`` (optionally ending in /p2p/<id>)."""
        try:
            split_addr(addr)
            return True
        except (MultiaddrError, ValueError):
            return False

    # -- plumbing ---------------------------------------------------------------------------

    def _certified(self) -> CertifiedKey:
        now = datetime.datetime.now(datetime.UTC)
        if self._cert is None or self._cert.not_valid_after - now < CERT_RENEW_BEFORE:
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
            alpn=ALPNS,
            idle_timeout=self.idle_timeout,
            max_data=min(NARROW_WINDOW, self.max_data) if self.narrow_windows else self.max_data,
            max_stream_data=self.max_stream_data,
            max_datagram_size=self.loopback_datagram_size if loopback else self.max_datagram_size,
            congestion_control=self.congestion_control,
            cid_length=CID_LEN,
        )
        return _aioquic.LatticaQuicConnection(
            configuration=config,
            max_streams=self.max_streams,
            original_destination_connection_id=odcid,
        )

    async def _open_endpoint(self, family: socket.AddressFamily, ip: str, port: int) -> Endpoint:
        sock = socket.socket(family, socket.SOCK_DGRAM)
        try:
            if family == socket.AF_INET6:
                sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
            for opt in (socket.SO_RCVBUF, socket.SO_SNDBUF):
                try:
                    sock.setsockopt(socket.SOL_SOCKET, opt, SOCK_BUF)
                except OSError:
                    pass
            try:  # Linux: report ICMP errors (port unreachable) on this unconnected socket
                if family == socket.AF_INET6:
                    sock.setsockopt(socket.IPPROTO_IPV6, RECVERR_V6, 1)
                else:
                    sock.setsockopt(socket.IPPROTO_IP, RECVERR_V4, 1)
            except OSError:
                pass
            sock.setblocking(False)
            sock.bind((ip, port))
        except OSError as e:
            sock.close()
            raise TransportError(f"cannot bind UDP {ip} port {port}: {e.strerror}") from None
        loop = asyncio.get_running_loop()
        ep = Endpoint(self, sock)
        ep.gso = ep.gso and self.gso
        await loop.create_datagram_endpoint(lambda: ep, sock=sock)
        self._endpoints.add(ep)
        return ep

    async def _endpoint_for(self, family: socket.AddressFamily, ip: str) -> Endpoint:
        """The listening endpoint to dial from (shares its NAT mapping), else an ephemeral one."""
        dest_loopback = ipaddress.ip_address(ip).is_loopback
        candidates = [
            ep for ep in self._listen_eps if ep.family == family and not ep.closed and ep.listener is not None
        ]
        for ep in candidates:
            if ep.bound_ip.is_unspecified:
                return ep
        for ep in candidates:
            if not ep.bound_ip.is_loopback or dest_loopback:
                return ep
        ephemeral = self._ephemeral.get(family)
        if ephemeral is None or ephemeral.closed:
            wildcard = "::" if family == socket.AF_INET6 else "0.0.0.0"
            ephemeral = await self._open_endpoint(family, wildcard, 0)
            self._ephemeral[family] = ephemeral
        return ephemeral

    # -- Transport API ----------------------------------------------------------------------

    async def listen(self, addr: Multiaddr, on_connection: ConnectionHandler) -> Listener:
        """Bind a UDP socket on ``addr`` and accept authenticated QUIC connections on it."""
        if self._closed:
            raise TransportError("QUIC transport is closed")
        ip, port, family = split_addr(addr)
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
        ip, port, family = split_addr(addr)
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
        peer_addr = sockaddr(ip, port, family)
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
                ep.sendto(data, sockaddr(ip, addr[1], family))
                return
        raise TransportError(f"no listening QUIC socket for {ip}")

    def on_punch(self, callback: Callable[[bytes, tuple], None] | None) -> None:
        """Be told of punch datagrams (first byte 0) arriving at the listening sockets."""
        for ep in self._listen_eps:
            ep.on_punch = callback

    async def spray(
        self, addrs: list[tuple], count: int, payload: bytes, on_hit: Callable[[Any, bytes, tuple], None]
    ) -> list:
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
                ep.sendto(payload, sockaddr(a[0], a[1], ep.family))

    @staticmethod
    def close_spray(eps: list) -> None:
        """Close the sprayed sockets; one that carries a connection now (a punch got through
        from it) stays until that connection ends."""
        for ep in eps:
            ep.on_punch = None
            if ep.members:
                ep.close_when_idle = True
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
