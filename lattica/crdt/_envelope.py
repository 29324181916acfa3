"""The signed envelope every change of a document travels and is stored in (docs/crdt.md).

An author's changes to a document form a **chain**: envelopes numbered 1, 2, 3, ... each naming
the hash of the one before, all signed by the author. A chain is one session of writing (an
author that restarts with its log continues its chain; one that lost it starts another, under a
new nonce), and its Yjs items carry one CRDT client id, derived from the document, the author and
the chain's nonce: nobody else can write under it. Two kinds:

- ``UPDATE``: a Yjs update (what the author changed), with ``deps``, the clocks of the other
  clients the author's document held when it made the change (a replica applies it once it holds
  as much), and the author's mesh certificates (who may write a mesh document).
- ``ACL``: the owner's writers list, version ``seq`` of the owner's ACL chain (nonce ``b""``),
  with the **cuts** of writers it removed: how far each of their chains still counts.

On the wire and on disk an envelope is a msgpack list; it is parsed strictly
(:class:`lattica.errors.MalformedUpdate`), and its id is the sha2-256 of what was signed and the
signature, so two envelopes that differ in anything are two.
"""

from __future__ import annotations

import hashlib
import time
from dataclasses import dataclass, field
from typing import Any

import msgpack

from lattica._identity import KeyPair, PeerId, verify_signature
from lattica.errors import MalformedUpdate

__all__ = [
    "Envelope",
    "Acl",
    "UPDATE",
    "ACL",
    "GENESIS",
    "doc_id",
    "client_id",
    "sign",
    "sign_acl",
    "MAX_ENVELOPE",
    "MAX_DEPS",
    "MAX_WRITERS",
]

UPDATE, ACL = 0, 1
GENESIS = bytes(32)  # the "previous hash" of a chain's first envelope
MAX_ENVELOPE = 8 << 20  # bytes of one encoded envelope (a replica's own limit on updates is lower)
MAX_DEPS = 16384  # clients an update may name (as many as a document's chains)
MAX_WRITERS = 1024  # PeerIds on a writers list
MAX_CUTS = 4096  # removed writers' chains an ACL still counts
MAX_CERTS = 4
MAX_CERT = 1024
MAX_NONCE = 16
MAX_AUTHOR = 64
_DOMAIN = b"lattica crdt v1\x00"
_CLIENT_BITS = 53  # Yjs client ids stay within JavaScript's safe integers
_sha256 = hashlib.sha256


def doc_id(name: str, owner: PeerId | None) -> bytes:
    """A document's id: its name and owner (none for a mesh document). Two owners' documents of
    one name are two documents."""
    n = name.encode()
    o = owner.to_bytes() if owner is not None else b""
    return _sha256(b"lattica crdt doc\x00" + len(n).to_bytes(2, "big") + n + o).digest()


def client_id(doc: bytes, author: bytes, nonce: bytes) -> int:
    """The Yjs client id of chain ``(author, nonce)`` in ``doc``: derived, so an author cannot
    claim another's, nor grind one (53 bits of sha2-256)."""
    h = _sha256(b"lattica crdt client\x00" + doc + len(author).to_bytes(1, "big") + author + nonce).digest()
    return (int.from_bytes(h[:8], "big") >> (64 - _CLIENT_BITS)) or 1


@dataclass(frozen=True, slots=True)
class Acl:
    """An ACL envelope's body: who may write, and the chains of removed writers that still
    count up to a sequence number (``cuts[(author, nonce)] = last seq``)."""

    writers: frozenset[bytes] = frozenset()
    cuts: dict[tuple[bytes, bytes], int] = field(default_factory=dict)

    def encode(self) -> bytes:
        return msgpack.packb([sorted(self.writers), [[a, n, s] for (a, n), s in sorted(self.cuts.items())]])

    @classmethod
    def decode(cls, body: bytes) -> Acl:
        try:
            raw = msgpack.unpackb(
                body, max_bin_len=MAX_AUTHOR, max_array_len=max(MAX_WRITERS, MAX_CUTS), max_map_len=0, max_str_len=0
            )
        except Exception as exc:
            raise MalformedUpdate(f"an ACL is not valid msgpack: {exc}") from None
        if type(raw) is not list or len(raw) != 2 or type(raw[0]) is not list or type(raw[1]) is not list:
            raise MalformedUpdate("an ACL is [writers, cuts]")
        if len(raw[0]) > MAX_WRITERS or not all(type(w) is bytes and 0 < len(w) <= MAX_AUTHOR for w in raw[0]):
            raise MalformedUpdate(f"an ACL's writers are at most {MAX_WRITERS} PeerIds")
        cuts: dict[tuple[bytes, bytes], int] = {}
        for c in raw[1]:
            if (
                type(c) is not list
                or len(c) != 3
                or type(c[0]) is not bytes
                or type(c[1]) is not bytes
                or len(c[1]) > MAX_NONCE
                or type(c[2]) is not int
                or not 0 <= c[2] < 1 << 63
            ):
                raise MalformedUpdate("an ACL's cut is [author, nonce, seq]")
            cuts[(c[0], c[1])] = c[2]
        if len(cuts) > MAX_CUTS:
            raise MalformedUpdate(f"an ACL counts at most {MAX_CUTS} cuts")
        return cls(frozenset(raw[0]), cuts)


@dataclass(frozen=True, slots=True)
class Envelope:
    """One signed change of a document (see the module docstring)."""

    kind: int
    doc: bytes
    author: bytes
    nonce: bytes
    seq: int
    prev: bytes
    ts: int  # milliseconds since the epoch, when the author signed
    deps: tuple[tuple[int, int], ...]
    body: bytes
    certs: tuple[bytes, ...]
    sig: bytes
    id: bytes = b""

    def signed_bytes(self) -> bytes:
        return _signed(
            self.kind, self.doc, self.author, self.nonce, self.seq, self.prev, self.ts, self.deps, self.body, self.certs
        )

    def to_bytes(self) -> bytes:
        return msgpack.packb(
            [
                self.kind,
                self.doc,
                self.author,
                self.nonce,
                self.seq,
                self.prev,
                self.ts,
                [c for d in self.deps for c in d],
                self.body,
                list(self.certs),
                self.sig,
            ]
        )

    @property
    def chain(self) -> tuple[bytes, bytes]:
        return (self.author, self.nonce)

    @property
    def client(self) -> int:
        return client_id(self.doc, self.author, self.nonce)

    @property
    def size(self) -> int:
        """About the bytes it takes, on the wire and on disk."""
        return len(self.body) + 16 * len(self.deps) + sum(len(c) for c in self.certs) + 200

    def verify(self) -> bool:
        """Whether the signature is the author's (the author's PeerId holds its key)."""
        try:
            key = PeerId.from_bytes(self.author).public_key()
        except Exception:
            return False
        return key is not None and verify_signature(key, self.sig, self.signed_bytes())

    @classmethod
    def from_bytes(cls, raw: bytes | memoryview, max_body: int = MAX_ENVELOPE) -> Envelope:
        """The envelope ``raw`` holds, or MalformedUpdate (nothing is checked but its form)."""
        if len(raw) > MAX_ENVELOPE:
            raise MalformedUpdate(f"an envelope is at most {MAX_ENVELOPE} bytes")
        try:
            v = msgpack.unpackb(raw, max_bin_len=MAX_ENVELOPE, max_str_len=0, max_map_len=0, max_array_len=2 * MAX_DEPS)
        except Exception as exc:
            raise MalformedUpdate(f"an envelope is not valid msgpack: {exc}") from None
        if type(v) is not list or len(v) != 11:
            raise MalformedUpdate("an envelope is a list of 11 fields")
        kind, doc, author, nonce, seq, prev, ts, deps, body, certs, sig = v
        if kind not in (UPDATE, ACL) or type(kind) is not int:
            raise MalformedUpdate(f"unknown envelope kind {kind!r}")
        if type(doc) is not bytes or len(doc) != 32 or type(prev) is not bytes or len(prev) != 32:
            raise MalformedUpdate("an envelope's document and previous hash are 32 bytes each")
        if type(author) is not bytes or not 0 < len(author) <= MAX_AUTHOR:
            raise MalformedUpdate("an envelope's author is a PeerId's bytes")
        if type(nonce) is not bytes or len(nonce) > MAX_NONCE or (kind == ACL) != (nonce == b""):
            raise MalformedUpdate(f"an update's chain nonce is 1 to {MAX_NONCE} bytes (an ACL's is empty)")
        if type(seq) is not int or not 0 < seq < 1 << 63 or type(ts) is not int or not 0 <= ts < 1 << 63:
            raise MalformedUpdate("an envelope's seq and time are positive 63-bit integers")
        if (
            type(deps) is not list
            or len(deps) % 2
            or len(deps) > 2 * MAX_DEPS
            or not all(type(x) is int and 0 <= x < 1 << 63 for x in deps)
        ):
            raise MalformedUpdate(f"an envelope's deps are at most {MAX_DEPS} (client, clock) pairs")
        if kind == ACL and deps:
            raise MalformedUpdate("an ACL has no deps")
        if type(body) is not bytes or len(body) > max_body:
            raise MalformedUpdate(f"an envelope's body is at most {max_body} bytes")
        if (
            type(certs) is not list
            or len(certs) > MAX_CERTS
            or not all(type(c) is bytes and 0 < len(c) <= MAX_CERT for c in certs)
        ):
            raise MalformedUpdate(f"an envelope's certificates are at most {MAX_CERTS} of at most {MAX_CERT} bytes")
        if type(sig) is not bytes or len(sig) != 64:
            raise MalformedUpdate("an envelope's signature is 64 bytes")
        pairs = tuple(zip(deps[::2], deps[1::2]))
        return _make(kind, doc, author, nonce, seq, prev, ts, pairs, body, tuple(certs), sig)


def _make(
    kind: int,
    doc: bytes,
    author: bytes,
    nonce: bytes,
    seq: int,
    prev: bytes,
    ts: int,
    deps: tuple,
    body: bytes,
    certs: tuple,
    sig: bytes,
) -> Envelope:
    signed = _signed(kind, doc, author, nonce, seq, prev, ts, deps, body, certs)
    return Envelope(kind, doc, author, nonce, seq, prev, ts, deps, body, certs, sig, _sha256(signed + sig).digest())


def _signed(
    kind: int,
    doc: bytes,
    author: bytes,
    nonce: bytes,
    seq: int,
    prev: bytes,
    ts: int,
    deps: tuple,
    body: bytes,
    certs: tuple,
) -> bytes:
    """What the author signs: the domain, then every field with its length (none can be shifted
    into another)."""
    parts = [
        _DOMAIN,
        bytes((kind,)),
        doc,
        len(author).to_bytes(1, "big"),
        author,
        len(nonce).to_bytes(1, "big"),
        nonce,
        seq.to_bytes(8, "big"),
        prev,
        ts.to_bytes(8, "big"),
        len(deps).to_bytes(4, "big"),
    ]
    parts += [c.to_bytes(8, "big") + k.to_bytes(8, "big") for c, k in deps]
    parts += [len(body).to_bytes(4, "big"), _sha256(body).digest(), len(certs).to_bytes(1, "big")]
    parts += [len(c).to_bytes(2, "big") + c for c in certs]
    return b"".join(parts)


def sign(
    keys: KeyPair,
    doc: bytes,
    nonce: bytes,
    seq: int,
    prev: bytes,
    deps: dict[int, int],
    update: bytes,
    certs: tuple[bytes, ...] = (),
    ts: int | None = None,
) -> Envelope:
    """An UPDATE envelope signed by ``keys``."""
    author = keys.peer_id.to_bytes()
    pairs = tuple(sorted(deps.items()))
    stamp = int(time.time() * 1000) if ts is None else ts
    sig = keys.sign(_signed(UPDATE, doc, author, nonce, seq, prev, stamp, pairs, update, certs))
    return _make(UPDATE, doc, author, nonce, seq, prev, stamp, pairs, update, certs, sig)


def sign_acl(keys: KeyPair, doc: bytes, version: int, prev: bytes, acl: Acl, ts: int | None = None) -> Envelope:
    """Version ``version`` of ``doc``'s writers list, signed by its owner ``keys``."""
    author = keys.peer_id.to_bytes()
    body = acl.encode()
    stamp = int(time.time() * 1000) if ts is None else ts
    sig = keys.sign(_signed(ACL, doc, author, b"", version, prev, stamp, (), body, ()))
    return _make(ACL, doc, author, b"", version, prev, stamp, (), body, (), sig)


def decode_any(raw: Any, max_body: int) -> Envelope:
    """An envelope from what a peer sent (bytes), or MalformedUpdate."""
    if type(raw) is memoryview:
        raw = raw.tobytes()
    if type(raw) is not bytes:
        raise MalformedUpdate("an envelope travels as bytes")
    return Envelope.from_bytes(raw, max_body)
