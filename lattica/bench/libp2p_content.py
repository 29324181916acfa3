"""``lattica bench libp2p-content``: content with the Lattica SDK (rust-libp2p 0.54 and its
beetswap, issue 49), four figures measured in one run, each next to its own baseline:

1. **Bitswap from an SDK node.** The object (``size`` bytes, 1 MiB chunks) is split between an
   SDK node A, which ``put_block``\\ s each leaf (one raw block each: the same CIDs as our UnixFS
   import), and a Lattica node R holding only the dag-pb nodes (the root, and past 174 leaves the
   inner nodes under it; the SDK cannot store them): R puts the object unpinned and deletes the
   leaves from its blockstore. A Lattica fetcher F, connected to A and R, fetches the root; every
   leaf must come from A over Bitswap (the fetch's per-peer stats and ``bitswap.received_bytes``
   say so). Baseline: SDK node B ``get_block``\\ s the same leaves from A, ``threads`` at once,
   timed by its driver (``sdk_peer.py``'s ``get_blocks``).
2. **Bitswap from a Lattica node.** Fetcher F2 gets the object from Lattica node P by our actor
   protocol and with Bitswap forced (the fetcher's ``content.bitswap.speaks_only_bitswap``
   answers True for P, so every have/blocks request to P goes over ``/ipfs/bitswap/1.2.0``),
   ``rounds`` times each, alternating, its blockstore emptied by ``gc`` before each.
3. **Kademlia lookups in a mixed DHT** of 3 SDK and 3 Lattica nodes on ``/lattica/1.0.0``:
   values are stored by an SDK node and a Lattica node, then a Lattica node and an SDK node that
   joined after the stores (so neither holds them) look them up; ``closest_peers`` of random keys
   from the Lattica node too. Ours are timed in the looking node's process (on its loop), the
   SDK's ``get`` by its driver.
4. **A swarm with mixed providers:** the publisher P, A and B holding the leaves, and
   ``fetchers`` Lattica fetchers started at once; each one's seconds, and the bytes each kind of
   provider served (publisher, SDK nodes, fellow fetchers), summed from the fetchers' per-peer
   session stats (``ContentService.last_stats``).

A Lattica fetch takes as providers only peers that say they have the **root** (connected peers
asked want-have, provider records, swarms), and an SDK node holds leaves only: F and the swarm's
fetchers are told A and B hold them (``ContentService.fetch(root, source=...)``) once the dag-pb
nodes have arrived, the way a caller that knows who holds the leaves would (told before, the
fetch may ask A for a dag-pb node, which the SDK neither sends nor says it lacks: the request
waits out ``ContentConfig.block_timeout``, 10 s). Every fetcher first gets a small warm-up
object (its fetch machinery loads, its worker threads start). Every Lattica node is a process
of its own on loopback (with a blockstore directory of its own), driven through actors by the
bench's node, which runs no Kademlia (the DHT figure's nodes must not find it); every fetch is
timed inside the fetching process from the call to the last block stored (each block checked
against its CID); the SDK nodes are ``sdk_peer.py kad`` processes (lattica.bench._peers.sdk_node).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import os
import pathlib
import shutil
import statistics
import tempfile
import time
from collections.abc import Awaitable, Callable, Iterator, Sequence
from typing import Any

import numpy as np

import lattica
from lattica._identity import PeerId
from lattica._runtime import current_runtime
from lattica.bench._peers.sdk_node import SdkNode
from lattica.bench.rpc import spawn_on
from lattica.content._cid import Cid
from lattica.content._dagpb import decode as decode_node
from lattica.dht._sdk_values import encode_value
from lattica.errors import LatticaError
from lattica.mesh.process import ServerProcess

MiB = 1 << 20
CHUNK = MiB  # the SDK sends every pending block in one message and we read 4 MiB at most
SDK_NET = "/lattica/1.0.0"
SEED = 49
WARM = 2 * MiB  # a warm-up object each fetcher gets first (its fetch machinery loads, its threads start)
_TCP = "/ip4/127.0.0.1/tcp/0"

Say = Callable[[str], None]


def _content() -> Any:
    return current_runtime().host.services.content


def object_bytes(size: int, seed: int = SEED) -> bytes:
    """Incompressible bytes that every process makes alike from ``seed`` (no two leaves alike)."""
    return np.random.default_rng(seed).bytes(size)


@lattica.actor
class ContentPeer:
    """Runs in a Lattica node process: publishes, holds only a root, or fetches (timed here)."""

    async def publish(self, size: int, seed: int) -> dict:
        """Put the object (pinned, announced); its root and leaves."""
        svc = _content()
        root = await svc.put(object_bytes(size, seed), CHUNK, True)
        nodes, leaves = _dag(svc, root)
        return {"cid": str(root), "nodes": [str(c) for c in nodes], "leaves": [str(c) for c in leaves]}

    async def hold_root_only(self, size: int, seed: int) -> dict:
        """Put the object unpinned, then delete its leaves: the blockstore keeps its dag-pb nodes
        alone (the root, and the inner nodes of an object of more than 174 leaves)."""
        svc = _content()
        root = await svc.put(object_bytes(size, seed), CHUNK, False)
        nodes, leaves = _dag(svc, root)
        for cid in leaves:
            svc.store.delete(cid)
        return {
            "cid": str(root),
            "nodes": [str(c) for c in nodes],
            "leaves": [str(c) for c in leaves],
            "blocks_held": len(svc.store),
        }

    async def fetch(self, cid: str, sources: list[str], bitswap_to: list[str], nodes: list[str]) -> dict:
        """Fetch ``cid`` into the blockstore: ``sources`` (PeerIds holding the leaves) join the
        fetch once the blocks ``nodes`` (its dag-pb nodes) are here; ``bitswap_to``: peers asked
        over Bitswap even if they are Lattica nodes. The seconds from the call to the last block
        stored, the bytes each peer delivered first (the session's stats), the bytes that came
        over Bitswap."""
        svc = _content()
        root = Cid.parse(cid)
        forced = {PeerId.from_string(p) for p in bitswap_to}
        if forced:
            speaks = svc.bitswap.speaks_only_bitswap
            svc.bitswap.speaks_only_bitswap = lambda peer: peer in forced or speaks(peer)
        received = svc.bitswap.received_bytes
        error = None
        t0 = time.perf_counter()
        try:
            main = asyncio.ensure_future(svc.fetch(root))
            if sources:
                wait = [Cid.parse(c) for c in nodes]
                while not main.done() and not all(svc.store.has(c) for c in wait):
                    await asyncio.sleep(0.002)
                if not main.done():
                    await asyncio.gather(main, *(svc.fetch(root, source=PeerId.from_string(s)) for s in sources))
            await main
        except LatticaError as e:
            error = f"{type(e).__name__}: {e}"
        finally:
            seconds = time.perf_counter() - t0
            if forced:
                del svc.bitswap.speaks_only_bitswap  # (the class's method again)
        stat = await svc.stat(root)
        return {
            "seconds": seconds,
            "error": error,
            "complete": stat["complete"],
            "peers": {str(p): [s.bytes, s.blocks, s.duplicates] for p, s in svc.last_stats.items()},
            "bitswap_bytes": svc.bitswap.received_bytes - received,
        }

    async def drop(self) -> dict:
        """Collect every unpinned block (a fetched object: fetched again from nothing)."""
        return await _content().gc()


def _kad_here() -> Any:
    kad = current_runtime().host.services.kad
    if kad is None:
        raise RuntimeError("the node runs no libp2p Kademlia")
    return kad[SDK_NET]


@lattica.actor
class KadPeer:
    """Runs in a Lattica node process of the DHT figure: its side of ``/lattica/1.0.0``."""

    async def knows(self, peer: str) -> bool:
        return PeerId.from_string(peer) in _kad_here().table

    async def warm(self) -> int:
        """A lookup of our own id (the table fills, connections open); the peers found."""
        kad = _kad_here()
        return len(await kad.closest_peers(kad.peer_id.to_bytes()))

    async def put(self, key: str, value: bytes) -> int:
        return int(await _kad_here().put_value(key.encode(), value))

    async def held(self, keys: list[str]) -> int:
        """How many of ``keys`` this node holds a value of."""
        values = _kad_here().values
        return sum(values.get(k.encode()) is not None for k in keys)

    async def lookups(self, keys: list[str], random_keys: int) -> dict:
        """``closest_peers`` of ``random_keys`` random keys, then ``get_value`` of each of
        ``keys``, one at a time, each timed here; the peers each get asked (median)."""
        kad = _kad_here()
        closest_ms, closest_ok = await _timed([lambda: kad.closest_peers(os.urandom(32)) for _ in range(random_keys)])
        before = len(kad.stats)
        gets: list[Callable[[], Awaitable[Any]]] = [functools.partial(kad.get_value, k.encode()) for k in keys]
        get_ms, get_ok = await _timed(gets)
        queried = [s.queried for s in list(kad.stats)[before:] if s.kind == "get_value"]
        return {
            "closest_ms": closest_ms,
            "closest_ok": closest_ok,
            "get_ms": get_ms,
            "get_ok": get_ok,
            "get_queried_p50": statistics.median(queried) if queried else None,
        }


def _dag(svc: Any, root: Cid) -> tuple[list[Cid], list[Cid]]:
    """The object's dag-pb nodes (the root, and inner nodes past 174 leaves) and its raw leaves,
    each in the file's order."""
    if root.codec_name != "dag-pb":
        raise ValueError(f"an object of one block ({root}): the bench needs more than {CHUNK} bytes")
    nodes: list[Cid] = []
    leaves: list[Cid] = []

    def walk(cid: Cid) -> None:
        if cid.codec_name == "raw":
            leaves.append(cid)
            return
        nodes.append(cid)
        for link in decode_node(svc.store.get(cid)).links:
            walk(link.cid)

    walk(root)
    return nodes, leaves


# -- processes ------------------------------------------------------------------------------------


class _Procs:
    """Lattica node processes, each with a blockstore directory of its own (removed when it stops)."""

    def __init__(self, me: lattica.Node) -> None:
        self.me = me
        self.running: dict[str, tuple[ServerProcess, str]] = {}

    def start(self, connect: Sequence[str] = (), actor: Any = None) -> tuple[ServerProcess, Any]:
        """A node process dialing ``connect`` once started, ``me`` connected to it, and an
        ``actor`` (default ContentPeer) spawned there."""
        blocks = tempfile.mkdtemp(prefix="lattica-bench-blocks-")
        extra = [x for a in connect for x in ("--connect", a)]
        proc = ServerProcess([_TCP], *extra, env={**os.environ, "LATTICA_BLOCKS": blocks})
        try:
            proc.__enter__()
        except BaseException:
            shutil.rmtree(blocks, ignore_errors=True)
            raise
        self.running[proc.peer_id] = (proc, blocks)
        self.me.connect(proc.addr("tcp"))
        return proc, spawn_on(self.me, actor or ContentPeer, proc.peer_id)

    def stop(self, proc: ServerProcess) -> None:
        _, blocks = self.running.pop(proc.peer_id)
        proc.__exit__(None, None, None)
        shutil.rmtree(blocks, ignore_errors=True)

    def close(self) -> None:
        for proc, _ in list(self.running.values())[::-1]:
            self.stop(proc)


def _call(me: lattica.Node, ref: Any, method: str, *args: Any, timeout: float = 1800) -> Any:
    async def go() -> Any:
        return await getattr(ref, method).remote(*args)

    return me.run(go(), timeout=timeout)


def _sdk(me: lattica.Node, stack: contextlib.ExitStack, sdk_python: pathlib.Path, boots: Sequence[str] = ()) -> SdkNode:
    """An SDK node driven from ``me``'s loop, stopped when ``stack`` closes."""
    node = me.run(SdkNode.start(sdk_python, boots), timeout=60)
    stack.callback(lambda: me.run(node.stop(), timeout=30))
    return node


def _put_leaves(me: lattica.Node, sdk: SdkNode, data: bytes) -> list[str]:
    """``put_block`` each 1 MiB leaf of ``data`` on ``sdk``; their CIDs."""

    async def put() -> list[str]:
        return [await sdk.put_block(data[i : i + CHUNK]) for i in range(0, len(data), CHUNK)]

    return me.run(put(), timeout=120 + len(data) / 5e6)


def _mb_s(nbytes: int, seconds: float) -> float:
    return round(nbytes / seconds / 1e6, 1)


# -- 1: Bitswap from an SDK node ------------------------------------------------------------------


def from_sdk(
    me: lattica.Node, procs: _Procs, a: SdkNode, b: SdkNode, data: bytes, threads: int, say: Say
) -> tuple[dict[str, Any], list[str]]:
    """Figure 1 (see the module docstring); also the leaves' CIDs."""
    size = len(data)
    say(f"1. SDK node A put_blocks {len(range(0, size, CHUNK))} leaves, Lattica node R holds the dag-pb nodes alone")
    r, holder = procs.start()
    held = _call(me, holder, "hold_root_only", size, SEED)
    cids = _put_leaves(me, a, data)
    say(f"1. SDK node B gets the leaves from A, {threads} get_block calls at once")
    base = me.run(b.get_blocks(cids, threads, timeout=60 + size / 1e6), timeout=90 + size / 1e6)
    say("1. Lattica fetcher F, connected to A and R, gets the root")
    warm = _call(me, holder, "publish", WARM, SEED + 1)["cid"]
    f, fetcher = procs.start([r.addr("tcp"), a.addr()])
    _call(me, fetcher, "fetch", warm, [], [], [])
    got = _call(me, fetcher, "fetch", held["cid"], [a.peer_id], [], held["nodes"])
    procs.stop(f)  # (F and R hold the object: they must serve nobody in the figures that follow)
    procs.stop(r)
    from_a = got["peers"].get(a.peer_id, [0])[0]
    ours = _mb_s(size, got["seconds"]) if got["complete"] else None
    theirs = _mb_s(base["bytes"], base["seconds"])
    row = {
        "bench": "libp2p-content",
        "case": "bitswap from an sdk node",
        "mib": size >> 20,
        "lattica_mb_s": ours,
        "sdk_mb_s": theirs,
        "ratio": round(ours / theirs, 2) if ours else None,
        "same_cids": cids == held["leaves"],
        "r_blocks": held["blocks_held"],
        "from_a_bytes": from_a,
        "bitswap_bytes": got["bitswap_bytes"],
        "all_from_a": from_a == size == got["bitswap_bytes"],
        "sdk_all_from_a": base["from"].get(a.peer_id, 0) == len(cids) == base["verified"],
        "sdk_threads": threads,
        "error": got["error"],
    }
    return row, cids


# -- 2: Bitswap from a Lattica node ---------------------------------------------------------------


def from_lattica(
    me: lattica.Node, procs: _Procs, p: ServerProcess, publisher: Any, root: str, size: int, rounds: int, say: Say
) -> dict[str, Any]:
    """Figure 2 (see the module docstring): after a warm-up object both ways, ``rounds`` fetches
    each way, alternating (actor, Bitswap, Bitswap, actor, ...), the blockstore emptied before
    each; the median of each way."""
    say(f"2. Lattica fetcher F2 gets the object from Lattica node P, {rounds} times by our protocol and over Bitswap")
    warm = _call(me, publisher, "publish", WARM, SEED + 2)["cid"]
    f2, fetcher = procs.start([p.addr("tcp")])
    runs: dict[bool, list[dict]] = {False: [], True: []}
    try:
        for bitswap in (False, True):
            _call(me, fetcher, "fetch", warm, [], [p.peer_id] if bitswap else [], [])
            _call(me, fetcher, "drop")
        for i in range(2 * rounds):
            bitswap = i % 4 in (1, 2)
            runs[bitswap].append(_call(me, fetcher, "fetch", root, [], [p.peer_id] if bitswap else [], []))
            _call(me, fetcher, "drop")
    finally:
        procs.stop(f2)

    def speed(got: list[dict]) -> float | None:
        if not all(g["complete"] for g in got):
            return None
        return _mb_s(size, statistics.median(g["seconds"] for g in got))

    ours, forced = speed(runs[False]), speed(runs[True])
    return {
        "bench": "libp2p-content",
        "case": "bitswap from a lattica node",
        "mib": size >> 20,
        "actor_mb_s": ours,
        "bitswap_mb_s": forced,
        "ratio": round(forced / ours, 2) if ours and forced else None,
        "rounds": rounds,
        "actor_runs_mb_s": [_mb_s(size, g["seconds"]) for g in runs[False]],
        "bitswap_runs_mb_s": [_mb_s(size, g["seconds"]) for g in runs[True]],
        "bitswap": "forced: F2's content.bitswap.speaks_only_bitswap(P) returns True",
        "bitswap_bytes": [g["bitswap_bytes"] for g in runs[True]],
        "actor_runs_bitswap_bytes": sum(g["bitswap_bytes"] for g in runs[False]),
        "error": next((g["error"] for g in runs[False] + runs[True] if g["error"]), None),
    }


# -- 3: Kademlia lookups --------------------------------------------------------------------------


def _pct(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return round(ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))], 2)


async def _timed(calls: list[Callable[[], Awaitable[Any]]]) -> tuple[list[float], int]:
    """The milliseconds of each call in turn (on the node's loop), and how many succeeded."""
    ms, ok = [], 0
    for call in calls:
        t0 = time.perf_counter()
        try:
            await call()
            ok += 1
        except LatticaError:
            pass
        ms.append((time.perf_counter() - t0) * 1e3)
    return ms, ok


def _wait_until_known(me: lattica.Node, ref: Any, peer: str, wait: float = 40.0) -> None:
    """Until ``peer`` is in the routing table of the node ``ref`` runs on."""
    deadline = time.monotonic() + wait
    while not _call(me, ref, "knows", peer, timeout=10):
        if time.monotonic() > deadline:
            raise TimeoutError(f"{peer} not in a Lattica node's {SDK_NET} table within {wait:.0f} s")
        time.sleep(0.05)


def kad_lookups(
    me: lattica.Node,
    procs: _Procs,
    stack: contextlib.ExitStack,
    sdk_python: pathlib.Path,
    lookups: int,
    keys: int,
    say: Say,
) -> dict[str, Any]:
    """Figure 3 (see the module docstring)."""
    say(f"3. a DHT of 3 SDK + 3 Lattica nodes on {SDK_NET}: {keys} values stored, {lookups} lookups each")
    l1, k1 = procs.start(actor=KadPeer)
    l2, k2 = procs.start([l1.addr("tcp")], actor=KadPeer)
    s1 = _sdk(me, stack, sdk_python, [l1.addr("tcp")])
    s2 = _sdk(me, stack, sdk_python, [s1.addr(), l2.addr("tcp")])
    _wait_until_known(me, k1, s1.peer_id)
    _wait_until_known(me, k2, s2.peer_id)
    _call(me, k2, "warm")  # (L2 meets S1 through L1 and S2)
    names = [f"issue-49/bench/{i}" for i in range(keys)]
    expiration = time.time() + 3600
    for i, name in enumerate(names):  # half stored by an SDK node, half by a Lattica node
        value = os.urandom(100)
        if i % 2:
            me.run(s1.store(name, value, expiration), timeout=60)
        else:
            _call(me, k2, "put", name, encode_value(value, expiration), timeout=60)
    # the lookers join after the stores, so neither holds a value of its own to answer with
    l3, k3 = procs.start([l1.addr("tcp")], actor=KadPeer)
    s3 = _sdk(me, stack, sdk_python, [s2.addr(), l2.addr("tcp")])
    _wait_until_known(me, k3, l1.peer_id)
    _call(me, k3, "warm")  # (its table fills)
    me.run(s3.gets(["issue-49/bench/nobody"]), timeout=60)  # (the SDK's warm-up)
    held_before = _call(me, k3, "held", names)
    picks = [names[i % keys] for i in range(lookups)]
    budget = 60 + lookups * 10
    ours = _call(me, k3, "lookups", picks, lookups, timeout=2 * budget)
    sdk_ms, sdk_found = me.run(s3.gets(picks, timeout=budget), timeout=budget + 30)
    for sdk in (s3, s2, s1):  # (the swarm that follows runs without them)
        me.run(sdk.stop(), timeout=30)
    for proc in (l3, l2, l1):
        procs.stop(proc)
    return {
        "bench": "libp2p-content",
        "case": "kad lookups",
        "dht": f"3 sdk + 3 lattica on {SDK_NET}",
        "lookups": lookups,
        "lattica_closest_p50_ms": _pct(ours["closest_ms"], 0.5),
        "lattica_closest_p99_ms": _pct(ours["closest_ms"], 0.99),
        "lattica_closest_ok": ours["closest_ok"],
        "lattica_get_p50_ms": _pct(ours["get_ms"], 0.5),
        "lattica_get_p99_ms": _pct(ours["get_ms"], 0.99),
        "lattica_get_found": ours["get_ok"],
        "lattica_get_queried_p50": ours["get_queried_p50"],
        "sdk_get_p50_ms": _pct(sdk_ms, 0.5),
        "sdk_get_p99_ms": _pct(sdk_ms, 0.99),
        "sdk_get_found": sum(sdk_found),
        "held_by_lookers_before": held_before,
    }


# -- 4: a swarm with mixed providers --------------------------------------------------------------


def swarm(
    me: lattica.Node,
    procs: _Procs,
    p: ServerProcess,
    publisher: Any,
    sdks: list[SdkNode],
    published: dict[str, Any],
    size: int,
    fetchers: int,
    say: Say,
) -> dict[str, Any]:
    """Figure 4 (see the module docstring)."""
    say(f"4. {fetchers} Lattica fetchers at once; providers: Lattica publisher P and {len(sdks)} SDK nodes")
    warm = _call(me, publisher, "publish", WARM, SEED + 3)["cid"]
    started = [procs.start([p.addr("tcp"), *(s.addr() for s in sdks)]) for _ in range(fetchers)]
    refs = [ref for _, ref in started]
    for ref in refs:
        _call(me, ref, "fetch", warm, [], [], [])
    sources = [s.peer_id for s in sdks]

    async def all_fetch() -> list[dict]:
        return await asyncio.gather(*(r.fetch.remote(published["cid"], sources, [], published["nodes"]) for r in refs))

    t0 = time.perf_counter()
    results = me.run(all_fetch(), timeout=600 + 4 * fetchers * size / 10e6)
    total = time.perf_counter() - t0
    kinds = {p.peer_id: "publisher", **{s: "sdk" for s in sources}}
    kinds.update({proc.peer_id: "fetchers" for proc, _ in started})
    served = {"publisher": 0, "sdk": 0, "fetchers": 0, "other": 0}
    for got in results:
        for peer, (nbytes, _, _) in got["peers"].items():
            served[kinds.get(peer, "other")] += nbytes
    for proc, _ in started:
        procs.stop(proc)
    return {
        "bench": "libp2p-content",
        "case": f"swarm: 1 lattica + {len(sdks)} sdk providers -> {fetchers} fetchers",
        "mib": size >> 20,
        "completed": sum(1 for g in results if g["complete"] and not g["error"]),
        "fetchers": fetchers,
        "seconds": [round(g["seconds"], 2) for g in results],
        "all_done_s": round(total, 2),
        "publisher_mib": round(served["publisher"] / MiB, 1),
        "sdk_mib": round(served["sdk"] / MiB, 1),
        "fetchers_mib": round(served["fetchers"] / MiB, 1),
        "other_mib": round(served["other"] / MiB, 1),
        "errors": [g["error"] for g in results if g["error"]],
    }


# -- the bench ------------------------------------------------------------------------------------


def bench_libp2p_content(
    sdk_python: pathlib.Path,
    size: int = 256 * MiB,
    lookups: int = 100,
    keys: int = 20,
    threads: int = 16,
    fetchers: int = 4,
    rounds: int = 2,
    progress: Say | None = None,
) -> Iterator[dict[str, Any]]:
    """The four figures (see the module docstring), a row each, in their order; ``sdk_python``:
    the SDK venv's interpreter (lattica.bench.libp2p.find_peers), used as given."""
    if size <= CHUNK:
        raise ValueError(f"the object must be larger than one {CHUNK}-byte leaf")
    say = progress or (lambda _: None)
    data = object_bytes(size)
    with contextlib.ExitStack() as stack:
        # (no Kademlia: the DHT figure's nodes must not find this one, which only drives them)
        me = stack.enter_context(lattica.Node([], kad=False))
        procs = _Procs(me)
        stack.callback(procs.close)
        a = _sdk(me, stack, sdk_python)
        b = _sdk(me, stack, sdk_python, [a.addr()])
        row, cids = from_sdk(me, procs, a, b, data, threads, say)
        yield row
        p, publisher = procs.start()
        published = _call(me, publisher, "publish", size, SEED)
        yield from_lattica(me, procs, p, publisher, published["cid"], size, rounds, say)
        yield kad_lookups(me, procs, stack, sdk_python, lookups, keys, say)
        # B holds the leaves it fetched from A (else they are put there)
        local = me.run(b.get_blocks(cids, threads, timeout=60 + size / 1e6), timeout=90 + size / 1e6)
        kept = local["from"].get("local", 0)
        if kept < len(cids):
            _put_leaves(me, b, data)
        yield {**swarm(me, procs, p, publisher, [a, b], published, size, fetchers, say), "b_kept_leaves": kept}
