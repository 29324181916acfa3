"""The scheduler of a Bitswap-style fetch session: which peer is asked for which block, and when.

Sans-IO: a plain object told what the glue saw (peers, wants, answers, the time as ``now``) that
answers with the want-block / want-have calls to make; it never reads a clock or touches a socket,
so it is tested by simulation. See :class:`FetchSession` for the rules and the glue's contract.

In layers, each on the one below: :mod:`~lattica.content._fetch_records` (the records: requests,
arrivals, peer stats, and what is kept per block, call and peer), :mod:`~lattica.content._fetch_state`
(the state and its bookkeeping: wants' states, the window, peers scored),
:mod:`~lattica.content._fetch_plan` (time and decisions: timeouts, whom to ask, the endgame), and
this module (the glue's side: peers, wants, answers, and what the glue reads).
"""

from __future__ import annotations

import heapq
from collections import deque
from collections.abc import Hashable, Sequence
from typing import Any

from lattica.content._fetch_plan import FetchPlanner
from lattica.content._fetch_records import PENDING, STUCK, Arrival, Peer, PeerStats, Want
from lattica.errors import BlockNotFound

__all__ = ["FetchSession", "PASS_LAPSES"]

PASS_LAPSES = 3  # claims a provider passed us that may lapse before its passes are just asked again


class FetchSession(FetchPlanner):
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
            p = self._peers[peer] = Peer(peer)
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
            w = self._wants[cid] = Want(cid, size, order[i] if order is not None else seq, seq, copies)
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
            if w.state == STUCK and p.active:
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
        if w.state == PENDING:
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
