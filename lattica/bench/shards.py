"""``lattica bench shards``: what a shard stub costs, and how long a call stalls when a provider
dies (docs/benchmarks.md).

Three node processes on loopback; two of them run an echo actor registered as providers of one
shard. ``overhead``: calls one after another from a driver node, straight to one provider's ref
against through the stub (which picks, counts and measures), p50/p99 and calls/s; then 64 calls in
flight. ``failover``: the driver calls through the stub back to back while one provider is
SIGKILLed (its sockets close: calls to it fail at once) or SIGSTOPped (it hangs: calls to it time
out after the stub's per-attempt ``timeout``); the figure is the longest gap between two answers,
the stall a caller sees, and the calls that failed (none should).

``bench_inference``: the sharded-inference pipeline (lattica/mesh/inference.py: 4 stages x 2
replicas on 4 processes) against the same model in one process: tokens/s, and the pause when a
stage node is SIGKILLed mid-generation (the longest token less the median), over fresh pipelines.
"""

from __future__ import annotations

import asyncio
import os
import signal
import time
from collections.abc import Iterator
from typing import Any

from lattica._node import Node
from lattica._remote import actor
from lattica.bench.rpc import spawn_on
from lattica.bench.transport import pct
from lattica.mesh.process import ServerProcess

__all__ = ["bench_shards", "bench_inference", "ShardEcho"]

TCP = "/ip4/127.0.0.1/tcp/0"


@actor
class ShardEcho:
    async def echo(self, x: Any) -> Any:
        return x


def bench_shards(calls: int = 2000, rounds: int = 3, attempt_timeout: float = 0.25) -> Iterator[dict[str, Any]]:
    """See the module docstring."""
    import lattica.shards as shards  # (this bench only)

    with _mesh() as (node, procs, refs):
        stub = shards.stub("bench", "echo", node=node)
        direct = _sequential(node, lambda i: refs[0].echo.remote(i), calls)
        via = _sequential(node, lambda i: stub.echo.remote(i), calls)
        for case, lat in (("direct", direct), ("stub", via)):
            us = [x * 1e6 for x in lat]
            yield {
                "bench": "shards",
                "case": f"sequential, {case}",
                "calls": calls,
                "p50_us": round(pct(us, 0.5), 1),
                "p99_us": round(pct(us, 0.99), 1),
                "calls_s": round(len(lat) / sum(lat)),
            }
        for case, fn in (("direct", lambda i: refs[0].echo.remote(i)), ("stub", lambda i: stub.echo.remote(i))):
            hedged = stub.hedged
            took = _concurrent(node, fn, calls * 4, 64)
            yield {
                "bench": "shards",
                "case": f"64 in flight, {case}",
                "calls": calls * 4,
                "calls_s": round(calls * 4 / took),
                **({"hedged": stub.hedged - hedged} if case == "stub" else {}),
            }
    for how in ("SIGKILL", "SIGSTOP"):
        stalls, failed = [], 0
        for _ in range(rounds):
            with _mesh() as (node, procs, refs):
                stub = shards.stub("bench", "echo", timeout=attempt_timeout, node=node)
                stall, bad = _failover(node, stub, procs[0], signal.SIGKILL if how == "SIGKILL" else signal.SIGSTOP)
                stalls.append(stall)
                failed += bad
        stalls.sort()
        yield {
            "bench": "shards",
            "case": f"failover, provider {how}",
            "rounds": rounds,
            "attempt_timeout_s": attempt_timeout if how == "SIGSTOP" else None,
            "stall_ms_p50": round(stalls[len(stalls) // 2] * 1000, 1),
            "stall_ms_max": round(stalls[-1] * 1000, 1),
            "failed_calls": failed,
        }


class _mesh:
    """Three node processes and a driver; echo providers on the first two."""

    def __enter__(self) -> tuple[Node, list[ServerProcess], list[Any]]:
        import lattica.shards as shards  # (this bench only)

        self.procs = [ServerProcess([TCP]).__enter__() for _ in range(3)]
        self.node = Node([TCP]).start()
        for p in self.procs:
            self.node.connect(p.addr("tcp"))
        refs = [spawn_on(self.node, ShardEcho, self.procs[i].peer_id) for i in range(2)]
        for r in refs:
            shards.serve(r, "bench", "echo", node=self.node).result(10)
        deadline = time.monotonic() + 10
        while len(shards.providers("bench", "echo", node=self.node).result(10)) < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        return self.node, self.procs, refs

    def __exit__(self, *exc: object) -> None:
        self.node.stop()
        for p in self.procs:
            if p.proc is not None and p.proc.poll() is None:
                os.kill(p.pid, signal.SIGCONT)
                p.__exit__(None, None, None)


def _sequential(node: Node, call: Any, n: int) -> list[float]:
    async def go() -> list[float]:
        for i in range(50):
            await call(i)
        out = []
        for i in range(n):
            t0 = time.perf_counter()
            await call(i)
            out.append(time.perf_counter() - t0)
        return out

    return node.run(go(), timeout=120)


def _concurrent(node: Node, call: Any, n: int, width: int) -> float:
    async def go() -> float:
        left = [n]

        async def worker() -> None:
            while left[0] > 0:
                left[0] -= 1
                await call(left[0])

        t0 = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(width)))
        return time.perf_counter() - t0

    return node.run(go(), timeout=120)


def _failover(node: Node, stub: Any, victim: ServerProcess, sig: int) -> tuple[float, int]:
    """Calls back to back for 1.5 s, the signal at 0.5 s: the longest gap between answers."""

    async def go() -> tuple[float, int]:
        answers: list[float] = []
        failed = 0
        t0 = time.perf_counter()
        sent = False
        while time.perf_counter() - t0 < 1.5:
            if not sent and time.perf_counter() - t0 >= 0.5:
                os.kill(victim.pid, sig)
                sent = True
            try:
                await stub.echo.remote(1)
                answers.append(time.perf_counter())
            except Exception:  # noqa: BLE001 -- counted: the figure is how many failed
                failed += 1
        gaps = [b - a for a, b in zip(answers, answers[1:])]
        return (max(gaps) if gaps else float("inf")), failed

    return node.run(go(), timeout=60)


def bench_inference(tokens: int = 48, rounds: int = 3) -> Iterator[dict[str, Any]]:
    """See the module docstring."""
    from lattica.mesh.inference import TinyLM, generate, pipeline  # (this bench only)

    prompt = [1, 2, 3, 4]
    model = TinyLM(0)
    t0 = time.perf_counter()
    reference = model.generate(prompt, tokens)
    local = tokens / (time.perf_counter() - t0)
    rates, pauses, same = [], [], 0
    for r in range(rounds):
        with pipeline(processes=4, stages=4) as (node, procs, hosts):
            steady = generate(node, prompt, tokens)
            out = generate(node, prompt, tokens, kill=procs[1 + r % 3], kill_at=tokens // 2)
        rates.append(steady["tokens_s"])
        pauses.append(out["pause_ms"])
        same += steady["tokens"] == reference and out["tokens"] == reference
    pauses.sort()
    yield {
        "bench": "shards",
        "case": "sharded inference",
        "tokens": tokens,
        "stages": 4,
        "replicas": 2,
        "processes": 4,
        "one_process_tokens_s": round(local),
        "pipeline_tokens_s": round(sorted(rates)[len(rates) // 2]),
        "failover_pause_ms_p50": round(pauses[len(pauses) // 2]),
        "failover_pause_ms_max": round(pauses[-1]),
        "same_tokens": f"{same}/{rounds}",
    }
