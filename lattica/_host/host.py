"""The host: everything of one node that runs on its loop. It owns the listeners, the connection
table, the dialer, identify and the address book, dispatches inbound streams to protocol handlers
by name, and starts the actor runtime and the system services (``lattica/services.py``)."""

from __future__ import annotations

import asyncio
import collections
import functools
import math
import threading
import time
import weakref
from collections.abc import Awaitable, Callable, Coroutine, Iterable
from typing import TYPE_CHECKING, Any

from lattica import _envelope as envelope
from lattica import _identify as identify
from lattica import _interfaces as interfaces
from lattica import _ping as ping
from lattica import codec
from lattica._budget import Buckets, StrangersShare, Turns
from lattica._framing import read_delimited, read_message, write_delimited, write_message
from lattica._host.connections import MAX_CONNS_PER_PEER, MAX_DRAINING_PER_PEER, Connections
from lattica._host.dialer import LIMITED_PROTOCOLS, PROTOCOL_READ_TIMEOUT, Dialer, PeerRouting, Puncher
from lattica._host.proposals import ProposedStream
from lattica._host.transports import Transports
from lattica._hostview import HostEvents
from lattica._identify import PeerInfo
from lattica._identity import PeerId
from lattica._multiaddr import Multiaddr
from lattica._protobuf import uvarint
from lattica._runtime import Runtime
from lattica.dht._records import StoreLimits
from lattica.errors import (
    ConnectionClosed,
    LatticaError,
    MultiaddrError,
    NodeClosed,
    PeerUnreachable,
    Timeout,
    UnsupportedProtocol,
)
from lattica.logging import get_logger
from lattica.nat._manager import NatManager, NatStatus
from lattica.services import NodeServices, ServiceContext
from lattica.transports import circuit, circuit_v2, multistream
from lattica.transports.base import Connection, Stream, Transport

if TYPE_CHECKING:
    from lattica._identity import KeyPair
    from lattica.config import NodeConfig
    from lattica.trust import Trust

__all__ = ["Host", "StreamProtocolHandler", "check_protocol_name", "encode_protocol"]

_EARLY_STALE = 15.0  # s: longer than any handshake takes (handshake_timeout is 10 s)
log = get_logger("lattica.node")
StreamProtocolHandler = Callable[[Stream, Connection], Awaitable[None]]

_MAX_PROTOCOL_NAME = 128
_STOP_GRACE = 2.0  # seconds stop() gives all connections together to close gracefully
STRANGERS_PINGS = (1000.0, 2000.0)  # pings a second (and at once) we echo for all strangers together
_MAX_KNOWN_PEERS = 4096  # address book entries; the oldest unconnected peers are forgotten first
_MAX_ADDRS_PER_PEER = 32
# identify pushes a peer may make once its connection is identified (addresses change seldom):
# a burst, then one every 2 s; beyond, only its latest push is kept, and taken when the budget
# allows (each costs ~1 ms of parsing and judging; the latest says where it listens now)
_PUSHES_PER_PEER = (0.5, 10.0)
MAX_ADVERTISED = StoreLimits().max_addrs  # addresses we tell peers and put in our peer record


def check_protocol_name(name: str) -> None:
    """Raise ValueError unless ``name`` fits a stream's protocol header."""
    if not name or len(name.encode()) > _MAX_PROTOCOL_NAME:
        raise ValueError(f"protocol names are 1 to {_MAX_PROTOCOL_NAME} bytes: {name[:40]!r}")


def encode_protocol(name: str) -> bytes:
    """The header that opens a stream: the protocol name, length-prefixed."""
    raw = name.encode()
    return len(raw).to_bytes(1, "big") + raw


def _lattica(protocols: Iterable[str]) -> bool:
    """A peer that serves our identify is a Lattica node."""
    return identify.PROTOCOL in protocols


class Host:
    """Everything that runs on the node loop (implements :class:`lattica._hostview.HostView`)."""

    def __init__(self, config: NodeConfig, keypair: KeyPair, trust: Trust) -> None:
        self.config = config  # what the node was told (max_connections, each service's section, ...)
        self.keypair = keypair
        self.trust = trust  # who is a member of our mesh (lattica.trust)
        self.refusals: collections.deque[dict] = collections.deque(maxlen=32)  # calls we refused, newest last
        self._verdict_timers: dict[Connection, asyncio.TimerHandle] = {}  # certificate expiries, per connection
        # when what we advertise last changed: an identify said early in a handshake that was
        # still going on then is said again once the connection is up (it may be out of date)
        self._addrs_changed_at = -math.inf
        self.peer_id = keypair.peer_id
        self.loop = asyncio.get_running_loop()
        self.max_connections = config.max_connections
        self.transport_set = Transports(self.keypair, config.transport_options, config.memory_network)
        self.transports: list[Transport] = self.transport_set.all
        self.listeners: list = []
        self.bound_addrs: list[Multiaddr] = []  # as the listeners report them (maybe 0.0.0.0)
        self.listen_addrs: list[Multiaddr] = []  # dialable: wildcards expanded per interface
        self.events = HostEvents()  # what services subscribe to (lattica/_hostview.py)
        self.connections = Connections(
            self.peer_id,
            self.loop,
            self.events,
            self.spawn,
            self._serve_stream,
            self._going_away,
            self._drain_expired,
            config.drain_grace,
        )
        # the connection table's maps, under the names the rest of the node reads them by
        self.conns = self.connections.conns
        self.all_conns = self.connections.all_conns
        self.conns_of = self.connections.conns_of
        self.info = self.connections.info
        self.identified = self.connections.identified
        self.protected = self.connections.protected
        self.dialer = Dialer(self)
        self._pushes = Buckets(*_PUSHES_PER_PEER, 4096, clock=self.loop.time)
        # libp2p connections on which the peer, a Lattica node, sent our own identify too (it
        # carries what libp2p's cannot: its mesh certificate), which then stands for it
        self._said_ours: weakref.WeakSet[Connection] = weakref.WeakSet()
        self._told_ours: weakref.WeakSet[Connection] = weakref.WeakSet()  # ... and we told it ours
        self._record: tuple[tuple[Multiaddr, ...], bytes] | None = None  # our signed peer record, of these addrs
        self._held_pushes: dict[Connection, Callable[[], object]] = {}  # a peer's latest push beyond its budget
        self.contacted = self.dialer.contacted
        self.peer_addrs: dict[
            PeerId, list[Multiaddr]
        ] = {}  # the address book: what peers said of themselves (identify, signed records) or the user gave
        self.hint_addrs: dict[
            PeerId, list[Multiaddr]
        ] = {}  # what other peers said of them (lookup answers, swarms): dialed under a budget
        self.handlers: dict[str, StreamProtocolHandler] = {}
        self.tasks: set[asyncio.Task] = set()
        self.closing = False
        self.thread_id = threading.get_ident()
        self.runtime: Runtime | None = None
        self.services = NodeServices()  # the system services, started with us
        self.circuit: circuit.CircuitTransport | None = None
        self.handlers[identify.PROTOCOL] = self._on_identify
        self.handlers[identify.LIBP2P_PROTOCOL] = self._serve_libp2p_identify
        self.handlers[identify.LIBP2P_PUSH_PROTOCOL] = self._on_libp2p_identify_push
        self._strangers_pings = Turns(StrangersShare(*STRANGERS_PINGS, self.connections.from_stranger), self.loop)
        self.handlers[ping.PROTOCOL] = lambda s, c: ping.serve(s, lambda: self._ping_turn(s, c))
        self.handlers[circuit.STOP] = self._on_stop
        self.handlers[circuit_v2.STOP] = lambda s, c: self._on_stop(s, c, v2=True)

    @property
    def nat(self) -> NatManager | None:
        """Our NAT situation (None until the services are built)."""
        return self.services.nat

    # -- start / stop ---------------------------------------------------------------------------

    async def start(self, listen: list[Multiaddr]) -> None:
        self.runtime = Runtime(self, self.config)
        context = ServiceContext(self.peer_id, self.keypair, self.trust, self.loop, self, self.config, self.runtime)
        self.services.start(context)
        self.circuit = circuit.CircuitTransport(
            self.keypair,
            self.dialer.open_hop,
            splice=self.dialer.dial_spliced,
            splice_addr=self.dialer.splice_addr,
            **self.transport_set.options.get("relay", {}),
        )
        self.transport_set.add(self.circuit)
        self.transport_set.set_early(self.early_identify, self._push_early)
        self.transport_set.set_dialed_in(self.events.dialed_in.emit)
        self.events.addresses_changed.subscribe(lambda addrs: setattr(self, "_addrs_changed_at", self.loop.time()))
        for addr in listen:
            transport = self.transport_for(addr)
            if transport is None:
                raise MultiaddrError(f"no transport can listen on {addr}")
            listener = await transport.listen(addr, self._on_inbound)
            self.listeners.append(listener)
            self.bound_addrs.extend(listener.addrs)
            self.listen_addrs.extend(a for bound in listener.addrs for a in interfaces.expand(bound))
        self.spawn(self.connections.reap_idle(self.config.idle_timeout))
        await self.services.astart()

    async def stop(self) -> None:
        membership = self.services.membership
        if membership is not None and not self.closing:
            membership.leave()  # goodbyes go out before the connections close
            membership.close()
            await asyncio.sleep(0)
        self.closing = True
        await self.services.aclose()
        if self.runtime is not None:
            await self.runtime.stop()  # actors first: their on_stop hooks may still call peers
        self.services.close()
        conns = list(self.all_conns)
        try:
            if conns:  # say goodbye to everyone at once, within one overall deadline
                await asyncio.wait([self.loop.create_task(c.close()) for c in conns], timeout=_STOP_GRACE)
        finally:
            for conn in conns:
                conn.abort("node stopping")
            for t in self.transports:
                await t.close()
            for _ in range(5):  # a task ending may start another (a failed request redials): cancel those too
                if not self.tasks:
                    break
                ending = list(self.tasks)
                for task in ending:
                    task.cancel()
                await asyncio.gather(*ending, return_exceptions=True)

    def set_handler(self, protocol: str, handler: StreamProtocolHandler) -> None:
        """Serve inbound streams of ``protocol`` with ``handler(stream, conn)``."""
        self.handlers[protocol] = handler

    def set_peer_routing(self, routing: PeerRouting | None) -> None:
        """Where the dialer looks up a peer it has no address for (the DHT service sets itself)."""
        self.dialer.routing = routing

    def set_puncher(self, puncher: Puncher | None) -> None:
        """What punches a direct path to a peer reached through a relay (the hole-punch service)."""
        self.dialer.puncher = puncher

    def spawn(self, coro: Coroutine[Any, Any, Any]) -> asyncio.Task:
        task = self.loop.create_task(coro)
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)
        return task

    def tcp_transport(self) -> Any:
        """The TCP transport, if it listens (hole punching dials from its listening port)."""
        return self.transport_set.listening("tcp")

    def quic_transport(self) -> Any:
        """The QUIC transport, if it listens (hole punching sends from its listening socket)."""
        return self.transport_set.listening("quic")

    def transport_for(self, addr: Multiaddr) -> Transport | None:
        return self.transport_set.for_addr(addr)

    # -- connections ----------------------------------------------------------------------------

    def _on_inbound(self, conn: Connection) -> None:
        if self.closing:
            conn.abort("node stopping")
            return
        peer = conn.remote_peer
        spare = None
        if len(self.conns_of.get(peer, ())) >= MAX_CONNS_PER_PEER + MAX_DRAINING_PER_PEER:
            # (retired spares drain within a round trip unless streams stay open on them)
            log.info("refusing inbound connection: too many from this peer", peer=str(peer))
            conn.abort("per-peer connection limit reached")
            return
        if self.connections.live_count(peer) >= MAX_CONNS_PER_PEER:
            spare = self.connections.displaceable(peer)
        if spare is None and len(self.all_conns) >= self.max_connections:
            victim = self.connections.evictable()
            if victim is None:
                log.info(
                    "refusing inbound connection: limit reached", peer=str(conn.remote_peer), limit=self.max_connections
                )
                conn.abort("connection limit reached")
                return
            log.info(
                "evicting a connection for a newcomer: limit reached",
                peer=str(victim.remote_peer),
                identified=victim in self.info,
            )
            victim.abort("evicted: connection limit reached (unidentified or idle stranger)")
        if spare is not None:  # (the newcomer takes its place; what is on the spare finishes there)
            log.info(
                "retiring a spare connection for the peer's newest: per-peer limit",
                peer=str(peer),
                spare=spare.transport,
            )
            spare.go_away()
        self.adopt(conn)
        self.dialer.inbound(conn)

    def adopt(self, conn: Connection, spare: bool = False) -> None:
        """Start serving a new authenticated connection and make it the peer's primary one (see
        ``Connections.add`` for a ``spare``)."""
        if self.connections.banned(conn.remote_peer):
            conn.abort("this peer's last connection was closed for opening streams without end: not let back in yet")
            return
        self.connections.add(conn, spare)
        early, conn.early_data = conn.early_data, None  # the peer's identify came in the handshake
        if conn.libp2p:
            self.spawn(self._query_libp2p_identify(conn))  # (a libp2p peer is asked; it asks us too)
        elif not conn.said_early or self.loop.time() - self._addrs_changed_at < _EARLY_STALE:
            self.spawn(self.push_identify(conn))
        if early is None:
            overdue = self.loop.call_later(self.config.identify_timeout, self._identify_overdue, conn)
            conn.add_close_callback(lambda c: overdue.cancel())  # (the timer would hold it 10 s after it closed)
        self.events.connected.emit(conn)
        if early is not None:
            try:
                msg = codec.decode(early)
            except LatticaError as e:
                self._bad_identify(conn, e)
                return
            self._identified(conn, msg)

    def _expire_verdict(self, conn: Connection, after: float) -> None:
        """Close ``conn`` when the certificate that admitted its peer expires (one timer per
        connection, replaced by a later identify, cancelled when the connection closes)."""
        old = self._verdict_timers.pop(conn, None)
        if old is not None:
            old.cancel()
        if after == math.inf or conn.is_closed:
            return
        if old is None:

            def forget(c: Connection) -> None:
                t = self._verdict_timers.pop(c, None)
                if t is not None:
                    t.cancel()

            conn.add_close_callback(forget)
        self._verdict_timers[conn] = self.loop.call_later(max(after, 0.0), self._certificate_expired, conn)

    def _certificate_expired(self, conn: Connection) -> None:
        self._verdict_timers.pop(conn, None)
        if not conn.is_closed and conn in self.info:
            log.info("closing connection: the peer's mesh certificate expired", peer=str(conn.remote_peer))
            self.spawn(conn.close())  # it may reconnect, and is judged afresh (a stranger, or renewed)

    def _identify_overdue(self, conn: Connection) -> None:
        if not conn.is_closed and conn not in self.info:
            log.info(
                "closing connection: no identify in time",
                peer=str(conn.remote_peer),
                timeout=self.config.identify_timeout,
            )
            conn.abort(f"the peer did not identify within {self.config.identify_timeout} s")

    async def peer_info(self, conn: Connection, timeout: float) -> PeerInfo | None:
        """What ``conn``'s peer told us in identify, waiting up to ``timeout`` seconds for it on
        a fresh connection (it is one one-way delay away); None if it never came."""
        info = self.info.get(conn)
        if info is not None:
            return info
        fut = self.identified.get(conn)
        if fut is None:
            return None
        try:
            return await asyncio.wait_for(asyncio.shield(fut), timeout)
        except (TimeoutError, LatticaError):
            return None

    def circle_of(self, peer: PeerId) -> str:
        """What ``peer`` is to us ("self", "member" or "stranger"), from its identify."""
        if peer == self.peer_id:
            return "self"
        for conn in self.conns_of.get(peer, ()):
            info = self.info.get(conn)
            if info is not None:
                return info.circle
        return "stranger"

    def circle_reason(self, peer: PeerId) -> str:
        """Why ``peer`` is in its circle (what made it a member, or why it is a stranger)."""
        for conn in self.conns_of.get(peer, ()):
            info = self.info.get(conn)
            if info is not None:
                return info.circle_reason
        return "it has not identified itself"

    def is_admin(self, peer: PeerId) -> bool:
        """Whether ``peer`` administers our mesh (this node does), from its identify."""
        if peer == self.peer_id:
            return True
        return any(info.admin for conn in self.conns_of.get(peer, ()) if (info := self.info.get(conn)) is not None)

    def note_refusal(self, peer: PeerId, what: str, why: str) -> None:
        """Remember a call we refused (``lattica doctor`` shows the latest)."""
        self.refusals.append({"at": time.time(), "peer": str(peer), "what": what, "why": why})

    def _going_away(self, conn: Connection) -> None:
        if self.runtime is not None:
            self.runtime.connection_going_away(conn)

    def _drain_expired(self, conn: Connection) -> None:
        if self.runtime is not None:
            self.runtime.connection_expired(conn, self.connections.grace)

    def protect(self, peer: PeerId, why: str) -> None:
        """Keep ``peer``'s connection open while idle (relay reservations, ...)."""
        self.connections.protect(peer, why)

    def unprotect(self, peer: PeerId, why: str) -> None:
        self.connections.unprotect(peer, why)

    # -- dialing (lattica/_host/dialer.py) -------------------------------------------------------

    async def connect(self, addrs: list[Multiaddr], peer: PeerId | None, timeout: float) -> PeerInfo:
        return await self.dialer.connect(addrs, peer, timeout)

    async def join(self, addrs: list[Multiaddr], timeout: float) -> PeerInfo:
        """Dial every bootstrap peer at once and return as soon as one is connected and identified
        (it is in the DHT's table then: lookups can start). The DHT's own bootstrap (a self-lookup
        and bucket refreshes) starts at once in the background; the other dials go on. Raises if
        none could be reached."""
        dials = {self.spawn(self.connect([a], None, timeout)): a for a in addrs}
        pending = set(dials)
        errors: list[tuple[Multiaddr, BaseException]] = []
        while pending:
            done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
            for t in done:
                error = NodeClosed("cancelled") if t.cancelled() else t.exception()
                if error is not None:
                    errors.append((dials[t], error))
                    continue
                for other in pending:  # their failures were ours to hear of only if all failed
                    other.add_done_callback(_retrieve)
                self.spawn(self._fill_routing())
                return t.result()
        if len(errors) == 1:
            raise errors[0][1]
        raise PeerUnreachable("no bootstrap peer could be reached: " + "; ".join(f"{a}: {e}" for a, e in errors))

    async def _fill_routing(self) -> None:
        dht = self.services.dht
        if dht is None or self.closing:
            return
        try:
            await dht.bootstrap()
        except LatticaError as e:
            log.info("DHT bootstrap failed", reason=str(e))

    async def get_connection(self, peer: PeerId, limited: bool = False) -> Connection:
        """The live connection to ``peer``, dialing it if there is none (a libp2p relay's limited
        circuit only if ``limited``: see Dialer.get_connection)."""
        return await self.dialer.get_connection(peer, limited)

    async def dial_addrs(self, peer: PeerId, addrs: list[Multiaddr]) -> Connection:
        return await self.dialer.dial_addrs(peer, addrs)

    def note_contact(self, ip: str, transport: str) -> None:
        self.dialer.note_contact(ip, transport)

    # -- streams and protocols ------------------------------------------------------------------

    async def open_stream(self, peer: PeerId, protocol: str) -> Stream:
        check_protocol_name(protocol)
        conn = await self.get_connection(peer, limited=protocol in LIMITED_PROTOCOLS)
        info = self.info.get(conn)
        if info is not None and protocol not in info.protocols:
            raise UnsupportedProtocol(f"{peer} does not serve {protocol}")
        return await self.open_stream_on(conn, protocol)

    @staticmethod
    async def open_stream_on(conn: Connection, protocol: str) -> Stream:
        """A stream speaking ``protocol`` on this very connection: named in our one-byte header
        to a Lattica node, proposed with multistream-select to a libp2p peer. Either way the
        caller writes at once; a libp2p peer's refusal comes with the first read
        (UnsupportedProtocol)."""
        stream = await conn.open_stream()
        if not conn.libp2p:
            stream.write(encode_protocol(protocol))
            return stream
        select = multistream.Dialer([protocol])
        stream.write(select.data_to_send())
        return ProposedStream(stream, select, conn.remote_peer)

    async def _select_inbound(self, stream: Stream) -> str:
        """The protocol a libp2p peer's stream speaks, agreed with multistream-select: any of
        our handlers (strangers are then held to what each allows them, as on our own header)."""
        select = multistream.Listener(self.handlers.__contains__, lambda: sorted(self.handlers))
        try:
            while (event := select.next_event()) is None:
                body = await read_delimited(stream, multistream.MAX_MESSAGE)
                select.receive(uvarint(len(body)) + body)
                out = select.data_to_send()
                if out:
                    stream.write(out)
        except LatticaError as e:
            if select.refused:  # (the usual end of a proposal we refused: the peer resets the stream)
                raise UnsupportedProtocol(f"we do not speak {', '.join(select.refused[:3])}") from e
            raise
        assert isinstance(event, multistream.Agreed)  # (a listener's only event)
        return event.protocol

    async def _serve_stream(self, stream: Stream, conn: Connection) -> None:
        try:
            async with asyncio.timeout(PROTOCOL_READ_TIMEOUT):  # cheaper than wait_for: no extra task
                if conn.libp2p:
                    name = await self._select_inbound(stream)
                else:
                    head = await stream.readexactly(1)
                    name = (await stream.readexactly(head[0])).decode()
        except UnsupportedProtocol as e:
            log.debug("libp2p peer's stream refused", peer=str(conn.remote_peer), reason=str(e))
            stream.reset()
            return
        except (TimeoutError, LatticaError, UnicodeDecodeError) as e:
            log.info(
                "dropping stream: no valid protocol header",
                peer=str(conn.remote_peer),
                reason=str(e) or type(e).__name__,
            )
            stream.reset()
            return
        handler = self.handlers.get(name)
        if handler is None:
            log.info("dropping stream: unknown protocol", peer=str(conn.remote_peer), protocol=name[:64])
            stream.reset()
            return
        try:
            await handler(stream, conn)
        except (TimeoutError, LatticaError) as e:
            log.info(
                "stream handler failed", peer=str(conn.remote_peer), protocol=name, reason=str(e) or type(e).__name__
            )
            stream.reset()
        except Exception:
            log.exception("stream handler crashed", peer=str(conn.remote_peer), protocol=name)
            stream.reset()

    async def _on_stop(self, stream: Stream, conn: Connection, v2: bool = False) -> None:
        """A relay brings us a circuit: ours, or (``v2``) libp2p's circuit relay v2's."""
        if conn.transport == "relay" or "relay-client" not in self.protected.get(conn.remote_peer, ()):
            log.info("refusing relayed connection: we hold no reservation with this peer", peer=str(conn.remote_peer))
            stream.reset()
            return
        assert self.circuit is not None  # (made at start, before any connection)
        if v2:
            await self.circuit.accept_v2(stream, conn, self._on_inbound)
        else:
            await self.circuit.accept(stream, conn, self._on_inbound)

    # -- identify and the address book ----------------------------------------------------------

    def advertised_addrs(self) -> list[Multiaddr]:
        """What we tell peers and the DHT: listen addresses, confirmed public ones (else, while
        unknown, observed candidates), circuits."""
        out = list(self.listen_addrs)
        nat = self.services.nat
        if nat is None:  # (not built yet: the node is starting)
            return out[:MAX_ADVERTISED]
        for a in nat.public_addrs + nat.candidate_addrs:
            if a not in out:
                out.append(a)
        # a peer record holds at most MAX_ADVERTISED (records.StoreLimits): circuits always fit
        relayed = [a for a in dict.fromkeys(nat.relay_addrs) if a not in out][:MAX_ADVERTISED]
        return out[: MAX_ADVERTISED - len(relayed)] + relayed

    def _identify_message(self, observed: Multiaddr) -> dict[str, Any]:
        """Who we are and where we listen, for a peer that reaches us from ``observed``."""
        return identify.build(
            self.keypair.public_key_protobuf(),
            self.config.agent_version,
            self.advertised_addrs(),
            observed,
            sorted(self.handlers),
            self.trust.presented,
        )

    def early_identify(self, observed: Multiaddr) -> bytes | None:
        """Our identify message as handshake early data (``Transport.early_data``); None when the
        connection would be refused whoever the peer is (stopping, or full): then the peer,
        without it, waits for identify as before and learns the refusal from its connect."""
        if self._refusing():
            return None
        return b"".join(codec.encode(self._identify_message(observed)))

    def _refusing(self) -> bool:
        # (full: a newcomer might still evict an idle stranger, but that is decided once we
        # know who it is, after the handshake; the early identify would only mislead it)
        return self.closing or len(self.all_conns) >= self.max_connections

    async def push_identify(self, conn: Connection, lattica_peer: bool = False) -> bool:
        """Tell the peer on ``conn`` who we are and where we listen (again, when that changes):
        in libp2p's identify to a libp2p peer, in ours to a Lattica node (over libp2p's stack
        too: a libp2p relay's circuit or a DCUtR punch between two of ours; ``lattica_peer``:
        the peer's libp2p identify just said it is one)."""
        info = self.info.get(conn)
        lattica_peer = not conn.libp2p or (
            _lattica(self.handlers)  # (what we do not serve, we do not speak)
            and (lattica_peer or conn in self._said_ours or (info is not None and _lattica(info.protocols)))
        )
        try:
            if not lattica_peer:
                stream = await self.open_stream_on(conn, identify.LIBP2P_PUSH_PROTOCOL)
                write_delimited(stream, self._libp2p_identify(conn.remote_addr))
            else:
                if conn.libp2p:
                    self._told_ours.add(conn)
                stream = await self.open_stream_on(conn, identify.PROTOCOL)
                write_message(stream, self._identify_message(conn.remote_addr))
            await stream.close()
            self.spawn(self._expect_end(stream))  # (nothing comes back on it)
            return True
        except LatticaError as e:
            log.debug("identify push failed", peer=str(conn.remote_peer), reason=str(e))
            return False

    def _push_early(self, conn: Connection) -> None:
        """``Transport.early_push``: identify on a connection whose handshake is still going on
        (a QUIC client that just said hello): it reaches the client with the handshake's end."""

        async def push() -> None:
            if await self.push_identify(conn):
                conn.said_early = True  # (adopt, once the client is verified, does not push again)

        if not self._refusing():
            self.spawn(push())

    def _bad_identify(self, conn: Connection, e: BaseException) -> None:
        log.info("closing connection: bad identify", peer=str(conn.remote_peer), reason=str(e) or "timeout")
        fut = self.identified.get(conn)
        if fut is not None and not fut.done():  # a connect() waiting for it learns why
            fut.set_exception(
                ConnectionClosed(f"connection to {conn.remote_peer} closed: bad identify: {e or 'timeout'}")
            )
            fut.exception()
        conn.abort(f"bad identify: {e}")

    async def _on_identify(self, stream: Stream, conn: Connection) -> None:
        try:
            async with asyncio.timeout(PROTOCOL_READ_TIMEOUT):
                msg = await read_message(stream, identify.MAX_MESSAGE)
        except (TimeoutError, LatticaError) as e:
            self._bad_identify(conn, e)
            return
        if conn in self.info and not self._pushes.take(conn.remote_peer):  # (its first identify always counts)
            self._hold_push(conn, functools.partial(self._identified, conn, msg))
        else:
            self._held_pushes.pop(conn, None)  # (an older push held is not taken after this one)
            if not self._identified(conn, msg):
                return
        # one message per stream: anything after it is a protocol error; end the stream either way
        try:
            async with asyncio.timeout(PROTOCOL_READ_TIMEOUT):
                extra = await stream.read(1)
        except TimeoutError:
            extra = b"?"
        if extra:
            stream.reset()
        else:
            await stream.close()

    def _hold_push(self, conn: Connection, take: Callable[[], object]) -> None:
        """Keep a peer's latest push beyond its budget (replacing an older one) until it is due."""
        if conn not in self._held_pushes:
            self.loop.call_later(self._pushes.wait(conn.remote_peer), self._held_push_due, conn)
        self._held_pushes[conn] = take

    def _held_push_due(self, conn: Connection) -> None:
        take = self._held_pushes.pop(conn, None)
        if take is not None and not conn.is_closed and not self.closing:
            self._pushes.take(conn.remote_peer, force=True)
            take()

    # -- identify with libp2p peers (/ipfs/id/1.0.0: the querier opens the stream) ---------------

    def _libp2p_identify(self, observed: Multiaddr) -> bytes:
        addrs = self.advertised_addrs()
        return identify.encode_libp2p(
            self.keypair.public_key_protobuf(),
            self.config.agent_version,
            self.config.protocol_version,
            addrs,
            observed,
            sorted(self.handlers),
            self._signed_record(addrs),
        )

    def _signed_record(self, addrs: list[Multiaddr]) -> bytes:
        """Our signed peer record of ``addrs``, sealed again only when they change (its sequence
        number is the time it was made, in microseconds, so a newer one always counts as newer)."""
        key = tuple(addrs)
        if self._record is None or self._record[0] != key:
            seq = time.time_ns() // 1000
            self._record = (key, envelope.seal_peer_record(self.keypair, seq, addrs))
        return self._record[1]

    async def _serve_libp2p_identify(self, stream: Stream, conn: Connection) -> None:
        write_delimited(stream, self._libp2p_identify(conn.remote_addr))
        await stream.close()

    async def _query_libp2p_identify(self, conn: Connection) -> None:
        try:
            stream = await self.open_stream_on(conn, identify.LIBP2P_PROTOCOL)
            async with asyncio.timeout(PROTOCOL_READ_TIMEOUT):
                data = await read_delimited(stream, identify.LIBP2P_MAX_MESSAGE)
            await stream.close()
            fields = identify.parse_libp2p(data, conn.remote_peer)
        except (TimeoutError, LatticaError) as e:
            self._bad_identify(conn, e)
            return
        if _lattica(fields["protocols"]) and _lattica(self.handlers):
            # a Lattica node met over libp2p's stack: each side sends the other our own identify
            # too, and the peer's stands for this one once it comes (this one, if it does not
            # within the deadline): who the peer is, for calls, waits for it
            if conn not in self._told_ours:
                self.spawn(self.push_identify(conn, lattica_peer=True))
            if conn not in self._said_ours:
                self.loop.call_later(PROTOCOL_READ_TIMEOUT, self._take_libp2p_identify, conn, fields)
        else:
            self._take_identify(conn, fields)
        await self._expect_end(stream)

    def _take_libp2p_identify(self, conn: Connection, fields: dict[str, Any]) -> None:
        """A Lattica node's libp2p identify, if its own identify never came."""
        if not conn.is_closed and conn not in self._said_ours and conn not in self.info:
            self._take_identify(conn, fields)

    @staticmethod
    async def _expect_end(stream: Stream) -> None:
        """The peer ends ``stream`` after its message (or after ours); reset it if anything more
        comes, or no end within the deadline. A stream we open has the full window: bytes the
        peer sends on where nothing reads them would otherwise pin 4 MiB of it."""
        try:
            async with asyncio.timeout(PROTOCOL_READ_TIMEOUT):
                extra = await stream.read(1)
        except (TimeoutError, LatticaError):
            extra = b"?"
        if extra:
            stream.reset()

    async def _on_libp2p_identify_push(self, stream: Stream, conn: Connection) -> None:
        """A libp2p peer's update: what it leaves out is unchanged. Beyond the peer's push budget
        the latest message is held unparsed and taken when the budget allows, as on our own
        protocol: a peer pushing in a loop costs reads of 4 KiB, not parses."""
        try:
            async with asyncio.timeout(PROTOCOL_READ_TIMEOUT):
                data = await read_delimited(stream, identify.LIBP2P_MAX_MESSAGE)
        except (TimeoutError, LatticaError) as e:
            log.info("ignoring an identify push", peer=str(conn.remote_peer), reason=str(e) or "timeout")
            stream.reset()
            return
        await stream.close()
        if conn in self.info and not self._pushes.take(conn.remote_peer):
            self._hold_push(conn, functools.partial(self._take_libp2p_push, conn, data))
        else:
            self._held_pushes.pop(conn, None)  # (an older push held is not taken after this one)
            self._take_libp2p_push(conn, data)

    def _take_libp2p_push(self, conn: Connection, data: bytes) -> None:
        if conn in self._said_ours:
            return  # (the peer's own identify says more; its updates come that way too)
        try:
            fields = identify.parse_libp2p(data, conn.remote_peer)
        except LatticaError as e:
            log.info("ignoring an identify push", peer=str(conn.remote_peer), reason=str(e))
            return
        before = self.info.get(conn)
        if before is not None:
            for key in ("listen_addrs", "protocols", "agent_version", "protocol_version"):
                if not fields[key]:
                    fields[key] = getattr(before, key)
            fields["observed_addr"] = fields["observed_addr"] or before.observed_addr
        self._take_identify(conn, fields)

    def _identified(self, conn: Connection, msg: Any) -> bool:
        """Take the peer's identify message (pushed on a stream, or early in the handshake);
        False if it was unusable (the connection is then closed)."""
        try:
            fields = identify.parse(msg, conn.remote_peer)
        except LatticaError as e:
            self._bad_identify(conn, e)
            return False
        if conn.libp2p and conn not in self._said_ours:
            self._said_ours.add(conn)
            if conn not in self._told_ours:  # (it may have heard our libp2p identify only: answer in kind)
                self.spawn(self.push_identify(conn, lattica_peer=True))
        return self._take_identify(conn, fields)

    def _take_identify(self, conn: Connection, fields: dict[str, Any]) -> bool:
        """What a peer said of itself, parsed (``identify.parse`` or ``parse_libp2p``): judged by
        our trust, kept as its PeerInfo, and told to whoever waits for it."""
        now = time.time()
        verdict = self.trust.judge(conn.remote_peer, fields.pop("mesh_certs"), now)
        self._expire_verdict(conn, verdict.until - now)
        info = PeerInfo(
            conn.remote_peer,
            conn.transport,
            conn.direction,
            conn.remote_addr,
            **fields,
            circle=verdict.circle,
            circle_reason=verdict.why,
            admin=verdict.admin,
        )
        self.info[conn] = info
        if verdict.circle != "stranger":
            conn.widen_windows()
        self.connections.settle(conn)  # (beside a primary, a connection counts once identified)
        self.remember_addrs(conn.remote_peer, info.listen_addrs)
        self.events.identified.emit(info)
        fut = self.identified.get(conn)
        if fut is not None and not fut.done():
            fut.set_result(info)
        self.dialer.identified(conn, info)
        return True

    def hinted_addrs(self, peer: PeerId, addrs: list[Multiaddr]) -> list[Multiaddr]:
        return self.dialer.hinted(peer, addrs)

    def remember_addrs(self, peer: PeerId, addrs: Iterable[Multiaddr], hint: bool = False) -> None:
        """Add dialable addresses of ``peer`` to the (bounded) address book. ``hint``: another
        peer said so (a lookup's answer, a swarm): kept apart, dialed only while the peer has no
        address of its own word and under a budget per destination (``Dialer.hinted``), and
        never passed on."""
        if hint:
            if self.peer_addrs.get(peer):
                return
            book = self.hint_addrs
            known = book.pop(peer, [])
            for a in addrs:
                a = a.without_peer_id()
                if a not in known and len(known) < _MAX_ADDRS_PER_PEER:
                    known.append(a)
            book[peer] = known
            while len(book) > _MAX_KNOWN_PEERS:
                del book[next(iter(book))]
            return
        self.hint_addrs.pop(peer, None)
        known = self.peer_addrs.pop(peer, [])  # re-inserted last: most recently used
        for a in addrs:
            a = a.without_peer_id()
            if a not in known and len(known) < _MAX_ADDRS_PER_PEER:
                known.append(a)
        self.peer_addrs[peer] = known
        if len(self.peer_addrs) > _MAX_KNOWN_PEERS:
            for old in list(self.peer_addrs):
                if old not in self.conns and old != peer:
                    del self.peer_addrs[old]
                    if len(self.peer_addrs) <= _MAX_KNOWN_PEERS:
                        break

    # -- what the Node facade asks ---------------------------------------------------------------

    async def _ping_turn(self, stream: Stream, conn: Connection) -> None:
        """Before a ping's echo: at once for a member; a stranger's waits its turn of the share
        all strangers' pings have, unless its stream or connection goes away meanwhile (then
        the echo fails and the stream's handler ends) or it turns out to be a member."""
        await self._strangers_pings.take(
            conn, give_up=lambda: stream.aborted or conn.is_closed or not self.connections.from_stranger(conn)
        )

    async def ping(self, peer: PeerId, count: int, timeout: float) -> list[float]:
        async def run() -> list[float]:
            stream = await self.open_stream(peer, ping.PROTOCOL)
            try:
                rtts = await ping.measure(stream, count)
            except BaseException:
                stream.reset()
                raise
            await stream.close()
            return rtts

        try:
            return await asyncio.wait_for(run(), timeout)
        except TimeoutError:
            raise Timeout(f"{count} ping(s) to {peer} did not finish within {timeout} s") from None

    async def nat_status(self, refresh: bool) -> NatStatus:
        assert self.nat is not None
        if refresh and self.nat.cfg.reachability is None:
            await self.nat.probe()
        return self.nat.snapshot()

    def peers(self) -> list[PeerInfo]:
        out = []
        for peer, conn in self.conns.items():
            info = self.info.get(conn)
            out.append(
                info
                or PeerInfo(
                    peer,
                    conn.transport,
                    conn.direction,
                    conn.remote_addr,
                    circle_reason="it has not identified itself yet",
                )
            )
        return out


def _retrieve(task: asyncio.Task) -> None:
    if not task.cancelled():
        task.exception()
