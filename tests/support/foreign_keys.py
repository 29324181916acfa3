"""Peers' identities of the libp2p key types we verify but never hold (RSA, secp256k1, ECDSA),
for tests: a key pair that signs as such a peer would."""

from __future__ import annotations

from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, padding, rsa

from lattica._protobuf import encode_fields

DER = {"encoding": serialization.Encoding.DER, "format": serialization.PublicFormat.SubjectPublicKeyInfo}


class Foreign:
    """A libp2p identity of another key type: what a Noise handshake asks of a key pair."""

    def __init__(self, kind: str) -> None:
        self.kind = kind
        if kind == "rsa":
            self.key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
            self.pb = encode_fields([(1, 0), (2, self.key.public_key().public_bytes(**DER))])
        elif kind == "secp256k1":
            self.key = ec.generate_private_key(ec.SECP256K1())
            point = self.key.public_key().public_bytes(
                serialization.Encoding.X962, serialization.PublicFormat.CompressedPoint
            )
            self.pb = encode_fields([(1, 2), (2, point)])
        else:
            self.key = ec.generate_private_key(ec.SECP256R1())
            self.pb = encode_fields([(1, 3), (2, self.key.public_key().public_bytes(**DER))])

    def sign(self, data: bytes) -> bytes:
        if self.kind == "rsa":
            return self.key.sign(bytes(data), padding.PKCS1v15(), hashes.SHA256())
        return self.key.sign(bytes(data), ec.ECDSA(hashes.SHA256()))

    def public_key_protobuf(self) -> bytes:
        return self.pb


KINDS = ["rsa", "secp256k1", "ecdsa"]
