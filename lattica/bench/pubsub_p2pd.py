"""``lattica bench pubsub --against p2pd``: our pub-sub's delivery latency beside go-libp2p's
GossipSub, in one run (issue 51, must-have 3).

Five node processes on 127.0.0.1, every one linked to every other, all subscribed to one topic;
node 0 publishes ``messages`` messages of ``size`` bytes, one every ``gap`` seconds, after a
warm-up round. The two cases alternate round by round at each gap:

- ``p2pd``: five go-libp2p daemons (p2pd ``-pubsub``, go-libp2p-pubsub v0.10, from the hivemind
  wheel) driven over their control sockets by agents (``lattica.bench.gossipsub_mixed``): the
  publish request and the subscription's socket are one unix-socket hop each that a go program
  would not pay, and they count against go;
- ``lattica``: five Lattica nodes on our own pub-sub (``lattica.pubsub``, not a libp2p topic),
  each publishing and receiving in its own process.

Latency = receive time - publish time, both read from CLOCK_REALTIME on this machine, for every
(message, receiver) pair; a row per case and gap with the medians over the rounds of p50, p99 and
max, and what was delivered.
"""

from __future__ import annotations

import pathlib
import statistics
from collections.abc import Callable, Iterator
from typing import Any

from lattica.bench.gossipsub_mixed import run_topology

__all__ = ["bench_pubsub_against_p2pd", "CASES", "NODES"]

NODES = 5
LINKS = tuple((i, j) for i in range(NODES) for j in range(i + 1, NODES))
CASES: dict[str, tuple[tuple[str, ...], str]] = {
    "p2pd": (("go",) * NODES, "strangers"),
    "lattica": (("lattica",) * NODES, "native"),
}


def bench_pubsub_against_p2pd(
    found: dict[str, pathlib.Path],
    gaps: tuple[float, ...] = (0.005, 0.002),
    messages: int = 200,
    rounds: int = 2,
    size: int = 128,
    progress: Callable[[str], None] | None = None,
) -> Iterator[dict[str, Any]]:
    """Rows as the module docstring says; ``found``: where p2pd is (``lattica.bench.libp2p.find_peers``)."""
    for gap in gaps:
        runs: dict[str, list[dict]] = {case: [] for case in CASES}
        cpu: dict[str, list[float]] = {case: [] for case in CASES}
        for r in range(rounds):
            for case in list(CASES) if r % 2 == 0 else list(reversed(CASES)):
                kinds, mode = CASES[case]
                rows = list(
                    run_topology(
                        case, kinds, mode, LINKS, (0,), found, messages, gap, size, warmup=20, progress=progress
                    )
                )
                runs[case].append(next(row for row in rows if row.get("pairs") == "all"))
                notes = next(row for row in rows if row.get("pairs") == "notes")
                cpu[case].extend(notes.get("cpu_ms_per_msg", {}).values())
        for case, alls in runs.items():
            delivered = [tuple(map(int, a["delivered"].split("/"))) for a in alls]
            yield {
                "bench": "pubsub-vs-p2pd",
                "case": case,
                "gap_ms": gap * 1e3,
                "rounds": rounds,
                "delivered": f"{sum(d for d, _ in delivered)}/{sum(w for _, w in delivered)}",
                "p50_us": _median(a["p50_us"] for a in alls),
                "p99_us": _median(a["p99_us"] for a in alls),
                "max_us": _median(a["max_us"] for a in alls),
                "cpu_ms_per_msg_per_node": round(statistics.median(cpu[case]), 2) if cpu[case] else None,
            }


def _median(values: Any) -> float | None:
    got = [v for v in values if v is not None]
    return round(statistics.median(got)) if got else None
