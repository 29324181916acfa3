"""The router's seen cache (``lattica.pubsub._router``): what it knows of each message id it saw,
for ``seen_ttl`` and at most ``seen_max`` ids, and its authors' floors.

A message is forwarded at most once, never back to a peer that sent it to us. When an accepted
message leaves the cache, its author's **floor** rises to its sequence number: that author's
messages at or below it are dropped unseen, so a flood that pushes the cache's entries out
(however many authors it is signed by) opens no window to replay what was forgotten. Floors are
kept for ``max_floors`` authors, only of accepted messages (whose authors the glue vouched for).

libp2p GossipSub messages have no floors (their seqnos need not grow: js-libp2p's are random);
as in libp2p, the seen cache alone keeps their copies out, for ``seen_ttl`` whatever came since
(go's cache is bounded by time alone). So a libp2p id pushed out by ``seen_max`` newer ones
before its time goes to the **tail** (:class:`Tail`): 8 bytes of a keyed hash, in buckets by
time, dropped as they age past ``seen_ttl``, at most ``seen_tail_max`` ids. When that is full
too, a peer's new message that would push another unexpired libp2p id out is dropped instead
(``_room``): never taken twice within ``seen_ttl``, never more memory than the bounds.
"""

from __future__ import annotations

import os
from array import array
from bisect import bisect_left
from collections import OrderedDict, deque
from collections.abc import Hashable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from lattica.pubsub._router import Envelope, GossipParams

__all__ = ["Seen", "SeenCache", "Tail", "PENDING", "ACCEPTED", "REJECTED", "IGNORED"]

# a message's state: waiting for the glue's verdict, or the verdict
PENDING, ACCEPTED, REJECTED, IGNORED = range(4)


_NOBODY: frozenset = frozenset()
_LIBP2P_MARK = bytes(8)  # (the router's LIBP2P_MARK: a libp2p GossipSub message's id ends with it)


class Seen:
    """What we know of one message id. Its sets of peers start as one shared empty set and
    become a set of their own at their first peer: the cache holds up to ``seen_max`` entries,
    most of which never name anyone (a third of the memory per entry, and a flood's worth)."""

    __slots__ = ("at", "state", "topic", "source", "have", "sent_to", "told", "flooded")

    def __init__(self, at: float, topic: str, source: Hashable | None) -> None:
        self.at = at
        self.state = PENDING
        self.topic = topic
        self.source = source
        self.flooded = False  # the author sent it to us itself, and said so: no mesh peer forwards it to us
        self.have: set[Hashable] | frozenset = _NOBODY  # peers that sent it to us
        self.sent_to: set[Hashable] | frozenset = _NOBODY  # peers we sent it to
        self.told: set[Hashable] | frozenset = _NOBODY  # peers that said IDONTWANT (have it, or will soon)

    def had_from(self, peer: Hashable) -> None:
        if self.have is _NOBODY:
            self.have = set()
        self.have.add(peer)  # type: ignore[union-attr]

    def sent(self, peer: Hashable) -> None:
        if self.sent_to is _NOBODY:
            self.sent_to = set()
        self.sent_to.add(peer)  # type: ignore[union-attr]

    def was_told(self, peer: Hashable) -> None:
        if self.told is _NOBODY:
            self.told = set()
        self.told.add(peer)  # type: ignore[union-attr]


_SEAL = 65_536  # ids a tail bucket takes as a set before it is sealed (sorted into 8 bytes each)
_BUCKETS = 12  # buckets a tail's seen_ttl is cut into by time


class Tail:
    """libp2p message ids that left the seen cache before ``ttl`` (see the module docstring),
    as 8-byte hashes keyed per node (blake2b: nobody can make another message's id collide with
    an honest one): the newest in a set, older ones sealed into sorted arrays, each bucket
    dropped ``ttl`` after its last id came. At most ``max_ids`` (8 bytes each once sealed; the
    open bucket at most ``_SEAL`` of ~60)."""

    __slots__ = ("ttl", "span", "max_ids", "size", "_key", "_hash", "_open", "_opened", "_last", "_sealed")

    def __init__(self, ttl: float, max_ids: int) -> None:
        import hashlib  # (at the first id pushed out early: hashlib stays out of a node's start)

        self.ttl = ttl
        self.span = ttl / _BUCKETS
        self.max_ids = max_ids
        self.size = 0
        self._key = os.urandom(16)
        self._hash: Any = hashlib.blake2b
        self._open: set[int] = set()
        self._opened = 0.0  # when the open bucket took its first id
        self._last = 0.0  # and its last
        self._sealed: deque[tuple[float, array]] = deque()  # (when its last id came, its ids sorted)

    def _of(self, mid: bytes) -> int:
        return int.from_bytes(self._hash(mid, digest_size=8, key=self._key).digest(), "big", signed=True)

    def full(self) -> bool:
        return self.size >= self.max_ids

    def add(self, mid: bytes, now: float) -> bool:
        """Keep ``mid`` (pushed out of the cache at ``now``) until ``ttl`` after ``now``; False
        (not kept) when full."""
        if self.size >= self.max_ids:
            return False
        h = self._of(mid)
        if self._open and (now - self._opened >= self.span or len(self._open) >= _SEAL):
            self._seal()
        if not self._open:
            self._opened = now
        self._last = now
        if h not in self._open:
            self._open.add(h)
            self.size += 1
        return True

    def __contains__(self, mid: bytes) -> bool:
        if not self.size:
            return False
        h = self._of(mid)
        if h in self._open:
            return True
        for _, ids in self._sealed:
            i = bisect_left(ids, h)
            if i < len(ids) and ids[i] == h:
                return True
        return False

    def _seal(self) -> None:
        self._sealed.append((self._last, array("q", sorted(self._open))))
        self._open = set()

    def expire(self, now: float) -> None:
        """Buckets whose ids all came more than ``ttl`` ago go (their messages' first copies
        came earlier still); the open one is sealed once it spans its share of ``ttl``."""
        if self._open and now - self._opened >= self.span:
            self._seal()
        sealed = self._sealed
        while sealed and now - sealed[0][0] > self.ttl:
            self.size -= len(sealed.popleft()[1])

    def __len__(self) -> int:
        return self.size


class SeenCache:
    """The router's part that remembers message ids (see the module docstring)."""

    if TYPE_CHECKING:  # (the router's, read here)
        p: GossipParams
        _messages: dict[bytes, Envelope]
        _dont: OrderedDict[bytes, set[Hashable]]

    def __init__(self) -> None:
        super().__init__()
        self._seen: OrderedDict[bytes, Seen] = OrderedDict()
        # author -> highest seqno of its accepted messages the cache forgot
        self._floors: OrderedDict[bytes, int] = OrderedDict()
        self._tail: Tail | None = None  # libp2p ids pushed out before seen_ttl (made at the first)

    def topic_of(self, mid: bytes) -> str | None:
        """The topic of a message we have seen (None: not seen, or forgotten)."""
        entry = self._seen.get(mid)
        return entry.topic if entry is not None else None

    def _remember(self, mid: bytes, now: float, topic: str, source: Hashable | None) -> Seen:
        entry = self._seen[mid] = Seen(now, topic, source)
        told = self._dont.pop(mid, None)
        if told:
            entry.told = told
        if len(self._seen) > self.p.seen_max:
            self._evicted(*self._seen.popitem(last=False), now)
        return entry

    def _room(self, now: float) -> bool:
        """Whether a peer's new message may be remembered now: not when that would push out an
        unexpired libp2p id the tail has no room for (it is dropped instead: see the module
        docstring; our own messages always are, so one of ours may push such an id out)."""
        seen = self._seen
        if len(seen) < self.p.seen_max:
            return True
        mid, entry = next(iter(seen.items()))
        if mid[-8:] != _LIBP2P_MARK or now - entry.at > self.p.seen_ttl:
            return True
        return self._tail is None or not self._tail.full()

    def _replayed(self, mid: bytes) -> bool:
        """Whether libp2p message ``mid`` left the seen cache early and is still within its
        ``seen_ttl`` (a replay, or a copy late by more than ``seen_max`` messages)."""
        tail = self._tail
        return tail is not None and mid[-8:] == _LIBP2P_MARK and mid in tail

    def _evicted(self, mid: bytes, entry: Seen, now: float) -> None:
        """``mid`` left the seen cache: an accepted message raises its author's floor; a libp2p
        one still within ``seen_ttl`` goes to the tail."""
        self._messages.pop(mid, None)
        if mid[-8:] == _LIBP2P_MARK:
            if now - entry.at <= self.p.seen_ttl:
                if self._tail is None:
                    self._tail = Tail(self.p.seen_ttl, self.p.seen_tail_max)
                self._tail.add(mid, now)
            return
        if entry.state != ACCEPTED:
            return
        author, seqno = mid[:-16], int.from_bytes(mid[-16:-8], "big")
        floors = self._floors
        if floors.get(author, -1) < seqno:
            floors[author] = seqno
            floors.move_to_end(author)
            if len(floors) > self.p.max_floors:
                floors.popitem(last=False)

    def _forgotten(self, mid: bytes) -> bool:
        """Whether ``mid`` is at or below its author's floor (see ``_evicted``)."""
        floor = self._floors.get(mid[:-16])
        return (
            floor is not None
            and len(mid) > 16
            and mid[-8:] != _LIBP2P_MARK
            and int.from_bytes(mid[-16:-8], "big") <= floor
        )

    def _expire(self, now: float) -> None:
        """Ids older than ``seen_ttl`` (or beyond ``seen_max``) leave the cache (at the heartbeat)."""
        ttl = self.p.seen_ttl
        seen = self._seen
        while seen:
            mid, entry = next(iter(seen.items()))
            if now - entry.at <= ttl and len(seen) <= self.p.seen_max:
                break
            del seen[mid]
            self._evicted(mid, entry, now)
        if self._tail is not None:
            self._tail.expire(now)
