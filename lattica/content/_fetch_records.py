"""The records of a fetch session (:mod:`lattica.content._session`): what it hands the glue
(:class:`Request`, :class:`Arrival`, :class:`PeerStats`) and what it keeps per block, per call,
per peer and per round (:class:`Want`, :class:`Call`, :class:`Peer`, :class:`Plan`). Plain data."""

from __future__ import annotations

from collections import deque
from collections.abc import Hashable
from dataclasses import dataclass
from typing import Any

__all__ = [
    "BLOCK",
    "HAVE",
    "PENDING",
    "ACTIVE",
    "STUCK",
    "GONE",
    "Request",
    "Arrival",
    "PeerStats",
    "Want",
    "Call",
    "Peer",
    "Plan",
]

BLOCK = "block"
HAVE = "have"

PENDING, ACTIVE, STUCK, GONE = range(4)  # a want's state: queued, in flight, stuck, no longer wanted


@dataclass(frozen=True, slots=True)
class Request:
    """One call for the glue to make: ask ``peer`` for ``cids`` (``kind`` BLOCK or HAVE).

    Past ``deadline`` the session counts the call as timed out and asks someone else; the glue gives
    the call ``hard_deadline`` as its own timeout (a late answer in between is still used) and then
    reports ``on_failure``. ``nbytes`` is what the call charges to the window (0 for HAVE)."""

    peer: Hashable
    kind: str
    cids: tuple[Hashable, ...]
    deadline: float
    hard_deadline: float
    nbytes: int


@dataclass(frozen=True, slots=True)
class Arrival:
    """What ``on_block`` decided: ``fresh`` — keep the bytes (the first copy of a wanted block) and
    call ``on_written`` once they leave memory; not fresh — discard them. ``cancel`` lists the peers
    whose requests for this CID are now redundant (the glue cancels them)."""

    fresh: bool
    cancel: tuple[Hashable, ...] = ()


@dataclass(frozen=True, slots=True)
class PeerStats:
    """One peer as the session sees it (for a progress display)."""

    asked: int  # CIDs asked with want-block
    blocks: int  # blocks delivered first (used)
    bytes: int
    rate: float  # measured bytes/s while busy (0.0 until measured)
    rtt: float  # seconds (0.0 until measured)
    score: float  # the bytes/s the scheduler plans with (rate, halved per failure in a row)
    in_flight: int  # CIDs asked and not answered
    dont_haves: int
    duplicates: int  # blocks delivered that someone else delivered first
    failures: int  # failed or timed-out calls, bad blocks
    consecutive_failures: int
    active: bool  # in the session now (added, not removed, not dropped)
    dropped: bool
    reason: str | None  # why it was dropped


class Want:
    """One wanted block as the session keeps it: its state, the peers asked for it (its copies),
    tried, excluded or known to hold it, and a fellow's claim on it."""

    __slots__ = (
        "cid",
        "size",
        "order",
        "seq",
        "gen",
        "state",
        "live",
        "copies",
        "tried",
        "excluded",
        "haves",
        "have_asked",
        "coming",
        "claimant",
        "claimed",
        "claim_charge",
        "vouched",
        "passed_by",
    )

    def __init__(self, cid: Hashable, size: int | None, order: Any, seq: int, copies: set[Hashable]) -> None:
        self.cid = cid
        self.size = size
        self.order = order
        self.seq = seq
        self.gen = 0  # heap entries of an older generation are stale
        self.state = GONE
        self.live = 0  # copies in flight that have not timed out
        self.copies = copies  # peers with an outstanding want-block for the CID (shared, see _holders)
        self.tried: dict[Hashable, int] | None = None  # want-blocks sent, per peer
        self.excluded: set[Hashable] | None = None  # said dont-have, or sent a bad block
        self.haves: set[Hashable] | None = None
        self.have_asked: set[Hashable] | None = None
        self.coming = 0.0  # until when a fellow fetcher's claim on it holds (0.0: none holds now)
        self.claimant: Hashable = None
        self.claimed = False  # (claimed once: never again)
        self.claim_charge = 0  # window bytes kept free for it while claimed
        self.vouched: Hashable = None  # the provider whose word the claim is (on_passed); None: the claimant's own
        self.passed_by: set[Hashable] | None = None  # providers that passed it on to a fellow (on_passed)


class Call:
    """One want-block or want-have call sent to a peer, until every CID in it is answered."""

    __slots__ = (
        "peer",
        "kind",
        "sent",
        "deadline",
        "eta",
        "open",
        "nbytes",
        "stale",
        "penalized",
        "failed",
        "alone",
        "passed",
    )

    def __init__(
        self, peer: Hashable, kind: str, sent: float, deadline: float, eta: float, open_: dict, alone: bool
    ) -> None:
        self.peer = peer
        self.kind = kind
        self.sent = sent
        self.deadline = deadline
        self.eta = eta  # when the scheduler expected it back
        self.open: dict[Hashable, int] = open_  # unanswered CID -> bytes charged to the window
        self.nbytes = 0  # bytes delivered
        self.stale = False  # timed out or its peer dropped: no longer counts as a live copy
        self.penalized = False  # already cost its peer a failure (timed out, or beaten while overdue)
        self.failed = False
        self.alone = alone  # sent to an idle peer: its round trip measures the peer's rtt
        self.passed = False  # some of it was passed on to a fellow: its time measures nothing


class Peer:
    """One peer as the session keeps it: its measures (rate, rtt), failures, calls and claims."""

    __slots__ = (
        "id",
        "active",
        "dropped",
        "reason",
        "rate",
        "rtt",
        "consecutive",
        "failures",
        "misses",
        "dont_haves",
        "asked",
        "blocks",
        "bytes",
        "duplicates",
        "inflight_bytes",
        "inflight_blocks",
        "calls",
        "have_calls",
        "last_done",
        "heard",
        "have_queue",
        "window_bytes",
        "window_time",
        "banned",
        "holder_only",
        "claims",
        "broken",
        "passes_lapsed",
    )

    def __init__(self, pid: Hashable) -> None:
        self.id = pid
        self.active = False
        self.dropped = False
        self.banned = False  # sent a bad block: never taken back
        self.holder_only = False  # asked only for blocks it said it has
        self.claims: deque[tuple[float, Want]] = deque()  # its open claims: (when they end, the block)
        self.broken = 0  # its claims that ended without its have
        self.passes_lapsed = 0  # claims it passed us (as a provider) that ended without the fellow's have
        self.reason: str | None = None
        self.rate: float | None = None  # bytes/s while busy
        self.rtt: float | None = None  # seconds
        self.window_bytes = 0.0  # decayed sums behind rate
        self.window_time = 0.0
        self.consecutive = 0  # failures in a row
        self.failures = 0
        self.misses = 0  # dont-haves in a row to want-blocks
        self.dont_haves = 0
        self.asked = 0
        self.blocks = 0
        self.bytes = 0
        self.duplicates = 0
        self.inflight_bytes = 0
        self.inflight_blocks = 0
        self.calls: set[Call] = set()
        self.have_calls: set[Call] = set()
        self.last_done = float("-inf")
        self.heard = float("-inf")  # its last answer to a call (blocks, haves or dont-haves)
        self.have_queue: deque[Hashable] = deque()


class Plan:
    """The want-blocks planned for one peer in one round, already cut into calls."""

    __slots__ = ("items", "calls", "n", "nbytes", "limit")

    def __init__(self, limit: float) -> None:
        self.limit = limit  # bytes per call
        self.items: list[list[tuple[Hashable, int, float]]] = []  # per call: (cid, charge, eta)
        self.calls = 0
        self.n = 0  # blocks in the last call
        self.nbytes = 0  # bytes in the last call
