"""``lattica bench firstcall``: what a fresh script pays to make one call, counted in round trips.

A user's script starts a node, joins through one bootstrap peer, resolves an actor by name, calls
it once and ends. On a long link every step that waits for the peer costs a round trip, so the
figures are reported in milliseconds and, across an emulated link (``--link``), in round trips
of that link. The far side is a node in its own process holding a named actor; every run is a
fresh caller process (nothing cached: keys, connections, the DHT's table).

Phases, each measured from the caller's exec: ``import`` (Python and lattica loaded), ``init``
(``lattica.init(bootstrap=...)`` returned: connected and identified), ``resolve``
(``get_actor(name)``), ``call`` (the reply), ``shutdown`` (``lattica.shutdown()`` returned) and
``exit`` (the process ended, seen by the parent).
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time
from typing import Any

import lattica
from lattica.bench.transport import LOOPBACK

NAME = "firstcall-counter"
PHASES = ("import", "init", "resolve", "call", "shutdown", "exit")


@lattica.actor
class Counter:
    """The far side's named actor."""

    def __init__(self) -> None:
        self.n = 0

    def incr(self, by: int) -> int:
        self.n += by
        return self.n


_CALLEE = r"""
import json, sys
import lattica
from lattica.bench.firstcall import Counter, NAME
node = lattica.init(sys.argv[1:], mdns=False)
lattica.get(Counter.options(name=NAME).remote().incr.remote(0))
print(json.dumps({"peer_id": str(node.peer_id), "addrs": [str(a) for a in node.addrs]}), flush=True)
sys.stdin.read()
"""

_CALLER = r"""
import json, sys, time
t0 = float(sys.argv[1])
ms = lambda: round((time.time() - t0) * 1e3, 2)
import lattica
out = {"import": ms()}
lattica.init(bootstrap=[sys.argv[2]], mdns=False)
out["init"] = ms()
ref = lattica.get_actor(sys.argv[3], timeout=30)
out["resolve"] = ms()
lattica.get(ref.incr.remote(1), timeout=30)
out["call"] = ms()
lattica.shutdown()
out["shutdown"] = ms()
print(json.dumps(out), flush=True)
"""


def bench_firstcall(transport: str = "tcp", link: Any = None, runs: int = 5) -> dict[str, Any]:
    """Median time of each phase of a fresh caller's first call over ``runs`` runs, on loopback or
    across an emulated ``link`` (a lattica.bench.linkem profile). Across a link the same runs on
    loopback come first, and each step that waits on the far side is also given in round trips
    of the link: (its time across the link - its time on loopback) / RTT."""
    row: dict[str, Any] = {"bench": "firstcall", "transport": transport, "runs": runs}
    local = _medians(transport, None, runs)
    if link is None:
        row.update({f"{p}_ms": round(local[p], 1) for p in PHASES})
        return row
    from lattica.bench.linkem import EmulatedLink  # (only a --link run builds namespaces)

    with EmulatedLink(link) as lk:
        far = _medians(transport, lk, runs)
    rtt_ms = lk.profile.rtt * 1e3
    row.update({"link": link if isinstance(link, str) else repr(link), "rtt_ms": rtt_ms})
    row.update({f"{p}_ms": round(far[p], 1) for p in PHASES})
    row.update({f"loopback_{p}_ms": round(local[p], 1) for p in PHASES})
    if rtt_ms > 0:
        prev = "import"
        for p in PHASES[1:]:
            row[f"{p}_rtts"] = round(((far[p] - far[prev]) - (local[p] - local[prev])) / rtt_ms, 2)
            prev = p
    return row


def _medians(transport: str, lk: Any, runs: int) -> dict[str, float]:
    """Run a far node (across ``lk``, else on loopback) and ``runs`` fresh callers; the median of
    each phase, in ms from the caller's exec."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}  # (as installed: bytecode cached)
    wrap = lk.wrap if lk is not None else []
    if lk is None:
        listen = LOOPBACK[transport]
    else:
        listen = f"/ip4/{lk.far_ip}/tcp/0" if transport == "tcp" else f"/ip4/{lk.far_ip}/udp/0/quic-v1"
    callee = subprocess.Popen(
        [*wrap, sys.executable, "-c", _CALLEE, listen],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env=env,
    )
    try:
        line = callee.stdout.readline()  # type: ignore[union-attr]
        if not line:
            raise RuntimeError("the far node did not start")
        addr = json.loads(line)["addrs"][0]
        results = []
        for i in range(runs + 1):  # the first run is discarded: it writes the bytecode cache
            t0 = time.time()
            out = subprocess.run(
                [sys.executable, "-c", _CALLER, repr(t0), addr, NAME],
                capture_output=True,
                text=True,
                env=env,
                timeout=120,
            )
            exited = (time.time() - t0) * 1e3
            if out.returncode != 0:
                raise RuntimeError(f"the caller failed: {out.stderr.strip()[-2000:]}")
            if i:
                results.append({**json.loads(out.stdout), "exit": exited})
    finally:
        _end(callee)
    return {p: statistics.median(r[p] for r in results) for p in PHASES}


def _end(proc: subprocess.Popen) -> None:
    try:
        proc.stdin.close()  # type: ignore[union-attr]
        proc.wait(10)
    except (OSError, subprocess.TimeoutExpired):
        proc.kill()
        proc.wait()
