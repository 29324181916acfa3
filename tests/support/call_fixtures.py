"""What the call-semantics tests share (tests/integration/test_mailboxes.py and its neighbours):
the ``node`` and ``where`` fixtures (an actor on the caller's own node, or on a second node over
TCP) and bounded waits, so that a test meeting a bug fails within seconds instead of hanging."""

import threading

import pytest

import lattica
from helpers import Where
from lattica.errors import Timeout

TCP = "/ip4/127.0.0.1/tcp/0"
ALLOW = ["sample_actors.*", "call_actors.*"]
SPAWNER_METHODS = {"spawn": "async", "kill": "async", "lookup": "async", "names": "async"}


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
