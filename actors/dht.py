"""The ``dht`` system actor: a Kademlia node over authenticated actor calls.

Two parts. :class:`DhtActor` is what peers may call (find_node, find_value, store, providers,
peer records, ping); it is a thin shell over :class:`DhtService`, which holds the routing table and
the record store and runs the client side: iterative lookups, put/get with replication and
caching, providers, peer records, bucket refresh, republishing, named-actor registrations and
persistence. Local code reaches the service as ``runtime.dht``; peers can never make this node run
a lookup or a put on their behalf.

A node id is ``sha256(PeerId bytes)`` and a peer enters the routing table only after it answered
one of our requests, or called us on an authenticated connection while having listen addresses.
"""

from __future__ import annotations

import asyncio
import collections
import os
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable

from lattica.config import DhtConfig
from lattica import codec, context
from lattica.logging import get_logger
from lattica.future import Future
from lattica.errors import (
    ActorNotFound,
    ConnectionLimit,
    MailboxFull,
    NodeClosed,
    DhtError,
    LatticaError,
    PeerNotFound,
    PeerUnreachable,
    RecordRejected,
    StoreFailed,
)
from lattica.identity import PeerId
from lattica.kademlia import K, Lookup, RoutingTable, key_id, node_id
from lattica.multiaddr import Multiaddr
from lattica.records import (
    REGISTRY_MAX_TTL,
    REGISTRY_PREFIX,
    TOMBSTONE,
    Entry,
    PeerRecord,
    RecordStore,
    check_entry,
    encode_subkey,
    is_authentic,
    entry_from_wire,
    entry_to_wire,
    sign_entry,
)
from lattica.runtime import ASYNC, ActorRef, current_caller

if TYPE_CHECKING:
    from lattica.runtime import Runtime

log = get_logger("lattica.dht")

__all__ = ["DhtConfig", "DhtActor", "DhtService", "dht_ref", "NAME_PREFIX"]

NAME_PREFIX = REGISTRY_PREFIX.decode()  # named actors: key NAME_PREFIX + name, subkey = hosting PeerId
_RPC_METHODS = ("ping", "find_node", "find_value", "store", "add_provider", "get_providers", "put_peer_record", "get_peer_record")
_MAX_PEERS_IN_ANSWER = 2 * K
_MAX_ADDRS_IN_ANSWER = 8


def dht_ref(peer: PeerId) -> ActorRef:
    """The ref of ``peer``'s DHT actor (its method table is fixed by the protocol)."""
    return ActorRef(peer, "dht", {m: ASYNC for m in _RPC_METHODS})


class _Garbage(Exception):
    """A peer's answer does not follow the protocol."""


# failures of a request that say nothing about the peer: they must not evict it from the table
_NOT_THE_PEERS_FAULT = (RecordRejected, ConnectionLimit, NodeClosed, MailboxFull)


@dataclass
class LookupStats:
    kind: str
    rounds: int
    queried: int
    found_round: int = 0  # get / find_providers: the round in which the first holder answered


class DhtService:
    """One node's DHT: routing table, record store, lookups and the background upkeep."""

    def __init__(self, runtime: Runtime, config: DhtConfig | None = None) -> None:
        self.rt = runtime
        self.host = runtime.host
        self.cfg = config or DhtConfig()
        if not 0 < self.cfg.name_ttl <= REGISTRY_MAX_TTL:
            raise ValueError(f"name_ttl must be in (0, {REGISTRY_MAX_TTL:.0f}] seconds")
        self.peer_id = runtime.peer_id
        self.keypair = runtime.host.keypair
        self.table = RoutingTable(self.peer_id, self.cfg.k, ping_after=self.cfg.ping_after)
        self.store = RecordStore(self.cfg.limits, local=self.peer_id)
        self.stats: collections.deque[LookupStats] = collections.deque(maxlen=10_000)
        self.misbehaved: collections.OrderedDict[PeerId, list[str]] = collections.OrderedDict()
        self.rejected = 0  # stores we refused
        self._mine: dict[tuple[bytes, bytes], Entry] = {}  # our live puts, re-stored until they expire
        self._provided: dict[bytes, float] = {}  # content ids we provide -> ttl
        self._names: dict[str, ActorRef] = {}  # actors of ours registered by name
        self._pinging: set[PeerId] = set()
        self._addrs: dict[PeerId, list[Multiaddr]] = {}  # how we reached the peers in our table
        self._refreshing_names = False
        self._saved_version = -1
        if self.cfg.persist_path and os.path.exists(self.cfg.persist_path):
            try:
                with open(self.cfg.persist_path, "rb") as f:
                    kept = self.store.load(f.read())
                log.info("DHT store loaded", path=self.cfg.persist_path, records=kept)
            except Exception as e:  # noqa: BLE001 -- a damaged file must not keep the node from starting
                log.warning("DHT store file unreadable; starting empty", path=self.cfg.persist_path, reason=str(e))
            self._saved_version = self.store.version
        self.host.identify_listeners.append(self._on_identified)
        self.host.spawn(self._upkeep())

    # -- routing table upkeep ---------------------------------------------------------------------

    def _on_identified(self, info: Any) -> None:
        # a peer that advertises relay circuits is private: it queries the DHT but serves no part
        # of it (others would reach it only through a relay); one that stops being reachable goes
        if "/lattica/rpc/1" not in info.protocols:
            return
        if any(a.is_circuit for a in info.listen_addrs):
            self._drop(info.peer_id)
        elif info.listen_addrs:
            self._seen(info.peer_id)

    def _seen(self, peer: PeerId) -> None:
        if peer in self.misbehaved:
            return  # it answered garbage: it does not come back by calling us
        addrs = self.host.peer_addrs.get(peer)
        if addrs:
            self._addrs[peer] = list(addrs)[:_MAX_ADDRS_IN_ANSWER]
        oldest = self.table.seen(peer)
        if oldest is not None and oldest not in self._pinging:
            self._pinging.add(oldest)
            self.host.spawn(self._check_oldest(oldest))

    async def _check_oldest(self, peer: PeerId) -> None:
        alive = False
        try:
            await self._call(peer, "ping")
            alive = True
        except LatticaError:
            pass
        finally:
            self._pinging.discard(peer)
        self.table.ping_result(peer, alive)
        if not alive:
            self._addrs.pop(peer, None)

    def _drop(self, peer: PeerId) -> None:
        self.table.remove(peer)
        self._addrs.pop(peer, None)

    def _misbehaved(self, peer: PeerId, reason: str) -> None:
        log.info("DHT peer misbehaved", peer=str(peer), reason=reason)
        self._drop(peer)
        reasons = self.misbehaved.pop(peer, [])
        reasons = (reasons + [reason])[-8:]
        self.misbehaved[peer] = reasons
        while len(self.misbehaved) > 1024:
            self.misbehaved.popitem(last=False)

    def _caller_seen(self) -> PeerId:
        caller = current_caller()
        assert caller is not None
        if caller != self.peer_id and caller not in self.table:
            conn = self.host.conns.get(caller)
            info = self.host.info.get(conn) if conn is not None else None
            if info is not None and info.listen_addrs:  # dialable, by its own (identify) word
                self._seen(caller)
        elif caller in self.table:
            self._seen(caller)
        return caller

    # -- wire helpers ------------------------------------------------------------------------

    def _peers_wire(self, peers: list[PeerId]) -> list:
        out = []
        for p in peers:
            addrs = (self._addrs.get(p) or self.host.peer_addrs.get(p, []))[:_MAX_ADDRS_IN_ANSWER]
            if addrs:
                out.append([p, addrs])
        return out

    def _parse_peers(self, obj: Any, hints: dict[PeerId, list[Multiaddr]]) -> list[PeerId]:
        """Closer peers from an answer: [[PeerId, [Multiaddr, ...]], ...]. Their addresses are
        only hints (unauthenticated), kept in ``hints`` until we dial them."""
        if type(obj) is not list or len(obj) > _MAX_PEERS_IN_ANSWER:
            raise _Garbage("closer peers must be a list of at most 2k entries")
        out = []
        for item in obj:
            if type(item) is not list or len(item) != 2 or not isinstance(item[0], PeerId) or type(item[1]) is not list:
                raise _Garbage("a closer peer is [PeerId, [Multiaddr, ...]]")
            peer, addrs = item
            if len(addrs) > _MAX_ADDRS_IN_ANSWER or not all(isinstance(a, Multiaddr) for a in addrs):
                raise _Garbage("closer peer addresses must be a short list of multiaddrs")
            if peer != self.peer_id and addrs and peer.public_key() is not None:
                if peer not in hints and len(hints) < Lookup.MAX_CANDIDATES:
                    hints[peer] = addrs
                out.append(peer)
        return out

    def _reachable(self, peer: PeerId, hints: dict[PeerId, list[Multiaddr]] | None = None) -> None:
        """Make sure the node can dial ``peer``: its table address, else the hint, unless the
        address book already has one (hints never displace what a peer said about itself)."""
        if self.host.peer_addrs.get(peer):
            return
        addrs = self._addrs.get(peer) or (hints or {}).get(peer)
        if addrs:
            self.host.remember_addrs(peer, addrs)

    def _request(self, peer: PeerId, method: str, args: tuple) -> Any:
        """Call ``method`` on ``peer``'s dht actor; returns its Future. A dial this starts never
        asks the DHT where the peer went: failing DHT requests would start lookups that fail
        more requests, a cascade when many peers are gone at once."""
        if self.rt._node_down(peer):  # membership holds it suspect or dead: do not wait on it
            fut = Future(self.rt.loop)
            fut._reject(PeerUnreachable(f"{peer} is {self.host.membership.core.get(str(peer)).state} in the membership view"))
            return fut
        token = context.NO_DHT_DIAL_LOOKUP.set(True)
        try:
            return self.rt.call(dht_ref(peer), method, args, {}, timeout=self.cfg.request_timeout)
        finally:
            context.NO_DHT_DIAL_LOOKUP.reset(token)

    async def _call(self, peer: PeerId, method: str, *args: Any) -> Any:
        self._reachable(peer)
        return await self._request(peer, method, args)

    # -- the lookup driver -----------------------------------------------------------------------

    def _new_lookup(self, target: int) -> Lookup:
        return Lookup(target, self.table.closest(target, self.cfg.k), self.peer_id, self.cfg.k, self.cfg.alpha)

    async def find_closest(self, target: int) -> Lookup:
        lk = self._new_lookup(target)
        return await self._run(lk, "find_node", (target.to_bytes(32, "big"),), lambda peer, answer: self._parse_peers(answer, lk.hints))

    def _targets(self, lk: Lookup, target: int, n: int) -> tuple[list[PeerId], bool]:
        """The n closest peers a lookup found, and whether we ourselves belong among them."""
        closest = lk.closest(n)
        mine = node_id(self.peer_id) ^ target
        include_self = len(closest) < n or mine < node_id(closest[-1]) ^ target
        if include_self and len(closest) >= n:
            closest = closest[: n - 1]
        return closest, include_self

    # -- values ------------------------------------------------------------------------------

    async def put(self, key: bytes, value: bytes, subkey: Any = None, ttl: float = 60.0, republish: bool = True) -> int:
        """Sign (when owned) and store a record on the k closest nodes; returns how many accepted.
        Raises StoreFailed when none did."""
        sk = encode_subkey(subkey)
        value = bytes(value)
        if not 0 < ttl <= self.cfg.limits.max_ttl:
            raise ValueError(f"ttl must be in (0, {self.cfg.limits.max_ttl:.0f}] seconds")
        entry = sign_entry(self.keypair, key, sk, value, time.time() + ttl)
        accepted = await self._replicate(key, sk, entry)
        if republish:
            self._mine[(key, sk)] = entry
        return accepted

    async def _replicate(self, key: bytes, sk: bytes, entry: Entry) -> int:
        kid = key_id(key)

        def store_here() -> None:
            self.store.put(key, sk, entry, self.peer_id)

        return await self._store_on_closest(kid, "store", (key, entry_to_wire(sk, entry)), store_here, f"the record for {key[:64]!r}", "put")

    async def _store_on_closest(self, target: int, method: str, args: tuple, here: Callable[[], None], what: str, kind: str) -> int:
        """Store on the k nodes closest to ``target`` (``method(*args)`` on each, ``here()`` if we
        are one of them); returns how many accepted, StoreFailed if none.

        The stores start at once to the closest peers we already know, in parallel with the
        lookup (usually they are the answer, and the put costs one round trip instead of two);
        peers the lookup adds get theirs when it ends. Only the final k count."""
        sent: dict[PeerId, Any] = {}

        def send(p: PeerId) -> None:
            try:
                sent[p] = self._request(p, method, args)
            except LatticaError as e:
                sent[p] = e

        n = self.cfg.replication
        for p in self.table.closest(target, n):
            send(p)
        lk = await self.find_closest(target)
        self.stats.append(LookupStats(kind, lk.rounds, lk.queried))
        targets, include_self = self._targets(lk, target, n)
        for p in targets:
            if p not in sent:
                send(p)
        reasons: list[str] = []
        accepted = 0
        if include_self:
            try:
                here()
                accepted += 1
            except RecordRejected as e:
                reasons.append(f"{self.peer_id.short()}: {e}")
        calls = [sent[p] for p in targets]
        waits = [c._fut for c in calls if not isinstance(c, BaseException)]
        if waits:
            await asyncio.wait(waits)
        for p, c in zip(targets, calls):
            err = c if isinstance(c, BaseException) else (c._fut.exception() if not c._fut.cancelled() else DhtError("cancelled"))
            if err is not None:
                reasons.append(f"{p.short()}: {err}")
            else:
                accepted += 1
        if accepted == 0:
            raise StoreFailed(f"no node accepted {what}: " + ("; ".join(reasons) or "no peers known"))
        return accepted

    async def get(self, key: bytes, quorum: int | None = None) -> dict[bytes, Entry]:
        """All live records of ``key`` (tombstones included), merged from the k closest nodes.
        ``quorum``: stop once that many nodes returned records."""
        kid = key_id(key)
        merged: dict[bytes, Entry] = {}
        holders: set[PeerId] = set()
        held = self.store.get(kid)
        if held is not None:
            merged.update(held[1])
        lim = self.cfg.limits
        found_round = [0]
        lk = self._new_lookup(kid)

        def parse(peer: PeerId, answer: Any) -> list[PeerId]:
            if type(answer) is not list or len(answer) != 2 or type(answer[0]) is not list:
                raise _Garbage("find_value answers [records, closer peers]")
            if len(answer[0]) > lim.max_subkeys:
                raise _Garbage("find_value returned more records than a key may hold")
            now = time.time()
            got = False
            for raw in answer[0]:
                try:
                    sk, e = entry_from_wire(raw)
                except RecordRejected as err:
                    raise _Garbage(f"find_value returned a malformed record: {err}") from None
                if not is_authentic(key, sk, e):
                    raise _Garbage("find_value returned a record its owner did not sign")
                try:
                    e = check_entry(key, sk, e, now, lim)
                except RecordRejected:
                    continue  # expired on the way, or beyond our limits: skipped, nobody blamed
                got = True
                old = merged.get(sk)
                if old is None and len(merged) >= lim.max_subkeys:
                    continue  # a key never holds more subkeys than this, whoever answers
                if old is None or e.wins_over(old):
                    merged[sk] = e
            if got:
                holders.add(peer)
                if not found_round[0]:
                    found_round[0] = lk.round_of(peer)
            return self._parse_peers(answer[1], lk.hints)  # type: ignore[arg-type]

        stop = (lambda: len(holders) >= quorum) if quorum else None
        await self._run(lk, "find_value", (kid.to_bytes(32, "big"),), parse, stop)
        self.stats.append(LookupStats("get", lk.rounds, lk.queried, found_round[0]))
        if merged and self.cfg.cache_on_get:
            for p in lk.closest():
                if p not in holders:
                    self.host.spawn(self._cache(p, key, merged))
                    break
        return merged

    async def _run(self, lk: Lookup, method: str, args: tuple, parse: Callable[[PeerId, Any], list[PeerId]], stop: Callable[[], bool] | None = None, skip: PeerId | None = None) -> Lookup:
        """Drive ``lk``: call ``method(*args)`` on the peers it names, ``parse(peer, answer)``
        each answer into the closer peers it names (raising _Garbage if malformed). Stops when the
        lookup converged or ``stop()`` says enough was found. Peers that fail leave the routing
        table; peers that answer garbage are also recorded as misbehaving. Answers are handled in
        future callbacks, with no task per request."""
        self.table.touch(lk.target)
        loop = self.rt.loop
        pending: dict[PeerId, Any] = {}
        wake: list[asyncio.Future | None] = [None]
        hints = lk.hints
        deadline = loop.time() + self.cfg.lookup_timeout

        def finished(peer: PeerId, f: asyncio.Future) -> None:
            pending.pop(peer, None)
            exc = None if f.cancelled() else f.exception()
            if f.cancelled():
                lk.failed(peer)
            elif exc is not None:
                if not isinstance(exc, _NOT_THE_PEERS_FAULT) and not isinstance(exc.__cause__, _NOT_THE_PEERS_FAULT):
                    self._drop(peer)
                lk.failed(peer)
            else:
                try:
                    closer = parse(peer, f.result())
                except _Garbage as e:
                    self._misbehaved(peer, str(e))
                    lk.failed(peer)
                else:
                    self._seen(peer)
                    lk.answered(peer, closer)
            w = wake[0]
            if w is not None and not w.done():
                w.set_result(None)

        try:
            while not lk.done and not (stop is not None and stop()):
                for p in lk.next():
                    if p == skip:
                        lk.failed(p)
                        continue
                    self._reachable(p, hints)  # type: ignore[arg-type]
                    try:
                        fut = self._request(p, method, args)
                    except LatticaError:
                        lk.failed(p)
                        continue
                    pending[p] = fut
                    fut._fut.add_done_callback(lambda f, p=p: finished(p, f))  # type: ignore[union-attr]
                if not pending:
                    break
                left = deadline - loop.time()
                if left <= 0:
                    break  # e.g. answers naming many peers that never answer: settle for what we have
                wake[0] = w = loop.create_future()
                timer = loop.call_at(deadline, lambda: w.done() or w.set_result(None))
                await w
                timer.cancel()
        finally:
            for fut in list(pending.values()):
                fut.cancel()
        return lk

    async def _cache(self, peer: PeerId, key: bytes, records: dict[bytes, Entry]) -> None:
        for sk, e in records.items():
            try:
                await self._call(peer, "store", key, entry_to_wire(sk, e))
            except LatticaError:
                return

    # -- providers ---------------------------------------------------------------------------

    async def provide(self, cid: bytes, ttl: float = 3600.0, republish: bool = True) -> int:
        """Announce that this node provides ``cid`` to the k closest nodes; returns how many
        accepted (StoreFailed when none)."""
        if not 0 < ttl <= self.cfg.limits.max_ttl:
            raise ValueError(f"ttl must be in (0, {self.cfg.limits.max_ttl:.0f}] seconds")
        if republish:
            self._provided[cid] = ttl
        return await self._store_on_closest(
            key_id(cid), "add_provider", (cid, float(ttl)), lambda: self.store.add_provider(cid, self.peer_id, ttl), "the provider record", "provide"
        )

    async def find_providers(self, cid: bytes, count: int = 20) -> list[PeerId]:
        """Up to ``count`` peers that provide ``cid`` (their addresses are remembered for dialing)."""
        kid = key_id(cid)
        found: dict[PeerId, None] = {p: None for p, _ in self.store.providers(cid)}
        addrs: dict[PeerId, list[Multiaddr]] = {}
        lk = self._new_lookup(kid)

        def parse(peer: PeerId, answer: Any) -> list[PeerId]:
            if type(answer) is not list or len(answer) != 2:
                raise _Garbage("get_providers answers [providers, closer peers]")
            for p in self._parse_peers(answer[0], addrs):
                found[p] = None
            return self._parse_peers(answer[1], lk.hints)  # type: ignore[arg-type]

        await self._run(lk, "get_providers", (cid,), parse, lambda: len(found) >= count)
        self.stats.append(LookupStats("providers", lk.rounds, lk.queried))
        result = list(found)[:count]
        for p in result:
            self._reachable(p, addrs)
        return result

    # -- peer records ------------------------------------------------------------------------

    async def publish_peer_record(self, lk: Lookup | None = None) -> int:
        """Sign our listen addresses and store them on the k nodes closest to our id (``lk``: a
        lookup of our own id that just ran); returns how many hold it, us included."""
        rec = PeerRecord.create(self.keypair, self.host.advertised_addrs())
        target = node_id(self.peer_id)
        if lk is None:
            lk = await self.find_closest(target)
        targets, _ = self._targets(lk, target, self.cfg.replication)
        self.store.put_peer_record(rec)
        results = await asyncio.gather(*(self._call(p, "put_peer_record", rec.to_wire()) for p in targets), return_exceptions=True)
        return 1 + sum(not isinstance(r, BaseException) for r in results)

    async def find_peer(self, peer: PeerId, fresh: bool = False) -> list[Multiaddr]:
        """Addresses of ``peer``: from a live connection, else its signed peer record in the DHT.
        ``fresh``: the addresses we know failed; ask the DHT for its newest record (the lookup
        runs to the end instead of stopping at the first record, ours included)."""
        conn = self.host.conns.get(peer)
        if not fresh and conn is not None and not conn.is_closed and self.host.peer_addrs.get(peer):
            return list(self.host.peer_addrs[peer])
        best: list[PeerRecord | None] = [self.store.peer_record(peer)]
        target = node_id(peer)

        def parse(p: PeerId, answer: Any) -> list[PeerId]:
            if type(answer) is not list or len(answer) != 2:
                raise _Garbage("get_peer_record answers [record or None, closer peers]")
            if answer[0] is not None:
                try:
                    rec = PeerRecord.from_wire(answer[0], self.cfg.limits)
                except RecordRejected as e:
                    raise _Garbage(f"forged or malformed peer record: {e}") from None
                if rec.peer != peer:
                    raise _Garbage("answered with the peer record of another peer")
                if best[0] is None or rec.seq > best[0].seq:
                    best[0] = rec
            return self._parse_peers(answer[1], lk.hints)  # type: ignore[arg-type]

        lk = self._new_lookup(target)
        # the peer itself is not asked: we may be dialing it right now, waiting for this lookup
        await self._run(lk, "get_peer_record", (peer,), parse, None if fresh else (lambda: best[0] is not None), skip=peer)
        self.stats.append(LookupStats("peer", lk.rounds, lk.queried))
        if best[0] is not None:
            self.host.remember_addrs(peer, best[0].addrs)
            return list(best[0].addrs)
        if self.host.peer_addrs.get(peer):
            return list(self.host.peer_addrs[peer])
        hinted = lk.hints.get(peer)
        if hinted:  # unsigned, but a dial authenticates whoever answers
            return list(hinted)  # type: ignore[call-overload]
        raise PeerNotFound(f"no address of {peer} is known or published in the DHT")

    # -- bootstrap and upkeep ----------------------------------------------------------------

    async def bootstrap(self) -> int:
        """Look ourselves up (filling near buckets), then refresh the farther ones; returns the
        routing table size."""
        if not len(self.table):
            for conn in list(self.host.conns.values()):
                info = self.host.info.get(conn)
                if info is not None:
                    self._on_identified(info)
        lk = await self.find_closest(node_id(self.peer_id))
        if self.host.advertised_addrs() and lk.closest():
            await self.publish_peer_record(lk)
        await self.refresh(0.0)
        return len(self.table)

    async def refresh(self, interval: float | None = None) -> None:
        """Look up a random id in every bucket no lookup went into for ``interval`` seconds."""
        stale = self.table.stale_buckets(self.cfg.refresh_interval if interval is None else interval)
        await asyncio.gather(*(self.find_closest(self.table.random_id(i)) for i in stale), return_exceptions=True)

    async def republish(self) -> None:
        """Store our live records, provider announcements and peer record again (churn moves the
        k closest nodes)."""
        now = time.time()
        gate = asyncio.Semaphore(16)

        async def bounded(coro: Any, what: str) -> None:
            async with gate:
                try:
                    await coro
                except DhtError as e:
                    log.info("republish failed", what=what, reason=str(e))

        jobs = []
        for (key, sk), entry in list(self._mine.items()):
            if entry.expiration <= now:  # the same record, until it expires: never extended
                del self._mine[(key, sk)]
            else:
                jobs.append(bounded(self._replicate(key, sk, entry), repr(key[:64])))
        for cid, ttl in list(self._provided.items()):
            jobs.append(bounded(self.provide(cid, ttl, republish=False), "provider record"))
        await asyncio.gather(*jobs)
        if self.host.advertised_addrs() and len(self.table):
            await self.publish_peer_record()

    def stop_providing(self, cid: bytes) -> None:
        """Stop re-announcing ``cid`` (the records on other nodes expire with their ttl)."""
        self._provided.pop(cid, None)

    async def _upkeep(self) -> None:
        last_refresh = last_republish = last_names = last_save = time.monotonic()
        while True:
            await asyncio.sleep(min(1.0, self.cfg.persist_interval))
            now = time.monotonic()
            try:
                if now - last_save >= self.cfg.persist_interval:
                    last_save = now
                    await self._persist_soon()
                if self._names and now - last_names >= self.cfg.name_ttl / 3 and not self._refreshing_names:
                    last_names = now
                    self.host.spawn(self._refresh_names())
                if now - last_refresh >= self.cfg.refresh_interval / 4:
                    last_refresh = now
                    self.store.purge()
                    if len(self.table):
                        await self.refresh()
                if now - last_republish >= self.cfg.republish_interval:
                    last_republish = now
                    await self.republish()
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("DHT upkeep step failed")

    def _persist(self) -> None:
        """Save the store now if it changed (blocking: used at shutdown)."""
        path = self.cfg.persist_path
        if path and self.store.version != self._saved_version:
            version = self.store.version
            _write_atomically(path, self.store.dump())
            self._saved_version = version

    async def _persist_soon(self) -> None:
        """Save the store if it changed, the file writing off the loop."""
        path = self.cfg.persist_path
        if path and self.store.version != self._saved_version:
            version = self.store.version
            await asyncio.to_thread(_write_atomically, path, self.store.dump())
            self._saved_version = version

    def close(self) -> None:
        """Save the store one last time (node shutdown)."""
        try:
            self._persist()
        except OSError as e:
            log.warning("could not save the DHT store", path=self.cfg.persist_path, reason=str(e))

    # -- named actors ------------------------------------------------------------------------

    def register_name(self, name: str, ref: ActorRef) -> None:
        """Publish ``name`` -> ``ref`` (owner-signed by this node) and keep it fresh while the actor lives."""
        self._names[name] = ref
        self.host.spawn(self._publish_name(name, ref))

    def unregister_name(self, name: str) -> None:
        if self._names.pop(name, None) is not None:
            # a new actor may take the name while the withdrawal runs: then it must not happen
            self.host.spawn(self._delete(_name_key(name), self.peer_id, lambda: name not in self._names))

    async def _publish_name(self, name: str, ref: ActorRef) -> None:
        if self._names.get(name) is not ref:
            return  # unregistered meanwhile
        try:
            await self.put(_name_key(name), codec.encode_bytes(ref), subkey=self.peer_id, ttl=self.cfg.name_ttl, republish=False)
        except LatticaError as e:
            log.info("could not publish actor name", name=name, reason=str(e))

    async def _refresh_names(self) -> None:
        self._refreshing_names = True  # one refresh at a time, however slow the puts are
        try:
            await asyncio.gather(*(self._publish_name(n, r) for n, r in list(self._names.items())))
        finally:
            self._refreshing_names = False

    async def _delete(self, key: bytes, subkey: Any, still_wanted: Callable[[], bool]) -> None:
        try:
            await self.delete(key, subkey, ttl=self.cfg.name_ttl, still_wanted=still_wanted)
        except LatticaError as e:
            log.info("could not delete DHT record", key=key[:64], reason=str(e))

    async def delete(self, key: bytes, subkey: Any = None, ttl: float = 60.0, still_wanted: Callable[[], bool] | None = None) -> int:
        """Replace a record by a tombstone that outlives it (readers see nothing)."""
        sk = encode_subkey(subkey)
        self._mine.pop((key, sk), None)
        current = (await self.get(key)).get(sk)
        if still_wanted is not None and not still_wanted():
            return 0
        now = time.time()
        expiration = max(now + ttl, current.expiration + 0.001 if current is not None else 0.0)
        if expiration > now + self.cfg.limits.max_ttl:
            raise StoreFailed("the record outlives any tombstone this node may store; it expires on its own")
        entry = sign_entry(self.keypair, key, sk, TOMBSTONE, expiration)
        return await self._replicate(key, sk, entry)

    async def resolve_name(self, name: str) -> ActorRef:
        """The live actor registered as ``name`` anywhere on the mesh (the freshest registration)."""
        records = await self.get(_name_key(name))
        best: tuple[float, ActorRef] | None = None
        for sk, e in records.items():
            if e.value == TOMBSTONE or sk[:1] != b"p":
                continue
            try:
                ref = codec.decode(e.value)
            except LatticaError:
                continue
            if not isinstance(ref, ActorRef) or ref.peer_id.to_bytes() != sk[1:] or ref.name != name:
                continue  # a node may only register actors that live on it
            if best is None or e.expiration > best[0]:
                best = (e.expiration, ref)
        if best is None:
            raise ActorNotFound(f"no live actor named {name!r} is registered in the DHT")
        return best[1]


def _name_key(name: str) -> bytes:
    return (NAME_PREFIX + name).encode()


def _write_atomically(path: str, data: bytes) -> None:
    tmp = f"{path}.tmp"
    with open(tmp, "wb") as f:
        f.write(data)
    os.replace(tmp, path)


class DhtActor:
    """What peers may call. Every method answers from local state only (no lookups on a peer's
    behalf) and records the caller in the routing table when it is dialable."""

    NAME = "dht"

    def __init__(self, service: DhtService) -> None:
        self._svc = service

    async def ping(self) -> bool:
        self._svc._caller_seen()
        return True

    async def find_node(self, target: bytes) -> list:
        svc = self._svc
        caller = svc._caller_seen()
        if type(target) is not bytes or len(target) != 32:
            raise ValueError("find_node takes a 32-byte id")
        return svc._peers_wire(svc.table.closest(int.from_bytes(target, "big"), svc.cfg.k, exclude=caller))

    async def find_value(self, kid: bytes) -> list:
        svc = self._svc
        caller = svc._caller_seen()
        if type(kid) is not bytes or len(kid) != 32:
            raise ValueError("find_value takes a 32-byte key id")
        target = int.from_bytes(kid, "big")
        held = svc.store.get(target)
        records = [entry_to_wire(sk, e) for sk, e in held[1].items()] if held else []
        return [records, svc._peers_wire(svc.table.closest(target, svc.cfg.k, exclude=caller))]

    async def store(self, key: bytes, record: list) -> bool:
        """Merge one record; raises RecordRejected with the reason when refused."""
        svc = self._svc
        caller = svc._caller_seen()
        try:
            svc.store.admit(caller)
            sk, entry = entry_from_wire(record)
            return svc.store.put(key, sk, entry, caller)
        except RecordRejected:
            svc.rejected += 1
            raise

    async def add_provider(self, cid: bytes, ttl: float) -> None:
        svc = self._svc
        caller = svc._caller_seen()
        try:
            svc.store.admit(caller)
            svc.store.add_provider(cid, caller, ttl)
        except RecordRejected:
            svc.rejected += 1
            raise

    async def get_providers(self, cid: bytes) -> list:
        svc = self._svc
        caller = svc._caller_seen()
        if type(cid) is not bytes or not 0 < len(cid) <= svc.cfg.limits.max_key:
            raise ValueError("get_providers takes a content id (bytes)")
        provs = [p for p, _ in svc.store.providers(cid)][:_MAX_PEERS_IN_ANSWER]
        closer = svc.table.closest(key_id(cid), svc.cfg.k, exclude=caller)
        return [svc._peers_wire(provs), svc._peers_wire(closer)]

    async def put_peer_record(self, record: list) -> bool:
        svc = self._svc
        caller = svc._caller_seen()
        try:
            svc.store.admit(caller)
            return svc.store.put_peer_record(PeerRecord.from_wire(record, svc.cfg.limits), caller)
        except RecordRejected:
            svc.rejected += 1
            raise

    async def get_peer_record(self, peer: PeerId) -> list:
        svc = self._svc
        caller = svc._caller_seen()
        if not isinstance(peer, PeerId):
            raise ValueError("get_peer_record takes a PeerId")
        rec = svc.store.peer_record(peer)
        closer = svc.table.closest(node_id(peer), svc.cfg.k, exclude=caller)
        return [rec.to_wire() if rec is not None else None, svc._peers_wire(closer)]
