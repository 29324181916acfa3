"""The connection table of one node: which connection each peer's new streams use, every live
connection by peer, what identify told us on each, idle close and the peers kept connected."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from typing import Any

from lattica._budget import Buckets, StrangersShare
from lattica._hostview import HostEvents
from lattica._identify import PeerInfo
from lattica._identity import PeerId
from lattica.config import DRAIN_GRACE
from lattica.errors import ConnectionClosed
from lattica.logging import get_logger
from lattica.transports.base import PROBE_TIMEOUT, Connection, Stream

__all__ = ["Connections", "DRAIN_GRACE", "MAX_CONNS_PER_PEER", "MAX_DRAINING_PER_PEER"]

log = get_logger("lattica.node")

QUIC_LINGER = 2.0  # seconds a QUIC connection beside a TCP one stays before it goes away
MAX_CONNS_PER_PEER = 4  # live connections (not going away) one peer may hold with us
MAX_DRAINING_PER_PEER = 4  # and going away besides: beyond, the oldest is closed at once
EVICT_MIN_AGE = 2.0  # seconds an unidentified connection is given before a newcomer may evict it
STREAM_OPENS = (500.0, 1000.0)  # streams a second (and at once) a peer may open on one connection
STRANGERS_OPENS = (1000.0, 2000.0)  # ... and all strangers (and unidentified peers) together
OPENS_REFUSED_MAX = 2000  # streams refused on one connection before it is closed: it keeps on opening
ABUSE_BAN = 60.0  # seconds the peer of a connection closed for that is not let back in
# the first streams of every connection are not charged to the strangers' share: a member whose
# connection is not identified yet (its identify still on the way) gets its first calls in while
# strangers have spent the share (a new connection costs an attacker a handshake: 8 are cheap)
FREE_OPENS = 8
# streams open at once on all strangers' connections together: each may pin yamux's 256 KiB
# minimum window of unread bytes (the full window waits for the peer to be trusted), so this
# bounds what strangers together hold of our memory in unread streams to 128 MiB
STRANGERS_STREAMS = 512
_STREAMS_FULL_WAIT = 0.1  # s a stranger's opens wait when strangers' streams are all taken
_ROOM_EVERY = 0.05  # s between counts of strangers' streams


_TCP_AND_QUIC = {"tcp", "quic"}
_PREFERENCE = {"tcp": 0, "quic": 1, "relay": 2}  # which path a peer's primary connection should be


def usable(conn: Connection) -> bool:
    """A connection new streams may be opened on: open and not going away."""
    return not conn.is_closed and not conn.going_away


class Connections:
    """Adopts authenticated connections and picks each peer's primary one (direct beats relayed,
    TCP beats QUIC; of two simultaneous dials both ends keep the one dialed by the smaller
    PeerId), forgets them when they close, and retires the ones it no longer wants: a retired
    connection goes away (``Connection.go_away``: no new streams on either side, those open finish
    there) and closes once its streams have ended, or after ``grace`` seconds. Nothing in flight
    is cut by a choice made here."""

    def __init__(
        self,
        peer_id: PeerId,
        loop: asyncio.AbstractEventLoop,
        events: HostEvents,
        spawn: Callable[[Coroutine[Any, Any, Any]], asyncio.Task],
        serve: Callable[[Stream, Connection], Coroutine[Any, Any, None]],
        going_away: Callable[[Connection], None],
        expired: Callable[[Connection], None],
        grace: float = DRAIN_GRACE,
    ) -> None:
        self.peer_id = peer_id
        self.loop = loop
        self.events = events
        self.spawn = spawn
        self._serve = serve  # serves one inbound stream of a connection
        self._going_away_hook = going_away  # a connection started going away: calls move off it
        self._expired_hook = expired  # its grace period ended with streams still open: it closes now
        self.grace = grace
        self.conns: dict[PeerId, Connection] = {}
        self.all_conns: set[Connection] = set()
        self.conns_of: dict[PeerId, set[Connection]] = {}  # every live connection, by peer
        self.info: dict[Connection, PeerInfo] = {}
        self.identified: dict[Connection, asyncio.Future[PeerInfo]] = {}
        self.idle_since: dict[Connection, float] = {}
        self.away_since: dict[Connection, float] = {}  # connections going away, since when
        self._grace_timers: dict[Connection, asyncio.TimerHandle] = {}  # when each must be gone
        self.protected: dict[PeerId, set[str]] = {}  # peers whose idle connections stay open, and why
        self.unsettled: set[Connection] = set()  # beside a primary, waiting for their peer's identify
        self._opens = Buckets(*STREAM_OPENS, max_keys=4096)  # by connection
        self._strangers_opens = StrangersShare(*STRANGERS_OPENS, self.from_stranger)
        self._opens_refused: dict[Connection, int] = {}
        self._opened: dict[Connection, int] = {}  # streams the peer opened on each connection, up to FREE_OPENS
        self._banned: dict[PeerId, float] = {}  # peers closed for opening streams without end: until when
        self._room, self._room_at = STRANGERS_STREAMS, float("-inf")  # (see _strangers_room)
        self._metered: set[Connection] = set()  # connections that hold a peer's opens beyond the gate unread

    def add(self, conn: Connection, spare: bool = False) -> None:
        """Start serving a new authenticated connection. The peer's only one is its primary at
        once; beside a primary, a newcomer is weighed once its peer has identified on it
        (``settle``: a connection the peer never identifies, such as an AutoNAT dial-back, is
        never used for our streams). A ``spare`` (our dial race's late winner, which the peer may
        already use) is served and retired at once."""
        self.all_conns.add(conn)
        self.conns_of.setdefault(conn.remote_peer, set()).add(conn)
        self.idle_since[conn] = self.loop.time()
        self.identified[conn] = self.loop.create_future()
        conn.add_close_callback(self._on_closed)
        if conn.meter_opens(lambda n: self._open_gate(conn, n)):
            self._metered.add(conn)
        conn.set_stream_handler(lambda s: self._on_stream(s, conn))
        if conn.is_closed:  # (its streams so far were refused past its budget: closed meanwhile)
            self._on_closed(conn)
            return
        conn.on_going_away = self._on_going_away
        if conn.going_away:  # (the peer said so before we adopted it)
            self._on_going_away(conn)
            return
        if spare:
            conn.go_away()
            return
        existing = self.conns.get(conn.remote_peer)
        if existing is None or not usable(existing):
            self.conns[conn.remote_peer] = conn
        else:
            self.unsettled.add(conn)

    def settle(self, conn: Connection) -> None:
        """``conn``'s peer identified on it: weigh it against the peer's primary. Which one goes
        is decided by rules both ends compute alike; the loser goes away (the peer's calls
        already on it finish there)."""
        if conn not in self.unsettled:
            return
        self.unsettled.discard(conn)
        if not usable(conn):
            return
        peer = conn.remote_peer
        existing = self.conns.get(peer)
        if existing is None or not usable(existing):
            self.conns[peer] = conn
        elif {conn.transport, existing.transport} == _TCP_AND_QUIC:
            # Two direct paths (a dial race's two winners, a punch that got through on both): TCP
            # is the fast one here (QUIC in Python carries a fraction of it), so both ends keep
            # TCP, whichever came first
            tcp, quic = (conn, existing) if conn.transport == "tcp" else (existing, conn)
            self.conns[peer] = tcp
            # the QUIC one goes away a moment later: AutoNAT dials QUIC beside TCP to see how our
            # NAT maps the listening UDP socket, and reads it off the live connection
            self.loop.call_later(QUIC_LINGER, self._retire_spare, quic)
        elif (conn.transport == "relay") != (existing.transport == "relay"):
            # a direct path always wins over a relayed one
            relayed = existing if existing.transport == "relay" else conn
            self.conns[peer] = conn if relayed is existing else existing
            relayed.go_away()
        elif (conn.relay_limit is None) != (existing.relay_limit is None):
            # a circuit that carries traffic wins over a libp2p relay's limited one
            limited = existing if existing.relay_limit is not None else conn
            self.conns[peer] = conn if limited is existing else existing
            limited.go_away()
        elif self._dialer(conn) != self._dialer(existing):
            # Both sides dialed at once: both ends must keep the same connection, so keep the one
            # dialed by the smaller PeerId
            keep_new = self._dialer(conn) < self._dialer(existing)
            winner, loser = (conn, existing) if keep_new else (existing, conn)
            self.conns[peer] = winner
            loser.go_away()
        else:
            # One side dialed twice (e.g. its NAT forgot the first one, so it dialed again): new
            # streams use the newer connection; the older is not retired (the two ends might
            # disagree on which is older) and goes when idle. It may also be dead: it is probed,
            # and aborted if it does not answer.
            self.conns[peer] = conn
            existing.probe(PROBE_TIMEOUT)

    def _retire_spare(self, conn: Connection) -> None:
        if usable(conn) and self.conns.get(conn.remote_peer) is not conn:
            conn.go_away()

    def _dialer(self, conn: Connection) -> PeerId:
        return self.peer_id if conn.direction == "outbound" else conn.remote_peer

    def _best(self, peer: PeerId) -> Connection | None:
        """The peer's best usable connection it identified on: TCP, then QUIC, then relayed; of
        equals, the one busy last."""
        alive = [c for c in self.conns_of.get(peer, ()) if usable(c) and c not in self.unsettled]
        if not alive:
            return None
        return min(
            alive,
            key=lambda c: (_PREFERENCE.get(c.transport, 1), c.relay_limit is not None, -self.idle_since.get(c, 0.0)),
        )

    def _on_going_away(self, conn: Connection) -> None:
        """``conn`` started going away (we retired it, or the peer did): new streams to its peer
        go elsewhere, call channels on it move, and it gets ``grace`` seconds to drain."""
        if conn.is_closed or conn in self.away_since or conn not in self.all_conns:
            return
        self.away_since[conn] = self.loop.time()
        self.unsettled.discard(conn)
        peer = conn.remote_peer
        log.debug("connection going away", peer=str(peer), transport=conn.transport, streams=conn.num_streams)
        if self.conns.get(peer) is conn:
            best = self._best(peer)
            if best is None:
                del self.conns[peer]  # (the next stream dials afresh)
            else:
                self.conns[peer] = best
        self._going_away_hook(conn)
        self._grace_timers[conn] = self.loop.call_later(self.grace, self._grace_over, conn)
        for riding in [c for c in self.all_conns if c.carrier is conn and usable(c)]:
            riding.go_away()  # (circuits inside its streams would die with it at the end of the grace)
        draining = sorted(
            (c for c in self.conns_of.get(peer, ()) if c in self.away_since and not c.is_closed),
            key=self.away_since.__getitem__,
        )
        for old in draining[: max(0, len(draining) - MAX_DRAINING_PER_PEER)]:
            log.info(
                "closing a connection going away: too many from this peer", peer=str(peer), streams=old.num_streams
            )
            old.abort("too many connections going away from this peer")

    def _grace_over(self, conn: Connection) -> None:
        self._grace_timers.pop(conn, None)
        if conn.is_closed:
            return
        log.info(
            "closing a connection going away: its grace period ended",
            peer=str(conn.remote_peer),
            streams=conn.num_streams,
            grace=self.grace,
        )
        self._expired_hook(conn)  # (calls still on it fail with PathChanged, or are re-sent)
        self.spawn(conn.close())

    def banned(self, peer: PeerId) -> bool:
        """``peer``'s last connection was closed for opening streams without end, lately: it is
        not let back in for ``ABUSE_BAN`` seconds."""
        until = self._banned.get(peer)
        if until is not None and self.loop.time() >= until:
            del self._banned[peer]
            return False
        return until is not None

    def from_stranger(self, conn: Connection) -> bool:
        """``conn``'s peer is outside our mesh, or has not identified on it yet."""
        info = self.info.get(conn)
        return info is None or info.circle == "stranger"

    def _open_gate(self, conn: Connection, n: int) -> tuple[int, float]:
        """How many of ``n`` more streams ``conn``'s peer may open now: its connection's first
        ``FREE_OPENS`` free (its identify may come after its first streams), then within the
        connection's budget and, for a stranger, the strangers' share; at none, the seconds
        until one."""
        stranger = self.from_stranger(conn)
        opened = self._opened.get(conn, 0)
        if opened < FREE_OPENS and conn not in self.info:
            # a connection not identified yet gets its first opens even when strangers hold all
            # their streams: a member whose identify comes on a stream (a QUIC dialer's) must
            # get it through (the peer has 10 s to identify, then its connection is closed)
            k = min(FREE_OPENS - opened, n)
            self._opened[conn] = opened + k
        else:
            room = self._strangers_room() if stranger else n
            if room <= 0:
                return 0, _STREAMS_FULL_WAIT
            if opened < FREE_OPENS:
                k = min(FREE_OPENS - opened, room, n)
                self._opened[conn] = opened + k
            else:
                share = self._strangers_opens
                k = int(min(n, room, self._opens.available(conn), share.available(conn)))
                if k <= 0:
                    return 0, max(self._opens.wait(conn), share.wait() if stranger else 0.0)
                self._opens.take(conn, k)
                share.take(conn, k)
        if stranger:
            self._room -= k
        return k, 0.0

    def _strangers_room(self) -> int:
        """Streams strangers together may still open: the cap less those they opened and hold
        open (not ours to them) and those granted on metered connections, not yet opened
        (counted at most every ``_ROOM_EVERY`` s: held connections ask again and again while it
        is full; grants since are taken off)."""
        now = self.loop.time()
        if now - self._room_at >= _ROOM_EVERY:
            taken = sum(c.peer_streams + c.opens_granted for c in self.all_conns if self.from_stranger(c))
            self._room, self._room_at = STRANGERS_STREAMS - taken, now
        return self._room

    def _on_stream(self, stream: Stream, conn: Connection) -> None:
        """A stream the peer opened: served within its connection's budget of opens and, for a
        stranger's (past the connection's first ``FREE_OPENS``), the strangers' share; else reset
        at once, before any work is made for it (a connection that keeps on opening is closed).
        On a metered connection the gate has had its say already."""
        if conn.is_closed:
            return
        if conn in self._metered:
            self.spawn(self._serve(stream, conn))
            return
        if self._open_gate(conn, 1)[0]:
            self.spawn(self._serve(stream, conn))
            return
        stream.reset()
        refused = self._opens_refused[conn] = self._opens_refused.get(conn, 0) + 1
        if refused == 1:
            log.info("refusing streams: the peer opens them faster than its budget", peer=str(conn.remote_peer))
        if refused > OPENS_REFUSED_MAX:
            if len(self._banned) >= 4096:
                self._banned.pop(next(iter(self._banned)))
            self._banned[conn.remote_peer] = self.loop.time() + ABUSE_BAN
            conn.abort(f"the peer opened over {OPENS_REFUSED_MAX} streams beyond its budget")

    def _on_closed(self, conn: Connection) -> None:
        self.all_conns.discard(conn)
        self._opens_refused.pop(conn, None)
        self._opened.pop(conn, None)
        self._metered.discard(conn)
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
        self.away_since.pop(conn, None)
        self.unsettled.discard(conn)
        timer = self._grace_timers.pop(conn, None)
        if timer is not None:
            timer.cancel()
        if self.conns.get(peer) is conn:
            del self.conns[peer]
            best = self._best(peer)  # promote a surviving duplicate, if any: the best path
            if best is not None:
                self.conns[peer] = best

    async def reap_idle(self, timeout: float) -> None:
        """Forever: retire connections with no stream for ``timeout`` seconds, except a protected
        peer's primary one (they go away, so a stream the peer opens meanwhile is still served)."""
        while True:
            await asyncio.sleep(max(timeout / 4, 0.05))
            now = self.loop.time()
            for conn in list(self.all_conns):
                if conn.num_streams or (
                    conn.remote_peer in self.protected and self.conns.get(conn.remote_peer) is conn
                ):
                    self.idle_since[conn] = now
                elif now - self.idle_since.get(conn, now) >= timeout and usable(conn):
                    log.debug("retiring idle connection", peer=str(conn.remote_peer))
                    conn.go_away()

    def live_count(self, peer: PeerId) -> int:
        """The peer's connections that are open and not going away."""
        return sum(1 for c in self.conns_of.get(peer, ()) if usable(c))

    def displaceable(self, peer: PeerId) -> Connection | None:
        """The connection of ``peer`` to retire when a newcomer is one more than
        MAX_CONNS_PER_PEER live ones: a spare, relayed before direct, idle before busy, oldest
        first; never the primary (a hole punch races dials both ways over two transports beside
        the relayed circuits, and the newest direct one is the one both ends are about to use).
        It goes away: whatever is on it finishes there. None: no spare to retire."""
        primary = self.conns.get(peer)
        spares = [c for c in self.conns_of.get(peer, ()) if c is not primary and usable(c)]
        if not spares:
            return None
        return min(spares, key=lambda c: (c.transport != "relay", c.num_streams > 0, self.idle_since.get(c, 0.0)))

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
