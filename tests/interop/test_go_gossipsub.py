"""Our pub-sub with go-libp2p-pubsub v0.10 GossipSub (p2pd ``-pubsub``: ``/meshsub/1.1.0``,
StrictSign) on 127.0.0.1 (issue 50): go's messages reach our subscribers, ours reach go's, both
ways through a Lattica node in the middle, and each side's signatures hold for the other."""

from __future__ import annotations

import asyncio
import time

import pytest

import lattica
from lattica.bench._peers.p2pd import Daemon, Subscription, daemon
from lattica.config import PubSubConfig

pytestmark = pytest.mark.timeout(120)

TOPIC = "lattica-go-interop"


async def _until(cond, what: str, timeout: float = 15.0) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while not await cond():
        assert time.monotonic() < deadline, what
        await asyncio.sleep(0.05)


def _node() -> lattica.Node:
    return lattica.Node(
        membership=False, crdt=False, pubsub=PubSubConfig(libp2p_topics=(TOPIC,), open_topics=(TOPIC,), discover=False)
    )


async def _join(d: Daemon, node: lattica.Node) -> None:
    await d.connect(node.peer_id, [a.without_peer_id() for a in node.addrs])


def test_go_and_lattica_in_one_topic(p2pd_binary):
    with (
        daemon(p2pd_binary, flags=("-pubsub",)) as go,
        _node() as node,
    ):
        sub = lattica.pubsub.subscribe(TOPIC, node=node)
        assert sub is not None

        async def run() -> None:
            gsub = await go.ps_subscribe(TOPIC)
            pgo, _ = await go.identify()
            await _join(go, node)
            await _until(
                lambda: asyncio.sleep(0, pgo in lattica.pubsub.peers(TOPIC, node=node)), "go never joined our mesh"
            )
            await _until(lambda: _has(go, node), "go never saw our subscription")

            # go -> us
            await go.ps_publish(TOPIC, b"from go")
            msg = await asyncio.to_thread(sub.get, 10)
            assert (msg.author, msg.data) == (pgo, b"from go")

            # us -> go (signed by us, StrictSign, checked by go)
            assert await lattica.pubsub.publish(TOPIC, b"from lattica", node=node) >= 1
            assert await _next_from(gsub, node.peer_id) == b"from lattica"
            gsub.close()

        node.run(run(), timeout=60)


async def _next_from(sub: Subscription, author: lattica.PeerId) -> bytes:
    """The data of the next message ``author`` published that go delivers (go delivers its own
    messages to its subscriptions too: skipped)."""
    while True:
        who, _, data = await sub.next()
        if who == author:
            return data


async def _has(d: Daemon, node: lattica.Node) -> bool:
    return node.peer_id in await d.ps_peers(TOPIC)


def test_messages_pass_through_a_lattica_node_both_ways(p2pd_binary):
    """go A - Lattica B - Lattica C - go D, a line: A's message reaches C and D (B passes it on
    to C over our batches, unchanged, and C to D over GossipSub), and C's reaches A."""
    with (
        daemon(p2pd_binary, flags=("-pubsub",)) as a,
        daemon(p2pd_binary, flags=("-pubsub",)) as d,
        _node() as b,
        _node() as c,
    ):
        sub_c = lattica.pubsub.subscribe(TOPIC, node=c)
        lattica.pubsub.subscribe(TOPIC, node=b)
        assert sub_c is not None
        c.connect(b.addrs[0])

        async def run() -> None:
            sub_a, sub_d = await a.ps_subscribe(TOPIC), await d.ps_subscribe(TOPIC)
            (pa, _), (pd, _) = await a.identify(), await d.identify()
            await _join(a, b)
            await _join(d, c)
            await _until(lambda: _has(a, b), "go A never saw B's subscription")
            await _until(lambda: _has(d, c), "go D never saw C's subscription")
            await _until(
                lambda: asyncio.sleep(0, b.peer_id in lattica.pubsub.peers(TOPIC, node=c)), "B and C never meshed"
            )

            await a.ps_publish(TOPIC, b"from go A")
            msg = await asyncio.to_thread(sub_c.get, 10)
            assert (msg.author, msg.data) == (pa, b"from go A")
            assert await _next_from(sub_d, pa) == b"from go A"

            assert await lattica.pubsub.publish(TOPIC, "from C", node=c) >= 1
            assert await _next_from(sub_a, c.peer_id) == b"from C"
            assert await _next_from(sub_d, c.peer_id) == b"from C"
            assert pd != pa
            sub_a.close()
            sub_d.close()

        c.run(run(), timeout=90)
