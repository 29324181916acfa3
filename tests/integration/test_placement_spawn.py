"""Placement wired into spawning: ``.options(resources=, labels=, placement=)`` picks a node from
the membership view, the target's spawner reserves the resources (or refuses, and the next
candidate is tried), reservations are gossiped and released when the actor stops."""

from __future__ import annotations

import collections
import contextlib

import pytest

import lattica
import sample_actors as sa
from helpers import wait_for

TCP = "/ip4/127.0.0.1/tcp/0"
ALLOW = ["sample_actors.*"]


@contextlib.contextmanager
def _mesh(*specs: dict):
    """Nodes with the given resources/labels, all connected, each seeing everyone's resources."""
    with contextlib.ExitStack() as stack:
        nodes = [stack.enter_context(lattica.Node([TCP], allow=ALLOW, **spec)) for spec in specs]
        for i, n in enumerate(nodes[1:], 1):
            for m in nodes[:i]:
                n.connect(m.addrs[0])
        assert wait_for(
            lambda: all(len(n.nodes()) == len(nodes) and all("cpu" in r for r in n.nodes()) for n in nodes), timeout=10
        )
        yield nodes


def _row(node: lattica.Node, peer: lattica.PeerId) -> dict:
    return next(r for r in node.nodes() if r["peer_id"] == str(peer))


def test_spread_fills_every_node_to_its_offer_then_says_why_nothing_fits():
    with _mesh({"resources": {"cpu": 1}}, {"resources": {"cpu": 2}}, {"resources": {"cpu": 2}}) as (a, b, c):

        async def place(n):
            refs = [sa.Counter.options(resources={"cpu": 1}).remote(i) for i in range(n)]
            return refs, [await r.get.remote() for r in refs]

        refs, values = a.run(place(5), timeout=30)
        assert values == list(range(5))  # every call reached the node that accepted the spawn
        per_node = collections.Counter(r.peer_id for r in refs)
        assert per_node == {a.peer_id: 1, b.peer_id: 2, c.peer_id: 2}
        with pytest.raises(lattica.errors.PlacementError, match="no node fits"):
            a.run(place(1), timeout=30)
        # the reservations travel in the gossiped load ...
        assert wait_for(lambda: _row(c, b.peer_id)["load"].get("reserved") == {"cpu": 2.0}, timeout=5)
        # ... and are released when the actor stops
        on_b = next(r for r in refs if r.peer_id == b.peer_id)
        a.run(lattica.akill(on_b), timeout=10)
        assert wait_for(lambda: _row(a, b.peer_id)["load"].get("reserved") == {"cpu": 1.0}, timeout=5)
        ref = a.run(_spawn_and_get(sa.Counter.options(resources={"cpu": 1}), 7), timeout=30)
        assert ref.peer_id == b.peer_id


async def _spawn_and_get(cls, value):
    ref = cls.remote(value)
    assert await ref.get.remote() == value
    return ref


def test_labels_choose_the_node_and_pack_fills_the_fullest_first():
    with _mesh(
        {"resources": {"cpu": 4}}, {"resources": {"cpu": 4}, "labels": {"zone": "b"}}, {"resources": {"cpu": 8}}
    ) as (a, b, c):
        ref = a.run(_spawn_and_get(sa.Counter.options(labels={"zone": "b"}), 1), timeout=30)
        assert ref.peer_id == b.peer_id
        with pytest.raises(lattica.errors.PlacementError, match="labels"):
            a.run(_spawn_and_get(sa.Counter.options(labels={"zone": "nowhere"}), 1), timeout=30)
        # pack: the node with the least room that still fits (a or b: 4 cpus, not c's 8)
        packed = a.run(_spawn_and_get(sa.Counter.options(resources={"cpu": 3}, placement="pack"), 2), timeout=30)
        assert packed.peer_id in (a.peer_id, b.peer_id)
        with pytest.raises(lattica.errors.PlacementError, match="placement must be"):
            a.run(_spawn_and_get(sa.Counter.options(placement="everywhere"), 1), timeout=30)
        with pytest.raises(ValueError, match="not both"):
            sa.Counter.options(node=b.peer_id, resources={"cpu": 1})


def test_a_refusing_spawner_sends_the_spawn_to_the_next_candidate():
    """a's view is stale (b's gossip is held back, as when it lags): b looks like the best fit but
    its spawner holds every cpu already, refuses, and the actor lands on c; a call made through
    the ref meanwhile follows it there."""
    with _mesh({"resources": {"cpu": 1}}, {"resources": {"cpu": 2}}, {"resources": {"cpu": 3}}) as (a, b, c):
        b.run(_freeze_load(b._host.services.membership), timeout=5)
        b.run(_reserve_all(b), timeout=30)  # another caller's placement, unseen by a
        assert _row(a, b.peer_id)["load"].get("reserved") is None  # a still thinks b is free

        async def place_and_call():
            ref = sa.Counter.options(resources={"cpu": 2}, placement="pack").remote(11)
            first_target = ref.peer_id
            return first_target, await ref.get.remote(), ref

        first, value, ref = a.run(place_and_call(), timeout=30)
        assert first == b.peer_id  # pack: b had the least room that fits
        assert value == 11 and ref.peer_id == c.peer_id


async def _freeze_load(membership):
    membership.load_changed = lambda: None
    membership._next_load = float("inf")


async def _reserve_all(node):
    await node._host.runtime.actors["spawner"].instance.spawn(
        "sample_actors.Counter", [0], None, "filler", {"reserve": {"cpu": 2}}
    )
