"""Peer identity: Ed25519 key pairs and PeerIds in libp2p's formats.

A PeerId is the multihash of the protobuf-encoded public key, written in base58btc: the identity
multihash when the encoding is at most 42 bytes (``12D3KooW...`` for Ed25519), else its SHA-256
(``Qm...``, RSA keys). Key files hold the protobuf-encoded private key, so a key written by
go-libp2p, rust-libp2p or js-libp2p loads here and yields the same PeerId.

Our own keys are Ed25519. A peer's key may be any type libp2p defines (RSA, secp256k1, ECDSA:
many IPFS nodes still run RSA identities): those are verify-only, and where this module hands a
public key around it is an Ed25519 key's raw 32 bytes, or another type's protobuf encoding (never
32 bytes long).
"""

from __future__ import annotations

import contextlib
import functools
import os
from typing import Any

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from lattica import _sodium
from lattica._digest import sha256
from lattica._protobuf import decode_fields, encode_fields, read_uvarint
from lattica.errors import InvalidPeerId, KeyFileError

__all__ = ["KeyPair", "PeerId", "verify_signature", "b58encode", "b58decode"]

_KEY_TYPE_RSA, _KEY_TYPE_ED25519, _KEY_TYPE_SECP256K1, _KEY_TYPE_ECDSA = 0, 1, 2, 3
_MAX_FOREIGN_KEY = 2048  # bytes of another type's protobuf key (RSA-8192 in DER is ~1.1 KiB)
_RSA_BITS = (2048, 8192)  # RSA key sizes we verify (go-libp2p refuses smaller ones too)
_RSA_MAX_EXPONENT = 2**32 - 1  # (65537 in practice; go's crypto/rsa refuses above 2**31 - 1)
_IDENTITY_MH = 0x00
_SHA256_MH = 0x12
_MAX_INLINE_KEY = 42  # libp2p inlines keys up to 42 bytes in the identity multihash

# -- base58btc ------------------------------------------------------------------------------------

_B58 = "123456789ABCDEFGHJKLMNPQRSTUVWXYZabcdefghijkmnopqrstuvwxyz"
_B58_INDEX = {c: i for i, c in enumerate(_B58)}


def b58encode(data: bytes) -> str:
    """Encode bytes in base58btc (the Bitcoin alphabet), keeping leading zero bytes as '1'."""
    n = int.from_bytes(data, "big")
    out = []
    while n:
        n, r = divmod(n, 58)
        out.append(_B58[r])
    pad = len(data) - len(data.lstrip(b"\0"))
    return "1" * pad + "".join(reversed(out))


def b58decode(text: str) -> bytes:
    """Decode base58btc text; raises ValueError on characters outside the alphabet."""
    n = 0
    for c in text:
        try:
            n = n * 58 + _B58_INDEX[c]
        except KeyError:
            raise ValueError(f"invalid base58 character {c!r}") from None
    pad = len(text) - len(text.lstrip("1"))
    body = n.to_bytes((n.bit_length() + 7) // 8, "big") if n else b""
    return b"\0" * pad + body


# -- libp2p's Key protobuf: {KeyType Type = 1; bytes Data = 2}


def _encode_key_pb(key_type: int, data: bytes) -> bytes:
    return encode_fields([(1, key_type), (2, data)])


def _decode_key_pb(buf: bytes) -> tuple[int, bytes]:
    try:
        fields = decode_fields(buf)
    except ValueError as e:
        raise KeyFileError(f"malformed protobuf key: {e}") from None
    key_type, data = fields.get(1), fields.get(2)
    if not isinstance(key_type, int) or not isinstance(data, bytes):
        raise KeyFileError("protobuf key is missing its type or data")
    return key_type, data


# -- public key helpers -----------------------------------------------------------------------


def public_key_to_protobuf(raw: bytes) -> bytes:
    """The libp2p protobuf encoding of a public key: a raw 32-byte Ed25519 key's, or another
    type's key, which is kept in that encoding already."""
    return _encode_key_pb(_KEY_TYPE_ED25519, raw) if len(raw) == 32 else bytes(raw)


def public_key_from_protobuf(buf: bytes) -> bytes:
    """A public key from its libp2p protobuf encoding: an Ed25519 key's raw 32 bytes, or for an
    RSA, secp256k1 or ECDSA key (verify-only) its canonical protobuf encoding, checked to parse.
    KeyFileError for anything else."""
    key_type, data = _decode_key_pb(buf)
    if key_type == _KEY_TYPE_ED25519:
        if len(data) != 32:
            raise KeyFileError(f"Ed25519 public key must be 32 bytes, got {len(data)}")
        return data
    if key_type not in (_KEY_TYPE_RSA, _KEY_TYPE_SECP256K1, _KEY_TYPE_ECDSA):
        raise KeyFileError(f"unsupported key type {key_type}")
    pb = _encode_key_pb(key_type, data)
    if len(pb) > _MAX_FOREIGN_KEY:
        raise KeyFileError(f"public key of {len(pb)} bytes (at most {_MAX_FOREIGN_KEY})")
    _foreign_key(pb)  # (a malformed key fails here, not at its first signature)
    return pb


@functools.lru_cache(maxsize=256)
def _foreign_key(pb: bytes) -> Any:
    """The key object of an RSA (PKIX DER), secp256k1 (compressed point) or ECDSA (PKIX DER)
    public key in its protobuf encoding; KeyFileError if it is not one."""
    # (loaded with the first key of another type: a node that meets none never loads them)
    from cryptography.exceptions import UnsupportedAlgorithm  # (loaded here: see the line above)
    from cryptography.hazmat.primitives import serialization  # (as the line above)
    from cryptography.hazmat.primitives.asymmetric import ec, rsa  # (as the line above)

    key_type, data = _decode_key_pb(pb)
    try:
        if key_type == _KEY_TYPE_SECP256K1:
            return ec.EllipticCurvePublicKey.from_encoded_point(ec.SECP256K1(), data)
        key = serialization.load_der_public_key(data)
    except (ValueError, TypeError, UnsupportedAlgorithm) as e:  # (a DER naming an algorithm we lack)
        raise KeyFileError(f"malformed public key of type {key_type}: {e}") from None
    if key_type == _KEY_TYPE_RSA and isinstance(key, rsa.RSAPublicKey):
        if not _RSA_BITS[0] <= key.key_size <= _RSA_BITS[1]:
            raise KeyFileError(f"RSA keys of {key.key_size} bits are not accepted ({_RSA_BITS[0]} to {_RSA_BITS[1]})")
        if key.public_numbers().e > _RSA_MAX_EXPONENT:
            # a huge exponent makes every verify a full-size exponentiation (~40x the work)
            raise KeyFileError(f"RSA public exponents above {_RSA_MAX_EXPONENT} are not accepted")
        return key
    if key_type == _KEY_TYPE_ECDSA and isinstance(key, ec.EllipticCurvePublicKey):
        return key
    raise KeyFileError(f"public key of type {key_type} holds another kind of key")


def _verify_foreign(pb: bytes, sig: bytes, msg: bytes | memoryview) -> bool:
    # (as in _foreign_key: loaded with the first key of another type)
    from cryptography.exceptions import InvalidSignature
    from cryptography.hazmat.primitives import hashes  # (as the line above)
    from cryptography.hazmat.primitives.asymmetric import ec, padding, rsa  # (as the line above)

    try:
        key = _foreign_key(pb)
        data = bytes(msg)
        if isinstance(key, rsa.RSAPublicKey):
            key.verify(sig, data, padding.PKCS1v15(), hashes.SHA256())
        else:
            key.verify(sig, data, ec.ECDSA(hashes.SHA256()))
    except (KeyFileError, InvalidSignature, ValueError, TypeError):
        return False
    return True


def verify_signature(public_key: bytes, signature: bytes, data: bytes) -> bool:
    """True when ``signature`` is a valid signature of ``data`` by ``public_key``: an Ed25519 key's
    raw bytes (checked by libsodium: lattica/_sodium.py), or another type's protobuf encoding
    (RSA PKCS#1 v1.5 or ECDSA, over SHA-256, as libp2p signs). Anything malformed is simply not
    valid."""
    try:
        key = memoryview(public_key).tobytes()  # (bytes of any buffer; an int is no key)
        sig = memoryview(signature).tobytes()
        msg = data if type(data) is bytes else memoryview(data).cast("B")
    except (TypeError, ValueError):
        return False
    if len(key) != 32:
        return _verify_foreign(key, sig, msg)  # (another key type's protobuf encoding)
    if len(sig) != 64:
        return False
    return _sodium.verifier()(key, sig, msg)


class PeerId:
    """A peer's identity: the multihash of its public key (compared and hashed by bytes)."""

    __slots__ = ("_mh", "_text", "_hash")

    def __init__(self, multihash: bytes) -> None:
        self._mh = bytes(multihash)
        self._text: str | None = None
        self._hash = hash(self._mh)

    @classmethod
    def from_public_key(cls, raw: bytes) -> PeerId:
        """PeerId of a public key (see :func:`public_key_from_protobuf`): the identity multihash
        of its protobuf encoding, or that encoding's SHA-256 when it is over 42 bytes."""
        pb = public_key_to_protobuf(raw)
        if len(pb) <= _MAX_INLINE_KEY:
            return cls(bytes([_IDENTITY_MH, len(pb)]) + pb)
        return cls(bytes([_SHA256_MH, 32]) + sha256(pb))

    @classmethod
    def from_string(cls, text: str) -> PeerId:
        """Parse the base58btc form (``12D3KooW...`` or ``Qm...``)."""
        try:
            mh = b58decode(text)
        except ValueError as e:
            raise InvalidPeerId(f"invalid PeerId {text!r}: {e}") from None
        return cls.from_bytes(mh)

    @classmethod
    def from_bytes(cls, mh: bytes) -> PeerId:
        """Parse the binary multihash form, checking its code and length."""
        mh = bytes(mh)
        try:
            code, pos = read_uvarint(mh, 0)
            length, pos = read_uvarint(mh, pos)
        except ValueError:
            raise InvalidPeerId("truncated PeerId multihash") from None
        if code not in (_IDENTITY_MH, _SHA256_MH):
            raise InvalidPeerId(f"unsupported PeerId multihash code {code:#x}")
        if len(mh) - pos != length or (code == _SHA256_MH and length != 32):
            raise InvalidPeerId("PeerId multihash length does not match its digest")
        if code == _IDENTITY_MH and length > _MAX_INLINE_KEY:
            raise InvalidPeerId("identity PeerId longer than an inlined key may be")
        return cls(mh)

    def to_bytes(self) -> bytes:
        return self._mh

    def public_key(self) -> bytes | None:
        """The public key inlined in this PeerId (see :func:`public_key_from_protobuf`), or None
        for hashed (non-inline) ids."""
        if self._mh[0] != _IDENTITY_MH:
            return None
        try:
            return public_key_from_protobuf(self._mh[2:])
        except KeyFileError:
            return None

    def matches_public_key(self, raw: bytes) -> bool:
        return PeerId.from_public_key(raw) == self

    def __str__(self) -> str:
        if self._text is None:
            self._text = b58encode(self._mh)
        return self._text

    def short(self) -> str:
        """Last 8 characters, for logs."""
        return str(self)[-8:]

    def __repr__(self) -> str:
        return f"PeerId({str(self)!r})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, PeerId) and other._mh == self._mh

    def __lt__(self, other: PeerId) -> bool:
        return self._mh < other._mh

    def __hash__(self) -> int:
        return self._hash


class KeyPair:
    """An Ed25519 key pair: signs for this node and names it (``.peer_id``)."""

    __slots__ = ("_private", "public_key", "peer_id", "_secret")

    def __init__(self, private_key: Ed25519PrivateKey) -> None:
        self._private = private_key
        self.public_key: bytes = private_key.public_key().public_bytes_raw()
        self.peer_id = PeerId.from_public_key(self.public_key)
        self._secret: bytes | None = None  # libsodium's form of the key (seed, public key), at the first signature

    @classmethod
    def generate(cls) -> KeyPair:
        """A new random key pair. An Ed25519 private key is 32 random bytes (RFC 8032 5.1.5):
        taken from the OS, they spare the process OpenSSL's random generator (~0.5 MiB)."""
        return cls(Ed25519PrivateKey.from_private_bytes(os.urandom(32)))

    @classmethod
    def from_seed(cls, seed: bytes) -> KeyPair:
        """Key pair from a 32-byte Ed25519 seed (deterministic; for tests and key derivation)."""
        if len(seed) != 32:
            raise KeyFileError("an Ed25519 seed is 32 bytes")
        return cls(Ed25519PrivateKey.from_private_bytes(seed))

    def seed(self) -> bytes:
        return self._private.private_bytes_raw()

    def sign(self, data: bytes | bytearray | memoryview) -> bytes:
        """The Ed25519 signature of ``data``: libsodium's once it is loaded (the first signature
        checked loads it), else OpenSSL's; the same bytes, libsodium's sooner."""
        sign = _sodium.signer()
        if sign is None:
            return self._private.sign(bytes(data) if type(data) is not bytes else data)
        secret = self._secret
        if secret is None:
            secret = self._secret = self.seed() + self.public_key
        return sign(secret, data)

    def public_key_protobuf(self) -> bytes:
        return public_key_to_protobuf(self.public_key)

    # -- libp2p private-key protobuf ------------------------------------------------------------

    def to_protobuf(self) -> bytes:
        """libp2p's PrivateKey protobuf; Data is seed || public key (64 bytes, as go-libp2p writes)."""
        return _encode_key_pb(_KEY_TYPE_ED25519, self.seed() + self.public_key)

    @classmethod
    def from_protobuf(cls, buf: bytes) -> KeyPair:
        key_type, data = _decode_key_pb(buf)
        if key_type != _KEY_TYPE_ED25519:
            raise KeyFileError(f"unsupported key type {key_type} (only Ed25519 is supported)")
        if len(data) not in (32, 64):
            raise KeyFileError(f"Ed25519 private key must be 32 or 64 bytes, got {len(data)}")
        kp = cls.from_seed(data[:32])
        if len(data) == 64 and data[32:] != kp.public_key:
            raise KeyFileError("Ed25519 private key file: public half does not match the seed")
        return kp

    def save(self, path: str | os.PathLike[str]) -> None:
        """Write the key file with mode 0600 (created that way, never world-readable in between)."""
        path = os.fspath(path)
        tmp = path + ".tmp"
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            try:
                os.write(fd, self.to_protobuf())
                os.fchmod(fd, 0o600)
            finally:
                os.close(fd)
            os.replace(tmp, path)
        except OSError as e:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise KeyFileError(f"cannot write key file {path}: {e.strerror or e}") from None

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> KeyPair:
        try:
            with open(path, "rb") as f:
                data = f.read()
        except OSError as e:
            raise KeyFileError(f"cannot read key file {path}: {e.strerror}") from None
        return cls.from_protobuf(data)

    @classmethod
    def load_or_create(cls, path: str | os.PathLike[str]) -> KeyPair:
        """Load the key at ``path``, or create and save a new one there if the file is absent."""
        if os.path.exists(path):
            return cls.load(path)
        kp = cls.generate()
        kp.save(path)
        return kp
