"""What a node keeps for a libp2p Kademlia network (issue 49), sans-IO: values others put, judged
by the network's validators, and provider records, each bounded in total and per peer.

Providers reuse :class:`lattica.dht._records.RecordStore`'s provider book (its bounds, its share for
peers outside our mesh, its ranking); values have a store of their own here, because libp2p's are
plain bytes under a key, with no subkeys, expiry or owner signature on the wire: the validator of
the key's namespace decides whether a value is valid and which of two is better.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

from lattica._identity import PeerId
from lattica.dht._libp2p_validators import Validator
from lattica.dht._records import RecordStore, StoreLimits
from lattica.errors import RecordRejected

__all__ = ["KadValue", "KadValues", "provider_book"]


@dataclass(slots=True)
class KadValue:
    value: bytes
    expires: float
    sender: PeerId
    stranger: bool = False  # the sender was outside our mesh (held in the strangers' share)


class KadValues:
    """Values others stored here: at most ``max_records`` (the oldest stored go first when full),
    ``peer_records`` per storing peer, each kept ``ttl`` seconds; a newer value replaces the held
    one only when the validator selects it. Peers outside our mesh (``member`` says who is in it;
    None: no one is a stranger) hold at most ``stranger_share`` of the store all together, as in
    our DHT's store: identities cost nothing, and without it enough of them evicted every value
    a member stored."""

    def __init__(
        self,
        validator: Validator,
        ttl: float,
        max_records: int,
        peer_records: int,
        max_value: int,
        clock: Callable[[], float] = time.time,
        member: Callable[[PeerId], bool] | None = None,
        stranger_share: float = 0.25,
    ) -> None:
        self.validator = validator
        self.ttl = ttl
        self.max_records = max_records
        self.peer_records = peer_records
        self.max_value = max_value
        self.clock = clock
        self.member = member
        self.stranger_room = max(1, int(max_records * stranger_share))
        self._values: OrderedDict[bytes, KadValue] = OrderedDict()  # oldest stored first
        self._count: dict[PeerId, int] = {}
        self._strangers = 0  # values held for strangers, all together

    def __len__(self) -> int:
        return len(self._values)

    def check(self, key: bytes, value: bytes) -> None:
        """RecordRejected unless ``value`` may be stored under ``key`` (size, then the validator)."""
        if len(value) > self.max_value:
            raise RecordRejected(f"a value of {len(value)} bytes (at most {self.max_value})")
        self.validator.validate(key, value, self.clock())

    def put(self, key: bytes, value: bytes, sender: PeerId) -> bool:
        """Validate and keep ``value``; True if it is now what we hold, False if the held one is
        better. RecordRejected (with the reason) when invalid or over a bound."""
        self.check(key, value)
        now = self.clock()
        held = self.get(key)
        if held is not None and held != value and self.validator.select(key, [held, value]) == 0:
            return False
        stranger = self.member is not None and not self.member(sender)
        old = self._values.pop(key, None)
        if old is not None:
            self._uncount(old)
        refusal = None
        if self._count.get(sender, 0) >= self.peer_records:
            refusal = f"{sender} already stored {self.peer_records} values here"
        elif stranger and self._strangers >= self.stranger_room:
            refusal = "this node's room for values of peers outside its mesh is full (members keep the rest)"
        if refusal is not None:
            if old is not None:  # (put back: the refusal changes nothing)
                self._values[key] = old
                self._counted(old)
            raise RecordRejected(refusal)
        while len(self._values) >= self.max_records:
            _, gone = self._values.popitem(last=False)
            self._uncount(gone)
        kept = self._values[key] = KadValue(value, now + self.ttl, sender, stranger)
        self._counted(kept)
        return True

    def get(self, key: bytes) -> bytes | None:
        """The live value under ``key``, if any."""
        held = self._values.get(key)
        if held is None:
            return None
        if held.expires <= self.clock():
            del self._values[key]
            self._uncount(held)
            return None
        return held.value

    def publisher(self, key: bytes) -> PeerId | None:
        """Who stored the value held under ``key`` (rust-libp2p's record publisher)."""
        held = self._values.get(key)
        return held.sender if held is not None else None

    def purge(self) -> None:
        now = self.clock()
        for key in [k for k, v in self._values.items() if v.expires <= now]:
            self._uncount(self._values.pop(key))

    def _counted(self, held: KadValue) -> None:
        self._count[held.sender] = self._count.get(held.sender, 0) + 1
        self._strangers += held.stranger

    def _uncount(self, held: KadValue) -> None:
        self._strangers -= held.stranger
        n = self._count.get(held.sender, 0) - 1
        if n > 0:
            self._count[held.sender] = n
        else:
            self._count.pop(held.sender, None)


def provider_book(local: PeerId, ttl: float, member: Callable[[PeerId], bool]) -> RecordStore:
    """A provider store for one libp2p network: :class:`RecordStore`'s, with room for IPFS's
    48-hour records (its value side stays unused)."""
    return RecordStore(StoreLimits(max_ttl=ttl), local=local, member=member)
