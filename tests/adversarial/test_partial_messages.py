"""Unfinished messages (issue 17 must-have 5): a peer that opens call channels and sends most of
a large message, never the rest, makes the node hold at most its budget, per peer and in all; an
unfinished message is dropped at its deadline; honest calls go on. Real nodes on loopback."""

from __future__ import annotations

import pytest

import lattica
import sample_actors as sa
from helpers import call_as, spawn_local, wait_for
from lattica import _rpc as rpc
from lattica.config import InboundBudget
from lattica.trust import MeshKey

pytestmark = pytest.mark.timeout(60)

MiB = 1 << 20


def _start_unfinished(attacker, host, channels, size, sent):
    """Open ``channels`` rpc streams to ``host``; on each, declare a ``size``-byte message and send
    ``sent`` bytes of it. Returns the streams (kept open)."""

    async def go():
        streams = []
        for _ in range(channels):
            s = await attacker._host.open_stream(host.peer_id, rpc.PROTOCOL)
            s.write(size.to_bytes(4, "big") + bytes(sent))
            streams.append(s)
        return streams

    return attacker.run(go(), timeout=20)


def _reset(attacker, streams):
    async def go():
        return [s for s in streams if getattr(s, "_error", None) is not None]

    return attacker.run(go(), timeout=5)


@pytest.fixture
def pair():
    key = MeshKey.generate()
    budget = InboundBudget(per_peer=8 * MiB, per_node=12 * MiB, deadline=3.0, min_rate=20 * MiB)
    with (
        lattica.Node(["/ip4/127.0.0.1/tcp/0"], mesh=key, allow=["sample_actors.*"], inbound=budget) as host,
        lattica.Node([], mesh=key) as attacker,
    ):
        attacker.connect(host.addrs[0])
        yield host, attacker, key


def test_one_peer_holds_at_most_its_budget(pair):
    host, attacker, key = pair
    partials = host._host.runtime.partials
    streams = _start_unfinished(attacker, host, channels=8, size=60 * MiB, sent=3 * MiB)  # 24 MiB offered
    assert wait_for(lambda: len(_reset(attacker, streams)) >= 6, timeout=10)
    assert partials.total <= 8 * MiB
    assert len(_reset(attacker, streams)) >= 6  # only two channels' 3 MiB fit under 8 MiB


def test_many_peers_together_hold_at_most_the_node_budget_and_honest_calls_go_on(pair):
    host, attacker, key = pair
    partials = host._host.runtime.partials
    counter = spawn_local(host, sa.Counter, 0, name="counter")
    others = [lattica.Node([], mesh=key).start() for _ in range(3)]
    try:
        streams = []
        for node in [attacker] + others:
            node.connect(host.addrs[0])
            streams += [(node, s) for s in _start_unfinished(node, host, channels=2, size=60 * MiB, sent=3 * MiB)]
        assert wait_for(lambda: sum(len(_reset(n, [s])) for n, s in streams) >= 4, timeout=10)  # 24 MiB offered
        assert partials.total <= 12 * MiB
        with lattica.Node([], mesh=key) as honest:
            honest.connect(host.addrs[0])
            assert call_as(honest, counter, "incr") == 1
    finally:
        for n in others:
            n.stop()


def test_an_unfinished_message_is_dropped_at_its_deadline(pair):
    host, attacker, key = pair
    partials = host._host.runtime.partials
    streams = _start_unfinished(attacker, host, channels=1, size=10 * MiB, sent=1 * MiB)
    assert wait_for(lambda: partials.total > 0, timeout=5)
    assert wait_for(lambda: partials.total == 0, timeout=6)  # deadline 3 s
    assert wait_for(lambda: _reset(attacker, streams), timeout=3)


def test_strangers_cannot_crowd_out_members():
    key = MeshKey.generate()
    budget = InboundBudget(per_peer=8 * MiB, per_node=12 * MiB, deadline=30.0, per_stranger=2 * MiB, strangers=3 * MiB)
    with lattica.Node(["/ip4/127.0.0.1/tcp/0"], mesh=key, allow=["sample_actors.*"], inbound=budget) as host:
        partials = host._host.runtime.partials
        counter = spawn_local(host, sa.Counter, 0, name="counter")
        strangers = [lattica.Node([], mesh=MeshKey.generate()).start() for _ in range(3)]
        try:
            streams = []
            for node in strangers:
                node.connect(host.addrs[0])
                streams += [
                    (node, s) for s in _start_unfinished(node, host, channels=2, size=60 * MiB, sent=int(1.5 * MiB))
                ]
            assert wait_for(lambda: sum(len(_reset(n, [s])) for n, s in streams) >= 4, timeout=10)  # 9 MiB offered
            assert partials.strangers <= 3 * MiB
            with lattica.Node([], mesh=key) as member:
                member.connect(host.addrs[0])
                big = "x" * (6 * MiB)  # a member's large call still fits in what strangers cannot use
                assert call_as(member, counter, "echo", big, timeout=20) == big
        finally:
            for n in strangers:
                n.stop()
