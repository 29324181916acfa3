"""Regression tests for bugs found in a code review of the actor runtime (issue 3).

Each test asserts the correct behaviour of one finding; most run twice, against an actor on the
caller's own node (``local``) and on a second node over TCP (``remote``). Every wait is bounded:
a test that meets the bug fails within a few seconds instead of hanging (calls that could block
the test thread itself run in a helper thread, see ``bounded``).

The actor classes live in tests/support/review_actors.py (allow-list pattern ``review_actors.*``).
"""

import gc
import threading
import time

import pytest

import lattica
import review_actors as ra
from lattica.errors import (
    ActorNotFound,
    ActorDied,
    LatticaError,
    MethodNotFound,
    NodeClosed,
    PeerUnreachable,
    RemoteError,
    SpawnError,
    Timeout,
)
from helpers import Where, wait_for

pytestmark = pytest.mark.timeout(60)

TCP = "/ip4/127.0.0.1/tcp/0"
ALLOW = ["sample_actors.*", "review_actors.*"]
SPAWNER_METHODS = {"spawn": "async", "kill": "async", "lookup": "async", "names": "async"}


# -- helpers -----------------------------------------------------------------------------------



def bounded(fn, timeout=5.0, what="the call"):
    """Run ``fn`` in a daemon thread; its result, or its exception re-raised here. Fails the test
    if it has not returned within ``timeout`` s (the thread is left behind: it is a hang)."""
    box = []

    def run():
        try:
            box.append((True, fn()))
        except BaseException as e:  # noqa: BLE001 -- re-raised in the test thread
            box.append((False, e))

    th = threading.Thread(target=run, daemon=True, name="bounded-test-call")
    th.start()
    th.join(timeout)
    if th.is_alive():
        pytest.fail(f"{what} did not return within {timeout} s (it hangs)")
    ok, value = box[0]
    if not ok:
        raise value
    return value


def fails_without_timeout(fn, timeout=5.0, what="the call"):
    """``fn`` must raise promptly, and not because a wait ran out; returns the exception."""
    try:
        value = bounded(fn, timeout, what)
    except Timeout as e:  # CallTimeout included: a mismatch must be reported, not waited out
        pytest.fail(f"{what} only timed out ({type(e).__name__}: {e}) instead of failing")
    except Exception as e:  # noqa: BLE001
        return e
    pytest.fail(f"{what} returned {value!r} instead of raising")


async def _aiter(values):
    for v in values:
        yield v


def spawner_names(peer_id):
    ref = lattica.ActorRef(peer_id, "spawner", SPAWNER_METHODS)
    return ref.names.remote().result(5)


def spawn_via_spawner(caller, peer_id, path, args, name):
    """Ask ``peer_id``'s spawner to create ``path`` exactly as ``ActorClass.remote`` does (a call
    made on the caller's loop), waiting for the answer."""
    rt = caller._host.runtime
    spawner = lattica.ActorRef(peer_id, "spawner", SPAWNER_METHODS)

    async def go():
        return await rt.call(spawner, "spawn", (path, args, None, name, {}), {}, timeout=5)

    return caller.run(go(), timeout=6)





@pytest.fixture
def node():
    """The default node (``lattica.init``), admitting the sample and the review actors."""
    lattica.shutdown()
    n = lattica.init(allow=ALLOW)
    try:
        yield n
    finally:
        lattica.shutdown()


@pytest.fixture(params=["local", "remote"])
def where(request, node):
    if request.param == "local":
        yield Where("local", node, node)
    else:
        with lattica.Node([TCP], allow=ALLOW) as b:
            node.connect(b.addrs[0])
            yield Where("remote", node, b)


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
    got = bounded(lambda: lattica.get([p.aping.remote() for _ in range(8)], timeout=5), 8, "8 calls after 20 timed-out ones")
    assert got == ["pong"] * 8


def test_cancelled_calls_return_their_mailbox_credit(where, token):
    p = where.spawn(ra.Probe, window=8)
    assert p.aping.remote().result(5) == "pong"
    started = 0
    for rnd in range(5):  # 20 running calls cancelled, 4 at a time (each batch fits the window)
        futs = [p.forever.remote(token) for _ in range(4)]
        started += 4
        assert wait_for(lambda: ra.COUNTS[token] >= started), f"round {rnd}: calls never started (credit leaked by earlier cancels)"
        for f in futs:
            assert f.cancel()
        assert wait_for(lambda: all(f.done() for f in futs))
    # every one of the 20 calls is over: the whole window of 8 is free again
    got = bounded(lambda: lattica.get([p.aping.remote() for _ in range(8)], timeout=5), 8, "8 calls after 20 cancelled ones")
    assert got == ["pong"] * 8


# -- 2. the peer dies while calls wait beyond the window ---------------------------------------


def test_peer_death_fails_calls_in_flight_and_calls_queued_at_the_caller(node, token):
    b = lattica.Node([TCP], allow=ALLOW).start()
    try:
        node.connect(b.addrs[0])
        p = ra.Probe.options(node=b.peer_id, window=4).remote()
        assert p.aping.remote().result(5) == "pong"

        async def issue():  # on the loop: no thread gate, 6 calls simply wait for credit
            return [p.forever.remote(token) for _ in range(10)]

        futs = node.run(issue(), timeout=5)
        assert wait_for(lambda: ra.COUNTS[token] >= 4)
        time.sleep(0.05)
        assert not any(f.done() for f in futs)
    finally:
        bounded(b.stop, 15, "stopping the peer")
    assert wait_for(lambda: all(f.done() for f in futs), 5), f"{sum(not f.done() for f in futs)} of 10 calls still pending 5 s after their peer stopped"
    for f in futs:
        with pytest.raises((PeerUnreachable, ActorDied)):
            f.result(0)


# -- 3. exception types that are awkward to rebuild ------------------------------------------


@pytest.mark.parametrize("method,type_name", [("bad_decode", "UnicodeDecodeError"), ("abad_decode", "UnicodeDecodeError"), ("group", "ExceptionGroup"), ("agroup", "ExceptionGroup")])
def test_awkward_exception_types_become_remote_errors_and_the_channel_keeps_working(where, method, type_name):
    p = where.spawn(ra.Probe)
    with pytest.raises(RemoteError) as ei:
        getattr(p, method).remote().result(5)
    assert ei.value.type_name == type_name
    # the same ref, the same channel: still answering
    assert p.ping.remote().result(5) == "pong"
    assert p.aping.remote().result(5) == "pong"
    assert lattica.get([p.aping.remote() for _ in range(5)], timeout=5) == ["pong"] * 5


# -- 4. asyncio structure inside async methods ---------------------------------------------------


def test_asyncio_timeout_inside_a_method(where):
    p = where.spawn(ra.Probe)
    assert p.with_timeout.remote().result(5) == "timed-out"
    time.sleep(0.1)  # past the timeout's own deadline
    assert lattica.get([p.aping.remote() for _ in range(5)], timeout=5) == ["pong"] * 5
    assert p.with_timeout.remote().result(5) == "timed-out"
    assert p.ping.remote().result(5) == "pong"


def test_task_group_inside_a_method(where):
    p = where.spawn(ra.Probe)
    assert p.task_group.remote().result(5) == [10, 20]
    assert lattica.get([p.aping.remote() for _ in range(5)], timeout=5) == ["pong"] * 5


def test_current_task_inside_concurrent_async_methods(where):
    p = where.spawn(ra.Probe)
    a, b = p.task_probe.remote("a", 0.1), p.task_probe.remote("b", 0.1)
    assert lattica.get([a, b], timeout=5) == [True, True], "asyncio.current_task() is None inside an async method"
    assert p.tasks_distinct.remote("a", "b").result(5) == [True, True, True], "two concurrent calls share one current task"


# -- 5. several calls awaiting one future ------------------------------------------------------


def test_concurrent_calls_awaiting_one_shared_future(where):
    p = where.spawn(ra.Probe)

    async def issue():  # three calls started in one loop iteration
        return [p.wait_ready.remote() for _ in range(3)]

    p.make_ready.remote().result(5)
    futs = where.me.run(issue(), timeout=5)
    time.sleep(0.1)
    p.set_ready.remote("go").result(5)
    assert lattica.get(futs, timeout=5) == ["go"] * 3
    # the same from a plain thread
    p.make_ready.remote().result(5)
    futs = [p.wait_ready.remote() for _ in range(3)]
    time.sleep(0.1)
    p.set_ready.remote("again").result(5)
    assert lattica.get(futs, timeout=5) == ["again"] * 3


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


# -- 7. abandoned and closed streams ---------------------------------------------------------


@pytest.mark.parametrize("method", ["gen", "agen"])
def test_abandoned_stream_does_not_hold_the_actor(where, token, method):
    g = where.spawn(ra.Gens, window=2)
    assert g.ping.remote().result(5) == "pong"
    for k in range(3):  # more abandoned streams than the window holds

        def abandon(tok=f"{token}-{k}"):
            for x in getattr(g, method).stream(tok, 1000):
                return x  # the stream is dropped here, mid-way

        assert bounded(abandon, 5, f"starting stream {k}") == 0
        gc.collect()
        t0 = time.monotonic()
        assert g.ping.remote().result(5) == "pong", f"after {k + 1} abandoned stream(s)"
        assert g.aping.remote().result(5) == "pong"
        assert time.monotonic() - t0 < 2.0


@pytest.mark.parametrize("method", ["gen", "agen"])
def test_stream_close_stops_the_producer(where, token, method):
    g = where.spawn(ra.Gens)
    s = getattr(g, method).stream(token, 1000)
    assert callable(getattr(s, "close", None)), "StreamCall has no close()"
    it = iter(s)
    assert [next(it) for _ in range(3)] == [0, 1, 2]
    s.close()
    assert ra.event(token + ":closed").wait(5), "the producer was not closed"
    n = ra.COUNTS[token]
    time.sleep(0.2)
    assert ra.COUNTS[token] == n < 100
    assert g.ping.remote().result(5) == "pong"


# -- 8. tell on a generator method ---------------------------------------------------------------


def test_tell_on_a_generator_method_is_a_type_error(where, token):
    g = where.spawn(ra.Gens)
    with pytest.raises(TypeError):
        g.gen.tell(token, 3)
    with pytest.raises(TypeError):
        g.agen.tell(token, 3)
    assert g.ping.remote().result(5) == "pong"


# -- 9. tells to an actor that does not exist ------------------------------------------------


def test_tells_to_an_unknown_actor_do_not_leak_credit(where):
    ghost = lattica.ActorRef(where.node.peer_id, "nobody", {"f": "async"}, 4)

    def tells():
        for _ in range(20):
            ghost.f.tell()

    bounded(tells, 5, "20 tells to an unknown actor (window 4)")
    real = where.spawn(ra.Nobody, name="nobody", window=4)
    assert bounded(lambda: real.f.remote().result(5), 6, "a call to the new 'nobody'") == "f"
    got = bounded(lambda: lattica.get([ghost.f.remote() for _ in range(8)], timeout=5), 6, "calls through the hand-built ref")
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
    got = bounded(lambda: lattica.get([p.aping.remote() for _ in range(4)], timeout=5), 6, "calls from a thread after cancelled ones")
    assert got == ["pong"] * 4


# -- 11. a client stream whose source raises ---------------------------------------------------


def test_client_stream_source_that_raises_fails_the_call(where):
    g = where.spawn(ra.Gens)

    async def broken():
        for i in range(3):
            yield i
        raise RuntimeError("source broke")

    fut = g.total.remote(broken())
    assert wait_for(fut.done, 5), "the call is still pending 5 s after its argument stream raised"
    assert fut.cancelled() or fut.exception() is not None
    assert g.total.remote(_aiter([1, 2, 3])).result(5) == 6
    assert g.ping.remote().result(5) == "pong"


# -- 12. the allow-list admits actor classes only ----------------------------------------------


@pytest.fixture(params=["local", "remote", "remote-loose-pattern"])
def spawn_target(request, node):
    """(caller, target node): the caller's own node, a peer allowing ``review_actors.*``, or a
    peer whose pattern ``review_actors*`` also matches ``review_actors:<anything>``."""
    if request.param == "local":
        yield node, node
        return
    allow = ["review_actors.*"] if request.param == "remote" else ["review_actors*"]
    with lattica.Node([TCP], allow=allow) as b:
        node.connect(b.addrs[0])
        yield node, b


def test_allow_list_cannot_be_bypassed_to_non_actor_classes(spawn_target, tmp_path):
    caller, target = spawn_target
    marker = tmp_path / "spawned"
    for path in ("review_actors:subprocess.Popen", "review_actors.subprocess.Popen"):
        with pytest.raises(SpawnError):
            spawn_via_spawner(caller, target.peer_id, path, [["touch", str(marker)]], "x")
    time.sleep(0.3)
    assert not marker.exists(), "a process was started through the spawner"
    assert "x" not in spawner_names(target.peer_id)


def test_undecorated_class_is_not_spawnable(spawn_target):
    caller, target = spawn_target
    with pytest.raises(SpawnError):
        spawn_via_spawner(caller, target.peer_id, "review_actors.Plain", [], "plain")
    assert "plain" not in spawner_names(target.peer_id)


def test_on_stop_is_not_a_remote_method(where, token):
    r = where.spawn(ra.WithOnStop, token)
    assert r.ping.remote().result(5) == "pong"
    assert "on_stop" not in r.methods
    assert "on_stop" not in lattica.get_actor(r.name, node=where.node.peer_id).methods
    forged = lattica.ActorRef(where.node.peer_id, r.name, {"on_stop": "sync"})
    with pytest.raises(MethodNotFound):
        forged.on_stop.remote().result(5)
    assert ra.RECORDS[token] == []  # the hook did not run
    assert r.ping.remote().result(5) == "pong"


# -- 13. a ref whose method table lies about streaming -------------------------------------------


def test_stream_of_a_unary_method_claimed_as_generator_is_an_error(where):
    p = where.spawn(ra.Probe)
    assert p.ping.remote().result(5) == "pong"
    forged = lattica.ActorRef(where.node.peer_id, p.name, {"aping": "agen", "ping": "gen"})
    for m in ("aping", "ping"):
        err = fails_without_timeout(lambda m=m: list(getattr(forged, m).stream()), 5, f"streaming unary {m}")
        assert isinstance(err, (LatticaError, TypeError)), err
    assert p.aping.remote().result(5) == "pong"


def test_unary_call_of_a_generator_claimed_as_unary_is_an_error(where, token):
    g = where.spawn(ra.Gens)
    assert g.ping.remote().result(5) == "pong"
    forged = lattica.ActorRef(where.node.peer_id, g.name, {"agen": "async", "gen": "sync"})
    for m in ("agen", "gen"):
        err = fails_without_timeout(lambda m=m: getattr(forged, m).remote(token, 3).result(5), 6, f"unary call of generator {m}")
        assert isinstance(err, (LatticaError, TypeError)), err
    assert g.ping.remote().result(5) == "pong"


# -- 14. calls after shutdown ----------------------------------------------------------------------


def test_calls_through_a_ref_after_its_node_stopped(node):
    p = ra.Probe.remote()
    assert p.aping.remote().result(5) == "pong"
    node.stop()
    with pytest.raises((NodeClosed, PeerUnreachable)):
        bounded(lambda: p.aping.remote().result(2), 3, "a call after node.stop()")


def test_calls_to_a_stopped_peer_fail_promptly(node):
    b = lattica.Node([TCP], allow=ALLOW).start()
    try:
        node.connect(b.addrs[0])
        p = ra.Probe.options(node=b.peer_id).remote()
        assert p.aping.remote().result(5) == "pong"
    finally:
        bounded(b.stop, 15, "stopping the peer")
    with pytest.raises((NodeClosed, PeerUnreachable, ActorDied)):
        bounded(lambda: p.aping.remote().result(2), 3, "a call to a stopped peer")


# -- 15. Future.exception with a timeout -----------------------------------------------------------


def test_future_exception_with_timeout_on_a_pending_future(node, token):
    p = ra.Probe.remote()
    fut = p.forever.remote(token)
    t0 = time.monotonic()
    with pytest.raises(Timeout):
        fut.exception(timeout=0.1)
    assert time.monotonic() - t0 < 2.0
    assert not fut.done()
    fut.cancel()


def test_thread_waiting_for_mailbox_room_is_released_when_the_node_stops():
    """A plain thread blocked on a full window (the actor's only slot is held by a call that never
    returns) is released with NodeClosed when the node stops, not left hanging: shutdown fails
    the queued calls, which frees their slots, and the released caller finds the node closed."""
    from lattica.errors import NodeClosed

    lattica.init(allow=["review_actors.*"])
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


def test_async_kill_and_get_actor_from_async_methods_and_other_loops(where):
    """akill / aget_actor work on a node loop (inside an async actor method, where the blocking
    forms would refuse) and from any other event loop."""
    import asyncio

    victim = where.spawn(ra.Probe, name="victim-" + str(time.monotonic_ns()))
    assert victim.aping.remote().result(5) == "pong"
    boss = ra.Manager.remote()  # on the caller's own node
    found = boss.find.remote(victim.name, str(where.node.peer_id)).result(5)
    assert found == victim and found.peer_id == where.node.peer_id
    assert boss.stop.remote(found).result(5) == "killed"
    with pytest.raises(ActorNotFound):
        victim.aping.remote().result(5)

    other = where.spawn(ra.Probe, name="other-" + str(time.monotonic_ns()))

    async def from_another_loop():
        ref = await lattica.aget_actor(other.name, node=where.node.peer_id)
        await lattica.akill(ref)
        return ref

    assert asyncio.run(from_another_loop()) == other
    with pytest.raises(ActorNotFound):
        lattica.get_actor(other.name, node=where.node.peer_id)
