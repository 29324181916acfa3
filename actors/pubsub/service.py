"""The ``pubsub`` system service: a GossipSub router (``lattica.pubsub.router``) on the node.

The service feeds the router what happens (members connecting and leaving, peers' batches, the
heartbeat) and carries out what it answers: batches go to peers as calls to their ``pubsub``
actor, one queue per peer bounded by ``peer_queue`` messages (IHAVE gossip dropped first, then
the oldest messages) with at most ``in_flight`` calls on the way.

Our messages published in one turn of the node's loop to one topic leave as one bundle under one
signature (``bundle``): a publisher faster than the network sends fewer, larger messages, and
receivers check one signature per bundle. A bundle from a peer is checked before the router
forwards it (the author's Ed25519 signature, once per bundle; a seqno, which is the author's
clock in ns, within ``clock_skew``; items the codec can decode; then the topic's validator on
each item): any item rejected refuses the bundle (and scores its sender down); otherwise the
accepted items are delivered and, if there are any, the bundle is passed on whole (the ignored
ones ride along, delivered nowhere they are ignored).

Subscribers find each other through the DHT: each announces itself as a provider of the topic's
key (``topic_key``) and, while it knows fewer than D_lo peers of the topic, looks the key up and
connects to some of the providers (by PeerId: direct, punched or relayed, as any dial). Mesh
peers' connections are kept open while idle.

Exposure (docs/security.md): members only. A mesh's topics are the mesh's business; a stranger
can neither publish into them nor read them through us. Topics a node opens
(``PubSubConfig.open_topics``) are the exception: strangers become router peers for those topics
alone, calling ``open_rpc`` (every other part of their batches is dropped, and nothing of another
topic goes to them), and those topics' authors need not be members.
"""

from __future__ import annotations

import asyncio
import inspect
import time
from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, cast

from lattica import codec
from lattica.budget import Buckets, StrangersShare
from lattica.config import PubSubConfig
from lattica.errors import ActorNotFound, LatticaError, PermissionDenied, ProtocolError
from lattica.identity import PeerId, verify_signature
from lattica.interfaces import host_key, ip_of, is_loopback_ip
from lattica.logging import get_logger
from lattica.records import mesh_scoped
from lattica.runtime import current_caller
from lattica.runtime.limits import ASYNC
from lattica.runtime.refs import ActorRef

if TYPE_CHECKING:
    from lattica.actors.pubsub import wire
    from lattica.actors.pubsub.bundle import MAX_FLOODED, Bundle
    from lattica.identify import PeerInfo
    from lattica.pubsub.router import Envelope, GossipParams, Router, Rpc
    from lattica.pubsub.subscription import Message, Subscription
    from lattica.runtime import Runtime
    from lattica.transports.base import Connection

log = get_logger("lattica.pubsub")

__all__ = ["PubSubService", "PubSubActor", "pubsub_ref", "topic_key"]

NAME = "pubsub"
ACCEPT, REJECT, IGNORE = "accept", "reject", "ignore"  # (the router's verdicts)
_VERDICTS = {True: ACCEPT, False: REJECT, None: IGNORE, ACCEPT: ACCEPT, REJECT: REJECT, IGNORE: IGNORE}


def _load() -> None:
    """The router, its scores, the wire form and subscriptions load when a node first uses pub-sub
    (a topic of its own, or a peer's batch): a node that never does pays nothing at start."""
    global wire, Bundle, MAX_FLOODED, Envelope, GossipParams, Router, Rpc, Message, Subscription
    from lattica.actors.pubsub import wire  # (first use: see above)
    from lattica.actors.pubsub.bundle import MAX_FLOODED, Bundle  # (first use)
    from lattica.pubsub.router import Envelope, GossipParams, Router, Rpc  # (first use)
    from lattica.pubsub.subscription import Message, Subscription  # (first use)


_KEYS_MAX = 4096  # authors whose public keys we keep decoded
_TOPIC_DOMAIN = b"lattica pubsub topic\x00"
_PROVIDE_TTL = 1800.0  # of our provider record for a topic we joined (the DHT re-announces it)
_FIND_EVERY = (1.0, 60.0)  # first and longest wait between lookups while a topic's peers are few
_MESH_TAG = "pubsub mesh"
_STRANGER_BATCHES = (50.0, 100.0)  # batches a second (and at once) we take from one stranger
_STRANGERS_BATCHES = (20.0, 40.0)  # ... and from all strangers together (a batch holds up to hundreds of messages)
_FLUSH_WAIT = 2.0  # seconds a stopping node gives its pub-sub batches on the way to arrive
_FAILED_FOR = 600.0  # seconds a topic provider we could not reach is not tried again
# direct dials to one IP address for topic providers: anyone may put provider records in the
# DHT, naming addresses of a third party; at most this many dials to it, then one per 30 s
_DIALS_PER_IP = (1 / 30, 2.0)
_BATCH_BYTES = 8 << 20  # messages' bytes in one call to a peer (far below a frame's limit)
# strangers' messages are checked this many at a turn of the loop, members' work in between: a
# stranger's batch costs members a wait of a few signature checks, not of hundreds
_STRANGERS_SLICE = 4
_STRANGERS_WAITING = 1024  # strangers' messages waiting for their turn (the oldest dropped beyond)


class _Batch:
    """Our messages to one topic waiting for the end of this turn of the loop, to go as one
    signed bundle; ``reach`` is what each publish reports (the peers it goes to)."""

    __slots__ = ("bodies", "datas", "size", "reach")

    def __init__(self, reach: int, body: bytes | None = None, data: Any = None) -> None:
        self.bodies: list[bytes] = [] if body is None else [body]
        self.datas: list[Any] = [] if body is None else [data]
        self.size = 0 if body is None else len(body)
        self.reach = reach


def topic_key(topic: str) -> bytes:
    """The DHT key under which a topic's subscribers announce themselves (sha2-256 multihash)."""
    import hashlib  # (a node that joins no topic does not load it)

    return b"\x12\x20" + hashlib.sha256(_TOPIC_DOMAIN + topic.encode()).digest()


def pubsub_ref(peer: PeerId) -> ActorRef:
    """The ref of ``peer``'s pubsub system actor."""
    return ActorRef(peer, NAME, {"rpc": ASYNC, "open_rpc": ASYNC})


class _Outbound:
    """What waits to be sent to one peer: one merged batch (its messages' bytes counted), and
    the calls on the way."""

    __slots__ = ("pending", "bytes", "in_flight", "dropped")

    def __init__(self) -> None:
        self.pending = Rpc()
        self.bytes = 0
        self.in_flight = 0
        self.dropped = 0

    def add(self, rpc: Rpc, cap: int, cap_bytes: int) -> None:
        p = self.pending
        p.subscribe = (p.subscribe + rpc.subscribe)[-wire.MAX_ENTRIES :]
        p.graft = (p.graft + rpc.graft)[-wire.MAX_ENTRIES :]
        p.prune = (p.prune + rpc.prune)[-wire.MAX_ENTRIES :]
        p.choke = (p.choke + rpc.choke)[-wire.MAX_ENTRIES :]
        p.unchoke = (p.unchoke + rpc.unchoke)[-wire.MAX_ENTRIES :]
        p.messages += rpc.messages
        self.bytes += sum(m.size for m in rpc.messages)
        p.ihave += rpc.ihave
        p.iwant += rpc.iwant
        p.idontwant += rpc.idontwant
        over = len(p.messages) + sum(len(ids) for _, ids in p.ihave) // 64 - cap
        if (over > 0 or self.bytes > cap_bytes) and p.ihave:
            p.ihave = []  # gossip goes first
            over = len(p.messages) - cap
        if over > 0 or self.bytes > cap_bytes:  # then the oldest messages
            n = max(over, 0)
            gone = sum(m.size for m in p.messages[:n])
            while self.bytes - gone > cap_bytes and n < len(p.messages):
                gone += p.messages[n].size
                n += 1
            del p.messages[:n]
            self.bytes -= gone
            self.dropped += n
        if len(p.ihave) > wire.MAX_IHAVE_TOPICS:
            del p.ihave[: len(p.ihave) - wire.MAX_IHAVE_TOPICS]
        ids = sum(len(i) for _, i in p.ihave)
        if ids + len(p.iwant) + len(p.idontwant) > wire.MAX_BATCH_IDS:
            room = (
                wire.MAX_BATCH_IDS // 2
            )  # IWANT and IDONTWANT at most half each, then IHAVE ids, newest first, as far as they fit
            del p.iwant[: max(len(p.iwant) - room, 0)]
            del p.idontwant[: max(len(p.idontwant) - room, 0)]
            left = wire.MAX_BATCH_IDS - len(p.iwant) - len(p.idontwant)
            kept: list = []
            for topic, i in reversed(p.ihave):
                if left <= 0:
                    break
                kept.append((topic, i[-left:]))
                left -= len(kept[-1][1])
            p.ihave = kept[::-1]

    def take(self) -> Rpc:
        """The next batch within the wire's limits: at most ``MAX_ENTRIES`` messages and
        ``_BATCH_BYTES`` of them (or one); the rest stays pending."""
        p = self.pending
        n = size = 0
        for m in p.messages:
            if n == wire.MAX_ENTRIES or (n and size + m.size > _BATCH_BYTES):
                break
            n += 1
            size += m.size
        if n == len(p.messages):
            self.pending = Rpc()
            self.bytes = 0
            return p
        out = Rpc(
            subscribe=p.subscribe,
            messages=p.messages[:n],
            ihave=p.ihave,
            iwant=p.iwant,
            graft=p.graft,
            prune=p.prune,
            idontwant=p.idontwant,
            choke=p.choke,
            unchoke=p.unchoke,
        )
        self.pending = Rpc(messages=p.messages[n:])
        self.bytes -= size
        return out


class PubSubService:
    """A node's router, subscriptions and validators (see the module docstring)."""

    def __init__(self, runtime: Runtime, config: PubSubConfig | None = None) -> None:
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
        self._payloads: dict[
            bytes, tuple[list, Any]
        ] = {}  # message id -> ([(item, decoded data)], peer it came from), until delivered
        self._batches: dict[str, _Batch] = {}
        self._send_later: asyncio.Handle | None = None  # the batches' departure
        rate = self.cfg.author_rate
        # bundles from each author we check (see ``_check``), and our own pace: half that
        self._rates = Buckets(rate, max(rate, 1.0), _KEYS_MAX, clock=self._now)
        self._own_rate = Buckets(rate / 2, max(rate / 2, 1.0), 1, clock=self._now)
        self._out: dict[PeerId, _Outbound] = {}
        self._keys: dict[bytes, bytes | None] = {}
        self._members: dict[bytes, float] = {}  # authors known to be members: until when (their certificate's expiry)
        self._validating = 0  # async validations running
        self._unheard: dict[PeerId, float] = {}  # peers added that have not sent their first batch: when
        self._heard = asyncio.Event()
        self._drained = asyncio.Event()  # a batch went out: publishers waiting for room look again
        self._finding: dict[str, asyncio.Task] = {}  # topic -> its discovery (``_discover``)
        self._protected: set[PeerId] = set()  # mesh peers whose idle connections we keep
        self._failed: dict[PeerId, float] = {}  # topic providers we could not reach: when
        self._strangers: set[PeerId] = set()  # router peers outside our mesh: open topics only
        self._stranger_batches = Buckets(*_STRANGER_BATCHES, _KEYS_MAX)
        self._strangers_batches = StrangersShare(
            *_STRANGERS_BATCHES, lambda peer: True
        )  # (asked for strangers' batches only)
        rate = max(self.cfg.strangers_messages, 0.0)
        self._strangers_messages = StrangersShare(
            rate, max(2 * rate, 1.0), lambda peer: True
        )  # (PubSubConfig.strangers_messages)
        self._strangers_waiting: deque[tuple[PeerId, Envelope]] = deque(maxlen=_STRANGERS_WAITING)
        self._strangers_turn: asyncio.Handle | None = None
        self._dials = Buckets(*_DIALS_PER_IP, _KEYS_MAX)
        self._closed = False
        self.published = self.delivered = self.rejected = self.bundles = self.copies = (
            0  # copies: items of peers' messages received
        )
        self.host.events.identified.subscribe(self._on_identified)
        self.host.events.disconnected.subscribe(self._on_disconnected)

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
            for info in list(self.host.info.values()):
                if (
                    (info.circle != "stranger" or self.cfg.open_topics)
                    and info.peer_id != self.rt.peer_id
                    and info.peer_id not in router.peers
                ):
                    if info.circle == "stranger":
                        self._strangers.add(info.peer_id)
                    router.add_peer(info.peer_id, self._now(), ip=_ip_of(info.remote_addr))
                    self._unheard[info.peer_id] = self._now()  # (a publish waits for their topics: ``publish_soon``)
                    self.host.spawn(self._measure(info.peer_id))
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
            if self.cfg.discover and topic not in self._finding:
                self._finding[topic] = self.host.spawn(self._discover(topic))
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
            task = self._finding.pop(topic, None)
            if task is not None:
                task.cancel()
            dht = self.rt.services.get("dht")
            if dht is not None:
                dht.stop_providing(self.rendezvous(topic))

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
        the loop (or when our bundle rate allows), in one bundle with the topic's others."""
        self.router  # noqa: B018 -- (loads the machinery at first use)
        wire.check_topic(topic)
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
            if self._send_wait() <= 0 and not any(o.in_flight for o in self._out.values()):
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
        while not self._closed and self._backlogged():
            self._drained.clear()
            try:
                await asyncio.wait_for(self._drained.wait(), 1.0)
            except TimeoutError:
                pass
        return self.publish(topic, data)

    def _backlogged(self) -> bool:
        """Whether the slowest peer that is taking any messages has half its queue waiting."""
        cfg = self.cfg
        return any(
            o.in_flight and (len(o.pending.messages) >= cfg.peer_queue // 2 or o.bytes >= cfg.peer_queue_bytes // 2)
            for o in self._out.values()
        )

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
            "dropped_to_peers": sum(o.dropped for o in self._out.values()),
        }

    # -- peers ----------------------------------------------------------------------------------

    def _now(self) -> float:
        return self.host.loop.time()

    def _on_identified(self, info: PeerInfo) -> None:
        if (info.circle == "stranger" and not self.cfg.open_topics) or self._closed or self._router is None:
            return  # (a router made later takes every member connected by then)
        peer = info.peer_id
        if info.circle == "stranger":
            self._strangers.add(peer)
        else:
            self._strangers.discard(peer)
        if peer in self.router.peers:
            self.router.scores.connected(peer, _ip_of(info.remote_addr))  # (a batch may have come first)
            return
        self.router.add_peer(peer, self._now(), ip=_ip_of(info.remote_addr))
        self._unheard[peer] = self._now()
        self.host.spawn(self._measure(peer))
        self._pump()

    async def _discover(self, topic: str) -> None:
        """Announce ourselves under the topic's key, and while we know fewer than D_lo of its
        peers, look the key up and connect to providers we are not connected to (up to D)."""
        dht = self.rt.services.get("dht")
        if dht is None:
            return
        key = self.rendezvous(topic)
        provided = False
        wait = _FIND_EVERY[0]
        while not self._closed:
            if not provided:
                try:
                    provided = await dht.provide(key, ttl=_PROVIDE_TTL) > 0
                except (TimeoutError, LatticaError) as e:
                    log.debug("pub-sub topic not announced yet", topic=topic, reason=str(e))
            known = len(self.router.topics.get(topic, ()))
            if known < self.cfg.d_lo:
                try:
                    found = await dht.find_providers(key, count=20)
                except (TimeoutError, LatticaError) as e:
                    log.debug("pub-sub topic lookup failed", topic=topic, reason=str(e))
                    found = []
                now = self._now()
                fresh = [
                    p
                    for p in found
                    if p != self.rt.peer_id
                    and p not in self.host.conns
                    and now - self._failed.get(p, -_FAILED_FOR) >= _FAILED_FOR
                ]
                fresh = fresh[: max(self.cfg.d - known, 0)]
                await asyncio.gather(*(self._connect(p) for p in fresh))
                wait = min(wait * 2, _FIND_EVERY[1])
            else:
                wait = _FIND_EVERY[1]
            await asyncio.sleep(wait if provided else min(wait, 5.0))

    async def _connect(self, peer: PeerId) -> None:
        """Dial a topic provider, unless a direct address it names has had its dials (circuits
        are the relays' to check); one we cannot reach is left alone for ``_FAILED_FOR``."""
        ips = {
            host_key(ip)
            for a in self.host.peer_addrs.get(peer, ())
            if (ip := ip_of(a)) is not None and not is_loopback_ip(ip)
        }
        if not all([self._dials.take(ip) for ip in ips]):
            log.debug("pub-sub topic peer not dialed: its address had its dials", peer=str(peer))
            return
        try:
            await self.host.get_connection(peer)
        except (TimeoutError, LatticaError, OSError) as e:
            log.debug("pub-sub topic peer not reached", peer=str(peer), reason=str(e))
            if len(self._failed) >= _KEYS_MAX:
                self._failed.pop(next(iter(self._failed)))
            self._failed[peer] = self._now()

    def _keep_mesh_connections(self) -> None:
        """Mesh peers' connections stay open while idle; others are the connection manager's."""
        # (the router keeps the PeerIds we give it as hashables)
        mesh = cast("set[PeerId]", set().union(*self.router.mesh.values()) if self.router.mesh else set())
        for peer in mesh - self._protected:
            self.host.protect(peer, _MESH_TAG)
        for peer in self._protected - mesh:
            self.host.unprotect(peer, _MESH_TAG)
        self._protected = mesh

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
            self._strangers.discard(peer)
        if self._router is not None and peer in self._router.peers:
            self.router.remove_peer(peer, self._now())
            self._out.pop(peer, None)
            self._pump()

    def on_rpc(self, peer: PeerId, raw: Any, stranger: bool = False) -> None:
        """A member's batch (the actor's call), or, with ``stranger``, a batch of which only the
        parts about our open topics are looked at."""
        if self._closed or peer not in self.host.conns:
            return
        if stranger and not (self._stranger_batches.take(peer) and self._strangers_batches.take(peer)):
            return  # (more than a stranger's share, or than all strangers': dropped unread)
        if self.router.score(peer, self._now()) < self.router.scores.params.graylist_threshold:
            return  # graylisted: not even parsed
        if stranger:
            raw = self._strangers_part(peer, raw)
        try:
            rpc = wire.decode(raw, self.cfg.max_message_bytes)
        except ProtocolError:
            self.router.scores.misbehaved(peer)
            raise
        if stranger:
            rpc = self._only_open(rpc, to_stranger=False)
            self._strangers.add(peer)
            self._strangers_waiting.extend((peer, m) for m in rpc.messages)
            rpc.messages = []  # (checked a few at a turn of the loop: ``_strangers_slice``)
            self._strangers_next()
        self._as_router_peer(peer)
        if self._unheard.pop(peer, None) is not None:
            self._heard.set()
        for env in rpc.messages:
            self.copies += env.data.count
        self.router.on_rpc(peer, rpc, self._now())
        self._pump()

    def _as_router_peer(self, peer: PeerId) -> None:
        """A peer that sent us a batch is the router's peer (its identify may still be on the way)."""
        if peer not in self.router.peers:
            self.router.add_peer(peer, self._now())
            self.host.spawn(self._measure(peer))

    def _strangers_next(self) -> None:
        """Take the next slice of strangers' messages at the loop's next turn (if any wait)."""
        if self._strangers_turn is None and self._strangers_waiting and not self._closed:
            self._strangers_turn = self.host.loop.call_soon(self._strangers_slice)

    def _strangers_slice(self) -> None:
        """Strangers' messages, a few (``_STRANGERS_SLICE``): what came from members meanwhile
        is served between the slices."""
        self._strangers_turn = None
        now, waiting = self._now(), self._strangers_waiting
        try:
            for _ in range(min(_STRANGERS_SLICE, len(waiting))):
                peer, env = waiting.popleft()
                if peer in self.host.conns:  # (still connected)
                    self._as_router_peer(peer)
                    self.copies += env.data.count
                    self.router.on_rpc(peer, Rpc(messages=[env]), now)
            self._pump()
        finally:
            self._strangers_next()  # (the rest waits its turn whatever became of this slice)

    async def _heartbeats(self) -> None:
        while True:
            await asyncio.sleep(self.cfg.heartbeat)
            try:
                self.router.heartbeat(self._now())
                self._pump()
                self._keep_mesh_connections()
            except Exception:  # one bad heartbeat must not end the mesh's upkeep
                log.exception("pub-sub heartbeat failed")

    # -- carrying out what the router says ------------------------------------------------------

    def _pump(self) -> None:
        r = self.router
        for env, peer in r.take_to_validate():
            verdicts = self._check(env, peer)
            waiting = sum(1 for v in verdicts if inspect.isawaitable(v)) if type(verdicts) is list else 0
            if waiting:
                if self._validating + waiting > self.cfg.max_validating:
                    for v in verdicts:
                        _close(v)
                    self._verdict(env, IGNORE)  # too many waiting on the application: drop, no blame
                    continue
                self._validating += waiting
                self.host.spawn(self._finish(env, verdicts, waiting))
            else:
                self._verdict(env, verdicts)
        for env in r.take_delivered():
            self._deliver(env)
        for peer, rpc in cast("dict[PeerId, Rpc]", r.take_outgoing()).items():  # (the PeerIds we gave the router)
            if peer in self._strangers:
                rpc = self._only_open(rpc, to_stranger=True)
                if not rpc:
                    continue
            ob = self._out.get(peer)
            if ob is None:
                ob = self._out[peer] = _Outbound()
            ob.add(rpc, self.cfg.peer_queue, self.cfg.peer_queue_bytes)
            if ob.in_flight < self.cfg.in_flight:
                ob.in_flight += 1
                self.host.spawn(self._drain(peer, ob))

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
        verdicts: list[str] | str
        try:
            verdicts = await asyncio.wait_for(_gather_verdicts(pending, env.topic), self.cfg.validate_timeout)
        except TimeoutError:
            log.info("pub-sub validator timed out", topic=env.topic, seconds=self.cfg.validate_timeout)
            verdicts = IGNORE
        except Exception:
            log.exception("pub-sub validator failed", topic=env.topic)
            verdicts = IGNORE
        finally:
            self._validating -= waiting
        self._verdict(env, verdicts)
        self._pump()

    def _check(self, env: Envelope, peer: Any) -> Any:
        """REJECT, or each item's verdict: a list, holding awaitables where an async validator
        is still at work."""
        b: Bundle = env.data
        key = self._key(env.author)
        if key is None or not verify_signature(key, env.signature, b.signed_bytes(env.topic, env.author, env.seqno)):
            return REJECT
        if abs(env.seqno / 1e9 - time.time()) > self.cfg.clock_skew:
            return REJECT  # a replay from beyond the seen cache, or a clock far off
        if not self._open(env.topic) and not self._is_member(env.author, b.certs):
            return IGNORE  # an author outside the mesh (not the sender's doing: it may know the author better)
        if not self._rates.take(env.author):
            # (the author's doing, not the sender's): no author can push the seen cache's
            # 100,000 entries out within the clock window (and so replay its old messages)
            return IGNORE
        try:
            items = [(i, codec.decode(d)) for i, d in enumerate(b.items)]
        except LatticaError:
            return REJECT
        self._payloads[env.id] = (items, peer)
        fn = self._validators.get(env.topic)
        if fn is None:
            return [ACCEPT] * len(items)
        author = PeerId.from_bytes(env.author)
        verdicts: list = []
        for i, data in items:
            try:
                out = fn(Message(env.topic, author, env.seqno + i, data, peer))
            except Exception:
                log.exception("pub-sub validator failed", topic=env.topic)
                out = IGNORE
            verdicts.append(out if inspect.isawaitable(out) else _verdict_of(out))
        return verdicts

    def rendezvous(self, topic: str) -> bytes:
        """The DHT key a topic's subscribers meet under: in a mesh (of a key) a closed topic's is
        scoped to it, so only its members' provider records are kept there; an open topic's, or
        any in a mesh of listed PeerIds, is the plain ``topic_key`` (providers ranked members first)."""
        key = topic_key(topic)
        cert = None if self._open(topic) else self.host.trust.certificate(time.time())
        return key if cert is None else mesh_scoped(key, cert.mesh)

    def _open(self, topic: str | None) -> bool:
        """Whether ``topic`` is one we opened to strangers."""
        return topic is not None and any(
            t == topic or (t.endswith("*") and topic.startswith(t[:-1])) for t in self.cfg.open_topics
        )

    def _only_open(self, rpc: Rpc, to_stranger: bool) -> Rpc:
        """The parts of ``rpc`` about our open topics: what a stranger may send us (it may ask
        only for their messages) or be sent (ids of no other topic's messages)."""
        ok, topic_of = self._open, self.router.topic_of
        iwant = (
            rpc.iwant if to_stranger else [i for i in rpc.iwant if ok(topic_of(i))]
        )  # (ours answer its IHAVEs of open topics)
        idontwant = [i for i in rpc.idontwant if ok(topic_of(i))] if to_stranger else rpc.idontwant
        return Rpc(
            subscribe=[(t, on) for t, on in rpc.subscribe if ok(t)],
            messages=[m for m in rpc.messages if ok(m.topic)],
            ihave=[(t, ids) for t, ids in rpc.ihave if ok(t)],
            iwant=iwant,
            graft=[t for t in rpc.graft if ok(t)],
            prune=[(t, b) for t, b in rpc.prune if ok(t)],
            idontwant=idontwant,
            choke=[t for t in rpc.choke if ok(t)],
            unchoke=[t for t in rpc.unchoke if ok(t)],
        )

    def _strangers_part(self, peer: PeerId, raw: Any) -> Any:
        """A stranger's batch with only as many of its messages as the strangers' share has
        left (the rest dropped before they are decoded, checked or remembered): what all
        strangers' messages together cost us is bounded, however many identities send them."""
        if type(raw) is not list or len(raw) < 2 or type(raw[1]) is not list or not raw[1]:
            return raw  # (nothing to cut; a malformed batch is wire.decode's to refuse)
        k = self._strangers_messages.take_up_to(peer, len(raw[1]))
        return raw if k == len(raw[1]) else [raw[0], raw[1][:k], *raw[2:]]

    def _is_member(self, author: bytes, certs: Any) -> bool:
        """Whether ``author`` belongs to our mesh, by its certificates (as in identify) or its
        PeerId: a mesh's topics carry only its members' messages."""
        until = self._members.get(author)
        if until is not None and until > time.time():
            return True
        trust = self.host.trust
        if trust.open:
            return True
        try:
            verdict = trust.judge(PeerId.from_bytes(author), list(certs), time.time())
        except LatticaError:
            return False
        if verdict.circle == "stranger":
            return False
        if len(self._members) >= _KEYS_MAX:
            self._members.pop(next(iter(self._members)))
        self._members[author] = verdict.until
        return True

    def _key(self, author: bytes) -> Any:
        """The author's public key (decoded once), or None if its PeerId holds none."""
        if author in self._keys:
            return self._keys[author]
        try:
            key = PeerId.from_bytes(author).public_key()
        except LatticaError:
            key = None
        if len(self._keys) >= _KEYS_MAX:
            self._keys.pop(next(iter(self._keys)))
        self._keys[author] = key
        return key

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

    async def _drain(self, peer: PeerId, ob: _Outbound) -> None:
        try:
            while ob.pending and self._out.get(peer) is ob:
                rpc = ob.take()
                try:
                    method = "open_rpc" if peer in self._strangers else "rpc"
                    await self.rt.call(pubsub_ref(peer), method, (wire.encode(rpc),), {}, timeout=10.0)
                except (ActorNotFound, PermissionDenied) as e:
                    log.debug("peer does not take pub-sub from us", peer=str(peer), reason=str(e))
                    self.router.remove_peer(peer, self._now())
                    self._out.pop(peer, None)
                    return
                except LatticaError as e:
                    ob.dropped += len(rpc.messages)
                    log.debug("pub-sub batch not delivered", peer=str(peer), reason=str(e))
                finally:
                    self._drained.set()
        finally:
            ob.in_flight -= 1

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
        while any(o.in_flight for o in self._out.values()) and loop.time() < deadline:
            self._drained.clear()
            try:
                await asyncio.wait_for(self._drained.wait(), deadline - loop.time())
            except TimeoutError:
                break

    def close(self) -> None:
        if self._send_later is not None:
            self._send_later.cancel()
        self._send_all()  # (what was published this turn goes, as far as the closing node still gets it)
        self._closed = True
        if self._strangers_turn is not None:
            self._strangers_turn.cancel()
        self._strangers_waiting.clear()
        for task in self._finding.values():
            task.cancel()
        self._finding.clear()
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


async def _gather_verdicts(pending: list, topic: str) -> list[str]:
    """The verdicts of a bundle's items, some still being worked out by an async validator."""
    outs = iter(await asyncio.gather(*(v for v in pending if inspect.isawaitable(v)), return_exceptions=True))
    verdicts = []
    for v in pending:
        if inspect.isawaitable(v):
            out = next(outs)
            if isinstance(out, Exception):
                log.error("pub-sub validator failed", topic=topic, error=repr(out))
            v = _verdict_of(out)
        verdicts.append(v)
    return verdicts


def _verdict_of(out: Any) -> str:
    """A validator's answer as a verdict: anything it should not have said is "ignore"."""
    try:
        return _VERDICTS.get(out, IGNORE)
    except TypeError:  # (unhashable)
        return IGNORE


async def _logged(aw: Any, topic: str) -> None:
    try:
        await aw
    except Exception:
        log.exception("pub-sub handler failed", topic=topic)


def _close(aw: Any) -> None:
    close = getattr(aw, "close", None)
    if close is not None:
        close()  # a coroutine never awaited: no warning


def _ip_of(addr: Any) -> str | None:
    try:
        return str(addr.without_peer_id().host_port()[0])
    except (LatticaError, AttributeError, ValueError, TypeError):
        return None
