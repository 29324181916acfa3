"""Circuit relay v2 (``/libp2p/circuit/relay/0.2.0/hop`` and ``/stop``) under attack, over real
sockets on 127.0.0.1 (attackers' bare identities dial from 127.0.0.2 and 127.0.0.3, so the relay
counts them apart from the members on 127.0.0.1).

Our relay as the target: malformed hop messages, a silent or trickling stream, a reservation over
a relayed connection, reservation floods from many throwaway identities, circuit floods beyond
the strangers' limits, circuits to peers without a reservation. Our node as the client of a
hostile libp2p relay: bad vouchers, addresses at a third host, absurd expiries and limits, STOP
streams it was never asked for, and upgrades that fail. Limited circuits: a call fails clearly,
ping still works, and nothing is left behind. Each time the outcome is defined (refused with the
right status, bounded, or dropped) and the node goes on serving its members.
"""

from __future__ import annotations

import asyncio
import contextvars
import logging
import threading
import time
from collections.abc import Callable, Coroutine, Iterator
from dataclasses import dataclass
from typing import Any

import pytest

import lattica
from helpers import on_loop, wait_for
from lattica._envelope import seal, seal_peer_record
from lattica._framing import read_delimited, write_delimited
from lattica._host import dialer
from lattica._host.proposals import ProposedStream
from lattica._identify import LIBP2P_PROTOCOL, encode_libp2p
from lattica._identity import KeyPair, PeerId
from lattica._multiaddr import Multiaddr
from lattica._protobuf import encode_fields, uvarint
from lattica.actors.nat import relay as relay_module
from lattica.config import NatConfig, RelayConfig
from lattica.errors import LatticaError, PeerUnreachable
from lattica.transports import circuit, multistream
from lattica.transports import circuit_v2 as v2
from lattica.transports.base import Connection, Stream
from lattica.transports.tcp import TcpTransport
from lattica.transports.upgrade import Libp2pUpgrade, Up
from lattica.trust import MeshKey

pytestmark = pytest.mark.timeout(60)

TCP = "/ip4/127.0.0.1/tcp/0"
S = v2.Status
NOT_OK = {S.MALFORMED_MESSAGE, S.UNEXPECTED_MESSAGE, S.PERMISSION_DENIED}


# -- bare libp2p identities on a loop of their own ----------------------------------------------------

_SOURCE_IP: contextvars.ContextVar[str] = contextvars.ContextVar("source_ip", default="127.0.0.2")


@dataclass
class Raw:
    """One throwaway identity: a libp2p connection (multistream, Noise, yamux) and nothing else."""

    kp: KeyPair
    transport: TcpTransport
    conn: Connection

    @property
    def peer_id(self) -> PeerId:
        return self.kp.peer_id

    async def open(self, protocol: str) -> Stream:
        stream = await self.conn.open_stream()
        select = multistream.Dialer([protocol])
        stream.write(select.data_to_send())
        return ProposedStream(stream, select, self.conn.remote_peer)


class Attackers:
    """Bare identities on their own loop thread; each dials from the source IP it is given."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        plain = self.loop.create_connection

        async def from_source(*args: Any, **kw: Any) -> Any:
            kw.setdefault("local_addr", (_SOURCE_IP.get(), 0))
            return await plain(*args, **kw)

        self.loop.create_connection = from_source  # type: ignore[method-assign]
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self.raws: list[Raw] = []
        self._tasks: set[asyncio.Future] = set()

    def run(self, coro: Coroutine[Any, Any, Any], timeout: float = 20.0) -> Any:
        return asyncio.run_coroutine_threadsafe(asyncio.wait_for(coro, timeout), self.loop).result(timeout + 5)

    async def _answer_identify(self, stream: Stream, kp: KeyPair) -> None:
        select = multistream.Listener(lambda p: p == LIBP2P_PROTOCOL)
        try:
            while select.next_event() is None:
                body = await read_delimited(stream, multistream.MAX_MESSAGE)
                select.receive(uvarint(len(body)) + body)
                stream.write(select.data_to_send())
            write_delimited(stream, encode_libp2p(kp.public_key_protobuf(), "attacker", "/lattica/1.0.0", [], None, []))
            await stream.close()
        except LatticaError:
            stream.reset()

    async def identity(self, addr: Multiaddr, ip: str = "127.0.0.2") -> Raw:
        kp = KeyPair.generate()
        t = TcpTransport(kp)
        t._libp2p_at[addr.without_peer_id().host_port()] = None  # the libp2p stack, as a libp2p node dials
        token = _SOURCE_IP.set(ip)
        try:
            conn = await t.dial(addr)
        finally:
            _SOURCE_IP.reset(token)
        conn.set_stream_handler(lambda s: self._tasks.add(asyncio.ensure_future(self._answer_identify(s, kp))))
        raw = Raw(kp, t, conn)
        self.raws.append(raw)
        return raw

    async def again(self, raw: Raw, addr: Multiaddr, ip: str) -> Raw:
        """A second connection of ``raw``'s identity, from ``ip``."""
        t = TcpTransport(raw.kp)
        t._libp2p_at[addr.without_peer_id().host_port()] = None
        token = _SOURCE_IP.set(ip)
        try:
            conn = await t.dial(addr)
        finally:
            _SOURCE_IP.reset(token)
        conn.set_stream_handler(lambda s: self._tasks.add(asyncio.ensure_future(self._answer_identify(s, raw.kp))))
        moved = Raw(raw.kp, t, conn)
        self.raws.append(moved)
        return moved

    async def _close(self) -> None:
        for raw in self.raws:
            raw.conn.abort("done")
            await raw.transport.close()
        for t in self._tasks:
            t.cancel()

    def close(self) -> None:
        if not self.thread.is_alive():
            return
        try:
            self.run(self._close(), timeout=10)
        finally:
            self.loop.call_soon_threadsafe(self.loop.stop)
            self.thread.join(5)


@pytest.fixture
def attackers() -> Iterator[Attackers]:
    a = Attackers()
    try:
        yield a
    finally:
        a.close()


async def _ask(stream: Stream, body: bytes | None = None, *, raw: bytes | None = None) -> v2.HopMessage | None:
    """Send a hop message (``body`` length-prefixed, or ``raw`` bytes as they are) and read the
    answer: the relay's HopMessage, or None if it ended or reset the stream without one."""
    if body is not None:
        write_delimited(stream, body)
    if raw is not None:
        stream.write(raw)
    try:
        return v2.decode_hop(await read_delimited(stream, v2.MAX_MESSAGE))
    except LatticaError:
        return None


def _reserve_msg() -> bytes:
    return v2.encode_hop(v2.HopMessage(v2.HopType.RESERVE))


def _connect_msg(peer: PeerId) -> bytes:
    return v2.encode_hop(v2.HopMessage(v2.HopType.CONNECT, v2.RelayPeer(peer)))


# -- nodes -----------------------------------------------------------------------------------------


def _relay(cfg: RelayConfig | bool = True, mesh: MeshKey | None = None, **kw: Any) -> lattica.Node:
    return lattica.Node([TCP], relay=cfg, mesh=mesh or MeshKey.generate(), mdns=False, membership=False, **kw)


def _private(relay: lattica.Node, mesh: MeshKey, listen: tuple[str, ...] = ()) -> lattica.Node:
    return lattica.Node(
        list(listen),
        relays=[str(relay.addrs[0])],
        nat=NatConfig(reachability="private"),
        mdns=False,
        membership=False,
        mesh=mesh,
    )


def _book(relay: lattica.Node) -> relay_module.RelayService:
    return relay._host.services.relay


def _circuit_of(node: lattica.Node) -> str:
    """``node``'s circuit address once it holds a reservation."""
    assert wait_for(lambda: node.nat_status().relays, timeout=10), "no reservation within 10 s"
    return node.nat_status().relays[0] + f"/p2p/{node.peer_id}"


def _names(caller: lattica.Node, peer: PeerId, timeout: float = 10.0) -> list:
    ref = lattica.ActorRef(peer, "spawner", {"names": "async"})
    return caller.run(caller._host.runtime.call(ref, "names", (), {}, timeout=timeout), timeout=timeout + 10)


def _v2_reserve_as(node: lattica.Node, relay: lattica.Node) -> v2.HopMessage | None:
    """A RESERVE on ``relay``'s hop stream, sent by ``node`` over its direct connection."""

    async def go() -> v2.HopMessage | None:
        conn = await node._host.get_connection(relay.peer_id)
        stream = await node._host.open_stream_on(conn, v2.HOP)
        try:
            return await _ask(stream, _reserve_msg())
        finally:
            stream.reset()

    return node.run(go(), timeout=15)


def _members_are_served(relay: lattica.Node, mesh: MeshKey) -> None:
    """Members on 127.0.0.1 reserve on ``relay`` (one with our protocol, one with circuit relay
    v2's RESERVE), and the second reaches the first through the circuit, pings it and calls it."""
    with _private(relay, mesh) as target, lattica.Node([], mesh=mesh, mdns=False, membership=False) as source:
        addr = _circuit_of(target)
        source.connect(relay.addrs[0], timeout=10)
        answer = _v2_reserve_as(source, relay)
        assert answer is not None and answer.status == S.OK, answer
        assert answer.reservation is not None
        assert v2.open_voucher(answer.reservation.voucher, relay.peer_id, source.peer_id) == answer.reservation.expire
        source.connect(addr, timeout=10)
        assert source._host.conns[target.peer_id].transport == "relay"
        assert source.ping(target.peer_id) > 0
        assert isinstance(_names(source, target.peer_id), list)


# -- 1. our relay as the target ------------------------------------------------------------------------


def _malformed_cases(relay: PeerId, source: PeerId) -> list[tuple[str, bytes | None, bytes | None, set]]:
    """(name, body, raw bytes, statuses the relay may answer with)."""
    mal = {S.MALFORMED_MESSAGE}
    return [
        ("garbage", b"\xff" * 12, None, mal),
        ("a wire type protobuf does not have here", b"\x0d\x00\x00\x00\x00", None, mal),
        ("over 4 KiB", None, uvarint(v2.MAX_MESSAGE + 1) + b"\x08\x00" * ((v2.MAX_MESSAGE + 2) // 2), mal),
        ("a length prefix of 2**40", None, uvarint(1 << 40) + b"\x08\x00", mal),
        ("an unknown type", encode_fields([(1, 7)]), None, mal),
        ("no type", encode_fields([(2, encode_fields([(1, source.to_bytes())]))]), None, mal),
        ("CONNECT without a peer", encode_fields([(1, 1)]), None, mal),
        (
            "CONNECT naming no valid peer",
            encode_fields([(1, 1), (2, encode_fields([(1, b"\x00\x01junk")]))]),
            None,
            mal,
        ),
        ("CONNECT naming the relay", _connect_msg(relay), None, mal),
        ("CONNECT naming its source", _connect_msg(source), None, mal),
        ("STATUS as a request", v2.encode_hop(v2.HopMessage(v2.HopType.STATUS, status=S.OK)), None, NOT_OK),
        ("an unknown status", encode_fields([(1, 2), (5, 999)]), None, mal),
    ]


def test_malformed_hop_messages_are_refused_and_the_relay_serves_on(attackers: Attackers) -> None:
    mesh = MeshKey.generate()
    with _relay(mesh=mesh) as relay:
        raw = attackers.run(attackers.identity(relay.addrs[0]))
        for name, body, data, allowed in _malformed_cases(relay.peer_id, raw.peer_id):

            async def one(body: bytes | None = body, data: bytes | None = data) -> v2.HopMessage | None:
                stream = await raw.open(v2.HOP)
                try:
                    return await _ask(stream, body, raw=data)
                finally:
                    stream.reset()

            answer = attackers.run(one(), timeout=15)
            assert answer is not None, f"{name}: no answer"
            assert answer.type == v2.HopType.STATUS and answer.status in allowed, (name, answer)
        book = _book(relay)
        assert on_loop(relay, lambda: (len(book.reservations), book.total_circuits, dict(book.circuits))) == (0, 0, {})
        assert not raw.conn.is_closed  # (refusing a message is not dropping the peer)
        _members_are_served(relay, mesh)


def test_a_silent_or_trickling_hop_stream_is_dropped_at_the_relays_timeout(
    attackers: Attackers, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A hop stream that never says anything, and one that sends a length and then a byte every
    0.2 s: each is answered MALFORMED_MESSAGE and ended at the relay's timeout (shortened here
    from 10 s), not held."""
    monkeypatch.setattr(relay_module, "_TIMEOUT", 1.5)
    mesh = MeshKey.generate()
    with _relay(mesh=mesh) as relay:
        raw = attackers.run(attackers.identity(relay.addrs[0]))

        async def silent() -> tuple[v2.HopMessage | None, float]:
            stream = await raw.open(v2.HOP)
            t0 = time.monotonic()
            answer = await _ask(stream)
            took = time.monotonic() - t0
            stream.reset()
            return answer, took

        async def trickle() -> tuple[v2.HopMessage | None, float]:
            stream = await raw.open(v2.HOP)
            stream.write(uvarint(60))
            t0 = time.monotonic()
            reading = asyncio.ensure_future(_ask(stream))
            try:
                while not reading.done() and time.monotonic() - t0 < 8:
                    stream.write(b"\x08")
                    await asyncio.wait([reading], timeout=0.2)
            except LatticaError:
                pass
            answer, took = await reading, time.monotonic() - t0
            stream.reset()
            return answer, took

        for attack in (silent, trickle):
            answer, took = attackers.run(attack(), timeout=15)
            assert 1.0 < took < 5.0, (attack.__name__, took)
            assert answer is not None and answer.status == S.MALFORMED_MESSAGE, (attack.__name__, answer)
        assert wait_for(lambda: on_loop(relay, lambda: _streams_of(relay, raw.peer_id)) == 0, 5)
        _members_are_served(relay, mesh)


def _streams_of(node: lattica.Node, peer: PeerId) -> int:
    """Streams open on ``node``'s connections to ``peer``."""
    return sum(c.num_streams for c in node._host.all_conns if c.remote_peer == peer)


def test_reserve_and_connect_over_a_relayed_connection_are_refused() -> None:
    """A reaches relay R1 only through relay R2 (R1 has no listener): R1 refuses its RESERVE and
    its CONNECT on that relayed connection, and still serves members that reach it otherwise."""
    mesh = MeshKey.generate()
    with _relay(RelayConfig(splice=False), mesh=mesh) as r2:
        with (
            lattica.Node(
                [],
                relay=True,
                relays=[str(r2.addrs[0])],
                nat=NatConfig(reachability="private"),
                mdns=False,
                membership=False,
                mesh=mesh,
            ) as r1,
            lattica.Node([], mdns=False, membership=False, mesh=MeshKey.generate()) as a,
            _private(r2, mesh) as target,
        ):
            a.connect(_circuit_of(r1), timeout=10)
            _circuit_of(target)
            conn = a._host.conns[r1.peer_id]
            assert conn.transport == "relay"

            async def ask(body: bytes) -> v2.HopMessage | None:
                stream = await a._host.open_stream_on(conn, v2.HOP)
                try:
                    return await _ask(stream, body)
                finally:
                    stream.reset()

            reserve = a.run(ask(_reserve_msg()), timeout=15)
            assert reserve is not None and reserve.status in {S.RESERVATION_REFUSED, S.PERMISSION_DENIED}, reserve
            assert a.peer_id not in _book(r1).reservations
            connect = a.run(ask(_connect_msg(target.peer_id)), timeout=15)
            assert connect is not None and connect.status == S.PERMISSION_DENIED, connect
            assert on_loop(r1, lambda: _book(r1).total_circuits) == 0
            assert a.ping(r1.peer_id) > 0  # (the relayed connection itself serves on)


def test_a_reservation_flood_from_one_address_stops_at_the_limit_per_address(attackers: Attackers) -> None:
    """40 fresh identities from 127.0.0.2 reserve: 16 (max_reservations_per_ip) are granted, with
    a voucher the relay signed for each, the other 24 get RESOURCE_LIMIT_EXCEEDED; a holder's
    renewal is still granted; the book holds 16; members on 127.0.0.1 still reserve and connect,
    and once the identities leave their reservations go with them."""
    mesh = MeshKey.generate()
    n = 40
    with _relay(mesh=mesh) as relay:

        async def flood() -> list[tuple[Raw, v2.HopMessage | None]]:
            room = asyncio.Semaphore(8)

            async def one() -> tuple[Raw, v2.HopMessage | None]:
                async with room:
                    raw = await attackers.identity(relay.addrs[0])
                    stream = await raw.open(v2.HOP)
                    try:
                        return raw, await _ask(stream, _reserve_msg())
                    finally:
                        stream.reset()

            return await asyncio.gather(*(one() for _ in range(n)))

        answers = attackers.run(flood(), timeout=40)
        granted = [(raw, a) for raw, a in answers if a is not None and a.status == S.OK]
        refused = [a for _, a in answers if a is not None and a.status == S.RESOURCE_LIMIT_EXCEEDED]
        cap = RelayConfig().max_reservations_per_ip
        assert (len(granted), len(refused)) == (cap, n - cap), [a and a.status for _, a in answers]
        for raw, a in granted:
            assert a.reservation is not None and a.reservation.addrs
            assert v2.open_voucher(a.reservation.voucher, relay.peer_id, raw.peer_id) == a.reservation.expire
            assert all(m.peer_id == relay.peer_id for m in a.reservation.addrs)
        book = _book(relay)
        assert on_loop(relay, lambda: len(book.reservations)) == cap

        async def renew() -> v2.HopMessage | None:
            stream = await granted[0][0].open(v2.HOP)
            return await _ask(stream, _reserve_msg())

        again = attackers.run(renew())
        assert again is not None and again.status == S.OK
        assert on_loop(relay, lambda: len(book.reservations)) == cap
        _members_are_served(relay, mesh)

        attackers.close()
        assert wait_for(lambda: on_loop(relay, lambda: len(book.reservations)) == 0, timeout=10)
        assert on_loop(relay, lambda: not any(p in relay._host.protected for p in (r.peer_id for r in attackers.raws)))


def test_strangers_cannot_take_every_reservation_from_the_members(attackers: Attackers) -> None:
    """max_reservations 24: strangers from two addresses take what they may (16 + 8), then a
    member of the relay's mesh asks: it must still get a reservation."""
    mesh = MeshKey.generate()
    with _relay(RelayConfig(max_reservations=24), mesh=mesh) as relay:

        async def flood() -> list[v2.Status | None]:
            out = []
            for ip, n in (("127.0.0.2", 16), ("127.0.0.3", 12)):
                for _ in range(n):
                    raw = await attackers.identity(relay.addrs[0], ip)
                    stream = await raw.open(v2.HOP)
                    answer = await _ask(stream, _reserve_msg())
                    stream.reset()
                    out.append(None if answer is None else answer.status)
            return out

        got = attackers.run(flood(), timeout=40)
        assert got.count(S.OK) <= 24 and on_loop(relay, lambda: len(_book(relay).reservations)) <= 24
        with lattica.Node([], mesh=mesh, mdns=False, membership=False) as member:
            member.connect(relay.addrs[0], timeout=10)
            assert on_loop(relay, lambda: relay._host.circle_of(member.peer_id)) == "member"
            answer = _v2_reserve_as(member, relay)
            assert answer is not None and answer.status == S.OK, answer


def test_renewing_from_another_address_does_not_get_around_the_limit_per_address(attackers: Attackers) -> None:
    """Three rounds: 16 fresh identities reserve from 127.0.0.2 (its limit), then each opens a
    second connection from 127.0.0.3 and renews there. However they move, no address may end up
    holding more than max_reservations_per_ip reservations."""
    cap = RelayConfig().max_reservations_per_ip
    with _relay() as relay:
        addr = relay.addrs[0]

        async def reserve(raw: Raw) -> v2.Status | None:
            stream = await raw.open(v2.HOP)
            try:
                answer = await _ask(stream, _reserve_msg())
            finally:
                stream.reset()
            return None if answer is None else answer.status

        async def rounds() -> list[tuple[int, int]]:
            out = []
            for _ in range(3):
                fresh = [await attackers.identity(addr, "127.0.0.2") for _ in range(cap)]
                granted = [r for r in fresh if await reserve(r) == S.OK]
                moved = [await attackers.again(r, addr, "127.0.0.3") for r in granted]
                renewed = [await reserve(m) for m in moved]
                out.append((len(granted), renewed.count(S.OK)))
            return out

        attackers.run(rounds(), timeout=40)
        book = _book(relay)
        per_ip = on_loop(relay, lambda: [r.ip for r in book.reservations.values()])
        assert max(per_ip.count(ip) for ip in set(per_ip)) <= cap, {ip: per_ip.count(ip) for ip in set(per_ip)}


def test_a_circuit_flood_stops_at_the_strangers_limits(attackers: Attackers) -> None:
    """Strangers' CONNECTs to a member that holds a reservation: one stranger gets
    max_circuits_per_stranger (2) and then RESOURCE_LIMIT_EXCEEDED, strangers from one address
    max_stranger_circuits_per_ip (3) together, another address its own; a CONNECT to a peer
    without a reservation is NO_RESERVATION. Once the strangers let go the counts are back to
    zero, and a member reaches the target through the relay."""
    mesh = MeshKey.generate()
    cfg = RelayConfig(max_circuits_per_stranger=2, max_stranger_circuits_per_ip=3)
    with _relay(cfg, mesh=mesh) as relay, _private(relay, mesh) as target:
        addr = _circuit_of(target)
        book = _book(relay)
        streams: list[Stream] = []

        async def connect(raw: Raw, peer: PeerId) -> v2.Status | None:
            stream = await raw.open(v2.HOP)
            streams.append(stream)
            answer = await _ask(stream, _connect_msg(peer))
            return None if answer is None else answer.status

        async def flood() -> list[list[v2.Status | None]]:
            s1 = await attackers.identity(relay.addrs[0], "127.0.0.2")
            s2 = await attackers.identity(relay.addrs[0], "127.0.0.2")
            s3 = await attackers.identity(relay.addrs[0], "127.0.0.3")
            return [
                [await connect(s1, target.peer_id) for _ in range(3)],
                [await connect(s2, target.peer_id) for _ in range(2)],
                [await connect(s3, target.peer_id), await connect(s3, KeyPair.generate().peer_id)],
            ]

        got = attackers.run(flood(), timeout=40)
        assert got == [
            [S.OK, S.OK, S.RESOURCE_LIMIT_EXCEEDED],
            [S.OK, S.RESOURCE_LIMIT_EXCEEDED],
            [S.OK, S.NO_RESERVATION],
        ], got
        assert on_loop(relay, lambda: (book.total_circuits, book.stranger_circuits)) == (4, 4)

        async def let_go() -> None:
            for s in streams:
                s.reset()

        attackers.run(let_go())
        assert wait_for(lambda: on_loop(relay, lambda: book.total_circuits) == 0, timeout=10)
        assert on_loop(relay, lambda: (book.stranger_circuits, dict(book._opened_by), dict(book.circuits))) == (
            0,
            {},
            {},
        )
        with lattica.Node([], mesh=mesh, mdns=False, membership=False) as member:
            member.connect(addr, timeout=10)
            assert member.ping(target.peer_id) > 0
            assert isinstance(_names(member, target.peer_id), list)


# -- 2. our node as the client of a hostile libp2p relay --------------------------------------------


class Hostile:
    """A libp2p relay (a node serving only circuit relay v2's hop protocol) that answers each hop
    request with what ``answer(request, peer)`` makes: a message body, or None to say nothing."""

    def __init__(self) -> None:
        self.node = lattica.Node([TCP], mdns=False, membership=False, mesh=MeshKey.generate())
        self.answer: Callable[[v2.HopMessage, PeerId], bytes | None] = lambda req, peer: None
        self.after: Callable[[Stream], Coroutine[Any, Any, None]] | None = None  # (a CONNECT's bytes after OK)
        self.asked = 0

    async def _serve(self, stream: Stream, conn: Connection) -> None:
        try:
            request = v2.decode_hop(await read_delimited(stream, v2.MAX_MESSAGE))
        except LatticaError:
            stream.reset()
            return
        self.asked += 1
        body = self.answer(request, conn.remote_peer)
        if body is None:
            await asyncio.sleep(30)
            return
        stream.write(uvarint(len(body)) + body)
        if self.after is not None and request.type == v2.HopType.CONNECT:
            await self.after(stream)
        await stream.close()

    def __enter__(self) -> Hostile:
        self.node.start()
        self.node.set_stream_handler(v2.HOP, self._serve)
        return self

    def __exit__(self, *exc: Any) -> None:
        self.node.stop()

    @property
    def kp(self) -> KeyPair:
        return self.node.keypair

    @property
    def peer_id(self) -> PeerId:
        return self.node.peer_id

    @property
    def addr(self) -> Multiaddr:
        return self.node.addrs[0]


def _try_reserve(a: lattica.Node, relay: PeerId) -> LatticaError | list[Multiaddr]:
    """``a``'s NAT manager reserves on ``relay`` as when it keeps its relays: the circuit addresses
    it then advertises, or the LatticaError it refused the answer with (anything else fails)."""

    async def go() -> LatticaError | list[Multiaddr]:
        nat = a._host.nat
        assert nat is not None
        try:
            nat._reserved(relay, await nat._reserve(relay))
        except LatticaError as e:
            return e
        return list(nat.relays[relay].addrs)

    return a.run(go(), timeout=20)


def _rsvp(
    h: KeyPair,
    me: PeerId,
    *,
    expire: int | None = None,
    addrs: tuple[Multiaddr, ...] = (),
    voucher: bytes | None = None,
    limit: v2.Limit | None = None,
) -> bytes:
    expire = int(time.time()) + 3600 if expire is None else expire
    voucher = v2.make_voucher(h, me, expire) if voucher is None else voucher
    return encode_fields(
        [(1, int(v2.HopType.STATUS))]
        + [(3, encode_fields([(1, expire)] + [(2, a.to_bytes()) for a in addrs] + ([(3, voucher)] if voucher else [])))]
        + ([(4, encode_fields([(1, limit.duration), (2, limit.data)]))] if limit else [])
        + [(5, int(S.OK))]
    )


def _voucher_payload(relay: PeerId, peer: PeerId) -> bytes:
    return encode_fields([(1, relay.to_bytes()), (2, peer.to_bytes()), (3, int(time.time()) + 3600)])


_Make = Callable[[KeyPair, PeerId, Multiaddr], bytes]
_REFUSED: dict[str, _Make] = {
    "a voucher signed by another key": lambda h, me, at: _rsvp(
        h, me, voucher=v2.make_voucher(KeyPair.generate(), me, int(time.time()) + 3600)
    ),
    "a voucher for another peer": lambda h, me, at: _rsvp(
        h, me, voucher=v2.make_voucher(h, KeyPair.generate().peer_id, int(time.time()) + 3600)
    ),
    "a voucher naming another relay": lambda h, me, at: _rsvp(
        h,
        me,
        voucher=seal(h, v2.VOUCHER_DOMAIN, v2.VOUCHER_TYPE, _voucher_payload(KeyPair.generate().peer_id, me)),
    ),
    "a voucher signed for another purpose": lambda h, me, at: _rsvp(
        h, me, voucher=seal(h, "libp2p-peer-record", v2.VOUCHER_TYPE, _voucher_payload(h.peer_id, me))
    ),
    "a peer record for a voucher": lambda h, me, at: _rsvp(h, me, voucher=seal_peer_record(h, 1, [at])),
    "a garbage voucher": lambda h, me, at: _rsvp(h, me, voucher=b"\x0a\x05junk!\xff\xff"),
    "RESERVATION_REFUSED": lambda h, me, at: v2.encode_hop(
        v2.HopMessage(v2.HopType.STATUS, status=S.RESERVATION_REFUSED)
    ),
    "OK without a reservation": lambda h, me, at: v2.encode_hop(v2.HopMessage(v2.HopType.STATUS, status=S.OK)),
    "a CONNECT for an answer": lambda h, me, at: v2.encode_hop(v2.HopMessage(v2.HopType.CONNECT, v2.RelayPeer(me))),
    "an unknown status": lambda h, me, at: encode_fields([(1, 2), (5, 999)]),
    "an answer over 4 KiB": lambda h, me, at: _rsvp(h, me) + encode_fields([(9, b"x" * v2.MAX_MESSAGE)]),
    "garbage": lambda h, me, at: b"\xff" * 32,
    # go-libp2p refuses a reservation that expired already (client/reservation.go)
    "an expiry in the past (0)": lambda h, me, at: _rsvp(h, me, expire=0),
}


@pytest.mark.parametrize("case", list(_REFUSED))
def test_a_bad_reservation_answer_is_refused_and_nothing_is_advertised(case: str) -> None:
    with Hostile() as h, lattica.Node([TCP], mdns=False, membership=False, mesh=MeshKey.generate()) as a:
        a.connect(h.addr)
        h.answer = lambda req, peer: _REFUSED[case](h.kp, peer, h.addr)
        got = _try_reserve(a, h.peer_id)
        assert h.asked == 1
        assert isinstance(got, LatticaError), got
        assert not a.nat_status().relays
        assert not [m for m in a._host.advertised_addrs() if m.is_circuit]
        assert "relay-client" not in on_loop(a, lambda: set(a._host.protected.get(h.peer_id, ())))
        assert a.ping(h.peer_id) > 0


def test_a_relay_that_never_answers_the_reservation_is_given_up(monkeypatch: pytest.MonkeyPatch) -> None:
    from lattica.nat import _manager

    monkeypatch.setattr(_manager, "_RESERVE_TIMEOUT", 1.0)
    with Hostile() as h, lattica.Node([TCP], mdns=False, membership=False, mesh=MeshKey.generate()) as a:
        a.connect(h.addr)
        t0 = time.monotonic()
        got = _try_reserve(a, h.peer_id)
        assert isinstance(got, LatticaError) and time.monotonic() - t0 < 5, got
        assert not a.nat_status().relays
        assert a.ping(h.peer_id) > 0


def _third_hosts(h: KeyPair, me: PeerId, at: Multiaddr) -> bytes:
    port = at.host_port()[1]
    return _rsvp(
        h,
        me,
        addrs=(
            Multiaddr(f"/ip4/192.0.2.7/tcp/{port}"),
            Multiaddr(f"/ip4/127.0.0.2/tcp/{port}/p2p/{h.peer_id}"),
            Multiaddr(f"/ip6/::1/tcp/{port}"),
            Multiaddr(f"/ip4/127.0.0.1/tcp/{port}/p2p/{KeyPair.generate().peer_id}/p2p-circuit"),
        ),
    )


_ACCEPTED: dict[str, tuple[_Make, int]] = {  # (answer, at most how many circuit addresses advertised)
    "honest": (lambda h, me, at: _rsvp(h, me, addrs=(at,)), 1),
    "no voucher (optional in the spec; go-libp2p takes it too)": (lambda h, me, at: _rsvp(h, me, voucher=b""), 1),
    "addresses at third hosts only": (_third_hosts, 1),
    "a hundred addresses": (
        lambda h, me, at: _rsvp(h, me, addrs=tuple(Multiaddr(f"/ip4/127.0.0.1/tcp/{20000 + i}") for i in range(100))),
        8,
    ),
    "a huge limit": (lambda h, me, at: _rsvp(h, me, addrs=(at,), limit=v2.Limit(2**64 - 1, 2**64 - 1)), 1),
}


@pytest.mark.parametrize("case", list(_ACCEPTED))
def test_a_reservation_advertises_only_the_relays_own_address(case: str) -> None:
    """What a relay's reservation makes us advertise: its circuit at the IP we reach it at (here
    127.0.0.1), at most 8 of them, never a third host's address nor a circuit in a circuit."""
    make, most = _ACCEPTED[case]
    with Hostile() as h, lattica.Node([TCP], mdns=False, membership=False, mesh=MeshKey.generate()) as a:
        a.connect(h.addr)
        h.answer = lambda req, peer: make(h.kp, peer, h.addr)
        got = _try_reserve(a, h.peer_id)
        assert isinstance(got, list), got
        advertised = [m for m in a._host.advertised_addrs() if m.is_circuit]
        assert 1 <= len(advertised) <= most and sorted(map(str, got)) == sorted(map(str, advertised))
        for m in advertised:
            relays, relay, target = circuit.split_circuit(m)
            assert relay == h.peer_id and target is None
            assert [r.host_port()[0] for r in relays] == ["127.0.0.1"], m
        assert a.ping(h.peer_id) > 0


def test_an_absurd_expiry_does_not_put_the_renewal_off_forever() -> None:
    with Hostile() as h, lattica.Node([TCP], mdns=False, membership=False, mesh=MeshKey.generate()) as a:
        a.connect(h.addr)
        h.answer = lambda req, peer: _rsvp(h.kp, peer, expire=2**63, addrs=(h.addr,))
        got = _try_reserve(a, h.peer_id)
        if isinstance(got, LatticaError):
            return  # (refusing it is as good)
        nat = a._host.nat
        assert nat is not None
        due = on_loop(a, lambda: nat.relays[h.peer_id].renew.when() - a._host.loop.time())
        assert due <= RelayConfig().reservation_ttl, due


async def _upgrade_as(stream: Stream, kp: KeyPair, expected: PeerId) -> Up | LatticaError | TimeoutError:
    """libp2p's upgrade, as the circuit's dialer, with ``kp``: Up, or why it failed."""
    up = Libp2pUpgrade(kp, True, expected)
    up.start()
    try:
        async with asyncio.timeout(5):
            while True:
                out = up.data_to_send()
                if out:
                    stream.write(out)
                event = up.next_event()
                if isinstance(event, Up):
                    out = up.data_to_send()
                    if out:
                        stream.write(out)
                    return event
                data = await stream.read(65536)
                if not data:
                    return LatticaError("the stream ended")
                up.receive_data(data)
    except (TimeoutError, LatticaError) as e:
        return e


def _relayed(node: lattica.Node) -> list[Connection]:
    return on_loop(node, lambda: [c for c in node._host.all_conns if c.transport == "relay" and not c.is_closed])


def _no_errors(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [f"{r.name}: {r.getMessage()}" for r in caplog.records if r.levelno >= logging.ERROR]


def test_stop_streams_from_a_relay_we_hold_no_reservation_with_are_refused() -> None:
    with Hostile() as h, lattica.Node([TCP], mdns=False, membership=False, mesh=MeshKey.generate()) as a:
        a.connect(h.addr)
        x = KeyPair.generate()

        async def stop(protocol: str) -> tuple[bytes | None, object]:
            conn = h.node._host.conns[a.peer_id]
            stream = await h.node._host.open_stream_on(conn, protocol)
            if protocol == v2.STOP:
                write_delimited(stream, v2.encode_stop(v2.StopMessage(v2.StopType.CONNECT, v2.RelayPeer(x.peer_id))))
            else:
                write_delimited(stream, b"\x00")  # (ours is refused before its first message is read)
            try:
                answer: bytes | None = await read_delimited(stream, v2.MAX_MESSAGE)
            except LatticaError:
                answer = None
            return answer, await _upgrade_as(stream, x, a.peer_id)

        for protocol in (v2.STOP, circuit.STOP):
            answer, upgraded = h.node.run(stop(protocol), timeout=15)
            assert answer is None and not isinstance(upgraded, Up), (protocol, answer, upgraded)
        assert not _relayed(a)
        assert a.ping(h.peer_id) > 0


def test_a_stop_circuit_that_breaks_its_upgrade_is_dropped_and_the_node_serves_on(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A relay we hold a reservation with brings circuits that are not what they say: a STOP that
    is no CONNECT (answered UNEXPECTED_MESSAGE), garbage, a CONNECT naming X and then garbage, a
    Noise handshake by another key than X's (or naming us), silence. Each fails on its own (no
    connection, no crash), and a genuine circuit from X still comes through after them."""
    caplog.set_level(logging.INFO)
    with Hostile() as h, lattica.Node([TCP], mdns=False, membership=False, mesh=MeshKey.generate()) as a:
        a.connect(h.addr)
        h.answer = lambda req, peer: _rsvp(h.kp, peer, addrs=(h.addr,))
        assert isinstance(_try_reserve(a, h.peer_id), list)
        on_loop(a, lambda: setattr(a._host.circuit, "handshake_timeout", 1.5))
        x, imposter = KeyPair.generate(), KeyPair.generate()

        def connect(peer: PeerId | None, limit: v2.Limit | None = None) -> bytes:
            return v2.encode_stop(
                v2.StopMessage(v2.StopType.CONNECT, None if peer is None else v2.RelayPeer(peer), limit)
            )

        async def stop(first: bytes, then: Callable[[Stream], Coroutine[Any, Any, Any]] | None) -> tuple[Any, Any]:
            conn = h.node._host.conns[a.peer_id]
            stream = await h.node._host.open_stream_on(conn, v2.STOP)
            stream.write(first)
            try:
                answer: Any = v2.decode_stop(await read_delimited(stream, v2.MAX_MESSAGE))
            except LatticaError as e:
                answer = e
            after = None if then is None else await then(stream)
            return answer, after

        async def garbage(stream: Stream) -> Any:
            stream.write(b"\x13/multistream/1.0.0\n\x07/noise\n" + b"\xff" * 300)
            return await _upgrade_as(stream, x, a.peer_id)

        async def impersonate(stream: Stream) -> Any:
            """Another key's handshake (it completes on our side: the last message is ours),
            then whether the node reset the stream."""
            up = await _upgrade_as(stream, imposter, a.peer_id)
            if not isinstance(up, Up):
                return up
            try:
                async with asyncio.timeout(5):
                    while await stream.read():
                        pass
            except LatticaError:
                return "reset"
            return "ended"

        async def silence(stream: Stream) -> Any:
            t0 = time.monotonic()
            try:
                while await stream.read():
                    pass
            except LatticaError:
                pass
            return time.monotonic() - t0

        unexpected = v2.StopMessage(v2.StopType.STATUS, status=S.UNEXPECTED_MESSAGE)
        cases: list[tuple[str, bytes, Any, Callable[[Any, Any], bool]]] = [
            (
                "STATUS as a request",
                uvarint(2) + encode_fields([(1, 1)]),
                None,
                lambda ans, aft: ans == unexpected,
            ),
            ("CONNECT without a peer", uvarint(2) + connect(None), None, lambda ans, aft: ans == unexpected),
            ("garbage", uvarint(8) + b"\xff" * 8, None, lambda ans, aft: isinstance(ans, LatticaError)),
            ("over 4 KiB", uvarint(1 << 20) + b"\x08\x00", None, lambda ans, aft: isinstance(ans, LatticaError)),
            (
                "CONNECT naming X, then garbage",
                uvarint(len(connect(x.peer_id))) + connect(x.peer_id),
                garbage,
                lambda ans, aft: ans.status == S.OK and not isinstance(aft, Up),
            ),
            (
                "CONNECT naming X, then another key's handshake",
                uvarint(len(connect(x.peer_id))) + connect(x.peer_id),
                impersonate,
                lambda ans, aft: ans.status == S.OK and aft in ("reset", "ended"),
            ),
            (
                "CONNECT naming us, then another key's handshake",
                uvarint(len(connect(a.peer_id))) + connect(a.peer_id),
                impersonate,
                lambda ans, aft: ans.status == S.OK and aft in ("reset", "ended"),
            ),
            (
                "CONNECT naming X, then silence",
                uvarint(len(connect(x.peer_id))) + connect(x.peer_id),
                silence,
                lambda ans, aft: ans.status == S.OK and 1.0 < aft < 5.0,
            ),
        ]
        for name, first, then, ok in cases:
            answer, after = h.node.run(stop(first, then), timeout=15)
            assert ok(answer, after), (name, answer, after)
            assert not _relayed(a), name
        assert wait_for(lambda: on_loop(a, lambda: not a._host.circuit._readers), timeout=5)
        assert a.ping(h.peer_id) > 0

        genuine = connect(x.peer_id, v2.Limit(60, 1 << 20))
        answer, up = h.node.run(stop(uvarint(len(genuine)) + genuine, lambda s: _upgrade_as(s, x, a.peer_id)), 15)
        assert answer.status == S.OK and isinstance(up, Up), (answer, up)
        assert wait_for(lambda: [c.remote_peer for c in _relayed(a)] == [x.peer_id], timeout=5)
        assert _relayed(a)[0].relay_limit == (60, 1 << 20)
        assert not _no_errors(caplog), _no_errors(caplog)


def test_a_hostile_relays_connect_answers_fail_the_dial_cleanly(caplog: pytest.LogCaptureFixture) -> None:
    """Dialing X through a libp2p relay that refuses, answers with the wrong message, or says OK
    and then sends garbage, another key's handshake or nothing: each dial fails with a
    LatticaError within the handshake timeout, leaves no connection to X, and the node serves on."""
    caplog.set_level(logging.INFO)
    with Hostile() as h, lattica.Node([TCP], mdns=False, membership=False, mesh=MeshKey.generate()) as b:
        on_loop(b, lambda: setattr(b._host.circuit, "handshake_timeout", 1.5))
        x, imposter = KeyPair.generate(), KeyPair.generate()
        ok = v2.encode_hop(v2.HopMessage(v2.HopType.STATUS, status=S.OK))

        async def garbage(stream: Stream) -> None:
            stream.write(b"\xff" * 300)

        async def as_imposter(stream: Stream) -> None:
            await _upgrade_as(stream, imposter, b.peer_id)

        async def silence(stream: Stream) -> None:
            await asyncio.sleep(5)

        cases: list[tuple[str, bytes, Callable[[Stream], Coroutine[Any, Any, None]] | None]] = [
            ("NO_RESERVATION", v2.encode_hop(v2.HopMessage(v2.HopType.STATUS, status=S.NO_RESERVATION)), None),
            ("a RESERVE for an answer", v2.encode_hop(v2.HopMessage(v2.HopType.RESERVE)), None),
            ("an unknown status", encode_fields([(1, 2), (5, 12345)]), None),
            ("OK, then garbage", ok, garbage),
            ("OK, then another key's handshake", ok, as_imposter),
            ("OK, then nothing", ok, silence),
        ]
        target = f"{h.addr}/p2p-circuit/p2p/{x.peer_id}"
        for name, answer, after in cases:
            h.answer = lambda req, peer, answer=answer: answer
            h.after = after
            t0 = time.monotonic()
            with pytest.raises(LatticaError):
                b.connect(target, timeout=10)
            assert time.monotonic() - t0 < 5, name
            assert x.peer_id not in on_loop(b, lambda: {c.remote_peer for c in b._host.all_conns}), name
        assert h.asked == len(cases)
        assert wait_for(lambda: on_loop(b, lambda: not b._host.circuit._readers and not b._host.dialer.dialing), 5)
        assert b.ping(h.peer_id) > 0
        assert not _no_errors(caplog), _no_errors(caplog)


# -- 3. limited circuits ---------------------------------------------------------------------------------


def test_a_call_over_only_a_limited_circuit_fails_clearly_and_leaves_nothing_behind(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Our relay made a libp2p relay (it serves only circuit relay v2, with a limit on every
    circuit), two private nodes without listeners: the circuit is their only path. Ping goes
    over it; a call fails with PeerUnreachable naming the limited circuit; afterwards the
    caller holds no more tasks, dials or connections than before, and the relay's circuit ends
    when the caller hangs up."""
    monkeypatch.setattr(dialer, "LIMITED_WAIT", 2.0)
    mesh = MeshKey.generate()
    cfg = RelayConfig(circuit_duration=60, circuit_bytes=1 << 20)
    with _relay(cfg, mesh=mesh) as relay:
        on_loop(relay, lambda: relay._host.handlers.pop(circuit.HOP))  # (a libp2p relay: v2's hop only)
        with _private(relay, mesh) as a, lattica.Node([], mesh=mesh, mdns=False, membership=False) as b:
            addr = _circuit_of(a)
            assert on_loop(relay, lambda: _book(relay).reservations[a.peer_id].libp2p)
            b.connect(addr, timeout=10)
            [conn] = _relayed(b)
            assert conn.libp2p and conn.relay_limit == (60, 1 << 20)
            assert b.ping(a.peer_id) > 0

            def state() -> tuple[int, int, int, int]:
                host = b._host
                return (
                    len(host.tasks),
                    len(host.circuit._readers),
                    len([c for c in host.all_conns if not c.is_closed]),
                    len(host.dialer.dialing),
                )

            time.sleep(0.5)
            before = on_loop(b, state)
            for _ in range(2):
                t0 = time.monotonic()
                with pytest.raises(PeerUnreachable, match="limited circuit"):
                    _names(b, a.peer_id)
                assert time.monotonic() - t0 < 8
            assert b.ping(a.peer_id) > 0
            assert _relayed(b) == [conn]
            assert wait_for(lambda: on_loop(b, state) <= before, timeout=5), (on_loop(b, state), before)
            assert on_loop(relay, lambda: _book(relay).total_circuits) == 1
            b.disconnect(a.peer_id)
            assert wait_for(lambda: on_loop(relay, lambda: _book(relay).total_circuits) == 0, timeout=10)
            assert wait_for(lambda: not [c for c in _relayed(a) if c.remote_peer == b.peer_id], timeout=10)


def test_a_call_takes_an_unlimited_circuit_when_the_first_path_was_a_limited_one(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A holds reservations on a libp2p relay that limits circuits and on a Lattica relay that
    does not, and advertises both circuits; B reached it first through the limited one. The call
    must go through the unlimited circuit ("a call must never fail only because the path is
    relayed"), not fail waiting for a direct path that cannot come."""
    monkeypatch.setattr(dialer, "LIMITED_WAIT", 3.0)
    mesh = MeshKey.generate()
    with (
        _relay(RelayConfig(circuit_duration=60, circuit_bytes=1 << 20), mesh=mesh) as limited,
        _relay(mesh=mesh) as unlimited,
    ):
        on_loop(limited, lambda: limited._host.handlers.pop(circuit.HOP))
        with (
            lattica.Node(
                [],
                relays=[str(limited.addrs[0]), str(unlimited.addrs[0])],
                nat=NatConfig(reachability="private"),
                mdns=False,
                membership=False,
                mesh=mesh,
            ) as a,
            lattica.Node([], mesh=mesh, mdns=False, membership=False) as b,
        ):
            assert wait_for(lambda: len(a.nat_status().relays) == 2, timeout=10)
            via_limited = next(r for r in a.nat_status().relays if str(limited.peer_id) in r)
            b.connect(f"{via_limited}/p2p/{a.peer_id}", timeout=10)
            assert [c.relay_limit for c in _relayed(b)] == [(60, 1 << 20)]
            assert any(str(unlimited.peer_id) in str(m) for m in b._host.peer_addrs.get(a.peer_id, ()))
            assert isinstance(_names(b, a.peer_id), list)


def test_a_relay_bringing_circuits_from_many_fresh_identities_stays_within_the_connection_limit() -> None:
    """A relay we hold a reservation with brings 40 circuits, each a genuine libp2p upgrade by a
    fresh identity that then says nothing (no identify answer): the node holds at most its
    connection limit, never evicts its member, drops the silent ones at the identify timeout,
    and keeps no reader of them."""
    mesh = MeshKey.generate()
    limit, n = 16, 40
    with (
        Hostile() as h,
        lattica.Node([TCP], mdns=False, membership=False, mesh=mesh, max_connections=limit, identify_timeout=2.0) as a,
        lattica.Node([TCP], mdns=False, membership=False, mesh=mesh) as member,
    ):
        member.connect(a.addrs[0])
        ours = member._host.conns[a.peer_id]
        a.connect(h.addr)
        h.answer = lambda req, peer: _rsvp(h.kp, peer, addrs=(h.addr,))
        assert isinstance(_try_reserve(a, h.peer_id), list)
        most = [0]
        sampling = [True]

        def sample() -> None:
            while sampling[0]:
                most[0] = max(most[0], on_loop(a, lambda: len(a._host.all_conns)))
                time.sleep(0.02)

        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()

        async def bring() -> int:
            conn = h.node._host.conns[a.peer_id]

            async def one() -> bool:
                x = KeyPair.generate()
                stream = await h.node._host.open_stream_on(conn, v2.STOP)
                write_delimited(stream, v2.encode_stop(v2.StopMessage(v2.StopType.CONNECT, v2.RelayPeer(x.peer_id))))
                try:
                    await read_delimited(stream, v2.MAX_MESSAGE)
                except LatticaError:
                    return False
                return isinstance(await _upgrade_as(stream, x, a.peer_id), Up)

            return sum(await asyncio.gather(*(one() for _ in range(n))))

        try:
            upgraded = h.node.run(bring(), timeout=20)
            assert upgraded > limit  # (the attack is real: more came than the node takes)
            assert member.ping(a.peer_id) > 0
            assert isinstance(_names(member, a.peer_id), list)
            assert wait_for(lambda: not _relayed(a), timeout=10)
        finally:
            sampling[0] = False
            sampler.join(5)
        assert most[0] <= limit, most[0]
        assert member._host.conns[a.peer_id] is ours and not ours.is_closed
        assert h.peer_id in on_loop(a, lambda: {c.remote_peer for c in a._host.all_conns})
        assert wait_for(lambda: on_loop(a, lambda: not a._host.circuit._readers), timeout=5)
