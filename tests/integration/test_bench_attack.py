"""``lattica bench attack`` runs end to end at a small size: a quiet phase and one attack, each
with the four measures, nothing lost, and the victim's CPU and memory read (figures: docs/security.md)."""

from __future__ import annotations

import math

import pytest

from lattica.bench.attack import bench_attack

pytestmark = pytest.mark.timeout(180)


def test_bench_attack_measures_quiet_and_an_attack_with_nothing_lost():
    rows = bench_attack(("have",), (8,), seconds=1.5)
    assert [(r["attack"], r["identities"]) for r in rows] == [("quiet", 0), ("have", 8)]
    for r in rows:
        assert r["rounds"] > 0 and r["lost"] == 0, r
        assert all(
            math.isfinite(r[f"{k}_p99_ms"]) and r[f"{k}_p99_ms"] > 0 for k in ("call", "lookup", "have", "pubsub")
        ), r
        assert r["victim_rss_mb"] > 10 and r["victim_cpu_pct"] > 0
    assert rows[1]["x_quiet"] > 0
    assert rows[1]["victim_cpu_pct"] > rows[0]["victim_cpu_pct"]  # (the victim answers 8 strangers' haves)
    assert rows[1]["attackers_cpu_pct"] > 0 and "attackers_cpu_pct" not in rows[0]
