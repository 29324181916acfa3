"""Ed25519 verification through libsodium (PyNaCl's build of it): about twice as fast here as
OpenSSL's, and stricter. It refuses small-order and non-canonical keys and points; OpenSSL accepts
a forged signature of any message under a small-order key. Every signed thing a peer sends
(pub-sub bundles, CRDT envelopes, DHT and membership records, handshake payloads) is checked once
per receiver, so this is on the hot path of pub-sub and the CRDT store.

PyNaCl's public bindings take ~8 ms to import (every binding module); its compiled module alone
takes ~1.3 ms, so this reaches that directly (checked against PyNaCl 1.5 and 1.6) and falls back to
the public ``nacl.bindings`` if the module's layout ever changes. There is no third way: a node
never checks signatures more loosely than its peers do.
"""

from __future__ import annotations

import threading
from typing import Any, Callable

__all__ = ["verifier"]

_lock = threading.Lock()
_verify: Callable[[bytes, bytes, Any], bool] | None = None


def verifier() -> Callable[[bytes, bytes, Any], bool]:
    """``verify(public_key, signature, data)``, loaded at the first call (from any thread).
    The caller passes ``bytes`` of exactly 32 and 64 bytes (the C code reads 32 key bytes, and
    splits the signed message at byte 64) and any contiguous buffer as ``data``."""
    verify = _verify
    if verify is None:
        with _lock:  # (another thread may be loading it: nobody checks with a half-made verifier)
            verify = _verify or _load()
    return verify


def _load() -> Callable[[bytes, bytes, Any], bool]:
    global _verify
    try:
        from nacl._sodium import ffi, lib  # (1.3 ms: loaded at the first check)

        if lib.sodium_init() < 0:
            raise ImportError("libsodium failed to initialise")
        sign_open = lib.crypto_sign_open
        null = ffi.NULL

        def verify(public_key: bytes, signature: bytes, data: Any) -> bool:
            signed = b"".join((signature, data))
            return sign_open(null, null, signed, len(signed), public_key) == 0  # (no copy of the message out)

    except (ImportError, AttributeError):
        try:
            from nacl.bindings import crypto_sign_open  # (the public way: ~8 ms to import)
            from nacl.exceptions import BadSignatureError  # (likewise)
        except ImportError as e:
            raise ImportError(f"Lattica checks signatures with PyNaCl (libsodium), which does not load: {e}") from e

        def verify(public_key: bytes, signature: bytes, data: Any) -> bool:
            try:
                crypto_sign_open(b"".join((signature, data)), public_key)
                return True
            except BadSignatureError:
                return False

    _verify = verify
    return verify
