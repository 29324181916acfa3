"""The service registry and the host's view of services: which services a node runs, that adding
one is one table row (its actor is then reachable by peers, it is closed when the node stops), and
the events services subscribe to."""

import importlib.util
import pathlib

import pytest

import lattica
from helpers import wait_for
from lattica import _hostview as hostview
from lattica import services
from lattica._membership import MemberUp
from lattica._runtime import ASYNC, ActorRef
from lattica._runtime.client import CallRouter

pytestmark = pytest.mark.timeout(60)

TCP = "/ip4/127.0.0.1/tcp/0"
ROOT = pathlib.Path(__file__).resolve().parents[2]


def test_a_node_runs_the_services_its_configuration_turns_on():
    with (
        lattica.Node([TCP]) as plain,
        lattica.Node([TCP], relay=True, membership=False, content=False, pubsub=False) as relay,
    ):
        assert list(plain.host.services) == [
            "monitors",
            "spawner",
            "membership",
            "checkpoints",
            "dht",
            "kad",
            "autonat",
            "holepunch",
            "shards",
            "content",
            "code",
            "pubsub",
            "crdt",
            "sdk_rpc",
            "rendezvous",
            "dashboard",
            "nat",
        ]
        assert list(relay.host.services) == [
            "monitors",
            "spawner",
            "checkpoints",
            "dht",
            "kad",
            "autonat",
            "holepunch",
            "relay",
            "shards",
            "sdk_rpc",
            "rendezvous",
            "dashboard",
            "nat",
        ]
        # every service with an actor serves it under its well-known name
        for name in (
            "spawner",
            "checkpoints",
            "dht",
            "autonat",
            "holepunch",
            "membership",
            "shards",
            "content",
            "pubsub",
            "dashboard",
        ):
            assert name in plain.host.runtime.actors
        assert plain.host.services.relay is None and relay.host.services.relay is not None


def _example_service():
    """docs/example_service.py, the minimal service docs/architecture.md walks through."""
    path = ROOT / "docs" / "example_service.py"
    spec = importlib.util.spec_from_file_location("example_service", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_adding_a_service_is_one_module_and_one_row(monkeypatch):
    example = _example_service()
    row = services.ServiceSpec("greeter", example.build_greeter, public=frozenset({"hello"}))
    monkeypatch.setattr(services, "SERVICES", services.SERVICES + (row,))
    with lattica.Node([TCP]) as a, lattica.Node([TCP]) as b:
        assert list(a.host.services)[-1] == "greeter"
        greeter = a.host.services.greeter
        assert greeter.dht is a.host.services.dht  # it was handed the service it uses
        assert a.host.runtime.actors["greeter"].public == {"hello"}  # the row's exposure
        b.connect(a.addrs[0])
        ref = ActorRef(a.peer_id, "greeter", {"hello": ASYNC})

        async def call():
            return await ref.hello.remote("b")  # on b's loop: the call goes through b

        assert b.run(call(), timeout=10) == f"hello b from {a.peer_id.short()}"
        assert greeter.served == 1
    assert greeter.closed


def test_services_see_connections_identify_and_membership_as_events():
    seen: dict[str, list] = {"identified": [], "connected": [], "disconnected": [], "membership": []}
    with lattica.Node([TCP]) as a, lattica.Node([TCP]) as b:
        events = a.host.events

        async def subscribe():
            events.identified.subscribe(lambda info: seen["identified"].append(info.peer_id))
            events.connected.subscribe(lambda conn: seen["connected"].append(conn.remote_peer))
            events.disconnected.subscribe(lambda peer, conn: seen["disconnected"].append(peer))
            events.membership_changed.subscribe(lambda ev: seen["membership"].append(ev))

        a.run(subscribe())
        b.connect(a.addrs[0])
        assert wait_for(lambda: b.peer_id in seen["identified"] and b.peer_id in seen["connected"], timeout=10)
        assert wait_for(
            lambda: any(isinstance(ev, MemberUp) and ev.member.id == str(b.peer_id) for ev in seen["membership"]),
            timeout=10,
        )
        b.disconnect(a.peer_id)
        assert wait_for(lambda: b.peer_id in seen["disconnected"], timeout=10)


def test_a_subscriber_that_raises_does_not_stop_the_others():
    signal = hostview.Signal("test")
    got: list[int] = []
    signal.subscribe(lambda x: 1 / 0)
    unsubscribe = signal.subscribe(got.append)
    signal.emit(1)
    unsubscribe()
    signal.emit(2)
    assert got == [1]


def test_the_host_offers_everything_the_host_view_promises():
    members = [m for m in dir(hostview.HostView) if not m.startswith("_")]
    members += list(hostview.HostView.__annotations__)
    with lattica.Node([TCP]) as node:
        missing = [m for m in members if not hasattr(node.host, m)]
    assert not missing, f"the host lacks {missing}"


def test_the_runtime_offers_everything_the_channels_call_router_promises():
    members = [m for m in dir(CallRouter) if not m.startswith("_")] + list(CallRouter.__annotations__)
    with lattica.Node([TCP]) as node:
        missing = [m for m in members if not hasattr(node.host.runtime, m)]
    assert not missing, f"the runtime lacks {missing}"
