"""The ``content`` system actor: blocks by CID, served to anyone and fetched Bitswap-style.

Serving (open to strangers, docs/security.md): ``have`` (want-have: have / dont-have per CID),
``blocks`` (want-block: the block's bytes, or None for dont-have; an answer shorter than the
request means "not now", ask again), ``swarm`` (who else fetched this root lately: fetchers find
each other, so a fleet mostly feeds itself) and ``haves`` (a swarm peer announces blocks it now
holds). A peer has at most ``serve_per_peer`` answers being read at once and all peers
``serve_total``; one answer carries at most ``max_request_blocks`` blocks and
``max_request_bytes``: what a peer can make us hold is bounded, however many CIDs it names.

Fetching (:class:`_Fetch`): the providers come from the peers we are connected to, the DHT and
the swarms they know; ``lattica.content.session.FetchSession`` decides whom to ask for what,
``lattica.content.unixfs.Walker`` checks every block against its CID and its parent and names
the next ones. Every verified block goes to the blockstore at once (served from there while the
fetch goes on, kept for a resumed fetch), and the object is read back from the blockstore.
Hashing and disk writes run on worker threads: at 800 MB/s they would take the loop's core.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import shutil
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING, Any, AsyncIterator, Callable

from lattica.config import ContentConfig
from lattica.content.blockstore import Blockstore, DiskBlockstore, MemoryBlockstore
from lattica.content.cid import RAW, Cid
from lattica.content.session import BLOCK, FetchSession, Request
from lattica.content import dagpb
from lattica.content.unixfs import Importer, UnixFSData, Walker, children, walk
from lattica.errors import BadBlock, BlockNotFound, ContentError, InvalidCid, LatticaError
from lattica.identity import PeerId
from lattica.logging import get_logger
from lattica.multiaddr import Multiaddr
from lattica.runtime import ASYNC, ActorRef, current_caller

if TYPE_CHECKING:
    from lattica.runtime import Runtime

log = get_logger("lattica.content")

__all__ = ["ContentActor", "ContentService", "ContentConfig", "content_ref", "provider_key"]

_MAX_NAMED = 1024  # CIDs one have/haves call may name
_SWARM_TTL = 60.0  # seconds a fetcher stays in a root's swarm after it last asked
_MAX_SWARMS = 1024  # roots whose swarms we track
_MAX_SWARM = 64  # fetchers tracked per root
_SWARM_ANSWER = 16  # fetchers named in one answer
_HAVES_EVERY = 0.05  # seconds between announcements of new blocks to a swarm
_SWARM_EVERY = 2.0  # seconds between a fetch's questions for more swarm peers
_INLINE_BYTES = 256 << 10  # hashing or disk work smaller than this runs on the loop (see ``on_disk``)
_BAND = 16  # blocks a fetch takes in its own random order (fetchers spread their first asks)
MEMORY_CAPACITY = 1 << 30


def content_ref(peer: PeerId) -> ActorRef:
    """The ref of ``peer``'s content system actor."""
    return ActorRef(peer, ContentActor.NAME, {"have": ASYNC, "blocks": ASYNC, "swarm": ASYNC, "haves": ASYNC})


def provider_key(cid: Cid) -> bytes:
    """The DHT key under which providers of ``cid`` are announced: its multihash, as in IPFS (a
    raw and a dag-pb CID of the same bytes name the same block)."""
    return cid.bytes[-34:]


def _cids(raw: Any, limit: int) -> list[Cid]:
    if type(raw) is not list or len(raw) > limit:
        raise ContentError(f"a list of at most {limit} CIDs (binary) is expected")
    try:
        return [Cid.from_bytes(c) for c in raw]
    except (InvalidCid, TypeError) as e:
        raise ContentError(f"not a CID: {e}") from None


class _Gate:
    """At most ``per_peer`` answers being read per peer and ``total`` in all; the rest wait (the
    caller's own deadline bounds the wait). Idle peers are forgotten."""

    def __init__(self, per_peer: int, total: int) -> None:
        self._total = asyncio.Semaphore(total)
        self._per_peer = per_peer
        self._peers: dict[PeerId, list] = {}  # peer -> [its semaphore, answers holding or awaiting it]

    @contextlib.asynccontextmanager
    async def enter(self, peer: PeerId) -> AsyncIterator[None]:
        slot = self._peers.get(peer)
        if slot is None:
            slot = self._peers[peer] = [asyncio.Semaphore(self._per_peer), 0]
        slot[1] += 1
        try:
            async with slot[0], self._total:
                yield
        finally:
            slot[1] -= 1
            if not slot[1]:
                del self._peers[peer]


class ContentService:
    """A node's blockstore, the fetches it runs and the swarms it knows (see the module docstring)."""

    def __init__(self, runtime: Runtime, config: ContentConfig | None = None) -> None:
        self.rt = runtime
        self.host = runtime.host
        self.cfg = config or ContentConfig()
        self._store: Blockstore | None = None
        self._private_dir: str | None = None  # a directory of our own, removed when we stop
        self._pool: ThreadPoolExecutor | None = None
        self._gate = _Gate(self.cfg.serve_per_peer, self.cfg.serve_total)
        self._swarms: dict[Cid, dict[PeerId, float]] = {}  # root -> fetchers -> when last heard
        self._fetches: dict[Cid, _Fetch] = {}  # running fetches (one per root; others join it)
        self._provided: set[Cid] = set()
        self.served_bytes = 0
        self.served_blocks = 0
        self.last_stats: dict = {}  # the peers of the last fetch that ended, as its session saw them
        self._upkeep = self.host.spawn(self._keep_up())

    # -- the blockstore -------------------------------------------------------------------------

    @property
    def store(self) -> Blockstore:
        """The blockstore, opened at first use (a node that never touches content pays nothing)."""
        if self._store is None:
            self._store = self._open_store()
        return self._store

    def _open_store(self) -> Blockstore:
        where = self.cfg.blocks or os.environ.get("LATTICA_BLOCKS") or str(Path.home() / ".lattica" / "blocks")
        if where == "memory":
            return MemoryBlockstore(min(self.cfg.capacity, MEMORY_CAPACITY))
        try:
            return DiskBlockstore(where, self.cfg.capacity)
        except ContentError as e:
            if self.cfg.blocks is not None:
                raise  # a directory the user chose: say so
            # the shared default is in use by another node on this machine: one of our own
            self._private_dir = tempfile.mkdtemp(prefix=f"lattica-blocks-{self.host.peer_id.short()}-")
            log.info("default blockstore in use; using a private one until this node stops", default=where, private=self._private_dir, reason=str(e))
            return DiskBlockstore(self._private_dir, self.cfg.capacity)

    @property
    def pool(self) -> ThreadPoolExecutor:
        if self._pool is None:
            self._pool = ThreadPoolExecutor(max(2, min(4, os.cpu_count() or 2)), thread_name_prefix="lattica-content")
        return self._pool

    async def in_thread(self, fn: Callable[..., Any], *args: Any) -> Any:
        return await asyncio.get_running_loop().run_in_executor(self.pool, fn, *args)

    async def on_disk(self, nbytes: int, fn: Callable[..., Any], *args: Any) -> Any:
        """``fn(*args)``, hashing or moving ``nbytes``: on a worker thread when that is worth
        the hop (large blocks), else here (a batch of small blocks costs less than the hop)."""
        if nbytes <= _INLINE_BYTES and isinstance(self._store, MemoryBlockstore):
            return fn(*args)
        if nbytes <= _INLINE_BYTES // 4:
            return fn(*args)
        return await self.in_thread(fn, *args)

    # -- publishing -----------------------------------------------------------------------------

    async def put(self, source: Any, chunk_size: int | None = None, pin: bool = True) -> Cid:
        """Chunk, hash and store ``source`` (bytes-like or a file path); pin it (a publisher's
        object is never collected) and announce it. Returns the root CID."""
        chunk = chunk_size or self.cfg.chunk_size
        store = self.store
        root, cids = await self.in_thread(_import, store, source, chunk)
        if pin:
            await self.in_thread(store.pin, str(root), cids)
        self.announce(root)
        return root

    def announce(self, root: Cid) -> None:
        """Tell the DHT we provide ``root`` (re-announced while we hold it); never waits."""
        self._provided.add(root)
        dht = self.rt.services.get("dht")
        if dht is None:
            return
        ttl = min(self.cfg.provider_ttl, dht.cfg.limits.max_ttl)
        self.host.spawn(_quietly(dht.provide(provider_key(root), ttl=ttl), "provider record not stored", root))

    def withdraw(self, root: Cid) -> None:
        self._provided.discard(root)
        dht = self.rt.services.get("dht")
        if dht is not None:
            dht.stop_providing(provider_key(root))

    async def _keep_up(self) -> None:
        """Forget old swarm members; stop announcing roots the blockstore no longer holds."""
        while True:
            await asyncio.sleep(10.0)
            now = time.monotonic()
            for root in list(self._swarms):
                members = self._swarms[root]
                for peer in [p for p, t in members.items() if now - t > _SWARM_TTL]:
                    del members[peer]
                if not members:
                    del self._swarms[root]
            if self._store is not None:
                for root in [r for r in self._provided if not self._store.has(r)]:
                    self.withdraw(root)

    # -- fetching -------------------------------------------------------------------------------

    async def fetch(self, root: Cid, progress: Callable[[dict], None] | None = None) -> Cid:
        """Make sure every block of ``root`` is in the blockstore (fetching what is missing from
        whoever has it); then announce it. One fetch per root runs; later callers share it."""
        running = self._fetches.get(root)
        if running is None:
            running = self._fetches[root] = _Fetch(self, root)
            task = self.host.spawn(running.run())
            task.add_done_callback(lambda _t: self._fetches.pop(root, None))
        if progress is not None:
            running.listeners.append(progress)
        await asyncio.shield(running.done)
        return root

    async def read(self, root: Cid) -> bytes:
        """The whole object ``root`` from the blockstore (BlockNotFound if a block is missing)."""
        return await self.in_thread(_read_all, self.store, root)

    async def write(self, root: Cid, path: str) -> str:
        """Write the object ``root`` from the blockstore to ``path`` (atomically: a temp file in
        the same directory, renamed when complete)."""
        return await self.in_thread(_write_file, self.store, root, path)

    async def pin(self, root: Cid) -> None:
        """Pin every block of ``root`` (held) under its CID text."""
        store = self.store
        cids = await self.in_thread(_dag, store, root)
        await self.in_thread(store.pin, str(root), cids)
        self.announce(root)

    async def unpin(self, root: Cid) -> bool:
        return await self.in_thread(self.store.unpin, str(root))

    async def stat(self, root: Cid | None) -> dict:
        store = self.store
        if root is None:
            st = store.stats()
            return {"blocks": st.blocks, "bytes": st.bytes, "capacity": st.capacity, "pinned_blocks": st.pinned_blocks,
                    "pinned_bytes": st.pinned_bytes, "pins": st.pin_sets, "path": getattr(store, "path", None),
                    "served_blocks": self.served_blocks, "served_bytes": self.served_bytes}
        return await self.in_thread(_stat, store, root)

    async def gc(self) -> dict:
        freed = await self.in_thread(self.store.gc)
        return {"blocks": freed.blocks, "bytes": freed.bytes}

    async def weights(self, root: Cid) -> dict:
        """The arrays of the safetensors object ``root``: fetched, written once to a file beside
        the blocks and memory-mapped from it (decoded in memory for a memory blockstore)."""
        from lattica.content import weights  # numpy and the format's parser: only for weights

        await self.fetch(root)
        base = getattr(self.store, "path", None)
        if base is None:
            return weights.decode(await self.read(root))
        target = os.path.join(os.fspath(base), "objects", f"{root}.safetensors")
        if not os.path.exists(target):
            os.makedirs(os.path.dirname(target), exist_ok=True)
            await self.write(root, target)
        return await self.in_thread(weights.mapped, target)

    async def providers(self, root: Cid, count: int = 20) -> list[PeerId]:
        dht = self.rt.services.get("dht")
        if dht is None:
            return []
        return await dht.find_providers(provider_key(root), count=count)

    # -- swarms ---------------------------------------------------------------------------------

    def joined(self, root: Cid, peer: PeerId) -> list[PeerId]:
        """``peer`` fetches ``root``: remember it in the root's swarm; the others, newest first."""
        members = self._swarms.get(root)
        if members is None:
            if len(self._swarms) >= _MAX_SWARMS:
                oldest = min(self._swarms, key=lambda r: max(self._swarms[r].values(), default=0.0))
                del self._swarms[oldest]
            members = self._swarms[root] = {}
        members.pop(peer, None)
        members[peer] = time.monotonic()
        while len(members) > _MAX_SWARM:
            del members[next(iter(members))]
        return [p for p in reversed(members) if p != peer][:_SWARM_ANSWER]

    def swarm_of(self, root: Cid) -> list[PeerId]:
        return list(self._swarms.get(root, ()))

    def heard_haves(self, peer: PeerId, root: Cid, cids: list[Cid]) -> None:
        fetch = self._fetches.get(root)
        if fetch is not None:
            fetch.heard_haves(peer, cids)

    def close(self) -> None:
        self._upkeep.cancel()
        for fetch in list(self._fetches.values()):
            fetch.cancel("the node is stopping")
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)
        if self._store is not None:
            self._store.close()
        if self._private_dir is not None:
            shutil.rmtree(self._private_dir, ignore_errors=True)


class ContentActor:
    """What peers call (see the module docstring); open to strangers: serving content is what
    the open network needs from us, and every answer is bounded."""

    NAME = "content"

    def __init__(self, service: ContentService) -> None:
        self._svc = service

    async def have(self, cids: list) -> list[bool]:
        """Per CID: whether we hold the block (want-have)."""
        store = self._svc.store
        return [store.has(c) for c in _cids(cids, _MAX_NAMED)]

    async def blocks(self, cids: list) -> list:
        """Per CID, in order: the block's bytes, or None if we do not hold it (want-block). The
        answer stops early (shorter than the request) at ``max_request_bytes``."""
        svc = self._svc
        wanted = _cids(cids, svc.cfg.max_request_blocks)
        caller = current_caller() or svc.rt.peer_id
        async with svc._gate.enter(caller):
            store = svc.store
            nbytes = sum(store.size_of(c) for c in wanted if store.has(c))
            out = await svc.on_disk(nbytes, _read_blocks, store, wanted, svc.cfg.max_request_bytes)
        sent = [b for b in out if b is not None]
        svc.served_blocks += len(sent)
        svc.served_bytes += sum(len(b) for b in sent)
        return out

    async def swarm(self, root: bytes) -> list:
        """The caller fetches ``root``: it joins the root's swarm; returns other members, each
        ``[peer id bytes, [address bytes, ...]]``, newest first."""
        cid = _cids([root], 1)[0]
        caller = current_caller() or self._svc.rt.peer_id
        out = []
        for peer in self._svc.joined(cid, caller):
            addrs = self._svc.host.peer_addrs.get(peer, ())
            out.append([peer.to_bytes(), [a.to_bytes() for a in list(addrs)[:8]]])
        return out

    async def haves(self, root: bytes, cids: list) -> None:
        """A swarm peer now holds ``cids`` of ``root`` (for our fetch of it, if any)."""
        caller = current_caller()
        if caller is None:
            return
        self._svc.heard_haves(caller, _cids([root], 1)[0], _cids(cids, _MAX_NAMED))


class _Fetch:
    """One fetch of a root: the glue between the network, the walker and the scheduler."""

    def __init__(self, svc: ContentService, root: Cid) -> None:
        self.svc = svc
        self.root = root
        self.cfg = svc.cfg
        loop = asyncio.get_running_loop()
        self.done: asyncio.Future = loop.create_future()
        self.listeners: list[Callable[[dict], None]] = []
        self.session = FetchSession(window_bytes=self.cfg.window, block_timeout=self.cfg.block_timeout, unknown_size=self.cfg.chunk_size,
                                    max_batch_bytes=min(self.cfg.max_request_bytes, 4 << 20), probe_bytes=4 << 20)
        self.walker = Walker(root, keep_bytes=self.cfg.window)
        self._wake = asyncio.Event()
        self._tasks: set[asyncio.Task] = set()
        self._peers: set[PeerId] = set()
        self._order = 0
        self._wanted: set[Cid] = set()  # given to the scheduler
        self._leaf = 0  # the largest leaf seen (sets the walker's window in places)
        self._handed = 0  # pieces of the file the walker handed out (it moved on by as many places)
        self._rescan = 0  # look for new wants once it handed out this many
        self._new_haves: list[Cid] = []
        self._swarm_asked: dict[PeerId, float] = {}
        self._stored_bytes = 0
        self._started = time.monotonic()
        self._last_found = self._started
        self._failure: BaseException | None = None
        self._rng = random.Random()

    # -- the loop -------------------------------------------------------------------------------

    async def run(self) -> None:
        try:
            await self._run()
        except BaseException as e:
            if not self.done.done():
                self.done.set_exception(e if isinstance(e, (LatticaError, OSError)) else ContentError(f"fetching {self.root} failed: {e!r}"))
                self.done.exception()  # (retrieved: a fetch nobody awaits any more must not warn)
            if not isinstance(e, (LatticaError, OSError, asyncio.CancelledError)):
                log.exception("fetch failed", root=str(self.root))
        finally:
            for t in self._tasks:
                t.cancel()
            self.svc.last_stats = self.session.stats()
        if not self.done.done():
            self.done.set_result(self.root)

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        store = self.svc.store
        self._spawn(self._discover())
        next_haves = 0.0
        while True:
            if self._failure is not None:
                raise self._failure
            await self._take_wants(store)
            if self.walker.done:
                break
            now = loop.time()
            for req in self.session.next_requests(now):
                self._spawn(self._ask(req))
            for peer in self.session.take_dropped():
                log.info("peer dropped from a fetch", peer=str(peer), root=str(self.root))
                self.session.remove_peer(peer)
            if now >= next_haves and self._new_haves:
                next_haves = now + _HAVES_EVERY
                self._announce_haves()
            if self.session.exhausted or self.session.blocked:
                if time.monotonic() - self._last_found > self.cfg.find_timeout:
                    raise self.session.error() or BlockNotFound(f"no provider of {self.root} was found")
            self._report()
            wake = self.session.next_wakeup()
            timeout = 0.25 if wake is None else min(max(wake - loop.time(), 0.0), 0.25)
            try:
                await asyncio.wait_for(self._wake.wait(), timeout)
            except asyncio.TimeoutError:
                pass
            self._wake.clear()
        self._announce_haves()
        self.svc.announce(self.root)
        self._report(final=True)

    async def _take_wants(self, store: Blockstore) -> None:
        """Give the scheduler what the walker wants next; blocks we hold already (a resumed or
        shared fetch) go straight to the walker."""
        while not self.walker.done:
            places = min(max(self.cfg.window // (self._leaf or self.cfg.chunk_size), 16), 4096)
            if self.session.remaining and (self.session.remaining > places // 2 or self._handed < self._rescan):
                return  # enough is asked: look further ahead once the walker moved on
            self._rescan = self._handed + max(places // 4, 1)
            wants = self.walker.wants(limit=places)
            held = [c for c in wants if store.has(c)]  # (also a repeated block, fetched once already)
            wants = [c for c in wants if c not in self._wanted or c in held]
            if not wants:
                return
            for cid in held:
                try:
                    block = await self.svc.in_thread(store.get, cid)
                except BlockNotFound:
                    continue  # collected meanwhile: fetch it
                self._handed += len(self.walker.add(cid, block, verified=True))
            fresh = [c for c in wants if c not in held]
            if not fresh:
                continue  # the walker moved on: look again
            # each fetcher takes a band of blocks in its own order: fetchers that start together
            # then ask the provider for different blocks and trade them among themselves
            self._rng.shuffle(fresh)
            order = []
            for _ in fresh:
                order.append((self._order // _BAND, self._rng.random()))
                self._order += 1
            self._wanted.update(fresh)
            self.session.want(fresh, None, order)
            return

    def _spawn(self, coro: Any) -> None:
        task = self.svc.host.spawn(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def cancel(self, why: str) -> None:
        self._failure = ContentError(why)
        self._wake.set()

    # -- peers ----------------------------------------------------------------------------------

    def _add_peer(self, peer: PeerId) -> None:
        if peer == self.svc.rt.peer_id or peer in self._peers:
            return
        self._peers.add(peer)
        if self.session.add_peer(peer, asyncio.get_running_loop().time()):
            self._last_found = time.monotonic()
            self._wake.set()

    async def _discover(self) -> None:
        """Providers: the peers we are connected to that have the root, the DHT's provider
        records, and the swarms those know; asked again while the fetch is short of peers."""
        delay = 0.5
        while not self.walker.done:
            await asyncio.gather(self._ask_connected(), self._ask_dht(), return_exceptions=True)
            await self._ask_swarms()
            await asyncio.sleep(delay)
            delay = min(delay * 2, _SWARM_EVERY * 2)

    async def _ask_connected(self) -> None:
        conns = [p for p in list(self.svc.host.conns) if p not in self._peers and p != self.svc.rt.peer_id]

        async def ask(peer: PeerId) -> None:
            try:
                got = await self.svc.rt.call(content_ref(peer), "have", ([self.root.bytes],), {}, timeout=2.0)
            except LatticaError:
                return
            if got == [True]:
                self._add_peer(peer)

        await asyncio.gather(*(ask(p) for p in conns[:64]))

    async def _ask_dht(self) -> None:
        try:
            found = await self.svc.providers(self.root)
        except LatticaError as e:
            log.debug("provider lookup failed", root=str(self.root), reason=str(e))
            return
        for peer in found:
            self._add_peer(peer)

    async def _ask_swarms(self) -> None:
        now = time.monotonic()
        asked = [p for p in list(self._peers) if now - self._swarm_asked.get(p, 0.0) >= _SWARM_EVERY][:8]

        async def ask(peer: PeerId) -> None:
            self._swarm_asked[peer] = now
            try:
                got = await self.svc.rt.call(content_ref(peer), "swarm", (self.root.bytes,), {}, timeout=2.0)
            except LatticaError:
                return
            if type(got) is not list:
                return
            for item in got[:_SWARM_ANSWER]:
                try:
                    other = PeerId.from_bytes(bytes(item[0]))
                    addrs = [Multiaddr.from_bytes(bytes(a)) for a in item[1][:8]]
                except (LatticaError, TypeError, ValueError, IndexError):
                    continue
                if addrs:
                    self.svc.host.remember_addrs(other, addrs)
                self._add_peer(other)

        await asyncio.gather(*(ask(p) for p in asked))

    def heard_haves(self, peer: PeerId, cids: list[Cid]) -> None:
        now = asyncio.get_running_loop().time()
        self._add_peer(peer)
        for cid in cids:
            self.session.on_have(peer, cid, now)
        self._wake.set()

    def _announce_haves(self) -> None:
        """Tell the swarm the blocks we got since the last time (Bitswap's HAVE)."""
        cids, self._new_haves = self._new_haves, []
        if not cids:
            return
        targets = set(self.svc.swarm_of(self.root)) | set(self._peers)
        for peer in targets:
            if peer not in self.svc.host.conns:
                continue  # never dial for an announcement
            for i in range(0, len(cids), _MAX_NAMED):
                try:
                    self.svc.rt.call(content_ref(peer), "haves", (self.root.bytes, [c.bytes for c in cids[i:i + _MAX_NAMED]]), {}, timeout=None, tell=True)
                except LatticaError:
                    break

    # -- one call -------------------------------------------------------------------------------

    async def _ask(self, req: Request) -> None:
        loop = asyncio.get_running_loop()
        session = self.session
        method = "blocks" if req.kind == BLOCK else "have"
        try:
            timeout = max(req.hard_deadline - loop.time(), 0.1)
            got = await self.svc.rt.call(content_ref(req.peer), method, ([c.bytes for c in req.cids],), {}, timeout=timeout)
            if type(got) is not list or len(got) > len(req.cids):
                raise ContentError(f"{req.peer} answered {method} with something else than a list per CID")
        except (LatticaError, asyncio.TimeoutError) as e:
            session.on_failure(req.peer, req.cids, loop.time(), str(e) or "timeout")
            self._wake.set()
            return
        now = loop.time()
        rest = req.cids[len(got):]
        if req.kind != BLOCK:
            for cid, has in zip(req.cids, got):
                (session.on_have if has is True else session.on_dont_have)(req.peer, cid, now)
        else:
            pairs = [(cid, b) for cid, b in zip(req.cids, got) if isinstance(b, (bytes, bytearray, memoryview))]
            missing = [cid for cid, b in zip(req.cids, got) if not isinstance(b, (bytes, bytearray, memoryview))]
            checked = await self.svc.on_disk(sum(len(b) for _, b in pairs), _check_and_store, self.svc.store, pairs) if pairs else []
            now = loop.time()
            for (cid, block), ok in zip(pairs, checked):
                if ok is not True:
                    if isinstance(ok, BaseException):  # our disk, not the peer: the fetch cannot go on
                        self._failure = ok
                        session.on_failure(req.peer, (cid,), now, str(ok))
                        continue
                    log.info("a peer sent a block that does not match its CID", peer=str(req.peer), cid=str(cid))
                    session.on_bad_block(req.peer, cid, now)
                    continue
                arrival = session.on_block(req.peer, cid, len(block), now)
                if arrival.fresh:
                    if cid.codec == RAW and len(block) > self._leaf:
                        self._leaf = len(block)
                    try:
                        self._handed += len(self.walker.add(cid, block, verified=True))
                    except BadBlock as e:  # the DAG itself is malformed: nothing to fetch elsewhere
                        self._failure = e
                    self._stored_bytes += len(block)
                    self._new_haves.append(cid)
                    session.on_written(cid)
            for cid in missing:
                session.on_dont_have(req.peer, cid, now)
        if rest:
            session.on_failure(req.peer, rest, now, "not sent (answer cut short)")
        self._wake.set()

    def _report(self, final: bool = False) -> None:
        if not self.listeners:
            return
        elapsed = max(time.monotonic() - self._started, 1e-9)
        stats = self.session.stats()
        info = {
            "cid": str(self.root),
            "bytes": self._stored_bytes,
            "total": self.walker.filesize,
            "seconds": elapsed,
            "mb_per_s": self._stored_bytes / elapsed / 1e6,
            "peers": sum(1 for s in stats.values() if s.active),
            "done": final,
        }
        for cb in list(self.listeners):
            try:
                cb(info)
            except Exception:
                log.exception("progress callback failed")


async def _quietly(coro: Any, what: str, root: Cid) -> None:
    try:
        await coro
    except LatticaError as e:
        log.info(what, root=str(root), reason=str(e))


# -- worker-thread jobs (hashing, disk) -----------------------------------------------------------


def _import(store: Blockstore, source: Any, chunk: int) -> tuple[Cid, list[Cid]]:
    importer = Importer(chunk)
    cids: list[Cid] = []

    def keep(blocks: list) -> None:
        for cid, block in blocks:
            store.put(cid, block, verified=True)
            cids.append(cid)

    if isinstance(source, (str, os.PathLike)):
        with open(source, "rb") as f:
            while True:
                piece = f.read(max(chunk, 1 << 20) * 4)
                if not piece:
                    break
                keep(importer.feed(piece))
    else:
        keep(importer.feed(source))
    root, last = importer.finish()
    keep(last)
    return root, cids


def _read_blocks(store: Blockstore, cids: list[Cid], budget: int) -> list:
    out: list = []
    for cid in cids:
        try:
            block = store.get(cid)
        except BlockNotFound:
            out.append(None)
            continue
        if out and len(block) > budget:
            break  # the rest: ask again
        budget -= len(block)
        out.append(block)
    return out


def _dag(store: Blockstore, root: Cid) -> list[Cid]:
    """Every CID of the object ``root`` (BlockNotFound if a block is missing)."""
    out, todo, seen = [], [root], set()
    while todo:
        cid = todo.pop()
        if cid in seen:
            continue
        seen.add(cid)
        out.append(cid)
        if cid.codec != RAW:
            todo.extend(children(cid, store.get(cid)))
    return out


def _stat(store: Blockstore, root: Cid) -> dict:
    held, blocks, todo, seen, size = 0, 0, [root], set(), None
    while todo:
        cid = todo.pop()
        if cid in seen:
            continue
        seen.add(cid)
        blocks += 1
        try:
            block = store.get(cid)
        except BlockNotFound:
            continue
        held += 1
        if cid.codec != RAW:
            if cid == root:
                size = UnixFSData.decode(dagpb.decode(block).data or b"").filesize
            todo.extend(children(cid, block))
        elif cid == root:
            size = len(block)
    return {"cid": str(root), "size": size, "blocks_known": blocks, "blocks_held": held, "complete": held == blocks and size is not None, "pinned": store.is_pinned(root)}


def _check_and_store(store: Blockstore, pairs: list[tuple[Cid, Any]]) -> list:
    """Per block: True (it matches its CID, and is stored), False (it does not), or the OSError
    or ContentError storing it raised."""
    out: list = []
    for cid, block in pairs:
        if not cid.verify(block):
            out.append(False)
            continue
        try:
            store.put(cid, block, verified=True)
        except BadBlock:
            out.append(False)  # over the size limit
            continue
        except (ContentError, OSError) as e:
            out.append(e)
            continue
        out.append(True)
    return out


def _read_all(store: Blockstore, root: Cid) -> bytes:
    return b"".join(piece for _, piece in walk(root, store.get, verified=True))


def _write_file(store: Blockstore, root: Cid, path: str) -> str:
    target = os.path.abspath(path)
    fd, tmp = tempfile.mkstemp(prefix=".lattica-get-", dir=os.path.dirname(target) or ".")
    try:
        with os.fdopen(fd, "wb") as f:
            for _, piece in walk(root, store.get, verified=True):
                f.write(piece)
        os.replace(tmp, target)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    return target
