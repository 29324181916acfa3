"""Our pub-sub with js-libp2p's GossipSub (@libp2p/gossipsub 17, js-libp2p 3.3: ``/meshsub/1.2.0``,
StrictSign, flood publish) on 127.0.0.1 (issue 50), as test_go_gossipsub.py does with go: js's
messages reach our subscribers, ours reach js's, both ways through a Lattica node in the middle,
and each side's signatures hold for the other. js dials us and we dial js."""

from __future__ import annotations

import time
from collections.abc import Callable

import pytest

import lattica
from lattica.bench._peers.js_peer import JsPeer, js_peer
from lattica.config import PubSubConfig

pytestmark = pytest.mark.timeout(120)

TOPIC = "lattica-js-interop"
GOSSIPSUB = {"gossipsub": True}


def _until(cond: Callable[[], bool], what: str, timeout: float = 15.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, what
        time.sleep(0.05)


def _node() -> lattica.Node:
    return lattica.Node(
        membership=False, crdt=False, pubsub=PubSubConfig(libp2p_topics=(TOPIC,), open_topics=(TOPIC,), discover=False)
    )


def _tcp(node: lattica.Node) -> str:
    return next(str(a) for a in node.addrs if "/tcp/" in str(a))


def _js_sees(js: JsPeer, node: lattica.Node) -> bool:
    """js knows ``node`` subscribes to the topic (so its flood publish goes there)."""
    return str(node.peer_id) in js.call("peers", topic=TOPIC)["subscribers"]


def _in_mesh(node: lattica.Node, peer: str | lattica.PeerId) -> bool:
    """``peer`` is in ``node``'s mesh for the topic."""
    return lattica.PeerId.from_string(str(peer)) in lattica.pubsub.peers(TOPIC, node=node)


def _next_from(js: JsPeer, author: lattica.PeerId, timeout: float = 10.0) -> bytes:
    """The data of the first message ``author`` published that js received (polled; the
    messages js took before it are dropped)."""
    deadline = time.monotonic() + timeout
    while True:
        for m in js.call("messages", topic=TOPIC)["messages"]:
            if m["from"] == str(author):
                assert len(m["seqno_hex"]) == 16, m  # (8 bytes, big-endian)
                return bytes.fromhex(m["data_hex"])
        assert time.monotonic() < deadline, f"js never received a message from {author}"
        time.sleep(0.05)


def test_js_and_lattica_in_one_topic(js_root):
    with js_peer(js_root, GOSSIPSUB) as js, _node() as node:
        sub = lattica.pubsub.subscribe(TOPIC, node=node)
        assert sub is not None
        js.call("subscribe", topic=TOPIC)
        assert js.call("dial", addr=_tcp(node))["peer"] == str(node.peer_id)
        _until(lambda: _in_mesh(node, js.peer_id), "js never joined our mesh")
        _until(lambda: _js_sees(js, node), "js never saw our subscription")

        # js -> us (signed by js, StrictSign, checked here)
        assert js.call("publish", topic=TOPIC, data_hex=b"from js".hex())["recipients"] >= 1
        msg = sub.get(10)
        assert (msg.author, msg.data) == (lattica.PeerId.from_string(js.peer_id), b"from js")

        # us -> js (signed by us, checked by js)
        assert lattica.pubsub.publish(TOPIC, b"from lattica", node=node).result(10) >= 1
        assert _next_from(js, node.peer_id) == b"from lattica"


def test_messages_pass_through_a_lattica_node_both_ways(js_root):
    """js A - Lattica B - Lattica C - js D, a line: A's message reaches C and D (B passes it on
    to C over our batches, unchanged, and C to D over GossipSub), and C's reaches A and D. B
    dials A; D dials C."""
    with (
        js_peer(js_root, GOSSIPSUB) as a,
        js_peer(js_root, GOSSIPSUB) as d,
        _node() as b,
        _node() as c,
    ):
        sub_c = lattica.pubsub.subscribe(TOPIC, node=c)
        sub_b = lattica.pubsub.subscribe(TOPIC, node=b)
        assert sub_c is not None and sub_b is not None
        a.call("subscribe", topic=TOPIC)
        d.call("subscribe", topic=TOPIC)
        c.connect(b.addrs[0])
        assert str(b.connect(a.addr("tcp")).peer_id) == a.peer_id
        assert d.call("dial", addr=_tcp(c))["peer"] == str(c.peer_id)
        _until(lambda: _js_sees(a, b), "js A never saw B's subscription")
        _until(lambda: _js_sees(d, c), "js D never saw C's subscription")
        _until(lambda: _in_mesh(b, a.peer_id), "A never joined B's mesh")
        _until(lambda: _in_mesh(c, d.peer_id), "D never joined C's mesh")
        _until(lambda: _in_mesh(c, b.peer_id), "B and C never meshed")

        pa = lattica.PeerId.from_string(a.peer_id)
        assert a.call("publish", topic=TOPIC, data_hex=b"from js A".hex())["recipients"] >= 1
        msg = sub_c.get(10)
        assert (msg.author, msg.data) == (pa, b"from js A")
        assert _next_from(d, pa) == b"from js A"

        assert lattica.pubsub.publish(TOPIC, "from C", node=c).result(10) >= 1
        assert _next_from(a, c.peer_id) == b"from C"
        assert _next_from(d, c.peer_id) == b"from C"
        assert a.peer_id != d.peer_id
