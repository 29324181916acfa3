"""A streaming call's item window (lattica.runtime.refs._StreamState): credit in batches of half
a window, doubled when a consumer that ran out of items took half a window within a round trip,
bounded in items and in bytes, shrunk (by keeping credit back) when items grow."""

from __future__ import annotations

import pytest

from lattica.runtime import refs
from lattica.runtime.limits import MAX_STREAM_WINDOW, STREAM_WINDOW, STREAM_WINDOW_BYTES

BATCH = STREAM_WINDOW // 2


class _Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock(monkeypatch):
    c = _Clock()
    monkeypatch.setattr(refs.time, "monotonic", c)
    return c


def _state(rtt: float | None, clock: _Clock) -> tuple[refs._StreamState, list[int]]:
    st = refs._StreamState(rt=None)  # (the credit logic never touches the runtime)
    grants: list[int] = []
    st._bind(grants.append, lambda: None, lambda: rtt)
    return st, grants


def _take(st: refs._StreamState, n: int, nbytes: int = 100, starved: bool = True) -> None:
    for _ in range(n):
        st._push(object(), nbytes)
        st._items.popleft()
        if starved:
            st._starved = True
        st._took_one()


def test_credit_goes_back_every_eight_items_and_a_slow_consumer_never_grows_the_window(clock):
    st, grants = _state(0.1, clock)
    for _ in range(10):
        clock.now += 0.2  # eight items take two round trips: the producer is not held back
        _take(st, BATCH)
    assert grants == [BATCH] * 10 and st._window == STREAM_WINDOW


def test_a_starved_consumer_held_back_by_credit_doubles_the_window_up_to_the_cap(clock):
    st, grants = _state(0.1, clock)
    windows = [st._window]
    while st._window < MAX_STREAM_WINDOW:
        clock.now += 0.001  # half a window within a millisecond: far above what it lets through
        before, g = st._window, len(grants)
        _take(st, before // 2)
        assert all(x == BATCH for x in grants[g:-1]) and grants[-1] == BATCH + before  # batches of 8, then a window more
        windows.append(st._window)
    assert windows == [STREAM_WINDOW * 2**i for i in range(len(windows))] and windows[-1] == MAX_STREAM_WINDOW
    clock.now += 0.001
    g = len(grants)
    _take(st, MAX_STREAM_WINDOW // 2)
    assert grants[g:] == [BATCH] * (MAX_STREAM_WINDOW // 2 // BATCH) and st._window == MAX_STREAM_WINDOW


def test_growth_stops_where_the_items_come_slower_than_half_the_window_allows(clock):
    """At 800 items/s over a 100 ms path the window grows while half of what it lets through
    (window / 2 per round trip) is below the rate: 128 (640/s) grows, 256 (1,280/s) stays."""
    st, grants = _state(0.1, clock)
    for _ in range(50):
        clock.now += 0.01
        _take(st, BATCH)
    assert st._window == 256


def test_items_taken_from_a_full_buffer_do_not_grow_it(clock):
    """The producer ran ahead while we were busy: taking the backlog fast is no sign of a window
    that holds it back."""
    st, grants = _state(0.1, clock)
    for _ in range(5):
        clock.now += 0.0001
        _take(st, BATCH, starved=False)
    assert st._window == STREAM_WINDOW and grants == [BATCH] * 5


def test_no_round_trip_known_no_growth(clock):
    st, grants = _state(None, clock)
    clock.now += 0.0001
    _take(st, BATCH)
    assert st._window == STREAM_WINDOW


def test_the_window_holds_at_most_its_bytes_and_shrinks_when_items_grow(clock):
    st, grants = _state(0.1, clock)
    big = STREAM_WINDOW_BYTES // STREAM_WINDOW  # 16 items of this size fill the byte budget
    clock.now += 0.001
    _take(st, BATCH, nbytes=big)
    assert st._window == STREAM_WINDOW  # no room to double
    # small items grow it...
    st, grants = _state(0.1, clock)
    taken = 0
    for _ in range(3):
        clock.now += 0.001
        n = st._window // 2
        _take(st, n, nbytes=100)
        taken += n
    assert st._window == STREAM_WINDOW * 8
    assert STREAM_WINDOW + sum(grants) - taken == st._window  # the producer's credit: one window
    # ...then they grow to 1 MiB: the window comes back to what 8 MiB holds (never under 16), by
    # keeping back credit the producer already has, and the producer's credit follows it down
    for _ in range(60):
        clock.now += 0.001
        _take(st, BATCH, nbytes=1 << 20)
        taken += BATCH
    assert st._window == max(STREAM_WINDOW, STREAM_WINDOW_BYTES // (1 << 20)) and st._withheld == 0
    assert STREAM_WINDOW + sum(grants) - taken == st._window


@pytest.mark.parametrize("producer_cap", [STREAM_WINDOW, 24, MAX_STREAM_WINDOW])
def test_a_producer_holding_less_credit_than_granted_never_stalls_the_stream(clock, producer_cap):
    """An older producer clamps its credit at 16, a newer one by the bytes of its items: the
    consumer grants every eight items taken, so the producer is never left without credit while
    the consumer waits for a batch it cannot send (a window of 64 granted in halves would)."""
    st = refs._StreamState(rt=None)
    credit = [STREAM_WINDOW]

    def grant(n: int) -> None:
        credit[0] = min(producer_cap, credit[0] + n)

    st._bind(grant, lambda: None, lambda: 0.1)
    queue, sent, got = 0, 0, 0
    while got < 5000:
        if queue == 0:
            if credit[0] == 0:
                pytest.fail(f"stalled after {got} items: the producer has no credit, the consumer no item")
            n = credit[0]  # the producer sends what its credit allows, at once
            credit[0] -= n
            queue += n
            sent += n
            st._starved = True
        clock.now += 0.0001
        st._push(object(), 100)
        st._items.popleft()
        queue -= 1
        got += 1
        st._took_one()
    assert got == 5000 and st._window > STREAM_WINDOW  # it grew, and went on
