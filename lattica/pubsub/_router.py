"""The pub-sub router: GossipSub v1.1's rules as a sans-IO state machine.

The glue tells it what happened (``add_peer``, ``remove_peer``, ``on_rpc`` with a peer's batch,
``validated`` with the verdict on a message it handed out, ``heartbeat`` once a second) and what
the node wants (``join``, ``leave``, ``publish``); it answers through three queues the glue
drains after every call: ``take_outgoing()`` (a batch per peer), ``take_to_validate()`` (new
messages: check the signature and run the topic's validators, then report ``validated``) and
``take_delivered()`` (accepted messages of the topics we joined). It never reads a clock nor
touches a socket, so hundreds of routers run in one process in a simulation.

The rules, in short (names as in the GossipSub v1.1 specification):

- **Meshes** (``lattica.pubsub._mesh``): per joined topic, D peers we forward every message to;
  kept between D_lo and D_hi on the heartbeat, the best-scoring D_score kept when trimming, peers
  with a negative score pruned. GRAFT asks to enter a peer's mesh, PRUNE leaves it with a backoff;
  a GRAFT during the backoff is misbehaviour (scored) and refused.
- **Fanout** (``mesh``, ``flood``): publishing to a topic we did not join goes to D peers of the
  topic, kept for ``fanout_ttl`` after the last publish. Our own messages are flooded to every
  peer of the topic whose score is above the publish threshold (flood publishing).
- **Flood sets** (``flood``): the author may name the peers it flooded a message to
  (``flood_set``: 8-byte tags of their PeerIds, which the glue signs with the message). Those
  peers have the author's copy, so a forwarder does not send it to them; it names the id to them
  in its heartbeats' IHAVE instead (while gossip would, and while it is cached), so an author that
  names a peer it never sent to only delays that peer by a heartbeat. A peer named in the set
  expects no forwards of that message from its mesh (the score's P3 does not count it).
- **Gossip** (``gossip``, from the message cache ``mcache``): on the heartbeat, IHAVE with the ids
  of the last ``history_gossip`` windows of messages goes to D_lazy (or ``gossip_factor`` of the)
  other peers of each topic; they answer IWANT for what they miss. An IWANT we send is a promise:
  the message not delivered within ``iwant_followup`` costs the peer (P7). IHAVEs per peer per
  heartbeat and ids asked are capped.
- **Choking** (``choke``): a mesh peer whose copies keep coming after others' is asked to send
  only IHAVE (announced at once, fetched with IWANT when we lack the message), so about
  ``d_eager`` full copies of each message arrive while the mesh stays D wide; IDONTWANT (v1.2)
  tells the mesh a message arrived before we validated it.
- **Seen cache** (``seen``): message ids (author, sequence number and a digest of data and
  signature) for ``seen_ttl``, at most ``seen_max``; a message is forwarded at most once, never
  back to a peer that sent it to us; messages of topics we did not join are dropped unremembered.
  When an accepted message leaves the cache, its author's **floor** rises to its sequence number:
  that author's messages at or below it are dropped unseen, so a flood that pushes the cache's
  entries out (however many authors it is signed by) opens no window to replay what was forgotten.
  Floors are kept for ``max_floors`` authors, only of accepted messages (whose authors the glue
  vouched for). libp2p messages have no floors: their ids pushed out early go to a compact
  **tail** (8 bytes each) until ``seen_ttl``, at most ``seen_tail_max``; beyond, peers' new
  messages are dropped rather than such an id forgotten.
- **Validation**: a new message is forwarded and delivered only after the glue accepted it;
  rejected ones count against every peer that sent them (P4); ignored ones are just dropped.
- **Scores** (``lattica.pubsub._score``): below ``gossip_threshold`` no gossip to or from a
  peer, below ``publish_threshold`` none of our messages, below ``graylist_threshold`` nothing
  it sends is looked at.
- **Bounds**: topics a peer may announce, message size, seen cache, message cache, IHAVE/IWANT
  per heartbeat; per-peer outbound queues are ``lattica.pubsub._outbound``'s (gossip is dropped
  first), run by the glue.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Hashable
from dataclasses import dataclass, field
from typing import Any

from lattica.pubsub._choke import Choking
from lattica.pubsub._flood import FloodSets
from lattica.pubsub._gossip import Gossip
from lattica.pubsub._mcache import MessageCache
from lattica.pubsub._mesh import Meshes
from lattica.pubsub._score import PeerScore, ScoreParams
from lattica.pubsub._seen import ACCEPTED, IGNORED, PENDING, REJECTED, SeenCache

__all__ = [
    "Envelope",
    "Rpc",
    "GossipParams",
    "Router",
    "flood_tag",
    "is_libp2p_id",
    "LIBP2P_MARK",
    "ACCEPT",
    "REJECT",
    "IGNORE",
]

ACCEPT, REJECT, IGNORE = "accept", "reject", "ignore"
# the last 8 bytes of the id of a libp2p GossipSub message (signed one by one, StrictSign): its
# id is then libp2p's own (author and seqno) with this mark, and the glue checked its signature
# before the router saw it, so no junk copy can take the id first (lattica.pubsub._libp2p)
LIBP2P_MARK = bytes(8)


def is_libp2p_id(mid: bytes) -> bool:
    """Whether ``mid`` names a libp2p GossipSub message (not one of our signed bundles)."""
    return mid[-8:] == LIBP2P_MARK


@dataclass(frozen=True, slots=True)
class Envelope:
    """One published message: ``data`` is opaque to the router (the glue's: bytes, or what the
    glue makes of them, with ``size`` its length in bytes); the signature is checked by the glue.

    Its ``id`` is the author, the seqno and 8 bytes of ``digest``, which the glue gives (it must
    cover everything the signature does, and the signature) or which is sha2-256 over the data
    and signature: a copy that differs in anything is another message, so a junk copy sent first
    under an honest message's author and seqno can neither pre-empt it nor get it refused. A
    libp2p GossipSub message's digest is ``LIBP2P_MARK`` (its signature checked before)."""

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
    # libp2p ids pushed out of the seen cache by seen_max before seen_ttl, kept as 8 bytes each
    # until it (``_seen.Tail``: 16 MiB); when full too, peers' new messages that would push out
    # another are dropped: a libp2p message is never taken twice within seen_ttl
    seen_tail_max: int = 2_000_000
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


class Router(SeenCache, MessageCache, Gossip, FloodSets, Meshes, Choking):
    """One node's pub-sub router (see the module docstring). Its parts, each a module of its own:
    the seen cache (``seen``), the message cache (``mcache``), gossip (``gossip``: IHAVE, IWANT,
    IDONTWANT), flood publishing and flood sets (``flood``), the meshes' upkeep (``mesh``: GRAFT,
    PRUNE, the fanout) and choking (``choke``); here the node's side, a peer's batch, the
    heartbeat, and the state they share."""

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
        self.scores = PeerScore(score)
        self.rng = rng or random.Random()
        self.peers: dict[Hashable, set[str]] = {}  # peer -> topics it joined
        self.topics: dict[str, set[Hashable]] = {}  # topic -> peers that joined it
        self.mesh: dict[str, set[Hashable]] = {}  # the topics we joined -> our mesh in each
        self.fanout: dict[str, set[Hashable]] = {}
        self._fanout_used: dict[str, float] = {}
        self._outbox: dict[Hashable, Rpc] = {}
        self._to_validate: list[tuple[Envelope, Hashable]] = []
        self._delivered: list[Envelope] = []
        self._messages: dict[bytes, Envelope] = {}  # pending validation
        self._rtt: dict[Hashable, float] = {}
        # libp2p GossipSub peers: they take only libp2p messages (ids with ``LIBP2P_MARK``), and
        # know nothing of choking or flood sets
        self.plain: set[Hashable] = set()
        self._ticks = 0
        super().__init__()  # (each part's own state)

    # -- the node's side ------------------------------------------------------------------------

    def add_peer(
        self, peer: Hashable, now: float, ip: str | None = None, rtt: float | None = None, plain: bool = False
    ) -> None:
        """A peer that speaks pub-sub is connected: tell it our topics. ``ip`` (for the score's
        colocation term) and ``rtt`` (seconds; tells its forwarded copies from echoes of ours)
        when the glue knows them; ``plain``: a libp2p GossipSub peer (see ``plain``)."""
        if peer == self.me or peer in self.peers:
            return
        self.peers[peer] = set()
        if plain:
            self.plain.add(peer)
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
        self.plain.discard(peer)
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
        entry.state = ACCEPTED
        self._cache(msg)
        if msg.topic in self.mesh:
            self._delivered.append(msg)
        planned, self._planned = self._planned, None
        targets = (
            planned[2]
            if planned is not None and planned[:2] == (msg.topic, now)
            else self._publish_targets(msg.topic, now)
        )
        if self.plain and not is_libp2p_id(msg.id):
            targets = {p for p in targets if p not in self.plain}  # (a bundle means nothing to them)
        for peer in targets:
            self._out(peer).messages.append(msg)
        if targets:
            entry.sent_to = set(targets) | entry.sent_to  # (a set of its own: see Seen)
        return len(targets)

    def reach(self, topic: str, now: float) -> int:
        """The peers a message we published to ``topic`` now would be sent to."""
        return len(self._publish_targets(topic, now))

    def validated(self, msg_id: bytes, verdict: str, now: float) -> None:
        """The glue's verdict on a message from ``take_to_validate``."""
        entry = self._seen.get(msg_id)
        msg = self._messages.pop(msg_id, None)
        if entry is None or msg is None or entry.state != PENDING:
            return
        topic = entry.topic
        if verdict == ACCEPT:
            entry.state = ACCEPTED
            self._cache(msg)
            if entry.source is not None:
                self.scores.first_delivery(entry.source, topic)
            mesh = self.mesh.get(topic, set())
            flooded = msg.flooded
            if flooded and self._my_tag in flooded:
                entry.flooded = True  # (our mesh peers were told not to forward it to us)
            else:
                plain = self.plain
                if plain and not is_libp2p_id(msg_id):  # (libp2p peers never carry our bundles)
                    self.scores.topic_message(topic, {p for p in mesh if p not in plain})
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
            if self.plain and not is_libp2p_id(msg_id):
                targets = [p for p in targets if p not in self.plain]
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
            entry.state = REJECTED
            for peer in entry.have:
                self.scores.invalid(peer, topic)
        else:
            entry.state = IGNORED

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
            if entry.state == REJECTED:
                self.scores.invalid(peer, msg.topic)
            elif (
                entry.state == ACCEPTED
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
        if floor is not None and msg.seqno <= floor and not is_libp2p_id(mid):
            return  # older than what we forgot of its author: a replay, or a copy far too late
        if self._tail is not None and self._replayed(mid):
            return  # a libp2p message seen within seen_ttl, pushed out of the cache early: a replay
        mesh = self.mesh.get(msg.topic)
        if mesh is None:
            return  # not ours to check or pass on (a peer's fanout reached us): not even remembered
        if not self._room(now):
            return  # the cache is full of unexpired libp2p ids and so is the tail: dropped, nobody blamed
        entry = self._remember(mid, now, msg.topic, peer)
        entry.had_from(peer)
        self._messages[mid] = msg
        self._to_validate.append((msg, peer))
        if msg.size >= self.p.idontwant_min_bytes:  # (GossipSub v1.2) the mesh need not send it to us now
            for other in mesh:
                if other not in entry.have:
                    self._out(other).idontwant.append(mid)

    # -- the heartbeat --------------------------------------------------------------------------

    def heartbeat(self, now: float) -> None:
        self._ticks += 1
        self.scores.decay(now)
        self._check_promises(now)
        self._next_round()
        for topic, mesh in self.mesh.items():
            self._maintain(topic, mesh, now)
            self._choose_eager(topic, mesh)
        self._keep_fanout(now)
        self._name_spared(now)
        self._gossip(now)
        self._shift()
        self._forget_served()
        self._expire(now)
        self._expire_backoff(now)

    # -- inside ---------------------------------------------------------------------------------

    def take_outgoing(self) -> dict[Hashable, Rpc]:
        self._flush_announce()
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
