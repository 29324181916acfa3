"""The dashboard's costs (``lattica bench dashboard``): one picture of a real local mesh (node
processes running a supervisor's children), from the request to the JSON, and what it weighs;
a simulated picture of 200 nodes with 5,000 actors: checking every report as a member's
(``clean_report``) and encoding it once for all live channels; Table 1's 128 B run against a
node serving its dashboard to three watchers (live channels, one with an actor's panel open)
beside the same run against a node without one, alternated in one run; and the memory an
actor's output ring and utilisation series hold. (The page's draw of the simulated picture in
headless Chromium is timed by tests/integration/test_dashboard_browser.py.)"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time
import urllib.request
from typing import Any

from lattica.actors.dashboard.clean import clean_member, clean_report
from lattica.mesh.supervised import supervised_mesh

__all__ = ["bench_dashboard", "bench_dashboard_cost", "bench_buffers", "WATCHERS"]

WATCHERS = 3  # pages watching the node under load


def bench_dashboard(rounds: int = 20, cost_seconds: float = 5.0, cost_rounds: int = 3) -> list[dict[str, Any]]:
    rows = _pictures(rounds)
    rows.append(bench_dashboard_cost(cost_seconds, cost_rounds))
    rows.append(bench_buffers())
    return rows


def _pictures(rounds: int) -> list[dict[str, Any]]:
    rows = []
    with supervised_mesh(children=6, processes=3, dashboard="127.0.0.1:0") as (here, procs, sup, refs):
        assert here.dashboard_url is not None  # (started with a dashboard)
        url = here.dashboard_url + "api/mesh"
        times, size = [], 0
        for _ in range(rounds):
            t0 = time.perf_counter()
            with urllib.request.urlopen(url, timeout=30) as r:
                size = len(r.read())
            times.append(time.perf_counter() - t0)
        rows.append(
            {
                "bench": "dashboard",
                "case": "picture, 4 nodes, 6 children",
                "p50_ms": round(statistics.median(times) * 1000, 2),
                "max_ms": round(max(times) * 1000, 2),
                "bytes": size,
            }
        )
    pic = _simulated(200, 25)
    t0 = time.perf_counter()
    nodes = []
    for n in pic["nodes"]:
        row = clean_member(n) or {}
        row["report"] = clean_report(n["report"])
        nodes.append(row)
    checked = time.perf_counter() - t0
    t0 = time.perf_counter()
    data = json.dumps({"nodes": nodes, "events": []}, separators=(",", ":"), allow_nan=False).encode()
    encoded = time.perf_counter() - t0
    rows.append(
        {
            "bench": "dashboard",
            "case": "picture, 200 nodes, 5000 actors (simulated)",
            "check_ms": round(checked * 1000, 1),
            "encode_ms": round(encoded * 1000, 1),
            "bytes": len(data),
        }
    )
    return rows


def _simulated(n_nodes: int, actors_per_node: int) -> dict[str, Any]:
    nodes = []
    for i in range(n_nodes):
        pid = f"12D3KooWsim{i:041d}"
        actors = [
            {
                "name": f"worker-{i}-{j}",
                "class": "app.Worker",
                "state": "running",
                "system": False,
                "mailbox": j % 3,
                "running": 1,
                "calls": i * j,
                "errors": 0,
                "failure": None,
            }
            for j in range(actors_per_node)
        ]
        peers = [
            {
                "peer_id": f"12D3KooWsim{(i + k) % n_nodes:041d}",
                "transport": "tcp",
                "direction": "outbound",
                "path": "direct",
                "remote": "/ip4/10.0.0.1/tcp/4001",
                "circle": "member",
                "agent": "lattica-py",
                "rtt_ms": 0.5,
                "bytes_sent": 10_000,
                "bytes_received": 12_000,
            }
            for k in range(1, 9)
        ]
        nodes.append(
            {
                "peer_id": pid,
                "state": "alive",
                "cpu": 8,
                "memory": 1 << 34,
                "gpus": 1,
                "labels": {"zone": f"z{i % 4}"},
                "load": {"actors": actors_per_node},
                "report": {
                    "peer_id": pid,
                    "agent": "lattica-py",
                    "addrs": ["/ip4/10.0.0.1/tcp/4001"],
                    "nat": {"reachability": "public", "reason": "sim"},
                    "peers": peers,
                    "actors": actors,
                    "actor_count": actors_per_node + 11,
                    "supervisors": [],
                    "dht": {"table": 20, "records": 5, "rejected": 0},
                },
            }
        )
    return {"nodes": nodes}


# A page's requests, in a process of its own (its CPU is not the measured node's, as a browser's
# is not): WATCHERS live channels read to the end, and the first watcher's actor panel (the
# actor's detail and its node's series) asked again with every picture, as the page does.
_WATCHER = r"""
import json, sys, threading, urllib.request
base, node, actor, n = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
def live(i):
    with urllib.request.urlopen(base + "api/live", timeout=60) as r:
        for line in r:
            if i == 0 and line.startswith(b"event: picture"):
                urllib.request.urlopen(base + f"api/actor?node={node}&name={actor}", timeout=30).read()
                urllib.request.urlopen(base + f"api/series?node={node}", timeout=30).read()
for i in range(n):
    threading.Thread(target=live, args=(i,), daemon=True).start()
print("watching", flush=True)
sys.stdin.read()
"""


def bench_dashboard_cost(seconds: float = 5.0, rounds: int = 3, concurrency: int = 1000) -> dict[str, Any]:
    """Table 1's first row (128 B async echo calls, ``concurrency`` in flight, TCP) against a node
    process serving its dashboard to WATCHERS pages, and against one serving none: alternated
    ``rounds`` times in this run; calls/s medians and their ratio."""
    from lattica._node import Node  # (as above)
    from lattica.bench.rpc import AsyncEcho, measure_calls, spawn_on  # (the benches load lazily: see lattica.cli)
    from lattica.bench.transport import server  # (as above)

    data = os.urandom(128)
    qps: dict[str, list[float]] = {"without": [], "with": []}
    for _ in range(rounds):
        for variant in ("without", "with"):
            extra = ("--dashboard", "127.0.0.1:0") if variant == "with" else ()
            with server("tcp", *extra) as (srv, _), Node([]) as node:
                node.connect(srv.addr("tcp"))
                ref = spawn_on(node, AsyncEcho, srv.peer_id)
                watcher = None
                if variant == "with":
                    assert srv.dashboard is not None  # (started with --dashboard)
                    watcher = subprocess.Popen(
                        [
                            sys.executable,
                            "-c",
                            _WATCHER,
                            srv.dashboard.rstrip("/") + "/",
                            srv.peer_id,
                            ref.name,
                            str(WATCHERS),
                        ],
                        stdin=subprocess.PIPE,
                        stdout=subprocess.PIPE,
                        text=True,
                    )
                    watcher.stdout.readline()  # type: ignore[union-attr]
                try:
                    done, failed, _, elapsed = measure_calls(node, ref, data, concurrency, seconds, 1.0)
                finally:
                    if watcher is not None:
                        watcher.kill()
                        watcher.wait()
                qps[variant].append(done / elapsed)
    without, with_ = statistics.median(qps["without"]), statistics.median(qps["with"])
    return {
        "bench": "dashboard",
        "case": f"Table 1 128 B async, node serving {WATCHERS} pages vs none",
        "rounds": rounds,
        "qps_without": round(without),
        "qps_with": round(with_),
        "ratio": round(with_ / without, 3),
        "each_without": [round(q) for q in qps["without"]],
        "each_with": [round(q) for q in qps["with"]],
    }


def bench_buffers(actors: int = 500) -> dict[str, Any]:
    """What an actor's output ring (empty, and full: MAX_LINES lines within MAX_BYTES) and its
    utilisation series hold, per actor, measured with tracemalloc over ``actors`` actors."""
    import tracemalloc  # (only this bench measures with it)

    from lattica._runtime import output  # (as above)
    from lattica.actors.dashboard.usage import SAMPLES, ActorCounters  # (the benches load lazily: see lattica.cli)

    class _Stub:  # (what _ActorCounters reads of an actor)
        calls = errors = 0
        thread_id = None

    peer = "bench"
    tracemalloc.start()
    try:
        t0 = tracemalloc.take_snapshot()
        rings = [output.OutputRing() for _ in range(actors)]
        empty = _grown(t0, tracemalloc.take_snapshot()) / actors
        line = "x" * (output.MAX_BYTES // output.MAX_LINES - 8)
        t1 = tracemalloc.take_snapshot()
        for r in rings:
            for i in range(output.MAX_LINES):
                r.add("stdout", f"{i:08d}{line}")  # (a string of its own per line, as printed lines are)
        full = _grown(t1, tracemalloc.take_snapshot()) / actors
        t2 = tracemalloc.take_snapshot()
        series = [ActorCounters(_Stub(), 0) for _ in range(actors)]  # type: ignore[arg-type]
        per_series = _grown(t2, tracemalloc.take_snapshot()) / actors
    finally:
        tracemalloc.stop()
        for r in rings:
            r.release()
    del rings, series, peer
    return {
        "bench": "dashboard",
        "case": f"buffers per actor ({actors} actors)",
        "output_ring_empty_bytes": round(empty),
        "output_ring_full_bytes": round(full),
        "output_ring_cap_bytes": output.MAX_BYTES,
        "series_bytes": round(per_series),
        "series_samples": SAMPLES,
    }


def _grown(before: Any, after: Any) -> int:
    return sum(s.size_diff for s in after.compare_to(before, "filename"))
