"""The lookup driver: iterative Kademlia lookups (:class:`lattica.dht._kademlia.Lookup`) run over
requests to peers, and what runs on them (closest nodes, get, providers, peer records, stores)."""

from __future__ import annotations

import asyncio
import collections
import random
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from lattica._identity import PeerId
from lattica._multiaddr import Multiaddr
from lattica.actors.dht.actor import MAX_ADDRS_IN_ANSWER, MAX_PEERS_IN_ANSWER
from lattica.actors.dht.state import DhtState
from lattica.config import DhtConfig
from lattica.dht._kademlia import Lookup, key_id, node_id
from lattica.dht._records import Entry, PeerRecord, check_entry, entry_from_wire, entry_to_wire, is_authentic, owner_of
from lattica.errors import (
    ConnectionLimit,
    DhtError,
    LatticaError,
    MailboxFull,
    NodeClosed,
    PeerNotFound,
    RecordRejected,
    StoreFailed,
)

if TYPE_CHECKING:
    from lattica._runtime.calls import Calls


class Garbage(Exception):
    """A peer's answer does not follow the protocol."""


PEER_RECORD_GRACE = 0.05  # s the other requests in flight get once a newer peer record arrived

# failures of a request that say nothing about the peer: they must not evict it from the table
_NOT_THE_PEERS_FAULT = (RecordRejected, ConnectionLimit, NodeClosed, MailboxFull)


@dataclass(slots=True)
class LookupStats:
    kind: str
    rounds: int
    queried: int
    found_round: int = 0  # get / find_providers: the round in which the first holder answered


@dataclass(slots=True)
class _Wakeup:
    """The future a running lookup sleeps on until an answer (or its deadline) wakes it."""

    fut: asyncio.Future | None = None


@dataclass(slots=True)
class _FirstHolder:
    """The round in which the first peer holding records answered a get (0: none yet)."""

    round: int = 0


@dataclass(slots=True)
class _NewestPeerRecord:
    """The newest signed peer record a find_peer has seen."""

    record: PeerRecord | None


class DhtLookups(DhtState):
    """Runs lookups: each asks the closest peers it knows, in parallel, for closer ones."""

    def __init__(self, runtime: Calls, config: DhtConfig | None = None) -> None:
        super().__init__(runtime, config)
        self.stats: collections.deque[LookupStats] = collections.deque(maxlen=10_000)
        self._handed_out: collections.OrderedDict[PeerId, int] = (
            collections.OrderedDict()
        )  # peer -> seq of the record find_peer returned

    def parse_peers(self, obj: Any, hints: dict[PeerId, list[Multiaddr]]) -> list[PeerId]:
        """Closer peers from an answer: [[PeerId, [Multiaddr, ...]], ...]. Their addresses are
        only hints (unauthenticated), kept in ``hints`` until we dial them."""
        if type(obj) is not list or len(obj) > MAX_PEERS_IN_ANSWER:
            raise Garbage("closer peers must be a list of at most 2k entries")
        out = []
        for item in obj:
            if type(item) is not list or len(item) != 2 or not isinstance(item[0], PeerId) or type(item[1]) is not list:
                raise Garbage("a closer peer is [PeerId, [Multiaddr, ...]]")
            peer, addrs = item
            if len(addrs) > MAX_ADDRS_IN_ANSWER or not all(isinstance(a, Multiaddr) for a in addrs):
                raise Garbage("closer peer addresses must be a short list of multiaddrs")
            if peer != self.peer_id and addrs and peer.public_key() is not None:
                if peer not in hints and len(hints) < Lookup.MAX_CANDIDATES:
                    hints[peer] = addrs
                out.append(peer)
        return out

    # -- the lookup driver -----------------------------------------------------------------------

    def _new_lookup(self, target: int) -> Lookup:
        return Lookup(target, self.table.closest(target, self.cfg.k), self.peer_id, self.cfg.k, self.cfg.alpha)

    async def find_closest(self, target: int) -> Lookup:
        lk = self._new_lookup(target)
        return await self._run(
            lk, "find_node", (target.to_bytes(32, "big"),), lambda peer, answer: self.parse_peers(answer, lk.hints)
        )

    def targets(self, lk: Lookup, target: int, n: int) -> tuple[list[PeerId], bool]:
        """The n closest peers a lookup found, and whether we ourselves belong among them."""
        closest = lk.closest(n)
        mine = node_id(self.peer_id) ^ target
        include_self = len(closest) < n or mine < node_id(closest[-1]) ^ target
        if include_self and len(closest) >= n:
            closest = closest[: n - 1]
        return closest, include_self

    async def _run(
        self,
        lk: Lookup,
        method: str,
        args: tuple,
        parse: Callable[[PeerId, Any], list[PeerId]],
        stop: Callable[[], bool] | None = None,
        skip: PeerId | None = None,
        grace: float = 0.0,
    ) -> Lookup:
        """Drive ``lk``: call ``method(*args)`` on the peers it names, ``parse(peer, answer)``
        each answer into the closer peers it names (raising Garbage if malformed). Stops when the
        lookup converged or ``stop()`` says enough was found (then the requests in flight get
        ``grace`` seconds more to answer, and no new ones start). Peers that fail leave the
        routing table; peers that answer garbage are also recorded as misbehaving. Answers are
        handled in future callbacks, with no task per request."""
        self.table.touch(lk.target)
        loop = self.rt.loop
        pending: dict[PeerId, Any] = {}
        wake = _Wakeup()
        hints = lk.hints
        deadline = loop.time() + self.cfg.lookup_timeout

        def finished(peer: PeerId, f: asyncio.Future) -> None:
            pending.pop(peer, None)
            exc = None if f.cancelled() else f.exception()
            if f.cancelled():
                lk.failed(peer)
            elif exc is not None:
                if not isinstance(exc, _NOT_THE_PEERS_FAULT) and not isinstance(exc.__cause__, _NOT_THE_PEERS_FAULT):
                    self.drop(peer)
                lk.failed(peer)
            else:
                try:
                    closer = parse(peer, f.result())
                except Garbage as e:
                    self.mark_misbehaved(peer, str(e))
                    lk.failed(peer)
                else:
                    self.seen(peer)
                    lk.answered(peer, closer)
            w = wake.fut
            if w is not None and not w.done():
                w.set_result(None)

        stopping = False
        try:
            while not lk.done:
                if not stopping and stop is not None and stop():
                    if not pending or grace <= 0:
                        break
                    stopping = True  # the answers in flight may still add fresher records
                    deadline = min(deadline, loop.time() + grace)
                if not stopping:
                    for p in lk.next():
                        if p == skip:
                            lk.failed(p)
                            continue
                        self.reachable(p, hints)
                        try:
                            fut = self.request(p, method, args)
                        except LatticaError:
                            lk.failed(p)
                            continue
                        pending[p] = fut
                        fut._fut.add_done_callback(lambda f, p=p: finished(p, f))
                if not pending:
                    break
                left = deadline - loop.time()
                if left <= 0:
                    break  # e.g. answers naming many peers that never answer: settle for what we have
                wake.fut = w = loop.create_future()
                timer = loop.call_at(deadline, _settle, w)
                await w
                timer.cancel()
        finally:
            for fut in list(pending.values()):
                fut.cancel()
        return lk

    # -- storing on the k closest ------------------------------------------------------------

    async def store_on_closest(
        self, target: int, method: str, args: tuple, here: Callable[[], None], what: str, kind: str
    ) -> int:
        """Store on the k nodes closest to ``target`` (``method(*args)`` on each, ``here()`` if we
        are one of them); returns how many accepted, StoreFailed if none.

        The stores start at once to the closest peers we already know, in parallel with the
        lookup (usually they are the answer, and the put costs one round trip instead of two);
        peers the lookup adds get theirs when it ends. Only the final k count."""
        sent: dict[PeerId, Any] = {}

        def send(p: PeerId) -> None:
            try:
                sent[p] = self.request(p, method, args)
            except LatticaError as e:
                sent[p] = e

        n = self.cfg.replication
        for p in self.table.closest(target, n):
            send(p)
        lk = await self.find_closest(target)
        self.stats.append(LookupStats(kind, lk.rounds, lk.queried))
        targets, include_self = self.targets(lk, target, n)
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
            err = (
                c
                if isinstance(c, BaseException)
                else (c._fut.exception() if not c._fut.cancelled() else DhtError("cancelled"))
            )
            if err is not None:
                reasons.append(f"{p.short()}: {err}")
            else:
                accepted += 1
        if accepted == 0:
            raise StoreFailed(f"no node accepted {what}: " + ("; ".join(reasons) or "no peers known"))
        return accepted

    # -- values ------------------------------------------------------------------------------

    async def get(self, key: bytes, quorum: int | None = None, grace: float = 0.0) -> dict[bytes, Entry]:
        """All live records of ``key`` (tombstones included), merged from the k closest nodes.
        ``quorum``: stop once that many nodes returned records (``grace``: and give the requests
        in flight that many seconds more)."""
        kid = key_id(key)
        merged: dict[bytes, Entry] = {}
        holders: set[PeerId] = set()
        held = self.store.get(kid)
        if held is not None:
            merged.update(held[1])
        lim = self.cfg.limits
        first = _FirstHolder()
        lk = self._new_lookup(kid)

        def parse(peer: PeerId, answer: Any) -> list[PeerId]:
            if type(answer) is not list or len(answer) != 2 or type(answer[0]) is not list:
                raise Garbage("find_value answers [records, closer peers]")
            if len(answer[0]) > lim.max_subkeys:
                raise Garbage("find_value returned more records than a key may hold")
            now = time.time()
            got = False
            for raw in answer[0]:
                try:
                    sk, e = entry_from_wire(raw)
                except RecordRejected as err:
                    raise Garbage(f"find_value returned a malformed record: {err}") from None
                if not is_authentic(key, sk, e):
                    raise Garbage("find_value returned a record its owner did not sign")
                try:
                    e = check_entry(key, sk, e, now, lim)
                except RecordRejected:
                    continue  # expired on the way, or beyond our limits: skipped, nobody blamed
                got = True
                old = merged.get(sk)
                if old is None and len(merged) >= lim.max_subkeys:
                    # a key never holds more subkeys than this, whoever answers; a member's record
                    # takes the place of a stranger's (holders off our mesh may be full of them)
                    spare = self._strangers_subkey(key, merged) if self._members_subkey(key, sk) else None
                    if spare is None:
                        continue
                    del merged[spare]
                if old is None or e.wins_over(old):
                    merged[sk] = e
            if got:
                holders.add(peer)
                if not first.round:
                    first.round = lk.round_of(peer)
            return self.parse_peers(answer[1], lk.hints)

        stop = (lambda: len(holders) >= quorum) if quorum else None
        await self._run(lk, "find_value", (kid.to_bytes(32, "big"),), parse, stop, grace=grace)
        self.stats.append(LookupStats("get", lk.rounds, lk.queried, first.round))
        if merged and self.cfg.cache_on_get:
            for p in lk.closest():
                if p not in holders:
                    self.host.spawn(self._cache(p, key, merged))
                    break
        return merged

    def _members_subkey(self, key: bytes, subkey: bytes) -> bool:
        """The record of ``subkey`` under ``key`` is owned (signed) by a member of our mesh."""
        try:
            owner = owner_of(key, subkey)
        except RecordRejected:
            return False
        return owner is not None and self.is_member(owner)

    def _strangers_subkey(self, key: bytes, records: dict[bytes, Entry]) -> bytes | None:
        return next((sk for sk in records if not self._members_subkey(key, sk)), None)

    async def _cache(self, peer: PeerId, key: bytes, records: dict[bytes, Entry]) -> None:
        for sk, e in records.items():
            try:
                await self.call(peer, "store", key, entry_to_wire(sk, e))
            except LatticaError:
                return

    # -- providers ---------------------------------------------------------------------------

    async def find_providers(self, cid: bytes, count: int = 20) -> list[PeerId]:
        """Up to ``count`` peers that provide ``cid``: members of our mesh first (as we know them,
        then as holders of our mesh vouch for them), the others in random order (arrival order,
        which fresh identities can win, hides nobody). Their addresses are remembered for dialing."""
        kid = key_id(cid)
        found: dict[PeerId, None] = dict.fromkeys(self.store.ranked_providers(cid))
        vouched: set[PeerId] = set()
        addrs: dict[PeerId, list[Multiaddr]] = {}
        lk = self._new_lookup(kid)

        def parse(peer: PeerId, answer: Any) -> list[PeerId]:
            if type(answer) is not list or len(answer) not in (2, 3):
                raise Garbage("get_providers answers [providers, closer peers, members among them]")
            for p in self.parse_peers(answer[0], addrs):
                found[p] = None
            members = answer[2] if len(answer) == 3 else 0
            if type(members) is not int or not 0 <= members <= len(answer[0]):
                raise Garbage("get_providers names how many of its providers are members, a count")
            if members and self.is_member(peer):  # (a holder of our mesh knows our members)
                vouched.update(item[0] for item in answer[0][:members])
            return self.parse_peers(answer[1], lk.hints)

        await self._run(lk, "get_providers", (cid,), parse, lambda: len(found) >= count)
        self.stats.append(LookupStats("providers", lk.rounds, lk.queried))
        member = {p: self.is_member(p) for p in found}
        ours = [p for p in found if member[p]]
        theirs = [p for p in found if p in vouched and not member[p]]
        others = [p for p in found if p not in vouched and not member[p]]
        random.shuffle(others)
        result = (ours + theirs + others)[:count]
        for p in result:
            self.reachable(p, addrs)
        return result

    # -- peer records ------------------------------------------------------------------------

    async def find_peer(self, peer: PeerId, fresh: bool = False) -> list[Multiaddr]:
        """Addresses of ``peer``: from a live connection, else its signed peer record in the DHT.
        ``fresh``: the addresses we know failed; ask the DHT for a newer record than ours (the
        lookup runs until one answers with a newer record, or to the end)."""
        conn = self.host.conns.get(peer)
        if not fresh and conn is not None and not conn.is_closed and self.host.peer_addrs.get(peer):
            return list(self.host.peer_addrs[peer])
        best = _NewestPeerRecord(self.store.peer_record(peer))
        known = max(best.record.seq if best.record is not None else -1, self._handed_out.get(peer, -1))
        target = node_id(peer)

        def parse(p: PeerId, answer: Any) -> list[PeerId]:
            if type(answer) is not list or len(answer) != 2:
                raise Garbage("get_peer_record answers [record or None, closer peers]")
            if answer[0] is not None:
                try:
                    rec = PeerRecord.from_wire(answer[0], self.cfg.limits)
                except RecordRejected as e:
                    raise Garbage(f"forged or malformed peer record: {e}") from None
                if rec.peer != peer:
                    raise Garbage("answered with the peer record of another peer")
                if best.record is None or rec.seq > best.record.seq:
                    best.record = rec
            return self.parse_peers(answer[1], lk.hints)

        lk = self._new_lookup(target)
        # the peer itself is not asked: we may be dialing it right now, waiting for this lookup
        # stop at the first record (``fresh``: the first newer than the one that failed us; the
        # requests in flight get a moment, one of them may hold a newer one still)
        found = (
            (lambda: best.record is not None and best.record.seq > known)
            if fresh
            else (lambda: best.record is not None)
        )
        await self._run(
            lk, "get_peer_record", (peer,), parse, found, skip=peer, grace=PEER_RECORD_GRACE if fresh else 0.0
        )
        self.stats.append(LookupStats("peer", lk.rounds, lk.queried))
        if best.record is not None:
            self._handed_out[peer] = best.record.seq  # a fresh look after these failed wants newer
            self._handed_out.move_to_end(peer)
            if len(self._handed_out) > 4096:
                self._handed_out.popitem(last=False)
            self.host.remember_addrs(peer, best.record.addrs)
            return list(best.record.addrs)
        if self.host.peer_addrs.get(peer):
            return list(self.host.peer_addrs[peer])
        hinted = lk.hints.get(peer)
        if hinted:  # unsigned (a dial authenticates whoever answers), and dialed under the hints' budget
            self.host.remember_addrs(peer, hinted, hint=True)
            return self.host.hinted_addrs(peer, list(hinted))
        raise PeerNotFound(f"no address of {peer} is known or published in the DHT")


def _settle(fut: asyncio.Future[None]) -> None:
    """The lookup's deadline: its wait ends (unless an answer ended it first)."""
    if not fut.done():
        fut.set_result(None)
