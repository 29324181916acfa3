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

import json
import os
import signal
import time

import numpy as np

from .actor import actor
from .bench.server import ServerProcess
from .node import Node
from .runtime import current_actor


@actor
class Accumulator:
    """A worker with state worth keeping: the supervisor checkpoints it and restores it elsewhere."""

    def __init__(self) -> None:
        self.total = 0
        self.restored = False

    async def add(self, n: int) -> int:
        self.total += n
        return self.total

    async def status(self) -> dict:
        return {"total": self.total, "node": str(current_actor().peer_id), "restored": self.restored}

    async def checkpoint(self) -> int:
        return self.total

    def restore(self, state: int) -> None:
        self.total, self.restored = state, True


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
    with ServerProcess(["/ip4/127.0.0.1/tcp/0", "/ip4/127.0.0.1/udp/0/quic-v1"], "--allow", "lattica.demo.*") as a:
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
                print(f"  ping RTT           : p50 {rtts[500] * 1e6:.0f} µs, p99 {rtts[990] * 1e6:.0f} µs over 1000 pings")
        with Node(["/ip4/127.0.0.1/tcp/0"]) as b:
            _work(b, a.addr("tcp"))
            _dht(b, a.addr("tcp"))
    _supervision()
    print("\ndone.")


def _dht(b: Node, addr: str) -> None:
    from . import dht
    from .api import aget_actor

    print("\nthe DHT: B announces which layers it serves; a new node C finds that and A's shards by name")
    dht.bootstrap(node=b).result(10)
    n = dht.put("swarm/layers", {"start": 0, "end": 8}, subkey=b.peer_id, ttl=60, node=b).result(10)
    print(f"  B put swarm/layers (subkey = its PeerId, signed): {n} replicas acknowledged")
    with Node([]) as c:
        c.connect(addr)  # C knows only A
        dht.bootstrap(node=c).result(10)
        rec = dht.get("swarm/layers", node=c).result(10)
        for sk, v in (rec or {}).items():
            print(f"  C reads swarm/layers: {sk.short() if sk else sk} serves {v.value}, expires in {v.expiration - time.time():.0f} s")
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
        shards = [MatMulShard.options(node=info.peer_id, name=f"shard-{i}").remote(i, rows, cols) for i in range(2)]
        for s in shards:
            await s._spawn
        return shards

    shards = b.run(spawn(), timeout=30)
    w = np.concatenate([np.random.default_rng(i).standard_normal((rows, cols), dtype=np.float32) for i in range(2)], axis=1)
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
    print(f"  200 sharded forward passes ({batch}x{rows} @ {rows}x{2 * cols}): {dt * 1e3:.0f} ms, {mb / dt:.0f} MB/s of tensors, results correct: {ok}")

    async def stream_and_stats() -> tuple:
        toks = [t async for t in shards[0].tokens.stream(5)]
        return toks, await shards[0].stats.remote()

    toks, stats = b.run(stream_and_stats(), timeout=30)
    print(f"  streamed from shard-0: {', '.join(toks)}")
    print(f"  shard-0 stats: {stats}")
    print("  shards named on A:", ", ".join(s.name for s in shards))


def _supervision() -> None:
    from .supervisor import Supervisor

    print("\nsupervision: three more node processes; a supervisor on B places six stateful workers (1 cpu each, spread)")
    opts = ("--allow", "lattica.demo.*", "--resources", json.dumps({"cpu": 6}))
    with ServerProcess(["/ip4/127.0.0.1/tcp/0"], *opts) as p1, ServerProcess(["/ip4/127.0.0.1/tcp/0"], *opts) as p2, \
            ServerProcess(["/ip4/127.0.0.1/tcp/0"], *opts) as p3, Node(["/ip4/127.0.0.1/tcp/0"], resources={"cpu": 0}) as b:
        procs = [p1, p2, p3]
        label = {p.peer_id: f"P{i + 1}" for i, p in enumerate(procs)}
        for p in procs:
            b.connect(p.addr("tcp"))
        deadline = time.monotonic() + 15
        while not all("cpu" in m for m in b.nodes()) or len(b.nodes()) < 4:
            if time.monotonic() > deadline:
                raise RuntimeError("the demo mesh did not form")
            time.sleep(0.05)

        async def start() -> tuple:
            sup = Supervisor.remote(strategy="one_for_one", max_restarts=10, within=60)
            refs = [await sup.start_child.remote(Accumulator, id=f"acc-{i}", resources={"cpu": 1}, checkpoint_every=0.1)
                    for i in range(6)]
            for i, r in enumerate(refs):
                await r.add.remote(100 * (i + 1))
            return sup, refs

        sup, refs = b.run(start(), timeout=60)

        async def statuses() -> list:
            # idempotent: a call in flight when its worker's node died is sent again to the new one
            return [await r.status.options(idempotent=True).remote() for r in refs]

        def where() -> str:
            homes = [label.get(s["node"], "B") for s in b.run(statuses(), timeout=60)]
            return ", ".join(f"{n}: {homes.count(n)}" for n in sorted(set(homes)))

        print(f"  placed: {where()}  (their totals: {[s['total'] for s in b.run(statuses(), timeout=60)]})")
        time.sleep(0.3)  # a checkpoint of each is held by the supervisor
        for p, sig, what in ((p1, signal.SIGKILL, "SIGKILL"), (p2, signal.SIGSTOP, "SIGSTOP (a silent loss)")):
            there = [i for i, s in enumerate(b.run(statuses(), timeout=60)) if s["node"] == p.peer_id]
            t0 = time.monotonic()
            os.kill(p.pid, sig)
            back = b.run(statuses(), timeout=60)  # stable refs: these calls wait for the new incarnations
            took = time.monotonic() - t0
            moved = [i for i in there if back[i]["restored"] and back[i]["node"] != p.peer_id]
            print(f"  {what} to {label[p.peer_id]} (hosting {len(there)}): all six answering again after {took:.2f} s; now {where()}")
            print(f"    totals after the restarts: {[s['total'] for s in back]} ({len(moved)} of {len(there)} moved and restored from checkpoints)")
            if sig == signal.SIGSTOP:
                os.kill(p.pid, signal.SIGCONT)


if __name__ == "__main__":
    run()
