"""A short soak of the failure detector with real processes under load (``lattica bench soak``
runs the 5-minute one): with every process alive and the machine busy, no member may be
declared dead anywhere and no call may fail."""

from __future__ import annotations

from lattica.bench.soak import soak


def test_no_false_dead_verdicts_and_no_failed_calls_under_load(capsys):
    out = soak(15.0, processes=3, rate=300.0)
    assert out["views"] >= (3 + 1) * 10  # every node's view (3 processes and here) read about once a second
    assert out["calls"] >= 300 * 14 and out["crunch"] > 0  # the load really ran
    assert out["errors"] == 0, out["verdicts"]
    assert out["dead"] == 0, out["verdicts"]
    with capsys.disabled():
        print(f"\nsoak 15 s, 3 processes: {out['calls']} calls, {out['suspect']} suspicions, {out['dead']} dead")
