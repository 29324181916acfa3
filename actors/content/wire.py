"""What the content actor's peers exchange: its ref, the DHT key of a provider record, CID lists
as they travel, and the protocol's limits and timings (shared by the service and its fetches)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from lattica._identity import PeerId
from lattica._runtime import ASYNC, ActorRef
from lattica.errors import ContentError, InvalidCid

if TYPE_CHECKING:
    from lattica.content._cid import Cid

__all__ = [
    "content_ref",
    "provider_key",
    "parse_cids",
    "NAME",
    "MAX_NAMED",
    "NAMED_RATE",
    "NAMED_BURST",
    "SWARM_TTL",
    "MAX_SWARMS",
    "MAX_SWARM",
    "SWARM_ANSWER",
    "SWARM_TAKE",
    "SWARM_ADDRS",
    "HAVES_EVERY",
    "SWARM_EVERY",
    "SWARM_SOON",
    "SWARM_WANT",
    "BAND",
    "PASSED_FOR",
    "PASSED_MAX",
]

NAME = "content"
MAX_NAMED = 1024  # CIDs one have/haves call may name
NAMED_RATE, NAMED_BURST = 16384.0, 32768.0  # CIDs a peer may name a second in have and haves calls
SWARM_TTL = 60.0  # seconds a fetcher stays in a root's swarm after it last asked
MAX_SWARMS = 1024  # roots whose swarms we track
MAX_SWARM = 64  # fetchers tracked per root
SWARM_ANSWER = 16  # fetchers named in one answer
SWARM_TAKE = 4  # new peers a fetch takes from one answer
SWARM_ADDRS = 4  # addresses per peer in an answer (all on the IP it is connected from)
HAVES_EVERY = 0.05  # seconds between announcements of new blocks to a swarm
SWARM_EVERY = 2.0  # seconds between a fetch's questions for more swarm peers
SWARM_SOON = 0.25  # ... while it has fewer than SWARM_WANT peers
SWARM_WANT = 8
BAND = 1024  # blocks a fetch takes in its own random order (fetchers spread their first asks)
PASSED_FOR = 1.0  # seconds a block we sent one fetcher is passed on to its fellows (super-seeding)
PASSED_MAX = 8192  # blocks remembered as sent; (fetcher, block) pairs already passed on: 4x that


def content_ref(peer: PeerId) -> ActorRef:
    """The ref of ``peer``'s content system actor."""
    return ActorRef(peer, NAME, {"have": ASYNC, "blocks": ASYNC, "swarm": ASYNC, "haves": ASYNC})


def provider_key(cid: Cid) -> bytes:
    """The DHT key under which providers of ``cid`` are announced: its multihash, as in IPFS (a
    raw and a dag-pb CID of the same bytes name the same block)."""
    return cid.bytes[-34:]


def parse_cids(raw: Any, limit: int) -> list[Cid]:
    if type(raw) is not list or len(raw) > limit:
        raise ContentError(f"a list of at most {limit} CIDs (binary) is expected")
    if not all(type(c) is bytes and len(c) <= 64 for c in raw):
        raise ContentError("not a CID: CIDs travel as byte strings of at most 64 bytes")
    from lattica.content._cid import Cid  # (hashlib with it) loads at the first content call, not at start

    try:
        return [Cid.from_bytes(c) for c in raw]
    except (InvalidCid, TypeError) as e:
        raise ContentError(f"not a CID: {e}") from None
