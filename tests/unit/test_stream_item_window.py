"""A stream's item window (lattica._runtime.window.ItemWindow, as a streaming call's results
(refs._StreamState) and a streamed argument (local.ArgStream) keep it, and SentItems, as their
producers do): credit in batches of half a window, doubled when a consumer that ran out of items
took half a window within a round trip, bounded in items and in bytes (exactly: grants say how
many items were taken, the producer sends only while what was not taken is under 16 items or
8 MiB, and the consumer cuts off a producer that does not)."""

from __future__ import annotations

import asyncio

import pytest

from lattica._runtime import local, refs, window
from lattica._runtime.limits import MAX_STREAM_WINDOW, STREAM_WINDOW, STREAM_WINDOW_BYTES
from lattica.errors import ProtocolError

BATCH = STREAM_WINDOW // 2


class _Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock(monkeypatch):
    c = _Clock()
    monkeypatch.setattr(window.time, "monotonic", c)
    return c


def _state(rtt: float | None, clock: _Clock) -> tuple[refs._StreamState, list[int]]:
    """A result stream's consumer state, and the credit of the grants it sends (each grant's
    items taken are checked: always the batch of 8 it was made for)."""
    st = refs._StreamState(rt=None)  # (the credit logic never touches the runtime)
    grants: list[int] = []

    def grant(n: int, taken: int) -> None:
        assert taken == BATCH and n >= taken
        grants.append(n)

    st._bind(grant, lambda: None, lambda: rtt)
    return st, grants


def _take(st: refs._StreamState, n: int, nbytes: int = 100, starved: bool = True) -> None:
    for _ in range(n):
        st._push(object(), nbytes)
        st._items.popleft()
        if starved:
            st._credit.starved = True
        st._took_one()


def test_credit_goes_back_every_eight_items_and_a_slow_consumer_never_grows_the_window(clock):
    st, grants = _state(0.1, clock)
    for _ in range(10):
        clock.now += 0.2  # eight items take two round trips: the producer is not held back
        _take(st, BATCH)
    assert grants == [BATCH] * 10 and st._credit.window == STREAM_WINDOW


def test_a_starved_consumer_held_back_by_credit_doubles_the_window_up_to_the_cap(clock):
    st, grants = _state(0.1, clock)
    windows = [st._credit.window]
    while st._credit.window < MAX_STREAM_WINDOW:
        clock.now += 0.001  # half a window within a millisecond: far above what it lets through
        before, g = st._credit.window, len(grants)
        _take(st, before // 2)
        assert (
            all(x == BATCH for x in grants[g:-1]) and grants[-1] == BATCH + before
        )  # batches of 8, then a window more
        windows.append(st._credit.window)
    assert windows == [STREAM_WINDOW * 2**i for i in range(len(windows))] and windows[-1] == MAX_STREAM_WINDOW
    clock.now += 0.001
    g = len(grants)
    _take(st, MAX_STREAM_WINDOW // 2)
    assert grants[g:] == [BATCH] * (MAX_STREAM_WINDOW // 2 // BATCH) and st._credit.window == MAX_STREAM_WINDOW


def test_growth_stops_where_the_items_come_slower_than_half_the_window_allows(clock):
    """At 800 items/s over a 100 ms path the window grows while half a window comes within 1.5
    round trips (a third of what the window lets through is below the rate): 128 (427/s) grows,
    256 (853/s) stays."""
    st, grants = _state(0.1, clock)
    for _ in range(50):
        clock.now += 0.01
        _take(st, BATCH)
    assert st._credit.window == 256


def test_items_taken_from_a_full_buffer_do_not_grow_it(clock):
    """The producer ran ahead while we were busy: taking the backlog fast is no sign of a window
    that holds it back."""
    st, grants = _state(0.1, clock)
    for _ in range(5):
        clock.now += 0.0001
        _take(st, BATCH, starved=False)
    assert st._credit.window == STREAM_WINDOW and grants == [BATCH] * 5


def test_no_round_trip_known_no_growth(clock):
    st, grants = _state(None, clock)
    clock.now += 0.0001
    _take(st, BATCH)
    assert st._credit.window == STREAM_WINDOW


def test_the_window_holds_at_most_its_bytes_and_comes_down_when_items_grow(clock):
    st, grants = _state(0.1, clock)
    big = STREAM_WINDOW_BYTES // STREAM_WINDOW  # 16 items of this size fill the byte budget
    clock.now += 0.001
    _take(st, BATCH, nbytes=big)
    assert st._credit.window == STREAM_WINDOW  # no room to double
    st, grants = _state(0.1, clock)
    for _ in range(3):  # small items grow it...
        clock.now += 0.001
        _take(st, st._credit.window // 2, nbytes=100)
    assert st._credit.window == STREAM_WINDOW * 8
    for _ in range(40):  # ...and 1 MiB ones bring it back to what 8 MiB holds (never under 16)
        clock.now += 0.001
        _take(st, BATCH, nbytes=1 << 20)
    assert st._credit.window == max(STREAM_WINDOW, STREAM_WINDOW_BYTES // (1 << 20))
    assert grants[-5:] == [BATCH] * 5  # credit still goes back every 8 items: nothing is kept back


class _Producer:
    """A model of a producer: a current one (``window.SentItems``: it learns what was taken,
    sends only while ``may_send`` and clamps its credit at ``cap``), an older result producer
    (credit clamped at 16, every grant counted as taken), an older argument producer
    (``"unclamped"``: it takes all the credit granted), or a hostile one (``"hostile"``: all
    the credit granted, and no regard for what waits unread)."""

    def __init__(self, old: bool | str) -> None:
        self.old, self.credit, self.items = old, STREAM_WINDOW, window.SentItems()

    def cap(self) -> int:
        if self.old in ("unclamped", "hostile"):
            return 1 << 40
        return STREAM_WINDOW if self.old else self.items.cap()

    def grant(self, n: int, taken: int) -> None:
        self.items.taken(taken if not self.old else n)
        self.credit = min(self.credit + n, max(self.credit, self.cap()))

    def may_send(self) -> bool:
        return self.credit > 0 and (self.old == "hostile" or self.items.may_send())

    def send(self, nbytes: int) -> None:
        self.credit -= 1
        self.items.sent(nbytes)
        self.credit = min(self.credit, self.cap())


def _play(
    sizes: list[int],
    old: bool | str,
    clock: _Clock,
    rtt: float | None = 0.1,
    slow: int = 0,
    lag: int = 0,
    slow_from: int = 0,
) -> refs._StreamState:
    """Stream ``sizes`` from the model producer to a real consumer state, the producer sending
    all it may whenever the consumer has run dry (or, with ``slow``, after every ``slow`` items
    taken from the ``slow_from``-th on: a consumer slower than its producer); grants reach the
    producer ``lag`` items taken after they were made (grants on the way). Fails on a stall or
    a cut-off (but for a hostile producer, whose cut-off ends the play). The state's ``peak``
    is the most bytes it held unread, its ``widest`` the widest window it had."""
    st = refs._StreamState(rt=None)
    prod = _Producer(old)
    on_way: list[tuple[int, int, int]] = []  # (due at this many items taken, n, taken)
    got = 0
    st._bind(lambda n, taken: on_way.append((got + lag, n, taken)), lambda: None, lambda: rtt)
    i = peak = widest = 0
    while got < len(sizes):
        while on_way and (on_way[0][0] <= got or not st._items):
            prod.grant(*on_way.pop(0)[1:])
        if not st._items or (slow and got >= slow_from and got % slow == 0):
            if not st._items and (not prod.may_send() or i == len(sizes)):
                pytest.fail(f"stalled after {got} of {len(sizes)} items (producer: {old})")
            while prod.may_send() and i < len(sizes):
                prod.send(sizes[i])
                st._push(object(), sizes[i])
                i += 1
                if st._error is not None:
                    break
                peak = max(peak, st._credit.buffered)
            if old == "hostile" and st._error is not None:
                break
            if not st._items:
                continue
            st._credit.starved = True
            clock.now += (rtt or 0.1) / 2
        clock.now += 0.00001
        st._items.popleft()
        got += 1
        st._took_one()
        widest = max(widest, st._credit.window)
        assert st._error is None, st._error
    st.peak, st.widest = peak, widest
    return st


@pytest.mark.parametrize("old", [False, True, "unclamped"], ids=["producer", "older-producer", "unclamped-producer"])
@pytest.mark.parametrize(
    "sizes",
    [
        [100] * 5000,
        [100] * 200 + [1 << 20] * 200,  # a token stream, then large results
        [100] * 500 + [1 << 20] * 600 + [100] * 500,
        [100 if k % 4 else 300_000 for k in range(3000)],
    ],
    ids=["small", "small-then-large", "small-large-small", "mixed"],
)
def test_no_producer_ever_stalls_the_stream_or_is_cut_off(clock, sizes, old):
    """A current producer holds what its items not yet taken allow (8 MiB, or under 16 items)
    and grows with the window; older ones never see the window grow (grants that cannot say
    what was taken do not grow it: no round trip is given them) and clamp at 16 or not at
    all: credit goes back every 8 items taken, so after any grant the producer can send at
    least 8 and the stream never stalls, however fast or slow the consumer."""
    rtt = 0.1 if old is False else None
    st = _play(sizes, old, clock, rtt=rtt)
    if sizes == [100] * 5000:
        assert (st._credit.window > STREAM_WINDOW) == (old is False)  # it grew on the way, where it may
    _play(sizes, old, clock, rtt=rtt, slow=3)


@pytest.mark.parametrize("big", [1 << 20, 4 << 20, 60 << 20])
@pytest.mark.parametrize("lag", [0, 40, 200])
def test_items_that_grow_after_the_window_grew_wait_within_eight_mib_or_sixteen_items(clock, big, lag):
    """Small items grow the window to hundreds; then the items become ``big`` and the consumer
    is slower than its producer, with grants reaching the producer ``lag`` items late: the
    producer knows what was taken (not only what was granted), so what waits unread stays under
    8 MiB plus one item, or 16 items, and the consumer's own check never fires."""
    st = _play([1000] * 4000 + [big] * 60, False, clock, slow=3, lag=lag, slow_from=4000)
    assert st.widest > STREAM_WINDOW * 4  # (the window had grown)
    assert st.peak <= max(STREAM_WINDOW_BYTES + big, STREAM_WINDOW * big), st.peak / 2**20


@pytest.mark.parametrize("big", [1 << 20, 60 << 20])
def test_a_producer_that_spends_a_grown_window_on_big_items_is_cut_off(clock, big):
    """A hostile producer grows the window with tiny items, then spends its credit on big ones
    while the consumer does not read: once 16 items holding 8 MiB wait unread, its next item
    ends the stream (ProtocolError), so it never holds more than that plus one item."""
    sizes = [100] * 3000 + [big] * 600
    st = _play(sizes, "hostile", clock, slow=3, slow_from=3000)
    assert isinstance(st._error, ProtocolError) and "waited unread" in str(st._error)
    assert st.peak <= max(STREAM_WINDOW_BYTES + big, STREAM_WINDOW * big), st.peak / 2**20


def test_a_producer_sending_beyond_its_credit_is_cut_off(clock):
    st = refs._StreamState(rt=None)
    cancelled = []
    st._bind(lambda n, taken: None, lambda: cancelled.append(True), lambda: 0.1)
    for _ in range(STREAM_WINDOW):
        st._push(object(), 100)
    assert st._error is None
    st._push(object(), 100)  # the 17th, never granted
    assert isinstance(st._error, ProtocolError) and cancelled == [True]
    assert len(st._items) == STREAM_WINDOW  # what it was granted is still there to take


def _arg_stream(rtt: float | None) -> tuple[local.ArgStream, list[int]]:
    grants: list[int] = []

    def grant(n: int, taken: int) -> None:
        assert taken == BATCH and n >= taken
        grants.append(n)

    return local.ArgStream(grant, lambda: rtt), grants


def test_a_streamed_argument_s_window_grows_on_a_long_path_as_a_result_stream_s_does(clock):
    """The callee consumes a streamed argument under the same rule: starved and fast, the window
    doubles (grants of 8, then a window more), up to the cap; with no round trip known it stays."""

    async def consume(s: local.ArgStream, n: int) -> None:
        for _ in range(n):
            s._push(object(), 100)
            clock.now += 0.0001
            await s.__anext__()
            s._credit.starved = True  # (it found nothing more waiting)

    s, grants = _arg_stream(0.1)
    asyncio.run(consume(s, 3000))
    assert s._credit.window == 512 and sum(grants) > 3000 and max(grants) == BATCH + 256
    s, grants = _arg_stream(None)
    asyncio.run(consume(s, 200))
    assert s._credit.window == STREAM_WINDOW and grants == [BATCH] * 25


def test_a_caller_sending_streamed_argument_items_beyond_its_credit_or_after_the_end_is_cut_off(clock):
    s, grants = _arg_stream(0.1)
    for _ in range(STREAM_WINDOW):
        s._push(object(), 100)
    with pytest.raises(ProtocolError):
        s._push(object(), 100)
    s, grants = _arg_stream(0.1)
    s._push(object(), 100)
    s._end()
    with pytest.raises(ProtocolError, match="after its end"):
        s._push(object(), 100)


class _RecordingSink(local.Sink):
    """A remote caller as a sync generator's items reach it: each item is 1 MiB encoded, and
    must go only while the producer may send (what the consumer checks)."""

    def __init__(self) -> None:
        self.inv: local.Invocation | None = None
        self.got: list = []

    def item(self, value) -> int:
        assert self.inv.sent_items.may_send(), "an item went while 16 items of 8 MiB or more were not taken"
        self.got.append(value)
        return 1 << 20

    def end(self) -> None:
        self.got.append("END")

    def err(self, kind: str, type_name: str, message: str, tb: str = "") -> None:
        self.got.append(("ERR", type_name))


def test_a_sync_generator_s_items_wait_on_the_loop_while_too_much_is_not_taken():
    """A sync generator's thread runs ahead of the loop by the credit it holds: items it handed
    over after the consumer's unread items reached 16 and 8 MiB wait on the loop (in order, its
    END, or the error it raised, behind them) and go as grants say items were taken; a cancel
    drops them."""
    from types import SimpleNamespace

    from lattica._identity import KeyPair

    loop = asyncio.new_event_loop()
    rt = SimpleNamespace(loop=loop, peer_id=KeyPair.generate().peer_id)
    actor = local.LocalActor(rt, "s", object, {"gen": "gen"}, 1, 16)
    sink = _RecordingSink()
    inv = sink.inv = local.Invocation(actor, "gen", [], None, None, sink, streaming=True)
    inv.credit = 100  # the window had grown (the thread took its credit from its semaphore)
    for i in range(40):
        actor._deliver_item(inv, i)
    assert sink.got == list(range(16)) and list(inv.held) == list(range(16, 40))
    actor._sync_done(inv, None, end=True)  # the generator ended: END waits behind its items
    actor.grant(inv, 8, 8)
    assert sink.got == list(range(24)) and type(inv.held[-1]) is local._Reply
    for _ in range(3):
        actor.grant(inv, 8, 8)
    assert sink.got == list(range(40)) + ["END"] and not inv.held
    inv3 = local.Invocation(actor, "gen", [], None, None, _RecordingSink(), streaming=True)
    inv3.sink.inv, inv3.credit = inv3, 100
    for i in range(20):
        actor._deliver_item(inv3, i)
    actor._sync_done(inv3, "remote", parts=("ValueError", "boom", ""))  # the generator raised: after its items too
    assert inv3.sink.got == list(range(16))
    actor.grant(inv3, 8, 8)
    assert inv3.sink.got == list(range(20)) + [("ERR", "ValueError")] and inv3.held is None
    inv2 = sink.inv = local.Invocation(actor, "gen", [], None, None, _RecordingSink(), streaming=True)
    inv2.sink.inv = inv2
    for i in range(20):
        actor._deliver_item(inv2, i)
    actor.cancel(inv2)
    assert inv2.held is None and inv2.replied
    loop.close()


def test_credit_granted_and_items_unread_never_exceed_the_widest_window(clock):
    """A producer that cycles tiny and big items makes the window grow, come down, and grow
    again: growth adds only what the window lacks (credit granted before it came down stays), so
    credit held plus items unread never exceed 512, and a flood of tiny items beyond that is cut
    off as credit it never had."""
    st, _ = _state(0.1, clock)
    for _ in range(40):
        for size in (100, 4 << 20):
            for _ in range(64):
                clock.now += 0.0001
                _take(st, BATCH, nbytes=size)
                assert st._credit._allowed + len(st._credit._sizes) <= MAX_STREAM_WINDOW
    for _ in range(st._credit._allowed):
        st._push(object(), 100)
    assert st._error is None and len(st._items) <= MAX_STREAM_WINDOW
    st._push(object(), 100)
    assert isinstance(st._error, ProtocolError)


def test_a_consumer_that_never_says_it_took_anything_gets_at_most_512_items():
    """Grants that say nothing was taken keep topping the producer's credit up, but it sends only
    while fewer than 512 of its items are not taken (and its credit stays within that too), so
    a consumer reading and discarding tiny items cannot make its bookkeeping grow."""
    items = window.SentItems()
    credit, sent = STREAM_WINDOW, 0
    for _ in range(5000):
        while credit > 0 and items.may_send():
            items.sent(12)
            credit -= 1
            sent += 1
        items.taken(0)
        credit = min(credit + 1000, max(credit, items.cap()))
    assert sent == MAX_STREAM_WINDOW and items.cap() == 0
    items.taken(8)
    assert items.may_send() and items.cap() == 8
