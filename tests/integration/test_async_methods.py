"""asyncio inside async actor methods: asyncio.timeout, TaskGroups, current_task, several calls
awaiting one future, and akill / aget_actor from actor methods and other loops."""

import time

import pytest

import call_actors as ra
import lattica
from lattica.errors import (
    ActorNotFound,
)

pytestmark = pytest.mark.timeout(60)


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
    assert p.tasks_distinct.remote("a", "b").result(5) == [True, True, True], (
        "two concurrent calls share one current task"
    )


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
