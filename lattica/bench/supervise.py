"""Supervised actors after the loss of a node, with real processes (``lattica bench supervise``).

Three node processes and this one: a supervisor here places stateful children on the others
(``resources={"cpu": 1}``, spread, checkpointed every 0.1 s). One process is SIGKILLed or frozen
with SIGSTOP; the round measures, from the signal, when membership here holds the node down, when
the supervisor restarted its children elsewhere, and when every child answers again (calls made
right after the signal through the stable refs, marked idempotent), and checks their state came
back from the checkpoints.
"""

from __future__ import annotations

import os
import signal
import statistics
from typing import Any

from lattica.mesh.supervised import lose, statuses, supervised_mesh


def bench_supervise(rounds: int = 5, children: int = 6) -> list[dict]:
    """Per signal (SIGKILL, SIGSTOP): ``rounds`` fresh meshes, one node lost in each; figures as
    min/median/max over the rounds."""
    rows = []
    for name, sig in (("SIGKILL", signal.SIGKILL), ("SIGSTOP", signal.SIGSTOP)):
        results = []
        for _ in range(rounds):
            with supervised_mesh(children) as (here, procs, sup, refs):
                victim = next(p for p in procs if p.peer_id == statuses(here, refs)[0]["node"])
                try:
                    results.append(lose(here, victim, sig, sup, refs))
                finally:
                    if sig == signal.SIGSTOP:
                        os.kill(victim.pid, signal.SIGCONT)
        row: dict[str, Any] = {
            "bench": f"supervise-{name.lower()}",
            "rounds": rounds,
            "children": children,
            "moved": f"{sum(r['moved'] for r in results)}/{sum(r['hosted'] for r in results)}",
            "state_kept": all(r["state_kept"] for r in results),
        }
        for key in ("verdict_s", "restarted_s", "answering_s"):
            xs = sorted(r[key] for r in results if r[key] is not None)
            if xs:
                row[key] = f"{xs[0]:.3f}/{statistics.median(xs):.3f}/{xs[-1]:.3f}"
        rows.append(row)
    return rows
