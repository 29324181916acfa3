"""``lattica bench scale``: the fits recover the curves they name, and a small run of every
service gives its figures and a fit per cost."""

from __future__ import annotations

import math

import pytest

from lattica.bench.scale import _extrapolated, bench_scale, fit, fit_log, growth


def test_a_power_law_is_recovered():
    ns = [100, 1000, 3000, 10000]
    a, b = fit(ns, [3.0 * n**0.5 for n in ns])
    assert a == pytest.approx(3.0) and b == pytest.approx(0.5)
    assert growth(1.0) == "~N (linear)" and growth(0.0) == "flat" and growth(1.5).endswith("(faster than N)")


def test_a_logarithm_is_told_from_a_power_law_and_extrapolated_as_one():
    ns = [100, 1000, 3000]
    points = [{"nodes": n, "hops": 1.0 + 0.5 * math.log2(n), "view": 2.0 * n} for n in ns]
    a, b = fit_log(ns, [p["hops"] for p in points])
    assert a == pytest.approx(1.0) and b == pytest.approx(0.5)
    out = _extrapolated(points, ["hops", "view"], 10_000)
    assert out["hops"]["grows"].startswith("~log N") and out["hops"]["at_10000"] == pytest.approx(
        1 + 0.5 * math.log2(1e4), abs=1e-3
    )
    assert out["view"]["grows"] == "~N (linear)" and out["view"]["at_10000"] == pytest.approx(20_000)


def test_a_small_run_of_every_service_gives_figures_and_fits():
    rows = list(bench_scale(sizes={"dht": (40, 80), "pubsub": (20, 40), "membership": (10, 20)}))
    points = [r for r in rows if r["bench"] == "scale"]
    assert [(r["service"], r["nodes"]) for r in points] == [
        ("dht", 40),
        ("dht", 80),
        ("pubsub", 20),
        ("pubsub", 40),
        ("membership", 10),
        ("membership", 20),
    ]
    dht = points[1]
    assert dht["hops_median"] >= 1 and dht["requests_per_lookup"] >= 1 and 0 < dht["table_entries"] < 80
    assert all(p["delivery_pct"] == 100.0 for p in points if p["service"] == "pubsub")
    assert points[-1]["view"] >= 15  # (every member keeps every other, once the views converge)
    fits = {r["service"]: r for r in rows if r["bench"] == "scale-fit"}
    assert set(fits) == {"dht", "pubsub", "membership"}
    assert all("grows" in v for v in fits["dht"].values() if isinstance(v, dict))
