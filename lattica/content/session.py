"""The scheduler of a Bitswap-style fetch session: which peer is asked for which block, and when.

Sans-IO: a plain object told what the glue saw (peers, wants, answers, the time as ``now``) that
answers with the want-block / want-have calls to make; it never reads a clock or touches a socket,
so it is tested by simulation. See :class:`FetchSession` for the rules and the glue's contract.
"""

from __future__ import annotations

import heapq
import itertools
from collections import deque
from collections.abc import Hashable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from lattica.errors import BlockNotFound

__all__ = ["FetchSession", "Request", "Arrival", "PeerStats", "BLOCK", "HAVE"]

BLOCK = "block"
HAVE = "have"

_PENDING, _ACTIVE, _STUCK, _GONE = range(4)
_LOOKAHEAD = 32  # blocks passed over per next_requests because their peers are busy (bounds the scan)
_SMALL = 16 << 10  # a call carrying at most this measures the rtt as it is
PASS_LAPSES = 3  # claims a provider passed us that may lapse before its passes are just asked again
_NO_ROOM = object()  # the peers that may be asked for a block are busy
_WAIT = object()  # a busy peer would still deliver it sooner than any with room


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


class _Want:
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
        self.state = _GONE
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


class _Call:
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


class _Peer:
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
        self.claims: deque[tuple[float, _Want]] = deque()  # its open claims: (when they end, the block)
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
        self.calls: set[_Call] = set()
        self.have_calls: set[_Call] = set()
        self.last_done = float("-inf")
        self.heard = float("-inf")  # its last answer to a call (blocks, haves or dont-haves)
        self.have_queue: deque[Hashable] = deque()


class _Plan:
    """The want-blocks planned for one peer in one round, already cut into calls."""

    __slots__ = ("items", "calls", "n", "nbytes", "limit")

    def __init__(self, limit: float) -> None:
        self.limit = limit  # bytes per call
        self.items: list[list[tuple[Hashable, int, float]]] = []  # per call: (cid, charge, eta)
        self.calls = 0
        self.n = 0  # blocks in the last call
        self.nbytes = 0  # bytes in the last call


class FetchSession:
    """Decides which peer is asked for which block of one fetch; the glue does the talking.

    **The glue's loop.** ``add_peer`` the providers, ``want`` the root; then repeatedly send what
    ``next_requests(now)`` returns (concurrently), report every answer per CID — ``on_block``
    (verified bytes), ``on_bad_block`` (bytes that failed verification), ``on_dont_have``,
    ``on_have``, ``on_passed`` (the peer names a fellow it sent the block to instead: a claim on
    the peer's word), ``on_failure`` (call failed, timed out at its ``hard_deadline`` or was
    cancelled) — ``want`` the children a block reveals, ``on_written`` a block once its bytes leave memory,
    and call ``next_requests`` again after each event or at ``next_wakeup()``. Every CID of every
    request ends in exactly one report, except after ``remove_peer``, which forgets that peer's
    calls (their answers are then ignored); ``take_dropped()`` lists the peers the session dropped
    (cancel their calls and ``remove_peer`` them, or let their reports come). Stop when ``done``;
    when ``exhausted`` (no peer left) raise ``error()``; while ``stuck()`` is not empty, look up
    more providers and ``add_peer`` them (``blocked`` says nothing else can make progress).

    **Window.** ``in_flight_bytes`` = bytes charged to outstanding want-block requests (one charge
    per copy: the declared size, or ``unknown_size``) + bytes of fresh blocks not yet
    ``on_written``. A request is only issued if it keeps this within ``window_bytes`` (one block
    may go when nothing is charged, so a block larger than the window cannot deadlock); first
    requests of a block stop ``reserve`` of the window short, so retries, endgame duplicates and
    the first request of the head block (the first pending in order) can go while the rest of the
    window waits on them.

    **Whom to ask.** Blocks are considered in ``order`` (lowest first). For each, among the peers
    that may be asked (active, not holding a request for it, not said dont-have, not asked
    ``max_attempts`` times, no have-query pending): known holders (``on_have``) first, then
    everyone, by expected delivery ``rtt + (bytes queued at the peer + block) / rate``; peers
    asked before and peers with ``miss_limit`` dont-haves in a row are a last resort, used only
    when no other peer may be asked. The block goes to the soonest peer with room — unless a busy
    peer would still deliver it sooner, then it waits for that one (a slow peer is used only when
    it actually helps). A peer's room: bytes in flight up to ``rate * (horizon + rtt)`` (its
    bandwidth-delay product plus ``horizon`` seconds of queue; ``probe_bytes`` until measured),
    halved per failure in a row, in at most ``max_per_peer_requests`` calls, each of at most
    ``max_batch`` CIDs and 1/``max_per_peer_requests`` of that cap, at most ``max_batch_bytes`` (a
    reply arrives whole, so a long call delays its first block). A (peer, CID) is never asked
    twice at once; it is asked again only after that peer's earlier request for it failed or timed
    out, at most ``max_attempts`` times, never after a dont-have (unless the peer later says have)
    or a bad block.

    **Stuck.** A block that no active peer may be asked for is stuck: it waits out of the queue
    (listed by ``stuck()``) and every peer added later is asked want-have for it; a have brings it
    back. A block whose only copy timed out at its only peer is stuck too (a late answer still
    counts). Every ``retry_after`` seconds the failed attempts on stuck blocks are forgotten, so
    peers that failed them (not those that said dont-have) are asked again, as Bitswap rebroadcasts.

    **Claims.** A fellow fetcher may say a block is coming to it (``on_coming``): the block goes
    to the back of the queue and is asked only of peers known to hold it, until its have arrives
    or ``coming_for`` seconds pass (then it is back in its place and anyone may be asked).
    Fetchers that start together then ask their common provider for different blocks and trade
    the rest. A block is claimed once, a peer holds at most ``max_claims`` open claims, and the
    claims of one that let ``max_broken`` expire without its have are ignored. A claim a
    provider makes for a fellow (``on_passed``: super-seeding) holds half as long and its lapses
    count against that provider (after ``PASS_LAPSES`` its passes are just asked again); a
    provider's first pass of a block is no attempt, later ones are. A peer added
    ``holder_only`` (a fellow that came to us) is asked want-block only for blocks it said it has.

    **Endgame.** When no block waits for a peer — or the window is full, then for its earliest
    in-flight blocks only, the ones the window waits on — in-flight blocks get another copy on an
    idle healthy peer (measured, no failure in a row, less than one call's bytes in flight) that
    would deliver sooner than the current copy is expected (when due; once overdue, when its
    peer's queue should have drained), up to ``max_copies`` live copies. The first copy to arrive
    makes ``on_block`` return the peers of the others, to cancel. A peer is *silent* while one
    of its calls has waited ``block_timeout`` with no answer of any kind from it since that call
    went (its deadline may be far off: its queued bytes at ``min_rate``): blocks whose every copy
    waits at silent peers get a copy at any idle peer that is not silent itself (measured or not,
    failures in a row or not), and a silent peer is a last resort for new blocks, never waited for.

    **Scoring.** ``rate``: bytes delivered over the time the peer was busy (since the call was
    sent, less the rtt, or since the peer's previous answer if the call queued behind it), both
    sums decayed by ``alpha`` per call so big transfers weigh most. ``rtt``: the minimum round
    trip of calls sent to an idle peer, drifting up slowly. Failures in a row (reset by any
    answer): a failed call, a call past its ``deadline`` (``block_timeout`` + the peer's queued
    bytes / ``min_rate``; one per peer per tick; its blocks are asked elsewhere), and a copy beaten
    by another while overdue. ``max_failures`` in a row drop the peer (``add_peer`` takes it back
    when the glue sees fit); a bad block drops it at once and for good. A want-block whose peer
    says nothing at all (no answer to any call, no have) by its deadline, or for
    ``abandon_after`` (2 x block_timeout) when its deadline is further off, is **given up**: one
    failure, its blocks asked again (of that peer too, on a new call), and the glue cancels it
    without a report (``take_abandoned()``); a path that broke under a call then costs seconds,
    not the call's whole deadline. ``stats()`` shows all of it.
    """

    def __init__(
        self,
        *,
        window_bytes: int = 64 << 20,
        max_per_peer_requests: int = 16,
        block_timeout: float = 10.0,
        max_batch: int = 32,
        max_batch_bytes: int = 2 << 20,
        max_have_batch: int = 256,
        unknown_size: int = 1 << 20,
        probe_bytes: int = 512 << 10,
        horizon: float = 0.25,
        min_rate: float = 128 << 10,
        default_rate: float = 1 << 20,
        max_failures: int = 3,
        max_attempts: int = 2,
        retry_after: float = 30.0,
        max_copies: int = 2,
        miss_limit: int = 8,
        reserve: float = 0.125,
        alpha: float = 0.3,
        coming_for: float = 1.0,
        max_claims: int = 32,
        max_broken: int = 1,
        abandon_after: float | None = None,
    ) -> None:
        ints = dict(
            window_bytes=window_bytes,
            max_per_peer_requests=max_per_peer_requests,
            max_batch=max_batch,
            max_batch_bytes=max_batch_bytes,
            max_have_batch=max_have_batch,
            max_failures=max_failures,
            max_attempts=max_attempts,
            max_copies=max_copies,
            miss_limit=miss_limit,
            max_claims=max_claims,
            max_broken=max_broken,
        )
        for name, value in ints.items():
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a positive integer, not {value!r}")
        if unknown_size < 0 or probe_bytes < 0:
            raise ValueError("unknown_size and probe_bytes must not be negative")
        if block_timeout <= 0 or retry_after <= 0 or min_rate <= 0 or default_rate <= 0 or horizon < 0:
            raise ValueError("block_timeout, retry_after, min_rate, default_rate must be > 0, horizon >= 0")
        if coming_for < 0:
            raise ValueError("coming_for must not be negative")
        if not 0 <= reserve < 1 or not 0 < alpha <= 1:
            raise ValueError("reserve must be in [0, 1) and alpha in (0, 1]")
        self.window_bytes = window_bytes
        self.max_per_peer_requests = max_per_peer_requests
        self.block_timeout = block_timeout
        self.max_batch = max_batch
        self.max_batch_bytes = max_batch_bytes
        self.max_have_batch = max_have_batch
        self.unknown_size = unknown_size
        self.probe_bytes = probe_bytes
        self.horizon = horizon
        self.min_rate = min_rate
        self.default_rate = default_rate
        self.max_failures = max_failures
        self.max_attempts = max_attempts
        self.retry_after = retry_after
        self.max_copies = max_copies
        self.miss_limit = miss_limit
        self.alpha = alpha
        self.coming_for = coming_for
        self.max_claims = max_claims
        self.max_broken = max_broken
        # a want-block whose peer says nothing at all about it for this long (or by its deadline,
        # if sooner) is given up: default twice block_timeout
        self.abandon_after = 2 * block_timeout if abandon_after is None else abandon_after
        if self.abandon_after <= 0:
            raise ValueError("abandon_after must be > 0")
        self._first_limit = window_bytes - int(window_bytes * reserve)
        self._peers: dict[Hashable, _Peer] = {}
        self._active: dict[Hashable, _Peer] = {}
        self._wants: dict[Hashable, _Want] = {}
        self._heap: list[tuple[Any, int, int, _Want]] = []  # pending blocks by ((claimed, order), seq)
        self._npending = 0
        self._inflight: dict[Hashable, _Want] = {}
        self._dups: list[tuple[Any, int, int, _Want]] = []  # in-flight blocks by order, for the endgame
        self._stuck: dict[Hashable, _Want] = {}
        self._comings: list[tuple[float, int, _Want]] = []  # claims by when they end (wakeups)
        self._claimed_bytes = 0  # charges of the blocks claimed now
        self._retry_at: float | None = None  # when stuck blocks are tried again at peers that failed them
        self._now = float("-inf")  # the latest time seen
        self._quiet_peers: set[Hashable] = set()  # active peers with a silent call (this round)
        self._out: dict[tuple[Hashable, Hashable], _Call] = {}  # outstanding want-blocks
        self._holders: dict[Hashable, set[Hashable]] = {}  # CID -> peers in _out, outlives a cancel
        self._asks: dict[tuple[Hashable, Hashable], _Call] = {}  # outstanding want-haves
        self._timers: list[tuple[float, int, _Call]] = []
        self._dues: list[tuple[float, int, _Call]] = []  # when calls are expected back (endgame wakeups)
        self._silences: list[tuple[float, int, _Call]] = []  # when a want-block is given up if its peer says nothing
        self._abandoned: list[tuple[Hashable, tuple[Hashable, ...]]] = []  # (peer, CIDs) for the glue to cancel
        self._held: dict[Hashable, int] = {}  # fresh blocks not yet written
        self._received: set[Hashable] = set()
        self._committed = 0
        self._seq = itertools.count()
        self._new_drops: list[Hashable] = []
        self.received_blocks = 0
        self.received_bytes = 0
        self.wasted_bytes = 0  # duplicates and late copies, discarded

    # -- peers ----------------------------------------------------------------------------------

    def add_peer(self, peer: Hashable, now: float, holder_only: bool = False) -> bool:
        """Take ``peer`` into the session (False if it is already in, or sent a bad block). It is
        asked want-have for every block stuck now; ``holder_only``: asked want-block only for
        blocks it said it has (a fellow fetcher that came to us: it has not said it holds
        anything). A peer dropped for failures in a row comes back unmeasured, its attempts
        forgotten (the glue decides when: a path that broke may have healed, and it may be the
        only provider there is)."""
        p = self._peers.get(peer)
        if p is None:
            p = self._peers[peer] = _Peer(peer)
        elif p.active or p.banned:
            return False
        elif p.dropped:
            p.dropped, p.reason, p.consecutive = False, None, 0
            p.rate = p.rtt = None
            p.window_bytes = p.window_time = 0.0
            for w in self._wants.values():
                if w.tried and peer in w.tried:
                    w.tried[peer] = 0  # (still "tried before": its retries keep the window's reserve)
        p.holder_only = holder_only
        p.active = True
        self._active[peer] = p
        p.have_queue = deque(self._stuck)
        return True

    def remove_peer(self, peer: Hashable) -> None:
        """``peer`` is gone (or the glue cancelled its calls after a drop): its calls are forgotten,
        their window charges released and their blocks asked elsewhere; later answers are ignored."""
        p = self._peers.get(peer)
        if p is None:
            return
        if p.active:
            p.active = False
            del self._active[peer]
        p.have_queue.clear()
        for call in list(p.calls):
            for cid in list(call.open):
                w = self._release(p, cid, call)
                if w is not None:
                    self._settle(w)
            call.failed = True
        p.calls.clear()
        for call in list(p.have_calls):
            for cid in call.open:
                self._asks.pop((peer, cid), None)
                w = self._wants.get(cid)
                if w is not None and w.have_asked:
                    w.have_asked.discard(peer)  # unanswered: ask again if it comes back
            call.open.clear()
        p.have_calls.clear()

    # -- wants ----------------------------------------------------------------------------------

    def want(
        self, cids: Sequence[Hashable], sizes: Sequence[int | None] | None = None, order: Sequence[Any] | None = None
    ) -> None:
        """Add blocks to fetch. ``sizes``: the block's bytes if known (a raw leaf's size from its
        parent), else None (charged as ``unknown_size``). ``order``: a sort key per block (e.g. its
        file offset), lowest fetched first; without it, the order of the calls. Give it always or
        never; give internal nodes a key some way ahead of their leaves' so the walker discovers
        the next leaves before the window needs them. A CID already wanted or received is skipped
        (a repeated chunk is fetched once)."""
        if sizes is not None and len(sizes) != len(cids):
            raise ValueError("want() needs one size per CID")
        if order is not None and len(order) != len(cids):
            raise ValueError("want() needs one order key per CID")
        for i, cid in enumerate(cids):
            size = sizes[i] if sizes is not None else None
            if size is not None and (not isinstance(size, int) or size < 0):
                raise ValueError(f"a block size must be a non-negative int, not {size!r}")
            if cid in self._received:
                continue
            w = self._wants.get(cid)
            if w is not None:
                if w.size is None:
                    w.size = size
                continue
            seq = next(self._seq)
            copies = self._holders.get(cid)
            if copies is None:
                copies = self._holders[cid] = set()
            w = self._wants[cid] = _Want(cid, size, order[i] if order is not None else seq, seq, copies)
            w.live = sum(1 for pid in copies if not self._out[(pid, cid)].stale)  # wanted again while asked
            if w.live:
                self._activate(w)
            else:
                self._pend(w)

    def cancel(self, cid: Hashable) -> tuple[Hashable, ...]:
        """Stop wanting ``cid``; returns the peers whose requests for it the glue should cancel
        (their reports are still expected: they release the window)."""
        w = self._wants.get(cid)
        if w is None:
            return ()
        self._retire(w)
        return tuple(w.copies)

    # -- answers --------------------------------------------------------------------------------

    def on_block(self, peer: Hashable, cid: Hashable, nbytes: int, now: float) -> Arrival:
        """``peer`` sent the block ``cid`` (``nbytes``) and it verified. A block nobody is waiting
        for (unasked, or from a removed peer) is used only if wanted and the window has room."""
        p = self._peers.get(peer)
        call = self._out.get((peer, cid))
        w = self._wants.get(cid)
        if call is not None:
            assert p is not None  # (a call is only made to a known peer, and peers are never forgotten)
            self._release(p, cid, call)
            call.nbytes += nbytes
        fits = not self._committed or self._committed + nbytes <= self.window_bytes
        fresh = w is not None and (call is not None or fits)
        if p is not None:
            if fresh:
                p.blocks += 1
                p.bytes += nbytes
            elif w is None:
                p.duplicates += 1
            if call is not None or fresh:
                p.consecutive = 0
                p.misses = 0
        if w is None or not fresh:  # (w is None: not fresh)
            self.wasted_bytes += nbytes
            if call is not None:
                self._finish(call, now)
            return Arrival(False)
        self._retire(w)
        for pid in w.copies:  # a copy overdue and beaten by another counts as timed out
            late = self._out.get((pid, cid))
            if late is not None and not late.penalized and now >= late.eta:
                late.penalized = True
                loser = self._peers[pid]
                if loser.active:
                    self._penalize(loser)
        self._received.add(cid)
        self._held[cid] = nbytes
        self._committed += nbytes
        self.received_blocks += 1
        self.received_bytes += nbytes
        if call is not None:
            self._finish(call, now)
        return Arrival(True, tuple(w.copies))

    def on_dont_have(self, peer: Hashable, cid: Hashable, now: float) -> None:
        """``peer`` does not hold ``cid`` (an answer to a want-block or a want-have)."""
        p = self._peers.get(peer)
        if p is None:
            return
        w = self._wants.get(cid)
        if w is not None:
            if w.excluded is None:
                w.excluded = set()
            w.excluded.add(peer)
            if w.haves:
                w.haves.discard(peer)
        call = self._out.get((peer, cid))
        if call is not None:
            self._release(p, cid, call)
            p.misses += 1
            p.dont_haves += 1
            p.consecutive = 0
            if w is not None:
                self._settle(w)
            self._finish(call, now)
            return
        call = self._asks.pop((peer, cid), None)
        if call is not None:
            del call.open[cid]
            p.consecutive = 0
            self._finish(call, now)

    def on_passed(self, peer: Hashable, cid: Hashable, holder: Hashable, now: float) -> None:
        """``peer`` answered a want-block for ``cid`` with ``holder``: a fellow fetcher it sent
        the block to a moment ago (super-seeding). The first time, not a dont-have and not a
        failed attempt: the block becomes a claim on the holder on the peer's word
        (``on_coming(vouched=peer)``: half of ``coming_for``), if the holder is active in the
        session, the block unclaimed and held by no one known, and the peer's passes have not
        lapsed ``PASS_LAPSES`` times; otherwise it is asked again. A second pass of the same
        block by the same peer is an attempt like any other (``max_attempts`` ends them)."""
        p = self._peers.get(peer)
        if p is None:
            return
        call = self._out.get((peer, cid))
        if call is None:
            return
        call.passed = True
        w = self._release(p, cid, call)
        if w is not None:
            first = not (w.passed_by and peer in w.passed_by)
            if first:
                if w.passed_by is None:
                    w.passed_by = set()
                w.passed_by.add(peer)
                if w.tried and w.tried.get(peer):
                    w.tried[peer] -= 1  # (not an attempt that failed: the peer is as good as before)
                    if not w.tried[peer]:
                        del w.tried[peer]
            self._settle(w)
            if w.state == _STUCK and p.active:
                self._unstick(w)
            if first and holder is not None and holder != peer and p.passes_lapsed < PASS_LAPSES:
                self.on_coming(holder, cid, now, vouched=peer)
        self._finish(call, now)

    def on_have(self, peer: Hashable, cid: Hashable, now: float) -> None:
        """``peer`` holds ``cid`` (an answer to a want-have, or news from elsewhere)."""
        p = self._peers.get(peer)
        if p is None:
            return
        p.heard = max(p.heard, now)  # (it talks: not silent, whatever its calls wait on)
        call = self._asks.pop((peer, cid), None)
        if call is not None:
            del call.open[cid]
            p.consecutive = 0
            self._finish(call, now)
        w = self._wants.get(cid)
        if w is None or not p.active:
            return
        if w.haves is None:
            w.haves = set()
        w.haves.add(peer)
        if w.excluded:
            w.excluded.discard(peer)
        if w.coming:  # claimed and now held: back in its place, asked of holders
            self._end_claim(w)
        self._unstick(w)

    def on_coming(self, peer: Hashable, cid: Hashable, now: float, vouched: Hashable = None) -> None:
        """``peer``, a fellow fetcher in the session, is being sent ``cid`` by someone: rather
        than ask a provider for it too (the swarm's publisher serving one block twice), wait up
        to ``coming_for`` seconds for the fellow's have and ask the fellow. A block is claimed
        once; a peer holds at most ``max_claims`` open claims, and one whose claims ended without
        its have ``max_broken`` times is not believed any more: a fellow that never delivers holds
        a few blocks up once, not the fetch. With ``vouched`` (a provider passed the block on to
        the fellow: ``on_passed``) the claim is that provider's word: it holds half as long, and a
        lapse counts against the provider, not the fellow."""
        p = self._peers.get(peer)
        w = self._wants.get(cid)
        if (
            p is None
            or not p.active
            or w is None
            or w.claimed
            or w.haves
            or self.coming_for == 0
            or (vouched is None and p.broken >= self.max_broken)
        ):
            return
        while p.claims and p.claims[0][0] <= now:
            p.claims.popleft()
        if len(p.claims) >= self.max_claims:
            return
        w.claimed = True
        w.claimant = peer
        w.vouched = vouched
        w.coming = now + (self.coming_for if vouched is None else self.coming_for / 2)
        w.claim_charge = self._charge(w)
        self._claimed_bytes += w.claim_charge  # (kept free of other blocks' requests: it may come first)
        p.claims.append((w.coming, w))
        heapq.heappush(self._comings, (w.coming, w.seq, w))
        if w.state == _PENDING:
            self._npending -= 1
            self._pend(w)  # (to the back of the queue)

    def on_failure(self, peer: Hashable, cids: Sequence[Hashable], now: float, reason: str = "error") -> None:
        """The call to ``peer`` for ``cids`` failed (connection lost, error, timed out at its hard
        deadline, or ``reason="cancelled"`` by the glue): one failure for the peer unless it was
        cancelled, already counted as timed out, or about blocks no longer wanted."""
        p = self._peers.get(peer)
        if p is None:
            return
        penalize = False
        touched = []
        for cid in cids:
            call = self._out.get((peer, cid))
            if call is not None:
                w = self._release(p, cid, call)
                if w is not None:
                    touched.append(w)
                    penalize = penalize or not call.penalized
                call.failed = True
                self._finish(call, now)
                continue
            call = self._asks.pop((peer, cid), None)
            if call is not None:
                del call.open[cid]
                penalize = penalize or (not call.penalized and cid in self._wants)
                call.failed = True
                self._finish(call, now)
        if penalize and reason != "cancelled":
            self._penalize(p)
        self._return_wants(touched, p.active)

    def on_bad_block(self, peer: Hashable, cid: Hashable, now: float) -> None:
        """The block ``peer`` sent for ``cid`` did not verify: the peer is dropped from the session
        (its other answers still count; bytes that verify are bytes) and the block asked elsewhere."""
        p = self._peers.get(peer)
        if p is None:
            return
        w = self._wants.get(cid)
        call = self._out.get((peer, cid))
        if call is not None:
            self._release(p, cid, call)
            call.failed = True
            self._finish(call, now)
        if w is not None:
            if w.excluded is None:
                w.excluded = set()
            w.excluded.add(peer)
        p.failures += 1
        p.banned = True
        if not p.dropped:
            self._drop(p, "sent a block that does not match its CID")
        if w is not None:
            self._settle(w)

    def on_written(self, cid: Hashable) -> None:
        """The fresh block ``cid`` left memory (written or stored): its bytes leave the window."""
        n = self._held.pop(cid, None)
        if n is not None:
            self._committed -= n

    # -- time and decisions ---------------------------------------------------------------------

    def tick(self, now: float) -> None:
        """Time out the calls past their deadline and end the claims past theirs
        (``next_requests`` does this first)."""
        self._now = now
        comings = self._comings
        while comings and comings[0][0] <= now:
            until, _, w = heapq.heappop(comings)
            if w.coming != until:
                continue  # (ended by a have)
            self._end_claim(w)
            claimant = self._peers.get(w.claimant)
            if claimant is None or w.state == _GONE:
                continue
            if w.vouched is not None:  # a provider's word: its passes are believed less, the fellow no less
                provider = self._peers.get(w.vouched)
                if provider is not None:
                    provider.passes_lapsed += 1
                continue
            claimant.broken += 1  # no have from it in time
            if claimant.broken >= self.max_broken:  # not believed any more: its other claims end too
                for end, other in claimant.claims:
                    if other.coming == end and other.vouched is None:
                        self._end_claim(other)
                claimant.claims = deque(c for c in claimant.claims if c[1].vouched is not None)
        silences = self._silences
        while silences and silences[0][0] <= now:
            call = heapq.heappop(silences)[2]
            p = self._peers.get(call.peer)
            if call.open and p is not None and call in p.calls and p.heard < call.sent:
                self._abandon(p, call, now)
        dues = self._dues
        while dues and dues[0][0] <= now:
            heapq.heappop(dues)
        timers = self._timers
        blamed: list[_Peer] = []
        while timers and timers[0][0] <= now:
            call = heapq.heappop(timers)[2]
            if call.stale or not call.open:
                continue
            call.stale = True
            p = self._peers[call.peer]
            wanted = False
            for cid in call.open:
                want = self._wants.get(cid)
                if want is not None:
                    wanted = True
                    if call.kind == BLOCK:
                        want.live -= 1
                        self._settle(want)
            if wanted and not call.penalized and p not in blamed:
                blamed.append(p)
            call.penalized = True
        for p in blamed:
            if not p.dropped:
                self._penalize(p)

    def next_wakeup(self) -> float | None:
        """When to call ``next_requests`` at the latest if nothing else happens: the earliest
        deadline of a call still awaited, the time one is due back (an overdue copy may get an
        endgame duplicate), or the time stuck blocks are tried again."""
        out = self._retry_at
        timers, dues = self._timers, self._dues
        while timers and (timers[0][2].stale or not timers[0][2].open):
            heapq.heappop(timers)
        while dues and (dues[0][2].stale or not dues[0][2].open or dues[0][0] <= self._now):
            heapq.heappop(dues)  # a call due already when it was sent
        comings = self._comings
        while comings and comings[0][2].coming != comings[0][0]:
            heapq.heappop(comings)  # (ended by a have)
        silences = self._silences
        while silences and not silences[0][2].open:
            heapq.heappop(silences)
        for heap in (timers, dues, comings, silences):
            if heap and (out is None or heap[0][0] < out):
                out = heap[0][0]
        return out

    def next_requests(self, now: float) -> list[Request]:
        """The calls to make now (after timing out the overdue ones)."""
        self.tick(now)
        if self._retry_at is not None and now >= self._retry_at:
            self._retry_stuck()
            self._retry_at = None
        if not self._active:
            return []
        rates = sorted(p.rate for p in self._active.values() if p.rate is not None)
        rate0 = rates[len(rates) // 2] if rates else self.default_rate
        rtts = sorted(p.rtt for p in self._active.values() if p.rtt is not None)
        rtt0 = rtts[len(rtts) // 2] if rtts else 0.0
        plan: dict[Hashable, _Plan] = {}
        self._quiet_peers = {pid for pid, p in self._active.items() if self._quiet(p, now)}
        window_full = self._assign(now, plan, rate0, rtt0)
        if (window_full or self._npending == 0) and self._inflight and self.max_copies > 1:
            self._endgame(now, plan, rate0, rtt0, head_only=window_full)
        out = self._emit(now, plan)
        self._have_requests(now, out)
        return out

    # -- what the glue and a progress bar read --------------------------------------------------

    @property
    def done(self) -> bool:
        """Every wanted block was received."""
        return not self._wants

    @property
    def remaining(self) -> int:
        """Blocks wanted and not received yet."""
        return len(self._wants)

    @property
    def in_flight_bytes(self) -> int:
        """Bytes charged to the window: outstanding want-blocks and fresh blocks not yet written."""
        return self._committed

    @property
    def exhausted(self) -> bool:
        """Blocks remain and no peer is left to ask (all removed or dropped): raise ``error()``."""
        return bool(self._wants) and not self._active

    @property
    def blocked(self) -> bool:
        """Blocks remain, all of them stuck, nothing is in flight or being asked, and no peer that
        failed a stuck block is left to try it again: only new peers can help."""
        return (
            bool(self._wants)
            and self._npending == 0
            and not self._inflight
            and not any(c.open and not c.stale for c in self._asks.values())
            and not any(p.have_queue for p in self._active.values())
            and not any(self._retriable(w) for w in self._stuck.values())
        )

    def holds(self, peer: Hashable, cid: Hashable) -> bool:
        """Whether ``peer`` said it has ``cid`` (a have) and it is still wanted."""
        w = self._wants.get(cid)
        return w is not None and bool(w.haves) and peer in w.haves  # type: ignore[operator]

    def stuck(self) -> list[Hashable]:
        """The wanted blocks no active peer may be asked for (look up more providers)."""
        return list(self._stuck)

    def error(self) -> BlockNotFound | None:
        """The error to raise when the fetch cannot finish (None when done)."""
        if not self._wants:
            return None
        first = next(iter(self._wants))
        why = "no peer is left in the session" if not self._active else f"{len(self._stuck)} of them no peer has"
        return BlockNotFound(f"{len(self._wants)} blocks could not be fetched ({why}); the first is {first}")

    def take_abandoned(self) -> list[tuple[Hashable, tuple[Hashable, ...]]]:
        """Want-blocks given up since the last call, as (peer, CIDs): cancel them without a
        report (their blocks are asked again, of that peer too, on a new call)."""
        out, self._abandoned = self._abandoned, []
        return out

    def take_dropped(self) -> list[Hashable]:
        """The peers dropped since the last call (the glue may cancel their calls and ``remove_peer``)."""
        out, self._new_drops = self._new_drops, []
        return out

    def stats(self) -> dict[Hashable, PeerStats]:
        """Every peer the session has seen, by id."""
        return {
            pid: PeerStats(
                asked=p.asked,
                blocks=p.blocks,
                bytes=p.bytes,
                rate=p.rate or 0.0,
                rtt=p.rtt or 0.0,
                score=0.0 if not p.active else (p.rate or 0.0) * 0.5**p.consecutive,
                in_flight=p.inflight_blocks,
                dont_haves=p.dont_haves,
                duplicates=p.duplicates,
                failures=p.failures,
                consecutive_failures=p.consecutive,
                active=p.active,
                dropped=p.dropped,
                reason=p.reason,
            )
            for pid, p in self._peers.items()
        }

    # -- internals ------------------------------------------------------------------------------

    def _retry_stuck(self) -> None:
        """Forget the failed attempts on stuck blocks (dont-haves stay): a peer that failed a block
        ``max_attempts`` times may be asked again, ``retry_after`` later."""
        for w in list(self._stuck.values()):
            if self._retriable(w):
                w.tried = None
                self._unstick(w)

    def _retriable(self, w: _Want) -> bool:
        """Whether an active peer failed ``w`` without saying dont-have (so may be asked again)."""
        excluded, tried = w.excluded or (), w.tried
        return bool(tried and any(pid in self._active and pid not in excluded for pid in tried))

    def _charge(self, w: _Want) -> int:
        return w.size if w.size is not None else self.unknown_size

    def _end_claim(self, w: _Want) -> None:
        """The claim on ``w`` ends: back in its place in the queue, anyone may be asked."""
        if not w.coming:
            return
        w.coming = 0.0
        self._claimed_bytes -= w.claim_charge
        if w.state == _PENDING:
            self._npending -= 1
            self._pend(w)

    def _pend(self, w: _Want) -> None:
        w.state = _PENDING
        w.gen += 1
        self._npending += 1
        heapq.heappush(self._heap, ((w.coming > 0.0, w.order), w.seq, w.gen, w))

    def _unstick(self, w: _Want) -> None:
        if w.state == _STUCK:
            del self._stuck[w.cid]
            self._pend(w)

    def _return_wants(self, wants: Iterable[_Want], retry: bool) -> None:
        """Wants a peer no longer carries: stuck ones back to the queue when ``retry`` (the peer
        is still worth asking), the rest settled by their other copies."""
        for w in wants:
            if w.state == _STUCK and retry:
                self._unstick(w)
            else:
                self._settle(w)

    def _settle(self, w: _Want) -> None:
        """Put ``w`` where its live copies say: in flight, or back in the queue."""
        if w.state == _GONE:
            return
        if w.live > 0:
            if w.state == _PENDING:
                self._npending -= 1
            elif w.state == _STUCK:
                del self._stuck[w.cid]
            self._activate(w)
        elif w.state == _ACTIVE:
            del self._inflight[w.cid]
            self._pend(w)

    def _activate(self, w: _Want) -> None:
        self._inflight[w.cid] = w
        w.state = _ACTIVE
        if w.live < self.max_copies:  # a candidate for an endgame copy
            dups = self._dups
            heapq.heappush(dups, (w.order, w.seq, w.gen, w))
            if len(dups) > 2 * len(self._inflight) + 64:  # mostly stale entries: rebuild
                dups[:] = [(v.order, v.seq, v.gen, v) for v in self._inflight.values() if v.live < self.max_copies]
                heapq.heapify(dups)

    def _retire(self, w: _Want) -> None:
        if w.state == _PENDING:
            self._npending -= 1
        elif w.state == _ACTIVE:
            del self._inflight[w.cid]
        elif w.state == _STUCK:
            del self._stuck[w.cid]
        w.state = _GONE
        del self._wants[w.cid]
        if not w.copies:
            del self._holders[w.cid]

    def _release(self, p: _Peer, cid: Hashable, call: _Call) -> _Want | None:
        """Resolve ``p``'s copy of ``cid``: its charge leaves the window; the want (if any) returned."""
        del self._out[(p.id, cid)]
        charge = call.open.pop(cid)
        self._committed -= charge
        p.inflight_bytes -= charge
        p.inflight_blocks -= 1
        w = self._wants.get(cid)
        copies = self._holders[cid]
        copies.discard(p.id)
        if w is None:
            if not copies:
                del self._holders[cid]
        elif not call.stale:
            w.live -= 1
        return w

    def _finish(self, call: _Call, now: float) -> None:
        """Once every CID of ``call`` is answered: score its peer from it."""
        if call.open:
            return
        p = self._peers[call.peer]
        if call.kind == HAVE:
            p.have_calls.discard(call)
        else:
            p.calls.discard(call)
        if call.failed:
            return
        p.heard = now
        a = self.alpha
        elapsed = now - call.sent
        rate = p.rate
        if call.nbytes:
            if call.sent < p.last_done:  # queued behind another call: busy since that one ended
                busy = now - p.last_done
            elif p.rtt is not None:  # sent to an idle peer: the round trip is no transfer time
                busy = max(elapsed - p.rtt, elapsed * 0.1)
            else:
                busy = elapsed
            if busy > 0:  # bytes over busy time, both decayed per call: big transfers weigh most
                p.window_bytes = p.window_bytes * (1 - a) + call.nbytes
                p.window_time = p.window_time * (1 - a) + busy
                p.rate = p.window_bytes / p.window_time
            p.last_done = now
        if (call.alone or call.kind == HAVE) and not call.passed:
            if call.nbytes <= _SMALL:
                sample = elapsed
            elif rate is not None:
                sample = max(0.0, elapsed - call.nbytes / rate)
            else:
                return
            if p.rtt is None or sample < p.rtt:  # follow the minimum, drift up slowly
                p.rtt = sample
            else:
                p.rtt += a * 0.25 * (sample - p.rtt)

    def _penalize(self, p: _Peer) -> None:
        p.consecutive += 1
        p.failures += 1
        if p.consecutive >= self.max_failures and not p.dropped:
            self._drop(p, f"{p.consecutive} failed or timed-out calls in a row")

    def _drop(self, p: _Peer, reason: str) -> None:
        p.dropped = True
        p.reason = reason
        self._new_drops.append(p.id)
        if p.active:
            p.active = False
            del self._active[p.id]
        p.have_queue.clear()
        for call in p.calls:
            call.penalized = True
            if call.stale:
                continue
            call.stale = True
            for cid in call.open:
                w = self._wants.get(cid)
                if w is not None:
                    w.live -= 1
                    self._settle(w)
        for call in p.have_calls:
            call.stale = True

    def _cap(self, p: _Peer) -> float:
        f = 0.5**p.consecutive
        if p.rate is None:
            return self.probe_bytes * f
        return max(self.probe_bytes * f, p.rate * f * (self.horizon + (p.rtt or 0.0)))

    def _batch_bytes(self, p: _Peer) -> float:
        """A call carries at most 1 / max_per_peer_requests of the peer's byte cap: its calls can
        fill the cap, and none is long (a reply arrives whole: a long call delays its first block)."""
        if p.rate is None:
            return self.max_batch_bytes
        return min(self.max_batch_bytes, self._cap(p) / self.max_per_peer_requests)

    def _joins(self, planned: _Plan | None, charge: int) -> bool:
        """Whether a block of ``charge`` bytes joins the last call planned (else it opens one)."""
        return (
            planned is not None
            and planned.calls > 0
            and planned.n < self.max_batch
            and planned.nbytes + charge <= planned.limit
        )

    def _fits(self, p: _Peer, charge: int, planned: _Plan | None) -> bool:
        calls = len(p.calls) + (planned.calls if planned is not None else 0)
        if not self._joins(planned, charge) and calls >= self.max_per_peer_requests:
            return False
        return p.inflight_bytes == 0 or p.inflight_bytes + charge <= self._cap(p)

    def _has_room(self, p: _Peer, planned: _Plan | None) -> bool:
        calls = len(p.calls) + (planned.calls if planned is not None else 0)
        if not self._joins(planned, 0) and calls >= self.max_per_peer_requests:
            return False
        return p.inflight_bytes == 0 or p.inflight_bytes < self._cap(p)

    def _eta(self, p: _Peer, charge: int, rate0: float, rtt0: float) -> float:
        rate = (p.rate if p.rate is not None else rate0) * 0.5**p.consecutive
        return (p.rtt if p.rtt is not None else rtt0) + (p.inflight_bytes + charge) / rate

    def _choose(self, w: _Want, charge: int, plan: dict, rate0: float, rtt0: float) -> tuple[Any, float]:
        """The peer to ask for ``w``: (peer, eta); (_NO_ROOM, 0) if the peers that may be asked
        are busy, (_WAIT, 0) if a busy one would still deliver sooner than any with room; (None,
        0) if no active peer may be asked."""
        best = None
        best_key: tuple[int, float] | None = None
        wait = [float("inf")] * 3  # per tier: the soonest a peer without room would deliver
        primary = fallback = False
        cid, copies, tried, excluded, haves = w.cid, w.copies, w.tried, w.excluded, w.haves
        asks = self._asks if w.have_asked else None
        max_attempts, miss_limit = self.max_attempts, self.miss_limit
        claimed = w.coming > 0.0
        quiet = self._quiet_peers
        for pid, p in self._active.items():
            if pid in copies or (excluded and pid in excluded) or (asks and (pid, cid) in asks):
                continue
            if p.holder_only and not (haves and pid in haves):
                continue  # (asked only for what it said it has)
            if claimed and not (haves and pid in haves):
                primary = True  # (it waits for the fellow's have, or for the claim to end)
                continue
            n = tried.get(pid, 0) if tried else 0
            if n >= max_attempts:
                continue
            if pid in quiet:
                tier = 2  # (a last resort, never waited for: it may never answer)
            elif haves and pid in haves:
                tier = 0
            elif n or p.misses >= miss_limit:
                tier = 2
            else:
                tier = 1
            if tier < 2:
                primary = True
            else:
                fallback = True
            eta = self._eta(p, charge, rate0, rtt0)
            if not self._fits(p, charge, plan.get(pid)):
                if eta < wait[tier]:
                    wait[tier] = eta
                continue
            key = (tier, eta)
            if best_key is None or key < best_key:
                best, best_key = p, key
        if best_key is not None and (best_key[0] < 2 or not primary):  # (set with ``best``)
            tier, eta = best_key
            if min(wait[: tier + 1]) > eta:
                return best, eta
            return _WAIT, 0.0
        return (_NO_ROOM if primary or fallback else None), 0.0

    def _take(self, p: _Peer, w: _Want, charge: int, eta: float, plan: dict) -> None:
        self._committed += charge
        p.inflight_bytes += charge
        p.inflight_blocks += 1
        w.copies.add(p.id)
        w.live += 1
        if w.tried is None:
            w.tried = {}
        w.tried[p.id] = w.tried.get(p.id, 0) + 1
        self._settle(w)
        planned = plan.get(p.id)
        if planned is None:
            planned = plan[p.id] = _Plan(self._batch_bytes(p))
        if not self._joins(planned, charge):
            planned.calls += 1
            planned.n = planned.nbytes = 0
            planned.items.append([])
        planned.n += 1
        planned.nbytes += charge
        planned.items[-1].append((w.cid, charge, eta))

    def _assign(self, now: float, plan: dict, rate0: float, rtt0: float) -> bool:
        """Give pending blocks, in order, to peers with room, within the window; True if the
        window stopped it."""
        heap = self._heap
        open_peers = {pid for pid, p in self._active.items() if self._has_room(p, None)}
        deferred = []
        window_full = False
        head = True  # the first block in order: the window may be waiting on it
        while heap and open_peers:
            entry = heap[0]
            w = entry[3]
            if w.state != _PENDING or entry[2] != w.gen:
                heapq.heappop(heap)
                continue
            charge = self._charge(w)
            # a retry, a claimed block or the head of the queue may use the whole window; other
            # first requests leave the reserve and the claimed blocks' room (they may come
            # before them in order). The head: blocks after it may have filled the rest while
            # it waited for a peer with room, and nothing is written before it arrives
            limit = self.window_bytes if w.tried or w.claimed or head else self._first_limit
            head = False
            if not w.claimed:
                limit -= self._claimed_bytes
            if self._committed and self._committed + charge > limit:
                window_full = True
                break
            heapq.heappop(heap)
            p, eta = self._choose(w, charge, plan, rate0, rtt0)
            if p is None:
                self._npending -= 1
                w.state = _STUCK
                self._stuck[w.cid] = w
                if self._retry_at is None and self._retriable(w):
                    self._retry_at = now + self.retry_after
                continue
            if p is _NO_ROOM or p is _WAIT:
                deferred.append(entry)
                if p is _WAIT or len(deferred) >= _LOOKAHEAD:
                    break
                continue
            self._take(p, w, charge, now + eta, plan)
            if not self._has_room(p, plan[p.id]):
                open_peers.discard(p.id)
        for entry in deferred:
            heapq.heappush(heap, entry)
        return window_full

    def _endgame(self, now: float, plan: dict, rate0: float, rtt0: float, head_only: bool) -> None:
        """Copy in-flight blocks, earliest first, to healthy measured peers that are idle (less
        than one call's bytes in flight) and would deliver sooner than the current copies are
        expected (when due, or, once overdue, when their peer's queue should have drained).
        A block whose every copy waits at a silent peer (nothing from it for ``block_timeout``
        since the call went) is copied to any idle peer that is not silent itself: its call may
        run until a deadline far off, and nothing else would move it meanwhile.
        ``head_only`` (the window is full, the queue not empty): only the earliest blocks, the
        ones the window waits on."""
        spare = [
            p
            for p in self._active.values()
            if p.inflight_bytes < self._batch_bytes(p)
            and self._has_room(p, plan.get(p.id))
            and p.id not in self._quiet_peers
        ]
        idle = [p for p in spare if p.consecutive == 0 and p.misses < self.miss_limit and p.rate is not None]
        heap = self._dups
        passed = []
        while heap and spare:
            entry = heap[0]
            w = entry[3]
            if w.state != _ACTIVE or w.live >= self.max_copies:
                heapq.heappop(heap)
                continue
            charge = self._charge(w)
            if self._committed + charge > self.window_bytes - self._claimed_bytes:
                break
            heapq.heappop(heap)
            expected = None
            for pid in w.copies:
                call = self._out.get((pid, w.cid))
                if call is None:  # asked in this very round
                    expected = None
                    break
                if not call.stale:  # overdue: when its peer's queue should have drained
                    if self._silent(call, now):
                        t = float("inf")
                    else:
                        t = call.eta if now < call.eta else now + self._eta(self._peers[pid], 0, rate0, rtt0)
                    expected = t if expected is None else min(expected, t)
            best = None
            if expected is not None:
                for p in spare if expected == float("inf") else idle:
                    pid = p.id
                    if (
                        pid in w.copies
                        or (w.excluded and pid in w.excluded)
                        or (p.holder_only and not (w.haves and pid in w.haves))
                        or (w.tried and w.tried.get(pid, 0) >= self.max_attempts)
                        or (pid, w.cid) in self._asks
                        or (p.inflight_bytes and p.inflight_bytes + charge > self._batch_bytes(p))
                        or not self._fits(p, charge, plan.get(pid))
                    ):
                        continue
                    t = now + self._eta(p, charge, rate0, rtt0)
                    if t < expected and (best is None or t < best[1]):
                        best = (p, t)
            if best is not None:
                p = best[0]
                self._take(p, w, charge, best[1], plan)
                if p.inflight_bytes >= self._batch_bytes(p) or not self._has_room(p, plan.get(p.id)):
                    spare.remove(p)
                    if p in idle:
                        idle.remove(p)
            else:
                passed.append(entry)
                if head_only or len(passed) >= _LOOKAHEAD:
                    break
        for entry in passed:
            heapq.heappush(heap, entry)

    def _abandon(self, p: _Peer, call: _Call, now: float) -> None:
        """A want-block whose peer said nothing at all since it went, for ``abandon_after`` or
        until its deadline, whichever comes first (a path that broke under it, a peer that
        froze): failed now — not kept until its hard deadline, nor its deadline when that is far
        off (queued bytes at ``min_rate``: half a minute for a probe) — its blocks asked again,
        of the same peer too, on a new call, and the glue told to cancel it. A peer that answers
        anything keeps the deadlines as they are (and its late answers count)."""
        cids = tuple(call.open)
        touched = []
        for cid in cids:
            w = self._release(p, cid, call)
            if w is not None:
                touched.append(w)
        call.failed = True
        self._finish(call, now)
        if not call.penalized and touched:
            call.penalized = True
            self._penalize(p)
        self._return_wants(touched, p.active)
        self._abandoned.append((p.id, cids))

    def _silent(self, call: _Call, now: float) -> bool:
        """Whether ``call`` waited ``block_timeout`` and its peer answered nothing since it went."""
        return call.sent + self.block_timeout <= now and self._peers[call.peer].heard < call.sent  # (the wakeup's sum)

    def _quiet(self, p: _Peer, now: float) -> bool:
        """Whether one of ``p``'s calls is silent (no copy of a silent peer's block goes to it)."""
        return any(self._silent(c, now) for c in p.calls if not c.stale)

    def _emit(self, now: float, plan: dict) -> list[Request]:
        out = []
        for pid, planned in plan.items():
            p = self._peers[pid]
            for chunk in planned.items:
                charges = {cid: charge for cid, charge, _ in chunk}
                nbytes = sum(charges.values())
                deadline = now + self.block_timeout + p.inflight_bytes / self.min_rate
                call = _Call(pid, BLOCK, now, deadline, max(e for _, _, e in chunk), charges, alone=not p.calls)
                for cid in charges:
                    self._out[(pid, cid)] = call
                p.calls.add(call)
                p.asked += len(charges)
                heapq.heappush(self._timers, (deadline, next(self._seq), call))
                if self.max_copies > 1:  # (endgame wakeups: when due, and when silent if no answer came)
                    heapq.heappush(self._dues, (call.eta, next(self._seq), call))
                    heapq.heappush(self._dues, (now + self.block_timeout, next(self._seq), call))
                heapq.heappush(self._silences, (min(deadline, now + self.abandon_after), next(self._seq), call))
                out.append(Request(pid, BLOCK, tuple(charges), deadline, deadline + self.block_timeout, nbytes))
        return out

    def _have_requests(self, now: float, out: list[Request]) -> None:
        """Ask new peers want-have for the blocks stuck when they joined."""
        for pid, p in self._active.items():
            queue = p.have_queue
            while queue and len(p.have_calls) < self.max_per_peer_requests:
                cids: list[Hashable] = []
                while queue and len(cids) < self.max_have_batch:
                    cid = queue.popleft()
                    w = self._wants.get(cid)
                    if (
                        w is None
                        or w.state != _STUCK
                        or (w.excluded and pid in w.excluded)
                        or (w.have_asked and pid in w.have_asked)
                        or (w.haves and pid in w.haves)
                    ):
                        continue
                    if w.have_asked is None:
                        w.have_asked = set()
                    w.have_asked.add(pid)
                    cids.append(cid)
                if not cids:
                    break
                deadline = now + self.block_timeout
                call = _Call(pid, HAVE, now, deadline, deadline, dict.fromkeys(cids, 0), alone=False)
                for cid in cids:
                    self._asks[(pid, cid)] = call
                p.have_calls.add(call)
                heapq.heappush(self._timers, (deadline, next(self._seq), call))
                out.append(Request(pid, HAVE, tuple(cids), deadline, deadline + self.block_timeout, 0))
