"""The libp2p TLS certificate: generation, verification, and the ways a certificate is refused."""

from __future__ import annotations

import datetime

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec

from lattica._identity import KeyPair
from lattica.errors import HandshakeError, PeerIdMismatch
from lattica.transports.quic.tlscert import (
    LIBP2P_EXTENSION_OID,
    SIGNATURE_PREFIX,
    build_certificate,
    decode_signed_key,
    encode_signed_key,
    generate_certificate,
    verify_certificate,
)

NOW = datetime.datetime.now(datetime.UTC)


def _spki(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.public_key().public_bytes(serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)


def _cert(host: KeyPair, signer: KeyPair | None = None, **window: datetime.datetime):
    """A certificate naming ``host`` whose extension signature is made by ``signer``."""
    key = ec.generate_private_key(ec.SECP256R1())
    sig = (signer or host).sign(SIGNATURE_PREFIX + _spki(key))
    return build_certificate(
        key,
        encode_signed_key(host.public_key_protobuf(), sig),
        not_before=window.get("not_before", NOW - datetime.timedelta(hours=1)),
        not_after=window.get("not_after", NOW + datetime.timedelta(days=1)),
    )


def test_round_trip_yields_peer_id() -> None:
    kp = KeyPair.generate()
    ck = generate_certificate(kp)
    assert verify_certificate(ck.certificate) == kp.peer_id
    assert verify_certificate(ck.certificate, kp.peer_id) == kp.peer_id
    # the certificate key is an ephemeral P-256 key, not the host key
    assert isinstance(ck.certificate.public_key(), ec.EllipticCurvePublicKey)


def test_certificate_survives_der_round_trip() -> None:
    kp = KeyPair.generate()
    der = generate_certificate(kp).certificate.public_bytes(serialization.Encoding.DER)
    assert verify_certificate(x509.load_der_x509_certificate(der)) == kp.peer_id


def test_extension_signed_by_another_key_is_rejected() -> None:
    host, other = KeyPair.generate(), KeyPair.generate()
    with pytest.raises(HandshakeError, match="signature"):
        verify_certificate(_cert(host, signer=other))


def test_signature_over_another_certificate_key_is_rejected() -> None:
    """A SignedKey copied from one certificate into another (different cert key) is refused."""
    kp = KeyPair.generate()
    stolen = generate_certificate(kp).certificate.extensions.get_extension_for_oid(LIBP2P_EXTENSION_OID).value.value
    key = ec.generate_private_key(ec.SECP256R1())
    forged = build_certificate(
        key,
        stolen,
        not_before=NOW - datetime.timedelta(hours=1),
        not_after=NOW + datetime.timedelta(days=1),
    )
    with pytest.raises(HandshakeError):
        verify_certificate(forged)


def test_missing_extension_is_rejected() -> None:
    key = ec.generate_private_key(ec.SECP256R1())
    cert = build_certificate(
        key,
        None,
        not_before=NOW - datetime.timedelta(hours=1),
        not_after=NOW + datetime.timedelta(days=1),
    )
    with pytest.raises(HandshakeError, match="extension"):
        verify_certificate(cert)


def test_no_certificate_is_rejected() -> None:
    with pytest.raises(HandshakeError):
        verify_certificate(None)


def test_expected_peer_id_mismatch() -> None:
    kp, other = KeyPair.generate(), KeyPair.generate()
    cert = generate_certificate(kp).certificate
    with pytest.raises(PeerIdMismatch):
        verify_certificate(cert, other.peer_id)
    assert issubclass(PeerIdMismatch, HandshakeError)


def test_expired_and_not_yet_valid_are_rejected() -> None:
    kp = KeyPair.generate()
    expired = _cert(kp, not_before=NOW - datetime.timedelta(days=2), not_after=NOW - datetime.timedelta(days=1))
    future = _cert(kp, not_before=NOW + datetime.timedelta(days=1), not_after=NOW + datetime.timedelta(days=2))
    for cert in (expired, future):
        with pytest.raises(HandshakeError, match="valid"):
            verify_certificate(cert)


def test_certificate_not_self_signed_is_rejected() -> None:
    """Subject key and signing key differ: the self-signature check fails."""
    kp = KeyPair.generate()
    subject_key, signing_key = ec.generate_private_key(ec.SECP256R1()), ec.generate_private_key(ec.SECP256R1())
    sig = kp.sign(SIGNATURE_PREFIX + _spki(subject_key))
    name = x509.Name([x509.NameAttribute(x509.oid.NameOID.SERIAL_NUMBER, "1")])
    from cryptography.hazmat.primitives import hashes

    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(subject_key.public_key())
        .serial_number(1)
        .not_valid_before(NOW - datetime.timedelta(hours=1))
        .not_valid_after(NOW + datetime.timedelta(days=1))
        .add_extension(
            x509.UnrecognizedExtension(LIBP2P_EXTENSION_OID, encode_signed_key(kp.public_key_protobuf(), sig)),
            critical=False,
        )
        .sign(signing_key, hashes.SHA256())
    )
    with pytest.raises(HandshakeError, match="self-signed"):
        verify_certificate(cert)


def test_malformed_extension_is_rejected() -> None:
    key = ec.generate_private_key(ec.SECP256R1())
    for junk in (b"", b"\x30\x00", b"\x04\x02ab", b"\x30\x03\x04\x01a", b"\x30\x80\x00\x00"):
        cert = build_certificate(
            key,
            junk,
            not_before=NOW - datetime.timedelta(hours=1),
            not_after=NOW + datetime.timedelta(days=1),
        )
        with pytest.raises(HandshakeError):
            verify_certificate(cert)


def test_signed_key_der_round_trip() -> None:
    pk, sig = b"\x08\x01\x12\x20" + bytes(32), bytes(range(64))
    der = encode_signed_key(pk, sig)
    assert der[0] == 0x30
    assert decode_signed_key(der) == (pk, sig)
    long_value = bytes(300)  # exercises the long-form DER length
    assert decode_signed_key(encode_signed_key(long_value, sig)) == (long_value, sig)
    with pytest.raises(ValueError):
        decode_signed_key(der + b"\x00")
    with pytest.raises(ValueError):
        decode_signed_key(der[:-1])
