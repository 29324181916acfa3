"""A streaming call's item window (lattica.runtime.refs._StreamState): credit in batches of half
a window, doubled when a consumer that ran out of items took half a window within a round trip,
bounded in items and in bytes, shrunk (by keeping credit back) when items grow."""

from __future__ import annotations

import pytest

from lattica.runtime import refs
from lattica.runtime.limits import MAX_STREAM_WINDOW, STREAM_WINDOW, STREAM_WINDOW_BYTES


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


def test_credit_goes_back_in_half_windows_and_a_slow_consumer_never_grows_it(clock):
    st, grants = _state(0.1, clock)
    for _ in range(10):
        clock.now += 0.2  # half a window takes two round trips: the producer is not held back
        _take(st, STREAM_WINDOW // 2)
    assert grants == [STREAM_WINDOW // 2] * 10 and st._window == STREAM_WINDOW


def test_a_starved_consumer_taking_half_a_window_within_a_round_trip_doubles_it_up_to_the_cap(clock):
    st, grants = _state(0.1, clock)
    windows = [st._window]
    while st._window < MAX_STREAM_WINDOW:
        clock.now += 0.05
        before = st._window
        _take(st, before // 2)
        assert grants[-1] == before // 2 + before  # the batch, and the new half of the window
        windows.append(st._window)
    assert windows == [STREAM_WINDOW * 2**i for i in range(len(windows))] and windows[-1] == MAX_STREAM_WINDOW
    clock.now += 0.05
    _take(st, MAX_STREAM_WINDOW // 2)
    assert grants[-1] == MAX_STREAM_WINDOW // 2 and st._window == MAX_STREAM_WINDOW


def test_items_taken_from_a_full_buffer_do_not_grow_it(clock):
    """The producer ran ahead while we were busy: taking the backlog fast is no sign of a window
    that holds it back."""
    st, grants = _state(0.1, clock)
    for _ in range(5):
        clock.now += 0.001
        _take(st, STREAM_WINDOW // 2, starved=False)
    assert st._window == STREAM_WINDOW and grants == [STREAM_WINDOW // 2] * 5


def test_no_round_trip_known_no_growth(clock):
    st, grants = _state(None, clock)
    clock.now += 0.001
    _take(st, STREAM_WINDOW // 2)
    assert st._window == STREAM_WINDOW


def test_the_window_holds_at_most_its_bytes_and_shrinks_when_items_grow(clock):
    st, grants = _state(0.1, clock)
    big = STREAM_WINDOW_BYTES // STREAM_WINDOW  # 16 items of this size fill the byte budget
    clock.now += 0.05
    _take(st, STREAM_WINDOW // 2, nbytes=big)
    assert st._window == STREAM_WINDOW  # no room to double
    # small items grow it...
    st, grants = _state(0.1, clock)
    taken = 0
    for _ in range(3):
        clock.now += 0.05
        n = st._window // 2
        _take(st, n, nbytes=100)
        taken += n
    assert st._window == STREAM_WINDOW * 8
    assert STREAM_WINDOW + sum(grants) - taken == st._window  # the producer's credit: one window
    # ...then they grow to 1 MiB: the window comes back to what 8 MiB holds (never under 16), by
    # keeping back credit the producer already has, and the producer's credit follows it down
    for _ in range(40):
        clock.now += 0.05
        n = st._window // 2
        _take(st, n, nbytes=1 << 20)
        taken += n
    assert st._window == max(STREAM_WINDOW, STREAM_WINDOW_BYTES // (1 << 20)) and st._withheld == 0
    assert STREAM_WINDOW + sum(grants) - taken == st._window
