"""A relay's bandwidth for strangers (issue 17 must-have 5): a circuit with no member of the
relay's mesh at either end gets the stranger limits (bytes, duration, circuits per peer); one with a
member at an end gets the general limits (unlimited by default). Real nodes on loopback."""

from __future__ import annotations

import pytest

import lattica
import sample_actors as sa
from helpers import wait_for
from lattica.actors.nat.relay import RelayConfig
from lattica.config import NatConfig
from lattica.errors import LatticaError
from lattica.trust import MeshKey

pytestmark = pytest.mark.timeout(60)

TCP = "/ip4/127.0.0.1/tcp/0"
BIG = "x" * 200_000  # more than the strangers' circuit may carry here


def _private(relay, mesh, **kw):
    return lattica.Node(
        [],
        relays=[str(relay.addrs[0])],
        nat=NatConfig(reachability="private"),
        allow=["sample_actors.*"],
        membership=False,
        mesh=mesh,
        **kw,
    )


def _echo(caller, target, payload):
    async def go():
        ref = sa.Counter.options(node=target.peer_id).remote()
        return await ref.echo.remote(payload)

    return caller.run(go(), timeout=20)


def _through_relay(relay, a, b):
    assert wait_for(lambda: len(a.nat_status().relays) >= 1, timeout=10)
    b.connect(relay.addrs[0])
    b._host.remember_addrs(a.peer_id, [lattica.Multiaddr(x) for x in a.nat_status().relays])


@pytest.mark.parametrize("splice", [True, False])
def test_a_circuit_between_strangers_is_limited(splice):
    ours, theirs = MeshKey.generate(), MeshKey.generate()
    cfg = RelayConfig(stranger_circuit_bytes=64 * 1024, splice=splice)
    with lattica.Node([TCP], relay=cfg, mesh=ours) as relay, lattica.Node([], mesh=theirs, membership=False) as b:
        with _private(relay, theirs) as a:
            _through_relay(relay, a, b)
            assert _echo(b, a, "small") == "small"
            assert _conn_transport(b, a) == "relay"
            with pytest.raises(LatticaError):
                _echo(b, a, BIG)
            assert wait_for(lambda: relay._host.services.relay.total_circuits == 0, timeout=10)


def test_a_circuit_with_a_member_at_one_end_is_not():
    ours, theirs = MeshKey.generate(), MeshKey.generate()
    cfg = RelayConfig(stranger_circuit_bytes=64 * 1024)
    with lattica.Node([TCP], relay=cfg, mesh=ours) as relay, lattica.Node([], mesh=theirs, membership=False) as b:
        with _private(relay, ours, members=[b.peer_id]) as a:  # a: a member of the relay's mesh
            _through_relay(relay, a, b)
            assert _echo(b, a, BIG) == BIG
            assert _conn_transport(b, a) == "relay"


def test_a_stranger_holds_few_circuits():
    ours, theirs = MeshKey.generate(), MeshKey.generate()
    cfg = RelayConfig(max_circuits_per_stranger=1)
    with lattica.Node([TCP], relay=cfg, mesh=ours) as relay:
        with (
            _private(relay, theirs) as a,
            _private(relay, theirs) as c,
            lattica.Node([], mesh=theirs, membership=False) as b,
        ):
            _through_relay(relay, a, b)
            _through_relay(relay, c, b)
            assert _echo(b, a, "one") == "one"  # b's first circuit
            with pytest.raises(LatticaError, match="circuits on this relay"):
                _echo(b, c, "two")  # b (a stranger to the relay) already has its one


def _conn_transport(node, peer):
    conn = node._host.conns.get(peer.peer_id)
    return None if conn is None else conn.transport


def test_strangers_hold_at_most_half_of_a_target_s_circuits_and_a_few_per_address():
    """Identities are free: strangers from one address (however many keys they use) open at most
    ``max_stranger_circuits_per_ip`` circuits, and strangers together at most half of one
    target's share, so a member can still reach it (before: 64 throwaway identities from one IP
    held all 64 circuits of a member target)."""
    ours, theirs = MeshKey.generate(), MeshKey.generate()
    cfg = RelayConfig(max_circuits_per_peer=4, max_stranger_circuits_per_ip=3)

    def reach(node, target):  # a connection through the relay: one circuit
        _through_relay(relay, target, node)
        return node.run(node._host.get_connection(target.peer_id), timeout=20).transport

    with lattica.Node([TCP], relay=cfg, mesh=ours) as relay:
        with _private(relay, ours) as a, _private(relay, theirs) as c:  # a: a member target; c: a stranger target
            strangers = [lattica.Node([], mesh=theirs, membership=False).start() for _ in range(4)]
            try:
                assert [reach(s, a) for s in strangers[:2]] == ["relay", "relay"]  # half of a's 4
                with pytest.raises(LatticaError, match="half of"):
                    reach(strangers[2], a)
                assert reach(strangers[3], c) == "relay"  # the third circuit strangers opened from 127.0.0.1
                with pytest.raises(LatticaError, match="per address"):
                    reach(strangers[2], c)
                with lattica.Node([], mesh=ours, membership=False) as member:
                    assert reach(member, a) == "relay"  # the share kept for members
                    assert _echo(member, a, "member") == "member"
            finally:
                for s in strangers:
                    s.stop()
