"""Bad input from libp2p peers (issue 48), over real connections on 127.0.0.1: an identify
message with a thousand addresses (over 4 KiB, and as many as fit with unknown multiaddr codes),
many stranger identities on the libp2p stack at once from another process, and identify pushed
in a loop. Each time what the victim keeps is bounded, nothing it should keep is lost, and a
member of its mesh goes on being served."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import threading
import time
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any

import pytest

import lattica
from helpers import call_as, end_child, on_loop, wait_for
from lattica import _identify as identify
from lattica._framing import write_delimited, write_message
from lattica._host.connections import FREE_OPENS, STRANGERS_STREAMS
from lattica._identity import PeerId
from lattica._multiaddr import Multiaddr
from lattica._protobuf import encode_fields, uvarint
from lattica.actors.dht.actor import dht_ref
from lattica.errors import LatticaError
from lattica.transports.base import Connection, Stream
from lattica.transports.mux import PROTOCOL_WINDOW
from lattica.trust import MeshKey

pytestmark = pytest.mark.timeout(60)

TCP = "/ip4/127.0.0.1/tcp/0"
_AGENT, _PROTO_VERSION = 6, 5  # identify's protobuf fields (1 key, 2 addresses, 3 protocols)


def _use_libp2p(caller: lattica.Node, target: lattica.Node) -> None:
    """Make ``caller`` dial ``target`` on the standard libp2p stack (as our TCP transport does
    once a libp2p listener answered it at that address), as a plain libp2p peer would."""
    host, port = target.addrs[0].host_port()
    on_loop(caller, lambda: caller._host.transport_set.named("tcp")._libp2p_at.__setitem__((host, port), None))
    _plain_libp2p(caller)


def _plain_libp2p(node: lattica.Node) -> None:
    """Make ``node`` a plain libp2p peer as far as identify goes: it neither serves nor sends
    our own identify (two Lattica nodes on libp2p's stack tell each other theirs)."""
    on_loop(node, lambda: node._host.handlers.pop(identify.PROTOCOL, None))


def _connect_libp2p(caller: lattica.Node, target: lattica.Node) -> None:
    """Connect ``caller`` to ``target`` on the libp2p stack, and check that it is."""
    _use_libp2p(caller, target)
    caller.connect(target.addrs[0])
    assert caller._host.conns[target.peer_id].libp2p


def _identify_message(
    node: lattica.Node, addrs: Sequence[bytes], protocols: Sequence[str] = (), agent: str = "stranger"
) -> bytes:
    """An identify protobuf from ``node`` (its own key) carrying ``addrs`` as they are, in order."""
    fields: list[tuple[int, int | bytes]] = [(1, node._host.keypair.public_key_protobuf())]
    fields += [(2, a) for a in addrs] + [(3, p.encode()) for p in protocols]
    fields += [(_PROTO_VERSION, b"/lattica/1.0.0"), (_AGENT, agent.encode())]
    return encode_fields(fields)


def _known(i: int) -> bytes:
    """A usable address (on loopback, where nothing listens on purpose)."""
    return Multiaddr(f"/ip4/127.0.0.1/tcp/{20000 + i}").to_bytes()


def _unknown(i: int) -> bytes:
    """Addresses a libp2p peer may well send and we cannot use: /ws, /webtransport with a
    certhash, a code nobody assigned, and a truncated one."""
    base = Multiaddr(f"/ip4/127.0.0.1/tcp/{40000 + i}").to_bytes()
    kind = i % 4
    if kind == 0:
        return base + uvarint(0x01DD)  # /ws
    if kind == 1:
        return base + uvarint(0x01D1) + uvarint(0x01D2) + uvarint(4) + b"hash"  # /webtransport/certhash
    if kind == 2:
        return base + uvarint(0x3FFF01)  # unassigned
    return base[:-1]  # the port cut short


def _a_thousand_addresses(node: lattica.Node) -> bytes:
    """1,000 addresses, a fifth of them unusable: about 10 KB, well over libp2p's 4 KiB."""
    msg = _identify_message(node, [_unknown(i) if i % 5 == 0 else _known(i) for i in range(1000)])
    assert len(msg) > identify.LIBP2P_MAX_MESSAGE
    return msg


def _as_many_as_fit(node: lattica.Node, agent: str) -> tuple[bytes, list[Multiaddr], list[str]]:
    """100 unusable addresses first, then 150 protocols (two of them over-long names first),
    then usable addresses until 4 KiB is full (well over the 64 kept); the message and the
    addresses and protocols we must keep."""
    unknown = [_unknown(i) for i in range(100)]
    protos = ["/x" * 150, "/y" * 150] + [f"/p/{i}" for i in range(150)]
    known: list[bytes] = []
    while len(_identify_message(node, unknown + known + [_known(len(known))], protos, agent)) <= (
        identify.LIBP2P_MAX_MESSAGE
    ):
        known.append(_known(len(known)))
    msg = _identify_message(node, unknown + known, protos, agent)
    assert len(known) > 64 and len(msg) <= identify.LIBP2P_MAX_MESSAGE
    return msg, [Multiaddr.from_bytes(a) for a in known[:64]], protos[2:130]


def _info(node: lattica.Node, peer: PeerId) -> lattica.PeerInfo | None:
    """What ``node`` knows of ``peer`` now (None: not connected, or not identified)."""
    return next((p for p in node.peers() if p.peer_id == peer), None)


def _member_is_served(victim: lattica.Node, member: lattica.Node) -> None:
    """The member's ping is echoed and its call answered."""
    assert member.ping(victim.peer_id) > 0
    assert call_as(member, dht_ref(victim.peer_id), "ping", timeout=10) is True


def _let_go(victim: lattica.Node, peer: PeerId) -> bool:
    """``victim`` is connected to ``peer`` and holds neither a stream it opened to it nor its
    unread bytes (beyond one stream's minimum window)."""

    def look() -> bool:
        conns = [c for c in victim._host.all_conns if c.remote_peer == peer]
        return bool(conns) and all(c._mux._n_local == 0 and c._mux._buffered_total < PROTOCOL_WINDOW for c in conns)

    return on_loop(victim, look)


async def _send_more(sent: threading.Event, stream: Stream) -> None:
    """4 MiB on ``stream`` (within the window a stream we are sent on gets), never ending it."""
    stream.write(b"x" * (4 * 1024 * 1024 - 64 * 1024))
    await stream.drain()
    sent.set()
    await asyncio.sleep(3600)


async def _push(pusher: lattica.Node, to: PeerId, data: bytes) -> bool:
    """Push ``data`` as identify on /ipfs/id/push/1.0.0 and read the stream to its end: True
    when the victim read it and ended the stream, False when it reset it."""
    stream = await pusher._host.open_stream(to, identify.LIBP2P_PUSH_PROTOCOL)
    write_delimited(stream, data)
    await stream.close()
    try:
        while await stream.read():
            pass
    except LatticaError:
        return False
    return True


def _held_then_newer(victim: lattica.Node, pusher: lattica.Node, push: Callable[[str], Awaitable[bool]]) -> None:
    """``pusher`` pushes identify (``push(agent)``) once its budget is spent, so that push is
    held, then once more with a token come: the newer is taken at once, and the older, due
    later, must not undo it (before, it did: the newer push was lost)."""

    def budget(tokens: float) -> None:
        victim._host._pushes._state[pusher.peer_id] = [tokens, victim._host.loop.time()]

    on_loop(victim, lambda: budget(0.0))
    assert pusher.run(push("an older push"), timeout=15)
    assert on_loop(victim, lambda: len(victim._host._held_pushes)) == 1
    on_loop(victim, lambda: budget(1.0))
    assert pusher.run(push("a newer push"), timeout=15)
    assert wait_for(lambda: on_loop(victim, lambda: not victim._host._held_pushes), timeout=10)
    assert _info(victim, pusher.peer_id).agent_version == "a newer push"


def _answer_identify_with(node: lattica.Node, data: Callable[[], bytes]) -> None:
    """Make ``node`` answer /ipfs/id/1.0.0 with ``data()`` instead of its own identify."""

    async def answer(stream: Stream, conn: Connection) -> None:
        write_delimited(stream, data())
        await stream.close()

    on_loop(node, lambda: node._host.handlers.__setitem__(identify.LIBP2P_PROTOCOL, answer))
    _plain_libp2p(node)


# Run in a process of its own: ``n`` fresh Ed25519 identities dial the victim on the libp2p
# stack (multistream-select, /noise, yamux), answer its identify query, and each opens
# ``streams`` ping streams with 4 pings on each, never reading the echoes; they hold all that
# until stdin closes. Prints "ready <connections made> <streams opened>".
_STRANGERS = """
import asyncio, os, sys
from lattica._framing import read_delimited, write_delimited
from lattica._identify import LIBP2P_PROTOCOL, encode_libp2p
from lattica._identity import KeyPair
from lattica._multiaddr import Multiaddr
from lattica._protobuf import uvarint
from lattica.errors import LatticaError
from lattica.transports import multistream
from lattica.transports.tcp import TcpTransport

HELLO = multistream.encode(multistream.HEADER) + multistream.encode("/ipfs/ping/1.0.0")


async def answer(stream, kp):
    select = multistream.Listener(lambda p: p == LIBP2P_PROTOCOL)
    try:
        while select.next_event() is None:
            body = await read_delimited(stream, multistream.MAX_MESSAGE)
            select.receive(uvarint(len(body)) + body)
            stream.write(select.data_to_send())
        write_delimited(stream, encode_libp2p(kp.public_key_protobuf(), "stranger", "/lattica/1.0.0", [], None, []))
        await stream.close()
    except LatticaError:
        stream.reset()


async def one(addr, streams, tasks):
    kp = KeyPair.generate()
    t = TcpTransport(kp)
    t._libp2p_at[addr.without_peer_id().host_port()] = None
    try:
        conn = await t.dial(addr)
    except LatticaError:
        return t, None, 0
    conn.set_stream_handler(lambda s: tasks.add(asyncio.ensure_future(answer(s, kp))))
    opened = 0
    for _ in range(streams):
        try:
            s = await conn.open_stream()
        except LatticaError:
            break
        s.write(HELLO + os.urandom(32) * 4)
        opened += 1
    return t, conn, opened


async def main():
    addr, n, streams = Multiaddr(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
    tasks, room = set(), asyncio.Semaphore(16)

    async def guarded():
        async with room:
            return await one(addr, streams, tasks)

    made = await asyncio.gather(*(guarded() for _ in range(n)))
    print("ready", sum(c is not None for _, c, _ in made), sum(o for _, _, o in made), flush=True)
    await asyncio.get_running_loop().run_in_executor(None, sys.stdin.read)
    for t, conn, _ in made:
        if conn is not None:
            conn.abort("done")
        await t.close()


asyncio.run(main())
"""


def test_identify_answers_with_a_thousand_addresses_as_many_as_fit_or_bytes_after_them() -> None:
    """A libp2p peer answers our identify query with 1,000 addresses (~10 KB, over libp2p's
    4 KiB): the connection is closed as one with a bad identify, nothing of the peer is kept,
    and the peer may come back. With as many addresses as fit (unusable ones first, then 150
    protocols): the usable ones are kept, at most 64 addresses and 128 protocols (before, unusable
    addresses and over-long names counted against the caps, and this peer was kept with no
    address). With 4 MiB more behind its answer on a stream it never ends: identified, and the
    bytes are not kept (before, they pinned 4 MiB of our memory for the connection's life). A
    member is served throughout."""
    key = MeshKey.generate()
    with (
        lattica.Node([TCP], mesh=key) as victim,
        lattica.Node([TCP], mesh=key) as member,
        lattica.Node([TCP], mesh=MeshKey.generate()) as stranger,
    ):
        member.connect(victim.addrs[0])
        _answer_identify_with(stranger, lambda: _a_thousand_addresses(stranger))
        _use_libp2p(stranger, victim)
        try:
            stranger.connect(victim.addrs[0])
        except LatticaError:
            pass  # (the victim may close it before our own identify of it is in)
        assert wait_for(lambda: victim.peer_id not in stranger._host.conns, timeout=10)
        assert _info(victim, stranger.peer_id) is None
        assert not victim._host.peer_addrs.get(stranger.peer_id)
        _member_is_served(victim, member)

        msg, kept_addrs, kept_protos = _as_many_as_fit(stranger, "fits")
        _answer_identify_with(stranger, lambda: msg)
        stranger.connect(victim.addrs[0])
        assert wait_for(lambda: _info(victim, stranger.peer_id) is not None, timeout=10)
        info = _info(victim, stranger.peer_id)
        assert info.agent_version == "fits" and info.circle == "stranger"
        assert list(info.listen_addrs) == kept_addrs
        assert list(info.protocols) == kept_protos
        assert len(victim._host.peer_addrs[stranger.peer_id]) <= 32  # (the address book's own cap)
        assert stranger.ping(victim.peer_id) > 0
        _member_is_served(victim, member)

        sent = threading.Event()

        async def answer_and_more(stream: Stream, conn: Connection) -> None:
            write_delimited(stream, _identify_message(stranger, [_known(0)], agent="and more"))
            await _send_more(sent, stream)

        stranger.disconnect(victim.peer_id)
        assert wait_for(lambda: _info(victim, stranger.peer_id) is None, timeout=10)
        on_loop(stranger, lambda: stranger._host.handlers.__setitem__(identify.LIBP2P_PROTOCOL, answer_and_more))
        stranger.connect(victim.addrs[0])
        assert wait_for(lambda: getattr(_info(victim, stranger.peer_id), "agent_version", "") == "and more", 10)
        assert wait_for(sent.is_set, timeout=10)
        assert wait_for(lambda: _let_go(victim, stranger.peer_id), timeout=15)
        assert stranger.ping(victim.peer_id) > 0
        _member_is_served(victim, member)


@pytest.mark.parametrize("libp2p", [False, True], ids=["lattica-stack", "libp2p-stack"])
def test_bytes_a_stranger_sends_back_on_our_identify_push_are_not_kept(libp2p: bool) -> None:
    """We push identify to a stranger (as when our addresses change); it sends 4 MiB back on
    that stream and never ends it: the stream is reset and the bytes let go (before, they
    pinned 4 MiB of our memory per push for the connection's life), and the connection serves
    on."""
    with (
        lattica.Node([TCP], mesh=MeshKey.generate()) as victim,
        lattica.Node([TCP], mesh=MeshKey.generate()) as stranger,
    ):
        sent = threading.Event()

        async def more(stream: Stream, conn: Connection) -> None:
            await _send_more(sent, stream)

        proto = identify.LIBP2P_PUSH_PROTOCOL if libp2p else identify.PROTOCOL
        on_loop(stranger, lambda: stranger._host.handlers.__setitem__(proto, more))
        if libp2p:
            _connect_libp2p(stranger, victim)
        else:
            stranger.connect(victim.addrs[0])
        assert wait_for(lambda: _info(victim, stranger.peer_id) is not None, timeout=10)

        async def push() -> bool:
            return await victim._host.push_identify(victim._host.conns[stranger.peer_id])

        assert victim.run(push(), timeout=10)
        assert wait_for(sent.is_set, timeout=10)
        assert wait_for(lambda: _let_go(victim, stranger.peer_id), timeout=15)
        assert stranger.ping(victim.peer_id) > 0


def test_an_identify_push_with_a_thousand_addresses_is_reset_and_the_connection_serves_on() -> None:
    """A libp2p peer pushes identify with 1,000 addresses (over 4 KiB): that push stream is
    reset, what we knew of the peer stays as it was, and the connection serves on; its next
    push, as many addresses as fit with unknown codes first, is taken bounded, the usable
    addresses kept. A member is served throughout."""
    key = MeshKey.generate()
    with (
        lattica.Node([TCP], mesh=key) as victim,
        lattica.Node([TCP], mesh=key) as member,
        lattica.Node([TCP], mesh=MeshKey.generate()) as stranger,
    ):
        member.connect(victim.addrs[0])
        _connect_libp2p(stranger, victim)
        assert wait_for(lambda: _info(victim, stranger.peer_id) is not None, timeout=10)
        before = _info(victim, stranger.peer_id)

        assert stranger.run(_push(stranger, victim.peer_id, _a_thousand_addresses(stranger)), timeout=15) is False
        assert _info(victim, stranger.peer_id) == before
        assert stranger.ping(victim.peer_id) > 0
        _member_is_served(victim, member)

        msg, kept_addrs, kept_protos = _as_many_as_fit(stranger, "pushed")
        assert stranger.run(_push(stranger, victim.peer_id, msg), timeout=15) is True
        assert wait_for(lambda: _info(victim, stranger.peer_id).agent_version == "pushed", timeout=10)
        info = _info(victim, stranger.peer_id)
        assert list(info.listen_addrs) == kept_addrs
        assert list(info.protocols) == kept_protos
        assert len(victim._host.peer_addrs[stranger.peer_id]) <= 32
        assert stranger.ping(victim.peer_id) > 0
        _member_is_served(victim, member)


def test_identify_pushed_in_a_loop_is_parsed_within_the_budget_and_the_latest_is_kept(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A libp2p peer pushes identify 2,000 times on /ipfs/id/push/1.0.0 (64 at once), then once
    more: each push is read, but only the peer's push budget of them is parsed (a burst of 10,
    then one every 2 s; before, every one was parsed), and the last one pushed is what the victim
    ends up with (held unparsed, taken when due: nothing lost), also when an older push is held
    as a newer one is taken at once. A member is served meanwhile."""
    parsed: dict[PeerId, int] = {}
    real = identify.parse_libp2p

    def counting(data: bytes, remote_peer: PeerId) -> dict[str, Any]:
        parsed[remote_peer] = parsed.get(remote_peer, 0) + 1
        return real(data, remote_peer)

    monkeypatch.setattr(identify, "parse_libp2p", counting)
    key = MeshKey.generate()
    n = 2000
    with (
        lattica.Node([TCP], mesh=key) as victim,
        lattica.Node([TCP], mesh=key) as member,
        lattica.Node([TCP], mesh=MeshKey.generate()) as stranger,
    ):
        member.connect(victim.addrs[0])
        _connect_libp2p(stranger, victim)
        assert wait_for(lambda: _info(victim, stranger.peer_id) is not None, timeout=10)
        pushes = [_identify_message(stranger, [_known(i % 1000)], agent=f"push {i}") for i in range(n)]
        final_addr = Multiaddr("/ip4/127.0.0.1/tcp/9999")
        final = _identify_message(stranger, [final_addr.to_bytes()], agent="the last push")

        async def flood() -> int:
            room = asyncio.Semaphore(64)

            async def one(data: bytes) -> bool:
                async with room:
                    return await _push(stranger, victim.peer_id, data)

            read = await asyncio.gather(*(one(p) for p in pushes))
            return sum(read) + await _push(stranger, victim.peer_id, final)

        t0 = time.monotonic()
        pushing = asyncio.run_coroutine_threadsafe(flood(), stranger._host.loop)
        while not pushing.done():
            _member_is_served(victim, member)
        assert pushing.result() == n + 1  # (every push was read, and its stream ended cleanly)

        def last() -> str:
            return _info(victim, stranger.peer_id).agent_version

        assert wait_for(lambda: last() == "the last push", timeout=10), last()
        took = time.monotonic() - t0
        assert list(_info(victim, stranger.peer_id).listen_addrs) == [final_addr]
        assert not on_loop(victim, lambda: dict(victim._host._held_pushes))
        # the query's answer, the burst of 10, one every 2 s while it went on, and the held last one
        assert parsed[stranger.peer_id] <= 1 + 10 + took / 2 + 2, (parsed[stranger.peer_id], took)
        _member_is_served(victim, member)

        _held_then_newer(
            victim,
            stranger,
            lambda agent: _push(stranger, victim.peer_id, _identify_message(stranger, [], agent=agent)),
        )


def test_many_stranger_identities_on_the_libp2p_stack_hold_to_the_strangers_budgets(tmp_path: Path) -> None:
    """96 fresh identities from another process connect on the libp2p stack to a node that takes
    48 connections, and each opens 32 ping streams it never reads: the node holds at most its
    connection limit (strangers evicted, a member never), strangers' streams at most their shared
    512 plus each connection's first 8 (the rest wait unparsed), their unread bytes within those
    streams' windows; a member is served throughout, a newcomer member gets in while the node is
    full, and once the strangers are gone nothing of them is left in the node's tables."""
    key = MeshKey.generate()
    limit, n, streams = 48, 96, 32
    with (
        lattica.Node([TCP], mesh=key, max_connections=limit) as victim,
        lattica.Node([TCP], mesh=key) as member,
    ):
        member.connect(victim.addrs[0])
        ours = member._host.conns[victim.peer_id]
        most = [0]
        sampling = [True]

        def sample() -> None:
            while sampling[0]:
                most[0] = max(most[0], on_loop(victim, lambda: len(victim._host.all_conns)))
                time.sleep(0.02)

        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()
        with open(tmp_path / "strangers.err", "w") as err:
            proc = subprocess.Popen(
                [sys.executable, "-c", _STRANGERS, str(victim.addrs[0]), str(n), str(streams)],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=err,
                text=True,
            )
        try:
            ready = proc.stdout.readline().split()
            assert ready[:1] == ["ready"], (ready, (tmp_path / "strangers.err").read_text()[-2000:])
            made, opened = int(ready[1]), int(ready[2])
            assert made >= limit  # (more came than the node takes: some were evicted or refused)
            _member_is_served(victim, member)
            time.sleep(1.0)  # (the node takes in what it will of the strangers' streams)

            def theirs() -> list[Connection]:
                return [c for c in victim._host.all_conns if c.remote_peer != member.peer_id]

            conns = on_loop(victim, theirs)
            held = sum(c.num_streams for c in conns)
            unread = sum(c._mux._buffered_total for c in conns)
            allowed = STRANGERS_STREAMS + len(conns) * FREE_OPENS
            assert len(conns) >= limit // 2 and len(conns) * streams > allowed  # (the attack is real)
            assert held <= allowed, (held, allowed, len(conns), opened)
            assert unread <= allowed * PROTOCOL_WINDOW, (unread, held)
            assert on_loop(victim, lambda: sum(i.circle == "stranger" for i in victim._host.info.values())) > 0
            _member_is_served(victim, member)
            assert member._host.conns[victim.peer_id] is ours and not ours.is_closed  # (never evicted)
            with lattica.Node([TCP], mesh=key) as newcomer:  # (the node is full: a stranger makes room)
                newcomer.connect(victim.addrs[0])
                _member_is_served(victim, newcomer)
        finally:
            sampling[0] = False
            end_child(proc)
            sampler.join(5)
        assert most[0] <= limit, most[0]
        assert wait_for(lambda: on_loop(victim, lambda: not theirs()), timeout=15)
        cm = victim._host.connections
        live = on_loop(victim, lambda: set(cm.all_conns))
        for table in (cm._opened, cm._metered, cm._opens_refused, cm.info, cm.idle_since, victim._host._held_pushes):
            assert not set(on_loop(victim, lambda t=table: list(t))) - live
        _member_is_served(victim, member)


def test_on_our_own_stack_too_a_push_held_is_not_taken_after_a_newer_one() -> None:
    """The same order on /lattica/id/1.0.0 (a Lattica stranger's pushes): a push held beyond the
    budget is dropped when a newer one is taken at once."""
    with (
        lattica.Node([TCP], mesh=MeshKey.generate()) as victim,
        lattica.Node([TCP], mesh=MeshKey.generate()) as stranger,
    ):
        stranger.connect(victim.addrs[0])
        assert wait_for(lambda: _info(victim, stranger.peer_id) is not None, timeout=10)

        async def push(agent: str) -> bool:
            conn = stranger._host.conns[victim.peer_id]
            stream = await stranger._host.open_stream_on(conn, identify.PROTOCOL)
            write_message(stream, {**stranger._host._identify_message(conn.remote_addr), "agent_version": agent})
            await stream.close()
            return await stream.read() == b""  # (the victim ends it once it took or held the push)

        _held_then_newer(victim, stranger, push)
