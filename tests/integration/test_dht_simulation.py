"""The issue's simulation: full nodes (runtime, dht actor, real multiplexer) on one event loop
over the in-memory transport. Every key stored is found from a random node; the lookup depth is
recorded; after 20 % of the nodes stop at random, at least 99 % of the keys are still found.

The default run simulates 150 nodes (7.5 times k, so lookups still take several hops; ~40-55 s
on two cores, where joining one by one is most of it and grows faster than linearly: 250 nodes
take ~2.5 minutes); the 250-node run and the issue's 1,000 nodes (~8 minutes or more) run with
``--slow``."""

import pytest

from lattica.bench.dht import simulate


def _check(r, nodes, keys):
    print(r)  # the figures docs/benchmarks.md quotes (run with -s to see them)
    assert r["found"] == keys, r
    assert r["replicas_median"] == 20, r  # every put reached its k closest
    assert r["rounds_median"] <= 4, r
    assert r["killed"] == nodes // 5
    assert r["found_after_churn_pct"] >= 99.0, r


def test_150_nodes_store_find_and_survive_churn():
    _check(simulate(150, keys=40, churn=0.2, seed=7), 150, 40)


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_250_nodes_store_find_and_survive_churn():
    _check(simulate(250, keys=60, churn=0.2, seed=7), 250, 60)


@pytest.mark.slow
@pytest.mark.timeout(1800)
def test_a_thousand_nodes_store_find_and_survive_churn():
    _check(simulate(1000, keys=200, churn=0.2, seed=7), 1000, 200)
