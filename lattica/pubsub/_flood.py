"""The router's flood publishing and flood sets (``lattica.pubsub._router``).

Our own messages are flooded to every peer of the topic whose score is above the publish
threshold (flood publishing); to a topic we did not join they go to its fanout, D peers of the
topic kept for ``fanout_ttl`` after the last publish. The author may name the peers it flooded
a message to (``flood_set``: 8-byte tags of their PeerIds, which the glue signs with the
message). Those peers have the author's copy, so a forwarder does not send it to them; it names
the id to them in its heartbeats' IHAVE instead (while gossip would, and while it is cached), so
an author that names a peer it never sent to only delays that peer by a heartbeat.
"""

from __future__ import annotations

import random
from collections import OrderedDict
from collections.abc import Hashable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from lattica.pubsub._router import Envelope, GossipParams, Rpc
    from lattica.pubsub._score import PeerScore
    from lattica.pubsub._seen import Seen

__all__ = ["FloodSets"]


class FloodSets:
    """The router's part that floods our messages and spares the peers an author named (see the
    module docstring)."""

    if TYPE_CHECKING:  # (the router's, read here)
        p: GossipParams
        rng: random.Random
        scores: PeerScore
        peers: dict[Hashable, set[str]]
        topics: dict[str, set[Hashable]]
        mesh: dict[str, set[Hashable]]
        fanout: dict[str, set[Hashable]]
        _fanout_used: dict[str, float]
        _tags: dict[Hashable, bytes | None]
        _seen: OrderedDict[bytes, Seen]
        _mcache: dict[bytes, Envelope]

        def _out(self, peer: Hashable) -> Rpc: ...
        def _score(self, peer: Hashable, now: float) -> float: ...
        def _candidates(self, topic: str, n: int, now: float, exclude: set, min_score: float) -> list[Hashable]: ...

    def __init__(self) -> None:
        super().__init__()
        # ids we did not forward to mesh peers the author named, to name in their IHAVE: per
        # heartbeat window (the last ``history_gossip``), peer -> topic -> [ids seen, ids sampled]
        self._later: list[dict[Hashable, dict[str, list]]] = [{}]
        self._planned: tuple[str, float, set] | None = None  # the last flood set's topic, time and peers

    def flood_set(self, topic: str, now: float) -> frozenset[bytes]:
        """The tags of the peers a message we published to ``topic`` now would be flooded to,
        for the author to sign with it (empty when flood publishing is off, or when they are more
        than ``max_flood_set``: forwarders then send it to all their mesh peers, as without one)."""
        if not self.p.flood_publish:
            return frozenset()
        targets = self._publish_targets(topic, now)
        self._planned = (topic, now, targets)  # (what ``publish`` then sends to: the peers the set names)
        if len(targets) > self.p.max_flood_set:
            return frozenset()
        tags = self._tags
        return frozenset(t for p in targets if (t := tags.get(p)) is not None)

    def _publish_targets(self, topic: str, now: float) -> set:
        limit = self.scores.params.publish_threshold
        if topic not in self.mesh:
            fan = self.fanout.get(topic)
            if fan is None:
                fan = self.fanout[topic] = set(self._candidates(topic, self.p.d, now, exclude=set(), min_score=limit))
            self._fanout_used[topic] = now
            targets = set(fan)
        else:
            targets = set(self.mesh[topic])
        if self.p.flood_publish:
            targets.update(p for p in self.topics.get(topic, ()) if self._score(p, now) >= limit)
        return targets

    def _defer(self, peer: Hashable, topic: str, mid: bytes) -> None:
        """Name ``mid`` to ``peer`` in our next heartbeat's IHAVE (the author said it sent it).
        Beyond ``max_ihave_length`` ids a heartbeat, a uniform sample of them is kept (reservoir
        sampling), so a burst of messages cannot choose which ones go unnamed."""
        topics = self._later[0].setdefault(peer, {})
        slot = topics.get(topic)
        if slot is None:
            slot = topics[topic] = [0, []]
        slot[0] += 1
        ids = slot[1]
        if len(ids) < self.p.max_ihave_length:
            ids.append(mid)
        else:
            k = self.rng.randrange(slot[0])
            if k < len(ids):
                ids[k] = mid

    def _name_spared(self, now: float) -> None:
        """At the heartbeat: what we spared mesh peers the author named, named to them like
        gossip, for as many windows, but only what they have not sent us or said they have, and
        what we can still send when asked (an IWANT we cannot answer would cost us)."""
        p = self.p
        limit = self.scores.params.gossip_threshold
        later: dict[Hashable, dict[str, list[bytes]]] = {}
        for spared in self._later:
            for peer, topics in spared.items():
                for topic, (_, ids) in topics.items():
                    later.setdefault(peer, {}).setdefault(topic, []).extend(ids)
        self._later.insert(0, {})
        del self._later[p.history_gossip :]
        seen, cached = self._seen, self._mcache
        for peer, topics in later.items():
            if peer in self.peers and self._score(peer, now) >= limit:
                for topic, ids in topics.items():
                    ids = [
                        m
                        for m in ids
                        if m in cached and ((e := seen.get(m)) is None or (peer not in e.have and peer not in e.told))
                    ]
                    if len(ids) > p.max_ihave_length:
                        ids = self.rng.sample(ids, p.max_ihave_length)
                    if ids:
                        self._out(peer).ihave.append((topic, ids))
