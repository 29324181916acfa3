"""Relayed against direct, side by side in one run: time to the first call, calls per second.

Processes on loopback: two relays (one splicing circuits onto their own sockets, the default; one
relaying them inside its secured connections), private servers (listening nowhere, reachable only
through their relay: two on the splicing relay, over TCP and over QUIC, whose circuits still
splice through the relay's TCP listener; one on the other), a public server, and this client (listening nowhere either, so
no direct path can replace a circuit). The same echo actor is driven over each path with the same
load, the paths taking turns round by round.
"""

from __future__ import annotations

import os
import statistics
import time
from typing import Any

from lattica._node import Node
from lattica.bench import host_of
from lattica.bench.rpc import AsyncEcho, measure_calls, pct, spawn_on
from lattica.mesh.process import ServerProcess

_TCP = "/ip4/127.0.0.1/tcp/0"
_QUIC = "/ip4/127.0.0.1/udp/0/quic-v1"


def _first_call(addr: str, data: bytes) -> float:
    """Seconds from dialing ``addr`` with a fresh node to the first echo's answer."""
    with Node([]) as node:
        t0 = time.perf_counter()
        info = node.connect(addr)
        ref = spawn_on(node, AsyncEcho, info.peer_id)
        node.run(_echo(ref, data), timeout=30)
        return time.perf_counter() - t0


async def _echo(ref: Any, data: bytes) -> Any:
    return await ref.echo.remote(data)


def bench_relay(
    payload: int = 262144,
    concurrency: int = 32,
    duration: float = 3.0,
    warmup: float = 1.0,
    rounds: int = 5,
    first_calls: int = 5,
) -> list[dict[str, Any]]:
    """Each round drives every path in turn for ``duration`` s, so slow drift on a shared machine
    hits all paths alike; rows give the median round, the range, and each relayed path's share of
    direct throughput in the same round (median and worst)."""
    data = os.urandom(payload)
    with ServerProcess([_TCP, _QUIC], "--relay") as relay, ServerProcess([_TCP], "--relay-in-stream") as relay2:
        with (
            ServerProcess([], "--private-via", relay.addr("tcp")) as private,
            ServerProcess([], "--private-via", relay.addr("quic")) as private_quic,
            ServerProcess([], "--private-via", relay2.addr("tcp")) as private2,
            ServerProcess([_TCP]) as public,
        ):
            paths = {
                "relayed-spliced": next(a for a in private.addrs if "/quic-v1" not in a),
                "relayed-spliced-quic": next(a for a in private_quic.addrs if "/quic-v1" in a),
                "relayed-in-stream": private2.addrs[0],
                "direct": public.addr("tcp"),
            }
            firsts = {
                path: statistics.median(_first_call(addr, b"x") for _ in range(first_calls))
                for path, addr in paths.items()
            }
            runs: dict[str, list[dict[str, Any]]] = {path: [] for path in paths}
            with Node([]) as node:
                refs = {}
                for path, addr in paths.items():
                    info = node.connect(addr)
                    refs[path] = (spawn_on(node, AsyncEcho, info.peer_id), host_of(node).conns[info.peer_id].transport)
                for _ in range(rounds):
                    for path, (ref, via) in refs.items():
                        done, failed, lat, elapsed = measure_calls(node, ref, data, concurrency, duration, warmup)
                        us = [x * 1e6 for x in lat] or [0.0]
                        runs[path].append({"via": via, "qps": done / elapsed, "failed": failed, "p50_us": pct(us, 0.5)})
    out = []
    for path, rs in runs.items():
        mib = [r["qps"] * payload * 2 / 2**20 for r in rs]
        row = {
            "bench": "relay",
            "path": path,
            "via": rs[0]["via"],
            "first_call_ms": round(firsts[path] * 1e3, 1),
            "payload": payload,
            "concurrency": concurrency,
            "rounds": rounds,
            "qps": round(statistics.median(r["qps"] for r in rs)),
            "MiB_per_s": round(statistics.median(mib), 1),
            "MiB_per_s_min": round(min(mib), 1),
            "MiB_per_s_max": round(max(mib), 1),
            "failed": sum(r["failed"] for r in rs),
            "p50_us": round(statistics.median(r["p50_us"] for r in rs), 1),
        }
        if path != "direct":
            shares = [r["qps"] / d["qps"] * 100 for r, d in zip(rs, runs["direct"])]
            row["pct_of_direct"] = round(statistics.median(shares), 1)
            row["pct_of_direct_min"] = round(min(shares), 1)
        out.append(row)
    return out
