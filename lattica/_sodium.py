"""Ed25519 through libsodium (PyNaCl's build of it). Verification is about twice as fast here as
OpenSSL's, and stricter: it refuses small-order and non-canonical keys and points, where OpenSSL
accepts a forged signature of any message under a small-order key. Every signed thing a peer
sends (pub-sub bundles, CRDT envelopes, DHT and membership records, handshake payloads) is
checked once per receiver, so this is on the hot path of pub-sub and the CRDT store. Signing goes
through it too once the first check has loaded it (27 against OpenSSL's 47 µs here; a starting
node signs with OpenSSL rather than load it sooner); Ed25519 signatures are deterministic, so
both give the same bytes.

PyNaCl's public bindings take ~8 ms to import (every binding module); its compiled module alone
takes ~1.3 ms, so this reaches that directly (checked against PyNaCl 1.5 and 1.6) and falls back to
the public ``nacl.bindings`` if the module's layout ever changes. There is no third way: a node
never checks signatures more loosely than its peers do.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

__all__ = ["verifier", "signer"]

_lock = threading.Lock()
_verify: Callable[[bytes, bytes, Any], bool] | None = None
_sign: Callable[[bytes, Any], bytes] | None = None


def verifier() -> Callable[[bytes, bytes, Any], bool]:
    """``verify(public_key, signature, data)``, loaded at the first call (from any thread).
    The caller passes ``bytes`` of exactly 32 and 64 bytes (the C code reads 32 key bytes, and
    splits the signed message at byte 64) and any contiguous buffer as ``data``."""
    verify = _verify
    if verify is None:
        with _lock:  # (another thread may be loading it: nobody checks with a half-made verifier)
            if _verify is None:
                _load()
            verify = _verify
    return verify  # type: ignore[return-value]


def signer() -> Callable[[bytes, Any], bytes] | None:
    """``sign(secret_key, data)``: the 64-byte signature of ``data`` (any contiguous buffer) under
    libsodium's 64-byte secret key (the seed, then the public key); None until the first check
    loaded libsodium (a node that starts signs with OpenSSL rather than load it sooner)."""
    return _sign


def _load() -> None:
    global _verify, _sign
    try:
        from nacl._sodium import ffi, lib  # (1.3 ms: loaded at the first use)

        if lib.sodium_init() < 0:
            raise ImportError("libsodium failed to initialise")
        sign_open, sign_combined = lib.crypto_sign_open, lib.crypto_sign
        null, new, from_buffer, buffer = ffi.NULL, ffi.new, ffi.from_buffer, ffi.buffer

        def verify(public_key: bytes, signature: bytes, data: Any) -> bool:
            signed = b"".join((signature, data))
            return sign_open(null, null, signed, len(signed), public_key) == 0  # (no copy of the message out)

        def sign(secret_key: bytes, data: Any) -> bytes:
            if type(data) is not bytes:
                data = from_buffer(data)  # (a bytearray, or a view of one frame)
            n = len(data)
            out = new("unsigned char[]", 64 + n)  # (libsodium writes the signature, then the message)
            sign_combined(out, null, data, n, secret_key)
            return buffer(out, 64)[:]

    except (ImportError, AttributeError):
        try:
            from nacl.bindings import crypto_sign, crypto_sign_open  # (the public way: ~8 ms to import)
            from nacl.exceptions import BadSignatureError  # (likewise)
        except ImportError as e:
            raise ImportError(
                f"Lattica signs and checks signatures with PyNaCl (libsodium), which does not load: {e}"
            ) from e

        def verify(public_key: bytes, signature: bytes, data: Any) -> bool:
            try:
                crypto_sign_open(b"".join((signature, data)), public_key)
                return True
            except BadSignatureError:
                return False

        def sign(secret_key: bytes, data: Any) -> bytes:
            return crypto_sign(bytes(data), secret_key)[:64]

    _verify, _sign = verify, sign
