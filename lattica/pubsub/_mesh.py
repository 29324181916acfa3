"""The router's meshes (``lattica.pubsub._router``): GRAFT and PRUNE, and their upkeep on the
heartbeat.

Per joined topic, D peers we forward every message to; kept between D_lo and D_hi on the
heartbeat, the best-scoring D_score kept when trimming, peers with a negative score pruned; a
mesh whose peers' median score is low gets better ones now and then (opportunistic grafting).
GRAFT asks to enter a peer's mesh, PRUNE leaves it with a backoff; a GRAFT during the backoff is
misbehaviour (scored) and refused. The fanout of a topic we publish to without joining it is
kept at D peers above the publish threshold until ``fanout_ttl`` after the last publish.
"""

from __future__ import annotations

import random
from collections.abc import Hashable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from lattica.pubsub._router import GossipParams, Rpc
    from lattica.pubsub._score import PeerScore

__all__ = ["Meshes"]


class Meshes:
    """The router's part that keeps its meshes (see the module docstring)."""

    if TYPE_CHECKING:  # (the router's, read here)
        p: GossipParams
        rng: random.Random
        scores: PeerScore
        peers: dict[Hashable, set[str]]
        topics: dict[str, set[Hashable]]
        mesh: dict[str, set[Hashable]]
        fanout: dict[str, set[Hashable]]
        _fanout_used: dict[str, float]
        _ticks: int
        _race: dict[tuple[Hashable, str], list]

        def _out(self, peer: Hashable) -> Rpc: ...
        def _score(self, peer: Hashable, now: float) -> float: ...
        def _member(self, peer: Hashable, topic: str) -> None: ...
        def _unmesh(self, peer: Hashable, topic: str) -> None: ...

    def __init__(self) -> None:
        super().__init__()
        self._backoff: dict[tuple[Hashable, str], float] = {}  # (peer, topic) -> until when it may not be grafted

    def _on_graft(self, peer: Hashable, topic: str, now: float) -> None:
        mesh = self.mesh.get(topic)
        if mesh is None or peer in mesh:
            return  # (a topic we did not join: it learns that from our subscriptions)
        until = self._backoff.get((peer, topic))
        if until is not None and now < until:
            self.scores.misbehaved(peer)  # grafting while told to back off
            self._prune(peer, topic, now, self.p.prune_backoff, known=False)
            return
        self._member(peer, topic)  # (a GRAFT says it joined: its batch saying so may be still on the way)
        if self._score(peer, now) < 0 or len(mesh) >= self.p.d_hi or topic not in self.peers[peer]:
            self._prune(peer, topic, now, self.p.prune_backoff, known=False)
            return
        mesh.add(peer)
        self._race[(peer, topic)] = [0, 0, 0.0]
        self.scores.grafted(peer, topic, now)

    def _on_prune(self, peer: Hashable, topic: str, backoff: float, now: float) -> None:
        if topic not in self.mesh:
            return  # a backoff for a topic we did not join would only take memory
        self._unmesh(peer, topic)
        mesh = self.mesh.get(topic)
        if mesh is not None and peer in mesh:
            mesh.discard(peer)
            self.scores.pruned(peer, topic)
        wait = min(max(float(backoff) if isinstance(backoff, (int, float)) else 0.0, 0.0), 3600.0)
        self._backoff[(peer, topic)] = max(
            self._backoff.get((peer, topic), 0.0), now + max(wait, self.p.unsubscribe_backoff)
        )

    def _maintain(self, topic: str, mesh: set, now: float) -> None:
        p = self.p
        for peer in [q for q in mesh if self._score(q, now) < 0]:
            mesh.discard(peer)
            self._prune(peer, topic, now, p.prune_backoff)
        if len(mesh) < p.d_lo:
            for peer in self._candidates(topic, p.d - len(mesh), now, exclude=mesh, min_score=0.0):
                mesh.add(peer)
                self._graft(peer, topic, now)
        if len(mesh) > p.d_hi:
            ranked = sorted(mesh, key=lambda q: self._score(q, now), reverse=True)
            keep = ranked[: p.d_score]
            rest = ranked[p.d_score :]
            self.rng.shuffle(rest)
            keep += rest[: p.d - len(keep)]
            for peer in set(mesh) - set(keep):
                mesh.discard(peer)
                self._prune(peer, topic, now, p.prune_backoff)
        # a mesh of peers that all forward too little gets better ones by the scores' median
        if self._ticks % p.opportunistic_graft_ticks == 0 and len(mesh) > 1:
            scores = sorted(self._score(q, now) for q in mesh)
            if scores[len(scores) // 2] < p.opportunistic_graft_threshold:
                median = scores[len(scores) // 2]
                better = [
                    q
                    for q in self._candidates(topic, len(self.topics.get(topic, ())), now, exclude=mesh, min_score=0.0)
                    if self._score(q, now) > median
                ]
                for peer in better[: p.opportunistic_graft_peers]:
                    mesh.add(peer)
                    self._graft(peer, topic, now)

    def _keep_fanout(self, now: float) -> None:
        """At the heartbeat: fanouts unused for ``fanout_ttl`` go, the others keep D peers above
        the publish threshold."""
        for topic in list(self.fanout):
            if now - self._fanout_used.get(topic, 0.0) > self.p.fanout_ttl:
                del self.fanout[topic]
                self._fanout_used.pop(topic, None)
                continue
            fan = self.fanout[topic]
            limit = self.scores.params.publish_threshold
            fan.intersection_update(p for p in self.topics.get(topic, ()) if self._score(p, now) >= limit)
            fan.update(self._candidates(topic, self.p.d - len(fan), now, exclude=fan, min_score=limit))

    def _expire_backoff(self, now: float) -> None:
        if len(self._backoff) > 0:
            self._backoff = {k: v for k, v in self._backoff.items() if v > now}

    def _candidates(self, topic: str, n: int, now: float, exclude: set, min_score: float) -> list[Hashable]:
        if n <= 0:
            return []
        pool = [
            q
            for q in self.topics.get(topic, ())
            if q not in exclude and self._score(q, now) >= min_score and self._backoff.get((q, topic), 0.0) <= now
        ]
        return pool if len(pool) <= n else self.rng.sample(pool, n)

    def _graft(self, peer: Hashable, topic: str, now: float) -> None:
        self._race[(peer, topic)] = [0, 0, 0.0]
        self.scores.grafted(peer, topic, now)
        self._out(peer).graft.append(topic)

    def _prune(self, peer: Hashable, topic: str, now: float, backoff: float, known: bool = True) -> None:
        self._unmesh(peer, topic)
        if known:
            self.scores.pruned(peer, topic)
        self._backoff[(peer, topic)] = now + backoff
        self._out(peer).prune.append((topic, backoff))
