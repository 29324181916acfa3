"""``lattica bench pubsub --against p2pd`` runs end to end: 5 go-libp2p daemons and 5 Lattica
node processes, one publisher each, alternating, on a tiny run (the figures are the bench's
business: here only that every message reached the 4 others in both cases and the rows are there)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from .conftest import INTEROP

pytestmark = pytest.mark.timeout(300)
BENCH = [sys.executable, "-c", "from lattica.cli import main; main()", "bench", "pubsub", "--against", "p2pd"]


def test_bench_pubsub_against_p2pd_delivers_everything_in_both_cases(p2pd_binary):
    out = subprocess.run(
        [*BENCH, "--peers", str(INTEROP), "--messages", "10", "--gap-ms", "5", "--runs", "1", "--json"],
        capture_output=True,
        text=True,
        timeout=280,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert "5 processes of ours against 5 go-libp2p daemons" in out.stderr  # (what it runs, first)
    rows = [json.loads(line) for line in out.stdout.splitlines() if line.startswith("{")]
    assert [(r["case"], r["gap_ms"]) for r in rows] == [("p2pd", 5.0), ("lattica", 5.0)]
    for r in rows:
        assert r["delivered"] == "40/40", r  # 10 messages to each of 4 receivers
        assert 0 < r["p50_us"] <= r["p99_us"] <= r["max_us"], r
