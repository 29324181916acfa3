"""A bundle: the messages an author published to one topic in one go, under one signature.

The author signs the list of its messages' digests (sha2-256 of each one's data), so one Ed25519
signature covers up to ``MAX_ITEMS`` messages and a receiver verifies it once, not once per
message. Any holder may leave items out (its validator ignored them) by sending an item's digest
in place of its data: what remains is still the author's, and still verifiable. Item ``i``'s
seqno is the bundle's plus ``i``.

On the wire a bundle's items are a list whose entries are the data (bytes) or, for an item left
out, ``[digest]``. A message id covers the author, the seqno, the signed digests, the signature
and which items were left out (``digest``): the same items from any peer are one message, and a
copy with items removed by someone is another (it can never hide the whole one).
"""

from __future__ import annotations

import hashlib
from typing import Any

from lattica.errors import ProtocolError

__all__ = ["Bundle", "MAX_ITEMS", "DIGEST"]

MAX_ITEMS = 256  # messages one bundle holds
DIGEST = 32  # bytes of an item's digest
_DOMAIN = b"lattica pubsub v2\x00"
_sha256 = hashlib.sha256


class Bundle:
    """The items of one signed bundle (data, or ``None`` where left out) and their digests."""

    __slots__ = ("items", "leaves", "root", "size", "_wire")

    def __init__(self, items: tuple, leaves: tuple[bytes, ...]) -> None:
        self.items = items
        self.leaves = leaves
        self.root = _sha256(b"".join(leaves)).digest()
        self.size = sum(len(d) for d in items if d is not None)
        self._wire: list | None = None

    @classmethod
    def of(cls, bodies: list[bytes]) -> Bundle:
        """A whole bundle of ``bodies`` (an author's, about to be signed)."""
        return cls(tuple(bodies), tuple(_sha256(b).digest() for b in bodies))

    @classmethod
    def from_wire(cls, raw: Any, max_data: int) -> Bundle:
        """The bundle a peer's item list names, or ProtocolError."""
        if type(raw) is not list or not 0 < len(raw) <= MAX_ITEMS:
            raise ProtocolError(f"a message's items are a list of 1 to {MAX_ITEMS}")
        items: list = []
        leaves: list = []
        size = 0
        for i, item in enumerate(raw):
            if type(item) is memoryview:  # (large data arrives out of band, as a view of the frame)
                if item.nbytes + size > max_data:
                    raise ProtocolError(f"a message's data is at most {max_data} bytes")
                item = raw[i] = item.tobytes()
            if type(item) is bytes:
                size += len(item)
                items.append(item)
                leaves.append(_sha256(item).digest())
            elif type(item) is list and len(item) == 1 and type(item[0]) is bytes and len(item[0]) == DIGEST:
                items.append(None)
                leaves.append(item[0])
            else:
                raise ProtocolError(f"a message's item is its data (bytes) or [its {DIGEST}-byte digest]")
            if size > max_data:
                raise ProtocolError(f"a message's data is at most {max_data} bytes")
        if len(items) == items.count(None):
            raise ProtocolError("a message carries at least one item's data")
        b = cls(tuple(items), tuple(leaves))
        b._wire = raw
        return b

    def wire(self) -> list:
        if self._wire is None:
            self._wire = [d if d is not None else [leaf] for d, leaf in zip(self.items, self.leaves)]
        return self._wire

    def keeping(self, keep: list[int]) -> Bundle:
        """This bundle with only the items at ``keep`` (the others by their digests)."""
        wanted = set(keep)
        b = Bundle.__new__(Bundle)
        b.items = tuple(d if i in wanted else None for i, d in enumerate(self.items))
        b.leaves = self.leaves
        b.root = self.root
        b.size = sum(len(d) for d in b.items if d is not None)
        b._wire = None
        return b

    def present(self) -> list[int]:
        return [i for i, d in enumerate(self.items) if d is not None]

    def signed_bytes(self, topic: str, author: bytes, seqno: int) -> bytes:
        """What the author signs: the domain, each field with its length (no field can be shifted
        into another), then the items' digests in order."""
        t = topic.encode()
        return b"".join((_DOMAIN, len(t).to_bytes(2, "big"), t, len(author).to_bytes(1, "big"), author, seqno.to_bytes(8, "big"),
                         len(self.leaves).to_bytes(2, "big"), *self.leaves))

    def digest(self, signature: bytes) -> bytes:
        """What a message id covers besides the author and seqno (see the module docstring)."""
        h = _sha256(self.root)
        h.update(signature)
        if None in self.items:
            h.update(bytes(0 if d is None else 1 for d in self.items))
        return h.digest()
