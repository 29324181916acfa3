"""The connection table of one node: which connection each peer's new streams use, every live
connection by peer, what identify told us on each, idle close and the peers kept connected."""

from __future__ import annotations

import asyncio
from typing import Any, Callable, Coroutine

from lattica.errors import ConnectionClosed
from lattica.hostview import HostEvents
from lattica.identify import PeerInfo
from lattica.identity import PeerId
from lattica.logging import get_logger
from lattica.transports.base import PROBE_TIMEOUT, Connection, Stream

__all__ = ["Connections", "LINGER", "MAX_CONNS_PER_PEER"]

log = get_logger("lattica.node")

LINGER = 2.0  # seconds a duplicate connection stays up for streams already on it
MAX_CONNS_PER_PEER = 4
EVICT_MIN_AGE = 2.0  # seconds an unidentified connection is given before a newcomer may evict it


_TCP_AND_QUIC = {"tcp", "quic"}
_PREFERENCE = {"tcp": 0, "quic": 1, "relay": 2}  # which path a peer's primary connection should be


class Connections:
    """Adopts authenticated connections and picks each peer's primary one (direct beats relayed;
    of two simultaneous dials both ends keep the one dialed by the smaller PeerId), forgets them
    when they close, and closes the idle ones nobody protects."""

    def __init__(
        self,
        peer_id: PeerId,
        loop: asyncio.AbstractEventLoop,
        events: HostEvents,
        spawn: Callable[[Coroutine[Any, Any, Any]], asyncio.Task],
        serve: Callable[[Stream, Connection], Coroutine[Any, Any, None]],
        path_changed: Callable[[PeerId], None],
    ) -> None:
        self.peer_id = peer_id
        self.loop = loop
        self.events = events
        self.spawn = spawn
        self._serve = serve  # serves one inbound stream of a connection
        self._path_changed = path_changed  # a peer's primary connection got better (relayed to direct, QUIC to TCP)
        self.conns: dict[PeerId, Connection] = {}
        self.all_conns: set[Connection] = set()
        self.conns_of: dict[PeerId, set[Connection]] = {}  # every live connection, by peer
        self.info: dict[Connection, PeerInfo] = {}
        self.identified: dict[Connection, asyncio.Future[PeerInfo]] = {}
        self.idle_since: dict[Connection, float] = {}
        self.protected: dict[PeerId, set[str]] = {}  # peers whose idle connections stay open, and why

    def add(self, conn: Connection, spare: bool = False) -> None:
        """Start serving a new authenticated connection and make it the peer's primary one; a
        ``spare`` (a dial race's late winner, which the peer may already use) is served but stays
        second to a live primary, and is closed gracefully after the linger period."""
        self.all_conns.add(conn)
        self.conns_of.setdefault(conn.remote_peer, set()).add(conn)
        self.idle_since[conn] = self.loop.time()
        self.identified[conn] = self.loop.create_future()
        conn.add_close_callback(self._on_closed)
        conn.set_stream_handler(lambda s: self.spawn(self._serve(s, conn)))
        peer = conn.remote_peer
        existing = self.conns.get(peer)
        if existing is None or existing.is_closed:
            self.conns[peer] = conn
        elif {conn.transport, existing.transport} == _TCP_AND_QUIC:
            # Two direct paths (a dial race's two winners, a punch that got through on both): TCP
            # is the fast one here (QUIC in Python carries a fraction of it), so both ends keep
            # TCP, whichever came first; the QUIC one lingers for streams already on it.
            tcp, quic = (conn, existing) if conn.transport == "tcp" else (existing, conn)
            self.conns[peer] = tcp
            self.loop.call_later(LINGER, self._close_if_unused, quic)
            if tcp is conn:
                self._path_changed(peer)
        elif spare:
            self.loop.call_later(LINGER, self._close_spare, conn)
        elif (conn.transport == "relay") != (existing.transport == "relay"):
            # a direct path always wins over a relayed one; calls already on the loser finish there
            if existing.transport == "relay":
                self.conns[peer] = conn
                self.loop.call_later(LINGER, self._close_if_unused, existing)
                self._path_changed(peer)
            else:
                self.loop.call_later(LINGER, self._close_if_unused, conn)
        elif self._dialer(conn) != self._dialer(existing):
            # Both sides dialed at once: both ends must keep the same connection, so keep the one
            # dialed by the smaller PeerId and let the other linger for streams already on it.
            keep_new = self._dialer(conn) < self._dialer(existing)
            winner, loser = (conn, existing) if keep_new else (existing, conn)
            self.conns[peer] = winner
            self.loop.call_later(LINGER, self._close_if_unused, loser)
        else:
            # One side dialed twice (e.g. TCP and QUIC both won a race): new streams use the newer
            # connection; the older is not force-closed (the two ends might disagree on which is
            # older) and closes itself once idle. It may also be dead (the peer's NAT forgot it,
            # so the peer dialed again): it is probed, and aborted if it does not answer.
            self.conns[peer] = conn
            existing.probe(PROBE_TIMEOUT)

    def _dialer(self, conn: Connection) -> PeerId:
        return self.peer_id if conn.direction == "outbound" else conn.remote_peer

    def _close_spare(self, conn: Connection) -> None:
        # closed after the linger period even if the peer still uses it: the peer may have made
        # it its primary (its newest), and then it would never go unused; its calls move over
        if not conn.is_closed and self.conns.get(conn.remote_peer) is not conn:
            self.spawn(conn.close())

    def _close_if_unused(self, conn: Connection) -> None:
        if conn.is_closed or self.conns.get(conn.remote_peer) is conn:
            return
        if conn.num_streams == 0:
            self.spawn(conn.close())
        else:
            self.loop.call_later(LINGER, self._close_if_unused, conn)

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
            # promote a surviving duplicate, if any: the best path (TCP, then QUIC, then relayed)
            alive = [c for c in same or () if not c.is_closed]
            if alive:
                self.conns[peer] = min(alive, key=lambda c: _PREFERENCE.get(c.transport, 1))

    async def reap_idle(self, timeout: float) -> None:
        """Forever: close connections with no stream for ``timeout`` seconds, except a protected
        peer's primary one."""
        while True:
            await asyncio.sleep(max(timeout / 4, 0.05))
            now = self.loop.time()
            for conn in list(self.all_conns):
                if conn.num_streams or (conn.remote_peer in self.protected and self.conns.get(conn.remote_peer) is conn):
                    self.idle_since[conn] = now
                elif now - self.idle_since.get(conn, now) >= timeout:
                    log.debug("closing idle connection", peer=str(conn.remote_peer))
                    self.spawn(conn.close())

    def displaceable(self, peer: PeerId, newcomer: Connection) -> Connection | None:
        """The connection of ``peer`` to close when ``newcomer`` is one more than
        MAX_CONNS_PER_PEER: a spare with no stream (relayed before direct, oldest first), or, for
        a direct newcomer, a relayed spare even if busy; never the primary (a hole punch races
        dials both ways over two transports beside the relayed circuits, and the newest direct
        one is the one both ends are about to use). None: keep them, refuse the newcomer."""
        primary = self.conns.get(peer)
        spares = [c for c in self.conns_of.get(peer, ()) if c is not primary and not c.is_closed
                  and (not c.num_streams or (c.transport == "relay" and newcomer.transport != "relay"))]
        if not spares:
            return None
        return min(spares, key=lambda c: (c.num_streams > 0, c.transport != "relay", self.idle_since.get(c, 0.0)))

    def evictable(self, min_age: float = EVICT_MIN_AGE) -> Connection | None:
        """The connection to close to make room for a newcomer when full: the oldest whose peer
        has not identified after ``min_age`` seconds, else the longest-idle stranger's with no
        stream, else the least recently active stranger's (unprotected first: a stranger's relay
        reservation is worth less than a member's place, and identities cost nothing); members'
        connections are never evicted. None: none qualifies."""
        now = self.loop.time()
        unidentified = idle = busy = guarded = None
        for conn in self.all_conns:
            since = self.idle_since.get(conn, now)
            info = self.info.get(conn)
            if conn.is_closed:
                continue
            if info is None:
                if now - since >= min_age and (unidentified is None or since < self.idle_since[unidentified]):
                    unidentified = conn
            elif info.circle == "stranger" and conn.remote_peer in self.protected:
                if guarded is None or since < self.idle_since[guarded]:
                    guarded = conn
            elif info.circle == "stranger":
                if not conn.num_streams:
                    if idle is None or since < self.idle_since[idle]:
                        idle = conn
                elif busy is None or since < self.idle_since[busy]:
                    busy = conn  # (a stream held open must not make a stranger unevictable)
        return unidentified or idle or busy or guarded

    def protect(self, peer: PeerId, why: str) -> None:
        """Keep ``peer``'s connection open while idle (relay reservations, ...)."""
        self.protected.setdefault(peer, set()).add(why)

    def unprotect(self, peer: PeerId, why: str) -> None:
        tags = self.protected.get(peer)
        if tags is not None:
            tags.discard(why)
            if not tags:
                del self.protected[peer]
