"""What this node keeps alive in the DHT and the background upkeep: its own records, provider
announcements, peer record and actor names (re-published), the routing table (refreshed) and
the record store (saved to ``persist_path`` and loaded from it)."""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

from lattica import codec
from lattica._runtime import ActorRef
from lattica.actors.dht.lookups import DhtLookups
from lattica.config import DhtConfig
from lattica.dht._kademlia import Lookup, key_id, node_id
from lattica.dht._records import (
    REGISTRY_MAX_TTL,
    REGISTRY_PREFIX,
    TOMBSTONE,
    Entry,
    PeerRecord,
    encode_subkey,
    entry_to_wire,
    scope_of,
    sign_entry,
)
from lattica.errors import ActorNotFound, DhtError, LatticaError, PermissionDenied, StoreFailed
from lattica.logging import get_logger

if TYPE_CHECKING:
    from lattica._identity import PeerId
    from lattica._runtime.calls import Calls
    from lattica.trust import Verdict

log = get_logger("lattica.dht")

NAME_PREFIX = REGISTRY_PREFIX.decode()  # named actors: key NAME_PREFIX + name, subkey = hosting PeerId
NAME_GRACE = 0.05  # s the other requests in flight get once the first holder of a name answered
NAME_RETRY_FIRST, NAME_RETRY_MAX = 0.05, 1.0  # s between lookups of a name not found yet (doubling)


def name_key(name: str) -> bytes:
    return (NAME_PREFIX + name).encode()


def _write_atomically(path: str, data: bytes) -> None:
    tmp = f"{path}.tmp"
    with open(tmp, "wb") as f:
        f.write(data)
    os.replace(tmp, path)


class DhtUpkeep(DhtLookups):
    """Puts, provider announcements and names this node keeps stored on the k closest nodes,
    bootstrap and refresh of the routing table, and persistence of the record store."""

    def __init__(self, runtime: Calls, config: DhtConfig | None = None) -> None:
        super().__init__(runtime, config)
        if not 0 < self.cfg.name_ttl <= REGISTRY_MAX_TTL:
            raise ValueError(f"name_ttl must be in (0, {REGISTRY_MAX_TTL:.0f}] seconds")
        self._mine: dict[tuple[bytes, bytes], Entry] = {}  # our live puts, re-stored until they expire
        self._provided: dict[bytes, float] = {}  # content ids we provide -> ttl
        # live records of ours (actor names, shard registrations): the value they have now, put
        # every name_ttl / 3 while kept
        self._live: dict[bytes, Callable[[], bytes]] = {}
        self._live_as: dict[bytes, Any] = {}  # the subkey each is kept under (our PeerId unless given)
        self._refreshing_live = False
        self._saved_version = -1
        if self.cfg.persist_path and os.path.exists(self.cfg.persist_path):
            try:
                with open(self.cfg.persist_path, "rb") as f:
                    kept = self.store.load(f.read())
                log.info("DHT store loaded", path=self.cfg.persist_path, records=kept)
            except Exception as e:  # noqa: BLE001 -- a damaged file must not keep the node from starting
                log.warning("DHT store file unreadable; starting empty", path=self.cfg.persist_path, reason=str(e))
            self._saved_version = self.store.version

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

        return await self.store_on_closest(
            kid, "store", (key, entry_to_wire(sk, entry)), store_here, f"the record for {key[:64]!r}", "put"
        )

    async def delete(
        self, key: bytes, subkey: Any = None, ttl: float = 60.0, still_wanted: Callable[[], bool] | None = None
    ) -> int:
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

    # -- providers ---------------------------------------------------------------------------

    async def provide(self, cid: bytes, ttl: float = 3600.0, republish: bool = True) -> int:
        """Announce that this node provides ``cid`` to the k closest nodes; returns how many
        accepted (StoreFailed when none)."""
        if not 0 < ttl <= self.cfg.limits.max_ttl:
            raise ValueError(f"ttl must be in (0, {self.cfg.limits.max_ttl:.0f}] seconds")
        if republish:
            self._provided[cid] = ttl
        args: tuple = (cid, float(ttl))
        cert = b""
        scope = scope_of(cid)
        if scope is not None:  # (a mesh's own key: our certificate of it comes with the record)
            mine = self.host.trust.certificate(time.time(), scope[0])
            if mine is None:
                raise StoreFailed(f"this node holds no live certificate of the mesh {cid[:80]!r} is scoped to")
            cert = mine.to_bytes()
            args += (cert,)
        return await self.store_on_closest(
            key_id(cid),
            "add_provider",
            args,
            lambda: self.store.add_provider(cid, self.peer_id, ttl, cert),
            "the provider record",
            "provide",
        )

    def stop_providing(self, cid: bytes) -> None:
        """Stop re-announcing ``cid`` (the records on other nodes expire with their ttl)."""
        self._provided.pop(cid, None)

    # -- our peer record ---------------------------------------------------------------------

    async def publish_peer_record(self, lk: Lookup | None = None) -> int:
        """Sign our listen addresses and store them on the k nodes closest to our id (``lk``: a
        lookup of our own id that just ran); returns how many hold it, us included. Without
        ``lk`` the stores to the closest peers we know start at once, beside the lookup (peers
        dialing us by PeerId need new addresses, a relay circuit, now, not after a lookup)."""
        rec = PeerRecord.create(self.keypair, self.host.advertised_addrs())
        target = node_id(self.peer_id)
        self.store.put_peer_record(rec)
        if lk is None:
            try:
                return await self.store_on_closest(
                    target, "put_peer_record", (rec.to_wire(),), lambda: None, "our peer record", "peer-record"
                )
            except StoreFailed:
                return 1
        targets, _ = self.targets(lk, target, self.cfg.replication)
        results = await asyncio.gather(
            *(self.call(p, "put_peer_record", rec.to_wire()) for p in targets), return_exceptions=True
        )
        return 1 + sum(not isinstance(r, BaseException) for r in results)

    # -- bootstrap, refresh, republish -------------------------------------------------------

    async def bootstrap(self) -> int:
        """Look ourselves up (filling near buckets), then refresh the farther ones; returns the
        routing table size."""
        self._reseed()
        lk = await self.find_closest(node_id(self.peer_id))
        if self.host.advertised_addrs() and lk.closest():
            await self.publish_peer_record(lk)
        await self.refresh(0.0)
        return len(self.table)

    def _reseed(self) -> None:
        """An empty table (a fresh node, or its peers all dropped) starts again from the peers we
        are connected to."""
        if not len(self.table):
            for conn in list(self.host.conns.values()):
                info = self.host.info.get(conn)
                if info is not None:
                    self.on_identified(info)

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

    async def upkeep_loop(self) -> None:
        """Save, refresh names, purge and refresh the table, republish, each on its interval."""
        last_refresh = last_republish = last_names = last_save = time.monotonic()
        while True:
            await asyncio.sleep(min(1.0, self.cfg.persist_interval))
            now = time.monotonic()
            try:
                if now - last_save >= self.cfg.persist_interval:
                    last_save = now
                    await self._persist_soon()
                if self._live and now - last_names >= self.cfg.name_ttl / 3 and not self._refreshing_live:
                    last_names = now
                    self.host.spawn(self._refresh_live())
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

    # -- persistence -------------------------------------------------------------------------

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
        # with our mesh certificates: members of our mesh trust only registrations by members
        self.keep_live(name_key(name), lambda: codec.encode_bytes([ref, self.host.trust.presented]))

    def unregister_name(self, name: str) -> None:
        self.drop_live(name_key(name))

    def keep_live(self, key: bytes, value: Callable[[], bytes], subkey: Any = None) -> asyncio.Task:
        """Put ``value()`` under ``key`` (subkey: our PeerId, or ``subkey``, one we own such as
        our mesh certificate; signed by us) now and every ``name_ttl`` / 3 while it is kept, with
        ``value()`` as it is then (what it says may change, a load); dropped, a tombstone replaces
        it; if we die, it expires within ``name_ttl``. The task of the first put (done once
        stored, or logged if it could not be)."""
        self._live[key] = value
        self._live_as[key] = self.peer_id if subkey is None else subkey
        return self.host.spawn(self._publish_live(key, value))

    def drop_live(self, key: bytes) -> None:
        if self._live.pop(key, None) is not None:
            subkey = self._live_as.pop(key, self.peer_id)
            # it may be kept again while the withdrawal runs: then it must not happen
            self.host.spawn(self._delete(key, subkey, lambda: key not in self._live))

    async def _publish_live(self, key: bytes, value: Callable[[], bytes]) -> None:
        if self._live.get(key) is not value:
            return  # dropped or replaced meanwhile
        try:
            await self.put(
                key, value(), subkey=self._live_as.get(key, self.peer_id), ttl=self.cfg.name_ttl, republish=False
            )
        except LatticaError as e:
            log.info("could not publish a registration", key=key[:64], reason=str(e))

    async def _refresh_live(self) -> None:
        self._refreshing_live = True  # one refresh at a time, however slow the puts are
        try:
            await asyncio.gather(*(self._publish_live(k, v) for k, v in list(self._live.items())))
        finally:
            self._refreshing_live = False

    async def _delete(self, key: bytes, subkey: Any, still_wanted: Callable[[], bool]) -> None:
        try:
            await self.delete(key, subkey, ttl=self.cfg.name_ttl, still_wanted=still_wanted)
        except LatticaError as e:
            log.info("could not delete DHT record", key=key[:64], reason=str(e))

    async def resolve_name(self, name: str, within: float = 0.0) -> ActorRef:
        """The live actor registered as ``name`` anywhere on the mesh: the freshest registration
        among the first answers that hold one. If none is found and we have peers to ask, look
        again on a short backoff for up to ``within`` seconds (a name registered a moment ago
        may still be on its way to the nodes we ask); then ActorNotFound."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + within
        delay = NAME_RETRY_FIRST
        while True:
            found = await self.get(name_key(name), quorum=1, grace=NAME_GRACE)
            ref = self._freshest(name, found)
            if ref is None and found:
                # the first holder had only registrations we cannot follow (a dead node's, a
                # stranger's): ask every holder before waiting to ask again
                found = await self.get(name_key(name), grace=NAME_GRACE)
                ref = self._freshest(name, found)
            if ref is not None:
                return ref
            outsider = self._outsider(name, found)
            if outsider is not None:
                peer, why = outsider
                raise PermissionDenied(
                    f"the actor {name!r} is registered only by nodes outside this node's mesh ({peer}: {why}): "
                    f"if it is yours, this node ({self.peer_id}) was started without your mesh's key or an "
                    "invitation (LATTICA_MESH; docs/security.md); if not, a stranger holds the name"
                )
            self._reseed()
            if not len(self.table) or loop.time() + delay >= deadline:
                raise ActorNotFound(f"no live actor named {name!r} is registered in the DHT")
            await asyncio.sleep(delay)
            delay = min(delay * 2, NAME_RETRY_MAX)

    def _registrations(self, name: str, records: dict[bytes, Entry]) -> Iterator[tuple[float, ActorRef, Verdict]]:
        """Each well-formed registration of ``name`` (by the node the actor lives on: a node may
        only register its own actors): its expiration, the ref, and what its node is to us."""
        now = time.time()
        for sk, e in records.items():
            if e.value == TOMBSTONE or sk[:1] != b"p":
                continue
            try:
                ref, certs = codec.decode(e.value)
            except (LatticaError, TypeError, ValueError):
                continue
            if isinstance(ref, ActorRef) and ref.peer_id.to_bytes() == sk[1:] and ref.name == name:
                yield e.expiration, ref, self.host.trust.judge(ref.peer_id, certs, now)

    def _outsider(self, name: str, records: dict[bytes, Entry]) -> tuple[PeerId, str] | None:
        """A live registration of ``name`` by a node outside our mesh, and why it is outside, when
        there are only such: most likely this node was started without the mesh key, and it is
        told so at once rather than after waiting for a member's registration."""
        return next(
            ((ref.peer_id, v.why) for _, ref, v in self._registrations(name, records) if v.circle == "stranger"), None
        )

    def _freshest(self, name: str, records: dict[bytes, Entry]) -> ActorRef | None:
        """The newest valid registration of ``name`` by a member of our mesh on a node membership
        does not hold dead (a holder that missed a failover may still serve the dead node's
        unexpired one), an administrator's before a plain member's (an invited member cannot
        squat an administrator's name by registering it later). The DHT is open to strangers:
        their registrations of a name are not ours to follow, however fresh (a stranger could
        otherwise take any name over)."""
        live = [
            (v.admin, exp, ref)
            for exp, ref, v in self._registrations(name, records)
            if v.circle != "stranger" and not self.rt.node_gone(ref.peer_id)
        ]
        return max(live, key=lambda r: r[:2])[2] if live else None
