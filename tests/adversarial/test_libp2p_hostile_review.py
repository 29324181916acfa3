"""A hostile review of GossipSub with libp2p peers and of the Lattica SDK's RPC (issue 50), over
real connections on 127.0.0.1. Each test is an attack that worked before its fix (findings 3
and 10 were fixed after the review, which pinned them as xfail tests). The review's findings:

1. a Lattica stranger forwards a forged libp2p message inside its batch (``[topic, protobuf]``):
   its signature was never checked, so it was delivered and passed on under any author, and a
   relayed address was filed under another peer's name;
2. a plain peer that says it is rust-libp2p sends an IHAVE id of kilobytes (base58 parsed over
   and over: quadratic, an hour of the loop for one 1 MiB id) or of thousands of digits (the
   stream's reader died);
3. a plain stranger's RPCs were decoded before any budget was taken;
4. messages of topics we never joined had their signatures checked, at every copy; an RPC of
   80,000 IHAVE ids was parsed and translated whole; a graylisted peer's RPCs were decoded;
5. an SDK caller that never reads its answers held its calls' slots for good;
6. a req-resp request that stalls (or never starts) held its stream for 17 minutes;
7. a served object's inherited builtins, callable attributes and lifecycle hooks were callable;
8. a hostile SDK node's streaming answer could make us hold 64 items of 16 MiB per call;
9. authors flooding the SDK's relay-address topic pushed known peers out of the address book;
10. a libp2p message was accepted again once 100,000 newer ones pushed it out of the seen
    cache, well within the 120 s the docs promise.

Found after the review: strangers from one address held the strangers' half of the SDK call
slots for good by re-issuing their calls; a streaming SDK call to a peer that went silent
waited as long as the peer kept its stream open.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

import lattica
from helpers import call_as, on_loop, wait_for
from lattica._framing import read_delimited, write_delimited
from lattica._identity import KeyPair, PeerId
from lattica._multiaddr import Multiaddr
from lattica._protobuf import uvarint
from lattica._rpc import PROTOCOL, PROTOCOL_1
from lattica.actors.pubsub.service import pubsub_ref
from lattica.bench import host_of
from lattica.config import InboundBudget, PubSubConfig
from lattica.errors import LatticaError, SdkStreamIdle
from lattica.pubsub import _gossipsub_wire as gs
from lattica.sdk import _wire as w
from lattica.transports.base import Connection, Stream
from lattica.trust import MeshKey

pytestmark = pytest.mark.timeout(60)

TCP = "/ip4/127.0.0.1/tcp/0"
TOPIC = "shared"
ALICE = KeyPair.generate()
QUIET = {"membership": False, "crdt": False}


def _seq(n: int) -> bytes:
    return n.to_bytes(8, "big")


def _svc(node: lattica.Node) -> Any:
    return host_of(node).services.pubsub


class Plain:
    """A node that looks like a plain libp2p GossipSub peer (it speaks ``/meshsub/1.1.0`` and not
    our actor calls), with the agent version and mesh given; it writes what it likes."""

    def __init__(self, agent: str = "go-libp2p", mesh: Any = None) -> None:
        opts: dict[str, Any] = {"agent_version": agent}
        if mesh is not None:
            opts["mesh"] = mesh
        self.node = lattica.Node(listen=[TCP], pubsub=False, **QUIET, **opts).start()
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

    def join(self, victim: lattica.Node, topic: str = TOPIC) -> None:
        host, port = victim.addrs[0].host_port()
        tcp = self.node._host.transport_set.named("tcp")
        on_loop(self.node, lambda: tcp._libp2p_at.__setitem__((host, port), None))
        self.node.connect(victim.addrs[0])

        async def open_stream() -> None:
            conn = self.node._host.conns[victim.peer_id]
            self.stream = await self.node._host.open_stream_on(conn, gs.MESHSUB_1_1)

        self.node.run(open_stream(), timeout=10)
        self.send(gs.RPC(subscriptions=(gs.SubOpts(True, topic),)))
        assert wait_for(lambda: on_loop(victim, lambda: self.node.peer_id in _svc(victim).router.plain))

    def send(self, *rpcs: gs.RPC) -> None:
        async def write() -> None:
            assert self.stream is not None
            for r in rpcs:
                write_delimited(self.stream, gs.encode(r))
            await self.stream.drain()

        self.node.run(write(), timeout=20)

    def stop(self) -> None:
        self.node.stop()


@pytest.fixture
def plain() -> Iterator[Callable[..., Plain]]:
    made: list[Plain] = []

    def make(*args: Any, **kw: Any) -> Plain:
        made.append(Plain(*args, **kw))
        return made[-1]

    try:
        yield make
    finally:
        for p in made:
            p.stop()


def _victim(mesh: Any = None, **cfg: Any) -> lattica.Node:
    pcfg = PubSubConfig(libp2p_topics=(TOPIC,), open_topics=(TOPIC,), discover=False, **cfg)
    opts: dict[str, Any] = {} if mesh is None else {"mesh": mesh}
    return lattica.Node(listen=[TCP], pubsub=pcfg, **QUIET, **opts)


class _Count:
    """Counts the calls of a function (and the arguments' lengths), calling it through."""

    def __init__(self, fn: Callable[..., Any]) -> None:
        self.fn = fn
        self.calls = 0
        self.longest = 0

    def __call__(self, *args: Any) -> Any:
        self.calls += 1
        if args and isinstance(args[-1], str | bytes):
            self.longest = max(self.longest, len(args[-1]))
        return self.fn(*args)


# -- 1. forged libp2p messages inside a Lattica stranger's batch -----------------------------------


def test_a_strangers_batch_cannot_carry_a_forged_libp2p_message() -> None:
    """A Lattica node outside the victim's mesh calls ``open_rpc`` with a libp2p message in
    Alice's name whose signature is junk: refused (before the fix: delivered to subscribers and
    passed on to every peer, the libp2p ones scoring the victim down for it). The honest copy
    still arrives."""
    with (
        _victim(mesh=MeshKey.generate()) as victim,
        lattica.Node(listen=[TCP], pubsub=False, mesh=MeshKey.generate(), **QUIET) as stranger,
    ):
        sub = lattica.pubsub.subscribe(TOPIC, node=victim)
        assert sub is not None
        stranger.connect(victim.addrs[0])
        assert host_of(victim).circle_of(stranger.peer_id) == "stranger"
        real = gs.sign(ALICE, TOPIC, b"alice's words", _seq(1))
        fake = gs.Message(TOPIC, b"not alice's words", ALICE.peer_id, _seq(1), b"\x01" * 64)
        batch = [[], [[TOPIC, gs.encode_message(fake)]], [], [], [], [], []]
        call_as(stranger, pubsub_ref(victim.peer_id), "open_rpc", batch)
        assert wait_for(lambda: on_loop(victim, lambda: _svc(victim).rejected) >= 1)
        with pytest.raises(TimeoutError):
            sub.get(timeout=0.5)
        batch[1] = [[TOPIC, gs.encode_message(real)]]
        call_as(stranger, pubsub_ref(victim.peer_id), "open_rpc", batch)
        msg = sub.get(timeout=5)
        assert (msg.author, msg.data) == (ALICE.peer_id, b"alice's words")


def test_a_stranger_cannot_file_a_relayed_address_under_another_peer() -> None:
    """On the SDK swarm's relay-address topic (open to strangers), a Lattica stranger forwards
    a message in Bob's name saying Bob is reached through the stranger's relay: not filed
    (before the fix it was: Bob's calls would go through the attacker)."""
    bob = KeyPair.generate()
    with (
        lattica.Node(listen=[TCP], sdk=True, mesh=MeshKey.generate(), **QUIET) as victim,
        lattica.Node(listen=[TCP], pubsub=False, mesh=MeshKey.generate(), **QUIET) as stranger,
    ):
        topic = host_of(victim).config.sdk.relay_topic
        assert wait_for(lambda: on_loop(victim, lambda: topic in _svc(victim).router.mesh))
        stranger.connect(victim.addrs[0])
        addr = f"/ip4/127.0.0.1/tcp/4001/p2p/{stranger.peer_id}/p2p-circuit/p2p/{bob.peer_id}"
        version = host_of(victim).config.protocol_version
        fake = gs.Message(topic, w.encode_relay_addr(addr, version), bob.peer_id, _seq(5), b"\x02" * 64)
        call_as(
            stranger,
            pubsub_ref(victim.peer_id),
            "open_rpc",
            [[], [[topic, gs.encode_message(fake)]], [], [], [], [], []],
        )
        assert wait_for(lambda: on_loop(victim, lambda: _svc(victim).rejected) >= 1)
        assert not on_loop(victim, lambda: host_of(victim).peer_addrs.get(bob.peer_id))
        assert host_of(victim).services.sdk_swarm.learned == 0


# -- 2. ids in rust's text dialect -------------------------------------------------------------------


@pytest.mark.parametrize(
    "wid",
    [
        b"A" * 4000 + b"1234567890123456789",  # base58 of 4 KB: each split parsed (quadratic)
        b"12D3KooW" + b"1" * 5000,  # thousands of digits: int() refused them, out of the reader
    ],
    ids=["long-author", "long-seqno"],
)
def test_ihave_ids_no_peer_id_could_be_are_skipped_unparsed(
    plain: Callable[..., Plain], monkeypatch: pytest.MonkeyPatch, wid: bytes
) -> None:
    """A peer that says it runs rust-libp2p (whose ids are text: the author in base58, then the
    seqno in decimal) announces ids no PeerId and seqno could make: skipped without parsing
    them, and its stream is still read (a message after them arrives)."""
    from lattica.pubsub import _libp2p

    parsed = _Count(PeerId.from_string)
    monkeypatch.setattr(_libp2p.PeerId, "from_string", parsed)
    with _victim() as victim:
        sub = lattica.pubsub.subscribe(TOPIC, node=victim)
        assert sub is not None
        rust = plain("rust-libp2p/0.54.1")
        rust.join(victim)
        assert wait_for(
            lambda: on_loop(victim, lambda: _svc(victim)._meshsub.peers[rust.node.peer_id].dialect.value) == "text"
        )
        rust.send(
            gs.RPC(control=gs.Control(ihave=(gs.IHave(TOPIC, (wid,)),))),
            gs.RPC(publish=(gs.sign(ALICE, TOPIC, b"after", _seq(3)),)),
        )
        assert sub.get(timeout=10).data == b"after"
        assert parsed.longest <= 64, f"parsed a {parsed.longest}-character text as a PeerId"


# -- 3. what a plain peer's RPCs cost before anything is counted --------------------------------------


def test_a_plain_strangers_rpcs_beyond_its_share_are_not_decoded(
    plain: Callable[..., Plain], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A plain stranger sends 400 RPCs without messages as fast as it can: only the strangers'
    batch share of them (40 at once, then 20 a second) is decoded, the rest read and dropped
    undecoded. Before the fix every one was decoded, and its ids translated, before anything
    was charged: an RPC of 5,000 signed messages cost 0.2 s of the victim's loop to decode
    (before the review's caps, one of 80,000 IHAVE ids cost 1.2 s), and one identity's stream
    kept the loop busy."""
    from lattica._runtime import partials

    decoded = _Count(gs.decode)
    read = _Count(partials.read_length)
    monkeypatch.setattr(gs, "decode", decoded)
    monkeypatch.setattr(partials, "read_length", read)
    with _victim(mesh=MeshKey.generate()) as victim:
        lattica.pubsub.subscribe(TOPIC, node=victim)
        stranger = plain(mesh=MeshKey.generate())
        stranger.join(victim)
        assert host_of(victim).circle_of(stranger.node.peer_id) == "stranger"
        loop = asyncio.new_event_loop()
        start = loop.time()
        n = 400
        stranger.send(*(gs.RPC(subscriptions=(gs.SubOpts(i % 2 == 0, "other"),)) for i in range(n)))
        assert wait_for(lambda: read.calls >= n + 1, timeout=10)
        elapsed = loop.time() - start
        loop.close()
        assert decoded.calls <= 40 + 20 * elapsed + 2, (decoded.calls, elapsed)


def test_a_plain_strangers_dense_rpcs_cost_no_more_than_the_strangers_share_of_fields(
    plain: Callable[..., Plain], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A plain stranger sends RPCs of one message padded with 30,000 fields each (48 ms of
    decoding apiece: the densest 60 KB), as fast as it can: what it makes the victim read stops
    at the fields all strangers may take (64,000 at once, 20,000 a second), the rest dropped
    undecoded, its stream still read; once the share refills, an honest message of its arrives.
    Before the fix, each was decoded whole before anything was charged."""
    from lattica.actors.pubsub import strangers as strangers_module

    rate, burst = strangers_module.STRANGERS_FIELDS
    read: list[int] = []
    charge = strangers_module.Strangers.fields_read
    monkeypatch.setattr(strangers_module.Strangers, "fields_read", lambda self, n: (read.append(n), charge(self, n)))
    with _victim(mesh=MeshKey.generate()) as victim:
        sub = lattica.pubsub.subscribe(TOPIC, node=victim)
        assert sub is not None
        stranger = plain(mesh=MeshKey.generate())
        stranger.join(victim)
        svc = _svc(victim)
        padded = gs.encode_message(gs.sign(ALICE, TOPIC, b"padded", _seq(1))) + b"\x38\x00" * 30_000
        raw = b"\x12" + uvarint(len(padded)) + padded  # (an RPC: field 2, one message)
        loop = asyncio.new_event_loop()
        start = loop.time()

        async def write() -> None:
            assert stranger.stream is not None
            for _ in range(12):
                write_delimited(stranger.stream, raw)
            await stranger.stream.drain()

        before = len(read)
        stranger.node.run(write(), timeout=20)
        assert wait_for(lambda: len(read) >= before + 12, timeout=10)
        elapsed = loop.time() - start
        loop.close()
        assert on_loop(victim, lambda: svc._strangers.undecoded) >= 1
        assert sum(read[before:]) <= burst + rate * elapsed + 10, (sum(read[before:]), elapsed)
        time.sleep(2.0)  # (the share refills)
        stranger.send(gs.RPC(publish=(gs.sign(ALICE, TOPIC, b"honest", _seq(2)),)))
        while (got := sub.get(timeout=5).data) != b"honest":
            assert got == b"padded"


def test_messages_of_topics_we_never_joined_are_not_checked(
    plain: Callable[..., Plain], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A member (a plain libp2p peer of our mesh: in an open mesh, any) sends 200 signed
    messages of a topic the victim never joined, twice: the router drops them unremembered, so
    their signatures need no check (before the fix: 400 checks, and again at every copy)."""
    checked = _Count(gs.verify)
    monkeypatch.setattr(gs, "verify", checked)
    with _victim(mesh="open") as victim:
        sub = lattica.pubsub.subscribe(TOPIC, node=victim)
        assert sub is not None
        member = plain()
        member.join(victim)
        assert host_of(victim).circle_of(member.node.peer_id) == "member"
        msgs = tuple(gs.sign(ALICE, "elsewhere", b"x", _seq(i)) for i in range(200))
        member.send(gs.RPC(publish=msgs), gs.RPC(publish=msgs))
        member.send(gs.RPC(publish=(gs.sign(ALICE, TOPIC, b"marker", _seq(1)),)))
        assert sub.get(timeout=5).data == b"marker"
        assert checked.calls == 1


def test_an_rpc_of_a_hundred_thousand_ihave_ids_is_read_no_further_than_the_router_looks(
    plain: Callable[..., Plain], monkeypatch: pytest.MonkeyPatch
) -> None:
    """16 IHAVEs of 5,000 ids each (1 MiB): the router asks for at most 5,000 ids a heartbeat
    and looks at 10 IHAVEs, so at most 5,000 of them are read (before the fix all 80,000 were
    parsed and translated: about a second of the victim's loop for one RPC)."""
    from lattica.pubsub import _libp2p

    translated = _Count(_libp2p.Dialect.ours)
    monkeypatch.setattr(_libp2p.Dialect, "ours", lambda self, wid: translated(self, wid))
    with _victim(mesh="open") as victim:
        sub = lattica.pubsub.subscribe(TOPIC, node=victim)
        assert sub is not None
        member = plain()
        member.join(victim)
        ids = tuple(b"\x00\x01" + i.to_bytes(4, "big") + bytes(4) for i in range(5000))
        member.send(gs.RPC(control=gs.Control(ihave=tuple(gs.IHave(TOPIC, ids) for _ in range(16)))))
        member.send(gs.RPC(publish=(gs.sign(ALICE, TOPIC, b"marker", _seq(2)),)))
        assert sub.get(timeout=10).data == b"marker"
        assert translated.calls <= 5000


def test_a_graylisted_plain_peers_rpcs_are_not_decoded(
    plain: Callable[..., Plain], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A member whose forgeries took its score below the graylist threshold sends 200 more
    RPCs: nothing it says is looked at, so they are read and dropped undecoded (before the
    fix each was decoded, its ids translated, and only then ignored)."""
    from lattica._runtime import partials

    decoded = _Count(gs.decode)
    read = _Count(partials.read_length)
    monkeypatch.setattr(gs, "decode", decoded)
    monkeypatch.setattr(partials, "read_length", read)
    with _victim(mesh="open") as victim:
        lattica.pubsub.subscribe(TOPIC, node=victim)
        member = plain()
        member.join(victim)
        for i in range(4):  # (a forgery each: P4 is -10 times their count squared)
            member.send(gs.RPC(publish=(gs.Message(TOPIC, b"forged", ALICE.peer_id, _seq(50 + i), b"\x03" * 64),)))
        threshold = on_loop(victim, lambda: _svc(victim).router.scores.params.graylist_threshold)
        now = victim._host.loop.time
        assert wait_for(
            lambda: on_loop(victim, lambda: _svc(victim).router.score(member.node.peer_id, now()) < threshold)
        )
        before, seen = decoded.calls, read.calls
        member.send(*(gs.RPC(control=gs.Control(graft=(TOPIC,))) for _ in range(200)))
        assert wait_for(lambda: read.calls >= seen + 200, timeout=10)
        assert decoded.calls - before <= 2


# -- 4. the SDK's RPC ---------------------------------------------------------------------------------


class Served:
    """What the victim serves SDK nodes: an endless stream, and a large answer."""

    def forever(self, request: bytes):  # type: ignore[no-untyped-def]
        while True:
            yield bytes(64 * 1024)

    def big(self, request: bytes) -> bytes:
        return bytes(8 << 20)

    def hello(self, request: bytes) -> bytes:
        return b"hello, " + request


@pytest.fixture
def sdk_victim() -> Iterator[lattica.Node]:
    with lattica.Node(
        [TCP], pubsub=False, inbound=InboundBudget(deadline=1.0), mesh=MeshKey.generate(), **QUIET
    ) as node:
        lattica.sdk.serve(Served(), node=node)
        yield node


@pytest.fixture
def sdk_stranger(sdk_victim: lattica.Node) -> Iterator[lattica.Node]:
    with lattica.Node([TCP], pubsub=False, mesh=MeshKey.generate(), **QUIET) as node:
        node.connect(sdk_victim.addrs[0])
        assert host_of(sdk_victim).circle_of(node.peer_id) == "stranger"
        yield node


async def _reset_within(stream: Stream, seconds: float) -> bool:
    """Whether the other side resets ``stream`` within ``seconds`` (we read nothing meanwhile:
    a caller that never reads)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + seconds
    while not stream.aborted and loop.time() < deadline:
        await asyncio.sleep(0.05)
    return stream.aborted


async def _ask(caller: lattica.Node, victim: lattica.Node, request: w.Request) -> w.Message:
    """``request`` over req-resp from ``caller`` to ``victim``: the answer."""
    stream = await caller.aopen_stream(victim.peer_id, w.REQ_RESP)
    stream.write(w.encode_message(request))
    await stream.close()
    got = b""
    while chunk := await asyncio.wait_for(stream.read(1 << 20), 10):
        got += chunk
    return w.decode_message(got)


def test_a_caller_that_never_reads_its_streaming_answers_gives_their_slots_back(
    sdk_victim: lattica.Node, sdk_stranger: lattica.Node, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A stranger starts 16 endless streaming calls on one stream and never reads: once the
    answers wait longer than the send timeout, the stream is reset and the 16 calls' slots are
    free again (before the fix they were held for good: 16 identities took all 256 and every
    SDK node was told "busy")."""
    from lattica.actors import sdk_rpc

    monkeypatch.setattr(sdk_rpc, "SEND_TIMEOUT", 1.0, raising=False)
    svc = host_of(sdk_victim).services.sdk_rpc
    raw = b"".join(
        w.encode_frame(w.StreamRequest(f"f{i}", "Served.forever")) + w.encode_frame(w.Data(f"f{i}", b"", True))
        for i in range(16)
    )

    async def attack() -> bool:
        stream = await sdk_stranger.aopen_stream(sdk_victim.peer_id, w.STREAM)
        stream.write(raw)
        await stream.drain()
        return await _reset_within(stream, 6)

    assert sdk_stranger.run(attack(), timeout=20)
    assert wait_for(lambda: on_loop(sdk_victim, lambda: svc._serving_all) == 0, timeout=5)


def test_strangers_cannot_take_the_slots_members_calls_need(monkeypatch: pytest.MonkeyPatch) -> None:
    """Strangers (every SDK node of a swarm that does not list it, identities free) together
    hold at most half of the node's call slots (8 here, 256 by default): with a stranger's
    endless calls holding what they may, a member's call is served (before the fix 16
    identities held all 256, renewing their hold every ``SEND_TIMEOUT``, and every member was
    told "busy")."""
    from lattica.actors import sdk_rpc

    monkeypatch.setattr(sdk_rpc, "MAX_CALLS_ALL", 8)
    key = MeshKey.generate()
    with (
        lattica.Node([TCP], pubsub=False, mesh=key, **QUIET) as victim,
        lattica.Node([TCP], pubsub=False, mesh=MeshKey.generate(), **QUIET) as stranger,
        lattica.Node([TCP], pubsub=False, mesh=key, **QUIET) as member,
    ):
        lattica.sdk.serve(Served(), node=victim)
        svc = host_of(victim).services.sdk_rpc
        stranger.connect(victim.addrs[0])
        member.connect(victim.addrs[0])
        assert wait_for(lambda: host_of(victim).circle_of(member.peer_id) == "member")
        raw = b"".join(
            w.encode_frame(w.StreamRequest(f"f{i}", "Served.forever")) + w.encode_frame(w.Data(f"f{i}", b"", True))
            for i in range(8)
        )

        async def hold() -> Stream:
            stream = await stranger.aopen_stream(victim.peer_id, w.STREAM)
            stream.write(raw)
            await stream.drain()
            return stream

        held = stranger.run(hold(), timeout=10)
        assert wait_for(lambda: on_loop(victim, lambda: svc._serving_all) >= 4)

        ask = _ask(member, victim, w.Request("m", "Served.hello", b"member"))
        assert member.run(ask, timeout=20) == w.Response("m", b"hello, member")
        held.reset()


def test_a_caller_that_never_reads_a_req_resp_answer_loses_its_stream(
    sdk_victim: lattica.Node, sdk_stranger: lattica.Node, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A stranger asks for an 8 MiB answer over req-resp and never reads it: the stream is
    reset after the send timeout (before the fix the answer, its task and its stream were held
    for the connection's life, a stream per call)."""
    from lattica.actors import sdk_rpc

    monkeypatch.setattr(sdk_rpc, "SEND_TIMEOUT", 1.0, raising=False)

    async def attack() -> bool:
        stream = await sdk_stranger.aopen_stream(sdk_victim.peer_id, w.REQ_RESP)
        stream.write(w.encode_message(w.Request("b", "Served.big", b"")))
        await stream.close()
        return await _reset_within(stream, 6)

    assert sdk_stranger.run(attack(), timeout=20)


@pytest.mark.parametrize("sent", [b"", "head"], ids=["silent", "stalled"])
def test_a_req_resp_request_that_stalls_loses_its_stream(
    sdk_victim: lattica.Node, sdk_stranger: lattica.Node, sent: Any
) -> None:
    """A req-resp stream that says nothing, or stops after the start of a request: reset once
    nothing comes for the budget's deadline (1 s here; docs/sdk.md: "a request that stalls for
    30 s with bytes held loses its stream"). Before the fix it was held 30 s plus 256 MiB at
    the budget's minimum rate: 17.5 minutes (with the default budget), a stranger's stream
    each, out of the 512 all strangers share."""
    if sent == "head":
        head, _ = w.request_parts("s", "Served.hello", 100_000)
        sent = head + bytes(1000)

    async def attack() -> bool:
        stream = await sdk_stranger.aopen_stream(sdk_victim.peer_id, w.REQ_RESP)
        stream.write(sent)
        await stream.drain()
        return await _reset_within(stream, 6)

    assert sdk_stranger.run(attack(), timeout=20)
    assert host_of(sdk_victim).runtime.partials.total == 0  # type: ignore[union-attr]


class Weights(dict):  # type: ignore[type-arg]
    """A served object as applications write them: a cache (here a dict), a hook the runtime
    calls to restore its state, a callable kept as an attribute, and the method it serves."""

    def __init__(self) -> None:
        super().__init__(layer=b"trained")
        self.reload = self._forget  # (a private method, reachable through a public attribute)

    def _forget(self) -> None:
        self.clear()

    def restore(self, state: bytes) -> None:  # (an actor's lifecycle hook: called by the runtime)
        self["layer"] = state

    def infer(self, request: bytes) -> bytes:
        return self["layer"]


@pytest.mark.parametrize("method", ["clear", "reload", "restore", "popitem"])
def test_only_methods_the_served_class_defines_are_callable(
    sdk_victim: lattica.Node, sdk_stranger: lattica.Node, method: str
) -> None:
    """``serve`` exposes the object's public methods: a stranger calling what its class merely
    inherits from a builtin (``dict.clear``), a callable held as an attribute, or a lifecycle
    hook gets "no method" (before the fix each ran: the served weights emptied or replaced;
    the SDK serves only the methods its class marks, actors never serve their hooks)."""
    served = Weights()
    lattica.sdk.serve(served, node=sdk_victim)

    def call(m: str, data: bytes) -> w.Message:
        return sdk_stranger.run(_ask(sdk_stranger, sdk_victim, w.Request("x", f"Weights.{m}", data)), timeout=20)

    answer = call(method, b"poisoned")
    assert isinstance(answer, w.Failure) and "no method" in answer.error, answer
    assert call("infer", b"") == w.Response("x", b"trained")


def test_a_hostile_sdk_nodes_streaming_answer_is_held_within_bytes_not_only_items(
    sdk_victim: lattica.Node, sdk_stranger: lattica.Node, monkeypatch: pytest.MonkeyPatch
) -> None:
    """We call a streaming method of a hostile SDK node and take its items slowly; it answers
    with items of 1 MiB as fast as it can. What waits for our consumer is bounded by bytes
    (4 MiB here, 32 MiB by default) as well as items: before the fix, 64 items of up to
    16 MiB each (up to the 256 MiB an answer may be) waited, per call."""
    from lattica.actors import sdk_rpc

    monkeypatch.setattr(sdk_rpc, "QUEUE_BYTES", 4 << 20, raising=False)
    hostile = sdk_stranger

    async def answer(stream: Stream, conn: Connection) -> None:
        frames = w.Frames(1 << 20)
        rid = None
        while rid is None:
            for f in frames.feed(await stream.read(1 << 16)):
                if isinstance(f, w.Data) and f.is_end:
                    rid = f.id
        for _ in range(24):
            stream.write(w.encode_frame(w.Data(rid, bytes(1 << 20), False)))
            await stream.drain()
        await asyncio.sleep(30)

    on_loop(hostile, lambda: hostile._host.set_handler(w.STREAM, answer))
    items = lattica.sdk.stub(hostile.peer_id, "Evil", node=sdk_victim).big.stream()
    assert len(next(items)) == 1 << 20
    svc = host_of(sdk_victim).services.sdk_rpc

    def waiting() -> int:
        out = svc._out[hostile.peer_id]
        return sum(len(v or b"") for q in out._calls.values() for _, v in list(q._queue))

    wait_for(lambda: on_loop(sdk_victim, waiting) > 12 << 20, timeout=3)
    assert on_loop(sdk_victim, waiting) <= 5 << 20
    items.close()


def _dials_from(node: lattica.Node, ip: str) -> None:
    """``node`` dials from ``ip`` (another loopback address): to the victim, another address."""
    loop = node._host.loop
    plain = loop.create_connection

    async def from_source(*args: Any, **kw: Any) -> Any:
        kw.setdefault("local_addr", (ip, 0))
        return await plain(*args, **kw)

    on_loop(node, lambda: setattr(loop, "create_connection", from_source))


def test_strangers_from_one_address_hold_no_more_than_their_addresses_share_of_slots(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Two stranger identities from one address start endless streaming calls, as many as the
    victim takes and again as it refuses them: they hold 2 slots (``MAX_STRANGER_CALLS_PER_ADDRESS``,
    32 by default) of the 4 strangers may take (128), and an SDK node outside the mesh from
    another address is served. Before the fix the two held all 4 for good (re-calling as their
    answers timed out), and every stranger was told "busy"."""
    from lattica.actors import sdk_rpc

    monkeypatch.setattr(sdk_rpc, "MAX_CALLS_ALL", 8)
    monkeypatch.setattr(sdk_rpc, "MAX_STRANGER_CALLS_PER_ADDRESS", 2, raising=False)
    with (
        lattica.Node([TCP], pubsub=False, mesh=MeshKey.generate(), **QUIET) as victim,
        lattica.Node([TCP], pubsub=False, mesh=MeshKey.generate(), **QUIET) as a1,
        lattica.Node([TCP], pubsub=False, mesh=MeshKey.generate(), **QUIET) as a2,
        lattica.Node(["/ip4/127.0.0.2/tcp/0"], pubsub=False, mesh=MeshKey.generate(), **QUIET) as honest,
    ):
        lattica.sdk.serve(Served(), node=victim)
        svc = host_of(victim).services.sdk_rpc
        _dials_from(honest, "127.0.0.2")
        held: list[Stream] = []
        for i, attacker in enumerate((a1, a2)):
            attacker.connect(victim.addrs[0])
            assert host_of(victim).circle_of(attacker.peer_id) == "stranger"
            raw = b"".join(
                w.encode_frame(w.StreamRequest(f"f{i}{k}", "Served.forever"))
                + w.encode_frame(w.Data(f"f{i}{k}", b"", True))
                for k in range(4)
            )

            async def hold(attacker: lattica.Node = attacker, raw: bytes = raw) -> Stream:
                stream = await attacker.aopen_stream(victim.peer_id, w.STREAM)
                stream.write(raw)
                await stream.drain()
                return stream

            held.append(attacker.run(hold(), timeout=10))
        assert wait_for(lambda: on_loop(victim, lambda: svc._serving_strangers) >= 2)
        time.sleep(0.5)
        assert on_loop(victim, lambda: svc._serving_strangers) == 2
        honest.connect(victim.addrs[0])
        assert host_of(victim).circle_of(honest.peer_id) == "stranger"

        ask = _ask(honest, victim, w.Request("h", "Served.hello", b"stranger"))
        assert honest.run(ask, timeout=20) == w.Response("h", b"hello, stranger")
        for stream in held:
            stream.reset()
        assert wait_for(lambda: on_loop(victim, lambda: (svc._serving_all, svc._by_source)) == (0, {}), timeout=5)


def test_a_streaming_call_to_a_peer_that_goes_silent_ends_after_its_timeout(
    sdk_victim: lattica.Node, sdk_stranger: lattica.Node
) -> None:
    """We call a streaming method of a hostile SDK node that answers one item and then nothing,
    or nothing at all, for good: with ``timeout=1`` each call raises SdkStreamIdle (a
    TimeoutError) a second after its last item, saying what to do, and the peer is told to
    cancel. Before, the caller waited for as long as the peer kept the stream open."""
    hostile = sdk_stranger
    cancelled: list[str] = []

    async def answer(stream: Stream, conn: Connection) -> None:
        frames = w.Frames(1 << 20)
        while chunk := await stream.read(1 << 16):
            for f in frames.feed(chunk):
                if isinstance(f, w.Data) and f.is_end and f.id not in cancelled:
                    if len(cancelled) == 0:
                        stream.write(w.encode_frame(w.Data(f.id, b"first", False)))
                elif isinstance(f, w.Cancel):
                    cancelled.append(f.id)

    on_loop(hostile, lambda: hostile._host.set_handler(w.STREAM, answer))
    evil = lattica.sdk.stub(hostile.peer_id, "Evil", node=sdk_victim)
    items = evil.slow.stream(timeout=1.0)
    assert next(items) == b"first"
    start = time.monotonic()
    with pytest.raises(SdkStreamIdle, match="timeout=") as e:
        next(items)
    assert 0.9 <= time.monotonic() - start < 5
    assert isinstance(e.value, TimeoutError)
    assert wait_for(lambda: len(cancelled) == 1)
    silent = evil.silent.stream(timeout=1.0)
    with pytest.raises(SdkStreamIdle):
        next(silent)
    assert wait_for(lambda: len(cancelled) == 2)


# -- 5. the SDK swarm's relay-address topic ----------------------------------------------------------


def test_relayed_addresses_of_unknown_authors_do_not_push_known_peers_out_of_the_address_book(
    plain: Callable[..., Plain], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Authors cost nothing: one peer sends relayed addresses of more fresh authors than the
    address book holds (8 here, 4,096 by default). They are kept apart, as hints, and the
    address of a peer the victim knew stays (before the fix they were filed as the authors' own
    word, and the book forgot the oldest unconnected peers to make room: a relay, a bootstrap
    peer, a member met yesterday)."""
    from lattica._host import host as host_module

    monkeypatch.setattr(host_module, "_MAX_KNOWN_PEERS", 8)
    known = KeyPair.generate().peer_id
    with lattica.Node(listen=[TCP], sdk=True, mesh="open", **QUIET) as victim:
        h = host_of(victim)
        topic = h.config.sdk.relay_topic
        on_loop(victim, lambda: h.remember_addrs(known, [Multiaddr("/ip4/10.1.2.3/tcp/4001")]))
        assert wait_for(lambda: on_loop(victim, lambda: topic in _svc(victim).router.mesh))
        flooder = plain()
        flooder.join(victim, topic)
        relay = flooder.node.peer_id
        msgs = []
        for i in range(12):
            author = KeyPair.generate()
            addr = f"/ip4/127.0.0.1/tcp/4001/p2p/{relay}/p2p-circuit/p2p/{author.peer_id}"
            msgs.append(gs.sign(author, topic, w.encode_relay_addr(addr, h.config.protocol_version), _seq(1)))
        flooder.send(gs.RPC(publish=tuple(msgs)))
        assert wait_for(lambda: h.services.sdk_swarm.learned == 12)
        assert on_loop(victim, lambda: h.peer_addrs.get(known)) == [Multiaddr("/ip4/10.1.2.3/tcp/4001")]


# -- 6. replays ----------------------------------------------------------------------------------------


def test_a_libp2p_message_replayed_within_the_seen_caches_time_is_not_delivered_again(
    plain: Callable[..., Plain],
) -> None:
    """Alice's message, then newer messages under throwaway authors (keys cost nothing), more
    than the seen cache holds (20 here, 100,000 by default), then Alice's message again, well
    within 120 s: not delivered again (before the fix it was: its id had left the cache, and
    libp2p messages raise no author's floor). docs/pubsub.md says "as in libp2p, the seen
    cache (120 s) keeps their copies out"; go's seen cache is bounded by time alone."""
    import dataclasses

    with _victim(mesh="open") as victim:
        sub = lattica.pubsub.subscribe(TOPIC, node=victim)
        assert sub is not None
        router = _svc(victim).router
        on_loop(victim, lambda: setattr(router, "p", dataclasses.replace(router.p, seen_max=20)))
        member = plain()
        member.join(victim)
        old = gs.sign(ALICE, TOPIC, b"pay bob 10", _seq(7))
        member.send(gs.RPC(publish=(old,)))
        assert sub.get(timeout=5).data == b"pay bob 10"
        for _ in range(3):  # (ten at a time: a pending message pushed out is never delivered)
            member.send(gs.RPC(publish=tuple(gs.sign(KeyPair.generate(), TOPIC, b"noise", _seq(1)) for _ in range(10))))
            for _ in range(10):
                assert sub.get(timeout=5).data == b"noise"
        member.send(gs.RPC(publish=(old,)))
        with pytest.raises(TimeoutError):
            sub.get(timeout=1)
