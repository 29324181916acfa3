"""The actor runtime in one process: the default node of ``lattica.init()`` plus extra nodes on
real TCP loopback sockets. Most behaviours run twice: against an actor on the caller's own node
(``local``, no network) and on another node (``remote``, through its spawner and the
``/lattica/rpc/1`` channel).

What happens inside actors is observed through ``sample_actors``' token-keyed records and events
(see tests/support/sample_actors.py)."""

import asyncio
import concurrent.futures
import pickle
import threading
import time

import numpy as np
import pytest

import lattica
import sample_actors as sa
from helpers import Where, wait_for
from lattica import _rpc as rpc
from lattica import codec
from lattica._runtime import ASYNC, STREAM_WINDOW
from lattica.errors import (
    ActorDied,
    ActorNotFound,
    CallTimeout,
    CodecError,
    FrameTooLarge,
    MailboxFull,
    MethodNotFound,
    PeerUnreachable,
    RemoteError,
    SpawnError,
    StreamReset,
    Timeout,
)

pytestmark = pytest.mark.timeout(60)

TCP = "/ip4/127.0.0.1/tcp/0"
ALLOW = ["sample_actors.*"]
RPC = rpc.PROTOCOL


@pytest.fixture
def peer(default_node):
    """A second node that admits the sample actors, connected to the default node."""
    with lattica.Node([TCP], allow=ALLOW) as b:
        default_node.connect(b.addrs[0])
        yield b


@pytest.fixture(params=["local", "remote"])
def where(request, default_node):
    if request.param == "local":
        yield Where("local", default_node, default_node)
    else:
        with lattica.Node([TCP], allow=ALLOW) as b:
            default_node.connect(b.addrs[0])
            yield Where("remote", default_node, b)


def spawner_names(peer_id):
    ref = lattica.ActorRef(peer_id, "spawner", {"names": "async"})
    return ref.names.remote().result(5)


# -- spawning ----------------------------------------------------------------------------------


def test_local_spawn_and_calls(default_node):
    c = sa.Counter.remote(5)
    assert isinstance(c, lattica.ActorRef)
    assert c.peer_id == default_node.peer_id
    assert c.incr.remote(2).result(5) == 7
    assert c.aincr.remote(3).result(5) == 10
    assert lattica.get(c.get.remote()) == 10
    assert c.name in spawner_names(default_node.peer_id)
    with pytest.raises(TypeError, match="cannot be instantiated directly"):
        sa.Counter(1)
    with pytest.raises(TypeError, match=r"\.remote"):
        c.incr(1)


def test_remote_spawn_goes_through_the_targets_spawner(default_node, peer):
    c = sa.Counter.options(node=peer.peer_id, name="remote-counter").remote(10)
    assert c.peer_id == peer.peer_id and c.name == "remote-counter"
    assert c.incr.remote(1).result(5) == 11
    assert c.aincr.remote(1).result(5) == 12
    # it lives on the peer (its spawner lists it), not here
    assert "remote-counter" in spawner_names(peer.peer_id)
    assert "remote-counter" not in spawner_names(default_node.peer_id)
    assert "remote-counter" in peer._host.runtime.actors
    # a PeerId given as a string works too; keyword arguments reach the constructor
    d = sa.Counter.options(node=str(peer.peer_id)).remote(start=100)
    assert d.get.remote().result(5) == 100


@lattica.actor
class Unlisted:
    """Defined in the test module: no node's allow-list admits it."""

    def ping(self):
        return "pong"


def _path(actor_class):
    return f"{actor_class.cls.__module__}.{actor_class.cls.__qualname__}"


def test_spawn_of_a_class_not_allowed_is_a_spawn_error_naming_the_class(default_node, peer):
    ref = Unlisted.options(node=peer.peer_id).remote()
    with pytest.raises(SpawnError, match="not allowed") as ei:
        ref.ping.remote().result(5)
    assert _path(Unlisted) in str(ei.value)
    # a narrower allow-list on another node: Counter admitted, Worker refused
    with lattica.Node([TCP], allow=["sample_actors.Counter"]) as narrow:
        default_node.connect(narrow.addrs[0])
        w = sa.Worker.options(node=narrow.peer_id).remote()
        with pytest.raises(SpawnError, match="not allowed") as ei:
            w.ping.remote().result(5)
        assert "sample_actors.Worker" in str(ei.value)
        c = sa.Counter.options(node=narrow.peer_id).remote(1)
        assert c.get.remote().result(5) == 1
        assert spawner_names(narrow.peer_id) == sorted(
            [
                "autonat",
                "checkpoints",
                "content",
                "dashboard",
                "dht",
                "holepunch",
                "membership",
                "pubsub",
                "shards",
                "spawner",
                c.name,
            ]
        )  # nothing else was created
    # a node with no allow-list admits nothing
    with lattica.Node([TCP]) as closed:
        default_node.connect(closed.addrs[0])
        c = sa.Counter.options(node=closed.peer_id).remote()
        with pytest.raises(SpawnError, match="sample_actors.Counter"):
            c.get.remote().result(5)
    # the peer keeps serving
    assert sa.Counter.options(node=peer.peer_id).remote(3).get.remote().result(5) == 3


class _Missing:
    def ping(self):
        return "pong"


_Missing.__module__ = "sample_actors"
_Missing.__qualname__ = "DoesNotExist"  # allowed by the pattern, absent from the module
MissingClass = lattica.actor(_Missing)


class _NoModule:
    def ping(self):
        return "pong"


_NoModule.__module__ = "no_such_module_for_lattica_tests"
_NoModule.__qualname__ = "Thing"
NoModuleClass = lattica.actor(_NoModule)


def test_spawn_of_a_class_that_cannot_be_imported_is_a_spawn_error(default_node):
    with lattica.Node([TCP], allow=ALLOW + ["no_such_module_for_lattica_tests.*"]) as b:
        default_node.connect(b.addrs[0])
        ref = MissingClass.options(node=b.peer_id).remote()
        with pytest.raises(SpawnError, match="cannot import") as ei:
            ref.ping.remote().result(5)
        assert "sample_actors.DoesNotExist" in str(ei.value)
        ref = NoModuleClass.options(node=b.peer_id).remote()
        with pytest.raises(SpawnError, match="cannot import") as ei:
            ref.ping.remote().result(5)
        assert "no_such_module_for_lattica_tests.Thing" in str(ei.value)
        assert spawner_names(b.peer_id) == [
            "autonat",
            "checkpoints",
            "content",
            "dashboard",
            "dht",
            "holepunch",
            "membership",
            "pubsub",
            "shards",
            "spawner",
        ]


def test_constructor_that_raises_fails_calls_through_the_ref_with_spawn_error(where):
    ref = where.spawn(sa.BadInit, "boom in init", 0.2)
    with pytest.raises(SpawnError, match="RuntimeError: boom in init") as ei:
        ref.ping.remote().result(5)  # waits for the constructor, then fails
    assert "sample_actors.py" in str(ei.value)  # the constructor's traceback
    # once the spawn's own outcome is known (a private future), every call fails the same way
    assert wait_for(lambda: ref._spawn is not None and ref._spawn.done())
    with pytest.raises(SpawnError, match="boom in init"):
        ref.ping.remote().result(5)
    assert ref.name not in spawner_names(where.node.peer_id)
    # the node keeps serving
    assert where.spawn(sa.Counter, 2).get.remote().result(5) == 2


def test_call_racing_a_failed_constructor_gets_spawn_error(default_node, token):
    ref = sa.BadInit.remote("late boom", 0.1, token)
    loop_busy = threading.Event()
    default_node._loop.call_soon_threadsafe(lambda: (loop_busy.set(), time.sleep(0.5)))  # a loaded loop
    assert loop_busy.wait(5)
    assert sa.event(token).wait(5)  # the constructor is raising now
    time.sleep(0.05)  # its failure is queued for the loop; our call queues behind it
    with pytest.raises(SpawnError, match="late boom"):
        ref.ping.remote().result(5)


# -- where methods run ---------------------------------------------------------------------------


def test_async_methods_run_on_the_node_loop_sync_methods_on_the_actors_own_thread(where):
    t = where.spawn(sa.Threads)
    loop_thread = where.node._host.thread_id
    assert t.loop_thread.remote().result(5) == loop_thread
    assert t.loop_thread_after_await.remote().result(5) == loop_thread
    sync_threads = {t.sync_thread.remote().result(5) for _ in range(5)}
    sync_threads |= set(lattica.get([t.sync_thread.remote() for _ in range(20)]))
    assert len(sync_threads) == 1
    (sync_thread,) = sync_threads
    assert sync_thread not in (loop_thread, threading.get_ident(), where.me._host.thread_id)
    # another actor has a thread of its own
    other = where.spawn(sa.Threads).sync_thread.remote().result(5)
    assert other not in (sync_thread, loop_thread)


def test_many_slow_async_calls_overlap(where):
    w = where.spawn(sa.Worker)
    t0 = time.monotonic()
    assert lattica.get([w.slow.remote(0.2) for _ in range(50)], timeout=10) == [0.2] * 50
    assert time.monotonic() - t0 < 2.0  # 50 * 0.2 s = 10 s if they ran one at a time


def test_max_concurrency_limits_running_async_calls(where):
    w = where.spawn(sa.Worker, max_concurrency=5)
    t0 = time.monotonic()
    assert lattica.get([w.slow.remote(0.1) for _ in range(20)], timeout=10) == [0.1] * 20
    assert time.monotonic() - t0 >= 0.38  # four waves of five


def test_sync_calls_never_overlap(where, token):
    w = where.spawn(sa.Worker)
    futs = []

    def issue():
        for _ in range(3):
            futs.append(w.busy.remote(token, 0.02))

    threads = [threading.Thread(target=issue) for _ in range(4)]
    for th in threads:
        th.start()
    for th in threads:
        th.join(5)
    assert len(set(lattica.get(futs, timeout=10))) == 1
    recs = sa.RECORDS[token]
    assert [r[0] for r in recs] == ["enter", "exit"] * 12
    assert all(a[1] <= b[1] for a, b in zip(recs, recs[1:]))
    assert len({r[2] for r in recs}) == 1


def test_a_blocked_sync_method_does_not_stall_async_methods_or_the_node(where, token):
    w = where.spawn(sa.Worker)
    blocked = w.wait_gate.remote(token, 10)
    assert wait_for(lambda: sa.RECORDS[token] == ["started"])
    t0 = time.monotonic()
    assert w.aping.remote().result(5) == "pong"  # same actor, async method: runs on the loop
    assert where.spawn(sa.Counter, 4).get.remote().result(5) == 4
    assert time.monotonic() - t0 < 1.0
    assert not blocked.done()
    sa.event(token).set()
    assert blocked.result(5) == "opened"


# -- ordering ----------------------------------------------------------------------------------


def test_per_caller_fifo_with_remote(where):
    c = where.spawn(sa.Counter)
    futs = [c.append.remote(i) for i in range(1000)]
    assert lattica.get(futs, timeout=20) == list(range(1, 1001))
    assert c.items_list.remote().result(5) == list(range(1000))


def test_per_caller_fifo_with_tell(where):
    c = where.spawn(sa.Counter)
    for i in range(1000):
        c.append.tell(i)
    assert c.items_list.remote().result(10) == list(range(1000))  # sent after every tell
    a = where.spawn(sa.Counter)
    for i in range(500):
        a.aappend.tell(i)
    # read with an async method too: async calls start in the order they were made, while sync
    # and async methods of one actor run concurrently (thread and loop)
    assert a.aitems_list.remote().result(10) == list(range(500))


# -- futures, get and wait ---------------------------------------------------------------------


def test_get_on_a_list_and_errors_through_get(where):
    c = where.spawn(sa.Counter)
    w = where.spawn(sa.Worker)
    assert lattica.get([c.add.remote(i, i) for i in range(10)]) == [2 * i for i in range(10)]
    assert lattica.get([]) == []
    with pytest.raises(ValueError, match="third"):
        lattica.get([c.add.remote(1, 1), w.raise_value.remote("third")], timeout=5)


def test_wait_returns_ready_and_pending_in_the_order_given(where):
    w = where.spawn(sa.Worker)
    slow1, fast, slow2 = w.slow.remote(1.0), w.slow.remote(0.01), w.slow.remote(1.0)
    futs = [slow1, fast, slow2]
    ready, pending = lattica.wait(futs, num_returns=1, timeout=5)
    assert ready == [fast] and pending == [slow1, slow2]
    t0 = time.monotonic()
    ready, pending = lattica.wait(futs, num_returns=3, timeout=0.1)
    assert time.monotonic() - t0 < 0.7
    assert ready == [fast] and pending == [slow1, slow2]
    ready, pending = lattica.wait(futs, num_returns=2, timeout=5)
    assert ready == [slow1, fast] and pending == [slow2]
    ready, pending = lattica.wait(futs, num_returns=3, timeout=5)
    assert ready == futs and pending == []
    with pytest.raises(ValueError):
        lattica.wait(futs, num_returns=4)
    with pytest.raises(ValueError):
        lattica.wait(futs, num_returns=0)


def test_result_with_timeout_raises_timeout_and_the_call_goes_on(where):
    w = where.spawn(sa.Worker)
    fut = w.slow.remote(0.5)
    with pytest.raises(Timeout) as ei:
        fut.result(0.05)
    assert type(ei.value) is Timeout
    assert not fut.done()
    with pytest.raises(Timeout):
        lattica.get([fut], timeout=0.05)
    assert fut.result(5) == 0.5


def test_await_a_future_from_another_event_loop(where):
    c = where.spawn(sa.Counter)
    w = where.spawn(sa.Worker)

    async def main():
        assert asyncio.get_running_loop() is not where.me._loop
        first = await c.incr.remote(1)
        futs = [c.incr.remote(1), c.incr.remote(1)]
        both = [await f for f in futs]
        with pytest.raises(ValueError, match="from another loop"):
            await w.raise_value.remote("from another loop")

        async def wrapped(f):
            return await f

        gathered = await asyncio.gather(wrapped(w.slow.remote(0.01)), wrapped(c.get.remote()))
        return first, both, gathered

    assert asyncio.run(main()) == (1, [2, 3], [0.01, 3])


def test_gather_and_wait_for_futures_from_another_event_loop(default_node):
    c = sa.Counter.remote(0)

    async def main():
        # two sync calls: they run in order on the actor's thread (a sync and an async call of one
        # actor would run concurrently, on its thread and on the loop)
        both = await asyncio.gather(c.incr.remote(1), c.incr.remote(1))
        last = await asyncio.wait_for(c.get.remote(), 5)
        return both, last

    assert asyncio.run(main()) == ([1, 2], 2)


def test_futures_awaited_on_the_node_loop(where):
    c = where.spawn(sa.Counter)

    async def on_loop():
        return [await c.incr.remote(1), await c.aincr.remote(1)]

    assert where.me.run(on_loop(), timeout=5) == [1, 2]


# -- deadlines and cancellation ----------------------------------------------------------------


def test_deadline_on_a_never_returning_async_method(where, token):
    w = where.spawn(sa.Worker)
    t0 = time.monotonic()
    fut = w.forever.options(timeout=0.2).remote(token)
    with pytest.raises(CallTimeout):
        fut.result(5)
    assert time.monotonic() - t0 < 2.0
    assert sa.event(token + ":cancelled").wait(5), "the method was not cancelled where it ran"
    assert sa.RECORDS[token] == ["cancelled"]
    assert w.aping.remote().result(5) == "pong"


def test_deadline_is_enforced_where_the_call_runs(where, token):
    """A call whose deadline passes while it waits behind a blocked sync method never runs."""
    w = where.spawn(sa.Worker)
    gate = token + ":gate"
    blocked = w.wait_gate.remote(gate, 10)
    assert wait_for(lambda: sa.RECORDS[gate] == ["started"])
    late = w.busy.options(timeout=0.2).remote(token, 0)
    with pytest.raises(CallTimeout):
        late.result(5)
    # the callee's deadline is the call's timeout from when it arrived, a little after the caller's:
    # the gate opens once it has passed there too (uvloop's millisecond timers can end the caller's
    # wait that little earlier)
    time.sleep(0.1)
    sa.event(gate).set()
    assert blocked.result(5) == "opened"
    assert w.ping.remote().result(5) == "pong"  # behind the expired call on the actor's thread
    assert sa.RECORDS[token] == []


def test_deadline_on_a_blocked_sync_method(where, token):
    w = where.spawn(sa.Worker)
    t0 = time.monotonic()
    with pytest.raises(CallTimeout):
        w.wait_gate.options(timeout=0.2).remote(token, 10).result(5)
    assert time.monotonic() - t0 < 2.0
    sa.event(token).set()
    assert w.ping.remote().result(5) == "pong"


def test_timeout_option_must_be_positive(default_node):
    w = sa.Worker.remote()
    with pytest.raises(ValueError):
        w.slow.options(timeout=0)
    with pytest.raises(ValueError):
        w.slow.options(timeout=-1)


def test_cancel_stops_a_running_async_method_where_it_runs(where, token):
    w = where.spawn(sa.Worker)
    fut = w.forever.remote(token)
    assert sa.event(token + ":started").wait(5)
    assert fut.cancel() is True
    assert sa.event(token + ":cancelled").wait(5), "the remote task was not cancelled"
    assert wait_for(fut.done)
    assert fut.cancelled()
    with pytest.raises(asyncio.CancelledError):
        fut.result(1)
    assert fut.cancel() is False
    assert w.aping.remote().result(5) == "pong"


# -- errors ------------------------------------------------------------------------------------


def test_remote_builtin_exception_is_a_remote_error_subclass_of_it(where):
    w = where.spawn(sa.Worker)
    with pytest.raises(ValueError) as ei:
        w.raise_value.remote("bad value 42").result(5)
    err = ei.value
    assert isinstance(err, RemoteError)
    assert err.type_name == "ValueError"
    assert err.remote_message == "bad value 42"
    assert "raise_value" in err.remote_traceback
    assert "RAISE_VALUE_LINE" in err.remote_traceback  # the method's source line
    assert "bad value 42" in str(err)
    with pytest.raises(KeyError) as ei:
        w.araise_key.remote("k").result(5)
    assert isinstance(ei.value, RemoteError) and ei.value.type_name == "KeyError"
    assert "araise_key" in ei.value.remote_traceback
    assert w.ping.remote().result(5) == "pong"


def test_remote_custom_exception_is_a_plain_remote_error(where):
    w = where.spawn(sa.Worker)
    with pytest.raises(RemoteError) as ei:
        w.raise_custom.remote("custom trouble").result(5)
    assert type(ei.value) is RemoteError
    assert ei.value.type_name == "sample_actors.CustomError"
    assert ei.value.remote_message == "custom trouble"
    assert "raise_custom" in ei.value.remote_traceback
    assert not isinstance(ei.value, sa.CustomError)


def test_wrong_arguments_are_a_remote_type_error(where):
    c = where.spawn(sa.Counter)
    for call in (lambda: c.add.remote(1), lambda: c.add.remote(1, 2, 3), lambda: c.add.remote(1, c=2)):
        with pytest.raises(TypeError) as ei:
            call().result(5)
        assert isinstance(ei.value, RemoteError) and ei.value.type_name == "TypeError"
    assert c.add.remote(1, b=2).result(5) == 3


def test_unknown_actor(where, token):
    with pytest.raises(ActorNotFound):
        lattica.get_actor("no-such-actor-" + token, node=where.node.peer_id)
    ghost = lattica.ActorRef(where.node.peer_id, "ghost-" + token, {"ping": "sync", "aping": "async"})
    with pytest.raises(ActorNotFound):
        ghost.ping.remote().result(5)
    with pytest.raises(ActorNotFound):
        ghost.aping.remote().result(5)
    ghost.ping.tell()  # nobody to tell: dropped quietly
    with pytest.raises(ActorNotFound):
        lattica.kill(ghost)
    assert where.spawn(sa.Counter, 1).get.remote().result(5) == 1


def test_unknown_method_on_a_hand_built_ref(where):
    c = where.spawn(sa.Counter, 3)
    assert c.get.remote().result(5) == 3  # the actor exists before a forged ref names it
    with pytest.raises(AttributeError, match="no public method"):
        c.nope
    forged = lattica.ActorRef(where.node.peer_id, c.name, {"nope": "async", "_private": "sync", "__init__": "sync"})
    with pytest.raises(MethodNotFound):
        forged.nope.remote().result(5)
    with pytest.raises(AttributeError):
        forged._private  # underscore names are never sent
    assert c.get.remote().result(5) == 3


def test_unknown_actor_by_name_locally(default_node):
    with pytest.raises(ActorNotFound):
        lattica.get_actor("nobody-here")


def test_an_envelope_over_the_cap_travels_by_cid_and_the_node_keeps_serving(default_node, peer):
    c = sa.Counter.options(node=peer.peer_id).remote(7)
    big = b"x" * (codec.DEFAULT_LIMITS.max_frame + 1)
    assert c.echo.remote(big).result(60) == big  # (both ways by CID: docs/api.md, "Big arguments and results")
    del big
    assert c.get.remote().result(5) == 7
    assert default_node.ping(peer.peer_id) > 0


def test_a_result_over_the_cap_travels_by_cid(default_node, peer):
    n = sa.Numeric.options(node=peer.peer_id).remote()
    out = n.make.remote(codec.DEFAULT_LIMITS.max_frame // 4 + 1024, 1).result(60)
    assert out.shape == (codec.DEFAULT_LIMITS.max_frame // 4 + 1024,) and out.nbytes > codec.DEFAULT_LIMITS.max_frame


def test_with_spilling_off_a_result_over_the_cap_fails_the_call_and_the_actor_keeps_serving(default_node):
    with lattica.Node([TCP], allow=ALLOW, spill_limit=0) as strict:
        default_node.connect(strict.addrs[0])
        n = sa.Numeric.options(node=strict.peer_id).remote()
        with pytest.raises((FrameTooLarge, RemoteError)) as ei:  # a RemoteError naming it
            n.make.remote(codec.DEFAULT_LIMITS.max_frame // 4 + 1024, 1).result(20)
        assert "FrameTooLarge" in (type(ei.value).__name__ + getattr(ei.value, "type_name", ""))
        assert "lattica.content.put" in str(ei.value)
        assert n.make.remote(4, 1).result(5).shape == (4,)


@pytest.mark.parametrize("local", [True, False], ids=["local", "remote"])
def test_unsupported_argument_type_is_a_codec_error_at_the_caller_local_or_not(default_node, peer, local):
    c = (sa.Counter if local else sa.Counter.options(node=peer.peer_id)).remote(1)
    with pytest.raises(CodecError, match="function.*lattica.values.register"):
        c.echo.remote(lambda: 1).result(5)
    with open(__file__) as f, pytest.raises(CodecError, match="TextIOWrapper"):
        c.echo.remote(x=f).result(5)
    with pytest.raises(CodecError):
        c.echo.remote([1, {"deep": object()}]).result(5)
    assert c.get.remote().result(5) == 1
    # what a Ray user passes comes back as it went
    import datetime
    import decimal
    import pathlib
    import uuid

    values = [
        (1, 2),
        {1, 2},
        frozenset({3}),
        datetime.datetime(2026, 11, 29, 6, 30),
        datetime.date(2026, 1, 1),
        datetime.timedelta(seconds=90),
        uuid.UUID(int=7),
        decimal.Decimal("0.10"),
        pathlib.Path("/tmp/x"),
    ]
    assert c.echo.remote(values).result(5) == values


def test_unencodable_tell_raises_at_the_caller(default_node, peer):
    c = sa.Counter.options(node=peer.peer_id).remote(1)
    with pytest.raises(CodecError):
        c.echo.tell(object())


def test_unencodable_result_fails_the_call_and_the_actor_keeps_serving(where):
    w = where.spawn(sa.Worker)
    if where.remote:
        with pytest.raises((CodecError, RemoteError)) as ei:  # a RemoteError naming it, for now
            w.returns_lock.remote().result(5)
        assert "CodecError" in (type(ei.value).__name__ + getattr(ei.value, "type_name", ""))
    else:
        assert w.returns_lock.remote().result(5) is sa._LOCK  # local results are not encoded
    assert w.ping.remote().result(5) == "pong"


def test_unencodable_result_is_a_codec_error_at_the_caller(default_node, peer):
    w = sa.Worker.options(node=peer.peer_id).remote()
    with pytest.raises(CodecError):
        w.returns_lock.remote().result(5)


# -- streaming ---------------------------------------------------------------------------------


@pytest.mark.parametrize("method", ["agen", "gen"])
def test_streaming_results_with_for_and_async_for(where, method):
    s = where.spawn(sa.Streamer)
    expected = list(range(100)) if method == "agen" else [i * 10 for i in range(100)]
    assert list(getattr(s, method).stream(100)) == expected

    async def consume():
        return [x async for x in getattr(s, method).stream(100)]

    assert asyncio.run(consume()) == expected  # another event loop
    assert where.me.run(consume(), timeout=10) == expected  # the node loop itself
    assert list(getattr(s, method).stream(0)) == []


def test_streaming_method_spelling(where):
    s = where.spawn(sa.Streamer)
    with pytest.raises(TypeError, match="stream"):
        s.agen.remote(3)
    c = where.spawn(sa.Counter)
    with pytest.raises(TypeError, match="not a generator"):
        c.get.stream()


def test_stream_error_after_items(where):
    s = where.spawn(sa.Streamer)
    got = []
    with pytest.raises(ValueError, match="stream broke") as ei:
        for x in s.agen_fail.stream(5):
            got.append(x)
    assert got == [0, 1, 2, 3, 4]
    assert isinstance(ei.value, RemoteError)


def test_stream_cancel_by_the_consumer_stops_the_producer(where, token):
    s = where.spawn(sa.Streamer)
    stream = s.produce_forever.stream(token)
    it = iter(stream)
    assert [next(it) for _ in range(5)] == [0, 1, 2, 3, 4]
    stream.cancel()
    assert sa.event(token + ":stopped").wait(5), "the producer kept running"
    assert list(s.agen.stream(3)) == [0, 1, 2]


@pytest.mark.parametrize("method", ["produce", "sync_produce"])
def test_slow_consumer_bounds_the_producer(where, token, method):
    s = where.spawn(sa.Streamer)
    n = 120
    got, leads = [], []
    for k, x in enumerate(getattr(s, method).stream(token, n), 1):
        got.append(x)
        if k <= 60:
            leads.append(sa.COUNTS[token] - k)  # items produced but not yet consumed
            time.sleep(0.005)
    assert got == list(range(n))
    # while we are slow the window never grows (a consumer that never runs dry is not held back
    # by credit); once we are fast it may, and 8 MiB of items bounds it (test_stream_item_window)
    assert max(leads) <= STREAM_WINDOW + 2, f"producer ran {max(leads)} items ahead"
    assert max(leads) >= STREAM_WINDOW // 2  # it did run ahead while we were slow
    assert sa.COUNTS[token] == n


def test_client_streaming_argument(where):
    s = where.spawn(sa.Streamer)

    async def numbers(n):
        for i in range(n):
            yield i

    assert s.total.remote(numbers(100)).result(10) == sum(range(100))
    assert s.collect.remote(numbers(50)).result(10) == list(range(50))
    assert s.total.remote(numbers(0)).result(10) == 0

    async def via_loop():
        return await s.total.remote(numbers(10))

    assert where.me.run(via_loop(), timeout=10) == 45


def test_slow_server_consumption_bounds_the_client_producer(where, token):
    s = where.spawn(sa.Streamer)
    leads = []

    async def items():
        for i in range(80):
            leads.append(i + 1 - sa.COUNTS[token])  # produced minus consumed by the server
            yield i

    assert s.slow_total.remote(items(), token, 0.005).result(20) == sum(range(80))
    assert max(leads) <= STREAM_WINDOW + 2, f"client producer ran {max(leads)} items ahead"
    if where.remote:
        assert max(leads) >= STREAM_WINDOW // 2


def test_unencodable_client_stream_item_fails_the_call(default_node, peer):
    s = sa.Streamer.options(node=peer.peer_id).remote()

    async def items():
        yield 1
        yield object()

    with pytest.raises(CodecError):
        s.total.remote(items()).result(5)
    assert s.total.remote(_aiter([1, 2, 3])).result(5) == 6


def test_unencodable_client_stream_item_releases_the_server_side_call(default_node, peer, token):
    s = sa.Streamer.options(node=peer.peer_id).remote()
    gate = asyncio.Event()

    async def items():
        yield 1
        while not gate.is_set():  # hold the bad item back until the method is running
            await asyncio.sleep(0.01)
        yield object()

    fut = s.guarded_total.remote(items(), token)
    assert sa.event(token + ":started").wait(5)
    default_node._loop.call_soon_threadsafe(gate.set)
    with pytest.raises(CodecError):
        fut.result(5)
    assert sa.event(token + ":cancelled").wait(3), "the server-side method still waits for the rest of the stream"


async def _aiter(values):
    for v in values:
        yield v


# -- refs are values ---------------------------------------------------------------------------


def test_refs_are_values_passed_to_an_actor_on_another_node(default_node, peer):
    with lattica.Node([TCP], allow=ALLOW) as third:
        default_node.connect(third.addrs[0])
        third.connect(peer.addrs[0])
        counter = sa.Counter.options(node=peer.peer_id).remote(0)
        caller = sa.Caller.options(node=third.peer_id).remote()
        assert caller.call_incr.remote(counter, 5).result(5) == 5  # async method on `third`
        assert caller.call_incr_sync.remote(counter, 2).result(5) == 7  # sync method on `third`
        assert caller.where.remote(counter).result(5) == [str(peer.peer_id), counter.name]
        assert counter.get.remote().result(5) == 7
        # a ref returned as a result is usable here
        made = caller.spawn_counter.remote(40).result(5)
        assert isinstance(made, lattica.ActorRef) and made.peer_id == third.peer_id
        assert made.incr.remote(2).result(5) == 42


def test_ref_encodes_in_the_codec_and_never_pickles(default_node):
    c = sa.Counter.remote(0)
    back = codec.decode(codec.encode_bytes({"ref": c}))["ref"]
    assert back == c and hash(back) == hash(c)
    assert back.methods == c.methods and back.peer_id == c.peer_id
    assert back.incr.remote(1).result(5) == 1
    with pytest.raises(TypeError):
        pickle.dumps(c)


def test_local_refs_skip_the_network():
    lattica.shutdown()
    node = lattica.init([], allow=ALLOW)
    try:
        assert node.addrs == []
        c = sa.Counter.remote(1)
        caller = sa.Caller.remote()
        assert caller.call_incr.remote(c, 1).result(5) == 2
        assert caller.call_incr_sync.remote(c, 1).result(5) == 3
        assert list(sa.Streamer.remote().agen.stream(3)) == [0, 1, 2]
        assert node.peers() == []
        assert node._host.runtime.channels == {}
        payload = {1, 2}  # checked, not encoded: passed by reference
        assert c.echo.remote(payload).result(5) is payload
    finally:
        lattica.shutdown()


# -- numpy -------------------------------------------------------------------------------------


def test_numpy_arrays_locally_are_passed_by_reference(default_node):
    n = sa.Numeric.remote()
    a = np.arange(1_000_000, dtype=np.float64)
    assert n.echo.remote(a).result(5) is a
    assert n.aecho.remote(a).result(5) is a
    assert n.keep.remote(a).result(5) == id(a)
    assert n.kept_id.remote().result(5) == id(a)
    r = n.make.remote(1000, 3).result(5)
    assert np.shares_memory(n.echo.remote(r).result(5), r)


def test_numpy_arrays_remotely(default_node, peer):
    n = sa.Numeric.options(node=peer.peer_id).remote()
    rng = np.random.default_rng(7)
    a = rng.standard_normal((512, 1024))  # 4 MiB
    b = rng.standard_normal((1024, 64))
    r = n.echo.remote(a).result(10)
    assert r.dtype == a.dtype and r.shape == a.shape
    np.testing.assert_array_equal(r, a)
    assert not r.flags.owndata  # a view of the received frame, not a copy
    np.testing.assert_allclose(n.matmul.remote(a, b).result(10), a @ b, rtol=1e-10)
    total, shape, dtype = n.checksum.remote(a).result(10)
    assert total == pytest.approx(float(a.sum()), rel=1e-9) and shape == [512, 1024] and dtype == "float64"
    for x in (np.arange(10, dtype=np.int8), np.zeros((0, 3), dtype=np.float32), a[::3, ::2], np.float32(1.5)):
        back = n.aecho.remote(x).result(10)
        np.testing.assert_array_equal(back, x)
        assert np.asarray(back).dtype == np.asarray(x).dtype
    nested = n.echo.remote({"w": [a[:2], b[:1]], "k": 3}).result(10)
    np.testing.assert_array_equal(nested["w"][0], a[:2])
    np.testing.assert_array_equal(nested["w"][1], b[:1])
    assert nested["k"] == 3
    made = n.make.remote(100_000, 5).result(10)
    np.testing.assert_array_equal(made, np.random.default_rng(5).standard_normal(100_000).astype(np.float32))


# -- lifecycle ---------------------------------------------------------------------------------


def test_kill_fails_calls_in_flight_runs_on_stop_and_later_calls_find_nothing(where, token):
    a = where.spawn(sa.Stoppable, token)
    assert a.ping.remote().result(5) == "pong"
    in_flight = a.forever.remote(token)
    assert sa.event(token + ":started").wait(5)
    lattica.kill(a)
    with pytest.raises(ActorDied):
        in_flight.result(5)
    assert token in sa.STOPPED
    with pytest.raises(ActorNotFound):
        a.ping.remote().result(5)
    with pytest.raises(ActorNotFound):
        lattica.get_actor(a.name, node=where.node.peer_id)
    assert a.name not in spawner_names(where.node.peer_id)
    with pytest.raises(ActorNotFound):
        lattica.kill(a)  # twice


def test_kill_while_a_sync_method_blocks(where, token):
    a = where.spawn(sa.Stoppable, token)
    gate = token + ":gate"
    blocked = a.wait_gate.remote(gate, 10)
    queued = a.ping.remote()
    assert wait_for(lambda: sa.RECORDS[gate] == ["started"])
    with concurrent.futures.ThreadPoolExecutor(1) as ex:
        killing = ex.submit(lattica.kill, a)
        t0 = time.monotonic()
        with pytest.raises(ActorDied):
            blocked.result(5)  # fails at once, though the method itself is still blocked
        with pytest.raises(ActorDied):
            queued.result(5)
        assert time.monotonic() - t0 < 2.0
        sa.event(gate).set()
        killing.result(10)
    assert token in sa.STOPPED


def test_async_only_actor_on_stop(where, token):
    a = where.spawn(sa.AsyncStoppable, token)
    assert a.ping.remote().result(5) == "pong"
    lattica.kill(a)
    assert token in sa.STOPPED


def test_node_shutdown_stops_actors_and_runs_on_stop(default_node, token):
    with lattica.Node([TCP], allow=ALLOW) as b:
        default_node.connect(b.addrs[0])
        remote_sync = sa.Stoppable.options(node=b.peer_id).remote(token + "-b-sync")
        remote_async = sa.AsyncStoppable.options(node=b.peer_id).remote(token + "-b-async")
        assert remote_sync.ping.remote().result(5) == remote_async.ping.remote().result(5) == "pong"
        in_flight = remote_sync.forever.remote(token)
        assert sa.event(token + ":started").wait(5)
    assert token + "-b-sync" in sa.STOPPED and token + "-b-async" in sa.STOPPED
    with pytest.raises((ActorDied, PeerUnreachable)):
        in_flight.result(5)
    local = sa.Stoppable.remote(token + "-local")
    assert local.ping.remote().result(5) == "pong"
    local_in_flight = local.forever.remote()
    lattica.shutdown()
    assert token + "-local" in sa.STOPPED
    assert local_in_flight.done()
    with pytest.raises(ActorDied):
        local_in_flight.result()  # finished: readable after the node stopped


# -- names -------------------------------------------------------------------------------------


def test_names_locally_and_on_a_peer(default_node, peer, token):
    local = sa.Counter.options(name="local-" + token).remote(1)
    assert local.name == "local-" + token
    found = lattica.get_actor("local-" + token)
    assert found == local
    assert found.incr.remote(1).result(5) == 2
    remote = sa.Counter.options(node=peer.peer_id, name="remote-" + token).remote(10)
    assert remote.get.remote().result(5) == 10
    for node in (peer.peer_id, str(peer.peer_id)):
        ref = lattica.get_actor("remote-" + token, node=node)
        assert ref == remote and ref.peer_id == peer.peer_id
        assert ref.incr.remote(1).result(5) in (11, 12)
    # named at spawn: registered in the DHT, so it resolves from here without node= too
    assert wait_for(lambda: _resolves("remote-" + token), timeout=10)
    assert lattica.get_actor("remote-" + token) == remote
    with pytest.raises(ActorNotFound):
        lattica.get_actor("never-spawned-" + token)


def _resolves(name):
    try:
        lattica.get_actor(name, timeout=2)
        return True
    except ActorNotFound:
        return False


def test_duplicate_local_name_is_a_spawn_error(default_node, token):
    first = sa.Counter.options(name=token).remote(1)
    with pytest.raises(SpawnError, match="already exists"):
        sa.Counter.options(name=token).remote(2)
    assert first.get.remote().result(5) == 1
    assert lattica.get_actor(token).get.remote().result(5) == 1


def test_duplicate_remote_name_leaves_the_first_actor_alone(default_node, peer, token):
    first = sa.Counter.options(node=peer.peer_id, name=token).remote(1)
    assert first.get.remote().result(5) == 1
    sa.Counter.options(node=peer.peer_id, name=token).remote(2)
    assert wait_for(
        lambda: (
            spawner_names(peer.peer_id)
            == sorted(
                [
                    "autonat",
                    "checkpoints",
                    "content",
                    "dashboard",
                    "dht",
                    "holepunch",
                    "membership",
                    "pubsub",
                    "shards",
                    "spawner",
                    token,
                ]
            )
        )
    )
    assert first.get.remote().result(5) == 1


def test_duplicate_remote_name_fails_calls_through_the_new_ref(default_node, peer, token):
    first = sa.Counter.options(node=peer.peer_id, name=token).remote(1)
    assert first.get.remote().result(5) == 1

    async def spawn_and_call():  # on the node loop: the call is sent before any reply can arrive
        dup = sa.Counter.options(node=peer.peer_id, name=token).remote(100)
        return await dup.get.remote()

    with pytest.raises(SpawnError, match="already exists"):
        default_node.run(spawn_and_call(), timeout=5)


# -- mailboxes and backpressure ----------------------------------------------------------------


def test_calls_beyond_the_window_wait_at_the_caller_or_fail_with_mailbox_full(where, token):
    w = where.spawn(sa.Worker, window=4)
    first = [w.wait_gate.remote(token, 10) for _ in range(4)]
    assert wait_for(lambda: sa.RECORDS[token] == ["started"])
    t0 = time.monotonic()
    with pytest.raises(MailboxFull):
        w.ping.options(block=False).remote().result(2)
    with pytest.raises(MailboxFull):
        w.aping.options(block=False).remote().result(2)
    assert time.monotonic() - t0 < 1.0
    # Held at the caller until credit returns. No more than a window of them: beyond that this
    # thread itself would be held back, and the gate below would never open.
    later = [w.ping.remote() for _ in range(4)]
    time.sleep(0.2)
    assert not any(f.done() for f in later)
    actor = where.actor(w)
    assert len(actor.live) <= 4, "the callee's mailbox holds more than the caller's window"
    sa.event(token).set()
    assert lattica.get(first + later, timeout=10) == ["opened"] * 4 + ["pong"] * 4
    assert w.ping.options(block=False).remote().result(5) == "pong"  # room again


def test_blocking_caller_thread_is_held_back_not_failed(where, token):
    w = where.spawn(sa.Worker, window=4)
    first = [w.wait_gate.remote(token, 10) for _ in range(4)]
    assert wait_for(lambda: sa.RECORDS[token] == ["started"])
    issued = []

    def flood():
        for _ in range(300):
            issued.append(w.ping.remote())

    # The caller's node loop is busy for a moment (as under load) while the thread starts calling.
    loop_busy = threading.Event()
    where.me._loop.call_soon_threadsafe(lambda: (loop_busy.set(), time.sleep(0.3)))
    assert loop_busy.wait(5)
    th = threading.Thread(target=flood, daemon=True)
    th.start()
    th.join(0.8)
    held_back = th.is_alive()
    sa.event(token).set()
    th.join(10)
    results = []
    for f in first + issued:
        try:
            results.append(f.result(10))
        except MailboxFull:
            results.append("MailboxFull")
    assert results == ["opened"] * 4 + ["pong"] * 300
    assert held_back, "the caller thread issued every call while the actor was blocked"


def test_flooding_a_sync_actor_with_tells_stays_bounded_and_the_node_answers(where, token):
    c = where.spawn(sa.Counter)
    w = where.spawn(sa.Worker)
    gate = token + ":gate"
    blocked = c.wait_gate.remote(gate, 10)  # the flood piles up behind a blocked actor
    assert wait_for(lambda: sa.RECORDS[gate] == ["started"])
    done = threading.Event()

    def flood():
        for _ in range(20_000):
            c.incr.tell(1)
        done.set()

    th = threading.Thread(target=flood, daemon=True)
    th.start()
    actor = where.actor(c)
    latencies = []
    for _ in range(10):  # the node answers while the flood is held back
        t0 = time.monotonic()
        assert w.aping.remote().result(5) == "pong"
        latencies.append(time.monotonic() - t0)
        assert len(actor.live) <= c.window + 1
        time.sleep(0.01)
    assert max(latencies) < 1.0
    if where.remote:
        assert where.me.ping(where.node.peer_id) < 1.0
    assert not done.is_set(), "20k calls were accepted while the actor was blocked: no backpressure"
    sa.event(gate).set()
    assert blocked.result(5) == "opened"
    th.join(30)
    assert done.is_set()
    assert c.get.remote().result(30) == 20_000  # none lost, all before this call


# -- malformed envelopes on a raw /lattica/rpc/1 stream ------------------------------------------


def _frame(obj):
    body = codec.encode_bytes(obj)
    return len(body).to_bytes(4, "big") + body


async def _read_msg(stream):
    n = int.from_bytes(await stream.readexactly(4), "big")
    return codec.decode(await stream.readexactly(n))


def _serves(default_node, target):
    c = sa.Counter.options(node=target.peer_id).remote(9)
    assert c.get.remote().result(5) == 9
    with lattica.Node([]) as probe:
        probe.connect(target.addrs[0])
        assert probe.ping(target.peer_id) > 0


def test_raw_stream_decodable_bad_call_gets_protocol_error_and_the_stream_goes_on(default_node, peer):
    c = sa.Counter.options(node=peer.peer_id, name="raw-target").remote(5)
    assert c.get.remote().result(5) == 5

    async def talk():
        s = await default_node.aopen_stream(peer.peer_id, RPC)
        replies = []
        s.write(_frame([0, 5, "x"]))  # a CALL of the wrong length
        replies.append(await _read_msg(s))
        s.write(_frame([0, 6, "raw-target", "get", "not-a-list", None, None, 0]))  # args not a list
        replies.append(await _read_msg(s))
        s.write(_frame([0, 7, "raw-target", "get", [], None, -1, 0]))  # negative timeout
        replies.append(await _read_msg(s))
        s.write(_frame([1, 12345]))  # CANCEL of an unknown call: ignored
        s.write(_frame([0, 8, "nobody", "get", [], None, None, 0]))
        replies.append(await _read_msg(s))
        s.write(_frame([0, 9, "raw-target", "nope", [], None, None, 0]))
        replies.append(await _read_msg(s))
        s.write(_frame([0, 10, "raw-target", "add", [1], None, None, 0]))
        replies.append(await _read_msg(s))
        s.write(_frame([0, 11, "raw-target", "__init__", [1], None, None, 0]))  # no private methods
        replies.append(await _read_msg(s))
        s.write(_frame([0, 12, "raw-target", "get", [], None, None, 0]))  # a good call still works
        replies.append(await _read_msg(s))
        s.reset()
        return replies

    replies = default_node.run(talk(), timeout=10)
    for cid, reply in zip((5, 6, 7), replies[:3]):
        assert reply[:4] == [11, cid, "protocol", "ProtocolError"], reply
    assert replies[3][:4] == [11, 8, "not_found", "ActorNotFound"]
    assert replies[4][:4] == [11, 9, "method", "MethodNotFound"]
    assert replies[5][:4] == [11, 10, "remote", "TypeError"]
    assert replies[6][:4] == [11, 11, "method", "MethodNotFound"]
    assert replies[7] == [10, 12, 5]
    _serves(default_node, peer)


@pytest.mark.parametrize(
    "garbage",
    [
        b"\x00\x00\x00\x05hello",  # not a codec frame
        _frame("just a string"),  # decodes, but is no message
        _frame([99, 1, 2]),  # unknown kind
        _frame([0, "id", "a", "m", [], None, None, 0]),  # a CALL without a usable id
        (codec.DEFAULT_LIMITS.max_frame + 1).to_bytes(4, "big"),  # declares a frame over the limit
    ],
    ids=["bytes", "string", "kind", "no-id", "too-large"],
)
def test_raw_stream_undecodable_input_resets_the_stream_and_the_node_keeps_serving(default_node, peer, garbage):
    async def talk():
        s = await default_node.aopen_stream(peer.peer_id, RPC)
        s.write(garbage)
        try:
            data = await asyncio.wait_for(s.read(100), 5)
        except StreamReset:
            return "reset"
        return data

    assert default_node.run(talk(), timeout=10) == "reset"
    _serves(default_node, peer)


_GRANTS = {
    rpc.PROTOCOL: lambda *head, n: [*head, n, n],
    rpc.PROTOCOL_1: lambda *head, n: [*head, n],
}  # (all of it "taken")


@pytest.mark.parametrize("protocol", [rpc.PROTOCOL, rpc.PROTOCOL_1], ids=["rpc2", "rpc1"])
@pytest.mark.parametrize("size, most", [(1 << 20, 16), (1000, 512)])
def test_raw_stream_consumer_granting_huge_credit_gets_at_most_a_window_of_bytes(
    default_node, peer, token, size, most, protocol
):
    """A consumer may grow a stream's window to 512 items, but only the producer knows its items'
    size: it takes credit up to what 8 MiB holds of them (never under 16), so a consumer that
    grants 100,000 (saying it took them all, on either version of the protocol) and reads
    nothing cannot make it queue 512 items of a megabyte. (Further grants are not read while
    the caller leaves 16 MiB of replies unread: CHANNEL_HIGH_WATER.)"""
    s_ = sa.Streamer.options(node=peer.peer_id, name="blob-streamer").remote()
    assert list(s_.agen.stream(2)) == [0, 1]

    async def talk():
        s = await default_node.aopen_stream(peer.peer_id, protocol)
        s.write(_frame([0, 1, "blob-streamer", "blobs", [token, 2000, size], None, None, 2]))
        await asyncio.sleep(0.3)  # (items have gone out: the producer knows their size)
        s.write(_frame(_GRANTS[protocol](rpc.CREDIT, 1, n=100_000)))
        await asyncio.sleep(1.0)  # reading nothing
        produced = sa.COUNTS[token]
        s.reset()
        return produced

    produced = default_node.run(talk(), timeout=15)
    # the first 16 went out on the initial credit; the grant added at most ``most`` more
    assert STREAM_WINDOW + most - 8 <= produced <= STREAM_WINDOW + most + 1, produced
    assert list(s_.agen.stream(3)) == [0, 1, 2]


def _serve_only(node: lattica.Node, protocol: str, handler) -> None:
    """``node`` answers calls with ``handler`` on ``protocol`` and serves no other version of
    the call protocol (so callers pick that one, as they do with an older node)."""
    node.set_stream_handler(protocol, handler)

    async def serve_no_other(host) -> None:
        for other in (rpc.PROTOCOL, rpc.PROTOCOL_1):
            if other != protocol:
                host.handlers.pop(other)

    node._call(serve_no_other)


@pytest.mark.parametrize("protocol", [rpc.PROTOCOL, rpc.PROTOCOL_1], ids=["rpc2", "rpc1"])
@pytest.mark.parametrize("size, most", [(1 << 20, 16), (1000, 512)])
def test_a_callee_granting_huge_credit_for_a_streamed_argument_gets_at_most_a_window_of_bytes(
    default_node, size, most, protocol
):
    """The other direction: a callee (here a node whose call protocol answers by hand) may grow a
    streamed argument's window, but the caller takes credit only up to what 8 MiB holds of its
    items (never under 16): a grant of 100,000 (all of it "taken", on either version of the
    protocol) that is never followed by reading cannot make it queue 512 items of a megabyte
    (or 100,000 small ones)."""
    from lattica._runtime.refs import ActorRef

    got: list[int] = []
    produced = [0]

    async def hostile(stream, conn):
        call = await _read_msg(stream)
        cid = call[1]
        stream.write(_frame([rpc.ARGCRED, cid, 0, STREAM_WINDOW]))  # (what a callee grants first)
        await asyncio.sleep(0.3)  # the first 16 items come on it: the caller knows their size
        stream.write(_frame(_GRANTS[protocol](rpc.ARGCRED, cid, 0, n=100_000)))
        while True:
            try:
                msg = await _read_msg(stream)
            except Exception:
                return
            if msg[0] == rpc.ARG:
                got.append(len(msg[3]))

    async def items():
        while True:
            produced[0] += 1
            yield bytes(size)

    with lattica.Node(["/ip4/127.0.0.1/tcp/0"]) as callee:
        _serve_only(callee, protocol, hostile)
        default_node.connect(callee.addrs[0])
        ref = ActorRef(callee.peer_id, "sink", {"collect": ASYNC})

        async def call():
            ref.collect.remote(items())  # (never answered)

        default_node.run(call(), timeout=10)
        time.sleep(1.5)  # the callee reads what comes and never grants again
        sent = len(got)
    # the first 16 went out on the first credit; the grant added at most ``most`` more
    assert STREAM_WINDOW + most - 8 <= sent <= STREAM_WINDOW + most, sent
    assert produced[0] <= sent + 1  # and nothing more was taken from the source than sent


def test_a_callee_that_keeps_granting_and_never_reads_cannot_make_the_caller_queue_its_whole_stream(default_node):
    """A callee grants a streamed argument's credit 8 items at a time, again and again, and
    reads nothing: the caller's unsent messages reach the channel's high-water mark (16 MiB)
    and it waits there instead of pulling its source into memory (1 MiB items)."""
    from lattica._runtime.refs import ActorRef

    produced = [0]

    async def greedy(stream, conn):
        call = await _read_msg(stream)
        stream.write(_frame([rpc.ARGCRED, call[1], 0, STREAM_WINDOW]))
        for _ in range(1000):
            await asyncio.sleep(0.002)
            stream.write(_frame([rpc.ARGCRED, call[1], 0, 8, 8]))

    async def items():
        while True:
            produced[0] += 1
            yield bytes(1 << 20)

    with lattica.Node(["/ip4/127.0.0.1/tcp/0"]) as callee:
        _serve_only(callee, RPC, greedy)
        default_node.connect(callee.addrs[0])
        ref = ActorRef(callee.peer_id, "sink", {"collect": ASYNC})

        async def call():
            ref.collect.remote(items())  # (never answered)

        default_node.run(call(), timeout=10)
        time.sleep(2.5)
        took = produced[0]
    # 16 MiB unsent in the channel, plus what the kernel's and the connection's buffers hold
    assert took < 80, took


def test_calls_to_a_node_serving_only_the_first_call_protocol_stream_both_ways(default_node):
    """An older node serves only ``/lattica/rpc/1``, whose grants cannot say what was taken:
    calls to it go on that version, streamed results (async and sync generators) and streamed
    arguments arrive whole, and their windows never grow (they stay at 16 items)."""
    with lattica.Node([TCP], allow=ALLOW) as old:

        async def only_the_first(host) -> None:
            host.handlers.pop(rpc.PROTOCOL)

        old._call(only_the_first)
        default_node.connect(old.addrs[0])
        s_ = sa.Streamer.options(node=old.peer_id).remote()
        results = s_.agen.stream(3000)
        assert list(results) == list(range(3000))
        assert list(s_.gen.stream(500)) == [i * 10 for i in range(500)]
        assert s_.total.remote(_ints(3000)).result(20) == sum(range(3000))
        assert results._state._credit.window == STREAM_WINDOW
        assert default_node.host.runtime.channels[old.peer_id].protocol == rpc.PROTOCOL_1
    with lattica.Node([TCP], allow=ALLOW) as current:
        default_node.connect(current.addrs[0])
        s_ = sa.Streamer.options(node=current.peer_id).remote()
        assert list(s_.agen.stream(3)) == [0, 1, 2]
        assert default_node.host.runtime.channels[current.peer_id].protocol == rpc.PROTOCOL


def test_two_streamed_arguments_of_big_items_both_arrive_though_they_wait_on_one_channel(default_node, peer):
    """Two streamed arguments of 2 MiB items fill the call channel past its high-water mark, so
    both of the caller's pumps wait for it to drain at once (a review found the second wait
    orphaning the first: the call hung); likewise two calls with one each."""
    s_ = sa.Streamer.options(node=peer.peer_id).remote()

    async def items(n):
        for _ in range(n):
            yield bytes(2 << 20)

    async def calls():
        return await asyncio.gather(
            s_.both.remote(items(40), items(40)), s_.total.remote(_ints(50)), s_.collect.remote(_ints(3))
        )

    assert default_node.run(calls(), timeout=60) == [[40, 40], sum(range(50)), [0, 1, 2]]

    async def two_calls():
        return await asyncio.gather(s_.both.remote(items(30), items(0)), s_.both.remote(items(0), items(30)))

    assert default_node.run(two_calls(), timeout=60) == [[30, 0], [0, 30]]


def test_a_callee_that_returns_before_taking_all_of_a_streamed_argument_ends_the_caller_s_pump(default_node, peer):
    """The callee answers after the first item: the caller stops sending and closes its source
    (before, the pump waited for credit forever and the source was never closed)."""
    s_ = sa.Streamer.options(node=peer.peer_id).remote()
    closed = []

    async def items():
        try:
            for i in range(100_000):
                yield i
        finally:
            closed.append(True)

    for _ in range(3):
        assert s_.first_only.remote(items()).result(10) == 0
    assert wait_for(lambda: len(closed) == 3, 5), closed

    async def pumps():
        return [
            t for t in asyncio.all_tasks() if t is not asyncio.current_task() and "Runtime._pump" in repr(t.get_coro())
        ]

    assert wait_for(lambda: not default_node.run(pumps(), timeout=5), 5)


def test_a_call_that_ends_while_its_streamed_argument_waits_or_before_any_credit_closes_the_source(default_node, peer):
    """The call times out while the caller's source is waiting for its next item (a queue, a
    sensor): the pump stops there and the source is closed. A call refused before the callee
    granted anything (no such actor) closes its source too."""
    from lattica._runtime.refs import ActorRef

    s_ = sa.Streamer.options(node=peer.peer_id).remote()
    closed = []

    async def stalls():
        try:
            yield 1
            await asyncio.sleep(60)
            yield 2
        finally:
            closed.append("stalls")

    async def never_sent():
        yield 1

    unsent = never_sent()

    async def calls():
        with pytest.raises(CallTimeout):
            await s_.collect.options(timeout=0.5).remote(stalls())
        with pytest.raises(ActorNotFound):
            await ActorRef(peer.peer_id, "nobody-here", {"collect": ASYNC}).collect.remote(unsent)

    default_node.run(calls(), timeout=20)
    assert wait_for(lambda: closed == ["stalls"], 5), closed
    assert wait_for(lambda: unsent.ag_frame is None, 5)  # closed before it ever ran (nothing to clean up)


async def _ints(n):
    for i in range(n):
        yield i


def test_raw_stream_caller_over_its_window_gets_mailbox_full(default_node, peer, token):
    w = sa.Worker.options(node=peer.peer_id, window=4, name="windowed").remote()
    assert w.ping.remote().result(5) == "pong"

    async def talk():
        s = await default_node.aopen_stream(peer.peer_id, RPC)
        for cid in range(1, 6):
            s.write(_frame([0, cid, "windowed", "wait_gate", [token, 10], None, None, 0]))
        first = await asyncio.wait_for(_read_msg(s), 5)
        sa.event(token).set()
        rest = [await asyncio.wait_for(_read_msg(s), 5) for _ in range(4)]
        s.reset()
        return first, rest

    first, rest = default_node.run(talk(), timeout=15)
    assert first[:4] == [11, 5, "mailbox", "MailboxFull"]
    assert sorted(rest) == [[10, cid, "opened"] for cid in range(1, 5)]
    assert w.ping.remote().result(5) == "pong"


def test_api_edges_a_new_user_meets():
    lattica.shutdown()
    try:
        node = lattica.init("/ip4/127.0.0.1/tcp/0", allow=ALLOW)  # one address, not a list
        assert len(node.addrs) == 1
        assert lattica.init() is node and lattica.init("/ip4/127.0.0.1/tcp/0", allow=ALLOW) is node
        with pytest.raises(lattica.errors.LatticaError, match=r"other arguments \(allow\).*shutdown"):
            lattica.init("/ip4/127.0.0.1/tcp/0", allow=["other.*"])
        c = sa.Counter.remote(1)
        with pytest.raises(lattica.errors.MethodNotFound, match="no public method 'nope'"):
            c.nope.remote()
        assert not hasattr(c, "nope") and hasattr(c, "incr")  # (an AttributeError too)
    finally:
        lattica.shutdown()


def test_with_spilling_off_an_argument_over_the_message_cap_says_what_to_do(peer):
    lattica.shutdown()
    lattica.init(allow=ALLOW, spill_limit=0)
    lattica._api.node().connect(peer.addrs[0])
    c = sa.Counter.options(node=peer.peer_id).remote(1)
    big = np.zeros(65 << 20, np.uint8)
    with pytest.raises(lattica.errors.FrameTooLarge, match=r"over the 64 MiB .*by CID .*lattica.content.put"):
        c.echo.remote(big).result(30)
    assert c.get.remote().result(5) == 1
