"""The ``checkpoints`` system actor: copies of supervised actors' latest checkpoints.

A supervisor keeps its children's latest checkpoints in memory, and placement keeps a
checkpointed child off the supervisor's node. A copy on a third node covers what that cannot:
the supervisor's own node dying (its parent restarts it elsewhere and it finds the copies), or a
child that had to share the supervisor's node. Copies are encoded bytes (never unpickled), keyed
by the child's stable name, newest stamp wins, and bounded: total bytes, bytes per writing peer,
and an expiry one hour after the last write.

Which node holds a name's copy needs no directory: both the writer and a later reader rank the
alive members by a hash of (name, member) (rendezvous hashing) and use the first ones.
"""

from __future__ import annotations

import collections
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

from lattica.digest import sha256
from lattica.errors import CheckpointRejected
from lattica.runtime import ASYNC, ActorRef, current_caller

if TYPE_CHECKING:
    from lattica.identity import PeerId
    from lattica.runtime import Runtime

MAX_BYTES = 256 << 20  # all copies held on one node
MAX_BYTES_PER_WRITER = 64 << 20  # copies written by one peer
MAX_NAME = 512
EXPIRY = 3600.0  # seconds after the last write


def checkpoints_ref(peer: PeerId) -> ActorRef:
    return ActorRef(peer, CheckpointStore.NAME, {"keep": ASYNC, "fetch": ASYNC, "drop": ASYNC})


def ranked(name: str, members: list[str]) -> list[str]:
    """``members`` (peer ids) in the order a checkpoint of ``name`` prefers them."""
    return sorted(members, key=lambda m: sha256(f"{name}\0{m}".encode()))


@dataclass
class _Copy:
    stamp: float
    blob: bytes
    writer: str
    expires: float


class CheckpointStore:
    """What peers may call: keep, fetch and drop the copy of one name's checkpoint."""

    NAME = "checkpoints"

    def __init__(self, runtime: Runtime, max_bytes: int = MAX_BYTES, max_per_writer: int = MAX_BYTES_PER_WRITER) -> None:
        self._rt = runtime
        self.max_bytes = max_bytes
        self.max_per_writer = max_per_writer
        self._copies: dict[str, _Copy] = {}
        self._by_writer: collections.Counter[str] = collections.Counter()
        self.total = 0

    async def keep(self, name: str, stamp: float, blob: bytes) -> bool:
        """Hold ``blob`` as the checkpoint of ``name`` unless a newer one is held; False if older."""
        if type(name) is not str or not 0 < len(name) <= MAX_NAME or type(stamp) is not float or type(blob) is not bytes:
            raise CheckpointRejected("keep takes a name (1-512 characters), a float stamp and bytes")
        writer = str(current_caller() or self._rt.peer_id)
        now = time.monotonic()
        self._expire(now)
        old = self._copies.get(name)
        if old is not None and old.stamp >= stamp:
            return False
        freed_total = len(old.blob) if old is not None else 0
        freed_writer = freed_total if old is not None and old.writer == writer else 0
        if self._by_writer[writer] - freed_writer + len(blob) > self.max_per_writer:
            raise CheckpointRejected(f"over the {self.max_per_writer} bytes of checkpoints one peer may keep here")
        if self.total - freed_total + len(blob) > self.max_bytes:
            raise CheckpointRejected(f"this node holds its maximum of {self.max_bytes} bytes of checkpoints")
        if old is not None:
            self._forget(name)
        self._copies[name] = _Copy(stamp, blob, writer, now + EXPIRY)
        self._by_writer[writer] += len(blob)
        self.total += len(blob)
        return True

    async def fetch(self, name: str) -> list | None:
        """``[stamp, blob]`` of the copy held for ``name``, or None."""
        if type(name) is not str:
            raise CheckpointRejected("fetch takes a name")
        self._expire(time.monotonic())
        c = self._copies.get(name)
        return [c.stamp, c.blob] if c is not None else None

    async def drop(self, name: str) -> None:
        """Forget the copy of ``name`` (its child was terminated for good)."""
        if type(name) is str and name in self._copies:
            self._forget(name)

    def _forget(self, name: str) -> None:
        c = self._copies.pop(name)
        self._by_writer[c.writer] -= len(c.blob)
        if self._by_writer[c.writer] <= 0:
            del self._by_writer[c.writer]
        self.total -= len(c.blob)

    def _expire(self, now: float) -> None:
        for name in [n for n, c in self._copies.items() if c.expires <= now]:
            self._forget(name)


def members(runtime: Runtime) -> list[str]:
    """This node and the members membership holds alive (what copies may be placed on)."""
    me = str(runtime.peer_id)
    ms = runtime.services.get("membership")
    if ms is None:
        return [me]
    return [me, *(m.id for m in ms.core.alive())]
