"""A rendezvous point's registrations, sans-IO (lattica/rendezvous/_registrations.py): who may
register (only a peer itself, with a record that verifies), lifetimes, discovery with stateless
cookies (pagination, namespaces, forgeries), and every bound (per peer, per namespace, per source
address, in all; an answer's count and bytes; the expiry heap)."""

from __future__ import annotations

import functools

import pytest

from lattica import _envelope as envelope
from lattica._identity import KeyPair
from lattica._multiaddr import Multiaddr
from lattica.config import RendezvousConfig
from lattica.rendezvous import _wire as w
from lattica.rendezvous._registrations import Registrations

OK = w.Status.OK
ADDR = Multiaddr("/ip4/198.51.100.7/tcp/4001")


@functools.cache
def _keys(i: int) -> KeyPair:
    return KeyPair.generate()


def _record(keys: KeyPair, addrs: list[Multiaddr] | None = None) -> bytes:
    return envelope.seal_peer_record(keys, 1, [ADDR] if addrs is None else addrs)


def _long_addrs(n: int) -> list[Multiaddr]:
    """``n`` addresses of about 70 bytes each (a record of 60 is near the 4 KiB a point keeps)."""
    return [Multiaddr(f"/dns4/{'a' * 50}{i}.example/tcp/4001") for i in range(n)]


def _book(**limits) -> Registrations:
    return Registrations(RendezvousConfig(serve=True, min_ttl=10, **limits), key=b"k" * 32)


def _register(book: Registrations, keys: KeyPair, ns: str = "app", ttl: int | None = 60, now: float = 0.0, source=None):
    return book.register(keys.peer_id, w.Register(ns, _record(keys), ttl), now, source)[0]


def _discover(book: Registrations, ns: str | None = "app", limit=None, cookie=None, now: float = 0.0):
    return book.discover(w.Discover(ns, limit, cookie), now)


def _peers(answer: w.DiscoverResponse) -> list:
    return [envelope.open_peer_record(r.record)[0] for r in answer.registrations]


def test_a_peer_registers_itself_and_is_discovered_with_its_signed_addresses():
    book = _book()
    a = _keys(0)
    assert book.register(a.peer_id, w.Register("app", _record(a), None), 0.0) == (OK, "", w.DEFAULT_TTL)
    answer = _discover(book)
    assert answer.status == OK and _peers(answer) == [a.peer_id]
    reg = answer.registrations[0]
    assert (reg.ns, reg.ttl) == ("app", w.DEFAULT_TTL) and envelope.open_peer_record(reg.record)[2] == (ADDR,)
    # the TTL a discovery gives is what is left of it
    assert _discover(book, now=100.0).registrations[0].ttl == w.DEFAULT_TTL - 100
    assert book.handle(a.peer_id, w.Unregister("app"), 1.0) is None
    assert _discover(book).registrations == () and len(book) == 0


def test_only_the_peer_itself_may_register_with_a_record_that_verifies():
    book = _book()
    a, b = _keys(0), _keys(1)
    assert book.register(b.peer_id, w.Register("app", _record(a), 60), 0)[0] == w.Status.E_NOT_AUTHORIZED
    good = _record(a)
    forged = good[:-1] + bytes([good[-1] ^ 1])
    assert book.register(a.peer_id, w.Register("app", forged, 60), 0)[0] == w.Status.E_INVALID_SIGNED_PEER_RECORD
    assert book.register(a.peer_id, w.Register("app", b"", 60), 0)[0] == w.Status.E_INVALID_SIGNED_PEER_RECORD
    huge = _record(a, _long_addrs(80))
    assert len(huge) > w.MAX_RECORD
    assert book.register(a.peer_id, w.Register("app", huge, 60), 0)[0] == w.Status.E_INVALID_SIGNED_PEER_RECORD
    # an envelope of another domain (a relay voucher) is no peer record
    voucher = envelope.seal(a, "libp2p-relay-rsvp", b"\x03\x02", b"x")
    assert book.register(a.peer_id, w.Register("app", voucher, 60), 0)[0] == w.Status.E_INVALID_SIGNED_PEER_RECORD
    for ns in ("", "x" * 256):
        assert book.register(a.peer_id, w.Register(ns, good, 60), 0)[0] == w.Status.E_INVALID_NAMESPACE
    for ttl in (0, 9, 72 * 3600 + 1, 2**64 - 1):
        assert book.register(a.peer_id, w.Register("app", good, ttl), 0)[0] == w.Status.E_INVALID_TTL
    assert len(book) == 0


def test_a_registration_expires_and_registering_again_replaces_it():
    book = _book()
    a, b = _keys(0), _keys(1)
    assert _register(book, a, ttl=10) == OK
    assert _register(book, b, ttl=100) == OK
    assert _register(book, a, ttl=50, now=5.0) == OK  # (renewed: now after b)
    assert _peers(_discover(book, now=5.0)) == [b.peer_id, a.peer_id]
    assert _peers(_discover(book, now=20.0)) == [b.peer_id, a.peer_id]  # (the first TTL no longer counts)
    assert book.expire(55.0) == 1 and _peers(_discover(book, now=55.0)) == [b.peer_id]
    assert _discover(book, now=100.0).registrations == () and len(book) == 0 and book.of_peer(b.peer_id) == 0


def test_cookies_page_through_and_then_give_only_what_is_new():
    book = _book(max_per_namespace=5000)
    for i in range(25):
        assert _register(book, _keys(i)) == OK
    seen, cookie = [], None
    while True:
        answer = _discover(book, limit=10, cookie=cookie)
        assert answer.status == OK and len(answer.registrations) <= 10
        seen += _peers(answer)
        cookie = answer.cookie
        if not answer.registrations:
            break
    assert seen == [_keys(i).peer_id for i in range(25)]
    # a new registration and a renewed one come with the next discovery, and nothing else
    assert _register(book, _keys(30)) == OK and _register(book, _keys(3), now=1.0) == OK
    answer = _discover(book, cookie=cookie, now=1.0)
    assert _peers(answer) == [_keys(30).peer_id, _keys(3).peer_id]
    assert _discover(book, cookie=answer.cookie, now=1.0).registrations == ()


def test_a_discovery_of_every_namespace_and_of_one():
    book = _book()
    a, b = _keys(0), _keys(1)
    _register(book, a, "one")
    _register(book, b, "two")
    _register(book, a, "two")
    assert [(r.ns, envelope.open_peer_record(r.record)[0]) for r in _discover(book, None).registrations] == [
        ("one", a.peer_id),
        ("two", b.peer_id),
        ("two", a.peer_id),
    ]
    assert _peers(_discover(book, "two")) == [b.peer_id, a.peer_id]
    assert _peers(_discover(book, "")) == _peers(_discover(book, None))  # ("" is no namespace)
    assert _discover(book, "x" * 256).status == w.Status.E_INVALID_NAMESPACE


def test_a_cookie_is_refused_unless_this_point_gave_it_for_this_namespace():
    book = _book()
    _register(book, _keys(0), "app")
    _register(book, _keys(1), "other")
    cookie = _discover(book, "app").cookie
    assert cookie is not None and _discover(book, "app", cookie=cookie).status == OK
    all_cookie = _discover(book, None).cookie
    assert all_cookie is not None
    # rust-libp2p's client reads a cookie as 8 bytes then the namespace: ours fit that layout
    assert len(cookie) == 8 + 3 and cookie[8:] == b"app" and len(all_cookie) == 8
    forged = [
        cookie[:7],  # cut short
        b"",
        bytes(8) + b"app",  # a made-up position
        cookie[:5] + bytes(a ^ 1 for a in cookie[5:8]) + b"app",  # a wrong MAC
        (int.from_bytes(cookie[:5], "big") + 1).to_bytes(5, "big") + cookie[5:],  # a moved position
        cookie + b"x",  # another namespace's suffix
        all_cookie,  # every namespace's, for one
        _discover(book, "other").cookie,  # another namespace's
        _discover(Registrations(book.cfg), "app").cookie,  # another point's (or before a restart)
    ]
    for bad in forged:
        assert _discover(book, "app", cookie=bad).status == w.Status.E_INVALID_COOKIE, bad
    assert _discover(book, None, cookie=cookie).status == w.Status.E_INVALID_COOKIE


def test_an_answer_holds_at_most_max_discover_and_a_mebibyte():
    book = _book(max_discover=20, max_per_namespace=5000)
    for i in range(30):
        _register(book, _keys(i))
    assert len(_discover(book, limit=10**9).registrations) == 20
    assert len(_discover(book, limit=0).registrations) == 20  # (0: as many as an answer holds)
    assert len(_discover(book, limit=3).registrations) == 3
    # large records: an answer stops before 1 MiB (rust's clients read no more) and the cookie goes on
    big = _book(max_per_namespace=5000)
    addrs = _long_addrs(50)
    for i in range(400):
        keys = _keys(i)
        assert big.register(keys.peer_id, w.Register("app", _record(keys, addrs), 60), 0)[0] == OK
    first = _discover(big, limit=10**9)
    assert 0 < len(first.registrations) < 400 and len(w.encode(first)) <= w.MAX_MESSAGE
    rest = _discover(big, limit=10**9, cookie=first.cookie)
    assert len(first.registrations) + len(rest.registrations) == 400 and len(w.encode(rest)) <= w.MAX_MESSAGE


def test_the_limits_per_peer_per_namespace_and_in_all():
    book = _book(max_per_peer=3, max_per_namespace=4, max_registrations=10)
    a = _keys(0)
    answers = [_register(book, a, f"ns{i}") for i in range(1000)]
    assert answers.count(OK) == 3 and answers[3:].count(w.Status.E_UNAVAILABLE) == 997
    assert book.of_peer(a.peer_id) == 3
    assert _register(book, a, "ns0", now=1.0) == OK  # (renewing one of its own is no new one)
    assert [_register(book, _keys(i), "full") for i in range(1, 8)].count(OK) == 4  # (the namespace's 4)
    assert [_register(book, _keys(i), "more") for i in range(8, 13)].count(OK) == 3  # (10 in all)
    assert len(book) == 10


def test_many_identities_from_one_address_are_bounded_and_members_are_not():
    book = _book(max_per_address=16, max_per_namespace=5000)
    strangers = [_register(book, _keys(i), source="192.0.2.1") for i in range(200)]
    assert strangers.count(OK) == 16 and strangers[16:].count(w.Status.E_UNAVAILABLE) == 200 - 16
    assert _register(book, _keys(500), source="192.0.2.2") == OK  # (another address has its own share)
    assert [_register(book, _keys(600 + i), source=None) for i in range(40)].count(OK) == 40
    # an ended registration frees its address's share
    assert book.unregister(_keys(0).peer_id, "app")
    assert _register(book, _keys(300), source="192.0.2.1") == OK


def test_renewals_do_not_grow_the_expiry_heap():
    book = _book()
    a = _keys(0)
    record = _record(a)
    for i in range(1000):
        assert book.register(a.peer_id, w.Register("app", record, 60), i / 1000)[0] == OK
    assert len(book) == 1 and len(book._expiry) <= 2 * len(book) + 64


def test_what_is_not_a_request_is_refused():
    book = _book()
    with pytest.raises(Exception, match="takes requests"):
        book.handle(_keys(0).peer_id, w.RegisterResponse(OK), 0)
