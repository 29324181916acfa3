"""Pub-sub measured: by simulation (hundreds of routers in one process, one topic), and with real
node processes on loopback (``bench_pubsub``: latency and messages/s).

Every node runs a real ``lattica.pubsub._router.Router``; what the glue would do is simulated: a
batch from one router reaches another after the link's latency (nodes sit at random points of a
square and a link's latency is 2 ms plus up to 28 ms in proportion to their distance, so latencies
keep the triangle inequality, as the internet's roughly do; the router knows each link's round
trip, as the service measures it), every
message is accepted by validation, heartbeats run once a second at a random phase, and each node
starts connected to ``degree`` random others (as a DHT walk would give it). After a warm-up,
random nodes publish ``messages`` messages at ``rate`` per second; optionally a share of the nodes
is killed at once mid-run (their neighbours notice after 0-1 s). Figures: delivery to every live
subscriber, the hops of each first copy (p50/p99), duplicates received per node per message, and
optionally nodes that never forward (to see the scores prune them).
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import math
import random
import statistics
import time
from collections.abc import Callable, Hashable, Iterator
from typing import TYPE_CHECKING, Any, cast

import lattica
from lattica._loop import DEFAULT_BUSY_POLL_US
from lattica._runtime import current_runtime
from lattica.bench import runtime_of
from lattica.pubsub._router import ACCEPT, Envelope, GossipParams, Router

if TYPE_CHECKING:
    from lattica.actors.pubsub import PubSubService

__all__ = ["simulate", "bench_pubsub", "PubSubPeer"]

TOPIC = "sim"


def simulate(
    nodes: int = 200,
    messages: int = 1000,
    *,
    degree: int = 20,
    rate: float = 100.0,
    warmup: float = 10.0,
    kill: float = 0.0,
    silent: float = 0.0,
    seed: int = 1,
    params: GossipParams | None = None,
    progress: Callable[[str], None] | None = None,
) -> dict[str, Any]:
    """One run (see the module docstring); ``kill``: share of nodes killed halfway through the
    publishing; ``silent``: share of nodes that take messages and never forward any."""
    rng = random.Random(seed)
    started = time.perf_counter()
    routers = [Router(i, params, rng=random.Random(rng.random()), peer_bytes=_author) for i in range(nodes)]
    links: dict[tuple[int, int], float] = {}
    where = [(rng.random(), rng.random()) for _ in range(nodes)]
    for i in range(nodes):
        for j in rng.sample(range(nodes), degree):
            if i != j and (i, j) not in links:
                links[(i, j)] = links[(j, i)] = 0.002 + 0.028 * math.dist(where[i], where[j]) / math.sqrt(2)
    mute = set(rng.sample(range(nodes), int(nodes * silent)))
    dead: set[int] = set()
    events: list = []
    seq = itertools.count()
    hops: dict[tuple[int, bytes], int] = {}  # (node, message) -> hops of its first copy
    received = [0] * nodes  # message copies each node received
    published: list[tuple[bytes, float, int]] = []

    def at(t: float, kind: str, *args: Any) -> None:
        heapq.heappush(events, (t, next(seq), kind, args))

    def flush(i: int, now: float) -> None:
        r = routers[i]
        for msg, _peer in r.take_to_validate():
            r.validated(msg.id, ACCEPT, now)
        r.take_delivered()
        for peer, rpc in r.take_outgoing().items():
            if i in mute:
                rpc.messages = [m for m in rpc.messages if m.author == _author(i)]  # only its own
                rpc.ihave = []
                if not rpc:
                    continue
            at(now + links[(i, cast(int, peer))], "rpc", i, peer, rpc)  # (the simulation's peers are ints)

    for (i, j), latency in links.items():
        if i < j:
            routers[i].add_peer(j, 0.0, rtt=2 * latency)
            routers[j].add_peer(i, 0.0, rtt=2 * latency)
    for i in range(nodes):
        routers[i].join(TOPIC, 0.0)
        flush(i, 0.0)
        at(rng.random(), "beat", i)
    t0 = warmup
    for k in range(messages):
        at(t0 + k / rate, "publish", rng.randrange(nodes), k)
    end_publish = t0 + messages / rate
    if kill:
        at(t0 + messages / rate / 2, "kill")
    at(end_publish, "measure")
    meshed: dict[str, float] = {}
    horizon = end_publish + 10.0
    while events:
        now, _, kind, args = heapq.heappop(events)
        if now > horizon:
            break
        if kind == "rpc":
            src, dst, rpc = args
            if dst in dead or src in dead:
                continue
            for m in rpc.messages:
                received[dst] += 1
                key = (dst, m.id)
                if key not in hops:
                    hops[key] = hops.get((src, m.id), 0) + 1
            routers[dst].on_rpc(src, rpc, now)
            flush(dst, now)
        elif kind == "beat":
            (i,) = args
            if i in dead:
                continue
            routers[i].heartbeat(now)
            flush(i, now)
            at(now + 1.0, "beat", i)
        elif kind == "publish":
            i, k = args
            while i in dead:
                i = (i + 1) % nodes
            msg = Envelope(TOPIC, _author(i), k, b"x" * 128, flooded=routers[i].flood_set(TOPIC, now))
            hops[(i, msg.id)] = 0
            routers[i].publish(msg, now)
            published.append((msg.id, now, i))
            flush(i, now)
        elif kind == "kill":
            victims = rng.sample([n for n in range(nodes) if n not in dead], int(nodes * kill))
            dead.update(victims)
            for v in victims:
                for (a, b), _ in list(links.items()):
                    if a == v and b not in dead:
                        at(now + rng.random(), "gone", b, v)
        elif kind == "measure" and mute:  # while messages still flow: are the silent ones pruned?
            honest = [n for n in range(nodes) if n not in dead and n not in mute]
            meshes = [routers[n].mesh.get(TOPIC, set()) for n in honest]
            meshed["silent_in_meshes"] = sum(1 for m in meshes for q in m if q in mute)
            meshed["silent_in_meshes_expected"] = round(sum(len(m) for m in meshes) * len(mute) / max(nodes - 1, 1), 1)
        elif kind == "gone":
            i, v = args
            if i not in dead:
                routers[i].remove_peer(v, now)
                flush(i, now)
    live = [n for n in range(nodes) if n not in dead and n not in mute]  # (what silent nodes get is their own business)
    want = got = 0
    hop_list = []
    for mid, _t, author in published:
        for n in live:
            if n == author:
                continue
            want += 1
            h = hops.get((n, mid))
            if h is not None:
                got += 1
                hop_list.append(h)
    hop_list.sort()
    per_node = [received[n] / max(len(published), 1) for n in live]
    result = {
        "bench": "pubsub-sim",
        "nodes": nodes,
        "messages": len(published),
        "degree": degree,
        "killed": len(dead),
        "silent": len(mute),
        "delivery_pct": round(100.0 * got / max(want, 1), 3),
        "hops_p50": hop_list[len(hop_list) // 2] if hop_list else None,
        "hops_p99": hop_list[int(len(hop_list) * 0.99)] if hop_list else None,
        "dup_per_node_msg": round(statistics.mean(per_node) - got / max(want, 1), 2) if per_node else None,
        "wall_s": round(time.perf_counter() - started, 1),
    }
    result.update(meshed)
    if progress is not None:
        progress(str(result))
    return result


def _author(i: Hashable) -> bytes:
    return cast(int, i).to_bytes(4, "big")  # (the simulation's peer handles are ints)


# -- real processes ---------------------------------------------------------------------------------


@lattica.actor
class PubSubPeer:
    """Runs in a node process: subscribes, publishes, and reports what arrived when."""

    def __init__(self) -> None:
        self.sub: Any = None

    async def subscribe(self, topic: str, maxsize: int) -> None:
        self.sub = _pubsub().subscribe(topic, maxsize)

    async def mesh(self, topic: str) -> int:
        return len(_pubsub().peers(topic))

    async def publish(self, topic: str, n: int, size: int, gap: float) -> float:
        svc = _pubsub()
        pad = b"x" * size
        t0 = time.perf_counter()
        for i in range(n):
            await svc.publish_soon(topic, [time.time_ns(), i, pad])  # (what lattica.pubsub.publish runs)
            if gap:
                await asyncio.sleep(gap)
            elif i % 64 == 63:
                await asyncio.sleep(0)  # let the batches go out
        return time.perf_counter() - t0

    async def collect(self, n: int, timeout: float) -> dict:
        lat, first, last, got = [], None, None, 0

        async def read() -> None:
            nonlocal first, last, got
            async for msg in self.sub:  # (what a subscriber on the node loop writes)
                now = time.time_ns()
                lat.append((now - msg.data[0]) / 1e3)
                first = first if first is not None else now
                last = now
                got += 1
                if got >= n:
                    return

        try:
            await asyncio.wait_for(read(), timeout)
        except TimeoutError:
            pass
        return {
            "got": got,
            "latency_us": lat,
            "span_s": ((last or 0) - (first or 0)) / 1e9,
            "dropped": self.sub.dropped,
        }


def bench_pubsub(
    subscribers: int = 4,
    latency_messages: int = 200,
    flood_messages: int = 20_000,
    size: int = 128,
    busy_poll_us: float | None = None,
) -> Iterator[dict[str, Any]]:
    """``1 + subscribers`` node processes on loopback, all connected: publish -> every subscriber
    latency (one message every 5 ms), then (unless ``flood_messages`` is 0) messages/s of ``size``
    bytes delivered to each subscriber when the publisher sends as fast as it can. Every node
    runs the default loop unless ``busy_poll_us`` says otherwise."""
    # (the process machinery: only for this bench, not the simulation)
    from lattica.bench.rpc import call_all, process_mesh, spawn_on

    poll = DEFAULT_BUSY_POLL_US if busy_poll_us is None else busy_poll_us
    with lattica.Node([], busy_poll_us=poll) as me, process_mesh(me, subscribers + 1, poll) as procs:
        peers = [spawn_on(me, PubSubPeer, p.peer_id) for p in procs]
        rt = runtime_of(me)

        call_all(me, *((r, "subscribe", "bench", flood_messages + latency_messages) for r in peers))
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and min(call_all(me, *((r, "mesh", "bench") for r in peers))) < min(
            subscribers, 4
        ):
            time.sleep(0.2)
        subs = peers[1:]

        async def publish_and_collect(n: int, gap: float, timeout: float) -> tuple:
            waits = [rt.call(r, "collect", (n, timeout), {}, timeout=timeout + 30) for r in subs]
            await asyncio.sleep(0.2)  # (the collectors are waiting)
            sent = await rt.call(peers[0], "publish", ("bench", n, size, gap), {}, timeout=timeout + 30)
            return sent, await asyncio.gather(*waits)

        # latency
        _, got = me.run(publish_and_collect(latency_messages, 0.005, 60), timeout=120)
        lat = sorted(x for g in got for x in g["latency_us"])
        yield {
            "bench": "pubsub",
            "case": "latency",
            "processes": len(procs),
            "bytes": size,
            "delivered": f"{sum(g['got'] for g in got)}/{latency_messages * len(subs)}",
            "p50_us": round(lat[len(lat) // 2], 1) if lat else None,
            "p99_us": round(lat[int(len(lat) * 0.99)], 1) if lat else None,
            "p50_each_us": sorted(round(statistics.median(g["latency_us"])) for g in got if g["latency_us"]),
        }
        if not flood_messages:
            return
        # throughput
        sent_s, got = me.run(publish_and_collect(flood_messages, 0.0, 120), timeout=300)
        rates = [g["got"] / g["span_s"] if g["span_s"] else 0.0 for g in got]
        yield {
            "bench": "pubsub",
            "case": "flood",
            "processes": len(procs),
            "bytes": size,
            "messages": flood_messages,
            "publish_msgs_s": round(flood_messages / sent_s),
            "delivered_min": min(g["got"] for g in got),
            "per_subscriber_msgs_s_min": round(min(rates)),
            "per_subscriber_msgs_s_median": round(statistics.median(rates)),
        }


def _pubsub() -> PubSubService:
    svc = current_runtime().host.services.pubsub
    assert svc is not None  # (the bench's nodes run pub-sub)
    return svc
