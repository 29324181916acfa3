"""The CRDT store measured (docs/benchmarks.md): convergence by simulation, and latency and
throughput between real node processes on loopback.

``simulate_crdt``: ``replicas`` full nodes (runtime, pub-sub, CRDT service, real multiplexer and
RPC) on one event loop over the in-memory transport, each connected to ``links`` random earlier
ones, all holding one mesh document. Each run cuts the network into two or three random sides
``partitions`` times; while cut, random replicas make random concurrent edits (map sets and
deletes, text inserts, array appends); then the network heals, the links come back (as
membership's redial brings them back on a real network) and the clock runs until every replica
holds the same document (equal state vectors and content). Figures: the time from the last heal
to convergence per run (p50/max), and runs that had not converged after ``limit`` seconds.

``bench_crdt``: three node processes, all connected, one document: a map set made on one is
visible at the others after (p50/p99), then sets/s applied at each other replica when the first
writes as fast as it can (every envelope verified: signature, chain, client ids, deps).

``bench_compaction``: one replica's rules (no network) over a log of ``envelopes`` small changes
by three writers: the log's bytes against the checkpoint state's, the time to propose and to check
a checkpoint (the merge of the whole log), and a newcomer's catch-up by replaying the log (every
signature verified) against taking the checkpoint.
"""

from __future__ import annotations

import asyncio
import gc
import random
import time
from collections.abc import Callable, Iterator
from typing import Any

import lattica
from lattica._node import Node
from lattica.bench import host_of, runtime_of
from lattica.config import CrdtConfig, PubSubConfig
from lattica.transports.memory import MemoryNetwork

__all__ = ["simulate_crdt", "bench_crdt", "bench_compaction", "CrdtPeer"]

DOC = "bench/doc"


def simulate_crdt(
    replicas: int = 20,
    runs: int = 100,
    *,
    partitions: int = 3,
    edits: int = 40,
    links: int = 4,
    limit: float = 30.0,
    seed: int = 1,
    compact_every: int = 0,
    progress: Callable[[str], None] | None = None,
) -> dict[str, Any]:
    """``runs`` runs, each on a fresh event loop (see the module docstring); the figures.
    ``compact_every``: replicas checkpoint their logs that often (0: never), partitions or not."""
    times: list[float] = []
    diverged = 0
    started = time.perf_counter()
    applied = refused = taken = 0
    for run in range(runs):
        gc.collect()
        t, a, r, c = asyncio.run(
            _one_run(replicas, partitions, edits, links, limit, random.Random(seed * 1_000_003 + run), compact_every)
        )
        applied += a
        refused += r
        taken += c
        if t is None:
            diverged += 1
        else:
            times.append(t)
        if progress is not None:
            progress(
                f"run {run + 1}/{runs}: " + ("diverged" if t is None else f"converged {t * 1000:.0f} ms after the heal")
            )
    times.sort()
    return {
        "bench": "crdt-sim",
        "replicas": replicas,
        "runs": runs,
        "partitions_per_run": partitions,
        "edits_per_partition": edits,
        "converged": len(times),
        "diverged": diverged,
        "converge_ms_p50": round(times[len(times) // 2] * 1000) if times else None,
        "converge_ms_max": round(times[-1] * 1000) if times else None,
        "envelopes_applied": applied,
        "refused": refused,
        "compact_every": compact_every,
        "checkpoints_taken": taken,
        "wall_s": round(time.perf_counter() - started, 1),
    }


async def _one_run(
    n: int, partitions: int, edits: int, links: int, limit: float, rng: random.Random, compact_every: int = 0
) -> tuple[float | None, int, int, int]:
    net = MemoryNetwork()
    nodes: list[Node] = []
    edges: list[tuple[int, int]] = []
    try:
        cfg = CrdtConfig(path="memory", sync_interval=2.0, compact_every=compact_every)
        for i in range(n):
            node = Node(
                ["/memory/0"],
                memory_network=net,
                mesh="open",
                max_connections=4096,
                membership=False,
                content=False,
                pubsub=PubSubConfig(discover=False),
                crdt=cfg,
            )
            await node.astart()
            for j in rng.sample(range(i), min(links, i)):
                await node.aconnect(nodes[j].addrs[0])
                edges.append((i, j))
            nodes.append(node)
        reps = []
        for node in nodes:
            crdt = host_of(node).services.crdt
            assert crdt is not None  # (the bench's nodes run the CRDT store)
            reps.append(await crdt.open(DOC))
        await _until(lambda: all(r.peers() for r in reps), 10.0)
        for _ in range(partitions):
            order = list(range(n))
            rng.shuffle(order)
            k = rng.choice((2, 3))
            sides = [set(nodes[i].peer_id for i in order[s::k]) for s in range(k)]
            net.partition(sides)
            for e in range(edits):
                _edit(rng, rng.choice(reps), e)
                if rng.random() < 0.3:
                    await asyncio.sleep(0.005)
            await asyncio.sleep(rng.uniform(0.05, 0.3))
            net.heal()
            await asyncio.gather(*(_redial(nodes[i], nodes[j]) for i, j in edges))
        healed = time.monotonic()
        ok = await _until(lambda: _same(reps), limit)
        took = time.monotonic() - healed if ok else None
        return took, sum(r.applied for r in reps), sum(r.refused for r in reps), sum(r.checkpoints_taken for r in reps)
    finally:
        for node in nodes:
            await node.astop()


def _edit(rng: random.Random, rep: Any, e: int) -> None:
    op = rng.random()
    if op < 0.5:
        rep.root("m", "map")[str(rng.randrange(30))] = e
    elif op < 0.65:
        m = rep.root("m", "map")
        if len(m):
            del m[rng.choice(list(m.keys()))]
    elif op < 0.85:
        t = rep.root("t", "text")
        t.insert(rng.randrange(len(t) + 1), rng.choice("abcdef"))
    else:
        rep.root("a", "array").append(e)


def _same(reps: list[Any]) -> bool:
    from lattica.crdt._yupdate import read_state_vector  # (lazy, like every import of the benchmark's helpers)

    first = read_state_vector(reps[0].ydoc.get_state())  # (as a dict: yrs writes its entries in any order)
    if any(read_state_vector(r.ydoc.get_state()) != first or r.state.held() for r in reps[1:]):
        return False
    content = reps[0].to_py()
    return all(r.to_py() == content for r in reps[1:])


async def _redial(a: Node, b: Node) -> None:
    try:
        await a.aconnect(b.addrs[0])
    except lattica.errors.LatticaError:
        pass


async def _until(pred: Callable[[], bool], limit: float) -> bool:
    deadline = time.monotonic() + limit
    while not pred():
        if time.monotonic() > deadline:
            return False
        await asyncio.sleep(0.02)
    return True


# -- compaction, sans-IO ---------------------------------------------------------------------------


def bench_compaction(envelopes: int = 10_000, writers: int = 3) -> dict[str, Any]:
    """See the module docstring."""
    import os  # (nonces; only this bench)

    import pycrdt  # (this bench only: the simulation and the process bench do not load it here)

    from lattica._identity import KeyPair  # (likewise)
    from lattica.crdt._envelope import GENESIS, client_id, doc_id, sign  # (likewise)
    from lattica.crdt._replica import ReplicaState  # (likewise)
    from lattica.crdt._yupdate import read_update  # (likewise)

    doc = doc_id(DOC, None)
    rng = random.Random(1)
    ws: list[list[Any]] = []  # per writer: [keys, nonce, ydoc, seq, prev]
    for _ in range(writers):
        keys, nonce = KeyPair.generate(), os.urandom(8)
        ydoc: pycrdt.Doc[Any] = pycrdt.Doc(client_id=client_id(doc, keys.peer_id.to_bytes(), nonce))
        ws.append([keys, nonce, ydoc, 0, GENESIS])
    log: list = []
    for i in range(envelopes):
        w = ws[i % writers]
        keys, nonce, ydoc, seq, prev = w
        got: list[bytes] = []
        sub = ydoc.observe(lambda e: got.append(e.update))  # noqa: B023 (unobserved within the iteration)
        with ydoc.transaction():
            ydoc.get("m", type=pycrdt.Map)[str(rng.randrange(200))] = i
        ydoc.unobserve(sub)
        client = ydoc.client_id
        deps = {c: k for c, k in read_update(got[0]).needs.items() if c != client}
        env = sign(keys, doc, nonce, seq + 1, prev, deps, got[0])
        w[3], w[4] = seq + 1, env.id
        log.append(env)
        for other in ws:
            if other is not w:
                other[2].apply_update(got[0])
    t0 = time.perf_counter()
    holder = ReplicaState(doc, None)
    holder.receive(log)
    replay = time.perf_counter() - t0
    t0 = time.perf_counter()
    made = holder.propose([])
    assert made is not None
    cp, state = made
    propose = time.perf_counter() - t0
    checker = ReplicaState(doc, None)
    checker.receive(log, verified=True)
    t0 = time.perf_counter()
    why, _ = checker.check(cp, [])
    check = time.perf_counter() - t0
    t0 = time.perf_counter()
    newcomer = ReplicaState(doc, None)
    why2, _ = newcomer.adopt(cp, state)
    ydoc = pycrdt.Doc()
    ydoc.apply_update(state)
    adopt = time.perf_counter() - t0
    return {
        "bench": "crdt",
        "case": "compaction",
        "envelopes": envelopes,
        "writers": writers,
        "log_bytes": sum(e.size for e in log),
        "state_bytes": len(state),
        "checked": why == "" and why2 == "",
        "propose_ms": round(propose * 1000, 1),
        "check_ms": round(check * 1000, 1),
        "newcomer_replay_ms": round(replay * 1000),
        "newcomer_from_checkpoint_ms": round(adopt * 1000, 1),
    }


# -- real processes ---------------------------------------------------------------------------------


@lattica.actor
class CrdtPeer:
    """Runs in a node process: opens the document, writes to it, and reports what arrived when."""

    def __init__(self) -> None:
        self.doc: Any = None
        self.seen: list[tuple[int, int, int]] = []  # (arrival ns, write ns, sets in the change)

    async def open(self) -> None:
        self.doc = await lattica.crdt.open(DOC, block=False)
        from lattica.crdt._yupdate import read_update  # (in the node process, when the actor opens the document)

        def on_change(change: Any) -> None:
            if change.local:
                return
            now = time.time_ns()
            span = read_update(change.update).structs
            sets = sum(e - s for s, e in span.values())
            last = self.doc.map("bench").get("t")
            self.seen.append((now, int(last[0]) if last else now, sets))

        self.doc.observe(on_change)

    async def peers(self) -> int:
        return len(self.doc.peers())

    async def write(self, n: int, gap: float, each: bool = False) -> float:
        """``n`` map sets, ``gap`` s apart (0: as fast as it can); ``each``: a turn of the loop
        after every set, so each leaves in an envelope of its own (else a turn's sets share one)."""
        m = self.doc.map("bench")
        t0 = time.perf_counter()
        for i in range(n):
            m["t"] = [time.time_ns(), i]
            if gap:
                await asyncio.sleep(gap)
            elif each or i % 256 == 255:
                await asyncio.sleep(0)  # (the envelopes go out)
        return time.perf_counter() - t0

    async def collect(self, n: int, timeout: float) -> dict:
        deadline = time.monotonic() + timeout
        while sum(s for _, _, s in self.seen) < n and time.monotonic() < deadline:
            await asyncio.sleep(0.01)
        seen, self.seen = self.seen, []
        return {
            "sets": sum(s for _, _, s in seen),
            "envelopes": len(seen),
            "latency_us": [(a - w) / 1e3 for a, w, _ in seen],
            "span_s": (seen[-1][0] - seen[0][0]) / 1e9 if len(seen) > 1 else 0.0,
            "refused": self.doc.stats()["refused"],
        }


def bench_crdt(latency_updates: int = 200, flood_updates: int = 20_000) -> Iterator[dict[str, Any]]:
    """Three node processes on loopback (see the module docstring)."""
    import os  # (only for the processes' environment)

    from lattica.bench.rpc import call_all, process_mesh, spawn_on  # (the process machinery: only for this bench)

    before = os.environ.get("LATTICA_CRDT")
    os.environ["LATTICA_CRDT"] = "memory"  # (the node processes start with no document: nothing of an earlier run)
    try:
        with lattica.Node([]) as me, process_mesh(me, 3) as procs:
            peers = [spawn_on(me, CrdtPeer, p.peer_id) for p in procs]
            rt = runtime_of(me)

            call_all(me, *((r, "open") for r in peers))
            deadline = time.monotonic() + 20
            while time.monotonic() < deadline and min(call_all(me, *((r, "peers") for r in peers))) < 2:
                time.sleep(0.1)

            async def write_and_collect(n: int, gap: float, timeout: float, each: bool = False) -> tuple:
                waits = [rt.call(r, "collect", (n, timeout), {}, timeout=timeout + 30) for r in peers[1:]]
                await asyncio.sleep(0.2)
                took = await rt.call(peers[0], "write", (n, gap, each), {}, timeout=timeout + 30)
                return took, await asyncio.gather(*waits)

            _, got = me.run(write_and_collect(latency_updates, 0.005, 60), timeout=120)
            lat = sorted(x for g in got for x in g["latency_us"])
            yield {
                "bench": "crdt",
                "case": "latency",
                "processes": 3,
                "updates": latency_updates,
                "seen": f"{sum(g['sets'] for g in got)}/{latency_updates * 2}",
                "p50_us": round(lat[len(lat) // 2], 1) if lat else None,
                "p99_us": round(lat[int(len(lat) * 0.99)], 1) if lat else None,
            }
            took, got = me.run(write_and_collect(flood_updates, 0.0, 120), timeout=300)
            rates = [g["sets"] / g["span_s"] if g["span_s"] else 0.0 for g in got]
            yield {
                "bench": "crdt",
                "case": "flood",
                "processes": 3,
                "updates": flood_updates,
                "write_sets_s": round(flood_updates / took),
                "applied_min": min(g["sets"] for g in got),
                "applied_sets_s_per_replica": [round(r) for r in rates],
                "envelopes_s_per_replica": [round(g["envelopes"] / g["span_s"]) if g["span_s"] else 0 for g in got],
                "refused": sum(g["refused"] for g in got),
            }
            n = flood_updates // 4
            took, got = me.run(write_and_collect(n, 0.0, 120, each=True), timeout=300)
            yield {
                "bench": "crdt",
                "case": "one envelope per set",
                "processes": 3,
                "updates": n,
                "write_sets_s": round(n / took),
                "applied_min": min(g["sets"] for g in got),
                "applied_envelopes_s_per_replica": [
                    round(g["envelopes"] / g["span_s"]) if g["span_s"] else 0 for g in got
                ],
                "refused": sum(g["refused"] for g in got),
            }
    finally:
        if before is None:
            os.environ.pop("LATTICA_CRDT", None)
        else:
            os.environ["LATTICA_CRDT"] = before
