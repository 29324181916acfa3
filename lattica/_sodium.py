"""Ed25519 verification through libsodium (PyNaCl's build of it), about twice as fast here as
OpenSSL's, and stricter: it also refuses small-order and non-canonical keys and points, which no
honestly made key or signature is. Every signed thing a peer sends (pub-sub bundles, CRDT
envelopes, DHT and membership records, handshake payloads) is checked once per receiver, so this
is on the hot path of pub-sub and the CRDT store.

PyNaCl's public bindings take ~8 ms to import (every binding module); the compiled module alone
takes ~1.3 ms, so this reaches it directly (checked against PyNaCl 1.5 and 1.6) and loads it at
the first verification. Without it (no wheel for the platform, a changed module), ``load()``
gives None and lattica.identity uses the ``cryptography`` package's verifier instead.
"""

from __future__ import annotations

from typing import Any, Callable

__all__ = ["load"]

_loaded = False
_verify: Callable[[bytes, Any, Any], bool] | None = None


def load() -> Callable[[bytes, Any, Any], bool] | None:
    """``verify(public_key, signature, data)`` through libsodium, or None if it cannot load.
    The caller checks that the key is 32 bytes and the signature 64 (the C code reads exactly
    that many from the key's buffer, and splits the signed message at byte 64)."""
    global _loaded, _verify
    if _loaded:
        return _verify
    _loaded = True
    try:
        from nacl._sodium import ffi, lib  # (1.3 ms: loaded at the first verification)

        if lib.sodium_init() < 0:
            return None
        sign_open = lib.crypto_sign_open
        alloc = ffi.new_allocator(should_clear_after_alloc=False)
    except (ImportError, AttributeError):
        return None

    def verify(public_key: bytes, signature: Any, data: Any) -> bool:
        signed = b"".join((signature, data))
        out = alloc("unsigned char[]", len(signed))
        return sign_open(out, alloc("unsigned long long *"), signed, len(signed), public_key) == 0

    _verify = verify
    return verify
