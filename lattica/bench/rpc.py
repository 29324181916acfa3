"""``lattica bench rpc``: the paper's Table 1 — echo calls to an actor in another process.

The server process allows ``lattica.bench.*``; the client spawns an echo actor there (async or
sync), then keeps ``concurrency`` calls in flight for ``duration`` seconds and reports completed
calls per second, failures, and latency percentiles.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import os
import time
from collections.abc import Iterator
from typing import Any

from lattica._loop import DEFAULT_BUSY_POLL_US
from lattica._node import Node
from lattica._remote import actor
from lattica.bench import runtime_of
from lattica.bench.transport import pct, plain_tcp_echo, server
from lattica.mesh.process import ServerProcess

PLAIN_ECHO_FROM = 64 * 1024  # payloads this big get a plain TCP echo's figure beside them (--link)


@actor
class AsyncEcho:
    async def echo(self, payload: Any) -> Any:
        return payload


@actor
class SyncEcho:
    def echo(self, payload: Any) -> Any:
        return payload


def bench_rpc(
    payload: int = 128,
    concurrency: int = 1000,
    duration: float = 10.0,
    transport: str = "tcp",
    kind: str = "async",
    warmup: float = 1.0,
    busy_poll_us: float = DEFAULT_BUSY_POLL_US,
    link: str | None = None,
) -> dict[str, Any]:
    """Table 1: ``concurrency`` echo calls of ``payload`` bytes in flight to an actor in another
    process, on loopback or across an emulated ``link`` (lattica.bench.linkem). Across a link,
    payloads of PLAIN_ECHO_FROM bytes or more also report what a plain TCP echo carries over the
    same link, in calls of that size per second (``plain_tcp_echo_calls_s``)."""
    cls = AsyncEcho if kind == "async" else SyncEcho
    data = os.urandom(payload)
    poll = ["--busy-poll-us", str(busy_poll_us)]
    baseline = None
    with server(transport, *poll, link=link) as (srv, lk), Node([], busy_poll_us=busy_poll_us) as node:
        info = node.connect(srv.addr(transport))
        ref = spawn_on(node, cls, info.peer_id)
        errors: collections.Counter = collections.Counter()
        done, failed, lat, elapsed = measure_calls(node, ref, data, concurrency, duration, warmup, errors)
        if lk is not None and payload >= PLAIN_ECHO_FROM:
            baseline = round(plain_tcp_echo(lk, min(duration, 8.0)) * 1e6 / payload)
    us = [x * 1e6 for x in lat] or [0.0]
    return {
        "bench": "rpc",
        "transport": transport,
        **({"link": link} if link else {}),
        "actor": kind,
        "payload": payload,
        "concurrency": concurrency,
        "busy_poll_us": busy_poll_us,
        "seconds": round(elapsed, 2),
        "calls": done,
        "qps": round(done / elapsed),
        "failed": failed,
        "p50_us": round(pct(us, 0.5), 1),
        "p99_us": round(pct(us, 0.99), 1),
        **({"errors": dict(errors.most_common(3))} if errors else {}),
        **({"plain_tcp_echo_calls_s": baseline} if baseline is not None else {}),
    }


def measure_calls(
    node: Node,
    ref: Any,
    data: bytes,
    concurrency: int,
    duration: float,
    warmup: float,
    errors: collections.Counter | None = None,
) -> tuple[int, int, list[float], float]:
    """``concurrency`` workers calling ``ref.echo(data)`` back to back: (calls, failed, latencies, s);
    ``errors`` counts the failures by exception type and message."""

    async def drive() -> tuple[int, int, list[float], float]:
        latencies: list[float] = []
        failed = 0
        done = 0
        stop_at = 0.0
        measuring = False

        async def worker() -> None:
            nonlocal failed, done
            clock = time.perf_counter
            while True:
                t0 = clock()
                if t0 >= stop_at:
                    return
                try:
                    await ref.echo.remote(data)
                except Exception as e:
                    failed += measuring
                    if measuring and errors is not None:
                        errors[f"{type(e).__name__}: {str(e)[:160]}"] += 1
                    continue
                if measuring:
                    latencies.append(clock() - t0)
                    done += 1

        stop_at = time.perf_counter() + warmup
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        measuring = True
        start = time.perf_counter()
        stop_at = start + duration
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        return done, failed, latencies, time.perf_counter() - start

    return node.run(drive(), timeout=duration + warmup + 120)


def spawn_on(node: Node, cls: Any, peer: Any) -> Any:
    """Spawn ``cls`` on ``peer`` through ``node`` (not the process default node)."""

    async def spawn() -> Any:
        ref = cls.options(node=peer).remote()
        await ref._spawn
        return ref

    return node.run(spawn(), timeout=30)


@contextlib.contextmanager
def process_mesh(node: Node, n: int, busy_poll_us: float = DEFAULT_BUSY_POLL_US) -> Iterator[list[ServerProcess]]:
    """``n`` node processes on loopback, each connected to those started before it, and ``node``
    connected to all of them."""
    procs: list[ServerProcess] = []
    try:
        addrs: list[str] = []
        for _ in range(n):
            p = ServerProcess(
                ["/ip4/127.0.0.1/tcp/0"],
                "--busy-poll-us",
                str(busy_poll_us),
                *(x for a in addrs for x in ("--connect", a)),
            )
            p.__enter__()
            procs.append(p)
            addrs.append(p.addr("tcp"))
            node.connect(addrs[-1])
        yield procs
    finally:
        for p in reversed(procs):
            p.__exit__(None, None, None)


def call_all(node: Node, *calls: tuple, timeout: float = 300) -> list:
    """Make ``(ref, method, *args)`` calls at once through ``node``; their results, in order."""
    rt = runtime_of(node)

    async def go() -> list:
        return await asyncio.gather(*(rt.call(c[0], c[1], c[2:], {}, timeout=timeout) for c in calls))

    return node.run(go(), timeout=timeout + 5)
