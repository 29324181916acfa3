"""The pub-sub router: GossipSub v1.1's rules as a sans-IO state machine.

The glue tells it what happened (``add_peer``, ``remove_peer``, ``on_rpc`` with a peer's batch,
``validated`` with the verdict on a message it handed out, ``heartbeat`` once a second) and what
the node wants (``join``, ``leave``, ``publish``); it answers through three queues the glue
drains after every call: ``take_outgoing()`` (a batch per peer), ``take_to_validate()`` (new
messages: check the signature and run the topic's validators, then report ``validated``) and
``take_delivered()`` (accepted messages of the topics we joined). It never reads a clock nor
touches a socket, so hundreds of routers run in one process in a simulation.

The rules, in short (names as in the GossipSub v1.1 specification):

- **Meshes**: per joined topic, D peers we forward every message to; kept between D_lo and D_hi
  on the heartbeat, the best-scoring D_score kept when trimming, peers with a negative score
  pruned. GRAFT asks to enter a peer's mesh, PRUNE leaves it with a backoff; a GRAFT during the
  backoff is misbehaviour (scored) and refused.
- **Fanout**: publishing to a topic we did not join goes to D peers of the topic, kept for
  ``fanout_ttl`` after the last publish. Our own messages are flooded to every peer of the topic
  whose score is above the publish threshold (flood publishing).
- **Flood sets**: the author may name the peers it flooded a message to (``flood_set``: 8-byte
  tags of their PeerIds, which the glue signs with the message). Those peers have the author's
  copy, so a forwarder does not send it to them; it names the id to them in its heartbeats'
  IHAVE instead (while gossip would, and while it is cached), so an author that names a peer it
  never sent to only delays that peer by a heartbeat. A peer named in the set expects no forwards of that message from its mesh (the
  score's P3 does not count it).
- **Gossip**: on the heartbeat, IHAVE with the ids of the last ``history_gossip`` windows of
  messages goes to D_lazy (or ``gossip_factor`` of the) other peers of each topic; they answer
  IWANT for what they miss. An IWANT we send is a promise: the message not delivered within
  ``iwant_followup`` costs the peer (P7). IHAVEs per peer per heartbeat and ids asked are capped.
- **Choking**: a mesh peer whose copies keep coming after others' is asked to send only IHAVE
  (announced at once, fetched with IWANT when we lack the message), so about ``d_eager`` full
  copies of each message arrive while the mesh stays D wide; IDONTWANT (v1.2) tells the mesh a
  message arrived before we validated it.
- **Seen cache**: message ids (author, sequence number and a digest of data and signature) for
  ``seen_ttl``, at most ``seen_max``; a message is forwarded at most once, never back to a peer
  that sent it to us; messages of topics we did not join are dropped unremembered. When an
  accepted message leaves the cache, its author's **floor** rises to its sequence number: that
  author's messages at or below it are dropped unseen, so a flood that pushes the cache's
  entries out (however many authors it is signed by) opens no window to replay what was
  forgotten. Floors are kept for ``max_floors`` authors, only of accepted messages (whose
  authors the glue vouched for).
- **Validation**: a new message is forwarded and delivered only after the glue accepted it;
  rejected ones count against every peer that sent them (P4); ignored ones are just dropped.
- **Scores** (``lattica.pubsub.score``): below ``gossip_threshold`` no gossip to or from a
  peer, below ``publish_threshold`` none of our messages, below ``graylist_threshold`` nothing
  it sends is looked at.
- **Bounds**: topics a peer may announce, message size, seen cache, message cache, IHAVE/IWANT
  per heartbeat; per-peer outbound queues belong to the glue (gossip is dropped first).
"""

from __future__ import annotations

import random
from collections import OrderedDict, deque
from collections.abc import Callable, Hashable
from dataclasses import dataclass, field
from typing import Any

from lattica.pubsub.score import PeerScore, ScoreParams

__all__ = ["Envelope", "Rpc", "GossipParams", "Router", "flood_tag", "ACCEPT", "REJECT", "IGNORE"]

ACCEPT, REJECT, IGNORE = "accept", "reject", "ignore"


@dataclass(frozen=True, slots=True)
class Envelope:
    """One published message: ``data`` is opaque to the router (the glue's: bytes, or what the
    glue makes of them, with ``size`` its length in bytes); the signature is checked by the glue.

    Its ``id`` is the author, the seqno and 8 bytes of ``digest``, which the glue gives (it must
    cover everything the signature does, and the signature) or which is sha2-256 over the data
    and signature: a copy that differs in anything is another message, so a junk copy sent first
    under an honest message's author and seqno can neither pre-empt it nor get it refused."""

    topic: str
    author: bytes
    seqno: int
    data: Any
    signature: bytes = b""
    digest: bytes | None = field(default=None, repr=False, compare=False)
    size: int = field(default=-1, repr=False, compare=False)
    flooded: frozenset[bytes] = field(
        default=frozenset(), repr=False, compare=False
    )  # the author's flood set (signed with it)
    id: bytes = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        digest = self.digest
        if digest is None:
            h = (_SHA256 or _sha256())(self.data)
            h.update(self.signature)
            digest = h.digest()
        if self.size < 0:
            object.__setattr__(self, "size", len(self.data))
        object.__setattr__(self, "id", self.author + self.seqno.to_bytes(8, "big") + digest[:8])


@dataclass(slots=True)
class Rpc:
    """One batch between two routers: subscription changes, messages and control."""

    subscribe: list[tuple[str, bool]] = field(default_factory=list)
    messages: list[Envelope] = field(default_factory=list)
    ihave: list[tuple[str, list[bytes]]] = field(default_factory=list)
    iwant: list[bytes] = field(default_factory=list)
    graft: list[str] = field(default_factory=list)
    prune: list[tuple[str, float]] = field(default_factory=list)  # (topic, backoff seconds)
    idontwant: list[bytes] = field(default_factory=list)
    choke: list[str] = field(default_factory=list)  # send me only IHAVE for this topic's messages
    unchoke: list[str] = field(default_factory=list)

    def __bool__(self) -> bool:
        return bool(
            self.subscribe
            or self.messages
            or self.ihave
            or self.iwant
            or self.graft
            or self.prune
            or self.idontwant
            or self.choke
            or self.unchoke
        )


@dataclass(frozen=True)
class GossipParams:
    """The router's parameters (GossipSub v1.1's names and defaults where it has them)."""

    d: int = 6
    d_lo: int = 4
    d_hi: int = 12
    d_score: int = 4
    d_lazy: int = 6
    gossip_factor: float = 0.25
    heartbeat: float = 1.0
    fanout_ttl: float = 60.0
    history_length: int = 5
    history_gossip: int = 3
    seen_ttl: float = 120.0
    seen_max: int = 100_000
    prune_backoff: float = 60.0
    unsubscribe_backoff: float = 10.0
    max_ihave_length: int = 5000  # ids we ask one peer for per heartbeat
    max_ihave_messages: int = 10  # IHAVE batches we look at per peer per heartbeat
    max_iwant_ids: int = 500  # ids of one IWANT we answer
    iwant_followup: float = 3.0
    gossip_retransmission: int = 3  # times one peer gets one message through IWANT
    opportunistic_graft_ticks: int = 60
    opportunistic_graft_peers: int = 2
    opportunistic_graft_threshold: float = 1.0
    max_topics_per_peer: int = 256
    max_floors: int = 50_000  # authors whose forgotten messages we still refuse to see again
    max_message_bytes: int = 1 << 20
    mcache_bytes: int = 64 << 20  # messages kept for IWANTs (history_length heartbeats, the oldest dropped beyond)
    max_idontwant: int = 1000  # IDONTWANT ids we keep per peer per heartbeat
    idontwant_min_bytes: int = 1024  # smaller messages cost about what their IDONTWANTs would
    near_first_window: float = 0.001  # a peer's round trip until the glue measured it (see the score's P3)
    flood_publish: bool = True
    max_flood_set: int = 64  # peers an author names in a message's flood set (more: it names none)
    # choking: mesh peers whose copies keep arriving after someone else's send us only IHAVE,
    # so about d_eager copies of each message arrive instead of one per mesh peer
    d_eager: int = 3
    d_eager_min: int = 2
    choke_after: int = 20  # messages of the topic seen before the slowest eager peer may be choked

    def __post_init__(self) -> None:
        if not (0 < self.d_lo <= self.d <= self.d_hi and 0 <= self.d_score <= self.d):
            raise ValueError("pub-sub degrees must satisfy 0 < d_lo <= d <= d_hi and d_score <= d")
        if not 0 < self.history_gossip <= self.history_length:
            raise ValueError("history_gossip must be between 1 and history_length")


_PENDING, _ACCEPTED, _REJECTED, _IGNORED = range(4)


_NOBODY: frozenset = frozenset()


class _Seen:
    """What we know of one message id. Its sets of peers start as one shared empty set and
    become a set of their own at their first peer: the cache holds up to ``seen_max`` entries,
    most of which never name anyone (a third of the memory per entry, and a flood's worth)."""

    __slots__ = ("at", "state", "topic", "source", "have", "sent_to", "told", "flooded")

    def __init__(self, at: float, topic: str, source: Hashable | None) -> None:
        self.at = at
        self.state = _PENDING
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


class Router:
    """One node's pub-sub router (see the module docstring)."""

    def __init__(
        self,
        me: Hashable,
        params: GossipParams | None = None,
        score: ScoreParams | None = None,
        rng: random.Random | None = None,
        peer_bytes: Callable[[Hashable], bytes | None] | None = None,
    ) -> None:
        """``peer_bytes``: the bytes a peer handle signs as (its PeerId's); by default the handle
        itself when it is bytes, else its ``to_bytes()``."""
        self.me = me
        self.p = params or GossipParams()
        self._peer_bytes = peer_bytes or _author_of
        self._tags: dict[Hashable, bytes | None] = {}  # peer -> its flood tag
        self._my_tag = flood_tag(self._peer_bytes(me))
        # ids we did not forward to mesh peers the author named, to name in their IHAVE: per
        # heartbeat window (the last ``history_gossip``), peer -> topic -> [ids seen, ids sampled]
        self._later: list[dict[Hashable, dict[str, list]]] = [{}]
        self._planned: tuple[str, float, set] | None = (
            None  # the last flood set's topic, time and peers  # ids we did not forward to mesh peers the author named: told at the heartbeat
        )
        self.scores = PeerScore(score)
        self.rng = rng or random.Random()
        self.peers: dict[Hashable, set[str]] = {}  # peer -> topics it joined
        self.topics: dict[str, set[Hashable]] = {}  # topic -> peers that joined it
        self.mesh: dict[str, set[Hashable]] = {}  # the topics we joined -> our mesh in each
        self.fanout: dict[str, set[Hashable]] = {}
        self._fanout_used: dict[str, float] = {}
        self._backoff: dict[tuple[Hashable, str], float] = {}
        self._seen: OrderedDict[bytes, _Seen] = OrderedDict()
        self._floors: OrderedDict[bytes, int] = (
            OrderedDict()
        )  # author -> highest seqno of its accepted messages the cache forgot
        self._mcache: dict[bytes, Envelope] = {}
        self._mcache_bytes = 0
        self._windows: list[deque[bytes]] = [deque()]
        self._iwant_served: dict[tuple[Hashable, bytes], int] = {}
        self._ihaves_heard: dict[Hashable, int] = {}
        self._asked: dict[Hashable, int] = {}
        self._promises: dict[bytes, tuple[Hashable, float]] = {}
        self._offered: dict[bytes, list[Hashable]] = {}  # ids asked of one peer -> other peers that have them
        self._outbox: dict[Hashable, Rpc] = {}
        self._to_validate: list[tuple[Envelope, Hashable]] = []
        self._delivered: list[Envelope] = []
        self._messages: dict[bytes, Envelope] = {}  # pending validation
        self._dont: OrderedDict[bytes, set[Hashable]] = OrderedDict()  # ids peers told us not to send, not seen yet
        self._dont_heard: dict[Hashable, int] = {}
        self._rtt: dict[Hashable, float] = {}
        self._choked_by: set[tuple[Hashable, str]] = set()  # (peer, topic): it asked us for IHAVE only
        self._choking: set[tuple[Hashable, str]] = set()  # (peer, topic): we asked it for IHAVE only
        self._race: dict[
            tuple[Hashable, str], list
        ] = {}  # (mesh peer, topic) -> [firsts, later copies, their summed lateness]
        self._announce: dict[Hashable, dict[str, list[bytes]]] = {}  # eager IHAVEs to choked peers, this flush
        self._ticks = 0

    # -- the node's side ------------------------------------------------------------------------

    def add_peer(self, peer: Hashable, now: float, ip: str | None = None, rtt: float | None = None) -> None:
        """A peer that speaks pub-sub is connected: tell it our topics. ``ip`` (for the score's
        colocation term) and ``rtt`` (seconds; tells its forwarded copies from echoes of ours)
        when the glue knows them."""
        if peer == self.me or peer in self.peers:
            return
        self.peers[peer] = set()
        self._tags[peer] = flood_tag(self._peer_bytes(peer))
        if rtt is not None:
            self._rtt[peer] = rtt
        self.scores.connected(peer, ip)
        if self.mesh:
            self._out(peer).subscribe.extend((t, True) for t in self.mesh)

    def set_rtt(self, peer: Hashable, rtt: float) -> None:
        """The peer's round trip, when the glue measured it after ``add_peer``."""
        if peer in self.peers:
            self._rtt[peer] = rtt

    def remove_peer(self, peer: Hashable, now: float) -> None:
        topics = self.peers.pop(peer, None)
        if topics is None:
            return
        for topic in topics:
            self._forget_member(peer, topic)
        self.scores.disconnected(peer, now)
        self._outbox.pop(peer, None)
        self._tags.pop(peer, None)
        for window in self._later:
            window.pop(peer, None)
        self._rtt.pop(peer, None)
        self._dont_heard.pop(peer, None)
        self._ihaves_heard.pop(peer, None)
        self._asked.pop(peer, None)

    def join(self, topic: str, now: float) -> None:
        """Subscribe: announce it, and build a mesh (from the fanout first, as the spec says)."""
        if topic in self.mesh:
            return
        mesh = self.fanout.pop(topic, set())
        self._fanout_used.pop(topic, None)
        mesh = {p for p in mesh if self._score(p, now) >= 0}
        for peer in self._candidates(topic, self.p.d - len(mesh), now, exclude=mesh, min_score=0.0):
            mesh.add(peer)
        self.mesh[topic] = mesh
        for peer in self.peers:
            self._out(peer).subscribe.append((topic, True))
        for peer in mesh:
            self._graft(peer, topic, now)

    def leave(self, topic: str, now: float) -> None:
        mesh = self.mesh.pop(topic, None)
        if mesh is None:
            return
        for peer in self.peers:
            self._out(peer).subscribe.append((topic, False))
        for peer in mesh:
            self._prune(peer, topic, now, self.p.unsubscribe_backoff)

    def publish(self, msg: Envelope, now: float) -> int:
        """Send our own (signed) message: flooded to every peer of the topic above the publish
        threshold; delivered to ourselves if we joined the topic. Returns the peers sent to."""
        if msg.id in self._seen:
            return 0
        entry = self._remember(msg.id, now, msg.topic, None)
        entry.state = _ACCEPTED
        self._cache(msg)
        if msg.topic in self.mesh:
            self._delivered.append(msg)
        planned, self._planned = self._planned, None
        targets = (
            planned[2]
            if planned is not None and planned[:2] == (msg.topic, now)
            else self._publish_targets(msg.topic, now)
        )
        for peer in targets:
            self._out(peer).messages.append(msg)
        if targets:
            entry.sent_to = set(targets) | entry.sent_to  # (a set of its own: see _Seen)
        return len(targets)

    def topic_of(self, mid: bytes) -> str | None:
        """The topic of a message we have seen (None: not seen, or forgotten)."""
        entry = self._seen.get(mid)
        return entry.topic if entry is not None else None

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

    def reach(self, topic: str, now: float) -> int:
        """The peers a message we published to ``topic`` now would be sent to."""
        return len(self._publish_targets(topic, now))

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

    def validated(self, msg_id: bytes, verdict: str, now: float) -> None:
        """The glue's verdict on a message from ``take_to_validate``."""
        entry = self._seen.get(msg_id)
        msg = self._messages.pop(msg_id, None)
        if entry is None or msg is None or entry.state != _PENDING:
            return
        topic = entry.topic
        if verdict == ACCEPT:
            entry.state = _ACCEPTED
            self._cache(msg)
            if entry.source is not None:
                self.scores.first_delivery(entry.source, topic)
            mesh = self.mesh.get(topic, set())
            flooded = msg.flooded
            if flooded and self._my_tag in flooded:
                entry.flooded = True  # (our mesh peers were told not to forward it to us)
            else:
                self.scores.topic_message(topic, mesh)
                for peer in entry.have:
                    self.scores.forwarded(peer, topic)
            if topic in self.mesh:
                self._delivered.append(msg)
            author = msg.author
            pb = self._peer_bytes
            targets = [
                p for p in mesh if p not in entry.have and p not in entry.told and p != entry.source and pb(p) != author
            ]
            if flooded:
                tags = self._tags
                lazy = [p for p in targets if tags.get(p) in flooded]
                if lazy:
                    targets = [p for p in targets if p not in lazy]
                    for peer in lazy:
                        self._defer(peer, topic, msg.id)
            for peer in targets:
                if (peer, topic) in self._choked_by:
                    self._announce.setdefault(peer, {}).setdefault(topic, []).append(msg.id)
                else:
                    self._out(peer).messages.append(msg)
                    entry.sent(peer)
        elif verdict == REJECT:
            entry.state = _REJECTED
            for peer in entry.have:
                self.scores.invalid(peer, topic)
        else:
            entry.state = _IGNORED

    # -- a peer's batch -------------------------------------------------------------------------

    def on_rpc(self, peer: Hashable, rpc: Rpc, now: float) -> None:
        if peer not in self.peers:
            return
        if self._score(peer, now) < self.scores.params.graylist_threshold:
            return  # graylisted: nothing it says is looked at
        for topic, on in rpc.subscribe:
            if on:
                self._member(peer, topic)
            elif topic in self.peers[peer]:
                self.peers[peer].discard(topic)
                self._forget_member(peer, topic)
        for topic in rpc.choke:
            if peer in self.mesh.get(topic, ()):
                self._choked_by.add((peer, topic))
        for topic in rpc.unchoke:
            self._choked_by.discard((peer, topic))
        if rpc.idontwant:
            self._on_idontwant(peer, rpc.idontwant)
        for msg in rpc.messages:
            self._on_message(peer, msg, now)
        gossip_ok = self._score(peer, now) >= self.scores.params.gossip_threshold
        if rpc.ihave and self._choking:
            rpc.ihave = self._on_announce(peer, rpc.ihave, now)
        if gossip_ok and rpc.ihave:
            self._on_ihave(peer, rpc.ihave, now)
        if gossip_ok and rpc.iwant:
            self._on_iwant(peer, rpc.iwant, now)
        for topic in rpc.graft:
            self._on_graft(peer, topic, now)
        for topic, backoff in rpc.prune:
            self._on_prune(peer, topic, backoff, now)

    def _on_message(self, peer: Hashable, msg: Envelope, now: float) -> None:
        if type(msg) is not Envelope:
            return
        mid = msg.id
        promise = self._promises.get(mid)
        if promise is not None and promise[0] == peer:
            del self._promises[mid]
            self._offered.pop(mid, None)
        entry = self._seen.get(mid)
        race = self._race.get((peer, msg.topic))
        if race is not None:
            if entry is None:
                race[0] += 1
            else:
                race[1] += 1
                race[2] += now - entry.at
        if entry is not None:
            if peer in entry.have:
                return  # the same copy again from the same peer: no credit, no penalty twice
            entry.had_from(peer)
            if entry.state == _REJECTED:
                self.scores.invalid(peer, msg.topic)
            elif (
                entry.state == _ACCEPTED
                and not entry.flooded
                and (peer not in entry.sent_to or now - entry.at < self._rtt.get(peer, self.p.near_first_window))
            ):
                # it forwarded the message to us: it did not have it from us, or its copy came
                # sooner than an echo of ours could (a round trip after we first had it)
                self.scores.forwarded(peer, msg.topic)
            return
        if msg.size > self.p.max_message_bytes:
            if msg.topic in self.mesh:
                self.scores.invalid(peer, msg.topic)
            return
        floor = self._floors.get(msg.author)
        if floor is not None and msg.seqno <= floor:
            return  # older than what we forgot of its author: a replay, or a copy far too late
        mesh = self.mesh.get(msg.topic)
        if mesh is None:
            return  # not ours to check or pass on (a peer's fanout reached us): not even remembered
        entry = self._remember(mid, now, msg.topic, peer)
        entry.had_from(peer)
        self._messages[mid] = msg
        self._to_validate.append((msg, peer))
        if msg.size >= self.p.idontwant_min_bytes:  # (GossipSub v1.2) the mesh need not send it to us now
            for other in mesh:
                if other not in entry.have:
                    self._out(other).idontwant.append(mid)

    def _on_announce(self, peer: Hashable, ihave: list, now: float) -> list:
        """IHAVEs from a mesh peer we choked are its eager announcements: fetch what we miss at
        once (it was faster than our eager peers: a point for unchoking it) and credit it as
        forwarding; what is left is ordinary gossip."""
        rest = []
        for item in ihave:
            if (
                type(item) not in (tuple, list)
                or len(item) != 2
                or (peer, item[0]) not in self._choking
                or type(item[1]) is not list
            ):
                rest.append(item)
                continue
            topic, ids = item
            race = self._race.get((peer, topic))
            want = []
            for mid in ids[: self.p.max_ihave_length]:
                if type(mid) is not bytes:
                    continue
                entry = self._seen.get(mid)
                if entry is None:
                    if self._forgotten(mid):
                        continue
                    if mid not in self._promises:
                        want.append(mid)
                    else:
                        self._offer(mid, peer)
                    if race is not None:
                        race[0] += 1
                else:
                    if (
                        entry.state == _ACCEPTED
                        and not entry.flooded
                        and (
                            peer not in entry.sent_to or now - entry.at < self._rtt.get(peer, self.p.near_first_window)
                        )
                    ):
                        self.scores.forwarded(peer, topic)
                    if race is not None:
                        race[1] += 1
                        race[2] += now - entry.at
            room = self.p.max_iwant_ids - self._asked.get(peer, 0)
            want = want[: max(room, 0)]
            if want:
                self._asked[peer] = self._asked.get(peer, 0) + len(want)
                self._out(peer).iwant.extend(want)
                for mid in want:
                    self._promises[mid] = (peer, now + self.p.iwant_followup)
        return rest

    def _choose_eager(self, topic: str, mesh: set) -> None:
        """Once a heartbeat: choke the eager peer whose copies came first least often while more
        than d_eager are eager; unchoke the choked peer that came first most often when fewer
        than d_eager_min are, or when its announcements beat the eager peers."""
        p = self.p
        stats = {q: self._race.get((q, topic), [0, 0, 0.0]) for q in mesh}
        # eager peers that sent us anything lately: a peer that sends nothing is no reason to
        # choke one that does (the scores deal with it)
        eager = [q for q in mesh if (q, topic) not in self._choking and stats[q][0] + stats[q][1]]
        choked = [q for q in mesh if (q, topic) in self._choking]
        if len(eager) > p.d_eager:
            # the fewest firsts, then the latest copies on average
            ranked = sorted(
                (q for q in eager if stats[q][0] + stats[q][1] >= p.choke_after),
                key=lambda q: (stats[q][0] / (stats[q][0] + stats[q][1]), -stats[q][2] / max(stats[q][1], 1)),
            )
            slow = ranked[: len(eager) - p.d_eager]
            for q in slow:
                self._choking.add((q, topic))
                self._out(q).choke.append(topic)
                self._race[(q, topic)] = [0, 0, 0.0]
            if slow:
                return
        if choked:
            fast = max(choked, key=lambda q: (stats[q][0], -stats[q][1]))
            worst = min((stats[q][0] for q in eager), default=0)
            if len(eager) < p.d_eager_min or stats[fast][0] > max(worst, 2):
                self._choking.discard((fast, topic))
                self._out(fast).unchoke.append(topic)
                self._race[(fast, topic)] = [0, 0, 0.0]

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

    def _unmesh(self, peer: Hashable, topic: str) -> None:
        self._choked_by.discard((peer, topic))
        self._choking.discard((peer, topic))
        self._race.pop((peer, topic), None)

    def _on_idontwant(self, peer: Hashable, ids: list) -> None:
        heard = self._dont_heard.get(peer, 0)
        room = self.p.max_idontwant - heard
        if room <= 0:
            return
        ids = ids[:room]
        self._dont_heard[peer] = heard + len(ids)
        for mid in ids:
            if type(mid) is not bytes or len(mid) > 128:
                continue
            entry = self._seen.get(mid)
            if entry is not None:
                entry.was_told(peer)
                continue
            peers = self._dont.get(mid)
            if peers is None:
                peers = self._dont[mid] = set()
                if len(self._dont) > self.p.seen_max:
                    self._dont.popitem(last=False)
            peers.add(peer)

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

    def _on_ihave(self, peer: Hashable, ihave: list, now: float) -> None:
        heard = self._ihaves_heard.get(peer, 0) + 1
        self._ihaves_heard[peer] = heard
        if heard > self.p.max_ihave_messages:
            return
        room = min(self.p.max_ihave_length, self.p.max_iwant_ids) - self._asked.get(peer, 0)
        if room <= 0:
            return
        want: list[bytes] = []
        for item in ihave[: self.p.max_ihave_messages]:
            if type(item) not in (tuple, list) or len(item) != 2:
                continue
            topic, ids = item
            if topic not in self.mesh or type(ids) is not list:
                continue
            for mid in ids[: self.p.max_ihave_length]:
                if type(mid) is bytes and mid not in self._seen and not self._forgotten(mid):
                    if mid not in self._promises:
                        want.append(mid)
                    else:
                        self._offer(mid, peer)
        if not want:
            return
        if len(want) > room:
            want = self.rng.sample(want, room)
        self._asked[peer] = self._asked.get(peer, 0) + len(want)
        self._out(peer).iwant.extend(want)
        for mid in want:
            self._promises[mid] = (peer, now + self.p.iwant_followup)

    def _on_iwant(self, peer: Hashable, ids: list, now: float) -> None:
        out = None
        for mid in ids[: self.p.max_iwant_ids]:
            msg = self._mcache.get(mid) if type(mid) is bytes else None
            if msg is None:
                continue
            key = (peer, mid)
            n = self._iwant_served.get(key, 0)
            if n >= self.p.gossip_retransmission:
                continue
            self._iwant_served[key] = n + 1
            if out is None:
                out = self._out(peer)
            out.messages.append(msg)
            entry = self._seen.get(mid)
            if entry is not None:
                entry.sent(peer)

    # -- the heartbeat --------------------------------------------------------------------------

    def heartbeat(self, now: float) -> None:
        self._ticks += 1
        self.scores.decay(now)
        broke = set()
        for mid, (peer, due) in list(self._promises.items()):
            if now >= due:
                del self._promises[mid]
                broke.add(peer)
                self._ask_another(mid, now)
        for peer in broke:  # asked with IWANT, never sent (once per peer and heartbeat)
            if peer in self.peers:
                self.scores.misbehaved(peer)
        self._ihaves_heard.clear()
        self._asked.clear()
        self._dont_heard.clear()
        self._dont.clear()  # (they were for messages in flight a heartbeat ago)
        for topic, mesh in self.mesh.items():
            self._maintain(topic, mesh, now)
            self._choose_eager(topic, mesh)
        for topic in list(self.fanout):
            if now - self._fanout_used.get(topic, 0.0) > self.p.fanout_ttl:
                del self.fanout[topic]
                self._fanout_used.pop(topic, None)
                continue
            fan = self.fanout[topic]
            limit = self.scores.params.publish_threshold
            fan.intersection_update(p for p in self.topics.get(topic, ()) if self._score(p, now) >= limit)
            fan.update(self._candidates(topic, self.p.d - len(fan), now, exclude=fan, min_score=limit))
        self._gossip(now)
        self._shift()
        self._expire(now)

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

    def _gossip(self, now: float) -> None:
        p = self.p
        recent: dict[str, list[bytes]] = {}
        for window in self._windows[: p.history_gossip]:
            for mid in window:
                msg = self._mcache.get(mid)
                if msg is not None:
                    recent.setdefault(msg.topic, []).append(mid)
        limit = self.scores.params.gossip_threshold
        # what we spared mesh peers the author named: named to them like gossip, for as many
        # windows, but only what they have not sent us or said they have, and what we can still
        # send when asked (an IWANT we cannot answer would cost us)
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
        for topic, ids in recent.items():
            inner = self.mesh.get(topic) or self.fanout.get(topic)
            if inner is None:
                continue
            others = [q for q in self.topics.get(topic, ()) if q not in inner and self._score(q, now) >= limit]
            if not others:
                continue
            n = max(p.d_lazy, int(len(others) * p.gossip_factor))
            chosen = others if n >= len(others) else self.rng.sample(others, n)
            if len(ids) > p.max_ihave_length:
                ids = self.rng.sample(ids, p.max_ihave_length)
            for peer in chosen:
                self._out(peer).ihave.append((topic, list(ids)))

    def _shift(self) -> None:
        self._windows.insert(0, deque())
        while len(self._windows) > self.p.history_length:
            for mid in self._windows.pop():
                gone = self._mcache.pop(mid, None)
                if gone is not None:
                    self._mcache_bytes -= gone.size
        if self._iwant_served and not self._mcache:
            self._iwant_served.clear()
        elif len(self._iwant_served) > 4 * len(self._mcache) + 1024:
            self._iwant_served = {k: v for k, v in self._iwant_served.items() if k[1] in self._mcache}

    def _expire(self, now: float) -> None:
        ttl = self.p.seen_ttl
        seen = self._seen
        while seen:
            mid, entry = next(iter(seen.items()))
            if now - entry.at <= ttl and len(seen) <= self.p.seen_max:
                break
            del seen[mid]
            self._evicted(mid, entry)
        if len(self._backoff) > 0:
            self._backoff = {k: v for k, v in self._backoff.items() if v > now}

    # -- inside ---------------------------------------------------------------------------------

    def take_outgoing(self) -> dict[Hashable, Rpc]:
        if self._announce:
            for peer, topics in self._announce.items():
                self._out(peer).ihave.extend(topics.items())
            self._announce = {}
        out, self._outbox = self._outbox, {}
        return {p: r for p, r in out.items() if r}

    def take_to_validate(self) -> list[tuple[Envelope, Hashable]]:
        out, self._to_validate = self._to_validate, []
        return out

    def take_delivered(self) -> list[Envelope]:
        out, self._delivered = self._delivered, []
        return out

    def score(self, peer: Hashable, now: float) -> float:
        return self.scores.score(peer, now)

    def _score(self, peer: Hashable, now: float) -> float:
        return self.scores.score(peer, now)

    def _out(self, peer: Hashable) -> Rpc:
        rpc = self._outbox.get(peer)
        if rpc is None:
            rpc = self._outbox[peer] = Rpc()
        return rpc

    def _member(self, peer: Hashable, topic: str) -> None:
        topics = self.peers[peer]
        if topic in topics or type(topic) is not str or len(topics) >= self.p.max_topics_per_peer:
            return
        topics.add(topic)
        self.topics.setdefault(topic, set()).add(peer)

    def _forget_member(self, peer: Hashable, topic: str) -> None:
        members = self.topics.get(topic)
        if members is not None:
            members.discard(peer)
            if not members:
                del self.topics[topic]
        mesh = self.mesh.get(topic)
        if mesh is not None and peer in mesh:
            mesh.discard(peer)
            self.scores.pruned(peer, topic)
        self._unmesh(peer, topic)
        fan = self.fanout.get(topic)
        if fan is not None:
            fan.discard(peer)

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

    def _offer(self, mid: bytes, peer: Hashable) -> None:
        """``peer`` has ``mid``, which we asked someone else for: the next to ask if that fails."""
        if peer == self._promises[mid][0]:
            return
        others = self._offered.get(mid)
        if others is None:
            if len(self._offered) >= self.p.max_iwant_ids * 4:
                return
            others = self._offered[mid] = []
        if len(others) < 4 and peer not in others:
            others.append(peer)

    def _ask_another(self, mid: bytes, now: float) -> None:
        """A promise to send ``mid`` was broken: ask the next peer that announced it."""
        others = self._offered.pop(mid, None)
        if not others or mid in self._seen:
            return
        for i, peer in enumerate(others):
            if peer in self.peers and self._asked.get(peer, 0) < self.p.max_iwant_ids:
                self._asked[peer] = self._asked.get(peer, 0) + 1
                self._out(peer).iwant.append(mid)
                self._promises[mid] = (peer, now + self.p.iwant_followup)
                if others[i + 1 :]:
                    self._offered[mid] = others[i + 1 :]
                return

    def _remember(self, mid: bytes, now: float, topic: str, source: Hashable | None) -> _Seen:
        entry = self._seen[mid] = _Seen(now, topic, source)
        told = self._dont.pop(mid, None)
        if told:
            entry.told = told
        if len(self._seen) > self.p.seen_max:
            self._evicted(*self._seen.popitem(last=False))
        return entry

    def _evicted(self, mid: bytes, entry: _Seen) -> None:
        """``mid`` left the seen cache: an accepted message raises its author's floor."""
        self._messages.pop(mid, None)
        if entry.state != _ACCEPTED:
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
        return floor is not None and len(mid) > 16 and int.from_bytes(mid[-16:-8], "big") <= floor

    def _cache(self, msg: Envelope) -> None:
        mid = msg.id
        if mid not in self._mcache:
            self._mcache[mid] = msg
            self._mcache_bytes += msg.size
            self._windows[0].append(mid)
            while self._mcache_bytes > self.p.mcache_bytes and len(self._mcache) > 1:
                oldest = next(w for w in reversed(self._windows) if w)
                gone = self._mcache.pop(oldest.popleft(), None)
                if gone is not None:
                    self._mcache_bytes -= gone.size


_SHA256: Any = None


def _sha256() -> Any:
    global _SHA256
    import hashlib  # (at the first message: hashlib and its OpenSSL binding stay out of a node's start)

    _SHA256 = hashlib.sha256
    return _SHA256


def flood_tag(peer_bytes: bytes | None) -> bytes | None:
    """A peer's name in flood sets: 8 bytes of sha2-256 of its PeerId's bytes."""
    if peer_bytes is None:
        return None
    h = (_SHA256 or _sha256())(b"lattica flood\x00")
    h.update(peer_bytes)
    return h.digest()[:8]


def _author_of(peer: Hashable) -> bytes | None:
    """The author bytes a peer signs with, when the peer handle is a PeerId (bytes otherwise)."""
    if isinstance(peer, bytes):
        return peer
    if isinstance(peer, int):
        return None
    to_bytes = getattr(peer, "to_bytes", None)
    return to_bytes() if callable(to_bytes) else None
