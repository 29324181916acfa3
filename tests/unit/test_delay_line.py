"""The emulated link's delay line (lattica.bench.linkem.DelayLine), sans-IO: packets and a clock
in, packets out."""

from __future__ import annotations

import random

from lattica.bench.linkem import PROFILES, DelayLine


def test_a_packet_arrives_after_the_delay_and_not_before():
    line = DelayLine(delay=0.075)
    assert line.push(10.0, b"a")
    assert line.due(10.07) == [] and line.next_at() == 10.075
    assert line.due(10.075) == [b"a"] and line.next_at() is None and line.bytes == 0


def test_order_is_kept_and_the_rate_serializes_packets_back_to_back():
    line = DelayLine(delay=0.01, rate=1000.0)  # 1000 B/s: a 100 B packet takes 0.1 s to send
    for p in (b"x" * 100, b"y" * 100, b"z" * 100):
        line.push(0.0, p)
    assert line.due(0.109) == []
    assert line.due(0.1101) == [b"x" * 100]
    assert line.due(0.2099) == []
    assert line.due(0.3101) == [b"y" * 100, b"z" * 100]
    # an idle line sends at once again
    line.push(5.0, b"w" * 100)
    assert abs(line.next_at() - (5.0 + 0.1 + 0.01)) < 1e-9


def test_jitter_delays_but_never_reorders():
    steady, jittery = DelayLine(delay=0.05), DelayLine(delay=0.05, jitter=0.02, rng=random.Random(7))
    for i in range(1000):
        for line in (steady, jittery):
            line.push(i * 0.0001, i.to_bytes(2, "big"))
    # by 0.1499 s every packet crossed the steady line (the last left at 0.0999); jitter held some back
    assert len(steady.due(0.1499 + 1e-9)) == 1000
    early = jittery.due(0.1499 + 1e-9)
    late = jittery.due(0.0999 + 0.05 + 0.02 + 1e-9)  # the latest any packet can arrive
    assert 0 < len(early) < 1000 and jittery.next_at() is None
    assert [int.from_bytes(p, "big") for p in early + late] == list(range(1000))


def test_loss_drops_about_its_share_and_counts_it():
    line = DelayLine(delay=0.0, loss=0.01, rng=random.Random(1))
    kept = sum(line.push(0.0, b"p") for _ in range(100_000))
    assert 98_700 < kept < 99_300 and line.lost == 100_000 - kept and line.sent == 100_000


def test_the_line_holds_at_most_its_limit_and_drops_the_rest():
    line = DelayLine(delay=1.0, limit=1000)
    assert [line.push(0.0, b"q" * 400) for _ in range(3)] == [True, True, False]
    assert line.overflow == 1 and line.bytes == 800
    line.due(1.0)
    assert line.bytes == 0 and line.push(1.0, b"q" * 400)


def test_the_profiles_are_the_issues():
    assert PROFILES["lan"].rtt == 0.0005 and PROFILES["region"].rtt == 0.010
    assert PROFILES["continent"].rtt == 0.150 and PROFILES["continent"].loss == 0.001
