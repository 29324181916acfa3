"""RL weight sync across clusters on a local mesh (issue 21; docs/shards.md): a trainer publishes
each new policy as a safetensors object by CID and announces its version on pub-sub; supervised
rollout workers on node processes (grouped into clusters) fetch it by CID, swarming among
themselves (every block verified against its CID), swap it in between rollouts and send their
trajectories back to the trainer. A worker that fell behind (frozen, restarted elsewhere) goes
straight to the newest version. Used by examples/rl_weight_sync.py, the tests and ``lattica bench
weightsync``.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import time
from collections.abc import Callable, Iterator
from typing import Any, cast

import numpy as np

from lattica import codec
from lattica._node import Node
from lattica._remote import ActorClass, actor
from lattica._runtime import ActorRef
from lattica.mesh.process import ServerProcess

__all__ = ["Trainer", "PolicyWorker", "fleet", "sync_versions", "TOPIC"]

TOPIC = "rl/policy"
TCP = "/ip4/127.0.0.1/tcp/0"
OBS, ACTIONS = 16, 4  # the policy's first OBS x ACTIONS weights act; the rest is the model's bulk
CHUNK = 256 << 10  # a policy's blocks: workers fetching it together need many pieces to trade


@actor
class Trainer:
    """The trainer's book-keeping: the newest version and its CID, who runs which version since
    when, and the trajectories that came back."""

    def __init__(self) -> None:
        self.version, self.cid = 0, ""
        self.announced: dict[int, float] = {}
        self.running: dict[str, tuple[int, float]] = {}  # worker -> (version, since)
        self.samples: dict[int, int] = {}  # version -> steps of trajectories collected under it

    async def announce(self, version: int, cid: str) -> None:
        self.version, self.cid = version, cid
        self.announced[version] = time.time()

    async def latest(self) -> list:
        return [self.version, self.cid]

    async def ran(self, worker: str, version: int) -> None:
        if self.running.get(worker, (0,))[0] < version:
            self.running[worker] = (version, time.time())

    async def submit(self, worker: str, version: int, steps: int, reward: float) -> None:
        self.samples[version] = self.samples.get(version, 0) + steps

    async def status(self) -> dict:
        return {
            "version": self.version,
            "running": {w: v for w, (v, _) in self.running.items()},
            "since": {w: t for w, (_, t) in self.running.items()},
            "announced": dict(self.announced),
            "samples": dict(self.samples),
        }


@actor
class PolicyWorker:
    """Runs rollouts with the newest policy it holds; follows the trainer's announcements."""

    def __init__(self, trainer: ActorRef, name: str, cluster: str) -> None:
        self.trainer, self.name, self.cluster = trainer, name, cluster
        self.version, self.weights = 0, np.zeros(OBS * ACTIONS, dtype=np.float32)
        self.wanted: tuple[int, str] = (0, "")
        self.fetching: asyncio.Task | None = None
        self.rolling: asyncio.Task | None = None
        self.rng = np.random.default_rng(abs(hash(name)) % (1 << 32))

    async def on_start(self) -> None:
        import lattica.pubsub  # (in the worker's node process, when it starts)

        lattica.pubsub.subscribe(TOPIC, handler=self._announced)
        self._want(*(await self.trainer.latest.remote()))  # (a worker started late, or restarted, begins at the newest)
        self.rolling = asyncio.get_running_loop().create_task(self._rollouts())

    async def on_stop(self) -> None:
        for task in (self.rolling, self.fetching):
            if task is not None:
                task.cancel()

    def _announced(self, msg: Any) -> None:
        try:
            version, cid = codec.decode(msg.data)
        except Exception:  # noqa: BLE001 -- not an announcement of ours: ignored
            return
        if type(version) is int and type(cid) is str:
            self._want(version, cid)

    def _want(self, version: int, cid: str) -> None:
        if version > self.wanted[0]:
            self.wanted = (version, cid)
            if self.fetching is None or self.fetching.done():
                self.fetching = asyncio.get_running_loop().create_task(self._fetch())

    async def _fetch(self) -> None:
        import lattica.content  # (likewise)

        while self.wanted[0] > self.version:
            version, cid = self.wanted  # (the newest announced: versions in between are skipped)
            try:
                arrays = await lattica.content.get_weights(cid)
            except Exception:  # noqa: BLE001 -- tried again at the next announcement or check
                await asyncio.sleep(0.5)
                continue
            policy = arrays.get("policy")
            if policy is None or policy.dtype != np.float32 or policy.size < OBS * ACTIONS:
                return  # (not a policy: keep the one we run)
            self.weights, self.version = np.array(policy[: OBS * ACTIONS]), version  # (swapped between rollouts)
            await self.trainer.ran.remote(self.name, version)

    async def _rollouts(self) -> None:
        while True:
            steps, reward = 0, 0.0
            for _ in range(32):
                obs = self.rng.standard_normal(OBS).astype(np.float32)
                action = int(np.argmax(obs @ self.weights.reshape(OBS, ACTIONS)))
                reward += float(obs[action])
                steps += 1
            try:
                await self.trainer.submit.remote(self.name, self.version, steps, reward / steps)
            except Exception:  # noqa: BLE001 -- the trainer is away: the rollout is dropped
                pass
            await asyncio.sleep(0.02)

    async def status(self) -> dict:
        return {"version": self.version, "pid": os.getpid(), "cluster": self.cluster}

    async def time_fetch(self, cid: str) -> float:
        """Seconds to fetch ``cid`` alone (the reference the fleet's sync is compared with)."""
        import lattica.content  # (likewise)

        t0 = time.perf_counter()
        await lattica.content.get_weights(cid)
        return time.perf_counter() - t0


@contextlib.contextmanager
def fleet(
    workers: int = 6, clusters: int = 3, spare: int = 1
) -> Iterator[tuple[Node, list[ServerProcess], Any, list, ActorRef]]:
    """``workers + spare`` node processes (1 cpu each), a trainer node here, a supervisor here
    placing one PolicyWorker per process (cluster ``i % clusters``); a spare process takes a
    worker whose process dies. Yields (node, processes, supervisor, worker refs, trainer)."""
    import lattica  # (the user API: Supervisor, get)

    opts = ("--resources", json.dumps({"cpu": 1}))
    with contextlib.ExitStack() as stack:
        procs = [stack.enter_context(ServerProcess([TCP], *opts)) for _ in range(workers + spare)]
        lattica.shutdown()  # (this process's node is the trainer's, made here)
        me = lattica.init([TCP], bootstrap=[p.addr("tcp") for p in procs], resources={"cpu": 0})
        stack.callback(lattica.shutdown)
        deadline = time.monotonic() + 20
        while not (len(me.nodes()) == len(procs) + 1 and all("cpu" in r for r in me.nodes())):
            if time.monotonic() > deadline:
                raise RuntimeError(f"the mesh did not form: {me.nodes()}")
            time.sleep(0.05)
        trainer = cast(ActorClass, Trainer).remote()  # (``@actor`` made it an ActorClass; mypy keeps the class)
        sup = lattica.Supervisor.remote(strategy="one_for_one", max_restarts=20, within=60)
        refs = lattica.get(
            [
                sup.start_child.remote(
                    PolicyWorker,
                    args=(trainer, f"w{i}", f"cluster-{i % clusters}"),
                    id=f"w{i}",
                    resources={"cpu": 1},
                    placement="spread",
                )
                for i in range(workers)
            ]
        )
        yield me, procs, sup, refs, trainer


def sync_versions(
    me: Node,
    trainer: ActorRef,
    workers: int,
    versions: int,
    size: int,
    *,
    timeout: float = 120.0,
    chunk_size: int = CHUNK,
    between: Callable[[int], None] | None = None,
    say: Callable[[str], None] | None = None,
) -> list[dict]:
    """Publish ``versions`` policies of ``size`` bytes and wait for every worker to run each:
    per version, the seconds from the announcement until all ``workers`` ran it, and the bytes
    this node (the trainer's) uploaded meanwhile. ``between(v)`` runs before version ``v``."""
    import lattica  # (the user API)

    host = me.host
    assert host is not None  # (a started node)
    content = host.services.content
    assert content is not None  # (weights travel through the content plane: it runs with content on)
    rows = []
    start = lattica.get(trainer.latest.remote())[0]
    for v in range(start + 1, start + versions + 1):
        if between is not None:
            between(v)
        rng = np.random.default_rng(v)
        policy = rng.standard_normal(size // 4).astype(np.float32)
        cid = lattica.content.put_weights(
            {"policy": policy}, metadata={"version": str(v)}, chunk_size=chunk_size, node=me
        ).result(60)
        served = content.served_bytes
        lattica.get(trainer.announce.remote(v, cid))
        t0 = time.time()
        lattica.pubsub.publish(TOPIC, codec.encode_bytes([v, cid]), node=me).result(10)
        deadline = time.monotonic() + timeout
        while True:
            st = lattica.get(trainer.status.remote())
            done = [w for w, ver in st["running"].items() if ver >= v]
            if len(done) >= workers:
                break
            if time.monotonic() > deadline:
                raise TimeoutError(f"version {v}: {len(done)} of {workers} workers run it after {timeout} s")
            time.sleep(0.01)
        took = max(st["since"][w] for w in done) - t0
        row = {
            "version": v,
            "all_running_s": round(took, 3),
            "each_s": dict(sorted(((w, round(st["since"][w] - t0, 3)) for w in done), key=lambda x: x[1])),
            "uploaded_bytes": content.served_bytes - served,
            "uploaded_x": round((content.served_bytes - served) / size, 2),
            "cid": cid,
        }
        rows.append(row)
        if say:
            say(
                f"v{v}: every worker runs it {took * 1000:.0f} ms after the announcement; the trainer uploaded "
                f"{row['uploaded_x']:.2f}x the policy ({size / 2**20:.0f} MiB)"
            )
    return rows
