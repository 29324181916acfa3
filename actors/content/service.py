"""The ``content`` system actor: blocks by CID, served to anyone and fetched Bitswap-style.

Serving (open to strangers, docs/security.md): ``have`` (want-have: have / dont-have per CID),
``blocks`` (want-block: the block's bytes, None for dont-have, or ``[peer id]``: "this fellow of
yours in a swarm was sent it a moment ago, get it there"; an answer shorter than the request
means "not now", ask again), ``swarm`` (who else fetched this root lately: fetchers find
each other, so a fleet mostly feeds itself) and ``haves`` (a swarm peer announces blocks it now
holds). A peer has at most ``serve_per_peer`` answers being read at once and all peers
``serve_total``, and none is read while twice ``max_request_bytes`` of its earlier answers wait to
be sent; one answer carries at most ``max_request_blocks`` blocks and ``max_request_bytes``: what
a peer can make us hold is bounded, however many CIDs it names and however slowly it reads.

Fetching (``Fetch``, ``actors/content/fetch.py``): the providers come from the peers we are connected to, the DHT and
the swarms they know; ``lattica.content._session.FetchSession`` decides whom to ask for what,
``lattica.content._unixfs.Walker`` checks every block against its CID and its parent and names
the next ones. Every verified block goes to the blockstore at once (served from there while the
fetch goes on, kept for a resumed fetch), and the object is read back from the blockstore.
Hashing and disk writes run on worker threads: at 800 MB/s they would take the loop's core.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import threading
import time
from collections import OrderedDict
from collections.abc import AsyncIterator, Callable
from typing import TYPE_CHECKING, Any

from lattica._budget import Buckets, StrangersShare
from lattica._identity import PeerId
from lattica._runtime import current_caller
from lattica.actors.content.bitswap import Bitswap
from lattica.actors.content.wire import (
    MAX_NAMED,
    MAX_SWARM,
    MAX_SWARMS,
    NAME,
    NAMED_BURST,
    NAMED_RATE,
    PASSED_FOR,
    PASSED_MAX,
    SWARM_ADDRS,
    SWARM_ANSWER,
    SWARM_TTL,
    content_ref,
    parse_cids,
    provider_key,
)
from lattica.config import ContentConfig
from lattica.errors import BadBlock, ContentError, LatticaError
from lattica.logging import get_logger

if TYPE_CHECKING:
    from lattica._runtime.calls import Calls
    from lattica.actors.content.fetch import Fetch
    from lattica.actors.dht import DhtService
    from lattica.actors.dht.libp2p import KadNetwork
    from lattica.content._blockstore import Blockstore
    from lattica.content._cid import Cid

log = get_logger("lattica.content")

_INLINE_BYTES = 256 << 10  # hashing or disk work smaller than this runs on the loop (see ``on_disk``)
MEMORY_CAPACITY = 1 << 30  # the largest memory blockstore (``blocks="memory"``)
_UNSENT_POLL = 0.02  # seconds between looks at a slow reader's unsent answers
# CIDs all strangers together may name a second in have and haves calls: half of one peer's
# (``NAMED_RATE``), as much at once (at 16,384 a second they cost the victim a tenth of a core)
STRANGERS_NAMED_RATE = NAMED_RATE / 2
_FETCH_STOP = 2.0  # seconds a stopping node waits for a fetch to end before it cancels it

__all__ = [
    "ContentActor",
    "ContentService",
    "ContentConfig",
    "content_ref",
    "provider_key",
    "MAX_NAMED",
    "SWARM_ANSWER",
]


def _jobs() -> Any:
    from lattica.actors.content import jobs  # hashing and disk code loads at first use (start-up time)

    return jobs


class _Gate:
    """At most ``per_peer`` answers being read per peer and ``total`` in all, of which strangers
    together hold at most half (members find the rest free), and none while more than
    ``unsent_max`` bytes of earlier answers to that peer wait to be sent (it is slow, or not
    reading them); the rest wait, bounded by the caller's own deadline. Idle peers are forgotten."""

    def __init__(
        self,
        per_peer: int,
        total: int,
        unsent: Callable[[PeerId], int],
        unsent_max: int,
        stranger: Callable[[PeerId], bool],
    ) -> None:
        self._total = asyncio.Semaphore(total)
        self._strangers = asyncio.Semaphore(max(1, total // 2))
        self._stranger = stranger
        self._per_peer = per_peer
        self._unsent, self._unsent_max = unsent, unsent_max
        self._peers: dict[PeerId, list] = {}  # peer -> [its semaphore, answers holding or awaiting it]

    @contextlib.asynccontextmanager
    async def enter(self, peer: PeerId, unsent: Callable[[], int] | None = None) -> AsyncIterator[None]:
        """Hold one of ``peer``'s answers being read (``unsent``: its bytes waiting to be sent,
        when they wait elsewhere than on its actor calls)."""
        slot = self._peers.get(peer)
        if slot is None:
            slot = self._peers[peer] = [asyncio.Semaphore(self._per_peer), 0]
        slot[1] += 1
        pending = unsent or (lambda: self._unsent(peer))
        try:
            async with slot[0]:
                while pending() > self._unsent_max:
                    await asyncio.sleep(_UNSENT_POLL)
                async with self._strangers if self._stranger(peer) else contextlib.nullcontext():
                    async with self._total:
                        yield
        finally:
            slot[1] -= 1
            if not slot[1]:
                del self._peers[peer]


_SPILL_PIN = "spill:"  # pin sets of spilled values (kept until the call is over)


def _forget(store: Any, root: Cid) -> None:
    """Delete the blocks of ``root`` that no pin set names (what a spill stored or fetched)."""
    try:
        cids = _jobs().dag(store, root)
    except LatticaError:  # (part of it already gone)
        cids = [root]
    for cid in cids:
        try:
            store.delete(cid)
        except LatticaError:  # pinned by a set of its own (the same bytes published): kept
            pass


class ContentService:
    """A node's blockstore, the fetches it runs and the swarms it knows (see the module docstring)."""

    def __init__(
        self,
        runtime: Calls,
        config: ContentConfig | None = None,
        dht: DhtService | None = None,
        kad: KadNetwork | None = None,
    ) -> None:
        self.rt = runtime
        self.dht = dht  # where provider records go and are found (None: only peers we are told of)
        self.kad = kad  # IPFS's DHT: also announced to and asked once it reaches libp2p nodes
        self.host = runtime.host
        self.cfg = config or ContentConfig()
        self._store: Blockstore | None = None
        self._private_dir: str | None = None  # a directory of our own, removed when we stop
        self._pool: Any = None  # worker threads for hashing and disk work, made at first use
        self._gate = _Gate(
            self.cfg.serve_per_peer,
            self.cfg.serve_total,
            runtime.unsent_to,
            2 * self.cfg.max_request_bytes,
            self.is_stranger,
        )
        self._swarms: dict[Cid, dict[PeerId, float]] = {}  # root -> fetchers -> when last heard
        self._fetches: dict[Cid, Fetch] = {}  # running fetches (one per root; others join it)
        self._kept: dict[Cid, int] = {}  # spilled values stored here: keeps not yet dropped, per root
        self._kept_lock = threading.Lock()  # (keep and drop run on callers' threads and workers)
        self._provided: set[Cid] = set()
        self._sent: OrderedDict[Cid, tuple[PeerId, float]] = OrderedDict()  # block -> the fetcher we last sent it, when
        self._passed: OrderedDict[tuple[PeerId, Cid], None] = OrderedDict()  # (fetcher, block) sent to a fellow instead
        self.served_bytes = 0
        self.passed_blocks = 0
        self.served_blocks = 0
        self.last_stats: dict = {}  # the peers of the last fetch that ended, as its session saw them
        self._named = Buckets(NAMED_RATE, NAMED_BURST)  # CIDs each peer may name in have and haves calls
        self._strangers_named = StrangersShare(STRANGERS_NAMED_RATE, NAMED_BURST, self.is_stranger)  # ... all strangers
        self._upkeep = self.host.spawn(self._keep_up())
        # (after the budgets above: Bitswap serves within them)
        self.bitswap = Bitswap(self)
        self.host.events.disconnected.subscribe(lambda peer, conn: self.bitswap.forget(peer))

    def is_stranger(self, peer: PeerId) -> bool:
        """``peer`` is outside our mesh (its share of serving is the strangers' together)."""
        return self.host.circle_of(peer) == "stranger"

    def transfers(self) -> list[dict]:
        """The fetches running now, with their progress (``Fetch.progress``)."""
        return [f.progress() for f in list(self._fetches.values())]

    # -- the blockstore -------------------------------------------------------------------------

    @property
    def store(self) -> Blockstore:
        """The blockstore, opened at first use (a node that never touches content pays nothing)."""
        if self._store is None:
            self._store = self._open_store()
        return self._store

    def _open_store(self) -> Blockstore:
        from lattica.content._blockstore import DiskBlockstore, MemoryBlockstore  # loaded at first use (start-up time)

        where = (
            self.cfg.blocks
            or os.environ.get("LATTICA_BLOCKS")
            or os.path.join(os.path.expanduser("~"), ".lattica", "blocks")
        )
        if where == "memory":
            return MemoryBlockstore(min(self.cfg.capacity, MEMORY_CAPACITY))
        try:
            return DiskBlockstore(where, self.cfg.capacity)
        except ContentError as e:
            if self.cfg.blocks is not None:
                raise  # a directory the user chose: say so
            # the shared default is in use by another node on this machine: one of our own
            import tempfile  # (only when the default store is taken)

            self._private_dir = tempfile.mkdtemp(prefix=f"lattica-blocks-{self.host.peer_id.short()}-")
            log.info(
                "default blockstore in use; using a private one until this node stops",
                default=where,
                private=self._private_dir,
                reason=str(e),
            )
            return DiskBlockstore(self._private_dir, self.cfg.capacity)

    @property
    def pool(self) -> Any:
        if self._pool is None:
            from concurrent.futures import ThreadPoolExecutor  # loaded at the first content work (start-up time)

            self._pool = ThreadPoolExecutor(max(2, min(4, os.cpu_count() or 2)), thread_name_prefix="lattica-content")
        return self._pool

    async def in_thread(self, fn: Callable[..., Any], *args: Any) -> Any:
        return await asyncio.get_running_loop().run_in_executor(self.pool, fn, *args)

    async def on_disk(self, nbytes: int, fn: Callable[..., Any], *args: Any) -> Any:
        """``fn(*args)``, hashing or moving ``nbytes``: on a worker thread when that is worth
        the hop (large blocks), else here (a batch of small blocks costs less than the hop)."""
        if nbytes <= _INLINE_BYTES and getattr(self._store, "path", None) is None:
            return fn(*args)
        if nbytes <= _INLINE_BYTES // 4:
            return fn(*args)
        return await self.in_thread(fn, *args)

    # -- publishing -----------------------------------------------------------------------------

    async def put(
        self,
        source: Any,
        chunk_size: int | None = None,
        pin: bool = True,
        progress: Callable[[dict], None] | None = None,
    ) -> Cid:
        """Chunk, hash and store ``source`` (bytes-like or a file path); pin it (a publisher's
        object is never collected) and announce it. Returns the root CID. ``progress`` gets
        ``{bytes, total, mb_per_s, seconds, done}`` as the source is read (on a worker thread)."""
        chunk = chunk_size or self.cfg.chunk_size
        store = self.store
        t0 = time.monotonic()

        def tick(done: int, total: int) -> None:
            took = max(time.monotonic() - t0, 1e-9)
            progress(
                {"bytes": done, "total": total, "mb_per_s": done / took / 1e6, "seconds": took, "done": done >= total}
            )  # type: ignore[misc]

        root, cids = await self.in_thread(
            _jobs().import_source, store, source, chunk, tick if progress is not None else None
        )
        if pin:
            await self.in_thread(store.pin, str(root), cids)
        self.announce(root)
        return root

    def put_now(self, data: bytes) -> Cid:
        """``put`` for a caller on any thread that needs the CID at once (a class's code package,
        named while a call that carries the class is encoded): chunk, hash, store and pin here;
        announced from the loop."""
        store = self.store
        root, cids = _jobs().import_source(store, data, self.cfg.chunk_size, None)
        store.pin(str(root), cids)
        self.host.loop.call_soon_threadsafe(self.announce, root)
        return root

    # -- spilled values (lattica._runtime.spill: a call's big arguments or result) ----------------

    def keep(self, data: bytes | memoryview) -> Cid:
        """Store ``data`` (any thread) for a peer to fetch by CID: pinned, not announced (the peer
        is told who holds it), until as many ``drop`` calls as ``keep`` calls of the same bytes."""
        store = self.store
        root, cids = _jobs().import_source(store, data, self.cfg.chunk_size, None)
        with self._kept_lock:
            n = self._kept.get(root, 0)
            self._kept[root] = n + 1
            if n == 0:
                store.pin(_SPILL_PIN + str(root), cids)
        return root

    def drop(self, root: Cid) -> None:
        """Release one ``keep`` of ``root`` (any thread): the last one lets its blocks go, unless
        something else pins them."""
        store = self.store
        with self._kept_lock:
            n = self._kept.get(root, 0) - 1
            if n > 0:
                self._kept[root] = n
                return
            self._kept.pop(root, None)
            if store.unpin(_SPILL_PIN + str(root)):
                _forget(store, root)

    async def take(self, root: Cid, source: PeerId, max_size: int) -> bytearray:
        """The ``max_size`` bytes of ``root`` (exactly: ContentError otherwise), fetched from
        ``source`` (it holds them: a caller's spilled argument, a callee's spilled result;
        verified block by block), then let go of here."""
        await self.fetch(root, max_size=max_size, source=source, announce=False)
        try:
            return await self.in_thread(_jobs().read_into, self.store, root, max_size)
        finally:
            await self.in_thread(_forget, self.store, root)

    def announce(self, root: Cid) -> None:
        """Tell the DHT we provide ``root`` (re-announced while we hold it); never waits."""
        self._provided.add(root)
        dht = self.dht
        if dht is None:
            return
        ttl = min(self.cfg.provider_ttl, dht.cfg.limits.max_ttl)
        self.host.spawn(_quietly(dht.provide(provider_key(root), ttl=ttl), "provider record not stored", root))
        kad = self.kad
        if kad is not None and kad.reaches_libp2p():
            self.host.spawn(_quietly(kad.provide(provider_key(root)), "libp2p provider record not stored", root))

    def withdraw(self, root: Cid) -> None:
        self._provided.discard(root)
        dht = self.dht
        if dht is not None:
            dht.stop_providing(provider_key(root))
        if self.kad is not None:
            self.kad.stop_providing(provider_key(root))

    async def _keep_up(self) -> None:
        """Forget old swarm members; stop announcing roots the blockstore no longer holds."""
        while True:
            await asyncio.sleep(10.0)
            now = time.monotonic()
            for root in list(self._swarms):
                members = self._swarms[root]
                for peer in [p for p, t in members.items() if now - t > SWARM_TTL]:
                    del members[peer]
                if not members:
                    del self._swarms[root]
            if self._store is not None:
                for root in [r for r in self._provided if not self._store.has(r)]:
                    self.withdraw(root)

    # -- fetching -------------------------------------------------------------------------------

    async def fetch(
        self,
        root: Cid,
        progress: Callable[[dict], None] | None = None,
        max_size: int | None = None,
        source: PeerId | None = None,
        announce: bool = True,
    ) -> Cid:
        """Make sure every block of ``root`` is in the blockstore (fetching what is missing from
        whoever has it); then announce it. One fetch per root runs; later callers share it, and
        when every caller has left (cancelled, or refused the size) the fetch stops. ``max_size``:
        ContentError as soon as the root declares more bytes. ``source``: a peer known to hold it,
        asked at once (beside the providers found). ``announce``: tell the DHT we provide it once
        here (not for an object passing through, such as a spilled value)."""
        running = self._fetches.get(root)
        if running is None:
            from lattica.actors.content.fetch import Fetch  # the fetch machinery loads at the first fetch

            running = self._fetches[root] = Fetch(self, root)
            running.announce = announce
            task = running.task = self.host.spawn(running.run())
            task.add_done_callback(lambda _t: self._fetches.pop(root, None))
        if source is not None:
            running.source(source)
        if progress is not None:
            running.listeners.append(progress)
        running.waiters += 1
        try:
            if max_size is not None:
                await asyncio.wait((running.size, running.done), return_when=asyncio.FIRST_COMPLETED)
                if running.size.done() and running.size.result() > max_size:
                    raise ContentError(
                        f"{root} holds {running.size.result()} bytes, more than get() returns in memory "
                        f"(ContentConfig.max_get_bytes = {max_size}): get it with path="
                    )
            await asyncio.shield(running.done)
        finally:
            running.waiters -= 1
            if running.waiters == 0 and not running.done.done():
                running.cancel(f"the fetch of {root} was given up by every caller")
        return root

    async def read(self, root: Cid) -> bytes:
        """The whole object ``root`` from the blockstore (BlockNotFound if a block is missing)."""
        return await self.in_thread(_jobs().read_all, self.store, root)

    async def write(self, root: Cid, path: str) -> str:
        """Write the object ``root`` from the blockstore to ``path`` (atomically: a temp file in
        the same directory, renamed when complete)."""
        return await self.in_thread(_jobs().write_file, self.store, root, path)

    async def pin(self, root: Cid) -> None:
        """Pin every block of ``root`` (held) under its CID text."""
        store = self.store
        cids = await self.in_thread(_jobs().dag, store, root)
        await self.in_thread(store.pin, str(root), cids)
        self.announce(root)

    async def unpin(self, root: Cid) -> bool:
        return await self.in_thread(self.store.unpin, str(root))

    async def stat(self, root: Cid | None) -> dict:
        store = self.store
        if root is None:
            st = store.stats()
            return {
                "blocks": st.blocks,
                "bytes": st.bytes,
                "capacity": st.capacity,
                "pinned_blocks": st.pinned_blocks,
                "pinned_bytes": st.pinned_bytes,
                "pins": st.pin_sets,
                "path": getattr(store, "path", None),
                "served_blocks": self.served_blocks,
                "served_bytes": self.served_bytes,
            }
        return await self.in_thread(_jobs().stat, store, root)

    async def gc(self) -> dict:
        freed = await self.in_thread(self.store.gc)
        return {"blocks": freed.blocks, "bytes": freed.bytes}

    async def weights(self, root: Cid) -> dict:
        """The arrays of the safetensors object ``root``: fetched, written once to a file beside
        the blocks and memory-mapped from it (decoded in memory for a memory blockstore)."""
        from lattica.content import _weights as weights  # numpy and the format's parser: only for weights

        await self.fetch(root)
        base = getattr(self.store, "path", None)
        if base is None:
            return weights.decode(await self.read(root))
        target = os.path.join(os.fspath(base), "objects", f"{root}.safetensors")
        if not os.path.exists(target):
            os.makedirs(os.path.dirname(target), exist_ok=True)
            await self.write(root, target)
        try:
            return await self.in_thread(weights.mapped, target)
        except BadBlock:
            os.unlink(target)  # not weights: keep no copy outside the blockstore
            raise

    async def providers(self, root: Cid, count: int = 20) -> list[PeerId]:
        """Providers of ``root`` from our DHT and, once it reaches libp2p nodes, IPFS's (their
        addresses remembered for dialing)."""
        key = provider_key(root)
        asks = []
        if self.dht is not None:
            asks.append(self.dht.find_providers(key, count=count))
        kad = self.kad
        if kad is not None and kad.reaches_libp2p():

            async def from_kad() -> list[PeerId]:
                return [p.peer for p in await kad.find_providers(key, count)]

            asks.append(from_kad())
        found: dict[PeerId, None] = {}
        answers = await asyncio.gather(*asks, return_exceptions=True)
        for got in answers:
            if isinstance(got, BaseException):
                if not isinstance(got, LatticaError) or all(isinstance(a, BaseException) for a in answers):
                    raise got  # (every lookup failed: say so, as a lookup that found nobody does not)
                continue
            found.update(dict.fromkeys(got))
        return list(found)[: 2 * count]

    def ask(self, peer: PeerId, method: str, cids: list[Cid], timeout: float) -> Any:
        """Ask ``peer`` ``have`` (a bool per CID) or ``blocks`` (a block, None, or a fellow's id
        per CID): through its content actor, or over Bitswap if it is a libp2p node. An awaitable
        the caller may cancel (cancelling withdraws the wants)."""
        if self.bitswap.speaks_only_bitswap(peer):
            asking = self.bitswap.have if method == "have" else self.bitswap.blocks
            return asyncio.ensure_future(asking(peer, cids, timeout))
        return self.rt.call(content_ref(peer), method, ([c.bytes for c in cids],), {}, timeout=timeout)

    # -- serving ------------------------------------------------------------------------------

    def charge_named(self, peer: PeerId, cost: int) -> None:
        """Charge ``cost`` CIDs a peer named (in a want-have, a haves notice) to its budget and,
        for a stranger, to the strangers' share; ContentError when spent."""
        if peer == self.rt.peer_id:
            return
        if not self._named.take(peer, cost):
            raise ContentError(f"too many CIDs named: at most {NAMED_RATE:.0f} a second per peer")
        if not self._strangers_named.take(peer, cost):
            raise ContentError(
                f"too many CIDs named: at most {STRANGERS_NAMED_RATE:.0f} a second from all peers outside this node's mesh"
            )

    async def serve_blocks(self, caller: PeerId, wanted: list[Cid], unsent: Callable[[], int] | None = None) -> list:
        """Per CID, in order: the block's bytes, None if we do not hold it, or ``[peer id]`` if a
        fellow fetcher in a swarm with ``caller`` was sent it a moment ago (``pass_on``); cut
        short at ``max_request_bytes``. Read within the serving gate (a share per peer, half of
        it for strangers together); ``unsent``: the bytes already waiting to go to the caller
        on its Bitswap stream (default: on its actor calls)."""
        async with self._gate.enter(caller, unsent):
            store = self.store
            passed = self.pass_on(caller, wanted) if self._swarms else {}
            ask = [c for i, c in enumerate(wanted) if i not in passed] if passed else wanted
            nbytes = sum(store.size_of(c) for c in ask if store.has(c))
            out = await self.on_disk(nbytes, _jobs().read_blocks, store, ask, self.cfg.max_request_bytes)
        if passed:
            out = _merge(wanted, passed, out)
            self.passed(caller, [wanted[i] for i in passed if i < len(out)])
        sent = [(c, b) for c, b in zip(wanted, out) if isinstance(b, (bytes, bytearray, memoryview))]
        self.served_blocks += len(sent)
        self.served_bytes += sum(len(b) for _, b in sent)
        if sent and self._swarms:
            self.sent_to(caller, [c for c, _ in sent])
        return out

    # -- swarms ---------------------------------------------------------------------------------

    def joined(self, root: Cid, peer: PeerId) -> list[PeerId]:
        """``peer`` fetches ``root``: remember it in the root's swarm; the others, newest first.
        Only roots we hold or fetch have swarms here (anyone can name any CID: made-up ones
        must not push real swarms out); the least recently joined swarm goes first."""
        members = self._swarms.pop(root, None)
        if members is None:
            if root not in self._fetches and not self.store.has(root):
                return []
            if len(self._swarms) >= MAX_SWARMS:
                del self._swarms[next(iter(self._swarms))]
            members = {}
        self._swarms[root] = members  # most recently joined last
        members.pop(peer, None)
        members[peer] = time.monotonic()
        fetch = self._fetches.get(root)
        if fetch is not None:
            fetch.fellow(peer)
        while len(members) > MAX_SWARM:
            del members[next(iter(members))]
        return [p for p in reversed(members) if p != peer][:SWARM_ANSWER]

    def pass_on(self, caller: PeerId, wanted: list[Cid]) -> dict[int, PeerId]:
        """Super-seeding, for blocks ``caller`` asks of us: which to answer with a fellow's id
        instead of the bytes (by position). A block we sent a fetcher less than PASSED_FOR ago,
        that fetcher being in a swarm here with ``caller``, connected and with nothing of ours
        left unsent to it, is passed on once per fetcher and block (``passed``, after the answer
        is made); asked again, we send it. So a publisher everyone asks at once sends each block
        about once and the fetchers trade the rest (docs/content.md, "passing on")."""
        now = time.monotonic()
        out: dict[int, PeerId] = {}
        mine: list | None = None  # the swarms ``caller`` is in (most recently joined first, at most 16)
        fellow: dict[PeerId, bool] = {}
        seen: set[Cid] = set()
        for i, cid in enumerate(wanted):
            if cid in seen:
                out.pop(wanted.index(cid), None)  # (named twice: we send it anyway)
                continue
            seen.add(cid)
            sent = self._sent.get(cid)
            if sent is None or sent[0] == caller or now - sent[1] >= PASSED_FOR or (caller, cid) in self._passed:
                continue
            holder = sent[0]
            ok = fellow.get(holder)
            if ok is None:
                if mine is None:
                    mine = [m for m in reversed(self._swarms.values()) if caller in m][:16]
                conn = self.host.conns.get(holder)
                ok = fellow[holder] = (
                    any(holder in m for m in mine)
                    and conn is not None
                    and not conn.is_closed
                    and not self.rt.unsent_to(holder)
                )
            if ok:
                out[i] = holder
        return out

    def passed(self, caller: PeerId, cids: list[Cid]) -> None:
        """``caller`` was answered these blocks' fellows (``pass_on``): the next ask gets them."""
        for cid in cids:
            self._passed[(caller, cid)] = None
        while len(self._passed) > 4 * PASSED_MAX:
            self._passed.popitem(last=False)
        self.passed_blocks += len(cids)

    def sent_to(self, caller: PeerId, cids: list[Cid]) -> None:
        """We sent ``caller`` these blocks (see ``pass_on``)."""
        now = time.monotonic()
        sent = self._sent
        for cid in cids:
            sent.pop(cid, None)
            sent[cid] = (caller, now)
        while len(sent) > PASSED_MAX:
            sent.popitem(last=False)

    def swarm_of(self, root: Cid) -> list[PeerId]:
        return list(self._swarms.get(root, ()))

    def heard_haves(self, peer: PeerId, root: Cid, cids: list[Cid], coming: list[Cid]) -> None:
        fetch = self._fetches.get(root)
        if fetch is not None and peer in fetch.peers:  # only from a peer the fetch already uses
            fetch.heard_haves(peer, cids, coming)

    async def aclose(self) -> None:
        """Before the actors and the worker threads stop: end every fetch and wait for it (a
        fetch task left running would meet the closed pool, its error reported to nobody)."""
        running = list(self._fetches.values())
        for fetch in running:
            fetch.cancel("the node is stopping")
        tasks = [f.task for f in running if f.task is not None]
        if tasks:
            _, late = await asyncio.wait(tasks, timeout=_FETCH_STOP)
            for task in late:
                task.cancel()
            if late:
                await asyncio.wait(late, timeout=_FETCH_STOP)

    def close(self) -> None:
        self._upkeep.cancel()
        for fetch in list(self._fetches.values()):
            fetch.cancel("the node is stopping")
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)
        if self._store is not None:
            self._store.close()
        if self._private_dir is not None:
            import shutil  # (only a private store is removed)

            shutil.rmtree(self._private_dir, ignore_errors=True)


class ContentActor:
    """What peers call (see the module docstring); open to strangers: serving content is what
    the open network needs from us, and every answer is bounded."""

    NAME = NAME

    def __init__(self, service: ContentService) -> None:
        self._svc = service

    async def have(self, cids: list) -> list[bool]:
        """Per CID: whether we hold the block (want-have); at most ``NAMED_RATE`` CIDs a second
        per peer (a fetch asks a few hundred at most)."""
        self._charge(cids)
        store = self._svc.store
        return [store.has(c) for c in parse_cids(cids, MAX_NAMED)]

    def _charge(self, *lists: Any) -> None:
        """Charge the CIDs the caller names to its budget; ContentError when it is spent."""
        caller = current_caller()
        if caller is not None:
            self._svc.charge_named(caller, max(1, sum(len(x) for x in lists if type(x) is list)))

    async def blocks(self, cids: list) -> list:
        """Per CID, in order: the block's bytes, None if we do not hold it (want-block), or
        ``[peer id]`` if a fellow fetcher in a swarm with the caller was sent it a moment ago
        (``ContentService.pass_on``). The answer stops early (shorter than the request) at
        ``max_request_bytes``."""
        svc = self._svc
        wanted = parse_cids(cids, svc.cfg.max_request_blocks)
        return await svc.serve_blocks(current_caller() or svc.rt.peer_id, wanted)

    async def swarm(self, root: bytes) -> list:
        """The caller fetches ``root``: it joins the root's swarm; returns the other members we
        are connected to, each ``[peer id bytes, [its addresses on the IP we see it connected
        from]]``, newest first. A member behind a NAT (or connected through a relay) comes with
        no address: the fetcher reaches it by its PeerId as any other peer (relay, hole punch)."""
        cid = parse_cids([root], 1)[0]
        caller = current_caller() or self._svc.rt.peer_id
        out = []
        for peer in self._svc.joined(cid, caller):
            conn = self._svc.host.conns.get(peer)
            if conn is None or conn.is_closed:
                continue
            # only addresses on the IP we see it connected from: an answer must not make fetchers
            # dial a third party a peer names (a reflection attack, as AutoNAT's dial-backs were)
            seen = _host_of(conn.remote_addr) if conn.transport != "relay" else None
            addrs = (
                [a for a in self._svc.host.peer_addrs.get(peer, ()) if _host_of(a) == seen][:SWARM_ADDRS]
                if seen
                else []
            )
            out.append([peer.to_bytes(), [a.to_bytes() for a in addrs]])
        return out

    async def haves(self, root: bytes, cids: list, coming: list | None = None) -> None:
        """A swarm peer now holds ``cids`` of ``root`` and is being sent ``coming`` (for our
        fetch of it, if any)."""
        caller = current_caller()
        if caller is None:
            return
        self._charge(cids, coming)
        self._svc.heard_haves(
            caller, parse_cids([root], 1)[0], parse_cids(cids, MAX_NAMED), parse_cids(coming or [], MAX_NAMED)
        )


def _merge(wanted: list, passed: dict, got: list) -> list:
    """The answer in request order: a fellow's id where a block is passed on, else what the
    blockstore gave for the blocks asked of it (None for those we lack), up to where that
    answer was cut short."""
    out: list = []
    j = 0
    for i in range(len(wanted)):
        if i in passed:
            out.append([passed[i].to_bytes()])
        elif j < len(got):
            out.append(got[j])
            j += 1
        else:
            break  # (the blockstore's answer was cut short before this block)
    return out


def _host_of(addr: Any) -> str | None:
    try:
        return str(addr.without_peer_id().host_port()[0])
    except (LatticaError, AttributeError, ValueError, TypeError):
        return None


async def _quietly(coro: Any, what: str, root: Cid) -> None:
    try:
        await coro
    except LatticaError as e:
        log.info(what, root=str(root), reason=str(e))


# -- worker-thread jobs (hashing, disk) -----------------------------------------------------------
