"""The content plane, measured: one provider to one fetcher, a swarm of fetchers, many small
blocks, and publishing (chunk + hash + store) against sha2-256's own speed.

Every node is its own process on loopback (``lattica.mesh.process``) with its own blockstore
directory; a fetch is timed inside the fetching process from the call to the last block stored
(every block hashed against its CID and written to the blockstore: end to end).
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import shutil
import statistics
import tempfile
import time
from collections.abc import Iterator
from typing import Any

import numpy as np

import lattica
from lattica._runtime import current_runtime
from lattica.bench.rpc import spawn_on
from lattica.bench.transport import bench_stream
from lattica.content._cid import Cid
from lattica.mesh.process import ServerProcess

_TCP = "/ip4/127.0.0.1/tcp/0"
MiB = 1 << 20


def _content() -> Any:
    return current_runtime().host.services.content


@lattica.actor
class Publisher:
    """Runs in the providing process: makes and publishes objects, reports what it served."""

    async def publish(self, size: int, chunk: int, seed: int) -> dict:
        data = _pseudo_random(size, seed)
        t0 = time.perf_counter()
        root = await _content().put(data, chunk, True)
        return {"cid": str(root), "seconds": time.perf_counter() - t0}

    async def served(self) -> int:
        return _content().served_bytes


@lattica.actor
class Fetcher:
    """Runs in a fetching process: fetches into its blockstore, timed."""

    async def fetch(self, cid: str) -> dict:
        svc = _content()
        t0 = time.perf_counter()
        await svc.fetch(Cid.parse(cid))
        return {
            "seconds": time.perf_counter() - t0,
            "served": svc.served_bytes,
            "peers": {
                str(p): [s.bytes, s.blocks, s.duplicates, s.asked, s.failures] for p, s in svc.last_stats.items()
            },
        }


def _pseudo_random(size: int, seed: int) -> bytes:
    """Incompressible bytes that two processes can make alike from ``seed`` (no two chunks share
    a CID: every block is really fetched)."""
    return np.random.default_rng(seed).bytes(size)


class _Procs:
    """Node processes, each with its own blockstore directory (removed at the end)."""

    def __init__(self) -> None:
        self.dirs: list[str] = []
        self.procs: list[ServerProcess] = []

    def start(self, connect: list[str] | None = None) -> ServerProcess:
        d = tempfile.mkdtemp(prefix="lattica-bench-blocks-")
        self.dirs.append(d)
        extra: list[str] = []
        for addr in connect or []:
            extra += ["--connect", addr]
        proc = ServerProcess([_TCP], *extra, env={**os.environ, "LATTICA_BLOCKS": d})
        proc.__enter__()
        self.procs.append(proc)
        return proc

    def close(self) -> None:
        for p in reversed(self.procs):
            p.__exit__(None, None, None)
        for d in self.dirs:
            shutil.rmtree(d, ignore_errors=True)


def _spawn(node: lattica.Node, cls: Any, where: str) -> Any:
    return spawn_on(node, cls, where)


def _call(node: lattica.Node, ref: Any, method: str, *args: Any, timeout: float = 600) -> Any:
    async def go() -> Any:
        return await getattr(ref, method).remote(*args)

    return node.run(go(), timeout=timeout)


def bench_content(
    size: int = 256 * MiB, fetchers: int = 8, small: int = 10_000, rounds: int = 3
) -> Iterator[dict[str, Any]]:
    """The four figures of docs/benchmarks.md (content plane), each the median of ``rounds``
    where it is cheap enough (the swarm runs once); rows as they are measured."""
    data = os.urandom(64 * MiB)
    t0 = time.perf_counter()
    hashlib.sha256(data).digest()
    sha_mb_s = len(data) / (time.perf_counter() - t0) / 1e6
    procs = _Procs()
    try:
        with lattica.Node([]) as me:
            pub = procs.start()
            me.connect(pub.addr("tcp"))
            publisher = _spawn(me, Publisher, pub.peer_id)
            # publish: chunk + hash + store, in the publishing process
            pubs = [_call(me, publisher, "publish", size, MiB, 100 + r) for r in range(rounds)]
            yield (
                {
                    "bench": "content",
                    "case": "publish",
                    "mib": size // MiB,
                    "mb_s": round(size / statistics.median(p["seconds"] for p in pubs) / 1e6, 1),
                    "sha256_mb_s": round(sha_mb_s, 1),
                }
            )
            # one provider -> one fetcher (a fresh fetcher process, empty blockstore, each round),
            # each round beside one encrypted stream of the same bytes between two fresh processes
            # (the yardstick). A fetcher first fetches a small object: a process's first
            # fetch loads the content modules, a cost paid once, not per MiB.
            warm = _call(me, publisher, "publish", 2 * MiB, MiB, 1)["cid"]
            speeds, streams = [], []
            for p in pubs:
                streams.append(bench_stream("tcp", size)["MB_per_s"])
                fp = procs.start([pub.addr("tcp")])
                me.connect(fp.addr("tcp"))
                fetcher = _spawn(me, Fetcher, fp.peer_id)
                _call(me, fetcher, "fetch", warm)
                got = _call(me, fetcher, "fetch", p["cid"])
                speeds.append(size / got["seconds"] / 1e6)
            yield (
                {
                    "bench": "content",
                    "case": "1->1",
                    "mib": size // MiB,
                    "mb_s": round(statistics.median(speeds), 1),
                    "min": round(min(speeds), 1),
                    "max": round(max(speeds), 1),
                    "stream_mb_s": round(statistics.median(streams), 1),
                    "of_stream": round(statistics.median(a / b for a, b in zip(speeds, streams)), 3),
                }
            )
            # a swarm: one publisher, ``fetchers`` fetchers starting together
            swarm_cid = _call(me, publisher, "publish", size, MiB, 999)["cid"]
            refs = []
            for _ in range(fetchers):
                fp = procs.start([pub.addr("tcp")])
                me.connect(fp.addr("tcp"))
                refs.append(_spawn(me, Fetcher, fp.peer_id))
                _call(me, refs[-1], "fetch", warm)
            before = _call(me, publisher, "served")

            async def all_fetch() -> list:
                return await asyncio.gather(*(r.fetch.remote(swarm_cid) for r in refs))

            t0 = time.perf_counter()
            results = me.run(all_fetch(), timeout=1800)
            total = time.perf_counter() - t0
            uploaded = _call(me, publisher, "served") - before
            one = size / statistics.median(speeds) / 1e6
            yield (
                {
                    "bench": "content",
                    "case": f"swarm 1->{fetchers}",
                    "mib": size // MiB,
                    "all_done_s": round(total, 2),
                    "slowest_s": round(max(r["seconds"] for r in results), 2),
                    "one_fetch_s": round(one, 2),
                    "publisher_uploaded_x": round(uploaded / size, 2),
                }
            )
            # many small blocks (one object of 4 KiB chunks) from two providers
            pub2 = procs.start([pub.addr("tcp")])
            me.connect(pub2.addr("tcp"))
            publisher2 = _spawn(me, Publisher, pub2.peer_id)
            small_cid = _call(me, publisher, "publish", small * 4096, 4096, 7)["cid"]
            assert (
                _call(me, publisher2, "publish", small * 4096, 4096, 7)["cid"] == small_cid
            )  # the same object on both
            fp = procs.start([pub.addr("tcp"), pub2.addr("tcp")])
            me.connect(fp.addr("tcp"))
            fetcher = _spawn(me, Fetcher, fp.peer_id)
            got = _call(me, fetcher, "fetch", small_cid)
            yield (
                {
                    "bench": "content",
                    "case": f"{small} x 4 KiB, 2 providers",
                    "blocks_s": round(small / got["seconds"], 1),
                    "mb_s": round(small * 4096 / got["seconds"] / 1e6, 1),
                }
            )
    finally:
        procs.close()
