"""The ``checkpoints`` system actor: copies of supervised actors' latest checkpoints.

A supervisor keeps its children's latest checkpoints in memory, and placement keeps a
checkpointed child off the supervisor's node. A copy on a third node covers what that cannot:
the supervisor's own node dying (its parent restarts it elsewhere and it finds the copies), or a
child that had to share the supervisor's node. Copies are encoded bytes (never unpickled), kept
per (child's stable name, writer): each writer's newest stamp wins in its own slot, so no one can
take a name's place from its real writer; bounded: total bytes and copies, bytes and copies per
writing peer, and an expiry one hour after the last write.

Which node holds a name's copy needs no directory: both the writer and a later reader rank the
alive members by a hash of (name, member) (rendezvous hashing) and use the first ones.

Trust (docs/security.md): a copy is signed by its writer's node over (name, stamp, blob digest)
and carries the writer's mesh certificates, so the node holding it can neither alter it nor pass
off a copy of its own as the writer's, and the restoring supervisor checks who wrote it. Stamps
are wall-clock seconds, finite and at most five minutes ahead of the holder's clock. A copy is
replaced only by its writer, and read or dropped only by its writer, an administrator of the
mesh, or (a supervisor restarted elsewhere) anyone once membership holds the writer's node dead;
the restoring supervisor ranks the copies it may read by who wrote them.
"""

from __future__ import annotations

import collections
import math
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from lattica._digest import sha256
from lattica._identity import KeyPair, PeerId, verify_signature
from lattica._runtime import ASYNC, ActorRef, current_caller
from lattica.errors import CheckpointRejected, LatticaError

if TYPE_CHECKING:
    from lattica._runtime.calls import Calls
    from lattica.actors.membership import MembershipService

MAX_BYTES = 256 << 20  # all copies held on one node
MAX_BYTES_PER_WRITER = 64 << 20  # copies written by one peer
MAX_NAME = 512
MAX_COPIES = 65536  # copies held on one node
MAX_COPIES_PER_WRITER = 4096
EXPIRY = 3600.0  # seconds after the last write
MAX_AHEAD = 300.0  # seconds a stamp may be ahead of the holder's clock
_DOMAIN = b"lattica checkpoint copy v1\x00"


def _signed_part(name: str, stamp: float, blob: bytes) -> bytes:
    return _DOMAIN + name.encode() + b"\x00" + repr(stamp).encode() + b"\x00" + sha256(blob)


def sign_copy(keypair: KeyPair, name: str, stamp: float, blob: bytes) -> bytes:
    """The writer's signature of a copy."""
    return keypair.sign(_signed_part(name, stamp, blob))


def copy_signed_by(writer: PeerId, name: str, stamp: float, blob: bytes, signature: Any) -> bool:
    """Whether ``signature`` is ``writer``'s over this copy."""
    key = writer.public_key()
    return (
        key is not None
        and type(signature) is bytes
        and len(signature) == 64
        and verify_signature(key, signature, _signed_part(name, stamp, blob))
    )


def checkpoints_ref(peer: PeerId) -> ActorRef:
    return ActorRef(peer, CheckpointStore.NAME, {"keep": ASYNC, "fetch": ASYNC, "drop": ASYNC})


def ranked(name: str, members: list[str]) -> list[str]:
    """``members`` (peer ids) in the order a checkpoint of ``name`` prefers them."""
    return sorted(members, key=lambda m: sha256(f"{name}\0{m}".encode()))


@dataclass(slots=True)
class _Copy:
    stamp: float
    blob: bytes
    writer: PeerId
    expires: float
    signature: bytes
    certs: list


class CheckpointStore:
    """What peers may call: keep, fetch and drop the copy of one name's checkpoint."""

    NAME = "checkpoints"

    def __init__(self, runtime: Calls, max_bytes: int = MAX_BYTES, max_per_writer: int = MAX_BYTES_PER_WRITER) -> None:
        self._rt = runtime
        self.max_bytes = max_bytes
        self.max_per_writer = max_per_writer
        self._copies: dict[str, dict[PeerId, _Copy]] = {}  # name -> writer -> its copy
        self._by_writer: collections.Counter[PeerId] = collections.Counter()  # bytes
        self._count: collections.Counter[PeerId] = collections.Counter()  # copies
        self.total = 0
        self.copies = 0
        self._next_scan = 0.0  # when expired copies are next looked for

    async def keep(self, name: str, stamp: float, blob: bytes, signature: bytes, certs: list) -> bool:
        """Hold ``blob`` as the caller's checkpoint of ``name`` unless its copy held is as new;
        False if so.
        ``signature``: the caller's (``sign_copy``); ``certs``: its mesh certificates."""
        if (
            type(name) is not str
            or not 0 < len(name) <= MAX_NAME
            or type(stamp) is not float
            or type(blob) is not bytes
        ):
            raise CheckpointRejected(
                "keep takes a name (1-512 characters), a float stamp, bytes, a signature and certificates"
            )
        if not math.isfinite(stamp) or not 0 < stamp <= time.time() + MAX_AHEAD:
            raise CheckpointRejected(f"a checkpoint stamp is a time no more than {MAX_AHEAD:g} s ahead of ours")
        if type(certs) is not list or len(certs) > 4 or not all(type(c) is bytes and len(c) <= 256 for c in certs):
            raise CheckpointRejected("certificates are a list of at most 4 byte strings")
        writer = current_caller() or self._rt.peer_id
        if not copy_signed_by(writer, name, stamp, blob, signature):
            raise CheckpointRejected("the copy is not signed by the node that sends it")
        now = time.monotonic()
        self._expire(now)
        old = self._copies.get(name, {}).get(writer)
        if old is not None and old.stamp >= stamp:
            return False
        freed = len(old.blob) if old is not None else 0
        if self._by_writer[writer] - freed + len(blob) > self.max_per_writer:
            raise CheckpointRejected(f"over the {self.max_per_writer} bytes of checkpoints one peer may keep here")
        if self.total - freed + len(blob) > self.max_bytes:
            raise CheckpointRejected(f"this node holds its maximum of {self.max_bytes} bytes of checkpoints")
        if old is None and (self._count[writer] >= MAX_COPIES_PER_WRITER or self.copies >= MAX_COPIES):
            raise CheckpointRejected(
                f"over the {MAX_COPIES_PER_WRITER} copies one peer may keep here (or this node's {MAX_COPIES})"
            )
        if old is not None:
            self._forget(name, writer)
        self._copies.setdefault(name, {})[writer] = _Copy(stamp, blob, writer, now + EXPIRY, signature, list(certs))
        self._by_writer[writer] += len(blob)
        self._count[writer] += 1
        self.total += len(blob)
        self.copies += 1
        return True

    async def fetch(self, name: str) -> list:
        """The copies of ``name`` the caller may read, newest first, each ``[stamp, blob, writer,
        signature, certificates]``: its own, and any once their writer is down (all of them for
        an administrator). CheckpointRejected if copies exist but none is the caller's to read."""
        if type(name) is not str:
            raise CheckpointRejected("fetch takes a name")
        self._expire(time.monotonic())
        mine = self._accessible(name, "read")
        return [
            [c.stamp, c.blob, c.writer.to_bytes(), c.signature, c.certs] for c in sorted(mine, key=lambda c: -c.stamp)
        ]

    async def drop(self, name: str) -> None:
        """Forget the copies of ``name`` the caller may drop (its child was terminated for good)."""
        if type(name) is str and name in self._copies:
            for c in self._accessible(name, "drop"):
                self._forget(name, c.writer)

    def _accessible(self, name: str, what: str) -> list[_Copy]:
        copies = list(self._copies.get(name, {}).values())
        peer = current_caller() or self._rt.peer_id
        if peer == self._rt.peer_id or self._rt.host.is_admin(peer):
            return copies
        mine = [c for c in copies if c.writer == peer or self._rt.node_gone(c.writer)]
        if copies and not mine:
            raise CheckpointRejected(
                f"{peer} may not {what} the checkpoint copies of {name!r}: their writers are alive"
            )
        return mine

    def _forget(self, name: str, writer: PeerId) -> None:
        slots = self._copies[name]
        c = slots.pop(writer)
        if not slots:
            del self._copies[name]
        self._by_writer[writer] -= len(c.blob)
        self._count[writer] -= 1
        if self._count[writer] <= 0:
            del self._by_writer[writer], self._count[writer]
        self.total -= len(c.blob)
        self.copies -= 1

    def _expire(self, now: float) -> None:
        if now < self._next_scan:
            return
        self._next_scan = now + 10.0
        for name, writer in [(n, w) for n, slots in self._copies.items() for w, c in slots.items() if c.expires <= now]:
            self._forget(name, writer)


def read_copies(got: Any, name: str) -> list[tuple[float, bytes, PeerId, list]]:
    """The well-formed, writer-signed copies in what ``fetch`` returned (see ``read_copy``)."""
    if type(got) is not list:
        return []
    return [c for c in (read_copy(g, name) for g in got[:64]) if c is not None]


def read_copy(got: Any, name: str) -> tuple[float, bytes, PeerId, list] | None:
    """A fetched copy, if well formed and signed by the writer it names: (stamp, blob, writer,
    writer's certificates); None otherwise."""
    if type(got) is not list or len(got) != 5:
        return None
    stamp, blob, raw_writer, signature, certs = got
    if type(stamp) is not float or type(blob) is not bytes or type(raw_writer) is not bytes or type(certs) is not list:
        return None
    try:
        writer = PeerId.from_bytes(raw_writer)
    except LatticaError:
        return None
    if not math.isfinite(stamp) or not copy_signed_by(writer, name, stamp, blob, signature):
        return None
    return stamp, blob, writer, certs


def members(me: PeerId, membership: MembershipService | None) -> list[str]:
    """This node and the members ``membership`` holds alive (what copies may be placed on)."""
    if membership is None:
        return [str(me)]
    return [str(me), *(m.id for m in membership.core.alive())]
