"""``lattica bench libp2p`` runs every pair against the installed peers and prints a row for each,
on tiny sizes (figures are the bench's business, not the test's); a missing peer is named with the
command that installs it."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from .conftest import INTEROP

pytestmark = pytest.mark.timeout(240)
BENCH = [sys.executable, "-c", "from lattica.cli import main; main()", "bench", "libp2p"]


def test_bench_libp2p_prints_a_row_per_pair(sdk_python, p2pd_binary, js_root):
    tiny = ["--handshakes", "2", "--pings", "10", "--size", str(1 << 20), "--transport", "tcp", "--json"]
    out = subprocess.run([*BENCH, "--peers", str(INTEROP), *tiny], capture_output=True, text=True, timeout=200)
    assert out.returncode == 0, out.stderr[-3000:]
    rows = [json.loads(line) for line in out.stdout.splitlines() if line.startswith("{")]
    pairs = [r["pair"] for r in rows]
    assert pairs == [
        "lattica->lattica",
        "rust->rust",
        "rust->lattica",
        "lattica->rust",
        "go->go",
        "go->lattica",
        "lattica->go",
        "js->js",
        "js->lattica",
        "lattica->js",
    ], pairs
    for r in rows:
        # (rust's throughput is one call of its RPC's Echo.sink, from either side: sdk_rpc.py)
        assert r["transport"] == "tcp" and r["handshake_p50_ms"] > 0 and r["ping_p50_us"] > 0 and r["MB_per_s"] > 0, r
    assert "lattica bench libp2p: " in out.stderr  # (what it runs and about how long, first)


def test_bench_libp2p_names_a_missing_peer_and_what_installs_it(tmp_path):
    out = subprocess.run([*BENCH, "--peers", str(tmp_path), "--impl", "go"], capture_output=True, text=True, timeout=60)
    assert out.returncode != 0
    assert "go-libp2p" in out.stderr and "make interop-peers" in out.stderr, out.stderr
