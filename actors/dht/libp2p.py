"""libp2p Kademlia beside our own DHT (issue 49): one :class:`KadNetwork` per protocol id (IPFS's
``/ipfs/kad/1.0.0``, a Lattica SDK swarm's ``protocolVersion``), each with its own routing table,
served and asked over libp2p streams.

The keyspace is ours (a node id is ``sha256(PeerId bytes)``, a key's id ``sha256(key)``), so the
sans-IO core is shared: :class:`lattica.dht._kademlia.RoutingTable` and ``Lookup``. What differs
is the wire (``lattica.dht._libp2p_wire``: one uvarint-delimited protobuf request and answer per
stream), what a record is (plain bytes judged by the network's validators) and who enters the
table: a peer whose identify lists the protocol (libp2p's server mode) and gives listen addresses.
Lattica nodes list it too, so they are in both tables; our own records stay on our DHT.

Peers' requests are answered from local state only, within a request budget per peer and one
that all peers outside our mesh share; over it, the stream is reset (libp2p's Kademlia has no
error answer).
"""

from __future__ import annotations

import asyncio
import collections
import random
import time
from collections.abc import Awaitable, Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from lattica._budget import Buckets, StrangersShare, Turns
from lattica._digest import sha256
from lattica._framing import read_delimited, write_delimited
from lattica._identity import PeerId
from lattica._interfaces import is_private
from lattica._multiaddr import Multiaddr
from lattica._rpc import PROTOCOL as RPC_PROTOCOL
from lattica.actors.dht.state import on_our_lan
from lattica.config import KadConfig
from lattica.dht._kademlia import Lookup, RoutingTable, key_id, node_id
from lattica.dht._libp2p_store import KadValues, provider_book
from lattica.dht._libp2p_validators import Validator
from lattica.dht._libp2p_wire import MAX_MESSAGE, KadMessage, KadPeer, KadRecord, MessageType, decode, encode
from lattica.errors import (
    DhtError,
    LatticaError,
    PeerNotFound,
    ProtocolError,
    RecordRejected,
    StoreFailed,
    StreamClosed,
)
from lattica.logging import get_logger

if TYPE_CHECKING:
    from lattica._hostview import HostView
    from lattica._identify import PeerInfo
    from lattica.transports.base import Connection, Stream

__all__ = ["KadNetwork", "KadNetworks", "KadLookupStats"]

log = get_logger("lattica.kad")

MAX_HINT_ADDRS = 8  # addresses of a peer we keep from an answer, and give in ours
_IDLE = 10.0  # s a served stream may sit between requests (peers may reuse a stream)
_REQUESTS_PER_STREAM = 64
_REFRESHED_BUCKETS = 14  # the farthest buckets refreshed by pre-image: nearly every peer is there
_PREIMAGE_TRIES = 1 << 20  # cap of one search; the nearest of them needs 2**14 tries on average
_PREIMAGES_KEPT = 8  # keys kept for each bucket, so refreshes vary the region they look up
_UPKEEP_TICK = 30.0


class _Garbage(Exception):
    """A peer's answer does not follow the protocol."""


@dataclass(slots=True)
class KadLookupStats:
    kind: str
    rounds: int
    queried: int
    seconds: float


@dataclass(slots=True)
class _Own:
    """What we keep alive on the network: our values and the keys we provide, with when each
    was last (re)published."""

    values: dict[bytes, tuple[bytes, float]] = field(default_factory=dict)
    provided: dict[bytes, float] = field(default_factory=dict)


def bucket_preimages(local: int, rng: random.Random | None = None) -> dict[int, list[bytes]]:
    """Keys whose ids (``sha256(key)``) fall in each of our ``_REFRESHED_BUCKETS`` farthest
    buckets, found by trying random keys: libp2p peers hash what we ask for, so a bucket's
    refresh key must be a pre-image. The nearest of those buckets takes 2**14 tries on average;
    missing one after ``_PREIMAGE_TRIES`` has odds of e**-64."""
    rng = rng or random.Random()
    nearest = 256 - _REFRESHED_BUCKETS
    found: dict[int, list[bytes]] = {index: [] for index in range(nearest, 256)}
    missing = set(found)
    for _ in range(_PREIMAGE_TRIES):
        key = rng.randbytes(32)
        index = (int.from_bytes(sha256(key), "big") ^ local).bit_length() - 1
        keys = found.get(index)
        if keys is None or len(keys) >= _PREIMAGES_KEPT:
            continue
        keys.append(key)
        missing.discard(index)
        if not missing:
            break
    return found


class KadNetwork:
    """One libp2p Kademlia network: its routing table, what we hold for it, the requests we
    answer, and the lookups we run (peer routing, providers, values)."""

    def __init__(
        self,
        host: HostView,
        protocol: str,
        validator: Validator,
        config: KadConfig | None = None,
        member: Callable[[PeerId], bool] | None = None,
    ) -> None:
        self.host = host
        self.protocol = protocol
        self.cfg = cfg = config or KadConfig()
        self.peer_id = host.peer_id
        self._member = member or (lambda peer: host.circle_of(peer) != "stranger")
        self.table = RoutingTable(self.peer_id, cfg.k, ping_after=30.0)
        self.values = KadValues(
            validator, cfg.record_ttl, cfg.max_records, cfg.peer_records, cfg.max_value, member=self._member
        )
        self.providers = provider_book(self.peer_id, cfg.provider_ttl, self._member)
        self.own = _Own()
        self.stats: collections.deque[KadLookupStats] = collections.deque(maxlen=1000)
        self.misbehaved: collections.OrderedDict[PeerId, str] = collections.OrderedDict()
        self._rates = Buckets(cfg.request_rate, cfg.request_burst, max_keys=10_000)
        self._strangers = Turns(
            StrangersShare(cfg.stranger_rate, cfg.stranger_burst, lambda p: not self._member(p)), host.loop
        )
        self._checking: set[PeerId] = set()
        # a node sends nothing on the network until local code first asks it something: until
        # then it serves, and its table fills from identify alone (no lookups to every peer met)
        self._active = False
        self._preimages: dict[int, list[bytes]] | None = None
        self._others: set[PeerId] = set()  # peers met that are libp2p nodes, not Lattica ones
        if cfg.server:
            host.set_handler(protocol, self._serve)
        host.events.identified.subscribe(self._on_identified)

    # -- the routing table ----------------------------------------------------------------------

    def _on_identified(self, info: PeerInfo) -> None:
        """A peer is in the table when its identify lists the protocol (server mode) and direct
        listen addresses; one that stopped listing it leaves."""
        if self.protocol in info.protocols and info.listen_addrs and not all(a.is_circuit for a in info.listen_addrs):
            self._seen(info.peer_id)
            if RPC_PROTOCOL not in info.protocols:  # (another implementation: go, rust, js, the SDK)
                self._others.add(info.peer_id)
                if len(self._others) > 4 * self.cfg.k * 64:
                    self._others = {p for p in self._others if p in self.table}
        elif info.peer_id in self.table:
            self.table.remove(info.peer_id)

    def _seen(self, peer: PeerId) -> None:
        if peer in self.misbehaved:
            return
        oldest = self.table.seen(peer)
        if oldest is not None and not self._active:
            self.table.ping_result(oldest, True)  # (a node that only serves keeps its proven peers)
        elif oldest is not None and oldest not in self._checking:
            self._checking.add(oldest)
            self.host.spawn(self._check(oldest))

    async def _check(self, peer: PeerId) -> None:
        """A full bucket's oldest peer: still there if it answers a FIND_NODE for itself (what
        go-libp2p asks before it lets a peer into its table)."""
        alive = False
        try:
            answer = await self._ask(peer, KadMessage(MessageType.FIND_NODE, peer.to_bytes()))
            alive = answer is not None
        except (LatticaError, OSError, TimeoutError, _Garbage):
            pass
        finally:
            self._checking.discard(peer)
        self.table.ping_result(peer, alive)

    def _misbehaved(self, peer: PeerId, reason: str) -> None:
        log.info("Kademlia peer misbehaved", protocol=self.protocol, peer=str(peer), reason=reason)
        self.table.remove(peer)
        self.misbehaved.pop(peer, None)
        self.misbehaved[peer] = reason
        while len(self.misbehaved) > 1024:
            self.misbehaved.popitem(last=False)

    def _addrs_for(self, peer: PeerId, to: PeerId | None) -> tuple[Multiaddr, ...]:
        """``peer``'s addresses as we give them to ``to``: ours if it is us; private ones only
        to a peer on our private network (to others they would cost a dial timeout)."""
        addrs = self.host.advertised_addrs() if peer == self.peer_id else self.host.peer_addrs.get(peer, [])
        if to is not None and not on_our_lan(self.host, to):
            addrs = [a for a in addrs if not is_private(a)]
        return tuple(addrs[:MAX_HINT_ADDRS])

    def _kad_peers(self, peers: Iterable[PeerId], to: PeerId | None) -> tuple[KadPeer, ...]:
        out = []
        for p in peers:
            addrs = self._addrs_for(p, to)
            if addrs:
                out.append(KadPeer(p, addrs))
        return tuple(out)

    def _closer(self, key: bytes, to: PeerId | None) -> tuple[KadPeer, ...]:
        """The k peers of our table closest to ``key``, less the asker; ourselves too when the key
        is our PeerId (go checks a new peer with that question, and wants an answer)."""
        peers = self.table.closest(key_id(key), self.cfg.k, exclude=to)
        if key == self.peer_id.to_bytes():
            peers = [self.peer_id] + peers[: self.cfg.k - 1]
        return self._kad_peers(peers, to)

    def reaches_libp2p(self) -> bool:
        """Our table holds a libp2p node that is not a Lattica one: this network reaches past our
        mesh (IPFS, an SDK swarm), so content is worth announcing and looking up on it."""
        return any(p in self.table for p in self._others)

    # -- serving --------------------------------------------------------------------------------

    async def _serve(self, stream: Stream, conn: Connection) -> None:
        """Answer requests on a peer's stream until it closes it, leaves it idle or spends its
        budget (then the stream is reset)."""
        peer = conn.remote_peer
        for _ in range(_REQUESTS_PER_STREAM):
            try:
                async with asyncio.timeout(_IDLE):
                    data = await read_delimited(stream, MAX_MESSAGE)
            except StreamClosed:  # the peer is done asking
                await stream.close()
                return
            except (TimeoutError, LatticaError):  # idle, or more than a message's worth
                stream.reset()
                return
            if not self._rates.take(peer) or not await self._strangers.take(
                peer, give_up=lambda: stream.aborted or conn.is_closed
            ):
                stream.reset()
                return
            try:
                request = decode(data)
            except ProtocolError as e:
                log.info("malformed Kademlia request", protocol=self.protocol, peer=str(peer), reason=str(e))
                stream.reset()
                return
            answer = self.answer(request, peer)
            if answer is not None:
                write_delimited(stream, encode(answer))
                try:  # (a peer that does not read its answers loses the stream, as an idle one)
                    async with asyncio.timeout(_IDLE):
                        await stream.drain()
                except (TimeoutError, LatticaError):
                    stream.reset()
                    return
        stream.reset()

    def answer(self, req: KadMessage, peer: PeerId) -> KadMessage | None:
        """Our answer to ``peer``'s request, from local state (None: the request has none)."""
        t = req.type
        if t is MessageType.FIND_NODE:
            return KadMessage(t, req.key, closer=self._closer(req.key, peer))
        if t is MessageType.GET_PROVIDERS:
            provs = self.providers.ranked_providers(req.key)[: self.cfg.k]
            return KadMessage(t, req.key, closer=self._closer(req.key, peer), providers=self._kad_peers(provs, peer))
        if t is MessageType.ADD_PROVIDER:
            self._add_provider(req, peer)
            return None
        if t is MessageType.GET_VALUE:
            value = self.values.get(req.key)
            publisher = self.values.publisher(req.key) or self.peer_id
            record = KadRecord(req.key, value, publisher=publisher) if value is not None else None
            return KadMessage(t, req.key, record, closer=self._closer(req.key, peer))
        if t is MessageType.PUT_VALUE:
            record = req.record
            if record is None or record.key != req.key:
                return None  # (go and rust answer nothing either: the asker sees the stream end)
            try:
                self.values.put(record.key, record.value, peer)
            except RecordRejected as e:
                log.info("Kademlia value refused", protocol=self.protocol, peer=str(peer), reason=str(e))
                return None
            return req  # the record back: the store took it
        return KadMessage(MessageType.PING)

    def _add_provider(self, req: KadMessage, peer: PeerId) -> None:
        """A peer announces itself as a provider of ``req.key``. Only its own announcement counts
        (go and rust ignore the others too), and the addresses we give for it are those it told
        us itself in identify, not the message's."""
        if not req.key or not any(p.peer == peer for p in req.providers):
            return
        try:
            self.providers.add_provider(req.key, peer, self.cfg.provider_ttl)
        except RecordRejected as e:
            log.info("Kademlia provider refused", protocol=self.protocol, peer=str(peer), reason=str(e))

    # -- asking ---------------------------------------------------------------------------------

    async def _ask(self, peer: PeerId, msg: KadMessage, reply: bool = True) -> KadMessage | None:
        """One request on a stream of its own; the answer (checked to be of the request's type),
        or None when ``reply`` is False."""
        async with asyncio.timeout(self.cfg.request_timeout):
            stream = await self.host.open_stream(peer, self.protocol)
            try:
                write_delimited(stream, encode(msg))
                await stream.drain()
                if not reply:
                    await stream.close()
                    return None
                data = await read_delimited(stream, MAX_MESSAGE)
            except BaseException:
                stream.reset()
                raise
            stream.reset()  # one request per stream: nothing more to say either way
        try:
            answer = decode(data)
        except ProtocolError as e:
            raise _Garbage(str(e)) from None
        if answer.type is not msg.type:
            raise _Garbage(f"answered a {msg.type.name} with a {answer.type.name}")
        return answer

    def _dialable(self, peer: PeerId, hints: dict[PeerId, list[Multiaddr]]) -> None:
        """Let the node dial ``peer`` at the addresses an answer gave, unless it knows better
        ones (hints are dialed under the host's budget per destination, never passed on)."""
        if not self.host.peer_addrs.get(peer) and hints.get(peer):
            self.host.remember_addrs(peer, hints[peer], hint=True)

    async def _lookup(
        self,
        kind: str,
        msg: KadMessage,
        on_answer: Callable[[PeerId, KadMessage], None] | None = None,
        stop: Callable[[], bool] | None = None,
    ) -> Lookup:
        """An iterative lookup of ``msg.key``: ``msg`` is asked of the closest peers known, α at
        once, each answer's closer peers joining the candidates, until the k closest answered,
        ``stop()`` says enough was found, or the lookup times out."""
        if not self._active:
            self._active = True
            if kind != "bootstrap":
                self.host.spawn(self._quietly(self.bootstrap()))
        loop = asyncio.get_running_loop()
        started = time.perf_counter()
        target = key_id(msg.key)
        lk = Lookup(target, self.table.closest(target, self.cfg.k), self.peer_id, self.cfg.k, self.cfg.alpha)
        self.table.touch(target)
        asking: dict[asyncio.Task[KadMessage | None], PeerId] = {}
        deadline = loop.time() + self.cfg.lookup_timeout
        try:
            while not lk.done and not (stop is not None and stop()):
                for p in lk.next():
                    self._dialable(p, lk.hints)
                    asking[asyncio.ensure_future(self._ask(p, msg))] = p
                if not asking:
                    break
                left = deadline - loop.time()
                if left <= 0:
                    break
                done, _ = await asyncio.wait(asking, timeout=left, return_when=asyncio.FIRST_COMPLETED)
                for task in done:
                    p = asking.pop(task)
                    exc = task.exception()
                    if isinstance(exc, _Garbage):
                        self._misbehaved(p, str(exc))
                        lk.failed(p)
                    elif exc is not None:
                        self.table.remove(p)
                        lk.failed(p)
                    else:
                        answer = task.result()
                        assert answer is not None
                        self._seen(p)
                        lk.answered(p, self._closer_from(answer, lk.hints))
                        if on_answer is not None:
                            on_answer(p, answer)
        finally:
            for task in asking:
                task.cancel()
        self.stats.append(KadLookupStats(kind, lk.rounds, lk.queried, time.perf_counter() - started))
        return lk

    def _closer_from(self, answer: KadMessage, hints: dict[PeerId, list[Multiaddr]]) -> list[PeerId]:
        """The closer peers an answer names that we could dial; their addresses become hints."""
        out = []
        for kp in answer.closer:
            if kp.peer == self.peer_id or kp.peer in self.misbehaved:
                continue
            if kp.addrs and kp.peer not in hints and len(hints) < Lookup.MAX_CANDIDATES:
                hints[kp.peer] = list(kp.addrs[:MAX_HINT_ADDRS])
            if kp.peer in hints or self.host.peer_addrs.get(kp.peer):
                out.append(kp.peer)
        return out

    # -- what local code asks -------------------------------------------------------------------

    async def bootstrap(self) -> None:
        """Look ourselves up (filling the buckets near us), then refresh the farther ones."""
        await self._lookup("bootstrap", KadMessage(MessageType.FIND_NODE, self.peer_id.to_bytes()))
        await self.refresh(force=True)

    async def closest_peers(self, key: bytes) -> list[PeerId]:
        """The k peers of the network closest to ``key`` (a PeerId's bytes, a multihash, any key)."""
        lk = await self._lookup("closest", KadMessage(MessageType.FIND_NODE, key))
        return lk.closest()

    async def find_peer(self, peer: PeerId) -> list[Multiaddr]:
        """Where ``peer`` listens, by its word if we are connected, else as the peers closest to
        it tell; PeerNotFound if none knows."""
        if self.host.conns.get(peer) is not None and self.host.peer_addrs.get(peer):
            return list(self.host.peer_addrs[peer])
        found: list[Multiaddr] = []

        def on_answer(_: PeerId, answer: KadMessage) -> None:
            for kp in answer.closer:
                if kp.peer == peer and kp.addrs and not found:
                    found.extend(kp.addrs[:MAX_HINT_ADDRS])

        await self._lookup(
            "find_peer", KadMessage(MessageType.FIND_NODE, peer.to_bytes()), on_answer, lambda: bool(found)
        )
        if not found:
            raise PeerNotFound(f"no peer of {self.protocol} knows where {peer} is")
        self.host.remember_addrs(peer, found, hint=True)
        return found

    async def provide(self, key: bytes) -> int:
        """Announce this node as a provider of ``key`` (a multihash) to the k peers closest to it,
        and keep announcing it every ``provider_republish`` s; returns how many were told (our
        own store always holds it)."""
        self.providers.add_provider(key, self.peer_id, self.cfg.provider_ttl)
        self.own.provided[key] = time.time()
        return await self._announce(key)

    async def _announce(self, key: bytes) -> int:
        lk = await self._lookup("provide", KadMessage(MessageType.FIND_NODE, key))
        me = KadPeer(self.peer_id, self._addrs_for(self.peer_id, None))
        msg = KadMessage(MessageType.ADD_PROVIDER, key, providers=(me,))
        results = await asyncio.gather(*(self._ask(p, msg, reply=False) for p in lk.closest()), return_exceptions=True)
        return sum(1 for r in results if not isinstance(r, BaseException))

    def stop_providing(self, key: bytes) -> None:
        self.own.provided.pop(key, None)

    async def find_providers(self, key: bytes, count: int = 20) -> list[KadPeer]:
        """Up to ``count`` providers of ``key`` (a multihash) with the addresses given for them:
        our own store's first, then what the lookup toward ``key`` finds."""
        found: dict[PeerId, KadPeer] = {}
        for p in self.providers.ranked_providers(key):
            found[p] = KadPeer(p, self._addrs_for(p, None))
            if len(found) >= count:
                return list(found.values())

        def on_answer(_: PeerId, answer: KadMessage) -> None:
            for kp in answer.providers:
                if len(found) < count and kp.peer not in found:
                    found[kp.peer] = kp
                    if kp.addrs and kp.peer != self.peer_id:
                        self.host.remember_addrs(kp.peer, kp.addrs[:MAX_HINT_ADDRS], hint=True)

        await self._lookup(
            "find_providers", KadMessage(MessageType.GET_PROVIDERS, key), on_answer, lambda: len(found) >= count
        )
        return list(found.values())

    async def put_value(self, key: bytes, value: bytes) -> int:
        """Store ``value`` under ``key`` on the k peers closest to it (and here, when we are one
        of them), re-put every ``record_republish`` s; returns how many took it, StoreFailed if
        none did. RecordRejected if the network's validator refuses it."""
        self.values.check(key, value)
        self.own.values[key] = (value, time.time())
        return await self._put(key, value)

    async def _put(self, key: bytes, value: bytes) -> int:
        lk = await self._lookup("put", KadMessage(MessageType.FIND_NODE, key))
        closest = lk.closest()
        target = key_id(key)
        accepted = 0
        if len(closest) < self.cfg.k or (target ^ self.table.local_id) < (target ^ node_id(closest[-1])):
            self.values.put(key, value, self.peer_id)
            accepted += 1
        msg = KadMessage(MessageType.PUT_VALUE, key, KadRecord(key, value, publisher=self.peer_id))
        results = await asyncio.gather(*(self._ask(p, msg) for p in closest), return_exceptions=True)
        reasons = [f"{p.short()}: {r}" for p, r in zip(closest, results) if isinstance(r, BaseException)]
        accepted += sum(1 for r in results if isinstance(r, KadMessage) and r.record == msg.record)
        if not accepted:
            raise StoreFailed(f"no peer of {self.protocol} took the value: " + ("; ".join(reasons) or "no peers known"))
        return accepted

    async def get_value(self, key: bytes, quorum: int = 1) -> bytes:
        """The best valid value under ``key``, once ``quorum`` peers (or we) gave valid ones or the
        lookup ended; DhtError if none did. Invalid values count as the peer's misbehaviour."""
        got: list[bytes] = []
        held = self.values.get(key)
        if held is not None:
            got.append(held)

        def on_answer(peer: PeerId, answer: KadMessage) -> None:
            record = answer.record
            if record is None:
                return
            try:
                if record.key != key:
                    raise RecordRejected("a record under another key")
                self.values.check(key, record.value)
            except RecordRejected as e:
                self._misbehaved(peer, f"gave an invalid value: {e}")
                return
            got.append(record.value)

        await self._lookup("get_value", KadMessage(MessageType.GET_VALUE, key), on_answer, lambda: len(got) >= quorum)
        if not got:
            raise DhtError(f"no peer of {self.protocol} holds a value under {key[:64]!r}")
        return got[self.values.validator.select(key, got)]

    # -- upkeep ---------------------------------------------------------------------------------

    async def refresh(self, force: bool = False) -> None:
        """Look up a random key in each bucket no lookup went into for ``refresh_interval`` s
        (from ours out to the farthest: libp2p keys are hashed, so each is a pre-image found by
        trying, which limits refreshes to the 14 farthest buckets, where nearly all peers are)."""
        stale = self.table.stale_buckets(0.0 if force else self.cfg.refresh_interval)
        for index in sorted(stale, reverse=True):
            key = self._key_in_bucket(index)
            if key is None:
                continue
            await self._lookup("refresh", KadMessage(MessageType.FIND_NODE, key))

    def _key_in_bucket(self, index: int) -> bytes | None:
        """A key whose id falls in bucket ``index``, or None for a near bucket (our own lookups
        keep those fresh). The pre-images are searched for once, for all the far buckets."""
        if self._preimages is None:
            self._preimages = bucket_preimages(self.table.local_id)
        keys = self._preimages.get(index)
        return random.choice(keys) if keys else None

    async def republish(self) -> None:
        """Re-announce what we provide and re-put our values when they are due."""
        now = time.time()
        for key, at in list(self.own.provided.items()):
            if now - at >= self.cfg.provider_republish:
                self.own.provided[key] = now
                self.providers.add_provider(key, self.peer_id, self.cfg.provider_ttl)
                await self._quietly(self._announce(key))
        for key, (value, at) in list(self.own.values.items()):
            if now - at >= self.cfg.record_republish:
                self.own.values[key] = (value, now)
                await self._quietly(self._put(key, value))

    async def upkeep_loop(self) -> None:
        while not self.host.closing:
            await asyncio.sleep(_UPKEEP_TICK)
            if self._active and len(self.table):
                await self._quietly(self.refresh())
            await self.republish()
            self.values.purge()
            self.providers.purge()

    async def _quietly(self, work: Awaitable[object]) -> None:
        """Run background work; a failure is logged, never raised."""
        try:
            await work
        except (LatticaError, OSError, TimeoutError) as e:
            log.info("Kademlia upkeep failed", protocol=self.protocol, reason=str(e) or type(e).__name__)


class KadNetworks:
    """The libp2p Kademlia networks this node is in, by protocol id (``NodeServices.kad``)."""

    def __init__(self, networks: Iterable[KadNetwork]) -> None:
        self.by_protocol: dict[str, KadNetwork] = {n.protocol: n for n in networks}

    def __getitem__(self, protocol: str) -> KadNetwork:
        try:
            return self.by_protocol[protocol]
        except KeyError:
            raise KeyError(f"this node is in no Kademlia network {protocol!r} (KadConfig.networks)") from None

    def __iter__(self) -> Iterator[KadNetwork]:
        return iter(self.by_protocol.values())

    async def astart(self) -> None:
        for n in self.by_protocol.values():
            n.host.spawn(n.upkeep_loop())
