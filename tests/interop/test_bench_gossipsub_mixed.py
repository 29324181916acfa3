"""``lattica bench gossipsub-mixed`` runs every case end to end against the installed go and js
peers (2 go + 2 js + 2 Lattica node processes, then 6 of one kind) and prints its figures, on a
tiny run (figures are the bench's business, not the test's: only that every message reached every
other node and the rows are there); a missing peer is named with the command that installs it."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from .conftest import INTEROP

pytestmark = pytest.mark.timeout(300)
BENCH = [sys.executable, "-c", "from lattica.cli import main; main()", "bench", "gossipsub-mixed"]
CASES = ["mixed", "mixed-open", "go", "js", "lattica"]
KINDS = ("go", "lattica", "js")


def test_bench_gossipsub_mixed_delivers_everything_and_prints_its_figures(p2pd_binary, js_root):
    out = subprocess.run(
        [*BENCH, "--peers", str(INTEROP), "--messages", "3", "--json"], capture_output=True, text=True, timeout=280
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert "lattica bench gossipsub-mixed: 5 topics of 6 node processes" in out.stderr  # (what it runs, first)
    rows = [json.loads(line) for line in out.stdout.splitlines() if line.startswith("{")]
    assert [r["case"] for r in rows if r["pairs"] == "all"] == CASES
    for r in rows:
        assert r["bench"] == "gossipsub-mixed", r
        if r["pairs"] == "notes":
            assert r["ready_s"] > 0, r
            continue
        # 3 messages from each of 6 nodes to each of the 5 others: 90 pairs in all
        got, want = map(int, r["delivered"].split("/"))
        assert got == want and want > 0 and r["dup"] == 0, r
        assert 0 < r["p50_us"] <= r["p99_us"] <= r["max_us"], r
    mixed = {r["pairs"]: r for r in rows if r["case"] == "mixed"}
    assert mixed["all"]["delivered"] == "90/90"
    assert {f"{a}->{b}" for a in KINDS for b in KINDS} | {"1 hop", "2 hops", "notes"} <= set(mixed)
    assert "js_clock_minus_ours_us" in mixed["notes"] and "lattica_delivered_copies" in mixed["notes"]


def test_bench_gossipsub_mixed_names_a_missing_peer_and_what_installs_it(tmp_path):
    out = subprocess.run([*BENCH, "--peers", str(tmp_path), "--case", "go"], capture_output=True, text=True, timeout=60)
    assert out.returncode != 0
    assert "go-libp2p" in out.stderr and "make interop-peers" in out.stderr, out.stderr
