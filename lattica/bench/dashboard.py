"""The dashboard's costs (``lattica bench dashboard``): one picture of a real local mesh (node
processes running a supervisor's children), from the request to the JSON, and what it weighs;
and a simulated picture of 200 nodes with 5,000 actors: checking every report as a member's
(``clean_report``) and encoding it once for all live channels. (The page's draw of that
picture in headless Chromium is timed by tests/integration/test_dashboard_browser.py.)"""

from __future__ import annotations

import json
import statistics
import time
import urllib.request
from typing import Any

from lattica.actors.dashboard.clean import clean_member, clean_report
from lattica.mesh.supervised import supervised_mesh

__all__ = ["bench_dashboard"]


def bench_dashboard(rounds: int = 20) -> list[dict[str, Any]]:
    rows = []
    with supervised_mesh(children=6, processes=3, dashboard="127.0.0.1:0") as (here, procs, sup, refs):
        url = here.dashboard_url + "api/mesh"
        times, size = [], 0
        for _ in range(rounds):
            t0 = time.perf_counter()
            with urllib.request.urlopen(url, timeout=30) as r:
                size = len(r.read())
            times.append(time.perf_counter() - t0)
        rows.append({"bench": "dashboard", "case": "picture, 4 nodes, 6 children", "p50_ms": round(statistics.median(times) * 1000, 2),
                     "max_ms": round(max(times) * 1000, 2), "bytes": size})
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
    rows.append({"bench": "dashboard", "case": "picture, 200 nodes, 5000 actors (simulated)", "check_ms": round(checked * 1000, 1),
                 "encode_ms": round(encoded * 1000, 1), "bytes": len(data)})
    return rows


def _simulated(n_nodes: int, actors_per_node: int) -> dict[str, Any]:
    nodes = []
    for i in range(n_nodes):
        pid = f"12D3KooWsim{i:041d}"
        actors = [{"name": f"worker-{i}-{j}", "class": "app.Worker", "state": "running", "system": False, "mailbox": j % 3,
                   "running": 1, "calls": i * j, "errors": 0, "failure": None} for j in range(actors_per_node)]
        peers = [{"peer_id": f"12D3KooWsim{(i + k) % n_nodes:041d}", "transport": "tcp", "direction": "outbound", "path": "direct",
                  "remote": "/ip4/10.0.0.1/tcp/4001", "circle": "member", "agent": "lattica-py", "rtt_ms": 0.5,
                  "bytes_sent": 10_000, "bytes_received": 12_000} for k in range(1, 9)]
        nodes.append({"peer_id": pid, "state": "alive", "cpu": 8, "memory": 1 << 34, "gpus": 1, "labels": {"zone": f"z{i % 4}"},
                      "load": {"actors": actors_per_node},
                      "report": {"peer_id": pid, "agent": "lattica-py", "addrs": ["/ip4/10.0.0.1/tcp/4001"],
                                 "nat": {"reachability": "public", "reason": "sim"}, "peers": peers, "actors": actors,
                                 "actor_count": actors_per_node + 11, "supervisors": [], "dht": {"table": 20, "records": 5, "rejected": 0}}})
    return {"nodes": nodes}
