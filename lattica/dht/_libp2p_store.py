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


class KadValues:
    """Values others stored here: at most ``max_records`` (the oldest stored go first when full),
    ``peer_records`` per storing peer, each kept ``ttl`` seconds; a newer value replaces the held
    one only when the validator selects it."""

    def __init__(
        self,
        validator: Validator,
        ttl: float,
        max_records: int,
        peer_records: int,
        max_value: int,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.validator = validator
        self.ttl = ttl
        self.max_records = max_records
        self.peer_records = peer_records
        self.max_value = max_value
        self.clock = clock
        self._values: OrderedDict[bytes, KadValue] = OrderedDict()  # oldest stored first
        self._count: dict[PeerId, int] = {}

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
        old = self._values.pop(key, None)
        if old is not None:
            self._uncount(old.sender)
        if self._count.get(sender, 0) >= self.peer_records:
            if old is not None:  # (put back: the refusal changes nothing)
                self._values[key] = old
                self._count[old.sender] = self._count.get(old.sender, 0) + 1
            raise RecordRejected(f"{sender} already stored {self.peer_records} values here")
        while len(self._values) >= self.max_records:
            _, gone = self._values.popitem(last=False)
            self._uncount(gone.sender)
        self._values[key] = KadValue(value, now + self.ttl, sender)
        self._count[sender] = self._count.get(sender, 0) + 1
        return True

    def get(self, key: bytes) -> bytes | None:
        """The live value under ``key``, if any."""
        held = self._values.get(key)
        if held is None:
            return None
        if held.expires <= self.clock():
            del self._values[key]
            self._uncount(held.sender)
            return None
        return held.value

    def publisher(self, key: bytes) -> PeerId | None:
        """Who stored the value held under ``key`` (rust-libp2p's record publisher)."""
        held = self._values.get(key)
        return held.sender if held is not None else None

    def purge(self) -> None:
        now = self.clock()
        for key in [k for k, v in self._values.items() if v.expires <= now]:
            self._uncount(self._values.pop(key).sender)

    def _uncount(self, sender: PeerId) -> None:
        n = self._count.get(sender, 0) - 1
        if n > 0:
            self._count[sender] = n
        else:
            self._count.pop(sender, None)


def provider_book(local: PeerId, ttl: float, member: Callable[[PeerId], bool]) -> RecordStore:
    """A provider store for one libp2p network: :class:`RecordStore`'s, with room for IPFS's
    48-hour records (its value side stays unused)."""
    return RecordStore(StoreLimits(max_ttl=ttl), local=local, member=member)
