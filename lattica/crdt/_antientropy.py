"""Whom a replica's anti-entropy syncs with, and when, sans-IO (docs/crdt.md, Replication): every
replica peer once after it appears (again after a disconnection), a random one every
``sync_interval``, and those known to lack envelopes anti-entropy brought. The replica actor
(``actors/crdt/sync.py``) asks this and makes the calls.
"""

from __future__ import annotations

import random
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from lattica._identity import PeerId
    from lattica.crdt._envelope import Envelope
    from lattica.crdt._replica import Chain

__all__ = ["SyncSchedule"]

FIRST_TICK = 0.1  # seconds between two looks at the replica peers, at first
TICK = 0.2  # and after a few looks


class SyncSchedule:
    """One document's anti-entropy schedule: which replica peers were synced with since they
    appeared (``synced``) and what each held when we last heard (``known``: seq per chain)."""

    def __init__(self, interval: float) -> None:
        self.interval = interval
        self.synced: set[PeerId] = set()
        self.known: dict[PeerId, dict[Chain, int]] = {}
        self.tick = FIRST_TICK  # seconds until the next look at the peers
        self._last = 0.0

    def start(self, now: float) -> None:
        """The looks begin: the first random sync is ``interval`` from ``now``."""
        self._last = now

    def due(self, peers: Sequence[PeerId], now: float) -> list[PeerId]:
        """A look at the replica ``peers`` there are now: those to sync with (each not synced with
        since it appeared, and a random one every ``interval``). Forgets the peers that left (one
        that comes back is synced with again), and puts the next look a little later."""
        self.tick = min(TICK, self.tick * 1.5)
        here = set(peers)
        self.synced &= here
        for gone in [p for p in self.known if p not in here]:
            del self.known[gone]
        out = [p for p in peers if p not in self.synced]
        if peers and now - self._last >= self.interval:
            self._last = now
            out.append(random.choice(peers))
        return out

    def heard(self, peer: PeerId, summary: dict[Chain, int], envs: Iterable[Envelope] = ()) -> None:
        """``peer`` holds ``summary``, and ``envs`` besides."""
        known = self.known[peer] = dict(summary)
        for e in envs:
            if known.get(e.chain, 0) < e.seq:
                known[e.chain] = e.seq

    def answered(self, peer: PeerId, summary: dict[Chain, int], sent: Iterable[Envelope]) -> None:
        """We answered ``peer``'s sync (it holds ``summary``, and now ``sent``): it syncs with us,
        we need not start one of our own."""
        self.synced.add(peer)
        self.heard(peer, summary, sent)

    def pushed(self, peer: PeerId, envs: Iterable[Envelope]) -> None:
        """``peer`` pushed us ``envs``: it holds them too (if we heard from it before)."""
        if peer in self.known:
            self.heard(peer, self.known[peer], envs)

    def lacking(self, applied: Sequence[Envelope], via: PeerId | None) -> list[PeerId]:
        """The replica peers (besides ``via``, which brought them) known to lack some of the
        envelopes ``applied``: pub-sub carries only what authors publish, so without passing these
        on, what one side of a healed partition learns from the other would wait for the timer."""
        return [
            peer
            for peer, known in self.known.items()
            if peer != via and any(known.get(e.chain, 0) < e.seq for e in applied)
        ]
