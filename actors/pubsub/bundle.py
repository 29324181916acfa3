"""A bundle: the messages an author published to one topic in one go, under one signature.

The author signs the list of its messages' digests (sha2-256 of each one's data), so one Ed25519
signature covers up to ``MAX_ITEMS`` messages and a receiver verifies it once, not once per
message. Item ``i``'s seqno is the bundle's plus ``i``. A bundle travels whole: on the wire its
items are a list of the data (bytes), and a message id covers the author, the seqno, the
hash of all the author signed (the topic, the items' digests, the certificates, the flood set)
and the signature (``digest``), so a copy that differs in anything is another message. The author's mesh certificates (none in an open mesh or one of listed members) travel
with it and are signed with it: a receiver that never met the author can tell it is a member,
and nobody can strip them. So does its flood set, when it names one (the peers it sent the bundle
to itself: ``lattica.pubsub._router``), so nobody can add a peer to it and cut that peer off from
its forwarders.
"""

from __future__ import annotations

import hashlib
from typing import Any

from lattica.errors import ProtocolError

__all__ = ["Bundle", "MAX_ITEMS"]

MAX_ITEMS = 256  # messages one bundle holds
MAX_CERTS = 4  # mesh certificates of the author (lattica.trust.MAX_PRESENTED)
MAX_CERT = 1024  # bytes of one
MAX_FLOODED = 64  # tags in a flood set (GossipParams.max_flood_set)
TAG = 8  # bytes of one
_DOMAIN = b"lattica pubsub v2\x00"
_DOMAIN_FLOODED = b"lattica pubsub v3\x00"  # (a bundle that names a flood set)
_sha256 = hashlib.sha256


class Bundle:
    """The items (data) of one signed bundle and their digests."""

    __slots__ = ("items", "certs", "flooded", "leaves", "root", "size", "count", "_signed")

    def __init__(self, items: list[bytes], certs: list[bytes] | tuple = (), flooded: list[bytes] | tuple = ()) -> None:
        self.items = items
        self.certs = certs
        self.flooded = flooded
        self.leaves = [_sha256(d).digest() for d in items]
        self.root = _sha256(b"".join(self.leaves)).digest()
        self.size = sum(len(d) for d in items)
        self.count = len(items)
        self._signed: tuple[tuple, bytes] | None = None  # (topic, author, seqno) and what they sign

    @classmethod
    def from_wire(cls, raw: Any, max_data: int, certs: Any = (), flooded: Any = ()) -> Bundle:
        """The bundle a peer's item list (its author's certificates, its flood set) name, or
        ProtocolError."""
        if certs != () and (
            type(certs) is not list
            or len(certs) > MAX_CERTS
            or not all(type(c) is bytes and 0 < len(c) <= MAX_CERT for c in certs)
        ):
            raise ProtocolError(
                f"an author's certificates are a list of at most {MAX_CERTS} byte strings of at most {MAX_CERT} bytes"
            )
        if flooded != () and (
            type(flooded) is not list
            or not 0 < len(flooded) <= MAX_FLOODED
            or not all(type(t) is bytes and len(t) == TAG for t in flooded)
        ):
            raise ProtocolError(f"a flood set is a list of 1 to {MAX_FLOODED} tags of {TAG} bytes")
        if type(raw) is not list or not 0 < len(raw) <= MAX_ITEMS:
            raise ProtocolError(f"a message's items are a list of 1 to {MAX_ITEMS}")
        size = 0
        for i, item in enumerate(raw):
            if type(item) is memoryview:  # (large data arrives out of band, as a view of the frame)
                if item.nbytes + size > max_data:
                    raise ProtocolError(f"a message's data is at most {max_data} bytes")
                item = raw[i] = item.tobytes()
            if type(item) is not bytes:
                raise ProtocolError("a message's items are bytes")
            size += len(item)
            if size > max_data:
                raise ProtocolError(f"a message's data is at most {max_data} bytes")
        return cls(raw, certs, flooded)

    def wire(self) -> list[bytes]:
        return self.items

    def signed_bytes(self, topic: str, author: bytes, seqno: int) -> bytes:
        """What the author signs: the domain, each field with its length (no field can be shifted
        into another), the items' digests in order, its certificates, then its flood set's tags
        (under another domain, so a bundle without one signs as it always did)."""
        key = (topic, author, seqno)
        if self._signed is not None and self._signed[0] == key:
            return self._signed[1]
        t = topic.encode()
        certs = [b for c in self.certs for b in (len(c).to_bytes(2, "big"), c)]
        parts = [
            _DOMAIN_FLOODED if self.flooded else _DOMAIN,
            len(t).to_bytes(2, "big"),
            t,
            len(author).to_bytes(1, "big"),
            author,
            seqno.to_bytes(8, "big"),
            len(self.leaves).to_bytes(2, "big"),
            *self.leaves,
            len(self.certs).to_bytes(1, "big"),
            *certs,
        ]
        if self.flooded:
            parts += [len(self.flooded).to_bytes(1, "big"), *self.flooded]
        signed = b"".join(parts)
        self._signed = (key, signed)
        return signed

    def digest(self, topic: str, author: bytes, seqno: int, signature: bytes) -> bytes:
        """What a message id covers besides the author and seqno: the hash of everything signed
        (``signed_bytes``: the topic, the items' digests, the certificates, the flood set, each
        with its length), then the signature. A copy changed on the way in anything is another
        message, refused on its own: it cannot get the author's copy refused as a duplicate."""
        return _sha256(_sha256(self.signed_bytes(topic, author, seqno)).digest() + signature).digest()
