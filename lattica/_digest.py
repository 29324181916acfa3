"""SHA-256 and HMAC-SHA-256 through cryptography, whose OpenSSL a node loads anyway for its keys.

``hashlib`` would load Python's own OpenSSL binding as well: about 0.6 MiB more resident memory
in every node for the same two functions, which are never on the per-call path (node ids, ring
positions, the Noise handshake)."""

from __future__ import annotations

from cryptography.hazmat.primitives import hashes, hmac

__all__ = ["sha256", "hmac_sha256"]

_SHA256 = hashes.SHA256()


def sha256(data: bytes) -> bytes:
    """The SHA-256 digest of ``data``."""
    h = hashes.Hash(_SHA256)
    h.update(data)
    return h.finalize()


def hmac_sha256(key: bytes, data: bytes) -> bytes:
    """HMAC-SHA-256 of ``data`` under ``key``."""
    h = hmac.HMAC(key, _SHA256)
    h.update(data)
    return h.finalize()
