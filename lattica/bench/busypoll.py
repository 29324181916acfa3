"""``lattica bench busy-poll``: which node loop should be the default (issue 51), decided by
measurement. Each workload runs with the plain loop (0) and with the busy-poll window, side by
side and alternating, on a quiet machine, beside one busy process and beside two (a Python loop
spinning on a core: what a training job or another node does to ours on two cores).

Workloads, each between node processes on loopback over TCP:
- ``calls``: Table 1's 128 B echo, 1,000 in flight (calls/s, higher wins);
- ``call``: one call at a time (p50 µs, lower wins): where a busy poll pays off, if anywhere;
- ``sync-call``: the same to a sync actor, whose methods run on a thread of their own in the
  node's process: the node loop and the actor's thread share one interpreter lock, which a loop
  spinning in its poll holds the more often;
- ``stream``: one stream of ``stream_bytes`` (MB/s, higher wins);
- ``pubsub``: publish -> 4 subscribers, one message every 5 ms (p50 and p99 µs, lower wins).

A row per (load, workload, loop) with the median of ``runs``; then a verdict per (load,
workload) and the wins of each loop in all.
"""

from __future__ import annotations

import contextlib
import statistics
import subprocess
import sys
from collections.abc import Callable, Iterator
from typing import Any

__all__ = ["bench_busy_poll", "WORKLOADS"]

#: workload -> (its figure's name, whether higher wins)
WORKLOADS: dict[str, tuple[str, bool]] = {
    "calls": ("qps", True),
    "call": ("p50_us", False),
    "sync-call": ("p50_us", False),
    "stream": ("MB_per_s", True),
    "pubsub": ("p50_us", False),
}
_SPIN = "while True: pass"


@contextlib.contextmanager
def busy_processes(n: int) -> Iterator[None]:
    """``n`` processes spinning on the CPU while the block runs."""
    procs = [subprocess.Popen([sys.executable, "-c", _SPIN]) for _ in range(n)]
    try:
        yield
    finally:
        for p in procs:
            p.kill()
            p.wait()


def _measure(workload: str, busy_poll_us: float, duration: float, stream_bytes: int) -> dict[str, float]:
    """One run of ``workload`` with the given loop; its figures (the first is the verdict's)."""
    from lattica.bench.pubsub import bench_pubsub  # lazy: the benches' machinery, as every bench's
    from lattica.bench.rpc import bench_rpc  # lazy: as above
    from lattica.bench.transport import bench_stream  # lazy: as above

    if workload == "calls":
        r = bench_rpc(128, 1000, duration, "tcp", "async", busy_poll_us=busy_poll_us)
        return {"qps": r["qps"], "p99_us": r["p99_us"]}
    if workload in ("call", "sync-call"):
        kind = "sync" if workload == "sync-call" else "async"
        r = bench_rpc(128, 1, duration, "tcp", kind, busy_poll_us=busy_poll_us)
        return {"p50_us": r["p50_us"], "p99_us": r["p99_us"]}
    if workload == "stream":
        r = bench_stream("tcp", stream_bytes, busy_poll_us=busy_poll_us)
        return {"MB_per_s": r["MB_per_s"]}
    if workload == "pubsub":
        r = next(bench_pubsub(flood_messages=0, busy_poll_us=busy_poll_us))
        return {"p50_us": r["p50_us"], "p99_us": r["p99_us"]}
    raise ValueError(f"unknown workload {workload!r}: one of {', '.join(WORKLOADS)}")


def bench_busy_poll(
    polls: tuple[float, float],
    loads: tuple[int, ...] = (0, 1, 2),
    workloads: tuple[str, ...] = tuple(WORKLOADS),
    runs: int = 3,
    duration: float = 4.0,
    stream_bytes: int = 256 << 20,
    progress: Callable[[str], None] | None = None,
) -> Iterator[dict[str, Any]]:
    """Rows as the module docstring says; ``polls``: the two loops compared (µs; 0 is plain)."""
    wins = {p: 0 for p in polls}
    for load in loads:
        with busy_processes(load):
            for workload in workloads:
                figures: dict[float, list[dict[str, float]]] = {p: [] for p in polls}
                for i in range(runs):
                    for p in polls if i % 2 == 0 else tuple(reversed(polls)):  # (alternating: drift is shared)
                        figures[p].append(_measure(workload, p, duration, stream_bytes))
                        if progress:
                            progress(f"busy {load}, {workload}, loop {p:g} µs: run {i + 1} of {runs}")
                medians = {
                    p: {k: round(statistics.median(f[k] for f in fs), 1) for k in fs[0]} for p, fs in figures.items()
                }
                for p in polls:
                    yield {"bench": "busy-poll", "busy": load, "workload": workload, "busy_poll_us": p, **medians[p]}
                key, higher = WORKLOADS[workload]
                a, b = polls
                winner = a if (medians[a][key] >= medians[b][key]) == higher else b
                wins[winner] += 1
                loser = b if winner == a else a
                yield {
                    "bench": "busy-poll",
                    "busy": load,
                    "workload": workload,
                    "wins": f"{winner:g} us",
                    "by": f"{medians[winner][key]} against {medians[loser][key]} {key}",
                }
    yield {"bench": "busy-poll", "verdict": {f"{p:g} us": n for p, n in wins.items()}}
