"""libp2p rendezvous's messages (lattica/rendezvous/_wire.py): the bytes are those rust-libp2p's
prost codec writes (``protocols/rendezvous/src/generated/rendezvous.pb.rs``: proto2, fields in
tag order, set ones only), spelled out here byte by byte rather than produced by our encoder; a
signed peer record made as another implementation makes one (an RSA, secp256k1 or ECDSA key, and
rust-libp2p's older signing convention) is what a REGISTER carries; and a discovery answer's
registrations are kept only when their record verifies."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from foreign_keys import KINDS, Foreign
from lattica import _envelope as envelope
from lattica._identity import KeyPair, PeerId, public_key_from_protobuf
from lattica._multiaddr import Multiaddr
from lattica.actors.rendezvous import registrations_of
from lattica.config import RendezvousConfig
from lattica.errors import ProtocolError
from lattica.rendezvous import _wire as w
from lattica.rendezvous._registrations import Registrations

ADDRS = [Multiaddr("/ip4/198.51.100.7/tcp/4001"), Multiaddr("/ip4/198.51.100.7/udp/4001/quic-v1")]
NS = b"my-app"


def _len(b: bytes) -> bytes:
    """A length prefix as protobuf writes it (uvarint), for the payloads these tests build."""
    n, out = len(b), bytearray()
    while n >= 0x80:
        out.append(n & 0x7F | 0x80)
        n >>= 7
    return bytes(out + bytes([n]))


# -- the bytes rust-libp2p writes -------------------------------------------------------------------


def test_a_register_is_what_rusts_codec_writes():
    # Message{type: REGISTER (0), register: {ns: "my-app", signedPeerRecord: "RRR", ttl: 7200}}
    wire = bytes.fromhex("0800" + "1210" + "0a06") + NS + bytes.fromhex("1203") + b"RRR" + bytes.fromhex("18a038")
    assert w.decode(wire) == w.Register("my-app", b"RRR", 7200)
    assert w.encode(w.Register("my-app", b"RRR", 7200)) == wire
    # without a TTL (rust's register(namespace, node, None)): no field 3, the default applies
    no_ttl = bytes.fromhex("0800" + "120d" + "0a06") + NS + bytes.fromhex("1203") + b"RRR"
    assert w.decode(no_ttl) == w.Register("my-app", b"RRR", None)
    assert w.encode(w.Register("my-app", b"RRR")) == no_ttl


def test_answers_and_the_other_requests_are_what_rusts_codec_writes():
    cases = [
        # RegisterResponse(Ok(7200)): status Some(OK), no text, ttl Some(7200)
        ("08011a05080018a038", w.RegisterResponse(w.Status.OK, "", 7200)),
        # RegisterResponse(Err(InvalidTtl)): status only
        ("08011a020866", w.RegisterResponse(w.Status.E_INVALID_TTL)),
        # Unregister("my-app"): ns only (rust sends no id)
        ("080222080a06" + NS.hex(), w.Unregister("my-app")),
        # Discover{namespace: None, cookie: None, limit: None}: every namespace
        ("08032a00", w.Discover()),
        # DiscoverResponse(Err(InvalidCookie)): status only, no registrations, no cookie
        ("080432021867", w.DiscoverResponse(status=w.Status.E_INVALID_COOKIE)),
    ]
    for hexed, msg in cases:
        assert w.decode(bytes.fromhex(hexed)) == msg, hexed
        assert w.encode(msg) == bytes.fromhex(hexed), hexed
    # Discover{ns, limit: 10, cookie}: a rust cookie is 8 random bytes and the namespace
    cookie = bytes(range(8)) + NS
    sub = bytes.fromhex("0a06") + NS + bytes.fromhex("100a") + b"\x1a" + _len(cookie) + cookie
    wire = bytes.fromhex("08032a") + _len(sub) + sub
    assert w.decode(wire) == w.Discover("my-app", 10, cookie)
    assert w.encode(w.Discover("my-app", 10, cookie)) == wire


def test_a_discover_response_with_registrations_is_what_rusts_codec_writes():
    keys = KeyPair.generate()
    record = envelope.seal_peer_record(keys, 5, ADDRS)
    reg = b"\x0a\x06" + NS + b"\x12" + _len(record) + record + bytes.fromhex("18a038")
    cookie = bytes(8) + NS
    # DiscoverResponse(Ok((registrations, cookie))): registrations, cookie, status OK, no text
    body = b"\x0a" + _len(reg) + reg + b"\x0a" + _len(reg) + reg + b"\x12" + _len(cookie) + cookie + b"\x18\x00"
    wire = b"\x08\x04\x32" + _len(body) + body
    msg = w.DiscoverResponse((w.Register("my-app", record, 7200),) * 2, cookie)
    assert w.decode(wire) == msg
    assert w.encode(msg) == wire
    found = registrations_of(msg, "my-app", 10)
    assert [(r.peer, r.addrs, r.namespace, r.ttl) for r in found] == [(keys.peer_id, ADDRS, "my-app", 7200)] * 2


# -- the bytes js writes -------------------------------------------------------------------------------


def test_what_jss_protons_codec_writes_reads_as_proto2_reads_it():
    """@canvas-js/libp2p-rendezvous (npm) encodes with protons under proto3's rules: no field that
    holds 0, so neither REGISTER's type (0) nor OK's status (0). proto2, the spec's syntax, reads an
    absent enum as its first value: REGISTER, OK (rust refuses these messages)."""
    # Message{register: {ns: "my-app", signedPeerRecord: "RRR"}}: no type, no TTL (js's 0n)
    sub = bytes.fromhex("0a06") + NS + bytes.fromhex("1203") + b"RRR"
    assert w.decode(b"\x12" + _len(sub) + sub) == w.Register("my-app", b"RRR", None)
    # Message{type: REGISTER_RESPONSE, registerResponse: {statusText: "OK", ttl: 7200}}: no status
    assert w.decode(bytes.fromhex("0801" + "1a07" + "12024f4b" + "18a038")) == w.RegisterResponse(
        w.Status.OK, "OK", 7200
    )
    # Message{type: DISCOVER, discover: {ns}}: no limit (0n), no cookie (empty)
    assert w.decode(bytes.fromhex("0803" + "2a08" + "0a06") + NS) == w.Discover("my-app")
    # Message{type: DISCOVER_RESPONSE, discoverResponse: {registrations, cookie, statusText}}: no status
    keys = KeyPair.generate()
    record = envelope.seal_peer_record(keys, 5, ADDRS)
    reg = b"\x0a\x06" + NS + b"\x12" + _len(record) + record + bytes.fromhex("18a038")
    cookie = (7).to_bytes(8, "big")  # (js's point: the 8-byte id of a registration)
    body = b"\x0a" + _len(reg) + reg + b"\x12\x08" + cookie + b"\x22\x02OK"
    msg = w.decode(b"\x08\x04\x32" + _len(body) + body)
    assert msg == w.DiscoverResponse((w.Register("my-app", record, 7200),), cookie, w.Status.OK, "OK")
    # a refusal does carry its status (not 0): E_INVALID_TTL
    assert w.decode(bytes.fromhex("0801" + "1a02" + "0866")) == w.RegisterResponse(w.Status.E_INVALID_TTL)
    # and an empty message is a REGISTER of nothing, which a point refuses for its namespace
    assert w.decode(b"") == w.Register("", b"", None)


@pytest.mark.parametrize("kind", KINDS + ["rust-legacy"])
def test_a_register_carries_a_record_signed_as_other_implementations_sign_theirs(kind):
    if kind == "rust-legacy":  # (rust-libp2p before 0.56: "libp2p-routing-state", its own payload type)
        keys = KeyPair.generate()
        peer, signer = keys.peer_id, keys.sign
        pb = keys.public_key_protobuf()
        domain, kind_bytes = envelope.LEGACY_PEER_RECORD_DOMAIN, envelope.LEGACY_PEER_RECORD_TYPE
    else:
        foreign = Foreign(kind)
        peer = PeerId.from_public_key(public_key_from_protobuf(foreign.pb))
        signer, pb = foreign.sign, foreign.pb
        domain, kind_bytes = envelope.PEER_RECORD_DOMAIN, envelope.PEER_RECORD_TYPE
    payload = envelope.encode_peer_record(peer, 1, ADDRS)
    d = domain.encode()
    signed = _len(d) + d + _len(kind_bytes) + kind_bytes + _len(payload) + payload
    sealed = (
        (b"\x0a" + _len(pb) + pb + b"\x12" + _len(kind_bytes) + kind_bytes + b"\x1a" + _len(payload) + payload)
        + b"\x2a"
        + _len(sig := signer(signed))
        + sig
    )
    sub = b"\x0a\x06" + NS + b"\x12" + _len(sealed) + sealed
    msg = w.decode(b"\x08\x00\x12" + _len(sub) + sub)
    assert isinstance(msg, w.Register)
    assert envelope.open_peer_record(msg.record) == (peer, 1, tuple(ADDRS))


# -- what we cannot read ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "wire, kind, status",
    [
        (bytes.fromhex("0a00"), None, w.Status.E_INTERNAL_ERROR),  # bytes for a type
        (b"\xff\xff", None, w.Status.E_INTERNAL_ERROR),  # not protobuf
        (bytes.fromhex("0809"), None, w.Status.E_INTERNAL_ERROR),  # an unknown type
        (bytes.fromhex("0800" + "1204" + "0a02ffff"), w.MessageType.REGISTER, w.Status.E_INVALID_NAMESPACE),
        (bytes.fromhex("0800" + "1202" + "0801"), w.MessageType.REGISTER, w.Status.E_INVALID_NAMESPACE),
        (bytes.fromhex("0800" + "1202" + "1001"), w.MessageType.REGISTER, w.Status.E_INVALID_SIGNED_PEER_RECORD),
        (bytes.fromhex("0800" + "1203" + "1a0100"), w.MessageType.REGISTER, w.Status.E_INVALID_TTL),
        (bytes.fromhex("0800" + "1202" + "0a05"), w.MessageType.REGISTER, w.Status.E_INTERNAL_ERROR),  # cut short
        (bytes.fromhex("0803" + "2a02" + "1801"), w.MessageType.DISCOVER, w.Status.E_INVALID_COOKIE),
        (bytes.fromhex("0803" + "2a03" + "1201ff"), w.MessageType.DISCOVER, w.Status.E_INTERNAL_ERROR),
        (bytes.fromhex("0803" + "2801"), w.MessageType.DISCOVER, w.Status.E_INTERNAL_ERROR),  # a number for a body
        (bytes.fromhex("0801" + "1a02" + "0a00"), w.MessageType.REGISTER_RESPONSE, w.Status.E_INTERNAL_ERROR),  # bytes
    ],
)
def test_what_cannot_be_read_says_which_answer_it_gets(wire, kind, status):
    with pytest.raises(w.BadMessage) as e:
        w.decode(wire)
    assert (e.value.kind, e.value.status) == (kind, status)


def test_a_negative_ttl_from_a_spec_int64_reads_as_out_of_range():
    # the spec's proto says int64: -1 is ten bytes of varint, which reads as 2**64 - 1
    minus_one = bytes.fromhex("ffffffffffffffffff01")
    msg = w.decode(bytes.fromhex("0800" + "1211" + "0a01") + b"x" + bytes.fromhex("1201") + b"R" + b"\x18" + minus_one)
    assert isinstance(msg, w.Register) and msg.ttl == 2**64 - 1


def test_namespaces_and_status_names():
    assert w.check_namespace("a" * 255) == b"a" * 255
    for bad in ("", "a" * 256, "é" * 128):
        with pytest.raises(ValueError):
            w.check_namespace(bad)
    assert w.status_name(102) == "E_INVALID_TTL" and w.status_name(999) == "999"


def test_a_discovery_answer_keeps_only_records_that_verify_for_the_namespace_asked():
    honest, liar = KeyPair.generate(), KeyPair.generate()
    good = envelope.seal_peer_record(honest, 1, ADDRS)
    broken = good[:-1] + bytes([good[-1] ^ 1])
    # a record naming the honest peer but signed by the liar
    stolen = envelope.seal(
        liar, envelope.PEER_RECORD_DOMAIN, envelope.PEER_RECORD_TYPE, envelope.encode_peer_record(honest.peer_id, 9, [])
    )
    answer = w.DiscoverResponse(
        (
            w.Register("my-app", broken, 60),
            w.Register("my-app", stolen, 60),
            w.Register("other", envelope.seal_peer_record(liar, 1, ADDRS), 60),
            w.Register("my-app", b"junk", 60),
            w.Register("my-app", good, 60),
            w.Register("my-app", good, 60),
        ),
        b"c" * 8,
    )
    assert [(r.peer, r.namespace) for r in registrations_of(answer, "my-app", 10)] == [(honest.peer_id, "my-app")] * 2
    assert len(registrations_of(answer, "my-app", 1)) == 1
    assert {r.namespace for r in registrations_of(answer, None, 10)} == {"my-app", "other"}


# -- fuzzing ------------------------------------------------------------------------------------------

FUZZ = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
_KEYS = KeyPair.generate()
_VALID = [
    w.encode(w.Register("my-app", envelope.seal_peer_record(_KEYS, 1, ADDRS), 7200)),
    w.encode(w.Discover("my-app", 10, bytes(8) + NS)),
    w.encode(w.DiscoverResponse((w.Register("my-app", b"R", 60),), b"c" * 8)),
    w.encode(w.RegisterResponse(w.Status.E_INVALID_TTL, "no")),
    w.encode(w.Unregister("my-app")),
]


@FUZZ
@given(
    st.one_of(st.binary(max_size=300), st.tuples(st.sampled_from(_VALID), st.integers(0, 10**6), st.binary(max_size=8)))
)
def test_decoding_anything_gives_a_message_or_bad_message_and_a_point_answers_or_refuses(data):
    if isinstance(data, tuple):  # a valid message with a few bytes replaced
        valid, at, junk = data
        at %= len(valid)
        data = valid[:at] + junk + valid[at + len(junk) :]
    try:
        msg = w.decode(data)
    except w.BadMessage:
        return
    assert w.decode(w.encode(msg)) == msg or isinstance(msg, w.RegisterResponse | w.DiscoverResponse)
    book = Registrations(RendezvousConfig(serve=True))
    try:
        answer = book.handle(_KEYS.peer_id, msg, 0.0, "192.0.2.1")
    except ProtocolError:
        return
    if answer is not None:
        w.decode(w.encode(answer))
