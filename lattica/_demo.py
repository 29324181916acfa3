"""``make demo``: nodes in two processes find each other, say who they are, ping, work, and meet
in the DHT.

The first node runs in a child process listening on TCP and QUIC; the second dials it on each
transport, prints what identify told it and how the connection was made, and measures RTT. Then it
spawns a sharded matrix-multiply actor on the first node, streams work to it and checks the results.
Then it publishes a record in the DHT, and a third node that knows only the first one reads it and
finds a shard by its name. Last, a supervisor places six stateful workers across three node
processes; one process is SIGKILLed and another frozen (SIGSTOP), and the supervisor brings their
workers back on the survivors with their checkpointed state, timed.
"""

from __future__ import annotations

import os
import signal
import time
from typing import cast

import numpy as np

from lattica import dht
from lattica._api import aget_actor
from lattica._node import Node
from lattica._remote import ActorClass, actor
from lattica.mesh.process import ServerProcess
from lattica.mesh.supervised import lose, statuses, supervised_mesh


@actor
class MatMulShard:
    """Holds one block of columns of a weight matrix; multiplies inputs by it (a model shard)."""

    def __init__(self, seed: int, rows: int, cols: int) -> None:
        self.w = np.random.default_rng(seed).standard_normal((rows, cols), dtype=np.float32)
        self.calls = 0

    def forward(self, x: np.ndarray) -> np.ndarray:  # sync: runs on the actor's own thread
        self.calls += 1
        return x @ self.w

    async def stats(self) -> dict:  # async: runs on the node loop
        return {"calls": self.calls, "shape": list(self.w.shape)}

    async def tokens(self, n: int):  # async generator: streamed back under credit
        for i in range(n):
            yield f"token-{i}"


def run() -> None:
    print("starting node A (child process) on TCP and QUIC ...")
    with ServerProcess(["/ip4/127.0.0.1/tcp/0", "/ip4/127.0.0.1/udp/0/quic-v1"], "--allow", "lattica._demo.*") as a:
        print(f"  A is {a.peer_id}")
        for addr in a.addrs:
            print(f"  A listens on {addr}")
        for transport in ("tcp", "quic"):
            with Node([]) as b:
                print(f"\nnode B {b.peer_id} dials A over {transport.upper()}")
                info = b.connect(a.addr(transport))
                print(f"  authenticated peer : {info.peer_id}  (matches A: {str(info.peer_id) == a.peer_id})")
                print(f"  connection         : {info.transport}, {info.direction}, to {info.remote_addr}")
                print(f"  A runs             : {info.agent_version} ({info.protocol_version})")
                print(f"  A serves           : {', '.join(info.protocols)}")
                print(f"  A sees B at        : {info.observed_addr}")
                rtts = sorted(b.ping_many(info.peer_id, 1000))
                print(
                    f"  ping RTT           : p50 {rtts[500] * 1e6:.0f} µs, p99 {rtts[990] * 1e6:.0f} µs over 1000 pings"
                )
        with Node(["/ip4/127.0.0.1/tcp/0"]) as b:
            _work(b, a.addr("tcp"))
            _dht(b, a.addr("tcp"))
    _supervision()
    _inference()
    print("\ndone.")


def _dht(b: Node, addr: str) -> None:
    print("\nthe DHT: B announces which layers it serves; a new node C finds that and A's shards by name")
    dht.bootstrap(node=b).result(10)
    n = dht.put("swarm/layers", {"start": 0, "end": 8}, subkey=b.peer_id, ttl=60, node=b).result(10)
    print(f"  B put swarm/layers (subkey = its PeerId, signed): {n} replicas acknowledged")
    with Node([]) as c:
        c.connect(addr)  # C knows only A
        dht.bootstrap(node=c).result(10)
        rec = dht.get("swarm/layers", node=c).result(10)
        for sk, v in (rec or {}).items():
            print(
                f"  C reads swarm/layers: {sk.short() if sk else sk} serves {v.value}, expires in {v.expiration - time.time():.0f} s"
            )
        ref = c.run(aget_actor("shard-0"), timeout=10)  # resolved through the DHT registry
        print(f"  C resolves 'shard-0' by name: {ref}, on A: {str(ref.peer_id) == str(c.peers()[0].peer_id)}")
        print(f"  C calls it: stats {c.run(_stats(ref), timeout=10)}")


async def _stats(ref: object) -> dict:
    return await ref.stats.remote()  # type: ignore[attr-defined]


def _work(b: Node, addr: str) -> None:
    info = b.connect(addr)
    print(f"\nnode B spawns two MatMulShard actors on A ({info.peer_id.short()}) and runs a sharded matmul")
    rows, cols, batch = 512, 256, 64

    async def spawn() -> list:
        shard_class = cast(ActorClass, MatMulShard)  # what @actor made of it (mypy keeps the plain class)
        shards = [shard_class.options(node=info.peer_id, name=f"shard-{i}").remote(i, rows, cols) for i in range(2)]
        for s in shards:
            await s._spawn
        return shards

    shards = b.run(spawn(), timeout=30)
    w = np.concatenate(
        [np.random.default_rng(i).standard_normal((rows, cols), dtype=np.float32) for i in range(2)], axis=1
    )
    x = np.random.default_rng(7).standard_normal((batch, rows), dtype=np.float32)

    async def forward(n: int) -> list:
        outs = []
        for _ in range(n):
            parts = [s.forward.remote(x) for s in shards]  # both shards work in parallel
            outs.append(np.concatenate([await p for p in parts], axis=1))
        return outs

    t0 = time.perf_counter()
    outs = b.run(forward(200), timeout=120)
    dt = time.perf_counter() - t0
    ok = all(np.allclose(o, x @ w, rtol=1e-4, atol=1e-3) for o in outs)
    mb = 200 * 2 * (x.nbytes + batch * cols * 4) / 1e6
    print(
        f"  200 sharded forward passes ({batch}x{rows} @ {rows}x{2 * cols}): {dt * 1e3:.0f} ms, {mb / dt:.0f} MB/s of tensors, results correct: {ok}"
    )

    async def stream_and_stats() -> tuple:
        toks = [t async for t in shards[0].tokens.stream(5)]
        return toks, await shards[0].stats.remote()

    toks, stats = b.run(stream_and_stats(), timeout=30)
    print(f"  streamed from shard-0: {', '.join(toks)}")
    print(f"  shard-0 stats: {stats}")
    print("  shards named on A:", ", ".join(s.name for s in shards))


def _inference() -> None:
    from lattica.mesh.inference import TinyLM, generate, pipeline  # (this part of the demo only)

    print(
        "\nsharded inference: a tiny transformer in 4 pipeline stages, each served twice on 4 node processes (registered as shards);"
    )
    print(
        "  this node generates through the first stage's stub, each stage forwards to the next; a stage node is SIGKILLed mid-way"
    )
    prompt, n = [1, 2, 3, 4], 32
    reference = TinyLM(0).generate(prompt, n)
    with pipeline(processes=4, stages=4) as (node, procs, hosts):
        r = generate(node, prompt, n, kill=procs[1], kill_at=12, say=print)
    print(f"  tokens: {r['tokens']}")
    print(
        f"  same tokens as the model in one process: {r['tokens'] == reference}; {r['tokens_s']:.0f} tokens/s; "
        f"failover pause {r['pause_ms']:.0f} ms"
    )


def _supervision() -> None:
    print(
        "\nsupervision: three more node processes; a supervisor on a fourth places six stateful workers (1 cpu each, spread)"
    )
    with supervised_mesh(6) as (here, procs, sup, refs):
        label = {p.peer_id: f"P{i + 1}" for i, p in enumerate(procs)}

        def where(sts: list) -> str:
            homes = [label[s["node"]] for s in sts]
            return ", ".join(f"{n}: {homes.count(n)}" for n in sorted(set(homes)))

        sts = statuses(here, refs)
        print(f"  placed: {where(sts)}  (their state: {[s['total'] for s in sts]}, checkpointed every 0.1 s)")
        for p, sig, what in (
            (procs[0], signal.SIGKILL, "SIGKILL"),
            (procs[1], signal.SIGSTOP, "SIGSTOP (a silent loss)"),
        ):
            try:
                r = lose(here, p, sig, sup, refs)
            finally:
                if sig == signal.SIGSTOP:
                    os.kill(p.pid, signal.SIGCONT)
            print(
                f"  {what} to {label[p.peer_id]} (hosting {r['hosted']}): known down after {r['verdict_s']:.2f} s, "
                f"restarted elsewhere after {r['restarted_s']:.2f} s, all six answering after {r['answering_s']:.2f} s"
            )
            print(
                f"    now {where(r['statuses'])}; state {[s['total'] for s in r['statuses']]} "
                f"({r['moved']} of {r['hosted']} moved and restored from checkpoints)"
            )


if __name__ == "__main__":
    run()
