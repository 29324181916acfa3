"""The state of a fetch session (:mod:`lattica.content._session`) and its bookkeeping, sans-IO:
the settings, each wanted block's state (queued, in flight, stuck, gone) and its copies, the
window's charges, and the peers scored as their calls end (rate, rtt, failures in a row, drops).
:class:`FetchState` is the bottom of the session: the planner and the glue's API build on it."""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Hashable, Iterable
from typing import Any

from lattica.content._fetch_records import ACTIVE, GONE, HAVE, PENDING, STUCK, Call, Peer, Want

__all__ = ["FetchState"]

_SMALL = 16 << 10  # a call carrying at most this measures the rtt as it is


class FetchState:
    """A fetch session's settings and state, and the rules that keep them consistent; the
    settings are :class:`~lattica.content._session.FetchSession`'s (its docstring says what each
    does)."""

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
        self._peers: dict[Hashable, Peer] = {}
        self._active: dict[Hashable, Peer] = {}
        self._wants: dict[Hashable, Want] = {}
        self._heap: list[tuple[Any, int, int, Want]] = []  # pending blocks by ((claimed, order), seq)
        self._npending = 0
        self._inflight: dict[Hashable, Want] = {}
        self._dups: list[tuple[Any, int, int, Want]] = []  # in-flight blocks by order, for the endgame
        self._stuck: dict[Hashable, Want] = {}
        self._comings: list[tuple[float, int, Want]] = []  # claims by when they end (wakeups)
        self._claimed_bytes = 0  # charges of the blocks claimed now
        self._retry_at: float | None = None  # when stuck blocks are tried again at peers that failed them
        self._now = float("-inf")  # the latest time seen
        self._quiet_peers: set[Hashable] = set()  # active peers with a silent call (this round)
        self._out: dict[tuple[Hashable, Hashable], Call] = {}  # outstanding want-blocks
        self._holders: dict[Hashable, set[Hashable]] = {}  # CID -> peers in _out, outlives a cancel
        self._asks: dict[tuple[Hashable, Hashable], Call] = {}  # outstanding want-haves
        self._timers: list[tuple[float, int, Call]] = []
        self._dues: list[tuple[float, int, Call]] = []  # when calls are expected back (endgame wakeups)
        self._silences: list[tuple[float, int, Call]] = []  # when a want-block is given up if its peer says nothing
        self._abandoned: list[tuple[Hashable, tuple[Hashable, ...]]] = []  # (peer, CIDs) for the glue to cancel
        self._held: dict[Hashable, int] = {}  # fresh blocks not yet written
        self._received: set[Hashable] = set()
        self._committed = 0
        self._seq = itertools.count()
        self._new_drops: list[Hashable] = []
        self.received_blocks = 0
        self.received_bytes = 0
        self.wasted_bytes = 0  # duplicates and late copies, discarded

    # -- the wants' states ----------------------------------------------------------------------

    def _retry_stuck(self) -> None:
        """Forget the failed attempts on stuck blocks (dont-haves stay): a peer that failed a block
        ``max_attempts`` times may be asked again, ``retry_after`` later."""
        for w in list(self._stuck.values()):
            if self._retriable(w):
                w.tried = None
                self._unstick(w)

    def _retriable(self, w: Want) -> bool:
        """Whether an active peer failed ``w`` without saying dont-have (so may be asked again)."""
        excluded, tried = w.excluded or (), w.tried
        return bool(tried and any(pid in self._active and pid not in excluded for pid in tried))

    def _charge(self, w: Want) -> int:
        return w.size if w.size is not None else self.unknown_size

    def _end_claim(self, w: Want) -> None:
        """The claim on ``w`` ends: back in its place in the queue, anyone may be asked."""
        if not w.coming:
            return
        w.coming = 0.0
        self._claimed_bytes -= w.claim_charge
        if w.state == PENDING:
            self._npending -= 1
            self._pend(w)

    def _pend(self, w: Want) -> None:
        w.state = PENDING
        w.gen += 1
        self._npending += 1
        heapq.heappush(self._heap, ((w.coming > 0.0, w.order), w.seq, w.gen, w))

    def _unstick(self, w: Want) -> None:
        if w.state == STUCK:
            del self._stuck[w.cid]
            self._pend(w)

    def _return_wants(self, wants: Iterable[Want], retry: bool) -> None:
        """Wants a peer no longer carries: stuck ones back to the queue when ``retry`` (the peer
        is still worth asking), the rest settled by their other copies."""
        for w in wants:
            if w.state == STUCK and retry:
                self._unstick(w)
            else:
                self._settle(w)

    def _settle(self, w: Want) -> None:
        """Put ``w`` where its live copies say: in flight, or back in the queue."""
        if w.state == GONE:
            return
        if w.live > 0:
            if w.state == PENDING:
                self._npending -= 1
            elif w.state == STUCK:
                del self._stuck[w.cid]
            self._activate(w)
        elif w.state == ACTIVE:
            del self._inflight[w.cid]
            self._pend(w)

    def _activate(self, w: Want) -> None:
        self._inflight[w.cid] = w
        w.state = ACTIVE
        if w.live < self.max_copies:  # a candidate for an endgame copy
            dups = self._dups
            heapq.heappush(dups, (w.order, w.seq, w.gen, w))
            if len(dups) > 2 * len(self._inflight) + 64:  # mostly stale entries: rebuild
                dups[:] = [(v.order, v.seq, v.gen, v) for v in self._inflight.values() if v.live < self.max_copies]
                heapq.heapify(dups)

    def _retire(self, w: Want) -> None:
        if w.state == PENDING:
            self._npending -= 1
        elif w.state == ACTIVE:
            del self._inflight[w.cid]
        elif w.state == STUCK:
            del self._stuck[w.cid]
        w.state = GONE
        del self._wants[w.cid]
        if not w.copies:
            del self._holders[w.cid]

    # -- calls answered, peers scored -----------------------------------------------------------

    def _release(self, p: Peer, cid: Hashable, call: Call) -> Want | None:
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

    def _finish(self, call: Call, now: float) -> None:
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

    def _penalize(self, p: Peer) -> None:
        p.consecutive += 1
        p.failures += 1
        if p.consecutive >= self.max_failures and not p.dropped:
            self._drop(p, f"{p.consecutive} failed or timed-out calls in a row")

    def _drop(self, p: Peer, reason: str) -> None:
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

    def _abandon(self, p: Peer, call: Call, now: float) -> None:
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
