"""Keyed token buckets (lattica._budget): burst, refill, per key, bounded table."""

import time

import pytest

from lattica._budget import Buckets


def test_burst_then_refill_per_key():
    t = [0.0]
    b = Buckets(rate=2.0, burst=3.0, clock=lambda: t[0])
    assert [b.take("a") for _ in range(4)] == [True, True, True, False]
    assert b.take("b")  # another key has its own bucket
    t[0] += 0.5  # one token back
    assert b.take("a") and not b.take("a")
    t[0] += 100.0  # refills up to the burst, no more
    assert [b.take("a") for _ in range(4)] == [True, True, True, False]


def test_a_refused_request_costs_nothing_and_costs_can_be_larger():
    t = [0.0]
    b = Buckets(rate=1.0, burst=4.0, clock=lambda: t[0])
    assert b.take(cost=3.0)
    assert not b.take(cost=2.0)  # 1 left: refused, still 1 left
    assert b.take(cost=1.0)


def test_the_table_is_bounded_and_forgets_the_least_recent_key():
    t = [0.0]
    b = Buckets(rate=0.0, burst=1.0, max_keys=3, clock=lambda: t[0])
    for k in "abc":
        assert b.take(k)
    assert not b.take("a")  # "a" is now the most recent
    assert b.take("d")  # "b" was forgotten to make room
    assert len(b) == 3
    assert b.take("b")  # ...and comes back with a full bucket, the most a forgotten key gains
    assert not b.take("a")


def test_bad_settings_are_refused():
    with pytest.raises(ValueError):
        Buckets(rate=-1, burst=1)
    with pytest.raises(ValueError):
        Buckets(rate=1, burst=0)


def test_wait_says_when_a_token_comes_and_force_runs_into_debt():
    now = [0.0]
    b = Buckets(rate=2.0, burst=2.0, clock=lambda: now[0])
    assert b.wait("k") == 0.0 and b.take("k") and b.take("k")
    assert b.wait("k") == 0.5 and not b.take("k")
    assert not b.take("k", force=True)  # charged anyway: one token in debt
    assert b.wait("k") == 1.0
    now[0] = 1.0
    assert b.take("k") and not b.take("k")


def test_strangers_share_one_budget_and_members_are_never_charged():
    from lattica._budget import StrangersShare

    t = [0.0]
    share = StrangersShare(10.0, 20.0, lambda peer: peer.startswith("s"), clock=lambda: t[0])
    taken = sum(share.take(f"s{i}") for i in range(100))  # a hundred identities: one budget
    assert taken == 20
    assert all(share.take("member") for _ in range(1000))
    t[0] = 1.0
    assert sum(share.take(f"s{i}", cost=2.0) for i in range(100)) == 5


def test_strangers_share_take_up_to_cuts_a_batch_to_what_is_left():
    from lattica._budget import StrangersShare

    t = [0.0]
    share = StrangersShare(10.0, 20.0, lambda peer: peer.startswith("s"), clock=lambda: t[0])
    assert share.take_up_to("s1", 15) == 15
    assert share.take_up_to("s2", 15) == 5  # another identity: the same share, 5 left
    assert share.take_up_to("s3", 1) == 0
    assert share.take_up_to("member", 10_000) == 10_000  # members are never cut
    t[0] = 0.5
    assert share.take_up_to("s1", 100) == 5


def test_turns_let_strangers_through_in_arrival_order_under_one_timer_and_members_at_once():
    import asyncio

    from lattica._budget import StrangersShare, Turns

    async def main() -> None:
        loop = asyncio.get_running_loop()
        share = StrangersShare(100.0, 1.0, lambda peer: peer != "member")
        turns = Turns(share, loop)
        assert await turns.take("s0")  # (the share held one: at once)
        order: list[str] = []

        async def one(peer: str) -> None:
            await turns.take(peer)
            order.append(peer)

        waiters = [asyncio.create_task(one(f"s{i}")) for i in range(1, 21)]
        await asyncio.sleep(0)
        assert len(turns) == 20
        timers = len(loop._scheduled)  # type: ignore[attr-defined]
        assert await asyncio.wait_for(turns.take("member"), 0.01)  # never queued behind strangers
        await asyncio.gather(*waiters)
        assert order == [f"s{i}" for i in range(1, 21)]  # in arrival order, one a 10 ms
        assert timers <= 2, timers  # (one for all the waiters; each used to sleep on its own)

        share._bucket._state[None] = [-1000.0, time.monotonic()]  # (10 s in debt)
        gave_up = await asyncio.wait_for(turns.take("s1", give_up=lambda: True, every=0.05), 1.0)
        assert gave_up is False
        assert await asyncio.wait_for(turns.take("member"), 0.01)
        # waiters that gave up are not counted, and do not pile up behind one still waiting
        head = asyncio.create_task(turns.take("s0"))
        await asyncio.sleep(0)
        quitters = await asyncio.gather(*(turns.take(f"q{i}", give_up=lambda: True, every=0.01) for i in range(200)))
        assert quitters == [False] * 200
        assert len(turns) == 1
        assert len(turns._queue) <= 65, len(turns._queue)
        # a waiter whose task is cancelled is not counted either
        cancelled = [asyncio.create_task(turns.take(f"c{i}")) for i in range(3)]
        await asyncio.sleep(0)
        assert len(turns) == 4
        for t in cancelled:
            t.cancel()
        await asyncio.gather(*cancelled, return_exceptions=True)
        assert len(turns) == 1
        head.cancel()

    asyncio.run(main())


def test_turns_wait_a_millisecond_at_least_between_serves_on_uvloop():
    """uvloop runs a timer of under half a millisecond at once, and the share's next token is
    often that close: the queue's timer then fired, found the token not yet due and armed again,
    spinning until it was (tens of wake-ups a token). A timer waits 1 ms at least, as asyncio's
    poll rounds it up."""
    import asyncio

    uvloop = pytest.importorskip("uvloop", reason="uvloop (the fast extra) is not installed")
    from lattica._budget import StrangersShare, Turns

    async def main() -> tuple[int, int]:
        loop = asyncio.get_running_loop()
        share = StrangersShare(3000.0, 1.0, lambda peer: True)  # (a token every third of a millisecond)
        turns = Turns(share, loop)
        serves = 0
        serve = turns._serve

        def counted() -> None:
            nonlocal serves
            serves += 1
            serve()

        turns._serve = counted  # type: ignore[method-assign]
        n = 100
        await asyncio.gather(*(turns.take(f"s{i}") for i in range(n)))
        return serves, n

    loop = uvloop.new_event_loop()
    try:
        serves, n = loop.run_until_complete(main())
    finally:
        loop.close()
    assert serves <= 2 * n, (serves, n)  # (before: ~80 a token)
