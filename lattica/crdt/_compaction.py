"""When a replica proposes a checkpoint, and when a checkpoint counts without being checked,
sans-IO (docs/crdt.md, Compaction). The replica actor (``actors/crdt/checkpoints.py``) asks these
and does the calls.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from lattica.crdt._checkpoint import Checkpoint

__all__ = ["proposer_turn", "is_settled", "RETRY_AFTER", "TOO_LARGE_AFTER"]

RETRY_AFTER = 30.0  # seconds before proposing again after a round that failed or gathered too few signatures
TOO_LARGE_AFTER = 600.0  # and after finding the document's state too large to checkpoint


def proposer_turn(me: bytes, owner: bytes | None, peers: Sequence[bytes], held: int, every: int, quorum: int) -> bool:
    """Whether it falls to this replica (``me``) to propose a checkpoint of its log of ``held``
    envelopes (``every``: how many make one due; 0: never): the owner's (an owner document), else
    the replica's with the lowest id among itself and the replica ``peers`` it meets (one
    proposer at a time, not one per replica). Should the lowest not propose (gone, or hostile),
    the next proposes at twice ``every``, every other at three times (checkpoints made apart are
    taken alike). Without peers, a mesh replica proposes only if one signature settles it
    (``quorum`` at most 1)."""
    if not every or held < every:
        return False
    if owner is not None:
        return owner == me
    if quorum > 1 and not peers:
        return False
    rank = min(sum(1 for p in peers if p < me), 2)
    return held >= every * (1 + rank)


def is_settled(
    cp: Checkpoint, owner: bytes | None, quorum: int, member_at: Callable[[bytes, tuple[bytes, ...], int], bool]
) -> bool:
    """Whether ``cp`` carries the signatures a replica that cannot check it needs: the owner's
    (an owner document), else ``quorum`` members' (``member_at(signer, certificates, ms)``:
    whether the signer was a member of the mesh when it signed)."""
    sigs = cp.valid_signatures()
    if owner is not None:
        return any(s.signer == owner for s in sigs)
    members = sum(1 for s in sigs if member_at(s.signer, s.certs, s.ts))
    return members >= max(1, quorum)
