"""Reaching peers: dial by PeerId (known addresses, else the peer's signed DHT record, again if
it moved), race addresses across transports, upgrade relayed connections to direct ones (with
hole punching), and open hops and spliced sockets for relay circuits."""

from __future__ import annotations

import asyncio
import weakref
from typing import TYPE_CHECKING, Protocol, cast

from lattica import _context as context
from lattica import _identify as identify
from lattica import _ping as ping
from lattica._budget import Buckets
from lattica._identify import PeerInfo
from lattica._identity import PeerId
from lattica._interfaces import host_key, ip_of, is_loopback_ip, on_local_network
from lattica._multiaddr import Multiaddr
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
from lattica.logging import get_logger
from lattica.nat import _dcutr_wire as dcutr
from lattica.nat import _holepunch as holepunch
from lattica.transports import circuit, circuit_v2
from lattica.transports.base import Connection, Stream, Transport

if TYPE_CHECKING:
    from lattica._host.host import Host

__all__ = ["Puncher", "Dialer", "PeerRouting", "DIAL_STAGGER", "PROTOCOL_READ_TIMEOUT"]

log = get_logger("lattica.node")

DIAL_STAGGER = 0.25  # happy-eyeballs delay before starting the next address
PROTOCOL_READ_TIMEOUT = 10.0
_MAX_CONTACTED = 4096
# Trying a relayed peer's direct addresses dials whatever addresses it announces, and it may
# announce a third party's (a reflection: every identify push of a stranger once started dials to
# all 64 of its addresses). So: at most this many addresses per try, one try per peer every 10 s
# (60 s when its addresses did not change), and dials to one IP (an IPv6 /64) a burst of 8,
# then one per 10 s, whoever announced it.
_UPGRADE_ADDRS = 8
_UPGRADE_EVERY = (10.0, 60.0)
_UPGRADE_DIALS_PER_IP = (0.1, 8.0)
# addresses another peer gave us (a lookup's answer, a swarm) may all name a third party: dials
# to one destination IP for them, per second and at once (loopback is exempt: a machine's own)
_HINT_DIALS_PER_IP = (0.2, 8.0)
_HINT_ADDRS = 2  # hinted addresses of one peer tried per dial
# what a libp2p relay's limited circuit carries: who we are, and what sets up a direct path
LIMITED_PROTOCOLS = frozenset(
    {
        identify.PROTOCOL,
        identify.LIBP2P_PROTOCOL,
        identify.LIBP2P_PUSH_PROTOCOL,
        ping.PROTOCOL,
        holepunch.PROTOCOL,
        dcutr.PROTOCOL,
    }
)
LIMITED_WAIT = 10.0  # s a stream waits for a direct path when a libp2p relay's limited circuit is all there is


class PeerRouting(Protocol):
    """Where a peer listens, from outside the address book (the DHT's signed peer records)."""

    async def find_peer(self, peer: PeerId, fresh: bool = False) -> list[Multiaddr]: ...


class Puncher(Protocol):
    """What makes a relayed peer direct (the hole-punch service)."""

    async def punch(self, conn: Connection) -> bool:
        """Reach ``conn``'s peer directly; True once a direct connection is the primary one."""

    async def punch_tcp(self, conn: Connection) -> bool:
        """Add a TCP path beside a direct QUIC connection; True once it is the primary one."""


class Dialer:
    """One dial per peer at a time; its callers share the result."""

    def __init__(self, host: Host) -> None:
        self.host = host
        self.routing: PeerRouting | None = None  # set by the DHT service when it starts
        self.puncher: Puncher | None = None  # set by the hole-punch service when it starts
        self.dialing: dict[PeerId, tuple[asyncio.Future[Connection], bool]] = {}  # -> (dial, DHT lookups allowed)
        self.upgrading: set[PeerId] = set()  # peers we are trying to reach directly (relayed now)
        self.upgrade_again: set[PeerId] = set()  # new addresses came while upgrading: try again after
        self.tcp_tried: weakref.WeakSet[Connection] = weakref.WeakSet()  # QUIC connections we asked to add TCP over
        self.upgrade_tried: dict[
            PeerId, tuple[frozenset, float]
        ] = {}  # relayed peer -> (direct addresses, when) of its last try
        self.upgrade_later: set[PeerId] = set()  # a try is due when its interval has passed
        self.upgrade_dials = Buckets(*_UPGRADE_DIALS_PER_IP, _MAX_CONTACTED, clock=host.loop.time)
        self.hint_dials = Buckets(*_HINT_DIALS_PER_IP, _MAX_CONTACTED, clock=host.loop.time)
        self.contacted: dict[
            tuple[str, str], float
        ] = {}  # (transport, IP) -> when a listening socket last sent it a packet (opens cone filters)

    async def connect(self, addrs: list[Multiaddr], peer: PeerId | None, timeout: float) -> PeerInfo:
        host = self.host
        if peer is None:
            ids = {a.peer_id for a in addrs}
            if len(ids) != 1 or None in ids:
                raise MultiaddrError("connect needs addresses ending in /p2p/<PeerId> (or a peer_id)")
            peer = cast(PeerId, ids.pop())  # (the one id, not None: checked above)
        if peer == host.peer_id:
            raise PeerUnreachable("cannot connect to ourselves")
        host.remember_addrs(peer, addrs)
        deadline = host.loop.time() + timeout
        for attempt in range(2):
            try:
                left = max(deadline - host.loop.time(), 0.0)
                conn = await asyncio.wait_for(self.get_connection(peer, limited=True), left)
                identified = host.identified.get(conn)
                if identified is None:  # the connection we had is closing (the peer just left)
                    raise ConnectionClosed(f"connection to {peer} closed before identify")
                return await asyncio.wait_for(asyncio.shield(identified), max(deadline - host.loop.time(), 0.0))
            except TimeoutError:
                raise Timeout(f"connecting to {peer} took longer than {timeout} s") from None
            except ConnectionClosed:
                if attempt or host.closing:
                    raise
                # the old connection was on its way out: dial once more, a fresh one
                await asyncio.sleep(0)
        raise AssertionError("unreachable")

    async def get_connection(self, peer: PeerId, limited: bool = False) -> Connection:
        """The live connection to ``peer``, dialing its known addresses if there is none. A
        libp2p relay's limited circuit is taken only if ``limited`` (it carries what sets up a
        direct path): otherwise the direct path its upgrade makes is awaited."""
        conn = await self._any_connection(peer)
        if conn.relay_limit is None or limited:
            return conn
        return await self._unlimited(peer, conn)

    async def _unlimited(self, peer: PeerId, conn: Connection) -> Connection:
        """A connection to ``peer`` no relay limits, while ``conn``, a limited circuit, is the
        best one: the direct one its upgrade makes, or a circuit through another relay (dialed
        now, if the peer has one); PeerUnreachable if none comes within ``LIMITED_WAIT`` s."""
        loop, host = self.host.loop, self.host
        others = self._circuits_elsewhere(peer, conn)
        dial = host.spawn(self.dial_addrs(peer, others)) if others else None
        if dial is not None:
            dial.add_done_callback(lambda t: t.cancelled() or t.exception())  # (its failure: the error below)
        deadline = loop.time() + LIMITED_WAIT
        try:
            while loop.time() < deadline and not host.closing:
                best = self._unlimited_conn(peer)
                if best is not None:
                    return best
                await asyncio.sleep(0.05)
        finally:
            if dial is not None and not dial.done():
                dial.cancel()
        seconds, size = conn.relay_limit or (0, 0)
        raise PeerUnreachable(
            f"{peer} is reachable only through a libp2p relay's limited circuit ({seconds} s, {size} bytes), which "
            f"carries what sets up a direct path, not calls, and no direct path came within {LIMITED_WAIT} s: "
            "give the peer a relay that carries traffic (a Lattica relay) or a reachable address (docs/nat.md)"
        )

    def _unlimited_conn(self, peer: PeerId) -> Connection | None:
        """The peer's primary connection if no relay limits it, else another such it identified
        on (which the host then made its primary one), if any."""
        host = self.host
        conns = [host.conns.get(peer), *(c for c in host.conns_of.get(peer, ()) if c in host.info)]
        return next(
            (c for c in conns if c is not None and c.relay_limit is None and not c.is_closed and not c.going_away),
            None,
        )

    def _circuits_elsewhere(self, peer: PeerId, limited: Connection) -> list[Multiaddr]:
        """The peer's circuit addresses through relays other than ``limited``'s."""
        relay = limited.carrier.remote_peer if limited.carrier is not None else None
        out = []
        for a in self.host.peer_addrs.get(peer, ()):
            if not a.is_circuit:
                continue
            try:
                through = circuit.split_circuit(a)[1]
            except LatticaError:
                continue
            if through != relay:
                out.append(a)
        return out

    async def _any_connection(self, peer: PeerId) -> Connection:
        conn = self.host.conns.get(peer)
        if conn is not None and not conn.is_closed and not conn.going_away:
            return conn
        lookups = not context.NO_DHT_DIAL_LOOKUP.get()
        entry = self.dialing.get(peer)
        if entry is not None:
            if entry[1] or not lookups:
                return await asyncio.shield(entry[0])
            try:  # a DHT request's dial (known addresses only) is under way: if it fails, we look
                return await asyncio.shield(entry[0])
            except PeerUnreachable:
                conn = self.host.conns.get(peer)
                if conn is not None and not conn.is_closed:
                    return conn
                entry = self.dialing.get(peer)
                if entry is not None and entry[1]:
                    return await asyncio.shield(entry[0])
        fut = self.host.loop.create_future()
        self.dialing[peer] = (fut, lookups)
        self.host.spawn(self._dial(peer, fut))
        return await asyncio.shield(fut)

    def hinted(self, peer: PeerId, addrs: list[Multiaddr] | None = None) -> list[Multiaddr]:
        """What to dial of the addresses others gave for ``peer`` (``addrs``, else the address
        book's hints): at most _HINT_ADDRS, each to a destination whose budget allows it (a
        stranger's answer naming one victim 320 times costs the victim 8 dials, then one per 5 s).
        PeerUnreachable when the budget allows none."""
        given = addrs if addrs is not None else self.host.hint_addrs.get(peer, [])
        out: list[Multiaddr] = []
        for a in given:
            if len(out) == _HINT_ADDRS:
                break
            ip = ip_of(a)
            if ip is None or is_loopback_ip(ip) or self.hint_dials.take(host_key(ip)):
                out.append(a)
        if given and not out:
            raise PeerUnreachable(
                f"{peer} is known only by addresses other peers gave, and their destination was dialed for such "
                "addresses too often lately (a budget per IP address: a peer's answers cannot aim our dials)"
            )
        return out

    async def _dial(self, peer: PeerId, fut: asyncio.Future) -> None:
        try:
            addrs = list(self.host.peer_addrs.get(peer, ()))  # a copy: the address book may change meanwhile
            if not addrs and peer in self.host.hint_addrs:
                addrs = self.hinted(peer)
            if context.NO_DHT_DIAL_LOOKUP.get():
                conn = await self.dial_addrs(peer, addrs)
            elif not addrs and self.routing is not None and not self.host.closing:
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

    def inbound(self, conn: Connection) -> None:
        """A peer connected to us while we were dialing it: the dial's waiters take this
        connection now (the dial itself may still finish; the better connection stays)."""
        entry = self.dialing.pop(conn.remote_peer, None)
        if entry is not None and not entry[0].done():
            entry[0].set_result(conn)  # and forgotten: once this connection closes, a new dial starts

    async def _moved_addrs(self, peer: PeerId, tried: list[Multiaddr]) -> list[Multiaddr]:
        """Addresses of ``peer`` in its newest DHT record that were not among ``tried``."""
        if self.routing is None or self.host.closing:
            return []
        try:
            found = await self.routing.find_peer(peer, fresh=True)
        except LatticaError:
            return []
        old = {a.without_peer_id() for a in tried}
        return [a for a in found if a.without_peer_id() not in old]

    async def _find_in_dht(self, peer: PeerId) -> list[Multiaddr]:
        """Dialing by PeerId alone: the addresses in the peer's signed DHT record."""
        try:
            return await self.routing.find_peer(peer)  # type: ignore[union-attr]
        except LatticaError as e:
            raise PeerUnreachable(f"no address of {peer} is known here or in the DHT ({e})") from e

    async def dial_addrs(self, peer: PeerId, addrs: list[Multiaddr]) -> Connection:
        """Dial ``peer`` at ``addrs`` only, racing them; the winner is adopted."""
        host = self.host
        by_transport: dict[str, list[tuple[Multiaddr, Transport]]] = {}
        elsewhere: dict[str, list[tuple[Multiaddr, Transport]]] = {}  # private addresses not on our networks
        relayed: list[tuple[Multiaddr, Transport]] = []
        for a in addrs:
            t = host.transport_for(a)
            if t is None:
                continue
            if a.is_circuit:
                if self._may_relay_to(peer, a):
                    relayed.append((a, t))
            else:
                (by_transport if on_local_network(a) else elsewhere).setdefault(t.name, []).append((a, t))
        if not by_transport and not relayed and not elsewhere:
            raise PeerUnreachable(f"no dialable address known for {peer}")
        if len(host.all_conns) >= host.max_connections:
            # as for an inbound newcomer: an unidentified or idle stranger's connection makes room
            # (strangers' connections, going away or not, must not keep us from reaching anyone)
            victim = host.connections.evictable()
            if victim is None:
                raise ConnectionLimit(f"connection limit of {host.max_connections} reached")
            log.info("evicting a connection to dial out: limit reached", peer=str(victim.remote_peer))
            victim.abort("evicted: connection limit reached (unidentified or idle stranger)")

        # Interleave transports so the first wave races one address of each (TCP against QUIC);
        # further addresses join one by one, every DIAL_STAGGER seconds or when an attempt fails.
        # The first relay circuit joins right after the first wave (a peer with circuits may well
        # be unreachable directly: it should not wait for every unproven address); the other
        # circuits after the direct attempts, and private addresses on networks we are not on
        # (the peer's LAN behind its NAT: black-holed) last.
        def interleave(queues: list[list[tuple[Multiaddr, Transport]]]) -> list[tuple[Multiaddr, Transport]]:
            return [q[i] for i in range(max(map(len, queues), default=0)) for q in queues if i < len(q)]

        direct = interleave(list(by_transport.values()))
        wave = len(by_transport)
        order = direct[:wave] + relayed[:1] + direct[wave:] + relayed[1:] + interleave(list(elsewhere.values()))
        first_wave = len(by_transport) or (1 if relayed else len(elsewhere))
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
                task = host.loop.create_task(transport.dial(addr, peer))
                task.addr = addr  # type: ignore[attr-defined]
                task.addr_transport = transport.name  # type: ignore[attr-defined]
                pending.add(task)

        for _ in range(first_wave):
            start_next()
        try:
            while pending and winner is None:
                done, _ = await asyncio.wait(pending, timeout=DIAL_STAGGER, return_when=asyncio.FIRST_COMPLETED)
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
                # a TCP dial under way when QUIC won goes on: TCP is the fast path here, and a
                # late TCP connection becomes the primary one (lattica/_host/connections.py)
                if not (winner is not None and winner.transport == "quic" and task.addr_transport == "tcp"):  # type: ignore[attr-defined]
                    task.cancel()
                task.add_done_callback(self._late_winner)
        if winner is None:
            kind = PeerGone if errors and refused == len(errors) else PeerUnreachable
            raise kind(f"could not reach {peer}: " + "; ".join(errors))
        if host.closing:
            winner.abort("node stopping")
            raise NodeClosed("node stopped while dialing")
        host.adopt(winner)
        return winner

    def _late_winner(self, task: asyncio.Task) -> None:
        """A dial that completed after another won the race: the peer may have taken this
        connection as its primary already (its end of the handshake finished first) and put
        calls on it, so it is kept as a spare that closes once unused, never aborted (a TCP one
        that finished after QUIC won becomes the primary one instead)."""
        if task.cancelled() or task.exception() is not None:
            return
        conn = task.result()
        if self.host.closing:
            conn.abort("node stopping")
        else:
            self.host.adopt(conn, spare=True)

    # -- relayed -> direct ----------------------------------------------------------------------

    def identified(self, conn: Connection, info: PeerInfo) -> None:
        """A peer (re)told us its addresses: if we reach it only through a relay, try them; if
        we dialed it over QUIC and it listens on TCP too, try to add a TCP path (the fast one)."""
        host = self.host
        if host.conns.get(conn.remote_peer) is not conn:
            return
        if conn.transport == "relay":
            if conn.remote_peer in self.upgrading:
                self.upgrade_again.add(conn.remote_peer)  # new addresses: try them once this try ends
            else:
                self._try_upgrade(conn)
        elif (
            conn.transport == "quic"
            and conn.direction == "outbound"  # (one side asks: the one that dialed)
            and conn not in self.tcp_tried
            and self.puncher is not None
            and holepunch.PROTOCOL in info.protocols
            and any(a.protocols()[1:2] == ["tcp"] and not a.is_circuit for a in info.listen_addrs)
        ):
            self.tcp_tried.add(conn)
            host.spawn(self.puncher.punch_tcp(conn))

    def _try_upgrade(self, conn: Connection) -> None:
        """Start trying a relayed peer's direct addresses (its latest identify's), or schedule
        the try for when the peer's interval has passed (``_UPGRADE_EVERY``)."""
        host, peer = self.host, conn.remote_peer
        info = host.info.get(conn)
        if info is None or conn.is_closed or host.closing or host.conns.get(peer) is not conn or peer in self.upgrading:
            return
        addrs = frozenset(a for a in info.listen_addrs if not a.is_circuit)
        last = self.upgrade_tried.get(peer)
        now = host.loop.time()
        wait = 0.0 if last is None else last[1] + _UPGRADE_EVERY[last[0] == addrs] - now
        if wait > 0:
            if peer not in self.upgrade_later:
                self.upgrade_later.add(peer)
                host.loop.call_later(wait, self._upgrade_due, conn)
            return
        self.upgrade_tried.pop(peer, None)
        self.upgrade_tried[peer] = (addrs, now)
        if len(self.upgrade_tried) > _MAX_CONTACTED:
            self.upgrade_tried.pop(next(iter(self.upgrade_tried)))
        self.upgrading.add(peer)
        host.spawn(self._upgrade(conn, info))

    def _upgrade_due(self, conn: Connection) -> None:
        self.upgrade_later.discard(conn.remote_peer)
        self._try_upgrade(conn)

    def _upgrade_addrs(self, info: PeerInfo) -> list[Multiaddr]:
        """The direct addresses of ``info`` to dial now: at most ``_UPGRADE_ADDRS``, each to
        an IP whose dial budget allows it."""
        out: list[Multiaddr] = []
        for a in info.listen_addrs:
            if len(out) == _UPGRADE_ADDRS:
                break
            if a.is_circuit:
                continue
            ip = ip_of(a)
            if ip is None or self.upgrade_dials.take(host_key(ip)):
                out.append(a)
        return out

    async def _upgrade(self, conn: Connection, info: PeerInfo) -> None:
        """A relayed connection came up: try the peer's direct addresses in the background (both
        sides do, so a public side is reached by whichever can dial out); on success the direct
        connection becomes the primary one and the relayed one closes once unused."""
        host = self.host
        direct = self._upgrade_addrs(info)
        if host.nat is not None:
            host.spawn(host.nat.learn_mapping())  # a hole punch may follow: both ends need it
        punch = None
        puncher = self.puncher
        punches = holepunch.PROTOCOL in info.protocols or dcutr.PROTOCOL in info.protocols
        if conn.direction == "inbound" and puncher is not None and punches:
            punch = host.spawn(puncher.punch(conn))  # neither side may be dialable: punch
        token = context.NO_DHT_DIAL_LOOKUP.set(True)
        try:
            if direct and not host.closing:
                await self.dial_addrs(conn.remote_peer, direct)
        except LatticaError as e:
            log.debug("no direct path yet", peer=str(conn.remote_peer), reason=str(e))
        finally:
            context.NO_DHT_DIAL_LOOKUP.reset(token)
            if punch is not None:
                await asyncio.wait([punch])
            self.upgrading.discard(conn.remote_peer)
            if conn.remote_peer in self.upgrade_again:
                self.upgrade_again.discard(conn.remote_peer)
                self._try_upgrade(conn)

    def _note_dial(self, addr: Multiaddr) -> None:
        parts = list(addr)
        if len(parts) > 1 and parts[0][0] in ("ip4", "ip6") and parts[1][0] == "udp":
            ip = cast(str, parts[0][1])  # (an ip4/ip6 part has a value)
            self.note_contact(ip, "quic")  # QUIC dials leave from the listening socket

    def note_contact(self, ip: str, transport: str) -> None:
        """``transport``'s listening socket sent ``ip`` a packet: a cone NAT now lets ``ip`` in on
        that port (AutoNAT must not take a dial-back from it there as proof that strangers can
        reach us; outbound TCP leaves from other ports, so QUIC contacts say nothing of TCP)."""
        key = (transport, ip)
        self.contacted.pop(key, None)
        self.contacted[key] = self.host.loop.time()
        if len(self.contacted) > _MAX_CONTACTED:
            del self.contacted[next(iter(self.contacted))]

    # -- relay circuits -------------------------------------------------------------------------

    def _may_relay_to(self, peer: PeerId, addr: Multiaddr) -> bool:
        """No circuit through the peer itself or through ourselves, none inside another circuit."""
        try:
            _, relay, target = circuit.split_circuit(addr)
        except LatticaError:
            return False
        return relay not in (peer, self.host.peer_id) and target in (None, peer)

    async def open_hop(self, relay: PeerId, relay_addrs: list[Multiaddr]) -> tuple[Stream, Connection, bool]:
        """A hop stream to ``relay`` (over a direct connection, dialed if needed), the connection,
        and whether the stream speaks libp2p's circuit relay v2 (a libp2p relay) or ours."""
        host = self.host
        host.remember_addrs(relay, [a for a in relay_addrs if not a.is_circuit])
        conn = host.conns.get(relay)
        if conn is None or conn.is_closed or conn.transport == "relay":
            direct = [a for a in host.peer_addrs.get(relay, ()) if not a.is_circuit]
            conn = await self.dial_addrs(relay, direct)
        info = host.info.get(conn)
        if info is None and conn in host.identified:  # a fresh connection: identify is one trip away
            try:
                info = await asyncio.wait_for(asyncio.shield(host.identified[conn]), PROTOCOL_READ_TIMEOUT)
            except (TimeoutError, LatticaError):
                info = None
        protocols = info.protocols if info is not None else ()
        libp2p = circuit.HOP not in protocols and (circuit_v2.HOP in protocols or (info is None and conn.libp2p))
        if info is not None and not libp2p and circuit.HOP not in protocols:
            raise UnsupportedProtocol(f"{relay} is not a relay")
        return await host.open_stream_on(conn, circuit_v2.HOP if libp2p else circuit.HOP), conn, libp2p

    def splice_addr(self, relay_conn: Connection) -> Multiaddr | None:
        """The relay's TCP listener for spliced sockets (see transports/splice.py): the address of
        a TCP connection we dialed; over QUIC, the TCP address the relay announced on the same IP
        (if that port turns out unreachable, the circuit falls back to in-stream)."""
        if self.host.transport_set.named("tcp") is None:
            return None
        if relay_conn.transport == "tcp":
            return relay_conn.remote_addr if relay_conn.direction == "outbound" else None
        if relay_conn.transport != "quic":
            return None
        try:
            ip = relay_conn.remote_addr.host_port()[0]
        except LatticaError:
            return None
        for a in self.host.peer_addrs.get(relay_conn.remote_peer, ()):
            a = a.without_peer_id()
            if not a.is_circuit and a.protocols()[1:] == ["tcp"]:
                try:
                    if a.host_port()[0] == ip:
                        return a
                except LatticaError:
                    continue
        return None

    async def dial_spliced(
        self, relay_tcp: Multiaddr, token: bytes, peer: PeerId, initiator: bool, remote: Multiaddr
    ) -> Connection:
        """A circuit on its own TCP socket to the relay (see transports/splice.py)."""
        tcp = self.host.transport_set.named("tcp")
        if tcp is None:
            raise TransportError("no TCP transport to splice a circuit with")
        return await tcp.dial_spliced(relay_tcp, token, peer, initiator=initiator, remote_addr=remote)
