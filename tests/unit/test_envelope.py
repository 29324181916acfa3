"""libp2p's signed envelopes and peer records (lattica/_envelope.py), and identify's
``signedPeerRecord``: signed by a key of any libp2p type, bound to their domain and type; a
valid record's addresses stand for the peer's, a forged one is ignored."""

from __future__ import annotations

import pytest

from foreign_keys import KINDS, Foreign
from lattica import _envelope as envelope
from lattica import _identify as identify
from lattica._identity import KeyPair, PeerId, public_key_from_protobuf
from lattica._multiaddr import Multiaddr
from lattica._protobuf import encode_fields
from lattica.errors import ProtocolError

ADDRS = [Multiaddr("/ip4/10.0.0.1/tcp/4001"), Multiaddr("/ip4/10.0.0.1/udp/4001/quic-v1")]


def _foreign_envelope(peer: Foreign, domain: str, kind: bytes, payload: bytes) -> bytes:
    """An envelope as a peer with a key of another type seals one (RFC 0002)."""
    d = domain.encode()
    signed = bytes([len(d)]) + d + bytes([len(kind)]) + kind + bytes([len(payload)]) + payload
    return encode_fields([(1, peer.pb), (2, kind), (3, payload), (5, peer.sign(signed))])


def test_our_peer_record_opens_and_says_our_addresses():
    keys = KeyPair.generate()
    peer, seq, addrs = envelope.open_peer_record(envelope.seal_peer_record(keys, 7, ADDRS))
    assert (peer, seq, addrs) == (keys.peer_id, 7, tuple(ADDRS))


@pytest.mark.parametrize("kind", KINDS)
def test_a_peer_record_signed_by_a_key_of_each_type_opens(kind):
    peer = Foreign(kind)
    pid = PeerId.from_public_key(public_key_from_protobuf(peer.pb))
    payload = envelope.encode_peer_record(pid, 3, ADDRS[:1])
    sealed = _foreign_envelope(peer, envelope.PEER_RECORD_DOMAIN, envelope.PEER_RECORD_TYPE, payload)
    assert envelope.open_peer_record(sealed) == (pid, 3, tuple(ADDRS[:1]))


def test_rust_libp2ps_older_signing_convention_opens_too():
    keys = KeyPair.generate()
    payload = envelope.encode_peer_record(keys.peer_id, 1, ADDRS)
    sealed = envelope.seal(keys, envelope.LEGACY_PEER_RECORD_DOMAIN, envelope.LEGACY_PEER_RECORD_TYPE, payload)
    assert envelope.open_peer_record(sealed)[2] == tuple(ADDRS)


def test_an_envelope_for_another_domain_or_type_or_tampered_does_not_open():
    keys = KeyPair.generate()
    sealed = envelope.seal(keys, "libp2p-relay-rsvp", envelope.PEER_RECORD_TYPE, b"payload")
    assert envelope.open_envelope(sealed, "libp2p-relay-rsvp", envelope.PEER_RECORD_TYPE).signer == keys.peer_id
    with pytest.raises(ProtocolError, match="not valid"):
        envelope.open_envelope(sealed, envelope.PEER_RECORD_DOMAIN, envelope.PEER_RECORD_TYPE)
    with pytest.raises(ProtocolError, match="another type"):
        envelope.open_envelope(sealed, "libp2p-relay-rsvp", b"\x03\x02")
    tampered = sealed.replace(b"payload", b"paylaod")
    with pytest.raises(ProtocolError, match="not valid"):
        envelope.open_envelope(tampered, "libp2p-relay-rsvp", envelope.PEER_RECORD_TYPE)
    for junk in (b"", b"\xff\xff", encode_fields([(1, b"no key"), (2, b"x"), (3, b"y"), (5, b"z")])):
        with pytest.raises(ProtocolError):
            envelope.open_envelope(junk, "libp2p-relay-rsvp", envelope.PEER_RECORD_TYPE)


def test_a_record_naming_another_peer_than_its_signer_is_refused():
    keys, other = KeyPair.generate(), KeyPair.generate()
    payload = envelope.encode_peer_record(other.peer_id, 1, ADDRS)
    sealed = envelope.seal(keys, envelope.PEER_RECORD_DOMAIN, envelope.PEER_RECORD_TYPE, payload)
    with pytest.raises(ProtocolError, match="another peer"):
        envelope.open_peer_record(sealed)


def test_identify_takes_the_signed_addresses_and_ignores_a_forged_record():
    peer, liar = KeyPair.generate(), KeyPair.generate()
    unsigned = [Multiaddr("/ip4/192.0.2.9/tcp/1")]

    def message(record: bytes) -> bytes:
        return identify.encode_libp2p(peer.public_key_protobuf(), "a", "/p", unsigned, None, [], record)

    ours = envelope.seal_peer_record(peer, 1, ADDRS)
    assert identify.parse_libp2p(message(ours), peer.peer_id)["listen_addrs"] == tuple(ADDRS)
    forged = envelope.seal_peer_record(liar, 1, ADDRS)  # (valid, but the liar's own)
    assert identify.parse_libp2p(message(forged), peer.peer_id)["listen_addrs"] == tuple(unsigned)
    broken = ours[:-1] + bytes([ours[-1] ^ 1])
    assert identify.parse_libp2p(message(broken), peer.peer_id)["listen_addrs"] == tuple(unsigned)


def test_our_identify_leaves_the_record_out_before_any_address_when_it_would_not_fit():
    keys = KeyPair.generate()
    many = [Multiaddr(f"/ip4/10.0.{i // 256}.{i % 256}/tcp/4001") for i in range(64)]
    record = envelope.seal_peer_record(keys, 1, many)
    protocols = [f"/p/{i:04d}/" + "x" * 40 for i in range(55)]
    without = identify.encode_libp2p(keys.public_key_protobuf(), "a", "/p", many, None, protocols)
    assert len(without) + len(record) > identify.LIBP2P_MAX_MESSAGE >= len(without)
    out = identify.encode_libp2p(keys.public_key_protobuf(), "a", "/p", many, None, protocols, record)
    assert out == without
    assert identify.parse_libp2p(out, keys.peer_id)["listen_addrs"] == tuple(many)
