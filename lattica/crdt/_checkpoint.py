"""Checkpoints: a document's state up to given chain heads, signed, so replicas can drop the
envelopes behind it and a newcomer can start from it (docs/crdt.md, "Compaction").

A checkpoint names, for every update chain it covers, the last seq and that envelope's id, and
the sha2-256 of the **canonical state**: ``pycrdt.merge_updates`` of the covered updates, which
yrs computes the same whatever the order and however the updates were merged before (so every
replica that holds the covered envelopes computes the same bytes and can check it). It carries
signatures: the proposer's, and one of every replica that checked it against its own log. Who
must have signed for a replica that cannot check it (a newcomer) to take it is the replica's
rule (the owner, or a quorum of members); here are the form, the signatures and the state's
shape.
"""

from __future__ import annotations

import hashlib
import time
from dataclasses import dataclass

import msgpack

from lattica._identity import KeyPair, PeerId, verify_signature
from lattica.crdt._envelope import MAX_AUTHOR, MAX_CERT, MAX_CERTS, MAX_NONCE, client_id
from lattica.crdt._yupdate import UpdateInfo, read_update_as_yrs
from lattica.errors import MalformedUpdate

__all__ = ["Checkpoint", "Signature", "canonical_state", "check_state", "MAX_SIGNATURES", "MAX_STATE"]

MAX_SIGNATURES = 16
MAX_HEADS = 16384  # chains a checkpoint covers (as many as a document holds)
MAX_STATE = 48 << 20  # bytes of a checkpoint's state (a document whose state is larger is not compacted)
_DOMAIN = b"lattica crdt checkpoint v1\x00"
_GROUP = 256
_sha256 = hashlib.sha256

Head = tuple[bytes, bytes, int, bytes]  # (author, nonce, seq, envelope id)


@dataclass(frozen=True, slots=True)
class Signature:
    """One replica's word that the checkpoint is its document's state at those heads; ``certs``:
    its mesh certificates (whether it was a member when it signed, ``ts`` in ms)."""

    signer: bytes
    ts: int
    certs: tuple[bytes, ...]
    sig: bytes

    @classmethod
    def from_wire(cls, s: object) -> Signature:
        """The signature ``[signer, time, certificates, signature]`` holds, or MalformedUpdate
        (its form only: whether it signs anything is checked with its checkpoint)."""
        if (
            type(s) is not list
            or len(s) != 4
            or type(s[0]) is not bytes
            or not 0 < len(s[0]) <= MAX_AUTHOR
            or type(s[1]) is not int
            or not 0 <= s[1] < 1 << 63
            or type(s[2]) is not list
            or len(s[2]) > MAX_CERTS
            or not all(type(c) is bytes and 0 < len(c) <= MAX_CERT for c in s[2])
            or type(s[3]) is not bytes
            or len(s[3]) != 64
        ):
            raise MalformedUpdate("a checkpoint's signature is [signer, time, certificates, signature]")
        return cls(s[0], s[1], tuple(s[2]), s[3])


@dataclass(frozen=True, slots=True)
class Checkpoint:
    """The state of document ``doc`` up to ``heads`` (see the module docstring)."""

    doc: bytes
    heads: tuple[Head, ...]  # sorted by chain
    state_hash: bytes
    signatures: tuple[Signature, ...] = ()

    @property
    def digest(self) -> bytes:
        """What identifies the checkpoint (and what each signature covers, with its signer)."""
        parts = [_DOMAIN, self.doc, len(self.heads).to_bytes(4, "big")]
        for a, n, s, i in self.heads:
            parts += [len(a).to_bytes(1, "big"), a, len(n).to_bytes(1, "big"), n, s.to_bytes(8, "big"), i]
        parts.append(self.state_hash)
        return _sha256(b"".join(parts)).digest()

    def covers(self) -> dict[tuple[bytes, bytes], int]:
        """Seq covered per chain."""
        return {(a, n): s for a, n, s, _ in self.heads}

    def signed(self, keys: KeyPair, certs: tuple[bytes, ...] = (), ts: int | None = None) -> Checkpoint:
        """This checkpoint with ``keys``'s signature added (once per signer)."""
        me = keys.peer_id.to_bytes()
        if any(s.signer == me for s in self.signatures):
            return self
        stamp = int(time.time() * 1000) if ts is None else ts
        sig = keys.sign(_signed(self.digest, me, stamp, certs))
        return Checkpoint(
            self.doc, self.heads, self.state_hash, self.signatures + (Signature(me, stamp, tuple(certs), sig),)
        )

    def with_signatures(self, more: list[Signature]) -> Checkpoint:
        """This checkpoint with ``more`` signatures (signers it has already are skipped)."""
        have = {s.signer for s in self.signatures}
        add: list[Signature] = []
        for s in more:
            if s.signer not in have and len(self.signatures) + len(add) < MAX_SIGNATURES:
                have.add(s.signer)
                add.append(s)
        return Checkpoint(self.doc, self.heads, self.state_hash, self.signatures + tuple(add))

    def valid_signatures(self) -> list[Signature]:
        """The signatures that verify, one per signer."""
        out, seen, digest = [], set(), self.digest
        for s in self.signatures:
            if s.signer in seen:
                continue
            try:
                key = PeerId.from_bytes(s.signer).public_key()
            except Exception:
                continue
            if key is not None and verify_signature(key, s.sig, _signed(digest, s.signer, s.ts, s.certs)):
                seen.add(s.signer)
                out.append(s)
        return out

    def to_bytes(self) -> bytes:
        return msgpack.packb(
            [
                self.doc,
                [list(h) for h in self.heads],
                self.state_hash,
                [[s.signer, s.ts, list(s.certs), s.sig] for s in self.signatures],
            ]
        )

    @classmethod
    def from_bytes(cls, raw: bytes) -> Checkpoint:
        """The checkpoint ``raw`` holds, or MalformedUpdate (nothing is checked but its form)."""
        if type(raw) is memoryview:
            raw = raw.tobytes()
        if type(raw) is not bytes or len(raw) > (MAX_HEADS + MAX_SIGNATURES) * 200:
            raise MalformedUpdate("a checkpoint is bytes of a bounded size")
        try:
            v = msgpack.unpackb(raw, max_bin_len=MAX_CERT, max_str_len=0, max_map_len=0, max_array_len=MAX_HEADS)
        except Exception as exc:
            raise MalformedUpdate(f"a checkpoint is not valid msgpack: {exc}") from None
        if type(v) is not list or len(v) != 4 or type(v[1]) is not list or type(v[3]) is not list:
            raise MalformedUpdate("a checkpoint is [doc, heads, state hash, signatures]")
        doc, heads, state_hash, sigs = v
        if type(doc) is not bytes or len(doc) != 32 or type(state_hash) is not bytes or len(state_hash) != 32:
            raise MalformedUpdate("a checkpoint's document and state hash are 32 bytes each")
        out, chains = [], set()
        for h in heads:
            if (
                type(h) is not list
                or len(h) != 4
                or type(h[0]) is not bytes
                or not 0 < len(h[0]) <= MAX_AUTHOR
                or type(h[1]) is not bytes
                or not 0 < len(h[1]) <= MAX_NONCE
                or type(h[2]) is not int
                or not 0 < h[2] < 1 << 63
                or type(h[3]) is not bytes
                or len(h[3]) != 32
            ):
                raise MalformedUpdate("a checkpoint's head is [author, nonce, seq, envelope id]")
            chains.add((h[0], h[1]))
            out.append((h[0], h[1], h[2], h[3]))
        if len(chains) != len(out) or out != sorted(out):
            raise MalformedUpdate("a checkpoint's heads are one per chain, in order")
        if len(sigs) > MAX_SIGNATURES:
            raise MalformedUpdate(f"a checkpoint carries at most {MAX_SIGNATURES} signatures")
        signatures = tuple(Signature.from_wire(s) for s in sigs)
        return cls(doc, tuple(out), state_hash, signatures)


def _signed(digest: bytes, signer: bytes, ts: int, certs: tuple[bytes, ...]) -> bytes:
    parts = [
        _DOMAIN,
        digest,
        len(signer).to_bytes(1, "big"),
        signer,
        ts.to_bytes(8, "big"),
        len(certs).to_bytes(1, "big"),
    ]
    parts += [len(c).to_bytes(2, "big") + c for c in certs]
    return b"".join(parts)


def canonical_state(updates: list[bytes]) -> bytes:
    """The one encoding of what ``updates`` hold together (a previous canonical state may be
    among them): yrs merges without applying, the same bytes whatever the order or grouping.
    Merged in groups of ``_GROUP`` (one merge of n updates takes time growing faster than n:
    10,000 small ones take ~0.4 s at once, ~20 ms in groups)."""
    import pycrdt  # (the rules load without pycrdt: it comes with the first document)

    level = list(updates)
    while len(level) > _GROUP:
        level = [pycrdt.merge_updates(*level[i : i + _GROUP], b"\x00\x00") for i in range(0, len(level), _GROUP)]
    return pycrdt.merge_updates(*level, b"\x00\x00")


def check_state(cp: Checkpoint, state: bytes) -> tuple[str, UpdateInfo | None]:
    """Whether ``state`` may be ``cp``'s, as far as it can be told without the envelopes: its
    hash, items only under the covered chains' client ids from clock 0, and nothing named that
    it does not hold. ``(why not, "" if it may; what it holds)``."""
    if len(state) > MAX_STATE:
        return f"a checkpoint's state is at most {MAX_STATE} bytes", None
    if _sha256(state).digest() != cp.state_hash:
        return "the state is not the one the checkpoint names", None
    try:
        info = read_update_as_yrs(state)
    except MalformedUpdate as exc:
        return f"malformed state: {exc}", None
    if canonical_state([state]) != state:
        return "the state is not in its canonical form", None  # (an honest one is a merge's output)
    clients = {client_id(cp.doc, a, n) for a, n, _, _ in cp.heads}
    for c, (start, _) in info.structs.items():
        if c not in clients:
            return "the state holds items of a chain it does not cover", None
        if start != 0:
            return "the state's items do not start at clock 0", None
    for c, k in info.needs.items():
        if k > info.structs.get(c, (0, 0))[1]:
            return "the state names items it does not hold", None
    return "", info
