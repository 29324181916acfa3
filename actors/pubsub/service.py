"""The ``pubsub`` system service: a GossipSub router (``lattica.pubsub._router``) on the node.

The service feeds the router what happens (members connecting and leaving, peers' batches, the
heartbeat) and carries out what it answers: batches go to peers as calls to their ``pubsub``
actor, one queue per peer bounded by ``peer_queue`` messages (IHAVE gossip dropped first, then
the oldest messages) with at most ``in_flight`` calls on the way (``sending``).

Our messages published in one turn of the node's loop to one topic leave as one bundle under one
signature (``bundle``): a publisher faster than the network sends fewer, larger messages, and
receivers check one signature per bundle. A bundle from a peer is checked before the router
forwards it (``validation``: the author's Ed25519 signature, once per bundle; a seqno, which is
the author's clock in ns, within ``clock_skew``; items the codec can decode; then the topic's
validator on each item): any item rejected refuses the bundle (and scores its sender down); otherwise the
accepted items are delivered and, if there are any, the bundle is passed on whole (the ignored
ones ride along, delivered nowhere they are ignored).

Subscribers find each other through the DHT (``discovery``): each announces itself as a provider
of the topic's key and, while it knows fewer than D_lo peers of the topic, looks the key up and
connects to some of the providers (by PeerId: direct, punched or relayed, as any dial). Mesh
peers' connections are kept open while idle.

libp2p peers (go-, js- and rust-libp2p, the Lattica SDK: identified as speaking ``/meshsub/1.2.0``
or ``/1.1.0`` and not our actor calls) are router peers too, over GossipSub's own streams
(``meshsub``). They take and send only libp2p messages, each signed on its own (StrictSign:
``lattica.pubsub._libp2p``), whose signatures are checked before the router sees them. We
publish such messages on the topics ``PubSubConfig.libp2p_topics`` names, and pass on those of
any topic to every peer; our bundles go to Lattica peers only.

Exposure (docs/security.md): members only. A mesh's topics are the mesh's business; a stranger
can neither publish into them nor read them through us. Topics a node opens
(``PubSubConfig.open_topics``) are the exception: strangers become router peers for those topics
alone, calling ``open_rpc`` (every other part of their batches is dropped, and nothing of another
topic goes to them: ``lattica.pubsub._open_topics``; their messages are checked within their
share, a few at a time: ``strangers``), and those topics' authors need not be members.
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, cast

from lattica import codec
from lattica._budget import Buckets
from lattica._identity import PeerId
from lattica._rpc import PROTOCOL as RPC_PROTOCOL
from lattica._runtime import current_caller
from lattica._runtime.limits import ASYNC
from lattica._runtime.refs import ActorRef
from lattica.actors.pubsub.discovery import Discovery
from lattica.actors.pubsub.strangers import Strangers
from lattica.config import PubSubConfig
from lattica.errors import LatticaError, PermissionDenied, ProtocolError
from lattica.logging import get_logger
from lattica.pubsub._gossipsub_wire import MESHSUB_1_1, MESHSUB_1_2

if TYPE_CHECKING:
    from lattica._identify import PeerInfo
    from lattica._runtime.calls import Calls
    from lattica.actors.dht import DhtService
    from lattica.actors.pubsub import wire
    from lattica.actors.pubsub.bundle import MAX_FLOODED, Bundle
    from lattica.actors.pubsub.meshsub import Meshsub, speaks_meshsub
    from lattica.actors.pubsub.sending import Sending
    from lattica.actors.pubsub.validation import Checks
    from lattica.pubsub import _gossipsub_wire as gs
    from lattica.pubsub._libp2p import Signed, envelope, screen
    from lattica.pubsub._open_topics import is_open, only_open
    from lattica.pubsub._router import Envelope, GossipParams, Router, Rpc
    from lattica.pubsub._subscription import Message, Subscription
    from lattica.transports.base import Connection, Stream

log = get_logger("lattica.pubsub")

__all__ = ["PubSubService", "PubSubActor", "pubsub_ref"]

NAME = "pubsub"
ACCEPT, REJECT, IGNORE = "accept", "reject", "ignore"  # (the router's verdicts)


def _load() -> None:
    """The router, its scores, the wire form, subscriptions, the checks and the peers' queues
    load when a node first uses pub-sub (a topic of its own, or a peer's batch): a node that
    never does pays nothing at start."""
    global wire, Bundle, MAX_FLOODED, Envelope, GossipParams, Router, Rpc, Message, Subscription
    global Checks, Sending, is_open, only_open, Meshsub, speaks_meshsub, gs, envelope, screen, Signed
    from lattica.actors.pubsub import wire  # (first use: see above)
    from lattica.actors.pubsub.bundle import MAX_FLOODED, Bundle  # (first use)
    from lattica.actors.pubsub.meshsub import Meshsub, speaks_meshsub  # (first use)
    from lattica.actors.pubsub.sending import Sending  # (first use)
    from lattica.actors.pubsub.validation import Checks  # (first use)
    from lattica.pubsub import _gossipsub_wire as gs  # (first use)
    from lattica.pubsub._libp2p import Signed, envelope, screen  # (first use)
    from lattica.pubsub._open_topics import is_open, only_open  # (first use)
    from lattica.pubsub._router import Envelope, GossipParams, Router, Rpc  # (first use)
    from lattica.pubsub._subscription import Message, Subscription  # (first use)


_FLUSH_WAIT = 2.0  # seconds a stopping node gives its pub-sub batches on the way to arrive


class _Batch:
    """Our messages to one topic waiting for the end of this turn of the loop, to go as one
    signed bundle; ``reach`` is what each publish reports (the peers it goes to)."""

    __slots__ = ("bodies", "datas", "size", "reach")

    def __init__(self, reach: int, body: bytes | None = None, data: Any = None) -> None:
        self.bodies: list[bytes] = [] if body is None else [body]
        self.datas: list[Any] = [] if body is None else [data]
        self.size = 0 if body is None else len(body)
        self.reach = reach


def pubsub_ref(peer: PeerId) -> ActorRef:
    """The ref of ``peer``'s pubsub system actor."""
    return ActorRef(peer, NAME, {"rpc": ASYNC, "open_rpc": ASYNC})


class PubSubService:
    """A node's router, subscriptions and validators (see the module docstring)."""

    def __init__(self, runtime: Calls, config: PubSubConfig | None = None, dht: DhtService | None = None) -> None:
        self.rt = runtime
        self.host = runtime.host
        self.cfg = config or PubSubConfig()
        self._router: Router | None = None  # made at first use (see ``_load``)
        self._beat: asyncio.Task | None = None
        self._author = runtime.peer_id.to_bytes()
        self._seqno = 0  # the last one used: our clock in ns, or one more than the last (unique across restarts)
        self._subs: dict[str, list[Subscription]] = {}
        self._handlers: dict[str, list[Callable[[Message], Any]]] = {}
        self._validators: dict[str, Callable[[Message], Any]] = {}
        # message id -> ([(item, decoded data)], peer it came from), until delivered
        self._payloads: dict[bytes, tuple[list, Any]] = {}
        self._batches: dict[str, _Batch] = {}
        self._send_later: asyncio.Handle | None = None  # the batches' departure
        rate = self.cfg.author_rate
        # our own pace: half the bundles a second of each author we check (``validation``)
        self._own_rate = Buckets(rate / 2, max(rate / 2, 1.0), 1, clock=self._now)
        self._validating = 0  # async validations running
        self._unheard: dict[PeerId, float] = {}  # peers added that have not sent their first batch: when
        self._heard = asyncio.Event()
        self.discovery = Discovery(runtime, self.cfg, lambda: self.router, self._open, dht)
        self._strangers = Strangers(self.host, self.cfg, self._from_stranger, self._pump)
        # made with the router, at first use: the checks on peers' bundles, the queues to peers
        self._checks: Checks
        self._sending: Sending
        self._meshsub: Meshsub  # the streams with libp2p GossipSub peers
        self._closed = False
        self.published = self.delivered = self.rejected = self.bundles = self.copies = (
            0  # copies: items of peers' messages received
        )
        self.host.events.identified.subscribe(self._on_identified)
        self.host.events.disconnected.subscribe(self._on_disconnected)
        for proto in (MESHSUB_1_2, MESHSUB_1_1):
            self.host.set_handler(proto, functools.partial(self._on_meshsub_stream, protocol=proto))

    @property
    def routing(self) -> bool:
        """The router is made (some topic was used): ``router`` would not make it now."""
        return self._router is not None

    @property
    def closed(self) -> bool:
        """The service stopped (``aclose``)."""
        return self._closed

    @property
    def router(self) -> Router:
        """The router, made (with every member connected so far as a peer) at first use."""
        if self._router is None:
            _load()
            cfg = self.cfg
            params = GossipParams(
                d=cfg.d,
                d_lo=cfg.d_lo,
                d_hi=cfg.d_hi,
                d_score=min(4, cfg.d),
                heartbeat=cfg.heartbeat,
                max_message_bytes=cfg.max_message_bytes,
                max_flood_set=MAX_FLOODED,
            )
            router = self._router = Router(self.rt.peer_id, params)
            self._checks = Checks(self.host, cfg, self._validators, self._payloads, self._open, self._now)
            self._sending = Sending(self.rt, cfg, router, self._strangers.peers, pubsub_ref)
            self._meshsub = Meshsub(
                self.host,
                cfg,
                self.rt.partials,
                self._sending.drained,
                self._from_plain,
                router.scores.misbehaved,
                self._plain_gone,
                self._heeded,
                self._strangers,
            )
            for info in list(self.host.info.values()):
                if (
                    (info.circle != "stranger" or self.cfg.open_topics)
                    and info.peer_id != self.rt.peer_id
                    and info.peer_id not in router.peers
                ):
                    self._add_peer(info)
            self._beat = self.host.spawn(self._heartbeats())
        return self._router

    # -- the node's side ------------------------------------------------------------------------

    def subscribe(
        self, topic: str, maxsize: int | None = None, handler: Callable[[Message], Any] | None = None
    ) -> Subscription | None:
        """Join ``topic``: a Subscription to read, or, with ``handler``, each message is passed to
        it on the node loop (an actor method handle is told the message)."""
        self.router  # noqa: B018 -- (loads the machinery at first use)
        wire.check_topic(topic)
        if maxsize is not None and (type(maxsize) is not int or maxsize < 1):
            raise ValueError(f"a subscription holds at least 1 message, not {maxsize!r}")
        first = not self._subs.get(topic) and not self._handlers.get(topic)
        sub = None
        if handler is not None:
            self._handlers.setdefault(topic, []).append(handler)
        else:
            sub = Subscription(
                topic,
                self.host.loop,
                maxsize or self.cfg.subscription_queue,
                self._closed_sub,
                self.cfg.subscription_bytes,
            )
            self._subs.setdefault(topic, []).append(sub)
        if first:
            self.router.join(topic, self._now())
            self._pump()
            self.discovery.start(topic)
        return sub

    def unsubscribe(self, topic: str, handler: Callable[[Message], Any] | None = None) -> None:
        """Stop the handler (or every subscription and handler) of ``topic``."""
        if self._router is None:
            return
        if handler is not None:
            hs = self._handlers.get(topic, [])
            if handler in hs:
                hs.remove(handler)
        else:
            self._handlers.pop(topic, None)
            for sub in self._subs.pop(topic, []):
                sub._end()
        self._maybe_leave(topic)

    def _closed_sub(self, sub: Subscription) -> None:
        self.host.loop.call_soon_threadsafe(self._drop_sub, sub)

    def _drop_sub(self, sub: Subscription) -> None:
        subs = self._subs.get(sub.topic, [])
        if sub in subs:
            subs.remove(sub)
        sub._end()
        self._maybe_leave(sub.topic)

    def _maybe_leave(self, topic: str) -> None:
        if not self._subs.get(topic) and not self._handlers.get(topic) and topic in self.router.mesh:
            self._subs.pop(topic, None)
            self._handlers.pop(topic, None)
            self.router.leave(topic, self._now())
            self._pump()
            self.discovery.stop(topic)

    def set_validator(self, topic: str, fn: Callable[[Message], Any] | None) -> None:
        """``fn(message)`` decides each new message of ``topic`` before it is delivered or
        forwarded: True/"accept", False/"reject" (the peer that sent it is scored down),
        None/"ignore"; it may be a coroutine function. None removes it."""
        if fn is None:
            self._validators.pop(topic, None)
        else:
            self._validators[topic] = fn

    def publish(self, topic: str, data: Any) -> int:
        """Send ``data`` (anything the codec carries) to ``topic``, signed; the peers it goes to.
        It leaves at once when nothing of ours is on the way; else at the end of this turn of
        the loop (or when our bundle rate allows), in one bundle with the topic's others. On a
        topic of ``PubSubConfig.libp2p_topics``, ``data`` is bytes (or text, sent as UTF-8),
        signed and sent on its own, as libp2p GossipSub does."""
        self.router  # noqa: B018 -- (loads the machinery at first use)
        wire.check_topic(topic)
        if is_open(topic, self.cfg.libp2p_topics):
            return self._publish_signed(topic, data)
        body = b"".join(bytes(c) for c in codec.encode(data))
        if len(body) > self.cfg.max_message_bytes:
            raise ValueError(
                f"a message of {len(body)} bytes is over this node's {self.cfg.max_message_bytes} (PubSubConfig.max_message_bytes)"
            )
        batch = self._batches.get(topic)
        if batch is not None and (
            len(batch.bodies) >= wire.MAX_ITEMS or batch.size + len(body) > self.cfg.max_message_bytes
        ):
            self._send(topic)
            batch = None
        self.published += 1
        if batch is None:
            if self._send_wait() <= 0 and not self._sending.busy():
                return self._send(topic, _Batch(0, body, data))  # nothing of ours on the way: it goes now
            if self._send_later is None:
                wait = self._send_wait()
                loop = self.host.loop
                self._send_later = (
                    loop.call_soon(self._send_all) if wait <= 0 else loop.call_later(wait, self._send_all)
                )
            batch = self._batches[topic] = _Batch(self.router.reach(topic, self._now()))
        batch.bodies.append(body)
        batch.datas.append(data)
        batch.size += len(body)
        return batch.reach

    def _publish_signed(self, topic: str, data: Any) -> int:
        """Publish ``data`` as one libp2p GossipSub message (StrictSign); the peers it goes to."""
        if isinstance(data, str):
            data = data.encode()
        elif isinstance(data, (bytearray, memoryview)):
            data = bytes(data)
        elif not isinstance(data, bytes):
            raise TypeError(
                f"topic {topic!r} is shared with libp2p peers (PubSubConfig.libp2p_topics): its messages are "
                f"bytes or text, not {type(data).__name__}; encode it first (e.g. with lattica.codec or json)"
            )
        if len(data) > self.cfg.max_message_bytes:
            raise ValueError(
                f"a message of {len(data)} bytes is over this node's {self.cfg.max_message_bytes} (PubSubConfig.max_message_bytes)"
            )
        seqno = self._seqno = max(self._seqno + 1, time.time_ns())
        env = envelope(gs.sign(self.host.keypair, topic, data, seqno.to_bytes(8, "big")))
        self.published += 1
        self._payloads[env.id] = ([(0, data)], None)
        reach = self.router.publish(env, self._now())
        self._pump()
        self._payloads.pop(env.id, None)
        return reach

    def _send_all(self) -> None:
        self._send_later = None
        for topic in list(self._batches):
            self._send(topic)

    def _send_wait(self) -> float:
        """Seconds until our own bundle rate (half the ``author_rate`` receivers allow, as many
        at once) lets the next bundle go: a fast publisher sends bigger bundles, not more."""
        return self._own_rate.wait()

    def _send(self, topic: str, batch: _Batch | None = None) -> int:
        """Sign the topic's waiting messages (or ``batch``) as one bundle and hand it to the
        router; the peers it went to."""
        if batch is None:
            batch = self._batches.pop(topic)
        n = len(batch.bodies)
        self._own_rate.take(force=True)  # (a full batch goes at once, into debt)
        seqno = max(self._seqno + 1, time.time_ns())
        self._seqno = seqno + n - 1
        trust = self.host.trust
        now = self._now()
        bundle = Bundle(batch.bodies, [] if trust.open else trust.presented, sorted(self.router.flood_set(topic, now)))
        env = wire.envelope(
            topic, self._author, seqno, bundle, self.host.keypair.sign(bundle.signed_bytes(topic, self._author, seqno))
        )
        self._payloads[env.id] = (list(enumerate(batch.datas)), None)
        self.bundles += 1
        reach = self.router.publish(env, now)
        self._pump()
        self._payloads.pop(env.id, None)
        return reach

    async def publish_soon(self, topic: str, data: Any, wait: float = 2.0) -> int:
        """``publish``, after waiting (up to ``wait`` s) for the members we just connected to to
        tell us their topics, when nobody of ``topic`` is known yet: a fresh node that publishes
        at once, from a script that then ends, reaches the subscribers already there."""
        loop = self.host.loop
        deadline = loop.time() + wait
        while not self.router.topics.get(topic) and topic not in self.router.fanout:
            now = loop.time()
            fresh = [p for p, t in self._unheard.items() if now - t < wait]
            if not fresh or now >= deadline:
                break
            self._heard.clear()
            try:
                await asyncio.wait_for(self._heard.wait(), deadline - now)
            except TimeoutError:
                break
        # our own messages wait for room rather than be dropped: a publisher faster than its
        # peers take messages is slowed to their pace (forwarded messages are dropped instead)
        while not self._closed and self._sending.backlogged():
            self._sending.drained.clear()
            try:
                await asyncio.wait_for(self._sending.drained.wait(), 1.0)
            except TimeoutError:
                pass
        return self.publish(topic, data)

    def topics(self) -> list[str]:
        return sorted(self._router.mesh) if self._router is not None else []

    def peers(self, topic: str | None = None) -> list[PeerId]:
        """The peers in ``topic``'s mesh (or every pub-sub peer)."""
        r = self._router
        if r is None:
            return []
        peers = r.mesh.get(topic, set()) if topic is not None else set(r.peers)
        return sorted(cast("set[PeerId]", peers), key=str)  # (the router keeps the PeerIds we give it as hashables)

    def stats(self) -> dict:
        return {
            "published": self.published,
            "bundles": self.bundles,
            "delivered": self.delivered,
            "copies": self.copies,
            "rejected": self.rejected,
            "peers": len(self._router.peers) if self._router is not None else 0,
            "topics": self.topics(),
            "dropped_to_peers": self._sending.dropped() + self._meshsub.dropped() if self._router is not None else 0,
        }

    # -- peers ----------------------------------------------------------------------------------

    def _now(self) -> float:
        return self.host.loop.time()

    def _on_identified(self, info: PeerInfo) -> None:
        if (info.circle == "stranger" and not self.cfg.open_topics) or self._closed or self._router is None:
            return  # (a router made later takes every member connected by then)
        peer = info.peer_id
        if info.circle != "stranger":
            self._strangers.peers.discard(peer)
        if peer in self.router.peers:
            if info.circle == "stranger":
                self._strangers.peers.add(peer)
            self.router.scores.connected(peer, _ip_of(info.remote_addr))  # (a batch may have come first)
            self._meshsub.identified(peer, info.agent_version)
            return
        self._add_peer(info)
        self._pump()

    def _add_peer(self, info: PeerInfo) -> None:
        """An identified peer becomes the router's: a Lattica node (our actor calls), or a libp2p
        node that speaks GossipSub (a plain peer); one that speaks neither is none of ours."""
        plain = None
        if RPC_PROTOCOL not in info.protocols:
            plain = speaks_meshsub(info.protocols)
            if plain is None:
                return
        self._add(info.peer_id, info.circle, _ip_of(info.remote_addr), plain, info.agent_version)

    def _add(self, peer: PeerId, circle: str, ip: str | None, plain: str | None, agent_version: str) -> None:
        """``peer`` becomes the router's; ``plain``: the GossipSub protocol of a libp2p peer."""
        if plain is not None:
            self._meshsub.add(peer, plain, agent_version)
        if circle == "stranger":
            self._strangers.peers.add(peer)
        self.router.add_peer(peer, self._now(), ip=ip, plain=plain is not None)
        self._unheard[peer] = self._now()  # (a publish waits for their topics: ``publish_soon``)
        self.host.spawn(self._measure(peer))

    async def _measure(self, peer: PeerId) -> None:
        """The peer's round trip, which tells its forwarded copies from echoes of ours (P3)."""
        try:
            rtts = await self.host.ping(peer, 1, 5.0)
        except (TimeoutError, LatticaError, OSError):
            return
        if rtts:
            self.router.set_rtt(peer, min(rtts))

    def _on_disconnected(self, peer: PeerId, conn: Connection) -> None:
        self._unheard.pop(peer, None)
        if peer not in self.host.conns:
            self._strangers.peers.discard(peer)
        if self._router is not None and peer in self._router.peers:
            self.router.remove_peer(peer, self._now())
            self._sending.forget(peer)
            self._meshsub.forget(peer)
            self._pump()

    def on_rpc(self, peer: PeerId, raw: Any, stranger: bool = False) -> None:
        """A member's batch (the actor's call), or, with ``stranger``, a batch of which only the
        parts about our open topics are looked at."""
        if self._closed or peer not in self.host.conns:
            return
        if stranger and not self._strangers.admit(peer):
            return  # (more than a stranger's share, or than all strangers': dropped unread)
        if self.router.score(peer, self._now()) < self.router.scores.params.graylist_threshold:
            return  # graylisted: not even parsed
        if stranger:
            raw = self._strangers.part(peer, raw)
        try:
            rpc = wire.decode(raw, self.cfg.max_message_bytes)
        except ProtocolError:
            self.router.scores.misbehaved(peer)
            raise
        if stranger:
            rpc = only_open(rpc, self._open, self.router.topic_of, to_stranger=False)
        self._as_router_peer(peer)
        if self._unheard.pop(peer, None) is not None:
            self._heard.set()
        # libp2p messages' signatures, before a stranger's wait their turn too: nothing checks
        # them later (a stranger's forgery in Alice's name was delivered; hostile review)
        self._screen(peer, rpc)
        if stranger:
            self._strangers.wait(peer, rpc.messages)
            rpc.messages = []  # (bundles checked a few at a turn of the loop: ``Strangers``)
        for env in rpc.messages:
            self.copies += env.data.count
        self.router.on_rpc(peer, rpc, self._now())
        self._pump()

    def _screen(self, peer: PeerId, rpc: Rpc, bad: list[str] | tuple = ()) -> None:
        """Take the libp2p messages whose signatures fail out of ``rpc`` before the router sees
        it; each (and each of ``bad``, the ones already left out) scores ``peer`` down (P4)."""
        r = self.router
        if any(type(m.data) is Signed and m.topic not in r.mesh for m in rpc.messages):
            # the router drops a new message of a topic we did not join unremembered: checking
            # its signature first cost a check per copy, at the sender's pace (hostile review)
            rpc.messages = [
                m for m in rpc.messages if type(m.data) is not Signed or m.topic in r.mesh or r.topic_of(m.id)
            ]
        for topic in [*bad, *screen(rpc, lambda mid: r.topic_of(mid) is not None)]:
            self.rejected += 1
            r.scores.invalid(peer, topic)

    # -- libp2p GossipSub peers -----------------------------------------------------------------

    async def _on_meshsub_stream(self, stream: Stream, conn: Connection, protocol: str) -> None:
        """A libp2p peer's GossipSub stream: its RPCs, read for as long as it lasts. Its peer is
        the router's from now (libp2p peers send their first RPC before identify is done)."""
        peer = conn.remote_peer
        circle = self.host.circle_of(peer)
        if self._closed or (circle == "stranger" and not self.cfg.open_topics):
            stream.reset()
            return
        if peer not in self.router.peers:  # (loads the machinery at first use)
            info = self.host.info.get(conn)
            self._add(peer, circle, _ip_of(conn.remote_addr), protocol, info.agent_version if info else "")
        await self._meshsub.on_stream(stream, conn)

    def _from_plain(self, peer: PeerId, rpc: Rpc, bad: list[str]) -> None:
        """A libp2p peer's RPC, as a router batch (``meshsub``)."""
        r = self.router
        if self._closed or peer not in self.host.conns:
            return
        if peer not in r.peers:
            return  # (gone meanwhile: disconnected, or our stream to it broke)
        if r.score(peer, self._now()) < r.scores.params.graylist_threshold:
            return  # graylisted: nothing it says is looked at
        if peer in self._strangers.peers:
            rpc = only_open(rpc, self._open, r.topic_of, to_stranger=False)
            # (decoding it was charged already, a batch if it carried no message: ``meshsub``)
            fresh = [m for m in rpc.messages if r.topic_of(m.id) is None]
            # new messages within the strangers' share, the rest dropped before their signatures
            # are checked (copies of seen ones cost nothing more: the router drops them)
            keep = self._strangers.share(peer, len(fresh))
            if keep < len(fresh):
                dropped = {id(m) for m in fresh[keep:]}
                rpc.messages = [m for m in rpc.messages if id(m) not in dropped]
            self._screen(peer, rpc, bad)
            self._strangers.wait(peer, rpc.messages)
            rpc.messages = []  # (checked a few at a turn of the loop: ``Strangers``)
        else:
            self._screen(peer, rpc, bad)
        if self._unheard.pop(peer, None) is not None:
            self._heard.set()
        self.copies += len(rpc.messages)
        r.on_rpc(peer, rpc, self._now())
        self._pump()

    def _heeded(self, peer: PeerId) -> bool:
        """Whether a libp2p peer's next RPC is worth decoding: it is our router's peer and not
        graylisted (before: decoded, ids translated, then ignored; hostile review)."""
        r = self._router
        return (
            r is not None
            and not self._closed
            and peer in r.peers
            and r.score(peer, self._now()) >= r.scores.params.graylist_threshold
        )

    def _plain_gone(self, peer: PeerId) -> None:
        """Our stream to a libp2p peer broke: it is no router peer until it is identified again."""
        if self._router is not None and peer in self._router.peers:
            self.router.remove_peer(peer, self._now())
            self._pump()

    def _as_router_peer(self, peer: PeerId) -> None:
        """A peer that sent us a batch is the router's peer (its identify may still be on the way)."""
        if peer not in self.router.peers:
            self.router.add_peer(peer, self._now())
            self.host.spawn(self._measure(peer))

    def _from_stranger(self, peer: PeerId, env: Envelope, now: float) -> None:
        """A stranger's message, at its turn (``Strangers``)."""
        self._as_router_peer(peer)
        self.copies += env.data.count
        self.router.on_rpc(peer, Rpc(messages=[env]), now)

    async def _heartbeats(self) -> None:
        while True:
            await asyncio.sleep(self.cfg.heartbeat)
            try:
                self.router.heartbeat(self._now())
                self._pump()
                self.discovery.keep_mesh_connections()
            except Exception:  # one bad heartbeat must not end the mesh's upkeep
                log.exception("pub-sub heartbeat failed")

    # -- carrying out what the router says ------------------------------------------------------

    def _pump(self) -> None:
        r = self.router
        for env, peer in r.take_to_validate():
            verdicts = self._checks.check(env, peer)
            waiting = sum(1 for v in verdicts if inspect.isawaitable(v)) if type(verdicts) is list else 0
            if waiting:
                if self._validating + waiting > self.cfg.max_validating:
                    self._checks.abandon(verdicts)
                    self._verdict(env, IGNORE)  # too many waiting on the application: drop, no blame
                    continue
                self._validating += waiting
                self.host.spawn(self._finish(env, verdicts, waiting))
            else:
                self._verdict(env, verdicts)
        for env in r.take_delivered():
            self._deliver(env)
        for peer, rpc in cast("dict[PeerId, Rpc]", r.take_outgoing()).items():  # (the PeerIds we gave the router)
            if peer in self._strangers.peers:
                rpc = only_open(rpc, self._open, r.topic_of, to_stranger=True)
                if not rpc:
                    continue
            if peer in r.plain:
                self._meshsub.send(peer, rpc)
            else:
                self._sending.send(peer, rpc)

    def _verdict(self, env: Envelope, verdicts: Any) -> None:
        """Tell the router what became of ``env``: REJECT or IGNORE, or each item's verdict:
        any rejected refuses the bundle; else the accepted ones are delivered and, if there are
        any, the bundle passes on whole (ignored items ride along, delivered nowhere they are
        ignored)."""
        if type(verdicts) is list:
            verdict = REJECT if REJECT in verdicts else ACCEPT if ACCEPT in verdicts else IGNORE
            if verdict == ACCEPT and IGNORE in verdicts:
                items, via = self._payloads.get(env.id, ((), None))
                self._payloads[env.id] = ([x for x, v in zip(items, verdicts) if v == ACCEPT], via)
        else:
            verdict = verdicts
        if verdict == REJECT:
            self.rejected += 1
        self.router.validated(env.id, verdict, self._now())
        for accepted in self.router.take_delivered():
            self._deliver(accepted)
        self._payloads.pop(env.id, None)  # (delivered, refused, or forgotten by the router meanwhile)

    async def _finish(self, env: Envelope, pending: list, waiting: int) -> None:
        try:
            verdicts = await self._checks.settle(env.topic, pending)
        finally:
            self._validating -= waiting
        self._verdict(env, verdicts)
        self._pump()

    def _open(self, topic: str | None) -> bool:
        """Whether ``topic`` is one we opened to strangers."""
        return is_open(topic, self.cfg.open_topics)

    def _deliver(self, env: Envelope) -> None:
        items, via = self._payloads.pop(env.id, ((), None))
        if not items:
            return
        author = PeerId.from_bytes(env.author)
        subs = self._subs.get(env.topic, ())
        handlers = self._handlers.get(env.topic, ())
        sizes = env.data.items
        for i, data in items:
            msg = Message(env.topic, author, env.seqno + i, data, via)
            self.delivered += 1
            for sub in subs:
                sub._push(msg, len(sizes[i]))
            for handler in handlers:
                try:
                    tell = getattr(handler, "tell", None)
                    if tell is not None:
                        tell(msg)
                    else:
                        out = handler(msg)
                        if inspect.isawaitable(out):
                            self.host.spawn(_logged(out, env.topic))
                except Exception:
                    log.exception("pub-sub handler failed", topic=env.topic)

    async def aclose(self) -> None:
        """Before the connections close: what we published goes out, and the batches on their
        way arrive (up to ``_FLUSH_WAIT`` s in all): a script that publishes and ends loses nothing."""
        if self._router is None:
            return
        if self._send_later is not None:
            self._send_later.cancel()
        self._send_all()
        loop = self.host.loop
        deadline = loop.time() + _FLUSH_WAIT
        sending = self._sending
        while (sending.busy() or self._meshsub.busy()) and loop.time() < deadline:
            sending.drained.clear()
            try:
                await asyncio.wait_for(sending.drained.wait(), deadline - loop.time())
            except TimeoutError:
                break

    def close(self) -> None:
        if self._send_later is not None:
            self._send_later.cancel()
        self._send_all()  # (what was published this turn goes, as far as the closing node still gets it)
        self._closed = True
        self._strangers.close()
        self.discovery.close()
        if self._beat is not None:
            self._beat.cancel()
        for subs in self._subs.values():
            for sub in subs:
                sub._end()
        self._subs.clear()
        self._handlers.clear()


class PubSubActor:
    """What members call: ``rpc(batch)`` hands a router batch over (see ``wire``)."""

    NAME = NAME

    def __init__(self, service: PubSubService) -> None:
        self._svc = service

    async def rpc(self, batch: list) -> None:
        caller = current_caller()
        if caller is None or caller == self._svc.rt.peer_id:
            return
        self._svc.on_rpc(caller, batch)

    async def open_rpc(self, batch: list) -> None:
        """A stranger's batch (anyone may call it): only its parts about our open topics count."""
        svc = self._svc
        if not svc.cfg.open_topics:
            raise PermissionDenied(f"{svc.rt.peer_id} opens no pub-sub topic to strangers")
        caller = current_caller()
        if caller is None or caller == svc.rt.peer_id:
            return
        svc.on_rpc(caller, batch, stranger=True)


async def _logged(aw: Any, topic: str) -> None:
    try:
        await aw
    except Exception:
        log.exception("pub-sub handler failed", topic=topic)


def _ip_of(addr: Any) -> str | None:
    try:
        return str(addr.without_peer_id().host_port()[0])
    except (LatticaError, AttributeError, ValueError, TypeError):
        return None
