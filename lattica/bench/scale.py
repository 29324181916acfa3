"""``lattica bench scale``: what a node pays as the mesh grows (issue 51, must-have 5).

Each service's own sans-IO state machines run in one process at growing sizes, as far as the
machine allows, and each cost is fitted to ``a * N ** b`` (or ``a + b log2 N``, whichever fits
better) so that it can be carried on paper to sizes no machine here holds. What runs, per service:

- **DHT**: N routing tables (``RoutingTable``, ``Lookup``: the code a node runs). Nodes join one
  by one through a random earlier node: a lookup of their own id, then one in every bucket from
  the nearest they hold (a node's bootstrap); every peer asked learns the asker, every answer
  enters the asker's table. Then random nodes look up random keys. Figures: lookup hops (the
  depth the closest peers were found at) and requests, table entries and memory per node, and the
  upkeep a node sends each second: one lookup per bucket every ``refresh_interval`` (600 s), each
  of that many requests, and as many answered (every request is someone's answer).
- **Pub-sub**: N GossipSub routers (``Router``) in one topic over simulated links
  (``lattica.bench.pubsub.simulate``): delivery, hops p99, duplicates per message, and the copies a
  node receives each second at the simulated rate.
- **Membership**: N ``Membership`` state machines on a simulated clock
  (``lattica.bench.membership.simulate``): every member keeps every other (the view is the whole
  mesh), so view memory grows with N; figures: messages a node sends each second, the view, the
  time until all know of a killed node.

Each size runs in a fresh process of its own. Memory is the services' own state divided by N, not
a node's (a node's fixed cost, ~40 MiB RSS, is measured by ``lattica bench startup``): what the
process's peak resident memory grew by during the run. CPU is the process's time per simulated
node-second where the simulation has a clock.
"""

from __future__ import annotations

import json
import math
import os
import random
import resource
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterable
from typing import Any

import msgpack

from lattica._identity import PeerId
from lattica.dht._kademlia import K, Lookup, RoutingTable

__all__ = ["dht_point", "pubsub_point", "membership_point", "fit", "fit_log", "growth", "bench_scale", "SIZES"]

# the sizes each service runs at by default: the most this machine does in minutes (a 1,000-router
# pub-sub run takes ~4 min, a 1,000-member membership run ~3; every member keeps every other)
SIZES = {"dht": (100, 1000, 3000, 10000), "pubsub": (100, 300, 1000), "membership": (100, 200, 400)}
REFRESH_INTERVAL = 600.0  # s: the DHT's default (DhtConfig.refresh_interval)
_ADDR = "/ip4/203.0.113.7/udp/4001/quic-v1"  # (an answer names each peer with addresses like these)


def _answer_bytes(peers: list[PeerId]) -> int:
    """Bytes of a FIND_NODE answer naming ``peers`` with two addresses each, as msgpack."""
    return len(msgpack.packb([[p.to_bytes(), [_ADDR, _ADDR.replace("udp", "tcp")]] for p in peers]))


def dht_point(n: int, lookups: int = 300, seed: int = 1, progress: Callable[[str], None] | None = None) -> dict:
    """One size of the DHT simulation (see the module docstring); its figures."""
    rng = random.Random(seed)
    now = [0.0]
    clock: Callable[[], float] = lambda: now[0]  # noqa: E731 -- (one simulated clock for every table)
    ids = [PeerId.from_public_key(rng.randbytes(32)) for _ in range(n)]
    base = _peak_rss()
    tables: dict[PeerId, RoutingTable] = {}
    asked = 0

    def run(lookup: Lookup, asker: PeerId) -> Lookup:
        nonlocal asked
        table = tables[asker]
        while not lookup.done:
            wave = lookup.next()
            if not wave:
                break
            for peer in wave:
                asked += 1
                theirs = tables[peer]
                theirs.seen(asker)  # (it called from an authenticated connection)
                lookup.answered(peer, theirs.closest(lookup.target, K, exclude=asker))
                table.seen(peer)
        table.touch(lookup.target)
        return lookup

    t0 = time.process_time()
    for i, me in enumerate(ids):
        table = tables[me] = RoutingTable(me, clock=clock)
        if i == 0:
            continue
        table.seen(ids[rng.randrange(i)])
        run(Lookup(table.local_id, table.closest(table.local_id), me), me)
        for b in table.stale_buckets(0.0):
            target = table.random_id(b, rng)
            run(Lookup(target, table.closest(target), me), me)
        now[0] += 0.001
        if progress and (i + 1) % 1000 == 0:
            progress(f"dht: {i + 1} of {n} nodes joined")
    join_cpu = time.process_time() - t0
    memory = _peak_rss() - base

    hops, requests = [], []
    t1 = time.process_time()
    for _ in range(lookups):
        me = rng.choice(ids)
        target = rng.getrandbits(256)
        before = asked
        lk = run(Lookup(target, tables[me].closest(target), me), me)
        hops.append(lk.rounds)
        requests.append(asked - before)
    lookup_cpu = (time.process_time() - t1) / lookups
    entries = [len(t) for t in tables.values()]
    buckets = statistics.median(len(t.stale_buckets(0.0)) for t in rng.sample(list(tables.values()), min(n, 200)))
    per_lookup = statistics.mean(requests)
    sent = buckets / REFRESH_INTERVAL * per_lookup * 2  # requests out and as many answers
    answer = _answer_bytes(ids[:K])
    request = len(msgpack.packb([1, os.urandom(32)]))
    return {
        "service": "dht",
        "nodes": n,
        "hops_median": statistics.median(hops),
        "hops_p99": sorted(hops)[int(len(hops) * 0.99)],
        "requests_per_lookup": round(per_lookup, 1),
        "table_entries": statistics.median(entries),
        "memory_bytes_per_node": round(memory / n),
        "upkeep_msgs_per_node_s": round(sent, 3),
        "upkeep_bytes_per_node_s": round(buckets / REFRESH_INTERVAL * per_lookup * (answer + request), 1),
        "join_cpu_ms": round(join_cpu / max(n - 1, 1) * 1e3, 2),
        "lookup_cpu_ms": round(lookup_cpu * 1e3, 3),
    }


def _peak_rss() -> int:
    """This process's peak resident memory so far, in bytes (Linux counts KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def fit(ns: Iterable[int], ys: Iterable[float]) -> tuple[float, float]:
    """``(a, b)`` of ``y = a * N ** b``, least squares in log-log (zeros left out)."""
    pts = [(math.log(n), math.log(y)) for n, y in zip(ns, ys) if y > 0]
    if len({x for x, _ in pts}) < 2:
        return (math.exp(pts[0][1]) if pts else 0.0, 0.0)
    b, log_a = statistics.linear_regression([x for x, _ in pts], [y for _, y in pts])
    return math.exp(log_a), b


def fit_log(ns: Iterable[int], ys: Iterable[float]) -> tuple[float, float]:
    """``(a, b)`` of ``y = a + b * log2(N)``, least squares."""
    pts = list(zip(ns, ys))
    if len({n for n, _ in pts}) < 2:
        return (statistics.mean(y for _, y in pts) if pts else 0.0, 0.0)
    b, a = statistics.linear_regression([math.log2(n) for n, _ in pts], [y for _, y in pts])
    return a, b


def growth(b: float) -> str:
    """How a cost ``a * N ** b`` grows, in words."""
    if b < 0.05:
        return "flat"
    if b < 0.85:
        return f"N^{b:.2f}"
    if b < 1.15:
        return "~N (linear)"
    return f"N^{b:.2f} (faster than N)"


def _extrapolated(points: list[dict], keys: Iterable[str], to: int) -> dict[str, Any]:
    """Per key, the model that fits the points better (``a * N^b``, or ``a + b log2 N`` where
    three points or more say so clearly), how that grows, and its value at ``to`` nodes."""
    ns = [p["nodes"] for p in points]
    out: dict[str, Any] = {}
    for key in keys:
        ys = [float(p[key]) for p in points]
        a, b = fit(ns, ys)
        la, lb = fit_log(ns, ys)
        power_err = sum((a * n**b - y) ** 2 for n, y in zip(ns, ys))
        log_err = sum((la + lb * math.log2(n) - y) ** 2 for n, y in zip(ns, ys))
        if len(ns) >= 3 and log_err < 0.5 * power_err and lb > 0 and b > 0.05:  # (two points fit both)
            out[key] = {"grows": f"~log N (+{lb:.3g} per doubling)", f"at_{to}": round(la + lb * math.log2(to), 3)}
        else:
            out[key] = {"grows": growth(b), "exponent": round(b, 2), f"at_{to}": round(a * to**b, 3)}
    return out


def bench_scale(
    services: Iterable[str] = ("dht", "pubsub", "membership"),
    sizes: dict[str, tuple[int, ...]] | None = None,
    extrapolate_to: int = 10_000,
    progress: Callable[[str], None] | None = None,
) -> Iterable[dict[str, Any]]:
    """A row per service and size, then a row per service with each cost's fit and its value
    at ``extrapolate_to`` nodes (see the module docstring)."""
    sizes = {**SIZES, **(sizes or {})}
    for service in services:
        points: list[dict] = []
        for n in sizes[service]:
            if progress:
                progress(f"{service}: {n} nodes")
            points.append(_in_child(service, n))
            yield {"bench": "scale", **points[-1]}
        keys = [k for k, v in points[0].items() if isinstance(v, (int, float)) and k != "nodes"]
        yield {"bench": "scale-fit", "service": service, **_extrapolated(points, keys, extrapolate_to)}


def _in_child(service: str, n: int) -> dict[str, Any]:
    """One point, run in a fresh process (its peak memory is the run's own)."""
    code = "import json, sys; from lattica.bench.scale import point; print(json.dumps(point(sys.argv[1], int(sys.argv[2]))))"
    out = subprocess.run([sys.executable, "-c", code, service, str(n)], capture_output=True, text=True, check=False)
    if out.returncode != 0:
        raise RuntimeError(f"the {service} simulation of {n} nodes failed: {out.stderr.strip()[-2000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def point(service: str, n: int) -> dict[str, Any]:
    """One size of one service's simulation, in this process."""
    if service == "dht":
        return dht_point(n)
    if service == "pubsub":
        return pubsub_point(n)
    if service == "membership":
        return membership_point(n)
    raise ValueError(f"unknown service {service!r}: dht, pubsub or membership")


def pubsub_point(n: int, rate: float = 20.0, seconds: float = 10.0) -> dict[str, Any]:
    """One size of the pub-sub simulation: ``rate`` messages a second into one topic of ``n``
    routers for ``seconds``; its figures, per node."""
    from lattica.bench.pubsub import simulate  # lazy: the router machinery, as every bench's

    base = _peak_rss()
    t0 = time.process_time()
    r = simulate(n, messages=int(rate * seconds), rate=rate, degree=min(20, n - 1), warmup=5.0)
    cpu = time.process_time() - t0
    memory = _peak_rss() - base
    copies = (r["dup_per_node_msg"] or 0.0) + 1.0
    return {
        "service": "pubsub",
        "nodes": n,
        "delivery_pct": r["delivery_pct"],
        "hops_p99": r["hops_p99"],
        "duplicates_per_msg": r["dup_per_node_msg"],
        "copies_per_node_s": round(copies * rate, 1),
        "peak_memory_bytes_per_node": round(memory / n),
        "cpu_ms_per_node_s": round(cpu / n / (seconds + 15.0) * 1e3, 3),  # (warm-up, publishing, 10 s after)
    }


def membership_point(n: int, settle: float = 15.0) -> dict[str, Any]:
    """One size of the membership simulation (the state machines on one simulated clock)."""
    from lattica.bench.membership import simulate  # lazy: as above

    base = _peak_rss()
    t0 = time.process_time()
    r = simulate(n, settle=settle, after=5.0)
    cpu = time.process_time() - t0
    memory = _peak_rss() - base
    return {
        "service": "membership",
        "nodes": n,
        "msgs_per_node_s": r["messages_per_node_s"],
        "view": r["view_sizes_median"],
        "peak_memory_bytes_per_node": round(memory / n),
        "cpu_ms_per_node_s": round(cpu / n / (settle + 5.0) * 1e3, 3),
    }
