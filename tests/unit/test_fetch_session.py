"""The fetch scheduler (lattica.content._session), driven as the glue drives it: a simulated swarm of
peers (bandwidth, latency, what they hold, how they misbehave) on a fake clock and an event heap,
with the window and the ask rules checked after every event; plus random event sequences."""

from __future__ import annotations

import heapq
import random
from dataclasses import dataclass, field

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from lattica.content._cid import DAG_PB, Cid
from lattica.content._fetch_records import BLOCK, HAVE
from lattica.content._session import PASS_LAPSES, FetchSession
from lattica.errors import BlockNotFound

KiB = 1024
MiB = 1024 * KiB
LEAF = 256 * KiB


# -- the simulated swarm -------------------------------------------------------------------------


@dataclass
class Tree:
    """A two-level UnixFS-like file: root -> internal nodes -> leaves, each level revealed by its
    parent, leaves written to the file strictly in order."""

    root: Cid
    children: dict[Cid, list[tuple[Cid, int | None, tuple]]]
    sizes: dict[Cid, int]
    leaves: list[Cid]


def make_tree(n_leaves: int, fanout: int = 64, leaf: int = LEAF, tag: str = "") -> Tree:
    leaves = [Cid.of(f"leaf {tag} {i}".encode()) for i in range(n_leaves)]
    sizes = {c: leaf for c in leaves}
    children: dict = {}
    mids = []
    for j in range(0, n_leaves, fanout):
        group = leaves[j : j + fanout]
        mid = Cid.of(f"mid {tag} {j}".encode(), DAG_PB)
        children[mid] = [(c, leaf, (j + k, 1)) for k, c in enumerate(group)]
        sizes[mid] = 40 * len(group) + 16
        mids.append((mid, j))
    root = Cid.of(f"root {tag}".encode(), DAG_PB)
    # an internal node's size is unknown; it is fetched two nodes' worth of leaves ahead of its own,
    # so the walker discovers the next leaves before the window needs them
    children[root] = [(m, None, (j - 2 * fanout, 0)) for m, j in mids]
    sizes[root] = 40 * len(mids) + 16
    return Tree(root, children, sizes, leaves)


@dataclass
class SimPeer:
    bandwidth: float  # bytes/s, serving one call after another
    latency: float = 0.01  # one way, seconds
    holds: set | None = None  # None: everything
    mode: str = (
        "ok"  # ok | silent (never answers want-block) | bad (blocks do not verify) | flaky | gone (refuses calls)
    )
    slows_at: float = float("inf")  # from then on, a tenth of its bandwidth
    loses: int = 0  # its first this-many calls are lost without an answer (a path that broke)
    busy_until: float = 0.0
    calls: int = 0

    def has(self, cid: Cid) -> bool:
        return self.holds is None or cid in self.holds


@dataclass
class Call:
    peer: str
    kind: str
    open: dict  # cid -> bytes charged


@dataclass
class Swarm:
    """The glue, exactly as the real one will be, over simulated peers."""

    s: FetchSession
    tree: Tree
    peers: dict[str, SimPeer]
    claimers: tuple = ()  # peers the glue hears "have" from for every wanted block
    t: float = 0.0
    events: list = field(default_factory=list)
    n: int = 0
    calls: dict = field(default_factory=dict)
    outstanding: dict = field(default_factory=dict)  # (peer, cid) -> call id
    last: dict = field(default_factory=dict)  # (peer, cid) -> last outcome of a want-block
    memory: int = 0  # bytes the glue holds or awaits: must stay within the window
    held: dict = field(default_factory=dict)
    written: int = 0
    asks: list = field(default_factory=list)  # (t, peer, cid) of every want-block
    have_requests: list = field(default_factory=list)
    fresh_from: dict = field(default_factory=dict)
    cancels: list = field(default_factory=list)
    bad: list = field(default_factory=list)  # (t, peer)
    dropped_at: dict = field(default_factory=dict)
    max_copies_seen: int = 0
    timers: set = field(default_factory=set)
    copies: dict = field(default_factory=dict)  # cid -> outstanding want-blocks
    abandoned: list = field(default_factory=list)  # (t, peer, cids) of want-blocks the session gave up

    def __post_init__(self) -> None:
        self.charge = {self.tree.root: None}
        for kids in self.tree.children.values():
            for c, size, _ in kids:
                self.charge[c] = size

    def at(self, t: float, fn, *args) -> None:
        heapq.heappush(self.events, (t, self.n, fn, args))
        self.n += 1

    def start(self, names=None) -> None:
        self.want([(self.tree.root, None, (-1, 0))])
        for name in names if names is not None else self.peers:
            self.s.add_peer(name, self.t)

    def run(self, until: float = 1e9) -> None:
        self.pump()
        while self.events and not self.s.done:
            t, _, fn, args = heapq.heappop(self.events)
            if t > until:
                heapq.heappush(self.events, (t, -1, fn, args))
                break
            self.t = t
            fn(*args)
            self.pump()

    def pump(self) -> None:
        requests = self.s.next_requests(self.t)
        for peer, cids in self.s.take_abandoned():  # the glue cancels them (before the new calls go)
            call_id = self.outstanding.get((peer, cids[0]))
            call = self.calls.pop(call_id, None)
            assert call is not None and set(call.open) == set(cids), "an abandoned call the glue does not have"
            for c in cids:
                self._close(call, c, "failure")
            self.abandoned.append((self.t, peer, cids))
        for r in requests:
            self.send(r)
        for name in self.s.take_dropped():
            self.dropped_at[name] = self.t
            self.dropped(name)
        wake = self.s.next_wakeup()
        if wake is not None and wake not in self.timers:  # one timer per instant, as a real loop keeps
            assert wake > self.t
            self.timers.add(wake)
            self.at(wake, self.timers.discard, wake)
        assert self.memory == self.s.in_flight_bytes
        assert self.memory <= self.s.window_bytes

    def dropped(self, name: str) -> None:
        """The session dropped ``name`` (this glue lets its calls run out)."""

    def want(self, kids) -> None:
        self.s.want([c for c, _, _ in kids], [z for _, z, _ in kids], [o for _, _, o in kids])
        for name in self.claimers:
            for c, _, _ in kids:
                self.s.on_have(name, c, self.t)

    def send(self, r) -> None:
        peer = self.peers[r.peer]
        assert r.cids and r.deadline > self.t and r.hard_deadline >= r.deadline
        assert r.peer not in self.dropped_at, "a dropped peer was asked again"
        call_id = self.n
        if r.kind == BLOCK:
            assert len(r.cids) <= self.s.max_batch
            for c in r.cids:
                key = (r.peer, c)
                assert key not in self.outstanding, "asked a peer twice at once for one block"
                assert self.last.get(key, "failure") == "failure", f"asked again after {self.last.get(key)}"
                self.outstanding[key] = call_id
                self.asks.append((self.t, r.peer, c))
            charges = {c: self.s.unknown_size if self.charge[c] is None else self.charge[c] for c in r.cids}
            assert sum(charges.values()) == r.nbytes
            self.memory += r.nbytes
            for c in r.cids:
                self.copies[c] = n = self.copies.get(c, 0) + 1
                self.max_copies_seen = max(self.max_copies_seen, n)
        else:
            self.have_requests.append((self.t, r.peer, r.cids))
            charges = dict.fromkeys(r.cids, 0)
        self.calls[call_id] = Call(r.peer, r.kind, charges)
        self.n += 1
        self.at(r.hard_deadline, self.resolve, call_id, "timeout")
        peer.calls += 1
        arrive = self.t + peer.latency
        if peer.loses and peer.calls <= peer.loses:
            pass  # (lost on a path that broke under it: never answered)
        elif peer.mode == "gone" or (peer.mode == "flaky" and peer.calls % 3 == 0):
            self.at(arrive + peer.latency, self.resolve, call_id, "closed")
        elif r.kind == HAVE:
            self.at(arrive + peer.latency, self.answer, call_id)
        elif peer.mode != "silent":
            nbytes = sum(self.tree.sizes[c] for c in r.cids if peer.has(c))
            bandwidth = peer.bandwidth if self.t < peer.slows_at else peer.bandwidth / 10
            peer.busy_until = max(arrive, peer.busy_until) + nbytes / bandwidth
            self.at(peer.busy_until + peer.latency, self.answer, call_id)

    def _close(self, call: Call, c: Cid, outcome: str) -> None:
        if call.kind == BLOCK:
            del self.outstanding[(call.peer, c)]
            self.copies[c] -= 1
            self.memory -= call.open[c]
            self.last[(call.peer, c)] = outcome
        del call.open[c]

    def resolve(self, call_id: int, reason: str) -> None:
        call = self.calls.pop(call_id, None)
        if call is None or not call.open:
            return
        cids = list(call.open)
        for c in cids:
            self._close(call, c, "failure")
        self.s.on_failure(call.peer, cids, self.t, reason)

    def answer(self, call_id: int) -> None:
        call = self.calls.pop(call_id, None)
        if call is None:
            return
        peer = self.peers[call.peer]
        for c in list(call.open):
            if call.kind == HAVE:
                self._close(call, c, "have")
                (self.s.on_have if peer.has(c) else self.s.on_dont_have)(call.peer, c, self.t)
            elif not peer.has(c):
                self._close(call, c, "dont-have")
                self.s.on_dont_have(call.peer, c, self.t)
            elif peer.mode == "bad":
                self._close(call, c, "bad")
                self.bad.append((self.t, call.peer))
                self.s.on_bad_block(call.peer, c, self.t)
            else:
                self._close(call, c, "block")
                self.arrived(call.peer, c)

    def arrived(self, name: str, c: Cid) -> None:
        size = self.tree.sizes[c]
        a = self.s.on_block(name, c, size, self.t)
        if not a.fresh:
            return
        self.fresh_from[c] = name
        self.memory += size
        if a.cancel:
            self.cancels.append((c, name, a.cancel))
        for other in a.cancel:  # the glue cancels the now redundant copies
            call_id = self.outstanding.get((other, c))
            if call_id is not None:
                self._close(self.calls[call_id], c, "cancelled")
                self.s.on_failure(other, [c], self.t, "cancelled")
        kids = self.tree.children.get(c)
        if kids is not None:  # an internal node: the walker reveals its children, then drops it
            self.want(kids)
            self.s.on_written(c)
            self.memory -= size
            return
        self.held[c] = size
        leaves = self.tree.leaves
        while self.written < len(leaves) and leaves[self.written] in self.held:
            self.memory -= self.held.pop(leaves[self.written])
            self.s.on_written(leaves[self.written])
            self.written += 1

    def share(self, name: str) -> float:
        leaves = set(self.tree.leaves)
        return sum(1 for c, p in self.fresh_from.items() if p == name and c in leaves) / len(leaves)


def session(**kw) -> FetchSession:
    kw.setdefault("window_bytes", 16 * MiB)
    kw.setdefault("block_timeout", 2.0)
    kw.setdefault("min_rate", 1 << 30)
    return FetchSession(**kw)


def finished(sw: Swarm) -> None:
    assert sw.s.done and not sw.s.stuck()
    assert sw.written == len(sw.tree.leaves)  # every leaf, in file order
    assert sw.memory == 0 and sw.s.in_flight_bytes == 0


# -- scenarios -----------------------------------------------------------------------------------


def test_equal_peers_fetch_everything_in_order_within_the_window():
    sw = Swarm(session(), make_tree(600), {n: SimPeer(4 * MiB, 0.02) for n in "abc"})
    sw.start()
    sw.run()
    finished(sw)
    asked = {(p, c) for _, p, c in sw.asks}
    assert len(asked) == len(sw.asks)  # no peer was asked twice for a block
    assert all(0.2 < sw.share(n) < 0.5 for n in "abc")
    stats = sw.s.stats()
    assert sum(st_.blocks for st_ in stats.values()) == len(sw.tree.leaves) + len(sw.tree.children)  # + inner nodes
    assert all(st_.rate > 0 and st_.in_flight == 0 and not st_.dropped for st_ in stats.values())


def test_a_ten_times_faster_peer_serves_most_blocks():
    sw = Swarm(session(), make_tree(400), {"slow": SimPeer(1 * MiB, 0.02), "fast": SimPeer(10 * MiB, 0.02)})
    sw.start()
    sw.run()
    finished(sw)
    assert sw.share("fast") > 0.7
    stats = sw.s.stats()
    assert stats["fast"].rate > 5 * stats["slow"].rate


def test_a_peer_that_says_have_then_never_sends_times_out_and_is_dropped():
    peers = {"liar": SimPeer(100 * MiB, 0.01, mode="silent"), "honest": SimPeer(8 * MiB, 0.01)}
    sw = Swarm(session(block_timeout=0.5), make_tree(200), peers, claimers=("liar",))
    sw.start()
    sw.run()
    finished(sw)
    stats = sw.s.stats()
    assert stats["liar"].dropped and stats["liar"].blocks == 0 and not stats["liar"].active
    assert stats["liar"].failures >= sw.s.max_failures
    asked_liar = {c for _, p, c in sw.asks if p == "liar"}
    assert asked_liar and all(sw.fresh_from[c] == "honest" for c in asked_liar)
    assert len(asked_liar) < 10  # its share shrank with each timeout
    assert "liar" in sw.dropped_at


def test_blocks_waiting_at_a_silent_peer_are_copied_to_an_idle_one_after_block_timeout():
    """A peer that says nothing may hold its calls until a deadline far off (block_timeout plus
    its queued bytes at min_rate: 33 s for a 4 MiB probe). Once a call has waited block_timeout
    with no answer of any kind from its peer, its blocks get a copy at an idle peer that is not
    silent itself, even one never measured or with a failure in a row."""
    peers = {"mute": SimPeer(100 * MiB, 0.01, mode="silent"), "honest": SimPeer(50 * MiB, 0.01)}
    sw = Swarm(
        session(block_timeout=1.0, min_rate=128 * KiB, probe_bytes=4 * MiB, max_batch_bytes=4 * MiB),
        make_tree(12, fanout=256, leaf=MiB),
        peers,
    )
    sw.start(["mute", "honest"])
    sw.run()
    finished(sw)
    assert sw.t < 4.0, sw.t  # not the mute peer's 33 s deadline
    assert {c for _, p, c in sw.asks if p == "mute"} and sw.share("honest") == 1.0


def test_a_want_block_lost_at_the_only_peer_is_given_up_and_asked_again_before_its_hard_deadline():
    """The only provider's first call is lost (the path under it broke: a relay replaced by a
    punched path): it has said nothing by the call's deadline (or for twice block_timeout, when
    that comes first), so the call is given up — the glue cancels it — and its blocks are asked of
    the same peer on a new call, instead of waiting for the hard deadline, 10 s later, the first
    time the same peer could be asked again."""
    only = SimPeer(50 * MiB, 0.01, loses=1)
    sw = Swarm(
        session(block_timeout=10.0, min_rate=128 * KiB, probe_bytes=4 * MiB, max_batch_bytes=4 * MiB),
        make_tree(12, fanout=256, leaf=MiB),
        {"only": only},
    )
    sw.start()
    sw.run()
    finished(sw)
    # (the root's call: 10 s + its 1 MiB charge at min_rate)
    assert (
        len(sw.abandoned) == 1 and sw.abandoned[0][0] == pytest.approx(18.0, abs=0.1) and sw.abandoned[0][1] == "only"
    )
    assert sw.t < 20.0, sw.t  # (the glue gives up after find_timeout + block_timeout = 30 s without a block)
    st = sw.s.stats()["only"]
    assert st.active and not st.dropped and st.blocks == 14 and st.failures == 1  # (root, one node, 12 leaves)


def test_a_call_silent_for_twice_block_timeout_is_given_up_before_a_far_deadline():
    """A 4 MiB call's deadline is 42 s away (10 s + 4 MiB at min_rate): a peer that says nothing
    for 20 s has it given up then."""
    s = FetchSession(block_timeout=10.0, min_rate=128 << 10, probe_bytes=4 << 20, max_batch_bytes=4 << 20)
    cids = _cids(4, "far")
    s.want(cids, [1 << 20] * 4)
    s.add_peer("p", 0.0)
    (r,) = s.next_requests(0.0)
    assert r.deadline == pytest.approx(42.0) and s.next_wakeup() <= 20.0
    assert s.next_requests(19.9) == [] and s.take_abandoned() == []
    again = s.next_requests(20.0)
    assert s.take_abandoned() == [("p", r.cids)]
    # the same peer, on a new call (its room halved by the failure: half of them for now)
    assert again and all(q.peer == "p" for q in again) and set().union(*(q.cids for q in again)) < set(cids)
    assert s.stats()["p"].consecutive_failures == 1


def test_a_peer_sending_a_bad_block_is_dropped_at_once_and_the_block_fetched_elsewhere():
    peers = {"bad": SimPeer(50 * MiB, 0.005, mode="bad"), "good": SimPeer(4 * MiB, 0.02)}
    sw = Swarm(session(), make_tree(100), peers)
    sw.start()
    sw.run()
    finished(sw)
    first_bad = sw.bad[0][0]
    assert not [1 for t, p, _ in sw.asks if p == "bad" and t > first_bad]
    assert sw.dropped_at["bad"] == first_bad
    stats = sw.s.stats()
    assert stats["bad"].dropped and "does not match" in stats["bad"].reason
    bad_asked = {c for _, p, c in sw.asks if p == "bad"}
    assert bad_asked and all(sw.fresh_from[c] == "good" for c in bad_asked)


def test_peers_without_the_blocks_are_routed_around():
    tree = make_tree(400)
    first_half = set(tree.leaves[:200]) | set(tree.children)
    peers = {
        "empty": SimPeer(50 * MiB, 0.005, holds=set()),
        "half": SimPeer(4 * MiB, 0.02, holds=first_half),
        "full": SimPeer(4 * MiB, 0.02),
    }
    sw = Swarm(session(), tree, peers)
    sw.start()
    sw.run()
    finished(sw)
    stats = sw.s.stats()
    assert stats["empty"].asked <= sw.s.miss_limit + 4  # after miss_limit dont-haves: a last resort only
    assert stats["empty"].blocks == 0 and not stats["empty"].dropped  # a dont-have is an answer, not a failure
    assert sw.share("half") > 0.15
    assert all(sw.fresh_from[c] == "full" for c in tree.leaves[200:])


def test_a_tiny_window_is_never_exceeded_with_many_uneven_peers():
    rng = random.Random(7)
    peers = {f"p{i}": SimPeer(rng.uniform(0.5, 20) * MiB, rng.uniform(0.001, 0.1)) for i in range(6)}
    sw = Swarm(session(window_bytes=1 * MiB, unknown_size=64 * KiB), make_tree(300, fanout=32), peers)
    sw.start()
    sw.run()  # pump() asserts memory == in_flight_bytes <= window after every event
    finished(sw)


def test_a_flaky_peer_is_asked_again_only_after_a_failure():
    tree = make_tree(200)
    evens = set(tree.leaves[::2]) | set(tree.children)  # the odd leaves only the flaky peer has
    peers = {"flaky": SimPeer(8 * MiB, 0.01, mode="flaky"), "ok": SimPeer(2 * MiB, 0.01, holds=evens)}
    sw = Swarm(session(retry_after=0.5), tree, peers)
    sw.start()
    sw.run()  # send() asserts: never twice at once, again only after "failure"
    finished(sw)
    counts: dict = {}
    for _, p, c in sw.asks:
        counts[(p, c)] = counts.get((p, c), 0) + 1
    assert max(counts.values()) > sw.s.max_attempts  # stuck after max_attempts, then retried
    assert sum(n > 1 for n in counts.values()) > 10
    flaky = sw.s.stats()["flaky"]
    assert flaky.failures > 10 and not flaky.dropped  # one call in three fails: never three in a row


def _endgame_run(max_copies: int) -> Swarm:
    peers = {"a": SimPeer(8 * MiB, 0.01), "b": SimPeer(8 * MiB, 0.01, slows_at=1.5)}  # b degrades
    sw = Swarm(session(max_copies=max_copies, block_timeout=30.0), make_tree(120), peers)
    sw.start()
    sw.run()
    finished(sw)
    return sw


def test_endgame_duplicates_the_tail_and_says_which_copies_to_cancel():
    with_dups, without = _endgame_run(2), _endgame_run(1)
    assert with_dups.t < 0.75 * without.t  # b's last blocks no longer hold the fetch
    assert with_dups.cancels and not without.cancels
    assert {(winner, losers) for _, winner, losers in with_dups.cancels} == {("a", ("b",))}
    assert with_dups.max_copies_seen == 2 and without.max_copies_seen == 1  # bounded
    assert len(with_dups.asks) < 1.1 * len(without.asks)
    b = with_dups.s.stats()["b"]
    assert b.blocks > 0 and b.failures > 0  # copies beaten while overdue count as timeouts


def test_a_block_nobody_holds_is_stuck_until_a_holder_joins():
    tree = make_tree(100)
    first_half = set(tree.leaves[:50]) | set(tree.children)
    peers = {"half": SimPeer(4 * MiB, 0.02, holds=first_half), "late": SimPeer(4 * MiB, 0.02)}
    sw = Swarm(session(), tree, peers)
    sw.start(["half"])
    sw.run()
    assert not sw.s.done and not sw.s.exhausted and sw.s.blocked
    assert sw.s.stuck() == tree.leaves[50:]
    assert sw.written == 50
    assert "50 blocks could not be fetched" in str(sw.s.error())
    assert sw.s.add_peer("late", sw.t) and not sw.s.add_peer("late", sw.t)
    sw.run()
    finished(sw)
    assert sw.have_requests and sw.have_requests[0][1] == "late"
    assert set(sw.have_requests[0][2]) == set(tree.leaves[50:])
    assert all(sw.fresh_from[c] == "late" for c in tree.leaves[50:])


def test_when_every_peer_is_gone_the_session_cannot_finish():
    sw = Swarm(session(), make_tree(200), {n: SimPeer(1 * MiB, 0.02) for n in "ab"})
    sw.start()
    sw.run(until=1.0)
    assert not sw.s.done and not sw.s.exhausted
    for name in "ab":
        sw.s.remove_peer(name)  # the glue forgets their calls with them
        for key in [k for k in sw.outstanding if k[0] == name]:
            call = sw.calls[sw.outstanding[key]]
            sw.memory -= call.open.pop(key[1])
            del sw.outstanding[key]
    assert sw.s.in_flight_bytes == sw.memory  # only the held, unwritten blocks remain charged
    assert sw.s.exhausted and sw.s.next_requests(sw.t) == []
    err = sw.s.error()
    assert isinstance(err, BlockNotFound) and "no peer is left" in str(err)


def test_when_the_only_peer_is_dropped_the_session_cannot_finish():
    sw = Swarm(session(), make_tree(50), {"bad": SimPeer(4 * MiB, mode="bad")})
    sw.start()
    sw.run()
    assert sw.s.exhausted and isinstance(sw.s.error(), BlockNotFound)
    assert not sw.s.add_peer("bad", sw.t)  # dropped for good


def test_a_peer_dropped_for_failures_may_rejoin_and_finish_the_fetch():
    """The only provider timed out three times in a row (a path broke, it was busy): dropped, the
    session is exhausted; taken back (the glue found it again), it is asked afresh, even for the
    blocks it failed, and the fetch completes."""
    solo = SimPeer(8 * MiB, 0.01, mode="silent")
    sw = Swarm(session(block_timeout=0.5), make_tree(40), {"solo": solo})
    sw.start()
    sw.run()
    assert sw.s.exhausted and "solo" in sw.dropped_at
    solo.mode = "ok"
    del sw.dropped_at["solo"]  # (the sim's glue asserts a dropped peer is never asked)
    assert sw.s.add_peer("solo", sw.t)
    assert not sw.s.stats()["solo"].dropped and sw.s.stats()["solo"].consecutive_failures == 0
    sw.run()
    finished(sw)
    assert "solo" not in sw.dropped_at


def test_a_block_a_fellow_claims_waits_for_its_have_and_is_then_asked_of_the_fellow():
    """Claims: fetchers that start together ask their common provider for different blocks. A
    claimed block is not asked of the provider; the fellow's have brings it back (asked of the
    fellow); a claim that is never made good ends after ``coming_for``, and a block is claimed
    only once."""
    a, b, c = (Cid.of(x) for x in (b"a", b"b", b"c"))
    s = FetchSession(window_bytes=16 * MiB, coming_for=1.0)
    for peer in ("seed", "fellow"):
        s.add_peer(peer, 0.0)
    s.want([a, b, c], [LEAF] * 3, [0, 1, 2])
    s.on_coming("fellow", a, 0.0)
    s.on_coming("fellow", c, 0.0)
    asked = {cid: r.peer for r in s.next_requests(0.0) if r.kind == BLOCK for cid in r.cids}
    assert a not in asked and c not in asked and asked.get(b) in ("seed", "fellow")
    assert s.next_wakeup() is not None and s.next_wakeup() <= 1.0  # the claims' end wakes the glue
    s.on_have("fellow", a, 0.1)
    asked = {cid: r.peer for r in s.next_requests(0.1) if r.kind == BLOCK for cid in r.cids}
    assert asked.get(a) == "fellow" and c not in asked
    s.on_coming("fellow", c, 0.5)  # renewed: ignored
    asked = {cid: r.peer for r in s.next_requests(1.01) if r.kind == BLOCK for cid in r.cids}
    assert c in asked  # the claim ended: anyone may be asked


def test_a_claim_from_a_peer_outside_the_session_or_on_a_held_block_is_ignored():
    a = Cid.of(b"a")
    s = FetchSession(window_bytes=16 * MiB)
    s.add_peer("seed", 0.0)
    s.add_peer("holder", 0.0)
    s.want([a], [LEAF])
    s.on_coming("stranger", a, 0.0)  # not in the session
    s.on_have("holder", a, 0.0)
    s.on_coming("holder", a, 0.0)  # someone holds it already: nothing to wait for
    assert [cid for r in s.next_requests(0.0) if r.kind == BLOCK for cid in r.cids] == [a]


def test_a_claim_never_made_good_delays_its_block_once_and_the_window_does_not_stall():
    """A claimant that never announces its have: the head block waits out the claim, then is
    back in its place, and the window (released in file order by this glue) kept room for it:
    later blocks cannot fill it meanwhile."""
    tree = make_tree(64, fanout=64)

    class ClaimHead(Swarm):
        def want(self, kids):
            super().want(kids)
            if any(c == self.tree.leaves[0] for c, _, _ in kids):
                self.s.on_coming("liar", self.tree.leaves[0], self.t)

    for reserve in (0.0, 0.125):
        peers = {"seed": SimPeer(8 * MiB), "liar": SimPeer(8 * MiB, holds=set())}
        sw = ClaimHead(session(window_bytes=8 * LEAF, reserve=reserve), tree, peers)
        sw.start()
        sw.run(until=600)
        finished(sw)
        assert sw.s.stats()["liar"].blocks == 0
        assert sw.t < 2.06 + 2 * sw.s.coming_for  # (the same run without the claim takes 2.06 s)


def test_a_claimant_that_lets_a_claim_lapse_is_not_believed_and_its_other_claims_end():
    a, b, c = (Cid.of(x) for x in (b"a", b"b", b"c"))
    s = FetchSession(window_bytes=16 * MiB, coming_for=1.0, max_claims=2)
    s.add_peer("seed", 0.0)
    s.add_peer("liar", 0.0)
    s.want([a, b, c], [LEAF] * 3, [0, 1, 2])
    s.on_coming("liar", a, 0.0)
    s.on_coming("liar", b, 0.5)
    s.on_coming("liar", c, 0.5)  # beyond max_claims: ignored
    asked = {cid for r in s.next_requests(0.5) for cid in r.cids}
    assert asked == {c}
    asked = {cid for r in s.next_requests(1.0) for cid in r.cids}  # a's claim lapsed: b's ends too
    assert asked == {a, b}
    s.want([Cid.of(b"d")], [LEAF])
    s.on_coming("liar", Cid.of(b"d"), 1.0)  # not believed any more
    assert Cid.of(b"d") in {cid for r in s.next_requests(1.0) for cid in r.cids}


def test_a_holder_only_peer_is_asked_only_for_blocks_it_said_it_has():
    """A fellow that came to us (not asked whether it has anything) is never asked for a block
    it did not announce: a silent one holds nothing up."""
    a, b = Cid.of(b"a"), Cid.of(b"b")
    s = FetchSession(window_bytes=16 * MiB)
    s.add_peer("fellow", 0.0, holder_only=True)
    s.want([a, b], [LEAF] * 2)
    assert [r for r in s.next_requests(0.0) if r.kind == BLOCK] == []
    s.on_have("fellow", b, 0.0)
    assert [cid for r in s.next_requests(0.0) if r.kind == BLOCK for cid in r.cids] == [b]
    s.add_peer("seed", 0.1)  # a was stuck (no peer might be asked): the newcomer is asked want-have
    assert [(r.kind, r.cids) for r in s.next_requests(0.1)] == [(HAVE, (a,))]
    s.on_have("seed", a, 0.2)
    assert [(r.peer, r.cids) for r in s.next_requests(0.2) if r.kind == BLOCK] == [("seed", (a,))]


def test_a_holder_only_peer_is_asked_want_have_for_blocks_that_got_stuck_after_it_joined():
    """A libp2p node that lacks the root may hold the leaves (the Lattica SDK stores no dag-pb
    node): a block the providers turn out not to have is asked of it with a want-have."""
    a = Cid.of(b"a")
    s = FetchSession(window_bytes=16 * MiB)
    s.add_peer("sdk", 0.0, holder_only=True)
    s.add_peer("seed", 0.0)
    s.want([a], [LEAF])
    assert [(r.peer, r.kind) for r in s.next_requests(0.0)] == [("seed", BLOCK)]
    s.on_dont_have("seed", a, 0.1)  # the provider lacks it: stuck, and the holder-only peer is asked
    assert [(r.peer, r.kind, r.cids) for r in s.next_requests(0.1)] == [("sdk", HAVE, (a,))]
    s.on_have("sdk", a, 0.2)
    assert [(r.peer, r.cids) for r in s.next_requests(0.2) if r.kind == BLOCK] == [("sdk", (a,))]


def test_a_liar_whose_have_came_in_the_tick_its_want_block_went_is_silent_on_a_coarse_clock():
    """uvloop's clock moves in whole milliseconds and holds still through a loop iteration: a
    lying provider's have and the want-block it prompts carry the same time. Nothing came after
    the call, so it is silent after block_timeout and the block goes to the honest peer (never
    measured), long before the call's deadline (block_timeout + its charge at min_rate)."""
    root = Cid.of(b"root")
    s = FetchSession(block_timeout=1.0, min_rate=128 * KiB, window_bytes=16 * MiB)
    s.want([root], None)
    s.add_peer("liar", 0.0, holder_only=True)
    s.on_have("liar", root, 0.0)
    assert [(r.peer, r.kind) for r in s.next_requests(0.0)] == [("liar", BLOCK)]
    s.add_peer("honest", 0.0)
    s.on_have("honest", root, 0.01)  # (its answer to the probe: the block is already asked of the liar)
    assert [r for r in s.next_requests(0.5) if r.kind == BLOCK] == []
    wake = s.next_wakeup()
    assert wake is not None and wake <= 1.0
    assert [(r.peer, r.cids) for r in s.next_requests(wake) if r.kind == BLOCK] == [("honest", (root,))]


class _Churn(Swarm):
    """The glue's peer handling too: a dropped peer is removed (its calls cancelled) and, unless
    it sent a bad block, taken back after a while when it still says it has the root; ``dying``
    goes away (its calls fail, new ones are refused) once a few blocks arrived."""

    def __post_init__(self) -> None:
        super().__post_init__()
        self.rng = random.Random()
        self.progress = 0.0  # the last fresh block, or peer taken back
        self.longest_gap = 0.0
        self.dead = False

    def pump(self) -> None:
        super().pump()
        self.longest_gap = max(self.longest_gap, self.t - self.progress)

    def arrived(self, name: str, c: Cid) -> None:
        before = len(self.fresh_from)
        super().arrived(name, c)
        if len(self.fresh_from) > before:
            self.progress = self.t
            if not self.dead and len(self.fresh_from) > 3:
                self.dead = True
                self.peers["dying"].mode = "gone"
                for call_id, call in list(self.calls.items()):
                    if call.peer == "dying":
                        self.at(self.t + 0.001, self.resolve, call_id, "closed")

    def dropped(self, name: str) -> None:
        self.s.remove_peer(name)
        for (peer, c), call_id in list(self.outstanding.items()):
            if peer == name and c in self.calls[call_id].open:
                self._close(self.calls[call_id], c, "cancelled")
        if name == "mute":  # says it has the root: found again, taken back after sitting out
            self.at(self.t + 2.0 + self.rng.uniform(0, 4), self.retake, name)

    def retake(self, name: str) -> None:
        self.dropped_at.pop(name, None)
        if self.s.add_peer(name, self.t):
            self.progress = self.t


@pytest.mark.parametrize("seed", range(40))
def test_a_liar_a_mute_and_a_dying_provider_never_stall_the_honest_ones_fetch(seed):
    """The mix of the integration test (a provider sending wrong bytes, one never answering, one
    going away mid-transfer, one honest; block_timeout 1 s), in random orders and speeds: blocks
    keep arriving (the glue gives up after find_timeout + block_timeout without one)."""
    rng = random.Random(seed)
    peers = {
        "liar": SimPeer(rng.uniform(20, 200) * MiB, rng.uniform(0.001, 0.05), mode="bad"),
        "mute": SimPeer(100 * MiB, 0.01, mode="silent"),
        "dying": SimPeer(rng.uniform(20, 200) * MiB, rng.uniform(0.001, 0.05)),
        "honest": SimPeer(rng.uniform(5, 200) * MiB, rng.uniform(0.001, 0.05)),
    }
    s = session(
        block_timeout=1.0, min_rate=128 * KiB, probe_bytes=4 * MiB, max_batch_bytes=4 * MiB, window_bytes=64 * MiB
    )
    sw = _Churn(s, make_tree(12, fanout=256, leaf=MiB, tag=str(seed)), peers)
    sw.rng = rng
    order = list(peers)
    rng.shuffle(order)
    sw.start(order)
    sw.run()
    finished(sw)
    assert sw.longest_gap < 2 * s.block_timeout, sw.longest_gap
    assert sw.s.stats()["liar"].blocks == 0


def test_a_large_fetch_with_many_peers():
    rng = random.Random(3)
    peers = {f"p{i}": SimPeer(rng.uniform(2, 40) * MiB, rng.uniform(0.002, 0.05)) for i in range(8)}
    tree = make_tree(10_000, fanout=174, leaf=16 * KiB)
    sw = Swarm(session(window_bytes=64 * MiB, unknown_size=64 * KiB), tree, peers)
    sw.start()
    sw.run()
    finished(sw)
    assert len(sw.asks) < 1.05 * (10_000 + 60)  # few duplicates
    ideal = sum(tree.sizes[c] for c in tree.leaves) / sum(p.bandwidth for p in peers.values())
    assert sw.t < 1.5 * ideal  # every peer kept busy in proportion to its bandwidth
    for name, peer in peers.items():
        assert sw.s.stats()[name].rate == pytest.approx(peer.bandwidth, rel=0.3)


def test_a_round_looks_at_the_blocks_it_hands_out_not_at_every_block(monkeypatch):
    s = FetchSession(window_bytes=1 << 40, probe_bytes=4 * LEAF)
    s.want(list(range(50_000)), [LEAF] * 50_000)  # any hashable names a block
    for i in range(8):
        s.add_peer(i, 0.0)
    looked = []
    choose = s._choose
    monkeypatch.setattr(s, "_choose", lambda *a: looked.append(1) or choose(*a))
    first = s.next_requests(0.0)
    assert sum(len(r.cids) for r in first) == 8 * 4 and len(looked) <= 8 * 4 + 1
    for k in range(1, 200):  # every peer busy: a round costs next to nothing
        looked.clear()
        assert s.next_requests(k * 1e-3) == [] and not looked
    r = first[0]
    s.on_block(r.peer, r.cids[0], LEAF, 0.5)  # one block back: one more handed out
    looked.clear()
    (again,) = s.next_requests(0.5)
    assert again.peer == r.peer and len(again.cids) == 1 and len(looked) <= 2


# -- the session alone ---------------------------------------------------------------------------


def _cids(n: int, tag: str = "") -> list[Cid]:
    return [Cid.of(f"{tag}{i}".encode()) for i in range(n)]


def test_a_new_peer_gets_a_probe_sized_share():
    s = FetchSession(probe_bytes=512 * KiB)
    s.want(_cids(100), [LEAF] * 100)
    s.add_peer("p", 0.0)
    reqs = s.next_requests(0.0)
    assert sum(r.nbytes for r in reqs) == 512 * KiB
    assert s.next_requests(0.0) == []


def test_a_known_holder_is_asked_first():
    s = FetchSession()
    a, b = _cids(2, "k")
    s.add_peer("x", 0.0)
    s.add_peer("y", 0.0)
    s.want([a, b], [10, 10])
    s.on_have("y", a, 0.0)
    assert {r.peer: r.cids for r in s.next_requests(0.0)} == {"y": (a,), "x": (b,)}


def test_a_late_answer_is_used_if_still_wanted_and_discarded_otherwise():
    s = FetchSession(block_timeout=1.0, min_rate=1 << 30)
    a, b = _cids(2)
    s.want([a, b], [10, 10])
    s.add_peer("p", 0.0)
    (r,) = s.next_requests(0.0)
    assert set(r.cids) == {a, b} and s.next_wakeup() <= r.deadline
    s.on_have("p", b, 0.5)  # p talks (a silent peer's call would be given up at its deadline instead)
    assert s.next_requests(r.deadline + 0.1) == []  # timed out; p may not be asked again yet
    assert s.stats()["p"].consecutive_failures == 1
    assert s.stuck() == [a, b]  # nobody else may be asked while p's copies are out
    s.add_peer("q", 1.2)
    (h,) = s.next_requests(1.2)
    assert h.peer == "q" and h.kind == HAVE and set(h.cids) == {a, b} and h.nbytes == 0
    s.on_have("q", a, 1.25)
    s.on_have("q", b, 1.25)
    (r2,) = s.next_requests(1.25)
    assert r2.peer == "q" and r2.kind == BLOCK and set(r2.cids) == {a, b}
    first = s.on_block("q", a, 10, 1.3)
    assert first.fresh and first.cancel == ("p",)
    assert not s.on_block("p", a, 10, 1.4).fresh  # the late copy of a block already received
    arrival = s.on_block("p", b, 10, 1.25)
    assert arrival.fresh and arrival.cancel == ("q",)  # the late copy still wanted: used
    assert s.done
    assert s.in_flight_bytes == 30  # q's copy of b still awaits its report; a and b unwritten
    s.on_failure("q", [b], 1.3, "cancelled")
    s.on_written(a)
    s.on_written(b)
    assert s.in_flight_bytes == 0
    assert s.stats()["q"].failures == 0 and s.stats()["p"].consecutive_failures == 0


def test_cancel_and_repeated_wants():
    s = FetchSession(probe_bytes=2 << 20)
    a, b = _cids(2)
    s.want([a, a, b], [5, 5, None])
    assert s.remaining == 2
    s.add_peer("p", 0.0)
    (r,) = s.next_requests(0.0)
    assert r.nbytes == 5 + s.unknown_size
    assert s.cancel(a) == ("p",) and s.cancel(a) == ()
    assert s.remaining == 1
    assert not s.on_block("p", a, 5, 0.1).fresh
    assert s.on_block("p", b, 7, 0.1).fresh
    s.want([b], [7])  # received already: not fetched again
    assert s.done and s.in_flight_bytes == 7
    s.on_written(b)
    assert s.in_flight_bytes == 0


def test_an_unsolicited_block_is_used_only_within_the_window():
    s = FetchSession(window_bytes=100, reserve=0.0)
    a, b = _cids(2)
    s.want([a, b], [60, 60])
    assert s.on_block("x", a, 60, 0.0).fresh
    assert not s.on_block("x", b, 60, 0.0).fresh  # 120 > 100: discarded
    assert s.in_flight_bytes == 60


def test_bad_settings_are_refused():
    for kw in ({"window_bytes": 0}, {"max_copies": 0}, {"block_timeout": 0}, {"reserve": 1.0}, {"max_batch": 1.5}):
        with pytest.raises(ValueError):
            FetchSession(**kw)
    with pytest.raises(ValueError):
        FetchSession().want(_cids(2), [1])
    with pytest.raises(ValueError):
        FetchSession().want(_cids(1), [-1])


# -- random event sequences ----------------------------------------------------------------------

PEERS = ["p0", "p1", "p2", "p3", "p4"]
CIDS = _cids(10, "h")
SIZES = [None if i % 4 == 0 else 10 * (i + 1) for i in range(10)]
ACTUAL = [s if s is not None else 33 for s in SIZES]  # a block of unknown size is at most unknown_size
OPS = (
    ["next"] * 5
    + ["block"] * 3
    + [
        "dont",
        "have",
        "fail",
        "cancelled",
        "bad",
        "dont-all",
        "add",
        "add",
        "remove",
        "want",
        "cancel",
        "written",
        "written",
        "stray",
        "coming",
    ]
)
events = st.lists(st.tuples(st.sampled_from(OPS), st.integers(0, 1000), st.floats(0, 1.5)), min_size=20, max_size=120)


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(events, st.sampled_from([1, 2, 3]), st.sampled_from([1, 2]), st.sampled_from([0.0, 0.2]), st.booleans())
def test_random_event_sequences_keep_the_invariants(evs, copies, attempts, reserve, retry):
    s = FetchSession(
        window_bytes=150,
        unknown_size=40,
        probe_bytes=30,
        max_batch=3,
        block_timeout=1.0,
        min_rate=1 << 30,
        max_per_peer_requests=2,
        max_copies=copies,
        max_attempts=attempts,
        reserve=reserve,
        retry_after=2.0 if retry else 1e9,
    )
    now = 0.0
    out: dict = {}  # (peer, cid index) -> (kind, charge): the calls the glue awaits
    last: dict = {}  # (peer, cid index) -> outcome of the last question
    held: dict = {}
    gone: set = set()
    wanted, received = set(range(6)), set()
    asked: dict = {}  # (peer, cid index) -> want-blocks sent for the current want
    s.add_peer("p0", now)
    s.add_peer("p1", now)
    s.want(CIDS[:6], SIZES[:6])
    for kind, n, dt in evs:
        if kind == "add":
            if s.add_peer(PEERS[n % 5], now, holder_only=n % 3 == 0):  # (a dropped peer comes back afresh)
                for key in [k for k in asked if k[0] == PEERS[n % 5]]:
                    del asked[key]
        elif kind == "coming":
            s.on_coming(PEERS[n % 5], CIDS[n // 5 % 10], now)
        elif kind == "remove":
            s.remove_peer(PEERS[n % 5])
            for key in [k for k in out if k[0] == PEERS[n % 5]]:
                del out[key]
        elif kind == "want":
            picked = sorted({n % 10, n // 10 % 10})
            s.want([CIDS[i] for i in picked], [SIZES[i] for i in picked])
            wanted |= set(picked) - received
        elif kind == "cancel":
            s.cancel(CIDS[n % 10])
            wanted.discard(n % 10)
            for key in [k for k in last if k[1] == n % 10]:  # a new want of it starts afresh
                del last[key]
            for key in [k for k in asked if k[1] == n % 10]:
                del asked[key]
        elif kind == "next":
            now += dt
            requests = s.next_requests(now)
            for peer, cids in s.take_abandoned():  # the session gave these up: the glue cancels them, no report
                for c in cids:
                    i = CIDS.index(c)
                    assert out.pop((peer, i))[0] == BLOCK, "an abandoned call the glue does not have"
                    if i in wanted:
                        last[(peer, i)] = "failure"
            for r in requests:
                assert s.stats()[r.peer].active and r.peer not in gone
                assert 0 < len(r.cids) <= (s.max_batch if r.kind == BLOCK else s.max_have_batch) and r.deadline > now
                for c in r.cids:
                    i = CIDS.index(c)
                    assert (r.peer, i) not in out, "asked twice at once"
                    if r.kind == BLOCK:
                        assert last.get((r.peer, i), "failure") in ("failure", "have"), "asked again after an answer"
                        asked[(r.peer, i)] = asked.get((r.peer, i), 0) + 1
                        assert retry or asked[(r.peer, i)] <= attempts
                        out[(r.peer, i)] = (BLOCK, SIZES[i] if SIZES[i] is not None else 40)
                    else:
                        out[(r.peer, i)] = (HAVE, 0)
            wake = s.next_wakeup()
            assert wake is None or wake > now  # a glue sleeping until then never spins
        elif kind == "written":
            if held:
                i = sorted(held)[n % len(held)]
                s.on_written(CIDS[i])
                del held[i]
        elif kind == "stray":
            peer, i = PEERS[n % 5], n // 5 % 10
            if (peer, i) not in out and s.on_block(peer, CIDS[i], ACTUAL[i], now).fresh:
                held[i] = ACTUAL[i]
                wanted.discard(i)
                received.add(i)
        elif kind == "dont-all":  # every outstanding question answered "dont-have": blocks get stuck
            for peer, i in sorted(out):
                s.on_dont_have(peer, CIDS[i], now)
                if i in wanted:  # an answer about a cancelled want tells nothing about a new one
                    last[(peer, i)] = "dont-have"
            out.clear()
        elif out:
            key = sorted(out)[n % len(out)]
            peer, i = key
            what, _ = out.pop(key)
            c = CIDS[i]
            last_key = key if i in wanted else None
            if what == HAVE:
                kind = {"block": "have", "bad": "dont"}.get(kind, kind)
            elif kind == "have":
                kind = "block"
            if kind == "block":
                if s.on_block(peer, c, ACTUAL[i], now).fresh:
                    held[i] = ACTUAL[i]
                    wanted.discard(i)
                    received.add(i)
                outcome = "block"
            elif kind == "dont":
                s.on_dont_have(peer, c, now)
                outcome = "dont-have"
            elif kind == "have":
                s.on_have(peer, c, now)
                outcome = "have"
            elif kind == "bad":
                s.on_bad_block(peer, c, now)
                outcome = "bad"
                gone.add(peer)
            else:
                s.on_failure(peer, [c], now, "cancelled" if kind == "cancelled" else "closed")
                outcome = "failure"
            if last_key is not None:
                last[last_key] = outcome
        charged = sum(ch for (what, ch) in out.values() if what == BLOCK)
        assert s.in_flight_bytes == charged + sum(held.values())
        assert 0 <= s.in_flight_bytes <= s.window_bytes
        for st_ in s.stats().values():
            assert min(st_.asked, st_.blocks, st_.bytes, st_.in_flight, st_.failures, st_.consecutive_failures) >= 0
            if st_.dropped:
                assert not st_.active
        assert s.done == (s.remaining == 0)
        assert set(s.stuck()) <= set(CIDS)
        if s.exhausted:
            assert isinstance(s.error(), BlockNotFound)


def _asked(s: FetchSession, now: float) -> dict:
    return {cid: r.peer for r in s.next_requests(now) if r.kind == BLOCK for cid in r.cids}


def test_a_block_a_provider_passes_to_a_fellow_is_claimed_for_the_fellow_and_not_a_dont_have():
    """Super-seeding: the seed answers a want-block with "fellow was sent it a moment ago". The
    block waits (half ``coming_for``) for the fellow's have and is then asked of the fellow; the
    seed is not marked as lacking it, and the call counts as answered, not failed."""
    a, b = Cid.of(b"a"), Cid.of(b"b")
    s = FetchSession(window_bytes=16 * MiB, coming_for=1.0)
    s.add_peer("seed", 0.0)
    s.add_peer("fellow", 0.0, holder_only=True)
    s.want([a, b], [LEAF] * 2, [0, 1])
    assert _asked(s, 0.0) == {a: "seed", b: "seed"}
    s.on_passed("seed", a, "fellow", 0.01)
    assert a not in _asked(s, 0.02)  # claimed: not asked of anyone yet
    s.on_have("fellow", a, 0.1)
    assert _asked(s, 0.1) == {a: "fellow"}
    assert s.stats()["seed"].failures == 0 and s.stats()["seed"].consecutive_failures == 0


def test_passed_claims_that_lapse_count_against_the_provider_not_the_fellow():
    """A pass is the provider's word: its claim lapses after half of ``coming_for`` and the block
    goes back (to the provider too); after PASS_LAPSES lapses the provider's passes are just
    asked again, while the fellow's own claims are still believed."""
    s = FetchSession(window_bytes=64 * MiB, coming_for=1.0)
    s.add_peer("seed", 0.0)
    s.add_peer("fellow", 0.0, holder_only=True)
    t = 0.0
    for i in range(PASS_LAPSES + 2):
        cid = Cid.of(bytes([i]))
        s.want([cid], [LEAF], [i])
        assert _asked(s, t) == {cid: "seed"}
        if i < PASS_LAPSES:  # a pass, then its lapse: asked of the seed again
            s.on_passed("seed", cid, "fellow", t)
            assert _asked(s, t + 0.4) == {}
            assert _asked(s, t + 0.51) == {cid: "seed"}
        elif i == PASS_LAPSES:  # no longer believed: asked again at once
            s.on_passed("seed", cid, "fellow", t)
            assert _asked(s, t) == {cid: "seed"}
        else:  # the fellow's own word still holds
            s.on_dont_have("seed", cid, t)
            s.want([Cid.of(b"own")], [LEAF], [99])
            s.on_coming("fellow", Cid.of(b"own"), t)
            assert Cid.of(b"own") not in _asked(s, t + 0.01)
        s.on_block("seed", cid, LEAF, t + 0.6)
        t += 1.0
    assert s.stats()["seed"].failures == 0


def test_a_provider_that_passes_a_block_again_and_again_cannot_hold_the_fetch_up():
    """Only the first pass of a block by a provider is taken as one; later ones are attempts
    (so ``max_attempts`` ends them) and an answer without bytes never makes it look fast."""
    a = Cid.of(b"a")
    s = FetchSession(window_bytes=16 * MiB, coming_for=1.0)
    s.add_peer("liar", 0.0)
    s.add_peer("honest", 0.0)
    s.want([a], [LEAF])
    t, asked_liar = 0.0, 0
    while True:
        asked = _asked(s, t)
        if asked.get(a) != "liar":
            break
        asked_liar += 1
        assert asked_liar < 10, "the liar keeps being asked"
        s.on_passed("liar", a, "nobody", t + 0.005)
        t += 0.01
    assert asked.get(a) == "honest"
    assert s.stats()["liar"].rtt == 0.0  # (not measured: its quick non-answers say nothing of its speed)


def test_a_late_pass_of_a_stuck_block_lets_it_be_asked_again():
    """The only peer that may be asked is slow; its call passes its deadline (the block is stuck
    meanwhile) and the answer that comes late is a pass: the block is asked again, not blocked."""
    a = Cid.of(b"a")
    s = FetchSession(window_bytes=16 * MiB, block_timeout=1.0, coming_for=1.0)
    s.add_peer("pub", 0.0)
    s.add_peer("other", 0.0)
    s.want([a], [MiB])
    s.on_dont_have("other", a, 0.0)
    (r,) = s.next_requests(0.0)
    s.on_have("pub", Cid.of(b"other"), 0.5)  # (it talks: not silent, only slow)
    s.next_requests(r.deadline + 0.01)
    s.on_passed("pub", a, "not in the session", r.deadline + 0.5)
    assert not s.blocked and [(x.peer, x.kind) for x in s.next_requests(5.0)] == [
        ("pub", BLOCK)
    ]  # (as a failure would)


def test_a_pass_naming_a_stranger_or_the_provider_itself_just_asks_again():
    a = Cid.of(b"a")
    for holder in ("stranger", "seed", None):
        s = FetchSession(window_bytes=16 * MiB, coming_for=1.0)
        s.add_peer("seed", 0.0)
        s.want([a], [LEAF])
        assert _asked(s, 0.0) == {a: "seed"}
        s.on_passed("seed", a, holder, 0.01)
        assert _asked(s, 0.02) == {a: "seed"}
        s.on_passed("nobody", a, "seed", 0.03)  # (an answer from a peer outside the session: ignored)
        assert s.stats()["seed"].failures == 0
