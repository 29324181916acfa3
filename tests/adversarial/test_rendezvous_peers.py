"""Bad input on libp2p rendezvous (issue 50), over real connections on 127.0.0.1: strangers (other
identities, outside the point's mesh) write what they like on ``/rendezvous/1.0.0``. Malformed
protobuf, records signed by someone else or forged, TTLs out of range, a thousand registrations
from one peer, many identities from one address, forged cookies, a discovery asking for 10^9,
oversized and stalled requests, floods: each is refused or bounded, and the point serves an
honest client on. And the other way round: a lying rendezvous point cannot make a client believe
an address a peer did not sign, nor make it read more than an answer's cap."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import pytest

import lattica
import lattica.bench
from lattica import _envelope as envelope
from lattica._framing import read_delimited, write_delimited
from lattica._identity import KeyPair
from lattica._multiaddr import Multiaddr
from lattica._protobuf import encode_fields, uvarint
from lattica.actors import rendezvous as service
from lattica.config import RendezvousConfig
from lattica.errors import LatticaError, ProtocolError
from lattica.rendezvous import _wire as w
from lattica.trust import MeshKey

pytestmark = pytest.mark.timeout(120)

TCP = "/ip4/127.0.0.1/tcp/0"
LIGHT = {"membership": False, "pubsub": False, "crdt": False, "content": False}
S = w.Status


def _node(**kw) -> lattica.Node:
    return lattica.Node([TCP], mesh=MeshKey.generate(), **{**LIGHT, **kw})


def _victim(**cfg) -> lattica.Node:
    return _node(rendezvous=RendezvousConfig(serve=True, **{"min_ttl": 60, "max_ttl": 3600, **cfg}))


@pytest.fixture
def victim() -> Iterator[lattica.Node]:
    with _victim() as node:
        yield node


@pytest.fixture
def stranger(victim: lattica.Node) -> Iterator[lattica.Node]:
    with _node() as node:
        node.connect(victim.addrs[0])
        assert lattica.bench.host_of(victim).circle_of(node.peer_id) == "stranger"
        yield node


def _book(node: lattica.Node):
    return node.host.services.rendezvous.book


async def _ask(caller: lattica.Node, target: lattica.Node, raw: bytes, framed: bool = True) -> w.Message | None:
    """Write ``raw`` (behind its length, if ``framed``) on a fresh stream, half-close; the answer,
    or None if the stream was reset or ended without one."""
    stream = await caller.aopen_stream(target.peer_id, w.PROTOCOL)
    if framed:
        write_delimited(stream, raw)
    else:
        stream.write(raw)
    await stream.close()
    try:
        data = await asyncio.wait_for(read_delimited(stream, w.MAX_MESSAGE), 10)
    except LatticaError:
        return None
    return w.decode(data)


def _status(caller: lattica.Node, target: lattica.Node, msg: w.Message | bytes) -> int | None:
    raw = msg if isinstance(msg, bytes) else w.encode(msg)
    answer = caller.run(_ask(caller, target, raw))
    return None if answer is None else getattr(answer, "status", None)


def _register(node: lattica.Node, ns: str = "app", ttl: int | None = 600, record: bytes | None = None) -> w.Register:
    if record is None:
        record = envelope.seal_peer_record(node.keypair, 1, [node.addrs[0].without_peer_id()])
    return w.Register(ns, record, ttl)


def _honest_client_is_served(point: lattica.Node) -> None:
    with _node() as honest:
        where = f"{point.addrs[0].without_peer_id()}/p2p/{point.peer_id}"
        assert lattica.rendezvous.register(where, "honest", 600, node=honest).result(10) == 600
        found, _ = lattica.rendezvous.discover(where, "honest", node=honest).result(10)
        assert [r.peer for r in found] == [honest.peer_id]


# -- malformed ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "raw, framed",
    [
        (b"\xff\xff\xff", True),  # not protobuf
        (bytes.fromhex("0809"), True),  # no such message type
        (bytes.fromhex("0802" + "2201" + "0a"), True),  # an UNREGISTER cut short
        (w.encode(w.RegisterResponse(S.OK, "", 60)), True),  # an answer where a request is due
        (w.encode(w.DiscoverResponse()), True),
        (b"\xff\xff\xff\xff\xff\xff", False),  # a length that is no varint
        (uvarint(5) + b"ab", False),  # a message shorter than its length
    ],
    ids=["junk", "bad-type", "cut", "register-response", "discover-response", "bad-length", "short"],
)
def test_malformed_requests_lose_their_stream_and_the_point_serves_on(victim, stranger, raw, framed):
    assert stranger.run(_ask(stranger, victim, raw, framed)) is None
    assert len(_book(victim)) == 0
    _honest_client_is_served(victim)


def test_a_register_that_cannot_be_read_is_answered_with_the_status_that_says_why(victim, stranger):
    bad_ns = encode_fields([(1, 0), (2, encode_fields([(1, b"\xff\xfe"), (2, b"r")]))])
    assert _status(stranger, victim, bad_ns) == S.E_INVALID_NAMESPACE
    ttl_as_bytes = encode_fields([(1, 0), (2, encode_fields([(1, b"app"), (2, b"r"), (3, b"x")]))])
    assert _status(stranger, victim, ttl_as_bytes) == S.E_INVALID_TTL
    cookie_as_number = encode_fields([(1, 3), (5, encode_fields([(1, b"app"), (3, 7)]))])
    assert _status(stranger, victim, cookie_as_number) == S.E_INVALID_COOKIE
    for ns in ("", "x" * 256):
        assert _status(stranger, victim, _register(stranger, ns)) == S.E_INVALID_NAMESPACE
    # an empty message: proto2 reads a REGISTER (the absent type's first value) of nothing
    assert _status(stranger, victim, b"") == S.E_INVALID_NAMESPACE
    assert len(_book(victim)) == 0


# -- whose record --------------------------------------------------------------------------------------


def test_a_record_signed_by_someone_else_or_forged_is_refused(victim, stranger):
    other = KeyPair.generate()
    addrs = [Multiaddr("/ip4/198.51.100.9/tcp/4001")]
    theirs = envelope.seal_peer_record(other, 1, addrs)  # valid, but another peer's
    assert _status(stranger, victim, _register(stranger, record=theirs)) == S.E_NOT_AUTHORIZED
    # a record naming the stranger, signed by another key
    payload = envelope.encode_peer_record(stranger.peer_id, 1, addrs)
    stolen = envelope.seal(other, envelope.PEER_RECORD_DOMAIN, envelope.PEER_RECORD_TYPE, payload)
    ours = _register(stranger).record
    forged = ours[:-1] + bytes([ours[-1] ^ 1])
    voucher = envelope.seal(stranger.keypair, "libp2p-relay-rsvp", b"\x03\x02", payload)  # another domain
    for record in (stolen, forged, b"", b"\x0a\x01", voucher, ours + bytes(5000)):
        assert _status(stranger, victim, _register(stranger, record=record)) == S.E_INVALID_SIGNED_PEER_RECORD
    assert len(_book(victim)) == 0
    assert _status(stranger, victim, _register(stranger)) == S.OK  # (its own record, as it should)


def test_ttls_out_of_range_are_refused(victim, stranger):
    for ttl in (0, 59, 3601, 10**12):
        assert _status(stranger, victim, _register(stranger, ttl=ttl)) == S.E_INVALID_TTL, ttl
    # the spec's int64 -1: ten bytes of varint
    record = _register(stranger).record
    minus_one = encode_fields(
        [(1, 0), (2, encode_fields([(1, b"app"), (2, record)]) + b"\x18" + b"\xff" * 9 + b"\x01")]
    )
    assert _status(stranger, victim, minus_one) == S.E_INVALID_TTL
    assert _status(stranger, victim, _register(stranger, ttl=None)) == S.E_INVALID_TTL  # (2 h: over this point's 1 h)
    assert len(_book(victim)) == 0


# -- how many --------------------------------------------------------------------------------------------


def test_a_thousand_registrations_from_one_peer_hold_its_share_and_no_more():
    many = {"request_rate": 10_000.0, "request_burst": 10_000.0, "stranger_rate": 10_000.0, "stranger_burst": 10_000.0}
    with _victim(**many) as victim, _node() as stranger:
        stranger.connect(victim.addrs[0])
        record = _register(stranger).record

        async def flood() -> list[int | None]:
            out = []
            for i in range(1000):
                answer = await _ask(stranger, victim, w.encode(w.Register(f"ns{i}", record, 600)))
                out.append(getattr(answer, "status", None))
            return out

        answers = stranger.run(flood(), timeout=100)
        assert answers.count(S.OK) == 32 and answers.count(S.E_UNAVAILABLE) == 1000 - 32
        assert _book(victim).of_peer(stranger.peer_id) == 32 == len(_book(victim))
        _honest_client_is_served(victim)


def test_many_identities_from_one_address_hold_that_addresss_share():
    with _victim(max_per_address=3) as victim:
        nodes = [_node().start() for _ in range(6)]
        try:
            answers = []
            for node in nodes:
                node.connect(victim.addrs[0])
                answers.append(_status(node, victim, _register(node)))
            assert answers == [S.OK] * 3 + [S.E_UNAVAILABLE] * 3
            assert len(_book(victim)) == 3
        finally:
            for node in nodes:
                node.stop()


def test_requests_beyond_a_peers_rate_are_answered_unavailable_and_others_are_served(victim, stranger):
    async def flood() -> list[int | None]:
        asks = [_ask(stranger, victim, w.encode(w.Discover("app"))) for _ in range(60)]
        return [getattr(a, "status", None) for a in await asyncio.gather(*asks)]

    answers = stranger.run(flood(), timeout=60)
    # a burst of 20 a peer (the answers beyond are E_UNAVAILABLE; a few streams over the 8 a
    # peer may have open at once are reset unread)
    assert answers.count(S.OK) <= 22 and answers.count(S.E_UNAVAILABLE) >= 20
    assert set(answers) <= {S.OK, S.E_UNAVAILABLE, None}
    _honest_client_is_served(victim)


def test_requests_in_a_row_on_one_stream_share_the_peers_rate(victim, stranger):
    """A point serves a stream's requests in turn (js's client sends several); they draw on the
    same budget as requests on streams of their own."""

    async def flood() -> list[int | None]:
        stream = await stranger.aopen_stream(victim.peer_id, w.PROTOCOL)
        out = []
        for _ in range(60):
            write_delimited(stream, w.encode(w.Discover("app")))
            answer = w.decode(await asyncio.wait_for(read_delimited(stream, w.MAX_MESSAGE), 10))
            out.append(getattr(answer, "status", None))
        await stream.close()
        assert await asyncio.wait_for(stream.read(), 10) == b""  # (then the point closes its side)
        return out

    answers = stranger.run(flood(), timeout=60)
    assert 20 <= answers.count(S.OK) <= 22 and answers.count(S.E_UNAVAILABLE) == 60 - answers.count(S.OK)
    _honest_client_is_served(victim)


# -- cookies and discovery -----------------------------------------------------------------------------


def test_forged_cookies_are_refused(victim, stranger):
    assert _status(stranger, victim, _register(stranger)) == S.OK
    answer = stranger.run(_ask(stranger, victim, w.encode(w.Discover("app"))))
    assert isinstance(answer, w.DiscoverResponse) and answer.cookie
    cookie = answer.cookie
    other = stranger.run(_ask(stranger, victim, w.encode(w.Discover("other")))).cookie
    for bad in (
        b"",
        cookie[:7],
        bytes(8) + b"app",
        cookie[:5] + b"\x00\x00\x00" + b"app",
        (2**40 - 1).to_bytes(5, "big") + cookie[5:],
        other,
        cookie + b"-and-more",
        bytes(range(256)) * 4,
    ):
        assert _status(stranger, victim, w.Discover("app", None, bad)) == S.E_INVALID_COOKIE, bad
    assert _status(stranger, victim, w.Discover("app", None, cookie)) == S.OK
    _honest_client_is_served(victim)


def test_a_discovery_asking_for_a_billion_gets_what_one_answer_holds():
    with _victim(max_discover=10) as victim, _node() as stranger:
        stranger.connect(victim.addrs[0])
        book = _book(victim)
        addrs = [Multiaddr(f"/dns4/{'a' * 50}{i}.example/tcp/4001") for i in range(50)]

        async def fill() -> None:  # (members' registrations: no bound per address)
            now = asyncio.get_running_loop().time()
            for _ in range(40):
                keys = KeyPair.generate()
                held = book.register(
                    keys.peer_id, w.Register("app", envelope.seal_peer_record(keys, 1, addrs), 600), now
                )
                assert held[0] == S.OK

        victim.run(fill())
        for limit in (10**9, 2**64 - 1, 0):
            answer = stranger.run(_ask(stranger, victim, w.encode(w.Discover("app", limit))))
            assert isinstance(answer, w.DiscoverResponse) and answer.status == S.OK
            assert len(answer.registrations) == 10 and len(w.encode(answer)) <= w.MAX_MESSAGE


# -- oversized and stalled ------------------------------------------------------------------------------


def test_an_oversized_request_is_reset_unread(victim, stranger):
    big = _register(stranger, record=bytes(w.MAX_REQUEST + 1))
    assert stranger.run(_ask(stranger, victim, w.encode(big))) is None
    assert len(_book(victim)) == 0
    _honest_client_is_served(victim)


def test_stalled_streams_are_reset_and_a_peer_has_few_at_once(victim, stranger, monkeypatch):
    monkeypatch.setattr(service, "READ_TIMEOUT", 1.0)

    async def stall() -> list[bool]:
        streams = [await stranger.aopen_stream(victim.peer_id, w.PROTOCOL) for _ in range(12)]
        for s in streams:
            s.write(b"\x05")  # (a length, and nothing after it)
        await asyncio.sleep(0.3)
        early = [s.aborted for s in streams]
        await asyncio.sleep(1.5)
        assert all(s.aborted for s in streams) or all(await _ended(s) for s in streams)
        return early

    early = stranger.run(stall(), timeout=30)
    assert early.count(True) == 12 - service.STREAMS_PER_PEER  # (those beyond 8 at once: reset unread)
    assert victim.host.services.rendezvous.served["reset"] == 12
    _honest_client_is_served(victim)


async def _ended(stream) -> bool:
    try:
        return await asyncio.wait_for(stream.read(), 1) == b""
    except LatticaError:
        return True


# -- a lying rendezvous point ------------------------------------------------------------------------------


def test_a_lying_point_cannot_plant_addresses_nor_flood_its_client():
    honest, liar_keys = KeyPair.generate(), KeyPair.generate()
    planted = Multiaddr("/ip4/203.0.113.66/tcp/4001")
    good = envelope.seal_peer_record(honest, 1, [Multiaddr("/ip4/198.51.100.1/tcp/4001")])
    stolen = envelope.seal(
        liar_keys,
        envelope.PEER_RECORD_DOMAIN,
        envelope.PEER_RECORD_TYPE,
        envelope.encode_peer_record(honest.peer_id, 2, [planted]),
    )
    answers = {
        "lies": w.DiscoverResponse(
            (
                w.Register("app", stolen, 60),  # the honest peer's name, the liar's signature
                w.Register("app", good[:-1] + bytes([good[-1] ^ 1]), 60),  # tampered
                w.Register("not-asked", envelope.seal_peer_record(liar_keys, 1, [planted]), 60),
                w.Register("app", good, 60),
            ),
            b"c" * 8,
        ),
        "register": w.DiscoverResponse(),  # (the wrong kind of answer)
    }

    with _node() as liar, _node() as client:

        async def serve(stream, conn) -> None:
            data = await read_delimited(stream, w.MAX_REQUEST)
            msg = w.decode(data)
            if isinstance(msg, w.Discover) and msg.ns == "huge":
                stream.write(uvarint(w.MAX_MESSAGE + 1) + bytes(1024))  # (announces more than 1 MiB)
            else:
                write_delimited(stream, w.encode(answers["lies" if isinstance(msg, w.Discover) else "register"]))
            await stream.drain()
            await stream.close()

        async def install() -> None:
            liar.host.set_handler(w.PROTOCOL, serve)

        liar.run(install())
        where = f"{liar.addrs[0].without_peer_id()}/p2p/{liar.peer_id}"
        found, _ = lattica.rendezvous.discover(where, "app", node=client).result(10)
        assert [(r.peer, r.addrs) for r in found] == [(honest.peer_id, [Multiaddr("/ip4/198.51.100.1/tcp/4001")])]
        assert planted not in client.host.peer_addrs.get(honest.peer_id, [])
        assert client.host.peer_addrs.get(liar_keys.peer_id) is None
        with pytest.raises(LatticaError):
            lattica.rendezvous.discover(where, "huge", node=client).result(10)
        with pytest.raises(ProtocolError, match="answered a REGISTER"):
            lattica.rendezvous.register(where, "app", node=client).result(10)
