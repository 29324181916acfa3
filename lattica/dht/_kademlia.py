"""Kademlia's sans-IO parts: 256-bit ids, the k-bucket routing table and the iterative lookup.

Nothing here does I/O. The routing table says which old peer to ping when a bucket is full; the
lookup says whom to ask next and is fed the answers. The DHT actor (``lattica.actors.dht``) does
the asking over authenticated connections, so a node id is always bound to a PeerId:
``node_id(peer) = sha256(peer id bytes)``, and only peers that answered us or called us from an
authenticated connection enter the table.
"""

from __future__ import annotations

import bisect
import random
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING

from lattica._digest import sha256
from lattica._identity import PeerId

if TYPE_CHECKING:
    from lattica._multiaddr import Multiaddr

__all__ = ["K", "ALPHA", "ID_BITS", "key_id", "node_id", "distance", "RoutingTable", "Lookup"]

K = 20  # bucket size and replication factor
ALPHA = 3  # requests in flight per lookup
ID_BITS = 256


def key_id(key: bytes) -> int:
    """The 256-bit id of a key: sha256 as an integer."""
    return int.from_bytes(sha256(key), "big")


def node_id(peer: PeerId) -> int:
    """A peer's id in the keyspace, derived from (so bound to) its PeerId."""
    return key_id(peer.to_bytes())


def distance(a: int, b: int) -> int:
    return a ^ b


class _Bucket:
    __slots__ = ("peers", "replacements", "pinging", "refreshed")

    def __init__(self, now: float) -> None:
        self.peers: OrderedDict[PeerId, int] = OrderedDict()  # least recently seen first
        self.replacements: OrderedDict[PeerId, int] = OrderedDict()  # newest last
        self.pinging: PeerId | None = None  # the oldest peer, being checked before eviction
        self.refreshed = now


class RoutingTable:
    """Peers by XOR distance from us, in 256 buckets of at most ``k`` (bucket ``i`` holds the peers
    whose distance has bit length ``i + 1``). Full buckets keep their old, proven peers (they are
    the likeliest to stay, as the Kademlia paper observes) and park newcomers as replacements."""

    def __init__(
        self, local: PeerId, k: int = K, clock: Callable[[], float] = time.monotonic, ping_after: float = 0.0
    ) -> None:
        self.local = local
        self.local_id = node_id(local)
        self.k = k
        self.ping_after = ping_after  # a full bucket's oldest peer seen this recently is not pinged
        self._clock = clock
        self._buckets: dict[int, _Bucket] = {}
        self._ids: dict[PeerId, int] = {}
        self._seen_at: dict[PeerId, float] = {}

    def __len__(self) -> int:
        return len(self._ids)

    def __contains__(self, peer: object) -> bool:
        return peer in self._ids

    def peers(self) -> list[PeerId]:
        return list(self._ids)

    def bucket_index(self, nid: int) -> int:
        return (nid ^ self.local_id).bit_length() - 1

    def _bucket(self, index: int) -> _Bucket:
        b = self._buckets.get(index)
        if b is None:
            b = self._buckets[index] = _Bucket(self._clock())
        return b

    def seen(self, peer: PeerId) -> PeerId | None:
        """``peer`` answered us (or called us): keep it fresh. Returns the bucket's oldest peer when
        the bucket is full and that peer should be pinged (see :meth:`ping_result`), else None."""
        if peer == self.local:
            return None
        now = self._clock()
        nid = self._ids.get(peer)
        if nid is None:
            nid = node_id(peer)
        b = self._bucket(self.bucket_index(nid))
        if peer in b.peers:
            b.peers.move_to_end(peer)
            self._seen_at[peer] = now
            return None
        if len(b.peers) < self.k:
            b.peers[peer] = nid
            self._ids[peer] = nid
            self._seen_at[peer] = now
            b.replacements.pop(peer, None)
            return None
        b.replacements[peer] = nid
        b.replacements.move_to_end(peer)
        while len(b.replacements) > self.k:
            b.replacements.popitem(last=False)
        if b.pinging is not None:
            return None
        oldest = next(iter(b.peers))
        if self.ping_after and now - self._seen_at.get(oldest, now) < self.ping_after:
            return None  # it answered recently: no need to ask whether it is still there
        b.pinging = oldest
        return b.pinging

    def ping_result(self, peer: PeerId, alive: bool) -> None:
        """The outcome of pinging the oldest peer of a full bucket."""
        nid = self._ids.get(peer)
        if nid is None:
            return
        b = self._bucket(self.bucket_index(nid))
        if b.pinging == peer:
            b.pinging = None
        if alive:
            b.peers.move_to_end(peer)
            self._seen_at[peer] = self._clock()
        else:
            self.remove(peer)

    def remove(self, peer: PeerId) -> None:
        """Drop ``peer`` (it failed a request or misbehaved), from the table and from the
        replacement lists; its bucket takes the newest replacement."""
        nid = self._ids.pop(peer, None)
        if nid is None:
            b = self._buckets.get(self.bucket_index(node_id(peer)))
            if b is not None:
                b.replacements.pop(peer, None)
            return
        self._seen_at.pop(peer, None)
        b = self._bucket(self.bucket_index(nid))
        del b.peers[peer]
        if b.pinging == peer:
            b.pinging = None
        if b.replacements:
            rpeer, rid = b.replacements.popitem(last=True)
            b.peers[rpeer] = rid
            self._ids[rpeer] = rid
            self._seen_at[rpeer] = self._clock()

    def closest(self, target: int, n: int | None = None, exclude: PeerId | None = None) -> list[PeerId]:
        """The ``n`` (default ``k``) known peers closest to ``target``.

        Walks buckets by distance band instead of sorting the whole table: with ``j`` the bucket
        ``target`` falls in, bucket ``j`` holds the closest peers, then buckets below ``j`` (one
        band, sorted together), then buckets above ``j`` in increasing order."""
        n = self.k if n is None else n
        want = n + (exclude is not None and exclude in self._ids)
        j = (target ^ self.local_id).bit_length() - 1
        out: list[tuple[int, PeerId]] = []

        def band(indices: Iterable[int]) -> None:
            items = [(nid ^ target, p) for i in indices for p, nid in self._buckets[i].peers.items()]
            items.sort()  # distances are unique: peers are never compared
            out.extend(items)

        present = sorted(i for i, b in self._buckets.items() if b.peers)
        if j >= 0 and j in self._buckets:
            band([j])
        if len(out) < want:
            band([i for i in present if i < j])
        for i in present:
            if len(out) >= want:
                break
            if i > j:
                band([i])
        return [p for _, p in out if p != exclude][:n]

    def touch(self, target: int) -> None:
        """A lookup for ``target`` ran: its bucket needs no refresh for a while."""
        self._bucket(self.bucket_index(target)).refreshed = self._clock()

    def stale_buckets(self, interval: float) -> list[int]:
        """Buckets from the nearest one holding a peer out to the farthest that no lookup went
        into for ``interval`` seconds (nearer buckets are empty: no peer is that close)."""
        if not self._ids:
            return []
        now = self._clock()
        nearest = min(i for i, b in self._buckets.items() if b.peers)
        stale = []
        for i in range(nearest, ID_BITS):
            b = self._buckets.get(i)
            if b is None or now - b.refreshed >= interval:
                stale.append(i)
        return stale

    def random_id(self, index: int, rng: random.Random | None = None) -> int:
        """A random id in bucket ``index`` (its distance from us has bit length ``index + 1``)."""
        low = (rng or random).getrandbits(index) if index > 0 else 0
        return self.local_id ^ ((1 << index) | low)


# -- the iterative lookup -----------------------------------------------------------------------

_NEW, _WAITING, _ANSWERED, _FAILED = range(4)


class _Candidate:
    __slots__ = ("peer", "distance", "state", "round")

    def __init__(self, peer: PeerId, dist: int, round_: int) -> None:
        self.peer = peer
        self.distance = dist
        self.state = _NEW
        self.round = round_


class Lookup:
    """An iterative parallel lookup of ``target``, as a state machine.

    Ask whom :meth:`next` returns (never more than ``alpha`` at once), then report each outcome
    with :meth:`answered` (the closer peers it named) or :meth:`failed`. The lookup is
    :attr:`done` when the ``k`` closest peers that did not fail have all answered. ``rounds`` is
    how deep it went: seeds are round 1, a peer first named by a round-r peer is round r + 1.
    """

    MAX_CANDIDATES = 2000  # a peer naming thousands of others cannot grow the lookup without bound

    def __init__(self, target: int, seeds: Iterable[PeerId], local: PeerId, k: int = K, alpha: int = ALPHA) -> None:
        self.target = target
        self.local = local
        self.k = k
        self.alpha = alpha
        self._cands: dict[PeerId, _Candidate] = {}
        self._order: list[tuple[int, _Candidate]] = []  # by distance; failed ones stay, skipped
        self.in_flight = 0
        self.queried = 0
        self.hints: dict[PeerId, list[Multiaddr]] = {}  # per candidate, the addresses a peer gave for it
        for p in seeds:
            self._add(p, 1)

    def _add(self, peer: PeerId, round_: int) -> None:
        if peer == self.local or peer in self._cands:
            return
        dist = node_id(peer) ^ self.target
        if len(self._cands) >= self.MAX_CANDIDATES:
            # full: a closer peer displaces the farthest one not asked yet (so a flood of made-up
            # ids named early cannot crowd out honest answers that come later)
            unasked = [c for c in self._cands.values() if c.state == _NEW]
            far = max(unasked, key=lambda c: c.distance, default=None)
            if far is None or far.distance <= dist:
                return
            del self._cands[far.peer]
            self._order.remove((far.distance, far))
        c = self._cands[peer] = _Candidate(peer, dist, round_)
        bisect.insort(self._order, (dist, c))

    def _ranked(self) -> list[_Candidate]:
        """The k closest candidates that have not failed."""
        out = []
        for _, c in self._order:
            if c.state != _FAILED:
                out.append(c)
                if len(out) == self.k:
                    break
        return out

    def next(self) -> list[PeerId]:
        """Peers to ask now (each is marked as asked)."""
        out: list[PeerId] = []
        if self.in_flight >= self.alpha:
            return out
        for c in self._ranked():
            if c.state == _NEW:
                c.state = _WAITING
                self.in_flight += 1
                self.queried += 1
                out.append(c.peer)
                if self.in_flight >= self.alpha:
                    break
        return out

    def answered(self, peer: PeerId, closer: Iterable[PeerId]) -> None:
        c = self._cands.get(peer)
        if c is None or c.state != _WAITING:
            return
        c.state = _ANSWERED
        self.in_flight -= 1
        for p in closer:
            self._add(p, c.round + 1)

    def failed(self, peer: PeerId) -> None:
        c = self._cands.get(peer)
        if c is None or c.state != _WAITING:
            return
        c.state = _FAILED
        self.in_flight -= 1

    def round_of(self, peer: PeerId) -> int:
        c = self._cands.get(peer)
        return c.round if c is not None else 0

    @property
    def done(self) -> bool:
        return all(c.state == _ANSWERED for c in self._ranked())

    def closest(self, n: int | None = None) -> list[PeerId]:
        """The closest peers that answered, nearest first."""
        n = self.k if n is None else n
        out: list[PeerId] = []
        for _, c in self._order:
            if len(out) >= n:
                break
            if c.state == _ANSWERED:
                out.append(c.peer)
        return out

    @property
    def rounds(self) -> int:
        """Depth of the lookup: the highest round among the closest peers that answered."""
        closest = set(self.closest())
        return max((c.round for c in self._cands.values() if c.peer in closest), default=0)

    def pending(self) -> list[PeerId]:
        return [c.peer for c in self._cands.values() if c.state == _WAITING]
