"""Peers with keys of every libp2p type, verify-only (lattica/_identity.py): RSA, secp256k1 and
ECDSA keys verify their signatures, name their PeerIds as libp2p does (inlined up to 42 bytes,
else SHA-256: ``Qm...``), and authenticate a Noise handshake, a QUIC certificate and an identify
message; bad keys and signatures fail."""

from __future__ import annotations

import datetime
import hashlib

import pytest
from cryptography.hazmat.primitives.asymmetric import ec, rsa

from foreign_keys import DER, KINDS, Foreign
from lattica import _identify as identify
from lattica._identity import KeyPair, PeerId, b58encode, public_key_from_protobuf, verify_signature
from lattica._protobuf import encode_fields
from lattica.errors import HandshakeError, KeyFileError, ProtocolError
from lattica.transports.noise import LIBP2P_PROTOCOL_NAME, NoiseHandshake
from lattica.transports.quic.tlscert import (
    SIGNATURE_PREFIX,
    build_certificate,
    encode_signed_key,
    verify_certificate,
)


@pytest.mark.parametrize("kind", KINDS)
def test_signatures_of_each_key_type_verify_and_tampered_ones_do_not(kind):
    peer = Foreign(kind)
    pub = public_key_from_protobuf(peer.pb)
    sig = peer.sign(b"hello")
    assert verify_signature(pub, sig, b"hello")
    assert not verify_signature(pub, sig, b"hellO")
    assert not verify_signature(pub, sig[:-1] + bytes([sig[-1] ^ 1]), b"hello")
    assert not verify_signature(pub, b"", b"hello")


@pytest.mark.parametrize("kind", KINDS)
def test_peer_ids_follow_libp2p_inlined_up_to_42_bytes_else_sha256(kind):
    peer = Foreign(kind)
    pid = PeerId.from_public_key(public_key_from_protobuf(peer.pb))
    if len(peer.pb) <= 42:  # secp256k1: 37 bytes, inlined ("16Uiu2...")
        assert pid.to_bytes() == bytes([0, len(peer.pb)]) + peer.pb
        assert str(pid).startswith("16Uiu2") and pid.public_key() == peer.pb
    else:  # RSA, ECDSA: hashed ("Qm...")
        assert pid.to_bytes() == b"\x12\x20" + hashlib.sha256(peer.pb).digest()
        assert str(pid).startswith("Qm") and str(pid) == b58encode(pid.to_bytes())
    assert PeerId.from_string(str(pid)) == pid


@pytest.mark.parametrize("kind", KINDS)
def test_a_peer_of_each_key_type_authenticates_a_noise_handshake(kind):
    peer, ours = Foreign(kind), KeyPair.generate()
    a = NoiseHandshake(peer, True, ours.peer_id, protocol_name=LIBP2P_PROTOCOL_NAME)  # type: ignore[arg-type]
    b = NoiseHandshake(ours, False, protocol_name=LIBP2P_PROTOCOL_NAME)
    msg2 = b.receive(a.start())
    msg3 = a.receive(msg2)
    b.receive(msg3)
    assert a.complete and b.complete and msg2 is not None
    assert b.remote_peer == PeerId.from_public_key(public_key_from_protobuf(peer.pb))


@pytest.mark.parametrize("kind", KINDS)
def test_a_peer_of_each_key_type_is_proven_by_its_tls_certificate(kind):
    """QUIC's libp2p-TLS: the certificate's extension carries the host key of any type, signed
    over the certificate key; another key's signature is refused."""
    peer, liar = Foreign(kind), Foreign(kind)
    cert_key = ec.generate_private_key(ec.SECP256R1())
    spki = cert_key.public_key().public_bytes(**DER)
    now = datetime.datetime.now(datetime.UTC)
    window = {"not_before": now - datetime.timedelta(hours=1), "not_after": now + datetime.timedelta(days=1)}
    signed = encode_signed_key(peer.pb, peer.sign(SIGNATURE_PREFIX + spki))
    expected = PeerId.from_public_key(public_key_from_protobuf(peer.pb))
    assert verify_certificate(build_certificate(cert_key, signed, **window), expected) == expected
    forged = encode_signed_key(peer.pb, liar.sign(SIGNATURE_PREFIX + spki))
    with pytest.raises(HandshakeError):
        verify_certificate(build_certificate(cert_key, forged, **window))


@pytest.mark.parametrize("kind", KINDS)
def test_a_peer_of_each_key_type_is_named_by_its_identify(kind):
    """/ipfs/id/1.0.0 from such a peer: its key must be the connection's peer's."""
    peer = Foreign(kind)
    pid = PeerId.from_public_key(public_key_from_protobuf(peer.pb))
    message = identify.encode_libp2p(peer.pb, "go-libp2p", "/ipfs/0.1.0", [], None, ["/ipfs/ping/1.0.0"])
    assert identify.parse_libp2p(message, pid)["protocols"] == ("/ipfs/ping/1.0.0",)
    with pytest.raises(ProtocolError):
        identify.parse_libp2p(message, KeyPair.generate().peer_id)


def test_a_handshake_signed_by_another_key_of_the_claimed_type_fails():
    peer, liar, ours = Foreign("ecdsa"), Foreign("ecdsa"), KeyPair.generate()
    peer.sign = liar.sign  # type: ignore[method-assign]  # (claims peer's key, signs with another)
    a = NoiseHandshake(peer, True, ours.peer_id, protocol_name=LIBP2P_PROTOCOL_NAME)  # type: ignore[arg-type]
    b = NoiseHandshake(ours, False, protocol_name=LIBP2P_PROTOCOL_NAME)
    msg3 = a.receive(b.receive(a.start()))
    with pytest.raises(HandshakeError):
        b.receive(msg3)


@pytest.mark.parametrize(
    "pb",
    [
        encode_fields([(1, 0), (2, b"not DER")]),
        encode_fields([(1, 2), (2, b"\x02" + b"\xff" * 32)]),  # not a point on secp256k1
        encode_fields([(1, 3), (2, b"\x30\x00")]),
        encode_fields([(1, 5), (2, b"x")]),  # no such key type
        encode_fields(
            [
                (1, 0),
                (2, rsa.generate_private_key(public_exponent=65537, key_size=1024).public_key().public_bytes(**DER)),
            ]
        ),  # RSA below 2,048 bits
        encode_fields([(1, 3), (2, Foreign("rsa").key.public_key().public_bytes(**DER))]),  # an RSA key called ECDSA
        encode_fields(
            [
                (1, 0),
                (
                    2,
                    rsa.RSAPublicNumbers(2**64 + 1, Foreign("rsa").key.public_key().public_numbers().n)
                    .public_key()
                    .public_bytes(**DER),
                ),
            ]
        ),  # a huge public exponent: every verify would cost a full-size exponentiation
    ],
    ids=[
        "rsa-garbage",
        "secp256k1-off-curve",
        "ecdsa-garbage",
        "unknown-type",
        "rsa-1024",
        "mislabelled",
        "rsa-huge-e",
    ],
)
def test_malformed_or_unacceptable_keys_are_refused(pb):
    with pytest.raises(KeyFileError):
        public_key_from_protobuf(pb)


@pytest.mark.parametrize("key_type", [0, 3])  # RSA, ECDSA: both read PKIX DER
def test_a_der_key_of_an_algorithm_we_lack_is_a_key_error_not_a_crash(key_type):
    """A SubjectPublicKeyInfo naming an unknown algorithm (OID 1.2.3.4): cryptography raises its
    own UnsupportedAlgorithm, which must not escape to the code reading a peer's key."""
    der = bytes.fromhex("301330070603" + "2a0304" + "0500" + "030800" + "01020304050607")
    with pytest.raises(KeyFileError):
        public_key_from_protobuf(encode_fields([(1, key_type), (2, der)]))
    assert not verify_signature(encode_fields([(1, key_type), (2, der)]), b"\x00" * 64, b"msg")
