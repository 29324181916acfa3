"""Relayed against direct, side by side in one run: time to the first call, calls per second.

Processes on loopback: two relays (one splicing circuits onto their own sockets, the default; one
relaying them inside its secured connections), a private server behind each (listening nowhere,
reachable only through its relay), a public server, and this client (listening nowhere either, so
no direct path can replace a circuit). The same echo actor is driven over each path with the same
load.
"""

from __future__ import annotations

import os
import statistics
import time
from typing import Any

from ..node import Node
from .rpc import AsyncEcho, _pct, _spawn_on, measure_calls
from .server import ServerProcess

_TCP = "/ip4/127.0.0.1/tcp/0"


def _first_call(addr: str, data: bytes) -> float:
    """Seconds from dialing ``addr`` with a fresh node to the first echo's answer."""
    with Node([]) as node:
        t0 = time.perf_counter()
        info = node.connect(addr)
        ref = _spawn_on(node, AsyncEcho, info.peer_id)
        node.run(_echo(ref, data), timeout=30)
        return time.perf_counter() - t0


async def _echo(ref: Any, data: bytes) -> Any:
    return await ref.echo.remote(data)


def bench_relay(payload: int = 262144, concurrency: int = 32, duration: float = 5.0, warmup: float = 1.0, first_calls: int = 5) -> list[dict[str, Any]]:
    data = os.urandom(payload)
    out = []
    with ServerProcess([_TCP], "--relay") as relay, ServerProcess([_TCP], "--relay-in-stream") as relay2:
        with (
            ServerProcess([], "--private-via", relay.addr("tcp")) as private,
            ServerProcess([], "--private-via", relay2.addr("tcp")) as private2,
            ServerProcess([_TCP]) as public,
        ):
            paths = {"relayed-spliced": private.addrs[0], "relayed-in-stream": private2.addrs[0], "direct": public.addr("tcp")}
            for path, addr in paths.items():
                firsts = [_first_call(addr, b"x") for _ in range(first_calls)]
                with Node([]) as node:
                    info = node.connect(addr)
                    ref = _spawn_on(node, AsyncEcho, info.peer_id)
                    done, failed, lat, elapsed = measure_calls(node, ref, data, concurrency, duration, warmup)
                    via = node._host.conns[info.peer_id].transport
                us = [x * 1e6 for x in lat] or [0.0]
                out.append({
                    "bench": "relay",
                    "path": path,
                    "via": via,
                    "first_call_ms": round(statistics.median(firsts) * 1e3, 1),
                    "payload": payload,
                    "concurrency": concurrency,
                    "qps": round(done / elapsed),
                    "MiB_per_s": round(done * payload * 2 / elapsed / 2**20, 1),
                    "failed": failed,
                    "p50_us": round(_pct(us, 0.5), 1),
                })
    return out
