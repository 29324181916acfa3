"""libp2p rendezvous between real nodes on 127.0.0.1 (issue 50): a rendezvous point and clients on
libp2p's stack (multistream-select, /noise, yamux), as a libp2p peer reaches us. A client
registers, another discovers it, learns its addresses from its signed record and dials it;
cookies page and then give only what is new; unregistering and TTLs end registrations;
registrations are renewed; a point serves several requests on one stream, as js's client sends
them. These are ours against ours; tests/interop/test_rendezvous_interop.py runs js's
(@canvas-js/libp2p-rendezvous) client and point against ours, and the wire is checked byte by
byte against rust's codec and js's in tests/unit/test_rendezvous_wire.py."""

from __future__ import annotations

import time

import pytest

import lattica
from lattica._framing import read_delimited, write_delimited
from lattica.config import RendezvousConfig
from lattica.errors import NodeClosed, RendezvousError, UnsupportedProtocol
from lattica.rendezvous import _wire as w

pytestmark = pytest.mark.timeout(90)

TCP = "/ip4/127.0.0.1/tcp/0"
LIGHT = {"membership": False, "pubsub": False, "crdt": False, "content": False}


def _addr(node: lattica.Node) -> str:
    return f"{node.addrs[0].without_peer_id()}/p2p/{node.peer_id}"


def _connect_libp2p(caller: lattica.Node, target: lattica.Node) -> None:
    """Connect on libp2p's stack (as our TCP transport does once a libp2p listener answered it there)."""
    host, port = target.addrs[0].host_port()

    async def remember():
        caller._host.transport_set.named("tcp")._libp2p_at[(host, port)] = None

    caller.run(remember())
    caller.connect(_addr(target))
    assert caller._host.conns[target.peer_id].libp2p


def _point(**cfg) -> lattica.Node:
    return lattica.Node([TCP], rendezvous=RendezvousConfig(serve=True, **{"min_ttl": 1, **cfg}), **LIGHT)


def test_two_peers_meet_through_a_rendezvous_point_on_libp2ps_stack():
    with _point() as point, lattica.Node([TCP], **LIGHT) as a, lattica.Node([TCP], **LIGHT) as b:
        _connect_libp2p(a, point)
        _connect_libp2p(b, point)
        # the point says it serves the protocol; its clients do not
        assert w.PROTOCOL in next(p for p in a.peers() if p.peer_id == point.peer_id).protocols
        assert w.PROTOCOL not in next(p for p in point.peers() if p.peer_id == a.peer_id).protocols
        assert lattica.rendezvous.register(point.peer_id, "my-app", node=a).result(10) == w.DEFAULT_TTL
        assert b.host.peer_addrs.get(a.peer_id) is None  # (b has never heard of a)
        found, cookie = lattica.rendezvous.discover(point.peer_id, "my-app", node=b).result(10)
        assert [(r.peer, r.namespace, r.ttl) for r in found] == [(a.peer_id, "my-app", w.DEFAULT_TTL)]
        assert found[0].addrs == [x.without_peer_id() for x in a.addrs]
        assert cookie and cookie[8:] == b"my-app"
        # the addresses went into b's address book: b dials a by its PeerId alone
        assert b.ping(a.peer_id) > 0
        assert lattica.rendezvous.registered(node=a) == [(point.peer_id, "my-app")]


def test_cookies_page_and_then_give_only_what_is_new_and_unregistering_ends_a_registration():
    with (
        _point() as point,
        lattica.Node([TCP], **LIGHT) as a,
        lattica.Node([TCP], **LIGHT) as b,
        lattica.Node([TCP], **LIGHT) as c,
    ):
        where = _addr(point)  # (an address: each client dials the point itself)
        for node in (a, b):
            lattica.rendezvous.register(where, "app", node=node).result(10)
        lattica.rendezvous.register(where, "elsewhere", node=c).result(10)
        page1, cookie = lattica.rendezvous.discover(where, "app", limit=1, node=c).result(10)
        page2, cookie = lattica.rendezvous.discover(where, "app", limit=1, cookie=cookie, node=c).result(10)
        page3, cookie = lattica.rendezvous.discover(where, "app", cookie=cookie, node=c).result(10)
        assert [r.peer for r in page1 + page2] == [a.peer_id, b.peer_id] and page3 == []
        everything, _ = lattica.rendezvous.discover(where, node=c).result(10)
        assert {(r.peer, r.namespace) for r in everything} == {
            (a.peer_id, "app"),
            (b.peer_id, "app"),
            (c.peer_id, "elsewhere"),
        }
        # a cookie is for its namespace only
        with pytest.raises(RendezvousError) as e:
            lattica.rendezvous.discover(where, "elsewhere", cookie=cookie, node=c).result(10)
        assert e.value.status == w.Status.E_INVALID_COOKIE
        # re-registering (new addresses, a renewal) comes with the next discovery after the cookie
        lattica.rendezvous.register(where, "app", node=a).result(10)
        again, cookie = lattica.rendezvous.discover(where, "app", cookie=cookie, node=c).result(10)
        assert [r.peer for r in again] == [a.peer_id]
        lattica.rendezvous.unregister(where, "app", node=a).result(10)
        assert lattica.rendezvous.registered(node=a) == []
        left, _ = lattica.rendezvous.discover(where, "app", node=c).result(10)
        assert [r.peer for r in left] == [b.peer_id]


def test_a_registration_lasts_its_ttl_unless_renewed():
    with (
        _point() as point,
        lattica.Node([TCP], rendezvous=RendezvousConfig(refresh=False), **LIGHT) as once,
        lattica.Node([TCP], **LIGHT) as kept,
    ):
        where = _addr(point)
        assert lattica.rendezvous.register(where, "app", 2, node=once).result(10) == 2
        assert lattica.rendezvous.register(where, "app", 2, node=kept).result(10) == 2
        time.sleep(3.5)  # (the kept one is renewed at 1.5 s and 3 s)
        found, _ = lattica.rendezvous.discover(where, "app", node=once).result(10)
        assert [r.peer for r in found] == [kept.peer_id]
        assert point.host.services.rendezvous.stats()["registrations"] == 1


def test_refusals_arrive_as_errors_that_say_why():
    with (
        _point(min_ttl=60, max_ttl=120) as point,
        lattica.Node([TCP], **LIGHT) as plain,
        lattica.Node([TCP], **LIGHT) as client,
    ):
        where = _addr(point)
        with pytest.raises(RendezvousError, match="E_INVALID_TTL") as e:
            lattica.rendezvous.register(where, "app", 30, node=client).result(10)
        assert e.value.status == w.Status.E_INVALID_TTL
        assert lattica.rendezvous.registered(node=client) == []
        with pytest.raises(ValueError):
            lattica.rendezvous.register(where, "x" * 256, node=client).result(10)
        with pytest.raises(ValueError):
            lattica.rendezvous.discover(where, "app", limit=0, node=client).result(10)
        # a node that is no rendezvous point does not serve the protocol
        with pytest.raises(UnsupportedProtocol):
            lattica.rendezvous.discover(_addr(plain), "app", node=client).result(10)
    with lattica.Node([TCP], rendezvous=False, **LIGHT) as off:
        with pytest.raises(NodeClosed, match="without rendezvous"):
            lattica.rendezvous.discover(off.peer_id, "app", node=off)


def test_a_point_serves_a_streams_requests_in_turn_until_the_client_closes_it():
    """js's client (@canvas-js/libp2p-rendezvous) sends a REGISTER and then a DISCOVER on one
    stream, as go's and js's points allow; ours and rust's send one a stream and half-close."""
    with _point() as point, lattica.Node([TCP], **LIGHT) as a:
        _connect_libp2p(a, point)
        record = a.host.services.rendezvous._record(a._host.conns[point.peer_id])

        async def in_turn() -> list[w.Message | None]:
            stream = await a.aopen_stream(point.peer_id, w.PROTOCOL)
            out: list[w.Message | None] = []

            async def ask(msg: w.Message, reply: bool = True) -> None:
                write_delimited(stream, w.encode(msg))
                if reply:
                    out.append(w.decode(await read_delimited(stream, w.MAX_MESSAGE)))

            await ask(w.Register("app", record, 3600))
            await ask(w.Discover("app"))
            await ask(w.Unregister("app"), reply=False)  # (no answer due)
            await ask(w.Discover("app"))
            await stream.close()
            assert await stream.read() == b""  # the point closes its side once we closed ours
            return out

        registered, found, gone = a.run(in_turn())
        assert registered == w.RegisterResponse(w.Status.OK, "", 3600)
        assert isinstance(found, w.DiscoverResponse) and [r.ns for r in found.registrations] == ["app"]
        assert isinstance(gone, w.DiscoverResponse) and gone.registrations == ()
        assert dict(point.host.services.rendezvous.served) == {"OK": 3}
