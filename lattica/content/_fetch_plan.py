"""The decisions of a fetch session (:mod:`lattica.content._session`), sans-IO: time (calls
timed out, claims ended, silent calls given up), and each round's plan — which peer is asked
for which block (by expected delivery, within each peer's room and the window), the endgame's
extra copies, and the want-haves for stuck blocks — cut into the requests the glue makes."""

from __future__ import annotations

import heapq
from collections import deque
from collections.abc import Hashable
from typing import Any

from lattica.content._fetch_records import ACTIVE, BLOCK, GONE, HAVE, PENDING, STUCK, Call, Peer, Plan, Request, Want
from lattica.content._fetch_state import FetchState

__all__ = ["FetchPlanner"]

_LOOKAHEAD = 32  # blocks passed over per next_requests because their peers are busy (bounds the scan)
_NO_ROOM = object()  # the peers that may be asked for a block are busy
_WAIT = object()  # a busy peer would still deliver it sooner than any with room


class FetchPlanner(FetchState):
    """Time and decisions: :meth:`tick`, :meth:`next_wakeup` and :meth:`next_requests`, by the
    rules :class:`~lattica.content._session.FetchSession`'s docstring states (whom to ask, the
    window, the endgame, silent peers)."""

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
            if claimant is None or w.state == GONE:
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
            if call.open and p is not None and call in p.calls and _unanswered(p, call):
                self._abandon(p, call, now)
        dues = self._dues
        while dues and dues[0][0] <= now:
            heapq.heappop(dues)
        timers = self._timers
        blamed: list[Peer] = []
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
        plan: dict[Hashable, Plan] = {}
        self._quiet_peers = {pid for pid, p in self._active.items() if self._quiet(p, now)}
        window_full = self._assign(now, plan, rate0, rtt0)
        if (window_full or self._npending == 0) and self._inflight and self.max_copies > 1:
            self._endgame(now, plan, rate0, rtt0, head_only=window_full)
        out = self._emit(now, plan)
        self._have_requests(now, out)
        return out

    # -- a peer's room --------------------------------------------------------------------------

    def _cap(self, p: Peer) -> float:
        f = 0.5**p.consecutive
        if p.rate is None:
            return self.probe_bytes * f
        return max(self.probe_bytes * f, p.rate * f * (self.horizon + (p.rtt or 0.0)))

    def _batch_bytes(self, p: Peer) -> float:
        """A call carries at most 1 / max_per_peer_requests of the peer's byte cap: its calls can
        fill the cap, and none is long (a reply arrives whole: a long call delays its first block)."""
        if p.rate is None:
            return self.max_batch_bytes
        return min(self.max_batch_bytes, self._cap(p) / self.max_per_peer_requests)

    def _joins(self, planned: Plan | None, charge: int) -> bool:
        """Whether a block of ``charge`` bytes joins the last call planned (else it opens one)."""
        return (
            planned is not None
            and planned.calls > 0
            and planned.n < self.max_batch
            and planned.nbytes + charge <= planned.limit
        )

    def _fits(self, p: Peer, charge: int, planned: Plan | None) -> bool:
        calls = len(p.calls) + (planned.calls if planned is not None else 0)
        if not self._joins(planned, charge) and calls >= self.max_per_peer_requests:
            return False
        return p.inflight_bytes == 0 or p.inflight_bytes + charge <= self._cap(p)

    def _has_room(self, p: Peer, planned: Plan | None) -> bool:
        calls = len(p.calls) + (planned.calls if planned is not None else 0)
        if not self._joins(planned, 0) and calls >= self.max_per_peer_requests:
            return False
        return p.inflight_bytes == 0 or p.inflight_bytes < self._cap(p)

    def _eta(self, p: Peer, charge: int, rate0: float, rtt0: float) -> float:
        rate = (p.rate if p.rate is not None else rate0) * 0.5**p.consecutive
        return (p.rtt if p.rtt is not None else rtt0) + (p.inflight_bytes + charge) / rate

    def _silent(self, call: Call, now: float) -> bool:
        """Whether ``call`` waited ``block_timeout`` and its peer answered nothing since it went."""
        return call.sent + self.block_timeout <= now and _unanswered(self._peers[call.peer], call)  # (the wakeup's sum)

    def _quiet(self, p: Peer, now: float) -> bool:
        """Whether one of ``p``'s calls is silent (no copy of a silent peer's block goes to it)."""
        return any(self._silent(c, now) for c in p.calls if not c.stale)

    # -- a round's plan -------------------------------------------------------------------------

    def _choose(self, w: Want, charge: int, plan: dict, rate0: float, rtt0: float) -> tuple[Any, float]:
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

    def _take(self, p: Peer, w: Want, charge: int, eta: float, plan: dict) -> None:
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
            planned = plan[p.id] = Plan(self._batch_bytes(p))
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
            if w.state != PENDING or entry[2] != w.gen:
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
                w.state = STUCK
                self._stuck[w.cid] = w
                for q in self._active.values():  # holder-only peers may have it: ask them want-have
                    if q.holder_only:
                        q.have_queue.append(w.cid)
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
            if w.state != ACTIVE or w.live >= self.max_copies:
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

    def _emit(self, now: float, plan: dict) -> list[Request]:
        out = []
        for pid, planned in plan.items():
            p = self._peers[pid]
            for chunk in planned.items:
                charges = {cid: charge for cid, charge, _ in chunk}
                nbytes = sum(charges.values())
                deadline = now + self.block_timeout + p.inflight_bytes / self.min_rate
                call = Call(pid, BLOCK, now, deadline, max(e for _, _, e in chunk), charges, alone=not p.calls)
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
                        or w.state != STUCK
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
                call = Call(pid, HAVE, now, deadline, deadline, dict.fromkeys(cids, 0), alone=False)
                for cid in cids:
                    self._asks[(pid, cid)] = call
                p.have_calls.add(call)
                heapq.heappush(self._timers, (deadline, next(self._seq), call))
                out.append(Request(pid, HAVE, tuple(cids), deadline, deadline + self.block_timeout, 0))


def _unanswered(p: Peer, call: Call) -> bool:
    """Whether ``p`` said nothing since ``call`` went. An answer at the call's own time came
    before it: a coarse clock (uvloop's, in whole milliseconds) stamps an answer and the call it
    prompted alike."""
    return p.heard <= call.sent
