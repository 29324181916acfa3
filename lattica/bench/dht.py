"""``lattica bench dht``: DHT put/get latency between real processes, and the N-node simulation.

The simulation runs N full nodes (runtime, spawner and dht actors, real multiplexer) on one event
loop over the in-memory transport: nodes join one by one through a random earlier node, random
nodes put keys, other random nodes get them, then a fraction of the nodes stops at random and the
keys stored before are looked up again from the survivors.
"""

from __future__ import annotations

import asyncio
import gc
import random
import statistics
import time
from typing import Any

from lattica._loop import DEFAULT_BUSY_POLL_US
from lattica._node import Node
from lattica.actors.dht import DhtConfig
from lattica.bench import runtime_of
from lattica.bench.transport import LOOPBACK, pct
from lattica.mesh.process import ServerProcess
from lattica.transports.memory import MemoryNetwork


async def _simulate(n: int, keys: int, churn: float, seed: int, progress: Any, idle: float = 4.0) -> dict[str, Any]:
    rng = random.Random(seed)
    net = MemoryNetwork()
    # generous timeouts: 1,000 nodes share one loop, and a request queued behind a busy stretch
    # of it is slow, not lost (the simulation checks routing, not deadlines)
    cfg = dict(
        request_timeout=10.0,
        first_contact_timeout=10.0,
        lookup_timeout=60.0,
        refresh_interval=1e9,
        republish_interval=1e9,
        persist_interval=3600.0,
    )
    nodes: list[Node] = []
    try:
        return await _run(n, keys, churn, rng, net, cfg, nodes, progress, idle)
    finally:
        for node in nodes:  # a failed run stops its nodes too: none stays bound to this thread
            await node.astop()


async def _run(
    n: int,
    keys: int,
    churn: float,
    rng: random.Random,
    net: MemoryNetwork,
    cfg: dict[str, Any],
    nodes: list[Node],
    progress: Any,
    idle: float,
) -> dict[str, Any]:
    t0 = time.perf_counter()
    for i in range(n):
        # connections close once idle for a few seconds, as a connection manager would trim them:
        # a node talks to ~k log n peers while joining, and keeping all of them costs ~13 KiB each
        node = Node(
            ["/memory/0"],
            memory_network=net,
            max_connections=4096,
            idle_timeout=idle,
            channel_idle=idle / 2,
            dht=DhtConfig(**cfg),
            membership=False,
        )
        await node.astart()
        if nodes:
            seed_node = rng.choice(nodes)
            await node.aconnect(seed_node.addrs[0])
            await runtime_of(node).host.services.dht.bootstrap()
        nodes.append(node)
        if progress and (i + 1) % 100 == 0:
            progress(f"{i + 1} nodes joined ({time.perf_counter() - t0:.1f} s)")
    join_s = time.perf_counter() - t0

    def dht(node: Node) -> Any:
        return runtime_of(node).host.services.dht

    stored = []
    t1 = time.perf_counter()
    replicas = []
    for i in range(keys):
        writer = rng.choice(nodes)
        key = f"sim/key/{i}".encode()
        replicas.append(await dht(writer).put(key, f"value {i}".encode(), ttl=3600.0, republish=False))
        stored.append(key)
    put_s = time.perf_counter() - t1

    async def get_all(pool: list[Node]) -> tuple[int, list[int], list[int]]:
        found = 0
        rounds, first = [], []
        for i, key in enumerate(stored):
            reader = rng.choice(pool)
            svc = dht(reader)
            got = await svc.get(key)
            st = svc.stats[-1]
            rounds.append(st.rounds)
            if got and list(got.values())[0].value == f"value {i}".encode():
                found += 1
                first.append(st.found_round)
        return found, rounds, first

    t2 = time.perf_counter()
    found, rounds, first = await get_all(nodes)
    get_s = time.perf_counter() - t2
    victims = rng.sample(nodes, int(n * churn))
    for v in victims:
        await v.astop()
    alive = [x for x in nodes if x not in victims]
    found_after, rounds_after, first_after = await get_all(alive)
    return {
        "bench": "dht-sim",
        "nodes": n,
        "keys": keys,
        "join_s": round(join_s, 1),
        "replicas_median": statistics.median(replicas),
        "put_ms_mean": round(put_s / keys * 1e3, 2),
        "get_ms_mean": round(get_s / keys * 1e3, 2),
        "found": found,
        "rounds_median": statistics.median(rounds),
        "rounds_max": max(rounds),
        "found_round_median": statistics.median(first) if first else 0,
        "killed": len(victims),
        "found_after_churn": found_after,
        "found_after_churn_pct": round(100 * found_after / keys, 2),
        "rounds_after_churn_median": statistics.median(rounds_after),
    }


def simulate(n: int = 1000, keys: int = 200, churn: float = 0.2, seed: int = 1, progress: Any = None) -> dict[str, Any]:
    """Run the N-node simulation on a fresh event loop; returns its figures."""
    gc.collect()
    # N nodes' worth of long-lived objects in one process: with the default thresholds the
    # collector walks them over and over (a third of the run time at 1,000 nodes)
    thresholds = gc.get_threshold()
    gc.set_threshold(200_000, 50, 1000)
    try:
        return asyncio.run(_simulate(n, keys, churn, seed, progress))
    finally:
        gc.set_threshold(*thresholds)


def bench_dht(
    nodes: int = 2, count: int = 2000, transport: str = "tcp", busy_poll_us: float = DEFAULT_BUSY_POLL_US
) -> dict[str, Any]:
    """put and get latency from this process to a DHT of ``nodes`` processes (this one included).
    A put is acknowledged by every replica (here: all the nodes)."""
    # one client storing thousands of records a second is far beyond the default per-peer store
    # rate (200/s): the servers lift it, or the bench would measure refusals
    poll = ["--busy-poll-us", str(busy_poll_us), "--dht-rate", "1e6"]
    servers = [ServerProcess([LOOPBACK[transport]], *poll) for _ in range(nodes - 1)]
    for s in servers:
        s.__enter__()
    try:
        with Node([LOOPBACK[transport]], busy_poll_us=busy_poll_us) as node:
            for s in servers:
                node.connect(s.addr(transport))
            dht = runtime_of(node).host.services.dht

            async def run() -> tuple[list[float], list[float], list[int]]:
                await dht.bootstrap()
                puts, gets, acks = [], [], []
                clock = time.perf_counter
                for i in range(count + 100):
                    key = f"bench/{i % 200}".encode()
                    t0 = clock()
                    acks.append(await dht.put(key, b"\xa5value", ttl=60.0, republish=False))
                    t1 = clock()
                    rec = await dht.get(key)
                    t2 = clock()
                    assert rec, "a key just stored was not found"
                    if i >= 100:  # warm-up: connections, channels, caches
                        puts.append(t1 - t0)
                        gets.append(t2 - t1)
                return puts, gets, acks

            puts, gets, acks = node.run(run(), timeout=600)
    finally:
        for s in servers:
            s.__exit__(None, None, None)
    return {
        "bench": "dht",
        "transport": transport,
        "nodes": nodes,
        "busy_poll_us": busy_poll_us,
        "count": count,
        "replicas": statistics.median(acks),
        "replicas_min": min(acks),
        "put_p50_ms": round(pct([x * 1e3 for x in puts], 0.5), 3),
        "put_p99_ms": round(pct([x * 1e3 for x in puts], 0.99), 3),
        "get_p50_ms": round(pct([x * 1e3 for x in gets], 0.5), 3),
        "get_p99_ms": round(pct([x * 1e3 for x in gets], 0.99), 3),
    }
