"""Streaming calls at their edges: abandoned and closed streams free the actor, tell on a generator
is a TypeError, a client stream whose source raises fails the call, and a ref whose method table
lies about streaming gets a clear error."""

import gc
import time

import pytest

import call_actors as ra
import lattica
from call_fixtures import (
    _aiter,
    bounded,
    fails_without_timeout,
)
from helpers import wait_for
from lattica.errors import (
    LatticaError,
)

pytestmark = pytest.mark.timeout(60)


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
        err = fails_without_timeout(
            lambda m=m: getattr(forged, m).remote(token, 3).result(5), 6, f"unary call of generator {m}"
        )
        assert isinstance(err, (LatticaError, TypeError)), err
    assert g.ping.remote().result(5) == "pong"
