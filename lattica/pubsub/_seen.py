"""The router's seen cache (``lattica.pubsub._router``): what it knows of each message id it saw,
for ``seen_ttl`` and at most ``seen_max`` ids, and its authors' floors.

A message is forwarded at most once, never back to a peer that sent it to us. When an accepted
message leaves the cache, its author's **floor** rises to its sequence number: that author's
messages at or below it are dropped unseen, so a flood that pushes the cache's entries out
(however many authors it is signed by) opens no window to replay what was forgotten. Floors are
kept for ``max_floors`` authors, only of accepted messages (whose authors the glue vouched for).
libp2p GossipSub messages have none (their seqnos need not grow: js-libp2p's are random); as in
libp2p, the seen cache alone keeps their copies out.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Hashable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from lattica.pubsub._router import Envelope, GossipParams

__all__ = ["Seen", "SeenCache", "PENDING", "ACCEPTED", "REJECTED", "IGNORED"]

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
            self._evicted(*self._seen.popitem(last=False))
        return entry

    def _evicted(self, mid: bytes, entry: Seen) -> None:
        """``mid`` left the seen cache: an accepted message raises its author's floor."""
        self._messages.pop(mid, None)
        if entry.state != ACCEPTED or mid[-8:] == _LIBP2P_MARK:
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
            self._evicted(mid, entry)
