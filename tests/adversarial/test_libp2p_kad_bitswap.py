"""Hostile libp2p peers against the two services of issue 49, over real connections on 127.0.0.1:
libp2p Kademlia (``actors/dht/libp2p.py``, served on ``/ipfs/kad/1.0.0`` and ``/lattica/1.0.0``)
and Bitswap 1.2.0 (``actors/content/bitswap.py``). The attackers are fresh Ed25519 identities on
the libp2p stack: stranger nodes in this process (``test_libp2p_strangers``' helpers), or many
raw identities from another process. Each time the victim stays bounded, nothing it should keep
is lost, and a member of its mesh (or an honest provider) goes on being served."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from test_libp2p_strangers import _answer_identify_with, _connect_libp2p, _identify_message, _member_is_served

import lattica
from helpers import call_as, end_child, on_loop, wait_for
from lattica._framing import read_delimited, write_delimited
from lattica._identity import PeerId
from lattica._multiaddr import Multiaddr
from lattica._protobuf import encode_fields, uvarint
from lattica.actors.content import bitswap as bitswap_actor
from lattica.actors.content.wire import NAMED_BURST, content_ref
from lattica.actors.dht import libp2p as kad_actor
from lattica.actors.dht.libp2p import KadNetwork
from lattica.config import IPFS_KAD, ContentConfig, KadConfig
from lattica.content import _bitswap_wire as bw
from lattica.content._cid import RAW, Cid
from lattica.content._dagpb import decode as decode_node
from lattica.dht import _libp2p_wire as kw
from lattica.dht._libp2p_validators import make_pk_record
from lattica.errors import BlockNotFound, LatticaError, PeerUnreachable, StreamClosed
from lattica.transports.base import Connection, Stream
from lattica.transports.mux import PROTOCOL_WINDOW, MuxConfig
from lattica.trust import MeshKey

pytestmark = pytest.mark.timeout(90)

TCP = "/ip4/127.0.0.1/tcp/0"
SDK_NET = "/lattica/1.0.0"
LEAN: dict[str, Any] = {"membership": False, "pubsub": False, "crdt": False}
# an attacker that grants yamux's minimum window and never more: what it does not read stays ours
STINGY = {"tcp": {"mux_config": MuxConfig(window=PROTOCOL_WINDOW, max_window=PROTOCOL_WINDOW)}}
THIRD_HOST = "10.99.0.1"  # where a liar's addresses point (never dialed here: see _record_dials)


def _node(mesh: MeshKey, **kw: Any) -> lattica.Node:
    return lattica.Node([TCP], mesh=mesh, content=kw.pop("content", ContentConfig(blocks="memory")), **LEAN, **kw)


def _kad(node: lattica.Node, protocol: str = IPFS_KAD) -> KadNetwork:
    kad = node._host.services.kad
    assert kad is not None
    return kad[protocol]


def _bitswap(node: lattica.Node) -> bitswap_actor.Bitswap:
    content = node._host.services.content
    assert content is not None
    return content.bitswap


def _fake_peer(i: int) -> PeerId:
    """A PeerId nobody holds the key of (an identity multihash of a made-up Ed25519 key)."""
    key = encode_fields([(1, 1), (2, i.to_bytes(4, "big") * 8)])
    return PeerId.from_bytes(b"\x00" + uvarint(len(key)) + key)


def _streams_from(victim: lattica.Node, peer: PeerId) -> int:
    """Streams ``victim`` holds on its connections with ``peer`` (either side opened them)."""
    return on_loop(victim, lambda: sum(c.num_streams for c in victim._host.all_conns if c.remote_peer == peer))


def _rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


async def _exchange(
    node: lattica.Node, peer: PeerId, protocol: str, frames: list[bytes], wait: float = 5.0
) -> tuple[list[kw.KadMessage], str]:
    """Write ``frames`` (each a message, length-prefixed here) on a stream of its own and read
    the answers; the answers and how the stream ended: "reset", "end", or "open" (still open
    after ``wait`` s)."""
    stream = await node._host.open_stream(peer, protocol)
    for f in frames:
        write_delimited(stream, f)
    got: list[kw.KadMessage] = []
    try:
        async with asyncio.timeout(wait):
            await stream.drain()
            while True:
                got.append(kw.decode(await read_delimited(stream, 1 << 20)))
    except TimeoutError:
        stream.reset()
        return got, "open"
    except StreamClosed:
        return got, "end"
    except LatticaError:
        return got, "reset"


def _find_node(key: bytes = b"") -> bytes:
    return kw.encode(kw.KadMessage(kw.MessageType.FIND_NODE, key or os.urandom(32)))


# -- libp2p Kademlia: what we serve ------------------------------------------------------------


def test_kad_requests_that_break_the_rules_end_their_stream_and_the_node_serves_on(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A stranger on the libp2p stack sends what the kad-dht spec does not allow, each on a
    stream of its own: a 70 KiB message (over our 64 KiB), protobuf garbage, nothing at all
    (idle), 70 requests on one stream (64 a stream), then 150 more on three streams (its 20 a
    second, burst 100). Each such stream is reset, the budget holds, and the stranger's next
    request on a fresh stream is answered; PUT_VALUE over the 10 KiB cap, a /pk/ record naming
    another key and a garbage /ipns/ record get no answer (the stream serves on) and nothing is
    stored, while its own /pk/ record is taken and echoed; ADD_PROVIDER naming the member is
    ignored and the stranger's own announcement with 1,000 addresses is kept with the addresses
    its identify gave. A member is served throughout."""
    monkeypatch.setattr(kad_actor, "_IDLE", 1.0)
    key = MeshKey.generate()
    with _node(key) as victim, _node(key) as member, _node(MeshKey.generate()) as stranger:
        member.connect(victim.addrs[0])
        _connect_libp2p(stranger, victim)
        vk = _kad(victim)

        def run(frames: list[bytes], wait: float = 5.0) -> tuple[list[kw.KadMessage], str]:
            return stranger.run(_exchange(stranger, victim.peer_id, IPFS_KAD, frames, wait), timeout=wait + 10)

        assert run([b"\x08\x04" + os.urandom(70 * 1024)]) == ([], "reset")
        assert run([b"\xff\xff\xff"]) == ([], "reset")
        t0 = time.monotonic()
        assert run([]) == ([], "reset")
        assert time.monotonic() - t0 < 4.0

        t0 = time.monotonic()
        got, how = run([_find_node() for _ in range(70)])
        assert (len(got), how) == (64, "reset")

        async def three_streams() -> list[tuple[list[kw.KadMessage], str]]:
            return await asyncio.gather(
                *(_exchange(stranger, victim.peer_id, IPFS_KAD, [_find_node() for _ in range(50)]) for _ in range(3))
            )

        results = stranger.run(three_streams(), timeout=20)
        took = time.monotonic() - t0
        answered = 64 + sum(len(g) for g, _ in results)
        assert all(how == "reset" for _, how in results)
        assert answered <= 100 + 20 * took + 2, (answered, took)
        time.sleep(0.2)  # (a token or so for the next)
        assert len(run([_find_node(member.peer_id.to_bytes())], wait=0.5)[0]) == 1

        pk_key, pk_value = make_pk_record(stranger.keypair)
        mh = stranger.peer_id.to_bytes()

        def put(k: bytes, v: bytes) -> bytes:
            return kw.encode(kw.KadMessage(kw.MessageType.PUT_VALUE, k, kw.KadRecord(k, v)))

        refused = [
            put(pk_key, pk_value + b"\x00" * (10 * 1024)),  # over the 10 KiB cap
            put(b"/pk/" + member.peer_id.to_bytes(), pk_value),  # another peer's name
            put(b"/ipns/" + mh, os.urandom(300)),  # not an IPNS record
        ]
        got, how = run([*refused, _find_node()], wait=1.0)
        assert [m.type for m in got] == [kw.MessageType.FIND_NODE] and how == "open"
        assert on_loop(victim, lambda: len(vk.values)) == 0
        got, _ = run([put(pk_key, pk_value)], wait=1.0)
        assert [m.record.value for m in got if m.record] == [pk_value]
        assert on_loop(victim, lambda: vk.values.get(pk_key)) == pk_value

        cid_key = Cid.of(b"provided").bytes[-34:]
        thousand = tuple(Multiaddr(f"/ip4/{THIRD_HOST}/tcp/{1000 + i}") for i in range(1000))
        others = kw.KadMessage(kw.MessageType.ADD_PROVIDER, cid_key, providers=(kw.KadPeer(member.peer_id, thousand),))
        run([kw.encode(others)], wait=0.5)
        assert on_loop(victim, lambda: vk.providers.ranked_providers(cid_key)) == []
        mine = kw.KadMessage(kw.MessageType.ADD_PROVIDER, cid_key, providers=(kw.KadPeer(stranger.peer_id, thousand),))
        assert len(kw.encode(mine)) > 10_000
        run([kw.encode(mine)], wait=0.5)
        assert on_loop(victim, lambda: vk.providers.ranked_providers(cid_key)) == [stranger.peer_id]

        ask = kw.KadMessage(kw.MessageType.GET_PROVIDERS, cid_key)
        answer = member.run(_kad(member)._ask(victim.peer_id, ask), timeout=10)
        assert [p.peer for p in answer.providers] == [stranger.peer_id]
        assert set(answer.providers[0].addrs) <= {a.without_peer_id() for a in stranger.addrs}
        _member_is_served(victim, member)


def test_kad_answers_never_read_are_let_go(monkeypatch: pytest.MonkeyPatch) -> None:
    """A stranger stores a 10 KiB value on the SDK network, then asks for it 60 times on each of
    4 streams and never reads the answers (its window stays at yamux's 256 KiB). The victim's
    answers stop at the window and each stream is reset once it has not drained for the idle
    time (before, the handler waited on the drain for good: the streams, their tasks and their
    unsent answers were held for the connection's life). A member is served meanwhile."""
    monkeypatch.setattr(kad_actor, "_IDLE", 1.0)
    key = MeshKey.generate()
    with (
        _node(key) as victim,
        _node(key) as member,
        _node(MeshKey.generate(), transport_options=STINGY) as stranger,
    ):
        member.connect(victim.addrs[0])
        _connect_libp2p(stranger, victim)
        value = os.urandom(10 * 1024)
        put = kw.encode(kw.KadMessage(kw.MessageType.PUT_VALUE, b"k", kw.KadRecord(b"k", value)))
        got, _ = stranger.run(_exchange(stranger, victim.peer_id, SDK_NET, [put], wait=0.5), timeout=10)
        assert got and got[0].record is not None and got[0].record.value == value

        async def ask_and_never_read() -> list[Stream]:
            streams = []
            for _ in range(4):
                s = await stranger._host.open_stream(victim.peer_id, SDK_NET)
                for _ in range(60):
                    write_delimited(s, kw.encode(kw.KadMessage(kw.MessageType.GET_VALUE, b"k")))
                streams.append(s)
            return streams

        stranger.run(ask_and_never_read(), timeout=10)

        def unsent() -> int:
            return on_loop(
                victim,
                lambda: sum(
                    s.write_buffer_size()
                    for c in victim._host.all_conns
                    if c.remote_peer == stranger.peer_id
                    for s in list(c._streams.values())
                ),
            )

        assert wait_for(lambda: unsent() > 0, timeout=5)  # (the attack is real: answers wait unsent)
        _member_is_served(victim, member)
        assert wait_for(lambda: _streams_from(victim, stranger.peer_id) == 0, timeout=6), (
            _streams_from(victim, stranger.peer_id),
            unsent(),
        )
        assert stranger.ping(victim.peer_id) > 0  # (the connection serves on)
        _member_is_served(victim, member)


def test_kad_values_of_many_identities_leave_the_members_values(monkeypatch: pytest.MonkeyPatch) -> None:
    """Six stranger identities each store their quota of values (8 of a store of 32) on the SDK
    network. Before, the store evicted its oldest values to take them, a member's among them;
    strangers together now hold at most a quarter of it (as in our DHT's store), and the
    member's value stays."""
    cfg = KadConfig(max_records=32, peer_records=8)
    key = MeshKey.generate()
    with _node(key, kad=cfg) as victim, _node(key) as member:
        member.connect(victim.addrs[0])
        put = kw.KadMessage(kw.MessageType.PUT_VALUE, b"member", kw.KadRecord(b"member", b"the member's"))
        echo = member.run(_kad(member, SDK_NET)._ask(victim.peer_id, put), timeout=10)
        assert echo == put
        strangers = [_node(MeshKey.generate()).start() for _ in range(6)]
        try:
            for s in strangers:
                _connect_libp2p(s, victim)
                frames = [
                    kw.encode(kw.KadMessage(kw.MessageType.PUT_VALUE, k, kw.KadRecord(k, b"junk")))
                    for k in (os.urandom(16) for _ in range(8))
                ]
                s.run(_exchange(s, victim.peer_id, SDK_NET, frames, wait=0.5), timeout=10)
        finally:
            for s in strangers:
                s.stop()
        values = _kad(victim, SDK_NET).values
        assert on_loop(victim, lambda: values.get(b"member")) == b"the member's"
        assert on_loop(victim, lambda: len(values)) <= 1 + 32 // 4
        _member_is_served(victim, member)


# -- libp2p Kademlia: what we ask ------------------------------------------------------------


@contextmanager
def _record_dials(node: lattica.Node) -> Iterator[list[Multiaddr]]:
    """Every address ``node``'s dialer is asked to dial; those on THIRD_HOST fail at once
    (never sent: the count is what matters), the rest are dialed."""
    dialer = node._host.dialer
    real = dialer.dial_addrs
    seen: list[Multiaddr] = []

    async def recording(peer: PeerId, addrs: list[Multiaddr]) -> Connection:
        seen.extend(addrs)
        if any(THIRD_HOST in str(a) for a in addrs):
            raise PeerUnreachable("(a test's third host)")
        return await real(peer, addrs)

    on_loop(node, lambda: setattr(dialer, "dial_addrs", recording))
    try:
        yield seen
    finally:
        on_loop(node, lambda: setattr(dialer, "dial_addrs", real))


def _answer_kad_with(node: lattica.Node, answer: Callable[[kw.KadMessage], bytes | None]) -> None:
    """Make ``node`` answer each /ipfs/kad/1.0.0 request with ``answer(request)`` (raw bytes;
    None: never answer)."""

    async def serve(stream: Stream, conn: Connection) -> None:
        request = kw.decode(await read_delimited(stream, kw.MAX_MESSAGE))
        data = answer(request)
        if data is None:
            await asyncio.sleep(3600)
        write_delimited(stream, data)
        await stream.close()

    on_loop(node, lambda: node._host.handlers.__setitem__(IPFS_KAD, serve))


def _aimed(request: kw.KadMessage) -> bytes:
    """An answer of the request's type naming 300 made-up closer peers with 16 addresses each on
    THIRD_HOST (~61 KB, under our 64 KiB; encoded by hand, past our own 16 KiB writer)."""
    peers = []
    for i in range(300):
        addrs = [Multiaddr(f"/ip4/{THIRD_HOST}/tcp/{2000 + 16 * i + j}").to_bytes() for j in range(16)]
        peers.append(encode_fields([(1, _fake_peer(i).to_bytes())] + [(2, a) for a in addrs]))
    fields: list[tuple[int, int | bytes]] = [(1, int(request.type)), (2, request.key)]
    out = encode_fields(fields + [(8, p) for p in peers])
    assert 50_000 < len(out) <= kw.MAX_MESSAGE
    return out


def test_kad_lookup_through_liars_a_wrong_answer_and_a_silent_peer() -> None:
    """Our node looks up providers (GET_PROVIDERS) while three strangers in its table misbehave:
    one answers with 300 made-up closer peers x 16 addresses, all on one third host; one answers with another message type; one never answers. The lookup ends within the
    request timeout plus a little (not the lookup's), the wrong answerer is marked misbehaved and
    the silent one leaves the table, and the third host is dialed only within the budget for
    addresses others gave (8, then one per 5 s), twice in a row. A member is served."""
    cfg = KadConfig(request_timeout=1.0, lookup_timeout=4.0)
    key = MeshKey.generate()
    with (
        _node(key, kad=cfg) as victim,
        _node(key) as member,
        _node(MeshKey.generate()) as liar,
        _node(MeshKey.generate()) as wrong,
        _node(MeshKey.generate()) as silent,
    ):
        member.connect(victim.addrs[0])
        _answer_kad_with(liar, _aimed)
        _answer_kad_with(wrong, lambda r: kw.encode(kw.KadMessage(kw.MessageType.PING)))
        _answer_kad_with(silent, lambda r: None)
        for s in (liar, wrong, silent):
            _connect_libp2p(s, victim)
        vk = _kad(victim)
        assert wait_for(lambda: on_loop(victim, lambda: len(vk.table)) == 4, timeout=10)
        with _record_dials(victim) as dialed:
            t0 = time.monotonic()
            found = victim.run(vk.find_providers(Cid.of(b"wanted").bytes[-34:]), timeout=30)
            took = time.monotonic() - t0
            assert took < cfg.request_timeout + 2.5, took
            assert wrong.peer_id in vk.misbehaved
            assert on_loop(victim, lambda: silent.peer_id not in vk.table)
            assert found == []
            victim.run(vk.find_providers(Cid.of(b"wanted too").bytes[-34:]), timeout=30)
            took = time.monotonic() - t0
            third = [a for a in dialed if THIRD_HOST in str(a)]
            assert 0 < len(third) <= 8 + 0.2 * took + 2, (len(third), took)
        _member_is_served(victim, member)


# -- many raw identities, from another process -----------------------------------------------

# ``json.loads(argv[1])``: {"addr", "n", "mode", ...}. ``n`` fresh Ed25519 identities dial the
# victim on the libp2p stack and answer its identify (and read what it sends on Bitswap); once
# all are in, at once:
# - "kad": each pipelines ``requests`` FIND_NODEs on ``streams`` streams and reads the answers;
# - "wants": each sends ``messages`` Bitswap messages of 1,024 want-haves (with send-dont-have)
#   of CIDs nobody has, on one stream, and counts the presences it is sent back for ``wait`` s;
# - "partial": each opens ``streams`` Bitswap streams, declares a ``declared``-byte message on
#   each and sends all of it but the last byte, then waits ``wait`` s and counts its streams reset.
# Prints one JSON line of what it saw, then holds its connections until stdin closes.
_RAW = r"""
import asyncio, json, os, sys, time
from lattica._framing import read_delimited, write_delimited
from lattica._host.proposals import ProposedStream
from lattica._identify import LIBP2P_PROTOCOL, encode_libp2p
from lattica._identity import KeyPair
from lattica._multiaddr import Multiaddr
from lattica._protobuf import uvarint
from lattica.content import _bitswap_wire as bw
from lattica.content._cid import RAW, Cid
from lattica.dht import _libp2p_wire as kw
from lattica.errors import LatticaError
from lattica.transports import multistream
from lattica.transports.tcp import TcpTransport

cfg = json.loads(sys.argv[1])
seen = {"presences": 0}


async def inbound(stream, kp):
    select = multistream.Listener(lambda p: p in (LIBP2P_PROTOCOL, bw.PROTOCOL))
    try:
        while (event := select.next_event()) is None:
            body = await read_delimited(stream, multistream.MAX_MESSAGE)
            select.receive(uvarint(len(body)) + body)
            stream.write(select.data_to_send())
        if event.protocol == LIBP2P_PROTOCOL:
            write_delimited(stream, encode_libp2p(kp.public_key_protobuf(), "raw", "/lattica/1.0.0", [], None, []))
            await stream.close()
            return
        while True:
            msg = bw.decode(await read_delimited(stream, bw.MAX_MESSAGE))
            seen["presences"] += len(msg.haves) + len(msg.dont_haves)
    except LatticaError:
        stream.reset()


async def connect(addr, tasks):
    kp = KeyPair.generate()
    t = TcpTransport(kp)
    t._libp2p_at[addr.without_peer_id().host_port()] = None
    conn = await t.dial(addr)
    conn.set_stream_handler(lambda s: tasks.add(asyncio.ensure_future(inbound(s, kp))))
    return t, conn


async def open_on(conn, protocol):
    inner = await conn.open_stream()
    select = multistream.Dialer([protocol])
    inner.write(select.data_to_send())
    return inner, ProposedStream(inner, select, conn.remote_peer)


async def kad(conn, start):
    async def one():
        _, s = await open_on(conn, "/ipfs/kad/1.0.0")
        for _ in range(cfg["requests"]):
            write_delimited(s, kw.encode(kw.KadMessage(kw.MessageType.FIND_NODE, os.urandom(32))))
        got, last = 0, 0.0
        try:
            while got < cfg["requests"]:
                kw.decode(await read_delimited(s, kw.MAX_MESSAGE))
                got, last = got + 1, time.monotonic() - start
        except LatticaError:
            pass
        return got, last

    done = await asyncio.gather(*(one() for _ in range(cfg["streams"])))
    return sum(g for g, _ in done), max(t for _, t in done)


async def wants(conn, messages):
    _, s = await open_on(conn, bw.PROTOCOL)
    for m in messages:
        write_delimited(s, m)
        await s.drain()
    return 0, 0.0


async def partial(conn, start):
    inners = []
    for _ in range(cfg["streams"]):
        inner, s = await open_on(conn, bw.PROTOCOL)
        s.write(uvarint(cfg["declared"]) + b"\0" * (cfg["declared"] - 1))
        inners.append(inner)
    await asyncio.sleep(cfg["wait"])
    return sum(1 for i in inners if i.aborted), 0.0


async def main():
    addr = Multiaddr(cfg["addr"])
    tasks, room = set(), asyncio.Semaphore(16)

    async def guarded():
        async with room:
            return await connect(addr, tasks)

    made = await asyncio.gather(*(guarded() for _ in range(cfg["n"])))
    await asyncio.sleep(0.5)  # (identified by the victim)
    messages = []
    if cfg["mode"] == "wants":
        for _ in range(cfg["messages"]):
            ws = tuple(bw.Want(Cid.of(os.urandom(16), RAW), have=True) for _ in range(1024))
            messages.append(bw.encode(bw.BitswapMessage(wants=ws)))
    start = time.monotonic()
    if cfg["mode"] == "kad":
        done = await asyncio.gather(*(kad(c, start) for _, c in made))
    elif cfg["mode"] == "wants":
        done = await asyncio.gather(*(wants(c, messages) for _, c in made))
        await asyncio.sleep(cfg["wait"])
    else:
        done = await asyncio.gather(*(partial(c, start) for _, c in made))
    print(json.dumps({"counts": [d[0] for d in done], "last": max(d[1] for d in done), **seen}), flush=True)
    await asyncio.get_running_loop().run_in_executor(None, sys.stdin.read)
    for t, conn in made:
        conn.abort("done")
        await t.close()


asyncio.run(main())
"""


@contextmanager
def _raw_identities(victim: lattica.Node, tmp_path: Path, **cfg: Any) -> Iterator[subprocess.Popen]:
    with open(tmp_path / "raw.err", "w") as err:
        proc = subprocess.Popen(
            [sys.executable, "-c", _RAW, json.dumps({"addr": str(victim.addrs[0]), **cfg})],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=err,
            text=True,
        )
    try:
        yield proc
    finally:
        end_child(proc)


def _report(proc: subprocess.Popen, tmp_path: Path) -> dict:
    line = proc.stdout.readline()
    assert line.startswith("{"), (line, (tmp_path / "raw.err").read_text()[-3000:])
    return json.loads(line)


def test_kad_requests_from_many_identities_wait_for_the_strangers_share(tmp_path: Path) -> None:
    """24 raw identities each pipeline 100 FIND_NODEs on two streams (within their own burst) at once: together
    2,400, three times the strangers' burst. They are answered at the strangers' share (800 at
    once, then 400 a second, in turn; none reset), while a member's requests are answered at once."""
    key = MeshKey.generate()
    with _node(key) as victim, _node(key) as member:
        member.connect(victim.addrs[0])
        mk = _kad(member)
        waits: list[float] = []
        with _raw_identities(victim, tmp_path, n=24, mode="kad", streams=2, requests=50) as proc:
            done = threading.Event()
            report: dict = {}

            def read() -> None:
                report.update(_report(proc, tmp_path))
                done.set()

            threading.Thread(target=read, daemon=True).start()
            time.sleep(1.5)  # (connected, and asking)
            while not done.is_set():
                t0 = time.monotonic()
                member.run(mk._ask(victim.peer_id, kw.KadMessage(kw.MessageType.FIND_NODE, os.urandom(32))), 10)
                waits.append(time.monotonic() - t0)
                time.sleep(0.1)
            counts, took = report["counts"], report["last"]
        assert sum(counts) == 2400, counts  # (every request within a peer's budget is answered in turn)
        assert took >= (2400 - 800) / 400 * 0.8, took  # (at the share's rate, not at once)
        assert waits and max(waits) < 1.5, waits
        _member_is_served(victim, member)


# -- Bitswap ----------------------------------------------------------------------------------


def test_bitswap_want_floods_from_many_identities_are_parsed_within_the_named_budget(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """16 raw identities each send 8 Bitswap messages of 1,024 want-haves at once (131,072 CIDs;
    ~8 ms of the victim's CPU to parse each message). Strangers together may name 8,192 CIDs a
    second (32,768 at once): only that many wants are parsed and answered with DONT_HAVE; the
    rest are counted and refused unparsed (before, every message was parsed, then refused). A
    member's content calls are answered meanwhile."""
    parsed: list[tuple[float, int]] = []
    real = bw.decode

    def counting(*args: Any, **kwargs: Any) -> bw.BitswapMessage:
        msg = real(*args, **kwargs)
        parsed.append((time.monotonic(), len(msg.wants)))
        return msg

    monkeypatch.setattr(bw, "decode", counting)  # (the service looks the codec up at each message)
    key = MeshKey.generate()
    with _node(key) as victim, _node(key) as member:
        member.connect(victim.addrs[0])
        held = Cid.parse(lattica.content.put(b"held by the victim", node=victim).result(10))
        with _raw_identities(victim, tmp_path, n=16, mode="wants", messages=8, wait=3.0) as proc:
            ok = []
            t0 = time.monotonic()
            while time.monotonic() - t0 < 3.0:
                ok.append(call_as(member, content_ref(victim.peer_id), "have", [held.bytes], timeout=10) == [True])
                time.sleep(0.2)
            report = _report(proc, tmp_path)
        assert all(ok) and ok
        total = sum(n for _, n in parsed)
        took = parsed[-1][0] - parsed[0][0] if parsed else 0.0
        allowed = NAMED_BURST + 8192 * took + 1024
        assert total <= allowed, (total, allowed, len(parsed))
        assert 0 < report["presences"] <= total
        _member_is_served(victim, member)


def _holder_of_big_blocks(node: lattica.Node) -> tuple[Cid, list[Cid]]:
    """``node`` holds a 4 MiB object: its root and four 1 MiB leaves."""
    root = Cid.parse(lattica.content.put(os.urandom(4 * 1024 * 1024), node=node).result(30))
    store = node._host.services.content.store
    return root, [link.cid for link in decode_node(store.get(root)).links]


def _bitswap_only(node: lattica.Node) -> None:
    """``node`` tells the next peer that identifies it that it speaks Bitswap and no actor calls
    (a libp2p node: we ask it over Bitswap, not our content actor)."""
    addrs = [a.without_peer_id().to_bytes() for a in node.addrs]
    _answer_identify_with(node, lambda: _identify_message(node, addrs, [bw.PROTOCOL], agent="hostile-bitswap"))


def test_bitswap_answers_never_read_are_let_go_and_our_asks_keep_their_deadline(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A libp2p stranger (window 256 KiB) wants four 1 MiB blocks we hold and never reads the
    stream we answer on. Our answer stops at its window (the outbound buffer stays within one
    message); our ``have(peer, timeout=1)`` keeps its deadline though that send holds the
    peer's lock (804384a); and once the answer has not drained for the send timeout our stream
    is reset and let go (before, that send waited for good: the stream, its unsent answer, the
    task serving the peer's wants and every later message to the peer were held for the
    connection's life). A member fetches the same object meanwhile."""
    monkeypatch.setattr(bitswap_actor, "SEND_TIMEOUT", 1.5, raising=False)
    key = MeshKey.generate()
    with (
        _node(key) as victim,
        _node(key) as member,
        _node(MeshKey.generate(), transport_options=STINGY) as stranger,
    ):
        root, leaves = _holder_of_big_blocks(victim)
        member.connect(victim.addrs[0])

        async def sink(stream: Stream, conn: Connection) -> None:
            await asyncio.sleep(3600)

        on_loop(stranger, lambda: stranger._host.handlers.__setitem__(bw.PROTOCOL, sink))
        _bitswap_only(stranger)
        _connect_libp2p(stranger, victim)
        vb = _bitswap(victim)
        assert on_loop(victim, lambda: vb.speaks_only_bitswap(stranger.peer_id))

        async def want_blocks() -> Stream:
            s = await stranger._host.open_stream(victim.peer_id, bw.PROTOCOL)
            write_delimited(s, bw.encode(bw.BitswapMessage(wants=tuple(bw.Want(c) for c in leaves))))
            await s.drain()
            return s

        stranger.run(want_blocks(), timeout=10)

        def unsent() -> int:
            return on_loop(victim, lambda: vb._unsent(stranger.peer_id))

        assert wait_for(lambda: unsent() > 0, timeout=10)  # (the attack is real: our answer waits)
        assert unsent() <= bitswap_actor.MESSAGE_BLOCK_BYTES + 64 * 1024

        t0 = time.monotonic()
        try:
            victim.run(vb.have(stranger.peer_id, [leaves[0]], timeout=1.0), timeout=6)
        except LatticaError:
            pass  # (Timeout: it answered nothing, as it should)
        assert time.monotonic() - t0 < 3.0, "our want-have did not keep its deadline"
        assert lattica.content.get(str(root), node=member).result(30) == lattica.content.get(
            str(root), node=victim
        ).result(30)
        assert wait_for(lambda: unsent() == 0, timeout=10)
        _member_is_served(victim, member)


def test_bitswap_messages_held_half_read_on_many_streams_stay_within_the_strangers_budget(tmp_path: Path) -> None:
    """One raw identity opens 32 Bitswap streams and on each declares a 4 MiB message and sends
    all of it but the last byte (128 MiB in all). Before, each stream's reader held its 4 MiB
    (for up to 300 s idle): the victim grew by 128 MiB. Half-read messages now count against the
    node's budget for partly received messages (16 MiB a stranger): the rest of the streams are
    reset, and the victim grows by a fraction of that. A 5 MiB message is reset at once. A member
    is served."""
    key = MeshKey.generate()
    with _node(key) as victim, _node(key) as member:
        member.connect(victim.addrs[0])
        _member_is_served(victim, member)
        before = _rss()
        most = [before]
        with _raw_identities(
            victim, tmp_path, n=1, mode="partial", streams=32, declared=4 * 1024 * 1024, wait=4.0
        ) as p:
            done = threading.Event()
            report: dict = {}

            def read() -> None:
                report.update(_report(p, tmp_path))
                done.set()

            threading.Thread(target=read, daemon=True).start()
            while not done.wait(0.1):
                most[0] = max(most[0], _rss())
            _member_is_served(victim, member)
        grew = (most[0] - before) / 2**20
        assert report["counts"][0] >= 24, (report, grew)
        assert grew < 48, grew
        with _raw_identities(victim, tmp_path, n=1, mode="partial", streams=1, declared=5 * 1024 * 1024, wait=1.0) as p:
            assert _report(p, tmp_path)["counts"] == [1]
        _member_is_served(victim, member)


def _liar(node: lattica.Node, junk: bool) -> list[int]:
    """Make ``node`` a lying Bitswap provider: HAVE to every want-have, nothing to a want-block;
    with ``junk``, each answer also carries 1,024 DONT_HAVEs and 4 blocks nobody asked for. The
    list counts the messages it was sent."""
    heard = [0]

    async def serve(stream: Stream, conn: Connection) -> None:
        out = await node._host.open_stream_on(conn, bw.PROTOCOL)
        try:
            while True:
                msg = bw.decode(await read_delimited(stream, bw.MAX_MESSAGE))
                heard[0] += 1
                haves = tuple(w.cid for w in msg.wants if w.have and not w.cancel)
                extra: dict[str, Any] = {}
                if junk:
                    extra["dont_haves"] = tuple(Cid.of(os.urandom(8)) for _ in range(1024))
                    blocks = [os.urandom(1000) for _ in range(4)]
                    extra["blocks"] = tuple((Cid.of(b, RAW), b) for b in blocks)
                if haves or junk:
                    write_delimited(out, bw.encode(bw.BitswapMessage(haves=haves, **extra)))
                    await out.drain()
        except LatticaError:
            out.reset()

    on_loop(node, lambda: node._host.handlers.__setitem__(bw.PROTOCOL, serve))
    _bitswap_only(node)
    return heard


def test_bitswap_providers_that_lie_or_send_junk_do_not_hold_a_fetch() -> None:
    """Two libp2p strangers say HAVE to every want-have and never send a block; one also sends
    1,024 DONT_HAVEs and 4 blocks nobody asked for with every answer. A fetch of an object a
    member holds completes from the member, nothing unasked is stored, and a fetch of an object
    only the liars claim fails with BlockNotFound within the fetch's find and block timeouts."""
    cfg = ContentConfig(blocks="memory", find_timeout=2.0, block_timeout=1.0)
    key = MeshKey.generate()
    with (
        _node(key, content=cfg) as victim,
        _node(key) as member,
        _node(MeshKey.generate()) as liar,
        _node(MeshKey.generate()) as junk,
    ):
        data = os.urandom(3 * 1024 * 1024 + 5)
        root = lattica.content.put(data, node=member).result(30)
        heard = [_liar(liar, junk=False), _liar(junk, junk=True)]
        member.connect(victim.addrs[0])
        for s in (liar, junk):
            _connect_libp2p(s, victim)
            assert on_loop(victim, lambda s=s: _bitswap(victim).speaks_only_bitswap(s.peer_id))
        t0 = time.monotonic()
        assert lattica.content.get(root, node=victim).result(30) == data
        assert time.monotonic() - t0 < 10
        assert all(h[0] > 0 for h in heard), heard  # (both were asked)
        store = victim._host.services.content.store
        assert on_loop(victim, lambda: store.stats().blocks) == 5  # (the root and 4 leaves: no junk)

        nobody = Cid.of(b"a block only liars claim")
        t0 = time.monotonic()
        with pytest.raises(BlockNotFound):
            lattica.content.get(str(nobody), node=victim).result(30)
        assert time.monotonic() - t0 < cfg.find_timeout + cfg.block_timeout + 6
        _member_is_served(victim, member)
