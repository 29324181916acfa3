"""Shared test setup: ``tests/support`` is importable (here and in child processes), and the
``default_node`` fixture gives each test a fresh ``lattica.init()`` node that admits the sample
actors, shut down (actors stopped) afterwards."""

import os
import sys
import time
import uuid

import pytest

SUPPORT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "support")
if SUPPORT not in sys.path:
    sys.path.insert(0, SUPPORT)
os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (SUPPORT, os.environ.get("PYTHONPATH")) if p)
# a child process that crashes in C (a SIGSEGV in an event loop's extension) prints its threads'
# stacks into the run's log, not just its exit code
os.environ.setdefault("PYTHONFAULTHANDLER", "1")

ALLOW = ["sample_actors.*"]


def pytest_addoption(parser):
    parser.addoption("--slow", action="store_true", help="also run the long simulations (marked slow)")


def pytest_configure(config):
    if config.getoption("--slow"):
        os.environ["LATTICA_SLOW"] = "1"  # (read at import by what runs longer then: the parsers' fuzzing)


def pytest_collection_modifyitems(config, items):
    if config.getoption("--slow") or os.environ.get("LATTICA_SLOW") == "1":
        return
    skip = pytest.mark.skip(reason="a long simulation: run with --slow (the default run has its short version)")
    for item in items:
        if "slow" in item.keywords:
            item.add_marker(skip)


@pytest.fixture
def default_node():
    """A started default node (``lattica.init``), shut down after the test."""
    import lattica

    lattica.shutdown()  # a test that started its own default node must not leak it into this one
    node = lattica.init(allow=ALLOW)
    try:
        yield node
    finally:
        lattica.shutdown()


@pytest.fixture
def token():
    """A fresh id per test, for keying records that sample actors share through module state."""
    return uuid.uuid4().hex


@pytest.fixture
def mesh():
    """Three connected nodes on loopback: ``host`` (mesh A, admits the sample actors), ``member``
    (mesh A) and ``stranger`` (mesh B: authenticated, not a member of A)."""
    import lattica
    from lattica.trust import MeshKey

    a, b = MeshKey.generate(), MeshKey.generate()
    tcp = "/ip4/127.0.0.1/tcp/0"
    with (
        lattica.Node([tcp], mesh=a, allow=ALLOW) as host,
        lattica.Node([tcp], mesh=a) as member,
        lattica.Node([tcp], mesh=b) as stranger,
    ):
        member.connect(host.addrs[0])
        stranger.connect(host.addrs[0])
        # connect() returns once the dialer has identified the host; wait for the host's side too
        want = {str(member.peer_id), str(stranger.peer_id)}
        deadline = time.monotonic() + 10
        while want - {str(p.peer_id) for p in host.peers() if p.protocols} and time.monotonic() < deadline:
            time.sleep(0.01)
        yield host, member, stranger
