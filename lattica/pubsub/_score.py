"""Peer scores for the pub-sub router: what each neighbour did for us, as one number.

Sans-IO, as the router: the router reports events (a peer joined or left a topic mesh, delivered
a message first or forwarded one it did not get from us, sent an invalid message, misbehaved),
calls ``decay`` once a heartbeat, and asks ``score(peer)``. The terms follow GossipSub v1.1's:

- P1 time in the mesh (a little credit per second, capped);
- P2 first deliveries (credit for messages we heard from the peer first, decaying, capped);
- P3 mesh deliveries: a mesh peer must forward a share of the topic's messages to us, counting
  only copies that cannot be echoes of ours (the router decides). The share expected is
  ``forward_ratio`` of the topic's messages we saw while the peer was in the mesh, so a quiet
  topic costs nobody anything; the penalty is the squared shortfall as a fraction of that share
  (0 to 1, whatever the message rate) times the weight, so a peer that forwards nothing costs
  ``mesh_deliveries_weight`` and one a little short almost nothing (its first deliveries make up
  for it); a peer pruned while short keeps it as P3b (sticky, decaying). This is the term
  against peers that take messages and never pass them on;
- P4 invalid messages (squared, decaying);
- P6 many peers from one IP address (squared excess over a threshold; loopback exempt);
- P7 protocol misbehaviour (GRAFT during a backoff, IWANT promises not kept; squared, decaying).

Topic terms are summed with the topic's weight and capped at ``topic_cap``; a peer's stats
outlive its connection for ``retain`` seconds, so reconnecting does not wash a bad score.
"""

from __future__ import annotations

from collections.abc import Hashable
from dataclasses import dataclass, field

__all__ = ["ScoreParams", "TopicScoreParams", "PeerScore"]


@dataclass(frozen=True)
class TopicScoreParams:
    """The topic terms (see the module docstring); weights per unit of each term."""

    weight: float = 1.0
    time_in_mesh_weight: float = 1 / 360  # per second in the mesh: +10 after an hour
    time_in_mesh_cap: float = 3600.0
    first_deliveries_weight: float = 0.5
    first_deliveries_cap: float = 20.0
    first_deliveries_decay: float = 0.9  # per decay interval
    mesh_deliveries_weight: float = -25.0  # times the squared shortfall (a fraction of the expected share)
    # of the topic's messages a mesh peer forwards to us: honest ones, 5-90 % (fewer where
    # authors flood their messages to most nodes at once); silent ones, only their own
    forward_ratio: float = 0.05
    mesh_deliveries_min: float = 20.0  # topic messages seen before the term counts
    mesh_deliveries_activation: float = 5.0  # seconds in the mesh before the term counts
    mesh_deliveries_decay: float = 0.97
    mesh_failure_weight: float = -25.0  # P3b, per unit of squared shortfall carried out of the mesh
    mesh_failure_decay: float = 0.97
    invalid_weight: float = -10.0  # times the squared count
    invalid_decay: float = 0.99


@dataclass(frozen=True)
class ScoreParams:
    """The router's scoring and the thresholds that act on it."""

    topic: TopicScoreParams = field(default_factory=TopicScoreParams)
    topics: dict[str, TopicScoreParams] = field(default_factory=dict)  # per-topic overrides
    topic_cap: float = 20.0  # the most all topic terms together may add
    ip_colocation_weight: float = -5.0  # times the squared excess
    ip_colocation_threshold: int = 8
    behaviour_weight: float = -10.0  # times the squared count
    behaviour_decay: float = 0.98
    decay_to_zero: float = 0.01
    retain: float = 600.0  # seconds a departed peer's stats are kept
    retained_max: int = 10_000
    # thresholds (0 > gossip > publish > graylist)
    gossip_threshold: float = -10.0  # below: no gossip to or from the peer
    publish_threshold: float = -50.0  # below: our own messages are not flooded to it
    graylist_threshold: float = -80.0  # below: everything it sends is ignored


class _TopicStats:
    __slots__ = ("in_mesh", "grafted_at", "first", "mesh_got", "mesh_seen", "failure", "invalid")

    def __init__(self) -> None:
        self.in_mesh = False
        self.grafted_at = 0.0
        self.first = 0.0
        self.mesh_got = 0.0  # forwarded to us (not echoes) while in the mesh
        self.mesh_seen = 0.0  # the topic's messages we saw meanwhile
        self.failure = 0.0
        self.invalid = 0.0


class _PeerStats:
    __slots__ = ("topics", "behaviour", "ip", "connected", "left_at")

    def __init__(self) -> None:
        self.topics: dict[str, _TopicStats] = {}
        self.behaviour = 0.0
        self.ip: str | None = None
        self.connected = True
        self.left_at = 0.0


class PeerScore:
    """The scores of the router's peers (see the module docstring)."""

    def __init__(self, params: ScoreParams | None = None) -> None:
        self.params = params or ScoreParams()
        self._peers: dict[Hashable, _PeerStats] = {}
        self._by_ip: dict[str, set[Hashable]] = {}

    # -- events ---------------------------------------------------------------------------------

    def connected(self, peer: Hashable, ip: str | None = None) -> None:
        st = self._peers.get(peer)
        if st is None:
            st = self._peers[peer] = _PeerStats()
        st.connected = True
        if ip is not None and st.ip is None and ip not in ("127.0.0.1", "::1"):
            st.ip = ip
            self._by_ip.setdefault(ip, set()).add(peer)

    def disconnected(self, peer: Hashable, now: float) -> None:
        st = self._peers.get(peer)
        if st is None:
            return
        for topic in [t for t, ts in st.topics.items() if ts.in_mesh]:
            self.pruned(peer, topic)
        st.connected = False
        st.left_at = now
        if st.ip is not None:
            members = self._by_ip.get(st.ip)
            if members is not None:
                members.discard(peer)
                if not members:
                    del self._by_ip[st.ip]
        self._trim(now)

    def grafted(self, peer: Hashable, topic: str, now: float) -> None:
        ts = self._topic(peer, topic)
        if ts is not None and not ts.in_mesh:
            ts.in_mesh, ts.grafted_at = True, now
            ts.mesh_got = ts.mesh_seen = 0.0

    def pruned(self, peer: Hashable, topic: str) -> None:
        st = self._peers.get(peer)
        ts = st.topics.get(topic) if st is not None else None
        if ts is None or not ts.in_mesh:
            return
        deficit = self._deficit(ts, self._tp(topic), None)
        if deficit > 0:
            ts.failure += deficit * deficit
        ts.in_mesh = False

    def first_delivery(self, peer: Hashable, topic: str) -> None:
        ts = self._topic(peer, topic)
        if ts is not None:
            ts.first = min(ts.first + 1, self._tp(topic).first_deliveries_cap)

    def forwarded(self, peer: Hashable, topic: str) -> None:
        """``peer`` sent us a message of ``topic`` that we had not sent it (first or not)."""
        ts = self._topic(peer, topic)
        if ts is not None and ts.in_mesh:
            ts.mesh_got += 1

    def topic_message(self, topic: str, mesh: set) -> None:
        """A new valid message of ``topic`` reached us: every peer in our mesh could forward it."""
        for peer in mesh:
            st = self._peers.get(peer)
            ts = st.topics.get(topic) if st is not None else None
            if ts is not None and ts.in_mesh:
                ts.mesh_seen += 1

    def invalid(self, peer: Hashable, topic: str) -> None:
        ts = self._topic(peer, topic)
        if ts is not None:
            ts.invalid += 1

    def misbehaved(self, peer: Hashable, count: float = 1.0) -> None:
        st = self._peers.get(peer)
        if st is not None:
            st.behaviour += count

    # -- the score ------------------------------------------------------------------------------

    def score(self, peer: Hashable, now: float) -> float:
        st = self._peers.get(peer)
        if st is None:
            return 0.0
        p = self.params
        topics = 0.0
        for topic, ts in st.topics.items():
            tp = self._tp(topic)
            s = 0.0
            if ts.in_mesh:
                s += min(now - ts.grafted_at, tp.time_in_mesh_cap) * tp.time_in_mesh_weight
                deficit = self._deficit(ts, tp, now)
                if deficit > 0:
                    s += deficit * deficit * tp.mesh_deliveries_weight
            s += ts.first * tp.first_deliveries_weight
            s += ts.failure * tp.mesh_failure_weight
            s += ts.invalid * ts.invalid * tp.invalid_weight
            topics += s * tp.weight
        total = min(topics, p.topic_cap)
        if st.ip is not None:
            excess = len(self._by_ip.get(st.ip, ())) - p.ip_colocation_threshold
            if excess > 0:
                total += excess * excess * p.ip_colocation_weight
        total += st.behaviour * st.behaviour * p.behaviour_weight
        return total

    def decay(self, now: float) -> None:
        """Once a heartbeat: counters fade (a peer's past weighs less and less)."""
        zero = self.params.decay_to_zero
        b = self.params.behaviour_decay
        for st in self._peers.values():
            st.behaviour = _fade(st.behaviour, b, zero)
            for topic, ts in st.topics.items():
                tp = self._tp(topic)
                ts.first = _fade(ts.first, tp.first_deliveries_decay, zero)
                ts.mesh_got *= tp.mesh_deliveries_decay
                ts.mesh_seen *= tp.mesh_deliveries_decay
                ts.failure = _fade(ts.failure, tp.mesh_failure_decay, zero)
                ts.invalid = _fade(ts.invalid, tp.invalid_decay, zero)
        self._trim(now)

    def in_deficit(self, peer: Hashable, topic: str, now: float) -> bool:
        st = self._peers.get(peer)
        ts = st.topics.get(topic) if st is not None else None
        return ts is not None and ts.in_mesh and self._deficit(ts, self._tp(topic), now) > 0

    # -- inside ---------------------------------------------------------------------------------

    def _tp(self, topic: str) -> TopicScoreParams:
        return self.params.topics.get(topic, self.params.topic)

    def _topic(self, peer: Hashable, topic: str) -> _TopicStats | None:
        st = self._peers.get(peer)
        if st is None:
            return None
        ts = st.topics.get(topic)
        if ts is None:
            ts = st.topics[topic] = _TopicStats()
        return ts

    @staticmethod
    def _deficit(ts: _TopicStats, tp: TopicScoreParams, now: float | None) -> float:
        if now is not None and now - ts.grafted_at < tp.mesh_deliveries_activation:
            return 0.0
        if ts.mesh_seen < tp.mesh_deliveries_min:
            return 0.0
        return max(0.0, 1.0 - ts.mesh_got / (tp.forward_ratio * ts.mesh_seen))

    def _trim(self, now: float) -> None:
        p = self.params
        gone = [peer for peer, st in self._peers.items() if not st.connected and now - st.left_at > p.retain]
        for peer in gone:
            del self._peers[peer]
        if len(self._peers) > p.retained_max:
            departed = sorted(
                (st.left_at, i, peer) for i, (peer, st) in enumerate(self._peers.items()) if not st.connected
            )
            for _, _, peer in departed[: len(self._peers) - p.retained_max]:
                del self._peers[peer]


def _fade(value: float, factor: float, zero: float) -> float:
    value *= factor
    return 0.0 if abs(value) < zero else value
