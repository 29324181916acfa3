"""Pub-sub simulated with full nodes: N nodes (runtime, pub-sub service, real multiplexer and
RPC) on one event loop over the in-memory transport, one topic.

Node ``i`` connects to ``peers`` random earlier nodes (so the graph is connected and degrees are
around twice that); every node subscribes; after ``warmup`` seconds of heartbeats, random nodes
publish ``messages`` messages ``gap`` seconds apart (each leaves alone: nothing of its author's is on the
way), optionally a share of the nodes stops at once halfway through. Figures, from what each
node's subscription handler saw: delivery to every node alive at the end (counted once
deliveries have stopped for 20 s: one loop may be far behind), the hops of each node's first copy (followed through the ``via`` of each delivery back to the author), and the
copies each node received beyond the first, per message. Everything is real except the network
(instant, in memory) and the clock the nodes share (one loop: time stretches when it is busy).
"""

from __future__ import annotations

import asyncio
import gc
import random
import statistics
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from lattica._node import Node
from lattica.bench import host_of
from lattica.transports.memory import MemoryNetwork

if TYPE_CHECKING:
    from lattica.actors.pubsub import PubSubService

__all__ = ["simulate_nodes"]

TOPIC = "sim"


def simulate_nodes(
    nodes: int = 200,
    messages: int = 1000,
    *,
    peers: int = 6,
    gap: float = 0.005,
    kill: float = 0.0,
    warmup: float = 5.0,
    seed: int = 1,
    progress: Callable[[str], None] | None = None,
) -> dict[str, Any]:
    """One run on a fresh event loop (see the module docstring); its figures."""
    gc.collect()
    thresholds = gc.get_threshold()
    gc.set_threshold(200_000, 50, 1000)  # (N nodes' long-lived objects: see lattica.bench.dht)
    try:
        return asyncio.run(_simulate(nodes, messages, peers, gap, kill, warmup, seed, progress))
    finally:
        gc.set_threshold(*thresholds)


async def _simulate(
    n: int,
    messages: int,
    peers: int,
    gap: float,
    kill: float,
    warmup: float,
    seed: int,
    progress: Callable[[str], None] | None,
) -> dict[str, Any]:
    rng = random.Random(seed)
    net = MemoryNetwork()
    nodes: list[Node] = []
    try:
        return await _run(n, messages, peers, gap, kill, warmup, rng, net, nodes, progress)
    finally:
        for node in nodes:
            await node.astop()


async def _run(
    n: int,
    messages: int,
    peers: int,
    gap: float,
    kill: float,
    warmup: float,
    rng: random.Random,
    net: MemoryNetwork,
    nodes: list[Node],
    progress: Callable[[str], None] | None,
) -> dict[str, Any]:
    started = time.perf_counter()
    firsts: list[dict[int, Any]] = []  # per node: message (its data, k) -> the peer its first copy came from

    def recorder(book: dict) -> Callable[[Any], None]:
        def on_message(msg: Any) -> None:
            book.setdefault(msg.data, msg.via)

        return on_message

    for _ in range(n):
        node = Node(["/memory/0"], memory_network=net, max_connections=4096, membership=False, content=False)
        await node.astart()
        for other in rng.sample(nodes, min(peers, len(nodes))):
            await node.aconnect(other.addrs[0])
        nodes.append(node)
        firsts.append({})
        _pubsub(node).subscribe(TOPIC, handler=recorder(firsts[-1]))
    index = {node.peer_id.to_bytes(): i for i, node in enumerate(nodes)}
    await _meshed(nodes, warmup)
    if progress:
        progress(f"{n} nodes joined and meshed ({time.perf_counter() - started:.1f} s)")
    dead: set[int] = set()
    authors: list[int] = []  # of message k
    for k in range(messages):
        if kill and k == messages // 2:
            victims = rng.sample(range(n), int(n * kill))
            dead.update(victims)
            await asyncio.gather(*(nodes[v].astop() for v in victims))
        author = rng.choice([i for i in range(n) if i not in dead])
        _pubsub(nodes[author]).publish(TOPIC, k)
        authors.append(author)
        await asyncio.sleep(gap)
    published_at = time.monotonic()
    live = [i for i in range(n) if i not in dead]
    want = set(range(messages))
    # the loop may be far behind (one loop for every node): wait while deliveries go on, and
    # give up 20 s after the last one
    got = last = -1
    quiet_since = time.monotonic()
    while got < len(want) * len(live) and time.monotonic() - quiet_since < 20.0:
        got = sum(len(want & firsts[i].keys()) for i in live)
        if got != last:
            last, quiet_since = got, time.monotonic()
        await asyncio.sleep(0.5)
    settle_s = time.monotonic() - published_at if got == len(want) * len(live) else None
    hops: list[int] = []

    def hop(i: int, k: Any, depth: dict[int, int]) -> int | None:
        """Node ``i``'s hops from message ``k``'s author (``depth``: the hops known so far)."""
        chain = []
        while i not in depth:
            via = firsts[i].get(k)
            if via is None:
                return None
            chain.append(i)
            i = index[via.to_bytes()]
        d = depth[i]
        for j in reversed(chain):
            d += 1
            depth[j] = d
        return depth[chain[0]] if chain else depth[i]

    for k in want:
        depth = {authors[k]: 0}
        for i in live:
            if i != authors[k] and k in firsts[i]:
                h = hop(i, k, depth)
                if h is not None:
                    hops.append(h)
    hops.sort()
    extra = []
    for i in live:
        st = _pubsub(nodes[i]).stats()
        extra.append((st["copies"] - st["delivered"] + st["published"]) / max(len(want), 1))
    return {
        "bench": "pubsub-nodes",
        "nodes": n,
        "messages": len(want),
        "killed": len(dead),
        "delivery_pct": round(100.0 * got / max(len(want) * len(live), 1), 3),
        "hops_p50": hops[len(hops) // 2] if hops else None,
        "hops_p99": hops[int(len(hops) * 0.99)] if hops else None,
        "dup_per_node_msg": round(statistics.mean(extra), 2) if extra else None,
        "missing": len(want) * len(live) - got,
        "settle_s": round(settle_s, 1) if settle_s is not None else None,
        "wall_s": round(time.perf_counter() - started, 1),
    }


async def _meshed(nodes: list[Node], warmup: float, timeout: float = 30.0) -> None:
    """Heartbeats for ``warmup`` seconds (grafts, prunes and their backoffs settle), then until
    every node has a mesh."""
    await asyncio.sleep(warmup)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and any(not _pubsub(node).router.mesh.get(TOPIC) for node in nodes):
        await asyncio.sleep(0.5)


def _pubsub(node: Node) -> PubSubService:
    svc = host_of(node).services.pubsub
    assert svc is not None  # (the bench's nodes run pub-sub)
    return svc
