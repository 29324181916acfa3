"""Hole-punch requests on loopback: who may ask, and what bad or lying requests cost.

The punching itself needs NATs and runs in the NAT lab (tests/natlab/test_holepunch.py). Here
nodes that listen nowhere meet through a relay: a punch has nothing to dial, fails, and the
relayed connection must keep carrying calls.
"""

from __future__ import annotations

import asyncio
import os

import pytest

import lattica
import sample_actors as sa
from helpers import wait_for
from lattica._framing import read_delimited, read_message, write_delimited, write_message
from lattica.actors.nat import holepunch as hp_actor
from lattica.config import NatConfig
from lattica.nat import _dcutr_wire as dcutr
from lattica.nat._holepunch import DEPENDENT, PROTOCOL, Plan, Punch

TCP = "/ip4/127.0.0.1/tcp/0"
QUIC = "/ip4/127.0.0.1/udp/0/quic-v1"
ALLOW = ["sample_actors.*"]


@pytest.fixture(autouse=True)
def short_window(monkeypatch):
    monkeypatch.setattr(hp_actor, "WINDOW", 0.3)
    monkeypatch.setattr(hp_actor, "BIRTHDAY_WINDOW", 0.5)


def _status(node: lattica.Node) -> dict:
    async def get():
        return node._host.services.holepunch.status()

    return node.run(get(), timeout=5)


async def _ask(node: lattica.Node, conn, msgs: list) -> bytes | None:
    """Open a hole-punch stream on ``conn``, send ``msgs`` (reading one answer after the first);
    return the answer, or None if the stream was reset."""
    stream = await node._host.open_stream_on(conn, PROTOCOL)
    try:
        write_message(stream, msgs[0])
        answer = await asyncio.wait_for(read_message(stream, 8192), 5)
        for m in msgs[1:]:
            write_message(stream, m)
        await stream.close()
        return answer
    except (lattica.errors.LatticaError, asyncio.IncompleteReadError):
        return None


def test_a_punch_request_on_a_direct_connection_is_refused():
    with lattica.Node([TCP]) as a, lattica.Node([TCP]) as b:
        a.connect(b.addrs[0])
        conn = a._host.conns[b.peer_id]
        connect = {
            "type": "connect",
            "addrs": ["/ip4/127.0.0.1/udp/9/quic-v1"],
            "nat": "endpoint-independent",
            "token": os.urandom(16),
        }
        assert a.run(_ask(a, conn, [connect]), timeout=10) is None  # reset, no answer
        assert _status(b)["refused"] == 1 and _status(b)["attempts"] == 0


def test_a_dcutr_request_on_a_direct_connection_is_refused():
    """libp2p's DCUtR, like ours, is taken only on a relayed connection: over a direct one the
    stream is reset unanswered and nothing is dialed."""
    with lattica.Node([TCP]) as a, lattica.Node([TCP]) as b:
        a.connect(b.addrs[0])
        conn = a._host.conns[b.peer_id]
        lie = dcutr.HolePunch(dcutr.PunchType.CONNECT, (lattica.Multiaddr("/ip4/192.0.2.1/tcp/4001"),))

        async def ask() -> bytes | None:
            stream = await a._host.open_stream_on(conn, dcutr.PROTOCOL)
            write_delimited(stream, dcutr.encode(lie))
            try:
                return await asyncio.wait_for(read_delimited(stream, dcutr.MAX_MESSAGE), 5)
            except lattica.errors.LatticaError:
                return None

        assert a.run(ask(), timeout=10) is None  # reset, no answer
        assert _status(b)["refused"] == 1 and _status(b)["attempts"] == 0
        assert not [k for k in b.run(_contacted(b._host)) if k[1] == "192.0.2.1"]


def test_a_punch_over_direct_quic_only_adds_tcp_and_only_towards_the_peers_address():
    """Over a direct QUIC connection a punch may only add TCP: the peer's candidates at another IP
    are ignored (nothing is sent to them, no UDP at all), and one with a TCP path already is
    refused."""
    no_candidate = "no TCP candidate at the peer's address"
    with lattica.Node([TCP, QUIC]) as a, lattica.Node([TCP, QUIC]) as b:
        a.connect(next(x for x in b.addrs if "quic" in str(x)))
        conn = a._host.conns[b.peer_id]
        assert conn.transport == "quic"
        # a, the QUIC dialer, asks by itself first: on loopback neither has a TCP candidate
        assert wait_for(lambda: [r.get("reason") for r in a.run(_recent(a._host))] == [no_candidate], timeout=5)
        lie = {
            "type": "connect",
            "addrs": ["/ip4/192.0.2.1/tcp/4001", "/ip4/192.0.2.1/udp/4001/quic-v1"],
            "nat": "endpoint-independent",
            "token": os.urandom(16),
        }
        assert a.run(_ask(a, conn, [lie, {"type": "sync"}]), timeout=10) is not None  # answered
        assert wait_for(lambda: [r.get("reason") for r in b.run(_recent(b._host))] == [no_candidate] * 2, timeout=5)
        assert _status(b)["attempts"] == 0  # nothing executed: no SYN, no datagram
        assert not [k for k in b.run(_contacted(b._host)) if k[1] == "192.0.2.1"]
        assert conn.transport == "quic" and b.ping(a.peer_id) > 0


def test_tcp_only_punches_are_limited_per_ip_whatever_the_peer_ids():
    """A TCP-only punch makes us connect from our listening port to ports the peer names at its
    address: six a minute per IP (v4 address or v6 /64), however many identities ask."""
    with lattica.Node([TCP, QUIC]) as b, lattica.Node([TCP, QUIC]) as a1, lattica.Node([TCP, QUIC]) as a2:
        quic = next(x for x in b.addrs if "quic" in str(x))
        for a in (a1, a2):
            a.connect(quic)
        # each asker asks once by itself (nothing to do on loopback): two of the IP's six
        assert wait_for(lambda: len(b.run(_recent(b._host))) == 2, timeout=10)
        lie = {"type": "connect", "addrs": ["/ip4/127.0.0.1/tcp/9"], "nat": "endpoint-independent"}
        answered = []
        for i in range(6):
            a = (a1, a2)[i % 2]
            conn = a._host.conns[b.peer_id]
            got = a.run(_ask(a, conn, [{**lie, "token": os.urandom(16)}, {"type": "sync"}]), timeout=10)
            answered.append(got is not None)
            wait_for(
                lambda: (
                    b.peer_id not in a._host.services.holepunch.tcp_active
                    and a.peer_id not in b._host.services.holepunch.tcp_active
                ),
                timeout=5,
            )
        assert answered == [True] * 4 + [False] * 2, answered  # 3 asks per identity: never its own limit


async def _recent(h):
    return list(h.services.holepunch.recent)


async def _contacted(h):
    return list(h.dialer.contacted)


def _relayed_pair(relay: lattica.Node, caller: lattica.Node):
    private = lattica.Node([], relays=[str(relay.addrs[0])], nat=NatConfig(reachability="private"), allow=ALLOW).start()
    assert wait_for(lambda: len(private.nat_status().relays) >= 1, timeout=10)
    caller.connect(relay.addrs[0])
    for n in (relay, caller):
        lattica.dht.bootstrap(node=n).result(10)
    return private


def _counter(caller: lattica.Node, target) -> int:
    async def go():
        ref = sa.Counter.options(node=target).remote(1)
        await ref.incr.remote()
        return await ref.get.remote()

    return caller.run(go(), timeout=20)


def test_failed_punches_leave_the_relayed_connection_working_and_lies_cost_nothing_lasting():
    with lattica.Node([TCP], relay=True) as relay, lattica.Node([], allow=ALLOW) as caller:
        target = _relayed_pair(relay, caller)
        try:
            assert _counter(caller, target.peer_id) == 2
            # the target received the relayed connection: it punched, three times, with nothing to
            # dial (neither side listens anywhere), and gave up
            assert wait_for(lambda: _status(target)["failed"] == 3 and _status(target)["active"] == 0, timeout=15), (
                _status(target)
            )
            assert caller._host.conns[target.peer_id].transport == "relay"
            assert _counter(caller, target.peer_id) == 2

            conn = caller._host.conns[target.peer_id]
            fds = len(os.listdir("/proc/self/fd"))
            lie = {
                "type": "connect",
                "addrs": ["/ip4/192.0.2.1/udp/4001/quic-v1", "/ip4/192.0.2.1/tcp/4001"],
                "nat": DEPENDENT,
                "token": os.urandom(16),
            }
            # the relayed connection's dialer never asks (its receiver does): garbage or a lie
            # from it is reset unanswered, nothing is run
            assert caller.run(_ask(caller, conn, [{"type": "what"}]), timeout=10) is None
            assert caller.run(_ask(caller, conn, [lie, {"type": "sync"}]), timeout=10) is None
            assert _status(target)["failed"] == 3 and _status(target)["refused"] == 2
            # the receiver may ask: garbage, then a lying request (unroutable addresses, claiming a
            # symmetric NAT so the caller probes): each is answered or reset, and the connection
            # stays up (the caller answered the target's three punches already)
            back = target._host.conns[caller.peer_id]
            assert target.run(_ask(target, back, [{"type": "what"}]), timeout=10) is None
            answer = target.run(_ask(target, back, [lie, {"type": "sync"}]), timeout=10)
            assert answer is not None and answer["type"] == "connect"
            assert wait_for(lambda: _status(caller)["active"] == 0 and _status(caller)["failed"] == 4, timeout=10)
            assert not conn.is_closed and _counter(caller, target.peer_id) == 2
            assert len(os.listdir("/proc/self/fd")) <= fds + 2  # no sockets left behind
            # a peer may ask only so often: the budget runs out, the caller says no
            answers = []
            for _ in range(6):
                answers.append(target.run(_ask(target, back, [lie, {"type": "sync"}]), timeout=10))
                assert wait_for(lambda: _status(caller)["active"] == 0, timeout=10)
            assert answers[-1] is None and _status(caller)["refused"] >= 1
            assert not conn.is_closed and _counter(caller, target.peer_id) == 2
        finally:
            target.stop()


def test_a_punch_whose_direct_path_came_up_before_its_wait_ends_at_once(monkeypatch):
    """The peer's dial can get through, and identify, while the asker still closes its exchange
    stream: the punch must see that success instead of waiting out its window for an event that
    already happened (the NAT lab's callee showed "active" after the caller had a direct path)."""
    monkeypatch.setattr(hp_actor, "WINDOW", 60.0)
    with lattica.Node([TCP]) as a, lattica.Node([TCP]) as b:
        a.connect(b.addrs[0])
        punches = a._host.services.holepunch
        punch = Punch(plan=Plan(), delay=0.0, rtt=None, token=os.urandom(16))
        assert a.run(punches._run(b.peer_id, punch, initiator=True), timeout=10) is True
        assert not punches._waiting
