"""How calls fail: a peer that dies fails calls in flight and queued; exceptions that are awkward
to rebuild arrive as RemoteError and the channel keeps working; calls after shutdown and to a
stopped peer fail promptly; Future.exception honours its timeout."""

import time

import pytest

import call_actors as ra
import lattica
from call_fixtures import (
    ALLOW,
    TCP,
    bounded,
)
from helpers import wait_for
from lattica.errors import (
    ActorDied,
    NodeClosed,
    PeerUnreachable,
    RemoteError,
    Timeout,
)

pytestmark = pytest.mark.timeout(60)


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
    assert wait_for(lambda: all(f.done() for f in futs), 5), (
        f"{sum(not f.done() for f in futs)} of 10 calls still pending 5 s after their peer stopped"
    )
    for f in futs:
        with pytest.raises((PeerUnreachable, ActorDied)):
            f.result(0)


# -- 3. exception types that are awkward to rebuild ------------------------------------------


@pytest.mark.parametrize(
    "method,type_name",
    [
        ("bad_decode", "UnicodeDecodeError"),
        ("abad_decode", "UnicodeDecodeError"),
        ("group", "ExceptionGroup"),
        ("agroup", "ExceptionGroup"),
    ],
)
def test_awkward_exception_types_become_remote_errors_and_the_channel_keeps_working(where, method, type_name):
    p = where.spawn(ra.Probe)
    with pytest.raises(RemoteError) as ei:
        getattr(p, method).remote().result(5)
    assert ei.value.type_name == type_name
    # the same ref, the same channel: still answering
    assert p.ping.remote().result(5) == "pong"
    assert p.aping.remote().result(5) == "pong"
    assert lattica.get([p.aping.remote() for _ in range(5)], timeout=5) == ["pong"] * 5


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
