"""The issue's convergence simulation (lattica/bench/crdt.py): full nodes (runtime, pub-sub, CRDT
service, multiplexer, RPC) on one event loop over the in-memory transport, random concurrent
edits during random partitions; after the last heal every replica holds the same document.

The default run is 10 replicas and 5 runs (~15 s on two cores); the issue's 20 replicas and 100
runs (``lattica bench crdt-sim``, ~8 minutes) run with ``--slow``. The issue's target, identical
within 2 s of the heal, is checked in both."""

import pytest

from lattica.bench.crdt import simulate_crdt


def _check(r, runs):
    print(r)  # the figures docs/benchmarks.md quotes (run with -s to see them)
    assert r["converged"] == runs and r["diverged"] == 0, r
    assert r["converge_ms_max"] <= 2000, r
    assert r["refused"] == 0, r  # honest replicas refuse nothing of each other's


@pytest.mark.timeout(300)
def test_10_replicas_converge_after_partitions_heal():
    _check(simulate_crdt(10, runs=5, seed=3), 5)


@pytest.mark.timeout(300)
def test_10_replicas_converge_while_they_compact_their_logs_during_partitions():
    """A checkpoint every 10 envelopes: checkpoints are made on each side of a partition, the
    two sides take each other's after the heal, and still converge."""
    r = simulate_crdt(10, runs=5, seed=4, compact_every=10)
    _check(r, 5)
    assert r["checkpoints_taken"] > 0, r


@pytest.mark.slow
@pytest.mark.timeout(3600)
def test_20_replicas_100_runs():
    _check(simulate_crdt(20, runs=100), 100)
