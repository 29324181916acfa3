"""Mailboxes are credit windows: calls that time out, are cancelled (even before they were sent)
or go to an unknown actor give their credit back; deep backlogs drain in order; a thread waiting
for room is released when the node stops. Each runs against a local and a remote actor."""

import threading
import time

import pytest

import call_actors as ra
import lattica
from call_fixtures import (
    bounded,
)
from helpers import wait_for
from lattica.errors import (
    NodeClosed,
)

pytestmark = pytest.mark.timeout(60)


# -- 1. cancelled and timed-out calls give their mailbox credit back ---------------------------


def test_timed_out_calls_return_their_mailbox_credit(where, token):
    p = where.spawn(ra.Probe, window=8)
    assert p.aping.remote().result(5) == "pong"

    def burst():  # 20 at once: 8 go out, the rest wait at the caller (and in its thread gate)
        futs = [p.forever.options(timeout=0.1).remote(token) for _ in range(20)]
        outcomes = []
        for f in futs:
            try:
                f.result(5)
                outcomes.append("returned")
            except Exception as e:  # noqa: BLE001
                outcomes.append(type(e).__name__)
        return outcomes

    assert bounded(burst, 10, "20 calls with timeout=0.1") == ["CallTimeout"] * 20
    # every one of the 20 calls is over: the whole window of 8 is free again
    got = bounded(
        lambda: lattica.get([p.aping.remote() for _ in range(8)], timeout=5), 8, "8 calls after 20 timed-out ones"
    )
    assert got == ["pong"] * 8


def test_cancelled_calls_return_their_mailbox_credit(where, token):
    p = where.spawn(ra.Probe, window=8)
    assert p.aping.remote().result(5) == "pong"
    started = 0
    for rnd in range(5):  # 20 running calls cancelled, 4 at a time (each batch fits the window)
        futs = [p.forever.remote(token) for _ in range(4)]
        started += 4
        assert wait_for(lambda: ra.COUNTS[token] >= started), (
            f"round {rnd}: calls never started (credit leaked by earlier cancels)"
        )
        for f in futs:
            assert f.cancel()
        assert wait_for(lambda: all(f.done() for f in futs))
    # every one of the 20 calls is over: the whole window of 8 is free again
    got = bounded(
        lambda: lattica.get([p.aping.remote() for _ in range(8)], timeout=5), 8, "8 calls after 20 cancelled ones"
    )
    assert got == ["pong"] * 8


# -- 6. deep backlogs ----------------------------------------------------------------------------


def test_deep_backlog_behind_a_slow_call(where, token):
    p = where.spawn(ra.Probe, max_concurrency=1, window=4096)
    assert p.aping.remote().result(5) == "pong"
    slow = p.hold.remote(token, 10)
    assert wait_for(lambda: ra.COUNTS[token + ":started"] >= 1)
    quick = [p.quick.remote(i) for i in range(3000)]
    time.sleep(0.3)  # all of them queued behind the slow call
    ra.event(token).set()
    assert slow.result(5) == "opened"
    assert lattica.get(quick, timeout=5) == list(range(3000))
    assert p.aping.remote().result(5) == "pong"


@pytest.mark.parametrize("method", ["quick", "squick"])
def test_many_quick_local_calls_behind_a_full_window(node, token, method):
    """A window of 200 filled by held calls; 3000 quick ones from one thread wait at the caller
    and must all go out and complete once the held calls return."""
    p = ra.Probe.options(window=200).remote()
    assert p.aping.remote().result(5) == "pong"
    held = [p.hold.remote(token, 10) for _ in range(200)]
    assert wait_for(lambda: ra.COUNTS[token + ":started"] >= 200)
    out = {}

    def run():
        try:
            out["values"] = lattica.get([getattr(p, method).remote(i) for i in range(3000)], timeout=5)
        except BaseException as e:  # noqa: BLE001
            out["error"] = e

    th = threading.Thread(target=run, daemon=True)
    th.start()
    time.sleep(0.3)  # the thread has filled the caller's queue and waits at its gate
    ra.event(token).set()
    th.join(10)
    assert not th.is_alive(), "the calling thread is stuck: calls were lost"
    assert lattica.get(held, timeout=5) == ["opened"] * 200
    if "error" in out:
        raise out["error"]
    assert out["values"] == list(range(3000))


# -- 9. tells to an actor that does not exist ------------------------------------------------


def test_tells_to_an_unknown_actor_do_not_leak_credit(where):
    ghost = lattica.ActorRef(where.node.peer_id, "nobody", {"f": "async"}, 4)

    def tells():
        for _ in range(20):
            ghost.f.tell()

    bounded(tells, 5, "20 tells to an unknown actor (window 4)")
    real = where.spawn(ra.Nobody, name="nobody", window=4)
    assert bounded(lambda: real.f.remote().result(5), 6, "a call to the new 'nobody'") == "f"
    got = bounded(
        lambda: lattica.get([ghost.f.remote() for _ in range(8)], timeout=5), 6, "calls through the hand-built ref"
    )
    assert got == ["f"] * 8


# -- 10. calls cancelled before they were sent ---------------------------------------------------


def test_calls_cancelled_before_they_are_sent_free_their_thread_gate_slot(where, token):
    p = where.spawn(ra.Probe, window=2)
    assert p.aping.remote().result(5) == "pong"
    held = [p.hold.remote(token, 10) for _ in range(2)]
    assert wait_for(lambda: ra.COUNTS[token + ":started"] >= 2)
    waiting = [p.aping.remote() for _ in range(2)]  # beyond the window: they wait at the caller
    time.sleep(0.1)
    assert not any(f.done() for f in waiting)
    for f in waiting:
        assert f.cancel()
    assert wait_for(lambda: all(f.cancelled() for f in waiting))
    ra.event(token).set()
    assert lattica.get(held, timeout=5) == ["opened"] * 2
    got = bounded(
        lambda: lattica.get([p.aping.remote() for _ in range(4)], timeout=5),
        6,
        "calls from a thread after cancelled ones",
    )
    assert got == ["pong"] * 4


def test_thread_waiting_for_mailbox_room_is_released_when_the_node_stops():
    """A plain thread blocked on a full window (the actor's only slot is held by a call that never
    returns) is released with NodeClosed when the node stops, not left hanging: shutdown fails
    the queued calls, which frees their slots, and the released caller finds the node closed."""

    lattica.init(allow=["call_actors.*"])
    released = threading.Event()
    outcome: list = []
    try:
        probe = ra.Probe.options(window=1).remote()
        assert probe.aping.remote().result(5) == "pong"
        probe.forever.remote("gate-" + str(time.monotonic()))  # holds the single slot

        def caller():
            try:
                for _ in range(3):  # 1 queued at the loop, then this thread waits in the gate
                    probe.aping.remote()
                outcome.append("returned")
            except NodeClosed:
                outcome.append("NodeClosed")
            except Exception as e:  # noqa: BLE001
                outcome.append(type(e).__name__)
            released.set()

        threading.Thread(target=caller, daemon=True).start()
        assert not released.wait(0.5), f"the caller was not held back: {outcome}"
    finally:
        lattica.shutdown()
    assert released.wait(5), "the waiting thread was never released"
    assert outcome == ["NodeClosed"], outcome
