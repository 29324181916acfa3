"""The node: one event loop thread that owns every socket, connection and protocol object.

``Node`` is the thread-safe handle users hold (sync methods, plus ``a``-prefixed coroutine versions
usable from any event loop). ``_Host`` lives on the node loop and does the work: listening, dialing
(racing TCP and QUIC), keeping one connection per peer, limits, idle close, identify and ping, and
dispatching inbound streams to protocol handlers by name.
"""

from __future__ import annotations

import asyncio
import atexit
import concurrent.futures
import os
import threading
import time
import weakref
from typing import TYPE_CHECKING, Any, Awaitable, Callable, Coroutine, Iterable, TypeVar

from lattica.logging import get_logger

from lattica import context, holepunch, identify, interfaces, ping
from lattica.transports import circuit
from lattica.transports.circuit import CircuitTransport
from lattica._loop import DEFAULT_BUSY_POLL_US, new_loop
from lattica.errors import (
    ConnectionClosed,
    ConnectionLimit,
    ConnectionRefused,
    LatticaError,
    MultiaddrError,
    NodeClosed,
    PeerGone,
    PeerUnreachable,
    Timeout,
    TransportError,
    UnsupportedProtocol,
)
from lattica.framing import read_message, write_message
from lattica.identify import PeerInfo
from lattica.identity import KeyPair, PeerId
from lattica.multiaddr import Multiaddr
from lattica.config import DhtConfig, MembershipConfig, NatConfig, RelayConfig
from lattica.nat import NatManager, NatStatus
from lattica.hostview import HostEvents
from lattica.runtime import Runtime
from lattica.services import Services
from lattica.transports.base import PROBE_TIMEOUT, Connection, Stream, Transport

if TYPE_CHECKING:
    from lattica.actors.holepunch import HolePunchService
    from lattica.actors.membership import MembershipService
    from lattica.actors.relay import RelayService

__all__ = ["Node", "PeerInfo"]

log = get_logger("lattica.node")
T = TypeVar("T")
StreamProtocolHandler = Callable[[Stream, Connection], Awaitable[None]]

AGENT_VERSION = "lattica-py/0.1.0"
_MAX_PROTOCOL_NAME = 128
_PROTOCOL_READ_TIMEOUT = 10.0
_DIAL_STAGGER = 0.25  # happy-eyeballs delay before starting the next address
_LINGER = 2.0  # seconds a duplicate connection stays up for streams already on it
_STOP_GRACE = 2.0  # seconds stop() gives all connections together to close gracefully
_MAX_CONNS_PER_PEER = 4
_MAX_KNOWN_PEERS = 4096  # address book entries; the oldest unconnected peers are forgotten first
_MAX_ADDRS_PER_PEER = 32


# Set while the DHT itself makes requests: the dials they start must not look peers up in the DHT.


def _check_protocol_name(name: str) -> None:
    if not name or len(name.encode()) > _MAX_PROTOCOL_NAME:
        raise ValueError(f"protocol names are 1 to {_MAX_PROTOCOL_NAME} bytes: {name[:40]!r}")


def _encode_protocol(name: str) -> bytes:
    raw = name.encode()
    return len(raw).to_bytes(1, "big") + raw


class _Host:
    """Everything that runs on the node loop."""

    def __init__(self, node: Node) -> None:
        self.node = node
        self.keypair = node.keypair
        self.peer_id = node.keypair.peer_id
        self.loop = asyncio.get_running_loop()
        self.transports: list[Transport] = []
        self.listeners: list = []
        self.bound_addrs: list[Multiaddr] = []  # as the listeners report them (maybe 0.0.0.0)
        self.listen_addrs: list[Multiaddr] = []  # dialable: wildcards expanded per interface
        self.conns: dict[PeerId, Connection] = {}
        self.all_conns: set[Connection] = set()
        self.conns_of: dict[PeerId, set[Connection]] = {}  # every live connection, by peer
        self.info: dict[Connection, PeerInfo] = {}
        self.identified: dict[Connection, asyncio.Future[PeerInfo]] = {}
        self.peer_addrs: dict[PeerId, list[Multiaddr]] = {}
        self.dialing: dict[PeerId, tuple[asyncio.Future[Connection], bool]] = {}  # -> (dial, DHT lookups allowed)
        self.handlers: dict[str, StreamProtocolHandler] = {}
        self.tasks: set[asyncio.Task] = set()
        self.idle_since: dict[Connection, float] = {}
        self.closing = False
        self.thread_id = threading.get_ident()
        self.runtime: Runtime | None = None
        self.events = HostEvents()  # what services subscribe to (lattica/hostview.py)
        self.protected: dict[PeerId, set[str]] = {}  # peers whose idle connections stay open, and why
        self.relay_addrs: list[Multiaddr] = []  # our /p2p-circuit addresses (from reservations)
        self.public_addrs: list[Multiaddr] = []  # observed addresses AutoNAT confirmed dialable
        self.upgrading: set[PeerId] = set()  # peers we are trying to reach directly (relayed now)
        self.upgrade_again: set[PeerId] = set()  # new addresses came while upgrading: try again after
        self.contacted: dict[str, float] = {}  # IP -> when a listening socket last sent it a packet (opens cone filters)
        self.circuit: CircuitTransport | None = None
        self.nat: NatManager | None = None
        self.mdns: Any = None  # the MdnsService, when mDNS runs
        self.services = Services()  # the system services (lattica/services.py), started with us
        self.handlers[identify.PROTOCOL] = self._on_identify
        self.handlers[ping.PROTOCOL] = lambda s, c: ping.serve(s)
        self.handlers[circuit.STOP] = self._on_stop

    @property
    def relay(self) -> RelayService | None:
        """The relay service, when this node relays for others."""
        return self.services.get("relay")

    @property
    def holepunch(self) -> HolePunchService | None:
        return self.services.get("holepunch")

    @property
    def membership(self) -> MembershipService | None:
        return self.services.get("membership")

    # -- start / stop ---------------------------------------------------------------------------

    async def start(self, listen: list[Multiaddr]) -> None:
        self.runtime = Runtime(self, self.node.allow, self.services)
        self.services.start(self.runtime, self.node)
        self.transports = self.node._make_transports()
        self.circuit = circuit.CircuitTransport(
            self.keypair, self._open_hop, splice=self._dial_spliced, splice_addr=self._splice_addr, **self.node._transport_options.get("relay", {})
        )
        self.transports.append(self.circuit)
        self.nat = NatManager(self, self.node.nat_config)
        for addr in listen:
            transport = self.transport_for(addr)
            if transport is None:
                raise MultiaddrError(f"no transport can listen on {addr}")
            listener = await transport.listen(addr, self._on_inbound)
            self.listeners.append(listener)
            self.bound_addrs.extend(listener.addrs)
            self.listen_addrs.extend(a for bound in listener.addrs for a in interfaces.expand(bound))
        self.spawn(self._idle_reaper())
        self.nat.start()
        want = self.node.mdns
        if want or (want is None and any(interfaces.is_lan(a) for a in self.listen_addrs)):
            from lattica.mdns import MdnsService

            self.mdns = MdnsService(self)
            if not await self.mdns.start():
                self.mdns = None

    async def stop(self) -> None:
        if self.membership is not None and not self.closing:
            self.membership.leave()  # goodbyes go out before the connections close
            self.membership.close()
            await asyncio.sleep(0)
        self.closing = True
        if self.mdns is not None:
            self.mdns.close()
        if self.runtime is not None:
            await self.runtime.stop()  # actors first: their on_stop hooks may still call peers
        self.services.close()
        conns = list(self.all_conns)
        try:
            if conns:  # say goodbye to everyone at once, within one overall deadline
                await asyncio.wait(
                    [self.loop.create_task(c.close()) for c in conns], timeout=_STOP_GRACE
                )
        finally:
            for conn in conns:
                conn.abort("node stopping")
            for t in self.transports:
                await t.close()
            for task in list(self.tasks):
                task.cancel()
            if self.tasks:
                await asyncio.gather(*self.tasks, return_exceptions=True)

    @property
    def identify_listeners(self) -> Any:  # TEMPORARY until actors/dht subscribes to events.identified
        return type("_Compat", (), {"append": staticmethod(self.events.identified.subscribe)})()

    def set_handler(self, protocol: str, handler: StreamProtocolHandler) -> None:
        """Serve inbound streams of ``protocol`` with ``handler(stream, conn)``."""
        self.handlers[protocol] = handler

    def spawn(self, coro: Coroutine[Any, Any, Any]) -> asyncio.Task:
        task = self.loop.create_task(coro)
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)
        return task

    def tcp_transport(self) -> Any:
        """The TCP transport, if it listens (hole punching dials from its listening port)."""
        return next((t for t in self.transports if t.name == "tcp" and t._listeners), None)

    def quic_transport(self) -> Any:
        """The QUIC transport, if it listens (hole punching sends from its listening socket)."""
        return next((t for t in self.transports if t.name == "quic" and t._listen_eps), None)

    def transport_for(self, addr: Multiaddr) -> Transport | None:
        for t in self.transports:
            if t.handles(addr):
                return t
        if self.node._lazy_quic and addr.without_peer_id().protocols()[-1:] == ["quic-v1"]:
            self.node._lazy_quic = False  # QUIC (and aioquic's import) only once it is needed
            self.transports.append(self.node._make_quic())
            return self.transport_for(addr)
        return None

    # -- connections ----------------------------------------------------------------------------

    def _on_inbound(self, conn: Connection) -> None:
        if self.closing:
            conn.abort("node stopping")
            return
        if len(self.all_conns) >= self.node.max_connections:
            log.info("refusing inbound connection: limit reached", peer=str(conn.remote_peer), limit=self.node.max_connections)
            conn.abort("connection limit reached")
            return
        if len(self.conns_of.get(conn.remote_peer, ())) >= _MAX_CONNS_PER_PEER:
            log.info("refusing inbound connection: too many from this peer", peer=str(conn.remote_peer))
            conn.abort("per-peer connection limit reached")
            return
        self.adopt(conn)

    def adopt(self, conn: Connection) -> None:
        """Start serving a new authenticated connection and make it the peer's primary one."""
        self.all_conns.add(conn)
        self.conns_of.setdefault(conn.remote_peer, set()).add(conn)
        self.idle_since[conn] = self.loop.time()
        self.identified[conn] = self.loop.create_future()
        conn.add_close_callback(self._on_closed)
        conn.set_stream_handler(lambda s: self.spawn(self._serve_stream(s, conn)))
        peer = conn.remote_peer
        existing = self.conns.get(peer)
        if existing is None or existing.is_closed:
            self.conns[peer] = conn
        elif (conn.transport == "relay") != (existing.transport == "relay"):
            # a direct path always wins over a relayed one; calls already on the loser finish there
            if existing.transport == "relay":
                self.conns[peer] = conn
                self.loop.call_later(_LINGER, self._close_if_unused, existing)
                if self.runtime is not None:
                    self.runtime.path_changed(peer)
            else:
                self.loop.call_later(_LINGER, self._close_if_unused, conn)
        elif self._dialer(conn) != self._dialer(existing):
            # Both sides dialed at once: both ends must keep the same connection, so keep the one
            # dialed by the smaller PeerId and let the other linger for streams already on it.
            keep_new = self._dialer(conn) < self._dialer(existing)
            winner, loser = (conn, existing) if keep_new else (existing, conn)
            self.conns[peer] = winner
            self.loop.call_later(_LINGER, self._close_if_unused, loser)
        else:
            # One side dialed twice (e.g. TCP and QUIC both won a race): new streams use the newer
            # connection; the older is not force-closed (the two ends might disagree on which is
            # older) and closes itself once idle. It may also be dead (the peer's NAT forgot it,
            # so the peer dialed again): it is probed, and aborted if it does not answer.
            self.conns[peer] = conn
            existing.probe(PROBE_TIMEOUT)
        self.spawn(self.push_identify(conn))
        self.events.connected.emit(conn)

    def _dialer(self, conn: Connection) -> PeerId:
        return self.peer_id if conn.direction == "outbound" else conn.remote_peer

    def _close_if_unused(self, conn: Connection) -> None:
        if conn.is_closed or self.conns.get(conn.remote_peer) is conn:
            return
        if conn.num_streams == 0:
            self.spawn(conn.close())
        else:
            self.loop.call_later(_LINGER, self._close_if_unused, conn)

    def _on_closed(self, conn: Connection) -> None:
        self.all_conns.discard(conn)
        self.info.pop(conn, None)
        self.idle_since.pop(conn, None)
        fut = self.identified.pop(conn, None)
        if fut is not None and not fut.done():
            fut.set_exception(ConnectionClosed(f"connection to {conn.remote_peer} closed before identify"))
            fut.exception()
        peer = conn.remote_peer
        same = self.conns_of.get(peer)
        if same is not None:
            same.discard(conn)
            if not same:
                del self.conns_of[peer]
                self.events.disconnected.emit(peer, conn)
        if self.conns.get(peer) is conn:
            del self.conns[peer]
            for other in same or ():  # promote a surviving duplicate, if any
                if not other.is_closed:
                    self.conns[peer] = other
                    break

    async def _idle_reaper(self) -> None:
        timeout = self.node.idle_timeout
        while True:
            await asyncio.sleep(max(timeout / 4, 0.05))
            now = self.loop.time()
            for conn in list(self.all_conns):
                if conn.num_streams or (conn.remote_peer in self.protected and self.conns.get(conn.remote_peer) is conn):
                    self.idle_since[conn] = now
                elif now - self.idle_since.get(conn, now) >= timeout:
                    log.debug("closing idle connection", peer=str(conn.remote_peer))
                    self.spawn(conn.close())

    # -- dialing --------------------------------------------------------------------------------

    async def connect(self, addrs: list[Multiaddr], peer: PeerId | None, timeout: float) -> PeerInfo:
        if peer is None:
            ids = {a.peer_id for a in addrs}
            if len(ids) != 1 or None in ids:
                raise MultiaddrError("connect needs addresses ending in /p2p/<PeerId> (or a peer_id)")
            peer = ids.pop()  # type: ignore[assignment]
        if peer == self.peer_id:
            raise PeerUnreachable("cannot connect to ourselves")
        self.remember_addrs(peer, addrs)
        try:
            conn = await asyncio.wait_for(self.get_connection(peer), timeout)
            return await asyncio.wait_for(asyncio.shield(self.identified[conn]), timeout)
        except asyncio.TimeoutError:
            raise Timeout(f"connecting to {peer} took longer than {timeout} s") from None
        except KeyError:
            raise ConnectionClosed(f"connection to {peer} closed before identify") from None

    async def get_connection(self, peer: PeerId) -> Connection:
        """The live connection to ``peer``, dialing its known addresses if there is none."""
        conn = self.conns.get(peer)
        if conn is not None and not conn.is_closed:
            return conn
        lookups = not context.NO_DHT_DIAL_LOOKUP.get()
        entry = self.dialing.get(peer)
        if entry is not None:
            if entry[1] or not lookups:
                return await asyncio.shield(entry[0])
            try:  # a DHT request's dial (known addresses only) is under way: if it fails, we look
                return await asyncio.shield(entry[0])
            except PeerUnreachable:
                conn = self.conns.get(peer)
                if conn is not None and not conn.is_closed:
                    return conn
                entry = self.dialing.get(peer)
                if entry is not None and entry[1]:
                    return await asyncio.shield(entry[0])
        fut = self.loop.create_future()
        self.dialing[peer] = (fut, lookups)
        self.spawn(self._dial(peer, fut))
        return await asyncio.shield(fut)

    async def _dial(self, peer: PeerId, fut: asyncio.Future) -> None:
        try:
            addrs = list(self.peer_addrs.get(peer, ()))  # a copy: the address book may change meanwhile
            if context.NO_DHT_DIAL_LOOKUP.get():
                conn = await self.dial_addrs(peer, addrs)
            elif not addrs and self.runtime is not None and not self.closing:
                addrs = await self._find_in_dht(peer)
                conn = await self.dial_addrs(peer, addrs)
            else:
                try:
                    conn = await self.dial_addrs(peer, addrs)
                except PeerUnreachable:
                    # the peer may have moved (restarted on another port, new network): its
                    # newest signed record in the DHT may know where
                    moved = await self._moved_addrs(peer, addrs)
                    if not moved:
                        raise
                    conn = await self.dial_addrs(peer, moved)
            if not fut.done():
                fut.set_result(conn)
        except BaseException as e:
            if not fut.done():
                fut.set_exception(e if isinstance(e, LatticaError) else PeerUnreachable(str(e)))
                fut.exception()
            if isinstance(e, asyncio.CancelledError):
                raise
        finally:
            if self.dialing.get(peer, (None,))[0] is fut:
                del self.dialing[peer]

    async def _moved_addrs(self, peer: PeerId, tried: list[Multiaddr]) -> list[Multiaddr]:
        """Addresses of ``peer`` in its newest DHT record that were not among ``tried``."""
        if self.runtime is None or self.closing:
            return []
        try:
            found = await self.runtime.dht.find_peer(peer, fresh=True)
        except LatticaError:
            return []
        old = {a.without_peer_id() for a in tried}
        return [a for a in found if a.without_peer_id() not in old]

    async def _find_in_dht(self, peer: PeerId) -> list[Multiaddr]:
        """Dialing by PeerId alone: the addresses in the peer's signed DHT record."""
        try:
            return await self.runtime.dht.find_peer(peer)  # type: ignore[union-attr]
        except LatticaError as e:
            raise PeerUnreachable(f"no address of {peer} is known here or in the DHT ({e})") from e

    async def dial_addrs(self, peer: PeerId, addrs: list[Multiaddr]) -> Connection:
        by_transport: dict[str, list[tuple[Multiaddr, Transport]]] = {}
        relayed: list[tuple[Multiaddr, Transport]] = []
        for a in addrs:
            t = self.transport_for(a)
            if t is None:
                continue
            if a.is_circuit:
                if self._may_relay_to(peer, a):
                    relayed.append((a, t))
            else:
                by_transport.setdefault(t.name, []).append((a, t))
        if not by_transport and not relayed:
            raise PeerUnreachable(f"no dialable address known for {peer}")
        if len(self.all_conns) >= self.node.max_connections:
            raise ConnectionLimit(f"connection limit of {self.node.max_connections} reached")
        # Interleave transports so the first wave races one address of each (TCP against QUIC);
        # further addresses join one by one, every _DIAL_STAGGER seconds or when an attempt fails.
        # Relay circuits come last: one stagger after the direct attempts, unless there are none.
        queues = list(by_transport.values())
        order = [q[i] for i in range(max(map(len, queues), default=0)) for q in queues if i < len(q)] + relayed
        if not queues:
            queues = [relayed]
        attempts = iter(order)
        errors: list[str] = []
        refused = 0
        pending: set[asyncio.Task] = set()
        winner: Connection | None = None

        def start_next() -> None:
            nxt = next(attempts, None)
            if nxt is not None:
                addr, transport = nxt
                self._note_dial(addr)
                task = self.loop.create_task(transport.dial(addr, peer))
                task.addr = addr  # type: ignore[attr-defined]
                pending.add(task)

        for _ in queues:
            start_next()
        try:
            while pending and winner is None:
                done, _ = await asyncio.wait(pending, timeout=_DIAL_STAGGER, return_when=asyncio.FIRST_COMPLETED)
                for task in done:
                    pending.discard(task)
                    if task.exception() is None:
                        winner = task.result()
                        break
                    errors.append(f"{task.addr}: {task.exception()}")  # type: ignore[attr-defined]
                    refused += isinstance(task.exception(), ConnectionRefused)
                if winner is None and (not done or not pending):
                    start_next()
        finally:
            for task in pending:
                task.cancel()
            for task in pending:
                task.add_done_callback(self._close_late_winner)
        if winner is None:
            kind = PeerGone if errors and refused == len(errors) else PeerUnreachable
            raise kind(f"could not reach {peer}: " + "; ".join(errors))
        if self.closing:
            winner.abort("node stopping")
            raise NodeClosed("node stopped while dialing")
        self.adopt(winner)
        return winner

    async def _upgrade(self, conn: Connection, info: PeerInfo) -> None:
        """A relayed connection came up: try the peer's direct addresses in the background (both
        sides do, so a public side is reached by whichever can dial out); on success the direct
        connection becomes the primary one and the relayed one closes once unused."""
        direct = [a for a in info.listen_addrs if not a.is_circuit]
        punch = None
        if conn.direction == "inbound" and self.holepunch is not None and holepunch.PROTOCOL in info.protocols:
            punch = self.spawn(self.holepunch.punch(conn))  # neither side may be dialable: punch
        token = context.NO_DHT_DIAL_LOOKUP.set(True)
        try:
            if direct and not self.closing:
                await self.dial_addrs(conn.remote_peer, direct)
        except LatticaError as e:
            log.debug("no direct path yet", peer=str(conn.remote_peer), reason=str(e))
        finally:
            context.NO_DHT_DIAL_LOOKUP.reset(token)
            if punch is not None:
                await asyncio.wait([punch])
            self.upgrading.discard(conn.remote_peer)
            again = self.info.get(conn)
            if conn.remote_peer in self.upgrade_again and again is not None and not self.closing:
                self.upgrade_again.discard(conn.remote_peer)
                if not conn.is_closed and self.conns.get(conn.remote_peer) is conn:
                    self.upgrading.add(conn.remote_peer)
                    self.spawn(self._upgrade(conn, again))

    def _note_dial(self, addr: Multiaddr) -> None:
        parts = list(addr)
        if len(parts) > 1 and parts[0][0] in ("ip4", "ip6") and parts[1][0] == "udp":
            self.note_contact(parts[0][1])  # QUIC dials leave from the listening socket

    def note_contact(self, ip: str) -> None:
        """A listening socket sent ``ip`` a packet: a cone NAT now lets ``ip`` in (AutoNAT must
        not take a dial-back from it as proof that strangers can reach us)."""
        self.contacted.pop(ip, None)
        self.contacted[ip] = self.loop.time()
        if len(self.contacted) > _MAX_KNOWN_PEERS:
            del self.contacted[next(iter(self.contacted))]

    def _close_late_winner(self, task: asyncio.Task) -> None:
        if not task.cancelled() and task.exception() is None:
            task.result().abort("lost the dial race")

    # -- streams and protocols ------------------------------------------------------------------

    async def open_stream(self, peer: PeerId, protocol: str) -> Stream:
        _check_protocol_name(protocol)
        conn = await self.get_connection(peer)
        info = self.info.get(conn)
        if info is not None and protocol not in info.protocols:
            raise UnsupportedProtocol(f"{peer} does not serve {protocol}")
        return await self.open_stream_on(conn, protocol)

    @staticmethod
    async def open_stream_on(conn: Connection, protocol: str) -> Stream:
        """A stream speaking ``protocol`` on this very connection."""
        stream = await conn.open_stream()
        stream.write(_encode_protocol(protocol))
        return stream

    # -- relays ---------------------------------------------------------------------------------

    def _may_relay_to(self, peer: PeerId, addr: Multiaddr) -> bool:
        """No circuit through the peer itself or through ourselves, none inside another circuit."""
        try:
            _, relay, target = circuit.split_circuit(addr)
        except LatticaError:
            return False
        return relay not in (peer, self.peer_id) and target in (None, peer)

    async def _open_hop(self, relay: PeerId, relay_addrs: list[Multiaddr]) -> tuple[Stream, Connection]:
        self.remember_addrs(relay, [a for a in relay_addrs if not a.is_circuit])
        conn = self.conns.get(relay)
        if conn is None or conn.is_closed or conn.transport == "relay":
            direct = [a for a in self.peer_addrs.get(relay, ()) if not a.is_circuit]
            conn = await self.dial_addrs(relay, direct)
        info = self.info.get(conn)
        if info is None and conn in self.identified:  # a fresh connection: identify is one trip away
            try:
                info = await asyncio.wait_for(asyncio.shield(self.identified[conn]), _PROTOCOL_READ_TIMEOUT)
            except (LatticaError, asyncio.TimeoutError):
                info = None
        if info is not None and circuit.HOP not in info.protocols:
            raise UnsupportedProtocol(f"{relay} is not a relay")
        return await self.open_stream_on(conn, circuit.HOP), conn

    def _splice_addr(self, relay_conn: Connection) -> Multiaddr | None:
        """The relay's TCP listener for spliced sockets (see transports/splice.py): the address of
        a TCP connection we dialed; over QUIC, the TCP address the relay announced on the same IP
        (if that port turns out unreachable, the circuit falls back to in-stream)."""
        if not any(t.name == "tcp" for t in self.transports):
            return None
        if relay_conn.transport == "tcp":
            return relay_conn.remote_addr if relay_conn.direction == "outbound" else None
        if relay_conn.transport != "quic":
            return None
        try:
            ip = relay_conn.remote_addr.host_port()[0]
        except LatticaError:
            return None
        for a in self.peer_addrs.get(relay_conn.remote_peer, ()):
            a = a.without_peer_id()
            if not a.is_circuit and a.protocols()[1:] == ["tcp"]:
                try:
                    if a.host_port()[0] == ip:
                        return a
                except LatticaError:
                    continue
        return None

    async def _dial_spliced(self, relay_tcp: Multiaddr, token: bytes, peer: PeerId, initiator: bool, remote: Multiaddr) -> Connection:
        """A circuit on its own TCP socket to the relay (see transports/splice.py)."""
        tcp = next((t for t in self.transports if t.name == "tcp"), None)
        if tcp is None:
            raise TransportError("no TCP transport to splice a circuit with")
        return await tcp.dial_spliced(relay_tcp, token, peer, initiator=initiator, remote_addr=remote)

    async def _on_stop(self, stream: Stream, conn: Connection) -> None:
        if conn.transport == "relay" or "relay-client" not in self.protected.get(conn.remote_peer, ()):
            log.info("refusing relayed connection: we hold no reservation with this peer", peer=str(conn.remote_peer))
            stream.reset()
            return
        await self.circuit.accept(stream, conn, self._on_inbound)  # type: ignore[union-attr]

    def protect(self, peer: PeerId, why: str) -> None:
        """Keep ``peer``'s connection open while idle (relay reservations, ...)."""
        self.protected.setdefault(peer, set()).add(why)

    def unprotect(self, peer: PeerId, why: str) -> None:
        tags = self.protected.get(peer)
        if tags is not None:
            tags.discard(why)
            if not tags:
                del self.protected[peer]

    def advertised_addrs(self) -> list[Multiaddr]:
        """What we tell peers and the DHT: listen addresses, confirmed public ones, circuits."""
        out = list(self.listen_addrs)
        for a in self.public_addrs + self.relay_addrs:
            if a not in out:
                out.append(a)
        return out

    async def _serve_stream(self, stream: Stream, conn: Connection) -> None:
        try:
            async with asyncio.timeout(_PROTOCOL_READ_TIMEOUT):  # cheaper than wait_for: no extra task
                head = await stream.readexactly(1)
                name = (await stream.readexactly(head[0])).decode()
        except (asyncio.TimeoutError, LatticaError, UnicodeDecodeError) as e:
            log.info("dropping stream: no valid protocol header", peer=str(conn.remote_peer), reason=str(e) or type(e).__name__)
            stream.reset()
            return
        handler = self.handlers.get(name)
        if handler is None:
            log.info("dropping stream: unknown protocol", peer=str(conn.remote_peer), protocol=name[:64])
            stream.reset()
            return
        try:
            await handler(stream, conn)
        except (LatticaError, asyncio.TimeoutError) as e:
            log.info("stream handler failed", peer=str(conn.remote_peer), protocol=name, reason=str(e) or type(e).__name__)
            stream.reset()
        except Exception:
            log.exception("stream handler crashed", peer=str(conn.remote_peer), protocol=name)
            stream.reset()

    # -- identify -------------------------------------------------------------------------------

    async def push_identify(self, conn: Connection) -> None:
        try:
            stream = await conn.open_stream()
            stream.write(_encode_protocol(identify.PROTOCOL))
            write_message(
                stream,
                identify.build(
                    self.keypair.public_key_protobuf(),
                    self.node.agent_version,
                    self.advertised_addrs(),
                    conn.remote_addr,
                    sorted(self.handlers),
                ),
            )
            await stream.close()
        except LatticaError as e:
            log.debug("identify push failed", peer=str(conn.remote_peer), reason=str(e))

    async def _on_identify(self, stream: Stream, conn: Connection) -> None:
        try:
            async with asyncio.timeout(_PROTOCOL_READ_TIMEOUT):
                msg = await read_message(stream, identify.MAX_MESSAGE)
            fields = identify.parse(msg, conn.remote_peer)
        except (LatticaError, asyncio.TimeoutError) as e:
            log.info("closing connection: bad identify", peer=str(conn.remote_peer), reason=str(e) or "timeout")
            conn.abort(f"bad identify: {e}")
            return
        info = PeerInfo(conn.remote_peer, conn.transport, conn.direction, conn.remote_addr, **fields)
        self.info[conn] = info
        self.remember_addrs(conn.remote_peer, info.listen_addrs)
        self.events.identified.emit(info)
        fut = self.identified.get(conn)
        if fut is not None and not fut.done():
            fut.set_result(info)
        if conn.transport == "relay" and self.conns.get(conn.remote_peer) is conn:
            if conn.remote_peer in self.upgrading:
                self.upgrade_again.add(conn.remote_peer)  # new addresses: try them once this try ends
            else:
                self.upgrading.add(conn.remote_peer)  # (again after every identify push: new addresses)
                self.spawn(self._upgrade(conn, info))
        # one message per stream: anything after it is a protocol error; end the stream either way
        try:
            async with asyncio.timeout(_PROTOCOL_READ_TIMEOUT):
                extra = await stream.read(1)
        except asyncio.TimeoutError:
            extra = b"?"
        if extra:
            stream.reset()
        else:
            await stream.close()

    def remember_addrs(self, peer: PeerId, addrs: Iterable[Multiaddr]) -> None:
        """Add dialable addresses of ``peer`` to the (bounded) address book."""
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
        except asyncio.TimeoutError:
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
            out.append(info or PeerInfo(peer, conn.transport, conn.direction, conn.remote_addr))
        return out


_THREADED: weakref.WeakSet[Node] = weakref.WeakSet()  # nodes running on a loop thread of their own


@atexit.register
def _stop_threaded_nodes() -> None:
    """At interpreter exit, stop every node a script started and never stopped: its actors'
    on_stop hooks run and peers see a goodbye instead of a dead connection."""
    for node in list(_THREADED):
        try:
            node.stop()
        except Exception:
            log.exception("error while stopping a node at exit")


class Node:
    """A Lattica node: identity, listeners, connections, on its own event-loop thread.

    Use as a context manager or call :meth:`start` / :meth:`stop`. Sync methods may be called from
    any thread except the node loop; the ``a``-prefixed coroutines may be awaited from any loop.
    """

    def __init__(
        self,
        listen: Iterable[str | Multiaddr] = ("/ip4/127.0.0.1/tcp/0",),
        *,
        key_path: str | os.PathLike[str] | None = None,
        keypair: KeyPair | None = None,
        max_connections: int = 512,
        idle_timeout: float = 300.0,
        dial_timeout: float = 10.0,
        agent_version: str = AGENT_VERSION,
        busy_poll_us: float = DEFAULT_BUSY_POLL_US,
        use_uvloop: bool | None = None,
        transport_options: dict[str, dict[str, Any]] | None = None,
        memory_network: Any = None,
        allow: Iterable[str] = (),
        dht_path: str | os.PathLike[str] | None = None,
        dht: Any = None,
        channel_idle: float = 60.0,
        relay: Any = False,
        relays: Iterable[str | Multiaddr] = (),
        nat: Any = None,
        mdns: bool | None = None,
        labels: dict[str, str] | None = None,
        resources: dict[str, float] | None = None,
        membership: Any = True,
    ) -> None:
        if keypair is not None and key_path is not None:
            raise ValueError("give key_path or keypair, not both")
        self.keypair = keypair or (KeyPair.load_or_create(key_path) if key_path else KeyPair.generate())
        self.peer_id: PeerId = self.keypair.peer_id
        self._listen = [Multiaddr(a) for a in listen]
        self.max_connections = max_connections
        self.idle_timeout = idle_timeout
        self.dial_timeout = dial_timeout
        self.agent_version = agent_version
        self._busy_poll_us = busy_poll_us
        self._use_uvloop = use_uvloop
        self._transport_options = transport_options or {}
        self._memory_network = memory_network
        self._lazy_quic = True
        self.allow = list(allow)  # class-path patterns peers may spawn here (fnmatch)
        if not channel_idle > 0:
            raise ValueError("channel_idle must be > 0 seconds")
        self.channel_idle = channel_idle  # an idle call channel closes after this, freeing its connection
        # relay=True (or a RelayConfig): serve reservations and circuits for private peers
        self.relay_config: RelayConfig | None = (RelayConfig() if relay is True else relay) or None
        self.relays = [Multiaddr(a) for a in relays]  # relays to hold reservations with (else found ones)
        # mDNS on the LAN: None = on when we listen on a non-loopback address
        self.mdns = mdns
        self.labels = dict(labels or {})  # what this node says about itself to placement
        from lattica.placement import RESOURCES

        if resources is not None and (set(resources) - set(RESOURCES) or any(v < 0 for v in resources.values())):
            raise ValueError(f"resources map {list(RESOURCES)} to amounts >= 0")
        self.resources = dict(resources or {})  # offered to placement instead of what is detected

        # membership=True (or a MembershipConfig): join the membership view; False: stay out
        self.membership_config: MembershipConfig | None = (MembershipConfig() if membership is True else membership) or None
        self.nat_config: NatConfig = nat or NatConfig()
        self.dht_config: DhtConfig = dht or DhtConfig()
        if dht_path is not None:
            self.dht_config.persist_path = os.fspath(dht_path)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._host: _Host | None = None
        self._lock = threading.Lock()
        self._starting: asyncio.Future | None = None  # an astart in progress
        self.started_at: float | None = None

    def _make_transports(self) -> list[Transport]:
        from lattica.transports.memory import MemoryTransport
        from lattica.transports.tcp import TcpTransport

        opts = self._transport_options
        memory_opts = dict(opts.get("memory", {}))
        if self._memory_network is not None:
            memory_opts.setdefault("network", self._memory_network)
        self._lazy_quic = True
        return [TcpTransport(self.keypair, **opts.get("tcp", {})), MemoryTransport(self.keypair, **memory_opts)]

    def _make_quic(self) -> Transport:
        from lattica.transports.quic import QuicTransport

        return QuicTransport(self.keypair, **self._transport_options.get("quic", {}))

    # -- lifecycle ------------------------------------------------------------------------------

    def start(self) -> Node:
        """Start the loop thread and listen on every address; returns once listening."""
        with self._lock:
            if self._thread is not None:
                return self
            if self._host is not None or self._starting is not None:
                raise RuntimeError("this node runs on a shared loop (astart); it cannot also start a thread")
            t0 = time.perf_counter()
            loop = new_loop(self._busy_poll_us, self._use_uvloop)
            ready: concurrent.futures.Future[None] = concurrent.futures.Future()
            self._loop = loop
            self._thread = threading.Thread(target=self._run, args=(loop, ready), name=f"lattica-node-{self.peer_id.short()}", daemon=True)
            self._thread.start()
            try:
                ready.result()
            except BaseException:
                self._thread.join()
                self._thread = self._loop = self._host = None
                raise
            self.started_at = time.perf_counter() - t0
            _THREADED.add(self)
            log.info("node started", peer_id=str(self.peer_id), addrs=[str(a) for a in self.addrs])
            return self

    def _run(self, loop: asyncio.AbstractEventLoop, ready: concurrent.futures.Future) -> None:
        asyncio.set_event_loop(loop)

        async def boot() -> None:
            self._host = _Host(self)
            await self._host.start(self._listen)

        try:
            loop.run_until_complete(boot())
        except BaseException as e:
            if self._host is not None:
                loop.run_until_complete(self._host.stop())
            loop.close()
            ready.set_exception(e)
            return
        ready.set_result(None)
        try:
            loop.run_forever()
        finally:
            loop.run_until_complete(loop.shutdown_asyncgens())
            loop.close()

    def stop(self) -> None:
        """Close every connection and listener, then end the loop thread."""
        with self._lock:
            if self._thread is None and self._host is not None:
                raise RuntimeError("this node runs on a shared loop (astart): stop it with `await node.astop()`")
            if self._thread is None or self._loop is None:
                return
            loop, thread, host = self._loop, self._thread, self._host
            if threading.current_thread() is thread:
                raise RuntimeError("Node.stop() cannot be called from the node's own loop")
            try:
                asyncio.run_coroutine_threadsafe(host.stop(), loop).result(10)  # type: ignore[union-attr]
            except Exception:
                log.exception("error while stopping the node")
            loop.call_soon_threadsafe(loop.stop)
            thread.join(10)
            self._thread = self._loop = self._host = None

    async def astart(self) -> Node:
        """Start on the running event loop instead of a loop thread of its own: for simulations
        (many nodes on one loop over the in-memory transport) and for embedding in an asyncio
        program. Blocking methods then cannot be used from that loop; use the ``a``-prefixed ones."""
        with self._lock:  # never held across an await: a second astart must not block the loop
            starting = self._starting
            if starting is None and (self._host is not None or self._thread is not None):
                return self
            if starting is None:
                self._loop = asyncio.get_running_loop()
                self._starting = starting = self._loop.create_future()
                owner = True
            else:
                owner = False
        if not owner:
            await asyncio.shield(starting)  # the first astart's outcome (raises its error)
            return self
        t0 = time.perf_counter()
        host = _Host(self)
        outcome: BaseException | None = NodeClosed("the node did not start")
        try:
            await host.start(self._listen)
            self._host = host
            self.started_at = time.perf_counter() - t0
            outcome = None
        except BaseException as e:
            outcome = e if not isinstance(e, asyncio.CancelledError) else NodeClosed("starting the node was cancelled")
            self._loop = None
            try:
                await host.stop()
            except Exception:
                log.exception("cleanup after a failed astart failed")
            raise
        finally:
            self._starting = None
            if outcome is None:
                starting.set_result(None)
            else:
                starting.set_exception(outcome)
                starting.exception()
        return self

    async def astop(self) -> None:
        """Stop a node started with :meth:`astart` (awaited on that same loop)."""
        if self._thread is not None:
            raise RuntimeError("this node runs its own loop thread: stop it with stop()")
        if self._starting is not None:
            await asyncio.shield(self._starting)
        if self._host is not None and asyncio.get_running_loop() is not self._loop:
            raise RuntimeError("astop() must be awaited on the loop the node was started on")
        host, self._host = self._host, None
        if host is not None:
            await host.stop()
        self._loop = None

    def __enter__(self) -> Node:
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()

    @property
    def running(self) -> bool:
        return self._host is not None

    @property
    def host(self) -> _Host | None:
        """The running host (connections, runtime, services), None while stopped: for Lattica's
        own modules and tools (``lattica.dht``, the benchmarks, ``doctor``), not for applications."""
        return self._host

    # -- bridging to the loop -------------------------------------------------------------------

    def _submit(self, fn: Callable[[_Host], Coroutine[Any, Any, T]]) -> concurrent.futures.Future[T]:
        loop, host = self._loop, self._host
        if loop is None or host is None:
            raise NodeClosed("the node is not running; call start() or use it as a context manager")
        return asyncio.run_coroutine_threadsafe(fn(host), loop)

    def _call(self, fn: Callable[[_Host], Coroutine[Any, Any, T]]) -> T:
        host = self._host
        if host is not None and threading.get_ident() == host.thread_id:
            raise RuntimeError("blocking Node methods cannot run on the node loop; await the a-prefixed version")
        return self._submit(fn).result()

    async def _acall(self, fn: Callable[[_Host], Coroutine[Any, Any, T]]) -> T:
        try:
            running = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if running is not None and running is self._loop:
            if self._host is None:
                raise NodeClosed("the node is not running")
            return await fn(self._host)
        return await asyncio.wrap_future(self._submit(fn))

    # -- public API -----------------------------------------------------------------------------

    @property
    def addrs(self) -> list[Multiaddr]:
        """Listen addresses, each ending in ``/p2p/<our PeerId>`` (dialable as they are)."""
        host = self._host
        if host is None:
            return []
        return [a.with_peer_id(self.peer_id) for a in host.listen_addrs]

    def _parse_target(self, target: str | Multiaddr | Iterable[str | Multiaddr]) -> list[Multiaddr]:
        if isinstance(target, (str, Multiaddr)):
            return [Multiaddr(target)]
        return [Multiaddr(a) for a in target]

    def connect(self, addr: str | Multiaddr | Iterable[str | Multiaddr], timeout: float | None = None) -> PeerInfo:
        """Dial the peer at ``addr`` (one or several multiaddrs ending in its /p2p/ id), authenticate
        and identify it; return what it told us. Reuses an existing connection."""
        addrs = self._parse_target(addr)
        return self._call(lambda h: h.connect(addrs, None, timeout or self.dial_timeout))

    async def aconnect(self, addr: str | Multiaddr | Iterable[str | Multiaddr], timeout: float | None = None) -> PeerInfo:
        addrs = self._parse_target(addr)
        return await self._acall(lambda h: h.connect(addrs, None, timeout or self.dial_timeout))

    def ping(self, peer: PeerId | str, count: int = 1, timeout: float | None = None) -> float:
        """Median round-trip time to ``peer`` in seconds over ``count`` pings on one stream.
        Raises Timeout if they take longer than ``timeout`` (default 10 s + 10 ms per ping)."""
        rtts = self.ping_many(peer, count, timeout)
        return sorted(rtts)[len(rtts) // 2]

    def ping_many(self, peer: PeerId | str, count: int, timeout: float | None = None) -> list[float]:
        """Every round-trip time (seconds) of ``count`` sequential pings on one stream."""
        pid = PeerId.from_string(peer) if isinstance(peer, str) else peer
        limit = timeout if timeout is not None else 10.0 + 0.01 * count
        return self._call(lambda h: h.ping(pid, count, limit))

    async def aping(self, peer: PeerId | str, count: int = 1, timeout: float | None = None) -> float:
        pid = PeerId.from_string(peer) if isinstance(peer, str) else peer
        limit = timeout if timeout is not None else 10.0 + 0.01 * count
        rtts = await self._acall(lambda h: h.ping(pid, count, limit))
        return sorted(rtts)[len(rtts) // 2]

    def nat_status(self, refresh: bool = False) -> NatStatus:
        """Whether peers can dial us (AutoNAT), our NAT's mapping type, observed addresses and
        relay reservations. ``refresh``: run an AutoNAT round now instead of reporting the last."""
        return self._call(lambda h: h.nat_status(refresh))

    async def anat_status(self, refresh: bool = False) -> NatStatus:
        return await self._acall(lambda h: h.nat_status(refresh))

    def nodes(self) -> list[dict[str, Any]]:
        """The live membership view, this node first: one dict per member with ``peer_id``,
        ``state`` (alive, suspect, dead, left), ``incarnation``, ``cpu``, ``memory``, ``gpus``,
        ``labels`` and ``load``. Dead and departed members stay listed for a minute."""

        async def get(h: _Host) -> list[dict[str, Any]]:
            return h.membership.nodes() if h.membership is not None else []

        return self._call(get)

    def peers(self) -> list[PeerInfo]:
        """Connected peers (one entry per peer, its primary connection)."""

        async def get(h: _Host) -> list[PeerInfo]:
            return h.peers()

        return self._call(get)

    def disconnect(self, peer: PeerId | str) -> None:
        """Close every connection to ``peer``."""
        pid = PeerId.from_string(peer) if isinstance(peer, str) else peer

        async def close(h: _Host) -> None:
            for conn in [c for c in h.all_conns if c.remote_peer == pid]:
                await conn.close()

        self._call(close)

    # -- for protocols built on the node (actors, DHT, ...) -------------------------------------

    def set_stream_handler(self, protocol: str, handler: StreamProtocolHandler) -> None:
        """Serve ``protocol``: ``await handler(stream, connection)`` runs on the node loop for each
        inbound stream that names it. Call before connecting, so identify advertises it."""
        _check_protocol_name(protocol)

        async def put(h: _Host) -> None:
            h.handlers[protocol] = handler

        self._call(put)

    async def aopen_stream(self, peer: PeerId, protocol: str) -> Stream:
        """Open a stream to ``peer`` speaking ``protocol`` (must be awaited on the node loop)."""
        if self._host is None or asyncio.get_running_loop() is not self._loop:
            raise RuntimeError("streams belong to the node loop; open them from coroutines running there")
        return await self._host.open_stream(peer, protocol)

    def run(self, coro: Coroutine[Any, Any, T], timeout: float | None = None) -> T:
        """Run ``coro`` on the node loop from another thread and return its result; raises
        Timeout if it takes longer than ``timeout`` seconds (it is cancelled then)."""

        async def bounded(h: _Host) -> T:
            try:
                return await asyncio.wait_for(coro, timeout)
            except asyncio.TimeoutError:
                raise Timeout(f"operation did not finish within {timeout} s") from None

        return self._call(bounded)

