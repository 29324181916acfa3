"""Bad input from libp2p GossipSub peers (issue 50), over real connections on 127.0.0.1: a
hostile node that looks like a plain libp2p peer (it speaks ``/meshsub/1.1.0`` and not our actor
calls) writes RPCs of its own making to a Lattica subscriber. Forged StrictSign signatures,
unusable seqnos, IHAVE and IWANT floods, malformed and oversized RPCs: each is refused or
bounded, the forger cannot take an honest message's id, and the node serves on."""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Iterator

import pytest

import lattica
from helpers import on_loop, wait_for
from lattica._framing import read_delimited, write_delimited
from lattica._identity import KeyPair
from lattica._protobuf import uvarint
from lattica._rpc import PROTOCOL, PROTOCOL_1
from lattica.bench import host_of
from lattica.config import PubSubConfig
from lattica.errors import LatticaError
from lattica.pubsub import _gossipsub_wire as gs
from lattica.transports.base import Connection, Stream

pytestmark = pytest.mark.timeout(60)

TCP = "/ip4/127.0.0.1/tcp/0"
TOPIC = "shared"
ALICE = KeyPair.generate()


class Hostile:
    """A node that looks like a plain libp2p GossipSub peer to the victim, and writes what it
    likes on its stream; what the victim sends it is kept (``heard``)."""

    def __init__(self) -> None:
        self.node = lattica.Node(listen=[TCP], pubsub=False, membership=False, crdt=False).start()
        self.heard: list[gs.RPC] = []
        self.stream: Stream | None = None
        host = self.node._host

        def plain() -> None:
            for name in (PROTOCOL, PROTOCOL_1, "/lattica/id/1.0.0"):
                host.handlers.pop(name, None)
            host.handlers[gs.MESHSUB_1_1] = self._read

        on_loop(self.node, plain)

    async def _read(self, stream: Stream, conn: Connection) -> None:
        while True:
            try:
                self.heard.append(gs.decode(await read_delimited(stream, gs.MAX_RPC)))
            except LatticaError:
                return

    def join(self, victim: lattica.Node) -> None:
        """Connect on the libp2p stack and open our GossipSub stream, subscribed to TOPIC."""
        host, port = victim.addrs[0].host_port()
        tcp = self.node._host.transport_set.named("tcp")
        on_loop(self.node, lambda: tcp._libp2p_at.__setitem__((host, port), None))
        self.node.connect(victim.addrs[0])

        async def open_stream() -> None:
            conn = self.node._host.conns[victim.peer_id]
            self.stream = await self.node._host.open_stream_on(conn, gs.MESHSUB_1_1)

        self.node.run(open_stream(), timeout=10)
        self.send(gs.RPC(subscriptions=(gs.SubOpts(True, TOPIC),)))

    def send(self, *rpcs: gs.RPC) -> None:
        self.write(*(gs.encode(r) for r in rpcs))

    def write(self, *raws: bytes, framed: bool = True) -> None:
        async def write() -> None:
            assert self.stream is not None
            for raw in raws:
                if framed:
                    write_delimited(self.stream, raw)
                else:
                    self.stream.write(raw)
            await self.stream.drain()

        self.node.run(write(), timeout=10)

    def iwanted(self) -> int:
        return sum(len(r.control.iwant) for r in self.heard)

    def got(self, data: bytes) -> int:
        return sum(1 for r in self.heard for m in r.publish if m.data == data)


@pytest.fixture
def victim() -> Iterator[lattica.Node]:
    cfg = PubSubConfig(libp2p_topics=(TOPIC,), open_topics=(TOPIC,), discover=False)
    with lattica.Node(listen=[TCP], pubsub=cfg, membership=False, crdt=False) as node:
        yield node


@pytest.fixture
def hostile() -> Iterator[Hostile]:
    h = Hostile()
    try:
        yield h
    finally:
        h.node.stop()


def _svc(node: lattica.Node):  # type: ignore[no-untyped-def]
    return host_of(node).services.pubsub


def _plain_peer_of(victim: lattica.Node, h: Hostile) -> bool:
    return on_loop(victim, lambda: h.node.peer_id in _svc(victim).router.plain)


def _seq(n: int) -> bytes:
    return n.to_bytes(8, "big")


def test_a_forged_copy_sent_first_does_not_take_the_honest_messages_id(victim: lattica.Node) -> None:
    """A forger sends a copy of Alice's message (her author and seqno, its own data, her
    signature of the other data) before an honest peer sends hers: the forged copy is refused
    before the router sees it and the honest one is delivered, once."""
    sub = lattica.pubsub.subscribe(TOPIC, node=victim)
    assert sub is not None
    forger, honest = Hostile(), Hostile()
    try:
        forger.join(victim)
        honest.join(victim)
        assert wait_for(lambda: _plain_peer_of(victim, forger) and _plain_peer_of(victim, honest))
        real = gs.sign(ALICE, TOPIC, b"alice's words", _seq(1))
        fake = gs.Message(TOPIC, b"not alice's", real.author, real.seqno, real.signature)
        forger.send(gs.RPC(publish=(fake,)))
        assert wait_for(lambda: on_loop(victim, lambda: _svc(victim).rejected) >= 1)
        honest.send(gs.RPC(publish=(real,)))
        msg = sub.get(timeout=5)
        assert (msg.author, msg.data, msg.seqno) == (ALICE.peer_id, b"alice's words", 1)
        honest.send(gs.RPC(publish=(real,)))  # (a second copy is a duplicate)
        with pytest.raises(TimeoutError):
            sub.get(timeout=0.5)
        score = on_loop(victim, lambda: _svc(victim).router.score(forger.node.peer_id, victim._host.loop.time()))
        assert score < 0
    finally:
        forger.node.stop()
        honest.node.stop()


@pytest.mark.parametrize(
    "bad",
    [
        gs.Message(TOPIC, b"anonymous", None, _seq(2)),
        gs.Message(TOPIC, b"short seqno", ALICE.peer_id, b"\x01\x02", b"x" * 64),
        gs.Message(TOPIC, b"unsigned", ALICE.peer_id, _seq(3)),
        gs.Message(TOPIC, b"wrong key", ALICE.peer_id, _seq(4), b"x" * 64, KeyPair.generate().public_key_protobuf()),
    ],
    ids=["no-author", "short-seqno", "unsigned", "another-key"],
)
def test_messages_strictsign_refuses_are_dropped_and_scored(
    victim: lattica.Node, hostile: Hostile, bad: gs.Message
) -> None:
    sub = lattica.pubsub.subscribe(TOPIC, node=victim)
    assert sub is not None
    hostile.join(victim)
    assert wait_for(lambda: _plain_peer_of(victim, hostile))
    hostile.send(gs.RPC(publish=(bad,)))
    assert wait_for(lambda: on_loop(victim, lambda: _svc(victim).rejected) >= 1)
    with pytest.raises(TimeoutError):
        sub.get(timeout=0.3)
    good = gs.sign(ALICE, TOPIC, b"fine", _seq(9))
    hostile.send(gs.RPC(publish=(good,)))  # (one bad message does not graylist it)
    assert sub.get(timeout=5).data == b"fine"


def test_an_ihave_flood_is_answered_within_the_iwant_budget(victim: lattica.Node, hostile: Hostile) -> None:
    """60 RPCs of 5,000 announced ids each: the victim looks at 10 IHAVEs and asks for at most
    5,000 ids per heartbeat, and keeps at most that many promises."""
    lattica.pubsub.subscribe(TOPIC, node=victim)
    hostile.join(victim)
    assert wait_for(lambda: _plain_peer_of(victim, hostile))
    ids = [ALICE.peer_id.to_bytes() + _seq(i) for i in range(5000)]
    hostile.send(*(gs.RPC(control=gs.Control(ihave=(gs.IHave(TOPIC, tuple(ids)),))) for _ in range(60)))
    assert wait_for(lambda: hostile.iwanted() > 0)
    promises = on_loop(victim, lambda: len(_svc(victim).router._promises))
    assert promises <= 5000
    assert hostile.iwanted() <= 5000 * 2  # (this heartbeat's, and perhaps the next's)
    assert wait_for(lambda: on_loop(victim, lambda: len(victim._host.conns)) == 1)  # still connected, serving


def test_an_iwant_flood_gets_a_message_at_most_three_times(victim: lattica.Node, hostile: Hostile) -> None:
    lattica.pubsub.subscribe(TOPIC, node=victim)
    hostile.join(victim)
    assert wait_for(lambda: _plain_peer_of(victim, hostile))
    assert lattica.pubsub.publish(TOPIC, b"cached", node=victim).result(timeout=5) >= 1
    assert wait_for(lambda: hostile.got(b"cached") == 1)
    mid = next(m for r in hostile.heard for m in r.publish if m.data == b"cached")
    wid = gs.default_id(mid)
    hostile.send(*(gs.RPC(control=gs.Control(iwant=(wid,) * 500)) for _ in range(40)))
    hostile.send(gs.RPC(subscriptions=(gs.SubOpts(True, "marker"),)))
    wait_for(lambda: hostile.got(b"cached") >= 4, timeout=2)
    assert 2 <= hostile.got(b"cached") <= 1 + 3


@pytest.mark.parametrize(
    "raw,framed",
    [
        (os.urandom(300) + b"\xff" * 20, True),
        (b"\x12\x05\x0a\x03abc" * 3 + b"\x1a\xff\xff\xff\xff\x0f", True),
        (uvarint(4 << 20), False),  # a 4 MiB RPC announced (over go's 1 MiB)
    ],
    ids=["garbage", "truncated-control", "oversized"],
)
def test_a_malformed_rpc_ends_the_stream_and_the_node_serves_on(
    victim: lattica.Node, hostile: Hostile, raw: bytes, framed: bool
) -> None:
    sub = lattica.pubsub.subscribe(TOPIC, node=victim)
    assert sub is not None
    hostile.join(victim)
    assert wait_for(lambda: _plain_peer_of(victim, hostile))
    hostile.write(raw, framed=framed)

    async def ended() -> bool:
        assert hostile.stream is not None
        try:
            return await asyncio.wait_for(hostile.stream.read(1), 5) == b""
        except LatticaError:
            return True  # (reset)
        except TimeoutError:
            return False

    assert hostile.node.run(ended(), timeout=10)
    # a fresh stream is read again (the peer is scored, not banned), and a member still publishes
    hostile.join(victim)
    hostile.send(gs.RPC(publish=(gs.sign(ALICE, TOPIC, b"after", _seq(11)),)))
    assert sub.get(timeout=5).data == b"after"


def test_a_stranger_sending_one_rpc_per_message_is_held_to_the_message_share_not_the_batch_budget(
    victim: lattica.Node, hostile: Hostile
) -> None:
    """go and js send about one RPC per message: 200 messages at ~60 a second, one per RPC, are
    all delivered (the strangers' share is 100 a second and 200 at once; the batch budget, 20
    RPCs a second, would have dropped most of them)."""
    sub = lattica.pubsub.subscribe(TOPIC, node=victim)
    assert sub is not None
    hostile.join(victim)
    assert wait_for(lambda: _plain_peer_of(victim, hostile))
    for i in range(200):
        hostile.send(gs.RPC(publish=(gs.sign(ALICE, TOPIC, f"m{i}".encode(), _seq(100 + i)),)))
        time.sleep(1 / 60)
    got = set()
    deadline = time.monotonic() + 10
    while len(got) < 200 and time.monotonic() < deadline:
        try:
            got.add(sub.get(timeout=1).data)
        except TimeoutError:
            pass
    assert len(got) == 200


def test_rpcs_of_thousands_of_signed_messages_cost_only_the_strangers_share(
    victim: lattica.Node, hostile: Hostile
) -> None:
    """Ten RPCs of 2,000 validly signed messages each (20,000 at once): only the strangers'
    share (200 at once, 100 a second) is checked and delivered; the rest is dropped before its
    signatures are checked."""
    sub = lattica.pubsub.subscribe(TOPIC, node=victim)
    assert sub is not None
    hostile.join(victim)
    assert wait_for(lambda: _plain_peer_of(victim, hostile))
    t0 = time.monotonic()
    for r in range(10):
        batch = tuple(gs.sign(ALICE, TOPIC, b"x", _seq(10_000 + r * 2000 + i)) for i in range(2000))
        hostile.send(gs.RPC(publish=batch))
    time.sleep(1.0)
    delivered = on_loop(victim, lambda: _svc(victim).delivered)
    elapsed = time.monotonic() - t0
    assert 0 < delivered <= 200 + 100 * elapsed + 10, (delivered, elapsed)
