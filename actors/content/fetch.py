"""One fetch of a root: the glue between the network, the walker and the scheduler (see the
``lattica.actors.content`` docstring)."""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, cast

from lattica._identity import PeerId
from lattica._multiaddr import Multiaddr
from lattica.actors.content.jobs import check_and_store, held_bytes
from lattica.actors.content.wire import (
    BAND,
    HAVES_EVERY,
    MAX_NAMED,
    SWARM_ADDRS,
    SWARM_ANSWER,
    SWARM_EVERY,
    SWARM_SOON,
    SWARM_TAKE,
    SWARM_WANT,
    content_ref,
)
from lattica.content._cid import RAW, Cid
from lattica.content._fetch_records import BLOCK, Request
from lattica.content._session import FetchSession
from lattica.content._unixfs import Walker
from lattica.errors import BadBlock, BlockNotFound, ContentError, LatticaError
from lattica.logging import get_logger

if TYPE_CHECKING:
    from lattica.actors.content.service import ContentService
    from lattica.content._blockstore import Blockstore

log = get_logger("lattica.content")

LOOKAHEAD = 16  # windows of places ahead of the walk that are asked for (in a random order per band)
PROBE_TIMEOUT = 8.0  # seconds a peer heard of has to answer whether it has the root (dial included)
PROBE_AGAIN = 10.0  # seconds before a peer that did not say so is asked again
NOBODY_ROUNDS = 2  # discovery rounds (~1.5 s) in which nobody has the root and the DHT names no provider: BlockNotFound
BENCH = 2.0  # seconds a peer dropped for failures sits out before it may rejoin (doubling each time)
MAX_FELLOWS = 32  # fellow fetchers that join a fetch by asking us for its swarm
MAX_REMEMBERED = 1024  # peers a fetch remembers as fellows, or as benched

__all__ = ["Fetch"]


class Fetch:
    """One fetch of a root: the glue between the network, the walker and the scheduler."""

    def __init__(self, svc: ContentService, root: Cid) -> None:
        self.svc = svc
        self.root = root
        self.cfg = svc.cfg
        loop = asyncio.get_running_loop()
        self.done: asyncio.Future = loop.create_future()
        self.listeners: list[Callable[[dict], None]] = []
        self.size: asyncio.Future = loop.create_future()  # the file's size, once the root is here
        self.waiters = 0  # callers awaiting it: the last one leaving early cancels the fetch
        self.session = FetchSession(
            window_bytes=self.cfg.window,
            block_timeout=self.cfg.block_timeout,
            unknown_size=self.cfg.chunk_size,
            max_batch_bytes=min(self.cfg.max_request_bytes, 4 << 20),
            probe_bytes=4 << 20,
        )
        # blocks go to the blockstore: the walker checks the DAG and keeps no leaf bytes, so the
        # fetch may look far ahead (fetchers of one object then spread over all of it)
        self.walker = Walker(root, keep_bytes=self.cfg.window, data=False)
        self._wake = asyncio.Event()
        self._tasks: set[asyncio.Task] = set()
        self._peers: set[PeerId] = set()
        self._ever_joined = False  # a provider joined at some point
        self._benched: dict[PeerId, tuple[float, int]] = {}  # dropped for failures: (until, drops)
        self._order = 0
        self._wanted: set[Cid] = set()  # given to the scheduler
        self._leaf = 0  # the largest leaf seen (sets the walker's window in places)
        self._handed = 0  # pieces of the file the walker handed out (it moved on by as many places)
        self._rescan = 0  # look for new wants once it handed out this many
        self._new_haves: list[Cid] = []
        self._new_coming: list[Cid] = []  # blocks asked of providers since the last announcement
        self._fellows: dict[PeerId, None] = {}  # peers known to fetch the root too (from swarms)
        self._joined_as_fellow = 0
        self._peer_calls: dict[PeerId, set[Any]] = {}  # each peer's calls in flight
        self._swarm_asked: dict[PeerId, float] = {}
        self._joined = asyncio.Event()  # a peer joined: ask it for its swarm now
        self.announce = True  # tell the DHT we provide the root once it is here (not a spilled value passing through)
        self._call_left: dict[Any, set[Cid]] = {}  # want-block call -> its blocks not received from anyone yet
        self._given_up: set[Any] = set()  # calls the session abandoned (cancelled without a report)
        self._calls_for: dict[Cid, dict[PeerId, Any]] = {}  # block -> the calls asking for it, by peer
        self._probed: dict[PeerId, float] = {}  # peers asked whether they have the root: when
        self._stored_bytes = 0
        self._held_bytes = 0  # of the file, held before the fetch started (a resumed fetch)
        self._started = time.monotonic()
        self._last_found = self._started  # the last block or new provider
        self._failure: BaseException | None = None
        self._rng = random.Random()
        self.task: asyncio.Task | None = None  # the task that runs it (set by the service)

    # -- the loop -------------------------------------------------------------------------------

    async def run(self) -> None:
        try:
            await self._run()
        except BaseException as e:
            if not self.done.done():
                self.done.set_exception(
                    e if isinstance(e, (LatticaError, OSError)) else ContentError(f"fetching {self.root} failed: {e!r}")
                )
                self.done.exception()  # (retrieved: a fetch nobody awaits any more must not warn)
            if not isinstance(e, (LatticaError, OSError, asyncio.CancelledError)):
                log.exception("fetch failed", root=str(self.root))
        finally:
            self.svc.last_stats = self.session.stats()
            await self._end_tasks()
        if not self.done.done():
            self.done.set_result(self.root)

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        store = self.svc.store
        if store.has(self.root):  # a resumed fetch: its progress starts at what is held
            self._held_bytes = await self.svc.in_thread(held_bytes, store, self.root)
        self._spawn(self._discover())
        next_haves = 0.0
        while True:
            if self._failure is not None:
                raise self._failure
            await self._take_wants(store)
            if self.walker.done:
                break
            now = loop.time()
            requests = self.session.next_requests(now)
            # (the session hands back the PeerIds and Cids we gave it, typed as any hashable)
            for peer, cids in self.session.take_abandoned():  # (before the new calls replace them in _calls_for)
                self._abandon(cast(PeerId, peer), cids)
            for req in requests:
                self._spawn(self._ask(req))
            for peer in self.session.take_dropped():
                self._bench(cast(PeerId, peer))
            if now >= next_haves and (self._new_haves or self._new_coming):
                next_haves = now + HAVES_EVERY
                self._announce_haves()
            idle = time.monotonic() - self._last_found
            if (self.session.exhausted or self.session.blocked) and idle > self.cfg.find_timeout:
                if not self._ever_joined:  # (nobody ever had it: say that, not how the session ended)
                    raise BlockNotFound(f"no provider found for {self.root}")
                raise self.session.error() or BlockNotFound(f"no provider of {self.root} was found")
            if idle > self.cfg.find_timeout + self.cfg.block_timeout:
                raise BlockNotFound(
                    f"no block of {self.root} arrived for {idle:.0f} s from {len(self._peers)} peers that said they have it, "
                    "and no other provider was found"
                )
            self._report()
            wake = self.session.next_wakeup()
            timeout = 0.25 if wake is None else min(max(wake - loop.time(), 0.0), 0.25)
            try:
                await asyncio.wait_for(self._wake.wait(), timeout)
            except TimeoutError:
                pass
            self._wake.clear()
        self._announce_haves()
        if self.announce:
            self.svc.announce(self.root)
        self._report(final=True)
        log.debug(
            "fetch done",
            root=str(self.root),
            seconds=round(time.monotonic() - self._started, 3),
            bytes=self._stored_bytes,
            blocks_from={str(p)[-8:]: st.blocks for p, st in self.session.stats().items() if st.blocks or st.asked},
        )

    async def _take_wants(self, store: Blockstore) -> None:
        """Give the scheduler what the walker wants next; blocks we hold already (a resumed or
        shared fetch) go straight to the walker."""
        while not self.walker.done:
            if self.walker.ready:  # a repeated subtree: read on from held blocks, a step at a time
                self._took(self.walker.advance())
                await asyncio.sleep(0)
                continue
            places = min(max(LOOKAHEAD * self.cfg.window // (self._leaf or self.cfg.chunk_size), 16), 4096)
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
                self._took(self.walker.add(cid, block, verified=True))
            fresh = [c for c in wants if c not in held]
            if not fresh:
                continue  # the walker moved on: look again
            # each fetcher takes a band of blocks in its own order: fetchers that start together
            # then ask the provider for different blocks and trade them among themselves
            self._rng.shuffle(fresh)
            order = []
            for _ in fresh:
                order.append((self._order // BAND, self._rng.random()))
                self._order += 1
            self._wanted.update(fresh)
            self.session.want(fresh, None, order)
            return

    def _took(self, pieces: list) -> None:
        """The walker handed out ``pieces``; the first time it knows the file's size, check it."""
        self._handed += len(pieces)
        self._last_found = time.monotonic()  # (progress: a block, or a provider, came lately)
        size = self.walker.filesize
        if size is not None and not self.size.done():
            self.size.set_result(size)
            if size > self.cfg.capacity:
                self._failure = ContentError(
                    f"{self.root} declares {size} bytes, more than this node's blockstore holds ({self.cfg.capacity})"
                )
                self._wake.set()

    def _spawn(self, coro: Any) -> None:
        task = self.svc.host.spawn(coro)
        self._tasks.add(task)
        task.add_done_callback(self._task_ended)

    def _task_ended(self, task: asyncio.Task) -> None:
        """A task of the fetch ended: an error it did not handle ends the fetch with it, rather
        than being left for the garbage collector to print as "never retrieved"."""
        self._tasks.discard(task)
        if task.cancelled() or task.exception() is None:
            return
        error = task.exception()
        if not isinstance(error, (LatticaError, OSError)):
            log.error("a fetch task failed", root=str(self.root), error=repr(error))
            error = ContentError(f"fetching {self.root} failed: {error!r}")
        if self._failure is None:
            self._failure = error
            self._wake.set()

    async def _end_tasks(self) -> None:
        """Cancel the fetch's tasks and wait for them: none outlives the fetch (the node's worker
        threads and blockstore close after it)."""
        while self._tasks:  # (a task ending may spawn another: a probe, a swarm question)
            ending = list(self._tasks)
            for t in ending:
                t.cancel()
            await asyncio.gather(*ending, return_exceptions=True)
            self._tasks.difference_update(ending)

    def cancel(self, why: str) -> None:
        self._failure = ContentError(why)
        self._wake.set()

    # -- peers ----------------------------------------------------------------------------------

    def _bench(self, peer: PeerId) -> None:
        """The session dropped ``peer``: its calls are forgotten, and unless it sent a bad block
        it may rejoin (found again and saying it has the root) once it sat out a while, longer
        each time: a path that broke during a hole punch, or a peer busy for a moment, is often
        the only provider there is."""
        drops = self._benched.pop(peer, (0.0, 0))[1] + 1
        sit = min(BENCH * 2 ** (drops - 1), SWARM_EVERY * 4)
        _remember(self._benched, peer, (time.monotonic() + sit, drops))
        log.info("peer dropped from a fetch", peer=str(peer), root=str(self.root), rejoins_after=sit, drops=drops)
        self.session.remove_peer(peer)
        self._peers.discard(peer)
        for call in list(self._peer_calls.pop(peer, ())):
            call.cancel()  # (a late answer must not count against it if it rejoins)

    def _add_peer(self, peer: PeerId, holder_only: bool = False, provider: bool = True) -> bool:
        """Take ``peer`` into the session; ``provider``: it holds the root or fetches it (a peer
        that may only hold some of its blocks joins without counting as one: a fetch nobody
        provides still fails fast)."""
        if peer == self.svc.rt.peer_id or peer in self._peers:
            return False
        if self._benched.get(peer, (0.0, 0))[0] > time.monotonic():
            return False
        if not self.session.add_peer(peer, asyncio.get_running_loop().time(), holder_only=holder_only):
            return False  # (it sent a bad block)
        self._peers.add(peer)
        self._ever_joined = self._ever_joined or provider
        log.debug(
            "fetch peer joins",
            root=str(self.root),
            peer=str(peer),
            after=round(time.monotonic() - self._started, 3),
            holder_only=holder_only,
        )
        self._last_found = time.monotonic()
        self._wake.set()
        self._joined.set()
        return True

    def source(self, peer: PeerId) -> None:
        """``peer`` holds the root (it told us so: a spilled value's sender): asked at once."""
        self._add_peer(peer)

    def fellow(self, peer: PeerId) -> None:
        """``peer`` fetches our root too and just asked us for its swarm: it joins our fetch at
        once, asked only for the blocks it says it has (it is alive, it called, and need not
        have anything yet), so fetchers that start together find each other whichever asked
        first. At most MAX_FELLOWS come this way (throwaway identities cannot crowd the fetch,
        and a silent one is never waited on)."""
        if peer not in self._peers and self._joined_as_fellow < MAX_FELLOWS:
            _remember(self._fellows, peer, None)
            if self._add_peer(peer, holder_only=True):
                self._joined_as_fellow += 1

    async def _discover(self) -> None:
        """Providers: the peers we are connected to that have the root, the DHT's provider
        records, and the swarms those know; asked again while the fetch is short of peers."""
        delay = 0.5
        empty = 0  # rounds in which the DHT answered that nobody provides the root, and no peer had it
        self._spawn(self._follow_swarms())
        while not self.walker.done:
            rounds = await asyncio.gather(self._ask_connected(), self._ask_dht(), return_exceptions=True)
            for failed in rounds:
                if isinstance(failed, Exception) and not isinstance(failed, LatticaError):
                    log.warning("provider discovery round failed", root=str(self.root), error=repr(failed))
            empty = (
                empty + 1 if rounds[1] == 0 and not self._ever_joined and not self._probed and not self._fellows else 0
            )
            if empty >= NOBODY_ROUNDS:
                # asked twice, a second apart: the DHT holds no provider record and no peer we
                # know has it. Say so now rather than after find_timeout (a provider that appears
                # later is found by the next fetch)
                self._failure = BlockNotFound(f"no provider found for {self.root}")
                self._wake.set()
                return
            await asyncio.sleep(delay)
            delay = min(delay * 2, SWARM_EVERY * 2)

    async def _ask_connected(self) -> None:
        conns = [p for p in list(self.svc.host.conns) if p not in self._peers and p != self.svc.rt.peer_id]

        async def ask(peer: PeerId) -> None:
            try:
                got = await self.svc.ask(peer, "have", [self.root], timeout=2.0)
            except LatticaError:
                return
            if got == [True]:
                self._add_peer(peer)

        for peer in conns[:64]:
            if self.svc.bitswap.speaks_only_bitswap(peer):
                # a libp2p node may hold blocks of an object whose root it lacks (the Lattica SDK
                # stores no dag-pb node, and says nothing of what it lacks): it joins at once,
                # holder-only, asked want-have for the blocks no provider has (the root first)
                # and want-block for those it says it has, as go's Bitswap asks its peers; it
                # counts as a provider once it says it has one
                self._add_peer(peer, holder_only=True, provider=False)
        await asyncio.gather(*(ask(p) for p in conns[:64] if p not in self._peers))

    async def _ask_dht(self) -> int | None:
        """Probe the providers the DHT knows; how many it named (None: the lookup failed)."""
        try:
            found = await self.svc.providers(self.root)
        except LatticaError as e:
            log.debug("provider lookup failed", root=str(self.root), reason=str(e))
            return None
        for peer in found:
            self._fellows.pop(peer, None)  # (a provider record: a holder, whatever a swarm answer said)
            self._probe(peer)
        return len(found)

    def _probe(self, peer: PeerId) -> None:
        """Ask a peer we heard of (a provider record, a swarm) whether it has the root, all such
        peers at once; it joins the session when it says so. A record outlives its provider by
        up to a TTL, and a dead one taken in would hold the root's first request until it timed
        out; probed together, the live ones answer first and the dead never get in."""
        if peer == self.svc.rt.peer_id or peer in self._peers:
            return
        now = time.monotonic()
        if now - self._probed.get(peer, -PROBE_AGAIN) < PROBE_AGAIN:
            return
        self._probed[peer] = now

        async def ask() -> None:
            try:
                got = await self.svc.ask(peer, "have", [self.root], timeout=PROBE_TIMEOUT)
            except LatticaError as e:
                log.debug("provider did not answer", peer=str(peer), root=str(self.root), reason=str(e))
                return
            if got == [True]:
                self._add_peer(peer)

        self._spawn(ask())

    async def _follow_swarms(self) -> None:
        """Ask our providers who else fetches the root: often while the fetch has few peers
        (fetchers that start together must find each other before the publisher has sent them
        everything), then every SWARM_EVERY."""
        while not self.walker.done:
            every = SWARM_SOON if len(self._peers) < SWARM_WANT else SWARM_EVERY
            self._joined.clear()
            try:
                await self._ask_swarms(every)
            except Exception as e:  # (a malformed answer must not end the search)
                log.warning("swarm question failed", root=str(self.root), error=repr(e))
            try:  # a new peer is asked at once (the first provider, found a round trip in)
                await asyncio.wait_for(self._joined.wait(), every)
            except TimeoutError:
                pass

    async def _ask_swarms(self, every: float) -> None:
        now = time.monotonic()
        asked = [
            p
            for p in list(self._peers)
            if now - self._swarm_asked.get(p, 0.0) >= every and not self.svc.bitswap.speaks_only_bitswap(p)
        ][:8]  # (libp2p peers keep no swarms)

        async def ask(peer: PeerId) -> None:
            self._swarm_asked[peer] = now
            try:
                got = await self.svc.rt.call(content_ref(peer), "swarm", (self.root.bytes,), {}, timeout=2.0)
            except LatticaError:
                return
            if type(got) is not list:
                return
            taken = 0
            for item in got[:SWARM_ANSWER]:
                if taken >= SWARM_TAKE:
                    break
                if (
                    type(item) is not list
                    or len(item) != 2
                    or type(item[0]) is not bytes
                    or type(item[1]) is not list
                    or len(item[1]) > SWARM_ADDRS
                ):
                    continue
                try:
                    other = PeerId.from_bytes(item[0])
                    addrs = [Multiaddr.from_bytes(a) for a in item[1] if type(a) is bytes and len(a) <= 128]
                except LatticaError:
                    continue
                if other in self._peers or other == self.svc.rt.peer_id:
                    continue
                if addrs and other not in self.svc.host.conns:
                    self.svc.host.remember_addrs(other, addrs, hint=True)  # (a peer's word for another's addresses)
                taken += 1
                _remember(self._fellows, other, None)
                self._probe(other)

        await asyncio.gather(*(ask(p) for p in asked))

    @property
    def peers(self) -> set[PeerId]:
        return self._peers

    def heard_haves(self, peer: PeerId, cids: list[Cid], coming: list[Cid]) -> None:
        now = asyncio.get_running_loop().time()
        for cid in cids:
            self.session.on_have(peer, cid, now)
        for cid in coming:
            self.session.on_coming(peer, cid, now)
        self._wake.set()

    def _announce_haves(self) -> None:
        """Tell the swarm the blocks we got since the last time (Bitswap's HAVE) and the ones we
        asked for meanwhile (a claim: fellows ask others for other blocks, then us for these)."""
        cids, self._new_haves = self._new_haves, []
        coming, self._new_coming = self._new_coming, []
        if not cids and not coming:
            return
        targets = set(self.svc.swarm_of(self.root)) | set(self._peers)
        for peer in targets:
            if peer not in self.svc.host.conns or self.svc.bitswap.speaks_only_bitswap(peer):
                continue  # never dial for an announcement; libp2p peers take no haves notices
            for i in range(0, max(len(cids), len(coming)), MAX_NAMED):
                part = ([c.bytes for c in cids[i : i + MAX_NAMED]], [c.bytes for c in coming[i : i + MAX_NAMED]])
                try:
                    self.svc.rt.call(content_ref(peer), "haves", (self.root.bytes, *part), {}, timeout=None, tell=True)
                except LatticaError:
                    break

    # -- one call -------------------------------------------------------------------------------

    async def _ask(self, req: Request) -> None:
        loop = asyncio.get_running_loop()
        session = self.session
        method = "blocks" if req.kind == BLOCK else "have"
        peer, cids = _typed(req)
        call = None
        try:
            timeout = max(req.hard_deadline - loop.time(), 0.1)
            call = self.svc.ask(peer, method, list(cids), timeout)
            self._peer_calls.setdefault(peer, set()).add(call)
            if req.kind == BLOCK:
                self._track(call, req)
                # a claim only for blocks the peer holds: a provider's, or those a fellow said it has
                fellow = peer in self._fellows
                self._new_coming.extend(c for c in cids if not fellow or session.holds(peer, c))
            try:
                got = await call
            finally:
                calls = self._peer_calls.get(peer)
                if calls is not None:
                    calls.discard(call)
                    if not calls:
                        del self._peer_calls[peer]
                if req.kind == BLOCK:
                    self._untrack(call, req)
            if type(got) is not list or len(got) > len(cids):
                raise ContentError(f"{peer} answered {method} with something else than a list per CID")
        except (TimeoutError, LatticaError) as e:
            session.on_failure(peer, cids, loop.time(), str(e) or "timeout")
            self._wake.set()
            return
        except asyncio.CancelledError:
            # (_ask runs as a task of its own: _spawn)
            if call is None or not call.cancelled() or cast(asyncio.Task, asyncio.current_task()).cancelling():
                raise  # (the fetch is ending)
            if call in self._given_up:
                self._given_up.discard(call)
                return  # (the session gave it up itself: its blocks may be asked again already)
            session.on_failure(peer, cids, loop.time(), "cancelled")  # every block of it came from elsewhere
            self._wake.set()
            return
        now = loop.time()
        rest = cids[len(got) :]
        if req.kind != BLOCK:
            for cid, has in zip(cids, got):
                (session.on_have if has is True else session.on_dont_have)(peer, cid, now)
            self._ever_joined = self._ever_joined or True in got  # (a holder-only peer that has some)
        else:
            pairs, passed, missing = [], [], []  # every CID answered ends in exactly one of them
            for cid, b in zip(cids, got):
                if isinstance(b, (bytes, bytearray, memoryview)):
                    pairs.append((cid, b))
                elif type(b) is list and len(b) == 1 and type(b[0]) is bytes and len(b[0]) <= 64:
                    passed.append((cid, b[0]))
                else:
                    missing.append(cid)  # None (dont-have), or anything else a peer made up
            for cid, who in passed:  # super-seeding: the provider sent it to a fellow a moment ago
                try:
                    holder: PeerId | None = PeerId.from_bytes(who)
                except (LatticaError, ValueError, TypeError):
                    holder = None
                session.on_passed(peer, cid, holder, loop.time())
            checked = (
                await self.svc.on_disk(sum(len(b) for _, b in pairs), check_and_store, self.svc.store, pairs)
                if pairs
                else []
            )
            now = loop.time()
            for (cid, block), ok in zip(pairs, checked):
                if ok is not True:
                    if isinstance(ok, BaseException):  # our disk, not the peer: the fetch cannot go on
                        self._failure = ok
                        session.on_failure(peer, (cid,), now, str(ok))
                        continue
                    log.info("a peer sent a block that does not match its CID", peer=str(peer), cid=str(cid))
                    session.on_bad_block(peer, cid, now)
                    continue
                arrival = session.on_block(peer, cid, len(block), now)
                for other in arrival.cancel:
                    self._redundant(cast(PeerId, other), cid)
                if arrival.fresh:
                    if cid.codec == RAW and len(block) > self._leaf:
                        self._leaf = len(block)
                    try:
                        # unixfs's Block leaves out bytearray, which Walker reads just the same
                        self._took(self.walker.add(cid, cast("bytes | memoryview", block), verified=True))
                    except BadBlock as e:  # the DAG itself is malformed: nothing to fetch elsewhere
                        self._failure = e
                    self._stored_bytes += len(block)
                    self._new_haves.append(cid)
                    session.on_written(cid)
            for cid in missing:
                session.on_dont_have(peer, cid, now)
        if rest:
            session.on_failure(peer, rest, now, "not sent (answer cut short)")
        self._wake.set()

    # Bitswap's CANCEL: a want-block whose every block arrived from another peer is cancelled
    # where it runs (a call still queued at a busy provider, often the publisher everyone asks,
    # is never served)

    def _track(self, call: Any, req: Request) -> None:
        peer, cids = _typed(req)
        self._call_left[call] = set(cids)
        for cid in cids:
            self._calls_for.setdefault(cid, {})[peer] = call

    def _untrack(self, call: Any, req: Request) -> None:
        peer, cids = _typed(req)
        self._call_left.pop(call, None)
        for cid in cids:
            calls = self._calls_for.get(cid)
            if calls is not None and calls.get(peer) is call:
                del calls[peer]
                if not calls:
                    del self._calls_for[cid]

    def _abandon(self, peer: PeerId, cids: tuple) -> None:
        """The session gave up a want-block its peer said nothing about: cancel it where it waits."""
        call = self._calls_for.get(cids[0], {}).get(peer) if cids else None
        if call is not None and not call.done():
            self._given_up.add(call)
            call.cancel()

    def _redundant(self, peer: PeerId, cid: Cid) -> None:
        call = self._calls_for.get(cid, {}).get(peer)
        if call is None:
            return
        left = self._call_left.get(call)
        if left is None:
            return
        left.discard(cid)
        if not left:
            call.cancel()

    def progress(self) -> dict:
        """Where this fetch stands (the dashboard's transfers): bytes of the file held (before it
        started, and fetched since), the file's size once known, the peers it fetches from, seconds since it started."""
        return {
            "cid": str(self.root),
            "bytes": self._held_bytes + self._stored_bytes,
            "total": self.walker.filesize,
            "peers": len(self._peers),
            "kinds": self.kinds(),
            "seconds": round(time.monotonic() - self._started, 3),
        }

    def kinds(self) -> str:
        """Who the fetch's providers are: ``"2 lattica, 1 libp2p (rust-libp2p/0.54)"``: Lattica
        nodes, and libp2p nodes by the implementation their identify names."""
        counts: dict[str, int] = {}
        for peer in self._peers:
            if self.svc.bitswap.speaks_only_bitswap(peer):
                kind = f"libp2p ({self.svc.bitswap.implementation(peer) or 'unnamed'})"
            else:
                kind = "lattica"
            counts[kind] = counts.get(kind, 0) + 1
        return ", ".join(f"{n} {kind}" for kind, n in sorted(counts.items()))

    def _report(self, final: bool = False) -> None:
        if not self.listeners:
            return
        elapsed = max(time.monotonic() - self._started, 1e-9)
        stats = self.session.stats()
        info = {
            "cid": str(self.root),
            "bytes": self._held_bytes + self._stored_bytes,  # (the file's: held before, and fetched)
            "held": self._held_bytes,
            "total": self.walker.filesize,
            "seconds": elapsed,
            "mb_per_s": self._stored_bytes / elapsed / 1e6,
            "peers": sum(1 for s in stats.values() if s.active),
            "kinds": self.kinds(),
            "done": final,
        }
        for cb in list(self.listeners):
            try:
                cb(info)
            except Exception:
                log.exception("progress callback failed")


def _typed(req: Request) -> tuple[PeerId, tuple[Cid, ...]]:
    """``req``'s peer and CIDs: the PeerId and Cids we gave the session (it types them as any hashable)."""
    return cast(PeerId, req.peer), cast("tuple[Cid, ...]", req.cids)


def _remember(table: dict, key: Any, value: Any) -> None:
    """Put ``key`` in ``table`` (insertion-ordered), dropping the oldest beyond MAX_REMEMBERED."""
    table.pop(key, None)
    table[key] = value
    while len(table) > MAX_REMEMBERED:
        del table[next(iter(table))]
