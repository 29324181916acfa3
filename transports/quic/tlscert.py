"""The libp2p-style TLS certificate that binds a QUIC/TLS 1.3 session to a node's Ed25519 key.

Following the libp2p TLS spec, the certificate is self-signed by an *ephemeral* ECDSA P-256 key
(the key TLS signs the handshake with); the node's host key only appears inside an X.509
extension (OID 1.3.6.1.4.1.53594.1.1) holding the DER structure

    SignedKey ::= SEQUENCE { publicKey OCTET STRING, signature OCTET STRING }

where ``publicKey`` is the libp2p protobuf public key and ``signature`` is the host key's Ed25519
signature over ``b"libp2p-tls-handshake:" + SubjectPublicKeyInfo(DER) of the certificate key``.
A peer is therefore verified by its key, never by a certificate authority. P-256 is the key type
go-libp2p and rust-libp2p use, and one aioquic can both sign with and verify.
"""

from __future__ import annotations

import datetime
from dataclasses import dataclass

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec

from lattica._identity import KeyPair, PeerId, public_key_from_protobuf, verify_signature
from lattica.errors import HandshakeError, KeyFileError, PeerIdMismatch

__all__ = [
    "LIBP2P_EXTENSION_OID",
    "SIGNATURE_PREFIX",
    "CertifiedKey",
    "generate_certificate",
    "build_certificate",
    "encode_signed_key",
    "decode_signed_key",
    "verify_certificate",
]

LIBP2P_EXTENSION_OID = x509.ObjectIdentifier("1.3.6.1.4.1.53594.1.1")
SIGNATURE_PREFIX = b"libp2p-tls-handshake:"
_CLOCK_SKEW = datetime.timedelta(hours=1)
_DEFAULT_LIFETIME = datetime.timedelta(days=365)


@dataclass(frozen=True)
class CertifiedKey:
    """An ephemeral certificate key and the self-signed certificate that carries the host key."""

    private_key: ec.EllipticCurvePrivateKey
    certificate: x509.Certificate

    @property
    def not_valid_after(self) -> datetime.datetime:
        return self.certificate.not_valid_after_utc


# -- DER: just the two-OCTET-STRING SEQUENCE ---------------------------------------------------


def _der_len(n: int) -> bytes:
    if n < 0x80:
        return bytes([n])
    body = n.to_bytes((n.bit_length() + 7) // 8, "big")
    return bytes([0x80 | len(body)]) + body


def _der_tlv(tag: int, value: bytes) -> bytes:
    return bytes([tag]) + _der_len(len(value)) + value


def _der_read(buf: bytes, pos: int, tag: int) -> tuple[bytes, int]:
    """Read one TLV of the expected ``tag`` at ``pos``; return (value, next position)."""
    if pos + 2 > len(buf) or buf[pos] != tag:
        raise ValueError(f"expected DER tag {tag:#x}")
    first = buf[pos + 1]
    pos += 2
    if first < 0x80:
        n = first
    else:
        width = first & 0x7F
        if width == 0 or width > 4 or pos + width > len(buf):
            raise ValueError("bad DER length")
        n = int.from_bytes(buf[pos : pos + width], "big")
        if n < 0x80 or buf[pos] == 0:
            raise ValueError("non-minimal DER length")
        pos += width
    if pos + n > len(buf):
        raise ValueError("truncated DER value")
    return bytes(buf[pos : pos + n]), pos + n


def encode_signed_key(public_key_protobuf: bytes, signature: bytes) -> bytes:
    """DER ``SignedKey`` SEQUENCE { publicKey OCTET STRING, signature OCTET STRING }."""
    return _der_tlv(0x30, _der_tlv(0x04, public_key_protobuf) + _der_tlv(0x04, signature))


def decode_signed_key(der: bytes) -> tuple[bytes, bytes]:
    """(publicKey, signature) from a DER ``SignedKey``; raises ValueError if malformed."""
    body, end = _der_read(der, 0, 0x30)
    if end != len(der):
        raise ValueError("trailing bytes after SignedKey")
    public_key, pos = _der_read(body, 0, 0x04)
    signature, pos = _der_read(body, pos, 0x04)
    if pos != len(body):
        raise ValueError("trailing bytes inside SignedKey")
    return public_key, signature


# -- generation -----------------------------------------------------------------------------------


def _spki(public_key: ec.EllipticCurvePublicKey) -> bytes:
    return public_key.public_bytes(serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)


def build_certificate(
    cert_key: ec.EllipticCurvePrivateKey,
    extension_value: bytes | None,
    *,
    not_before: datetime.datetime,
    not_after: datetime.datetime,
) -> x509.Certificate:
    """Self-signed certificate for ``cert_key`` carrying ``extension_value`` (None: no extension).

    Low-level on purpose: tests use it to build deliberately broken certificates.
    """
    name = x509.Name([x509.NameAttribute(x509.oid.NameOID.SERIAL_NUMBER, "1")])
    builder = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(cert_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(not_before)
        .not_valid_after(not_after)
    )
    if extension_value is not None:
        builder = builder.add_extension(
            x509.UnrecognizedExtension(LIBP2P_EXTENSION_OID, extension_value), critical=False
        )
    return builder.sign(cert_key, hashes.SHA256())


def generate_certificate(keypair: KeyPair, *, lifetime: datetime.timedelta = _DEFAULT_LIFETIME) -> CertifiedKey:
    """A fresh P-256 certificate key and a self-signed certificate bound to ``keypair``."""
    cert_key = ec.generate_private_key(ec.SECP256R1())
    signature = keypair.sign(SIGNATURE_PREFIX + _spki(cert_key.public_key()))
    now = datetime.datetime.now(datetime.UTC)
    cert = build_certificate(
        cert_key,
        encode_signed_key(keypair.public_key_protobuf(), signature),
        not_before=now - _CLOCK_SKEW,
        not_after=now + lifetime,
    )
    return CertifiedKey(cert_key, cert)


# -- verification ---------------------------------------------------------------------------------


def verify_certificate(
    cert: x509.Certificate | None,
    expected: PeerId | None = None,
    *,
    now: datetime.datetime | None = None,
) -> PeerId:
    """Check a peer's libp2p certificate and return the PeerId it proves.

    Raises HandshakeError for a missing, expired, not-self-signed or badly signed certificate,
    and PeerIdMismatch if ``expected`` is given and the certificate names another peer.
    """
    if cert is None:
        raise HandshakeError("peer presented no TLS certificate")
    now = now or datetime.datetime.now(datetime.UTC)
    if not cert.not_valid_before_utc <= now <= cert.not_valid_after_utc:
        raise HandshakeError("peer certificate is expired or not yet valid")
    try:
        cert.verify_directly_issued_by(cert)
    except Exception as e:  # InvalidSignature, ValueError (issuer != subject), TypeError (key type)
        raise HandshakeError(f"peer certificate is not validly self-signed: {e!r}") from None
    try:
        ext = cert.extensions.get_extension_for_oid(LIBP2P_EXTENSION_OID)
    except x509.ExtensionNotFound:
        raise HandshakeError("peer certificate lacks the libp2p public key extension") from None
    except ValueError as e:  # duplicate or unparsable extensions
        raise HandshakeError(f"peer certificate has malformed extensions: {e}") from None
    value = ext.value
    if not isinstance(value, x509.UnrecognizedExtension):
        raise HandshakeError("libp2p extension has an unexpected form")
    try:
        public_key_pb, signature = decode_signed_key(value.value)
        host_key = public_key_from_protobuf(public_key_pb)
    except (ValueError, KeyFileError) as e:
        raise HandshakeError(f"malformed libp2p extension: {e}") from None
    try:
        spki = _spki(cert.public_key())  # type: ignore[arg-type]
    except Exception as e:
        raise HandshakeError(f"peer certificate key is unusable: {e!r}") from None
    if not verify_signature(host_key, signature, SIGNATURE_PREFIX + spki):
        raise HandshakeError("libp2p extension signature does not match the host key")
    peer = PeerId.from_public_key(host_key)
    if expected is not None and peer != expected:
        raise PeerIdMismatch(f"dialed {expected} but the peer authenticated as {peer}")
    return peer
