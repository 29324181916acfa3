"""Our pub-sub through a Lattica SDK node (rust-libp2p-gossipsub 0.47, ``/meshsub/1.1.0``, issue
50), on 127.0.0.1, on the SDK's own topic ``p2p-circuit-broadcast``: Lattica A - SDK - Lattica
B in a line, A and B not connected. What A publishes reaches B only if rust checked A's StrictSign
signature and passed the message on. The SDK makes every GossipSub peer a direct peer (sent
every message of the topics it joined, never grafted), so this runs without a mesh."""

from __future__ import annotations

import asyncio
import time

import pytest

import lattica
from lattica.bench import host_of
from lattica.bench._peers.sdk_node import SdkNode
from lattica.config import PubSubConfig

pytestmark = pytest.mark.timeout(120)

TOPIC = "p2p-circuit-broadcast"  # (the one topic the SDK subscribes to)


def _node() -> lattica.Node:
    cfg = PubSubConfig(libp2p_topics=(TOPIC,), open_topics=(TOPIC,), discover=False)
    return lattica.Node(["/ip4/127.0.0.1/tcp/0"], membership=False, crdt=False, pubsub=cfg)


def _svc(node: lattica.Node):  # type: ignore[no-untyped-def]
    return host_of(node).services.pubsub


async def _until(what: str, cond, wait: float = 20) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + wait
    while not cond():
        assert time.monotonic() < deadline, what
        await asyncio.sleep(0.1)


def test_a_message_through_an_sdk_node(sdk_python):
    with _node() as a, _node() as b:
        sub_b = lattica.pubsub.subscribe(TOPIC, node=b)
        lattica.pubsub.subscribe(TOPIC, node=a)
        assert sub_b is not None

        async def run() -> None:
            async with await SdkNode.start(sdk_python, [str(a.addrs[0])]) as sdk:
                ps = lattica.PeerId.from_string(sdk.peer_id)
                await asyncio.to_thread(b.connect, sdk.addr())
                # the SDK makes every GossipSub peer a direct peer: it sends each one every
                # message of the topics it joined and grafts none (it prunes our GRAFTs)
                for node in (a, b):
                    await _until(
                        f"the SDK never told {node.peer_id.short()} its topic",
                        lambda node=node: ps in _svc(node).router.topics.get(TOPIC, ()),
                    )
                    assert ps in _svc(node).router.plain
                circuit = f"{a.addrs[0]}/p2p-circuit/p2p/{a.peer_id}"
                # rust's mesh may still be forming: publish until one gets through
                deadline = time.monotonic() + 20
                while True:
                    await asyncio.to_thread(lattica.pubsub.publish(TOPIC, circuit, node=a).result, 5)
                    try:
                        msg = await asyncio.to_thread(sub_b.get, 1.0)
                        break
                    except TimeoutError:
                        assert time.monotonic() < deadline, "nothing of A's reached B through the SDK node"
                assert (msg.author, msg.data) == (a.peer_id, circuit.encode())
                assert msg.via == ps

        b.run(run(), timeout=90)
