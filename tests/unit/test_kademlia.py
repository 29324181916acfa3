"""Kademlia's sans-IO parts: ids and XOR distance, the k-bucket routing table (LRU order, pinging the
oldest peer of a full bucket, replacement cache, refresh), and the iterative lookup state machine,
checked alone and over a simulated network of 500 peers against brute force."""

import hashlib
import random
from collections import deque

import pytest

from lattica._identity import KeyPair, PeerId
from lattica.dht._kademlia import ID_BITS, K, Lookup, RoutingTable, distance, key_id, node_id


def make_peer(rng: random.Random) -> PeerId:
    """A PeerId in sha256-multihash form: valid, deterministic under ``rng``, no key to generate."""
    return PeerId.from_bytes(b"\x12\x20" + rng.randbytes(32))


def make_peers(n: int, seed: int) -> list[PeerId]:
    rng = random.Random(seed)
    return [make_peer(rng) for _ in range(n)]


def peers_in_bucket(table: RoutingTable, index: int, n: int, seed: int = 0) -> list[PeerId]:
    """``n`` fresh peers that fall into ``table``'s bucket ``index`` (only cheap for high indexes)."""
    rng = random.Random(seed)
    out = []
    while len(out) < n:
        p = make_peer(rng)
        if table.bucket_index(node_id(p)) == index:
            out.append(p)
    return out


class Clock:
    def __init__(self, t: float = 0.0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


def by_distance(peers, target: int) -> list[PeerId]:
    return sorted(peers, key=lambda p: node_id(p) ^ target)


# -- ids -------------------------------------------------------------------------------------------


def test_ids_are_sha256_of_the_key_and_of_the_peer_id_bytes():
    assert key_id(b"hello") == int.from_bytes(hashlib.sha256(b"hello").digest(), "big")
    p = make_peers(1, seed=1)[0]
    assert node_id(p) == int.from_bytes(hashlib.sha256(p.to_bytes()).digest(), "big")
    assert 0 <= node_id(p) < 1 << ID_BITS
    assert distance(5, 3) == 6


def test_bucket_index_is_the_bit_length_of_the_xor_distance_minus_one():
    local = make_peers(1, seed=2)[0]
    table = RoutingTable(local)
    lid = node_id(local)
    assert table.bucket_index(lid ^ 1) == 0
    assert table.bucket_index(lid ^ 0b10) == 1
    assert table.bucket_index(lid ^ 0b1011) == 3
    assert table.bucket_index(lid ^ (1 << 255)) == 255
    assert table.bucket_index(lid ^ ((1 << 256) - 1)) == 255
    for p in make_peers(200, seed=3):
        i = table.bucket_index(node_id(p))
        assert 2**i <= distance(node_id(p), lid) < 2 ** (i + 1)


# -- routing table -----------------------------------------------------------------------------


def test_table_never_holds_itself():
    local = make_peers(1, seed=4)[0]
    table = RoutingTable(local, k=2)
    assert table.seen(local) is None
    assert local not in table and len(table) == 0
    for p in make_peers(50, seed=5):
        table.seen(p)
    table.seen(local)
    assert local not in table
    assert local not in table.peers()
    assert local not in table.closest(node_id(local), n=1000)


def test_seen_adds_until_the_bucket_is_full_then_returns_the_oldest_to_ping():
    local = make_peers(1, seed=6)[0]
    table = RoutingTable(local, k=3)
    a, b, c, d, e = peers_in_bucket(table, 255, 5)
    assert [table.seen(p) for p in (a, b, c)] == [None, None, None]
    assert len(table) == 3
    assert table.seen(d) == a  # full: ping the least recently seen
    assert d not in table
    assert table.seen(e) is None  # one ping per bucket at a time
    assert e not in table


def test_seen_again_moves_a_peer_to_the_back_of_the_lru_order():
    local = make_peers(1, seed=7)[0]
    table = RoutingTable(local, k=3)
    a, b, c, d = peers_in_bucket(table, 255, 4)
    for p in (a, b, c):
        table.seen(p)
    assert table.seen(a) is None  # known: refreshed, nothing to ping
    assert table.seen(d) == b  # b is now the oldest


def test_an_old_peer_that_answers_the_ping_is_kept():
    local = make_peers(1, seed=8)[0]
    table = RoutingTable(local, k=3)
    a, b, c, d, e = peers_in_bucket(table, 255, 5)
    for p in (a, b, c):
        table.seen(p)
    assert table.seen(d) == a
    table.ping_result(a, alive=True)
    assert set(table.peers()) == {a, b, c}
    assert d not in table
    # a is now the most recently seen, so the next newcomer asks to ping b
    assert table.seen(e) == b


def test_an_old_peer_that_fails_the_ping_is_evicted_for_the_newest_replacement():
    local = make_peers(1, seed=9)[0]
    table = RoutingTable(local, k=3)
    a, b, c, d, e = peers_in_bucket(table, 255, 5)
    for p in (a, b, c):
        table.seen(p)
    assert table.seen(d) == a
    assert table.seen(e) is None  # parked too; a ping is already under way
    table.ping_result(a, alive=False)
    assert a not in table
    assert set(table.peers()) == {b, c, e}
    # the ping is over: a new newcomer may ask for one again
    f = peers_in_bucket(table, 255, 1, seed=99)[0]
    assert table.seen(f) == b


def test_remove_promotes_the_newest_replacement_and_the_cache_holds_at_most_k():
    local = make_peers(1, seed=10)[0]
    table = RoutingTable(local, k=3)
    peers = peers_in_bucket(table, 255, 8)
    members, replacements = peers[:3], peers[3:]
    for p in members:
        table.seen(p)
    for r in replacements:
        table.seen(r)
    # replacements beyond k are forgotten, oldest first: r0 and r1 are gone
    promoted = []
    for m in members:
        table.remove(m)
        promoted.append(next(p for p in table.peers() if p not in members and p not in promoted))
    assert promoted == [replacements[4], replacements[3], replacements[2]]
    table.remove(replacements[4])
    assert set(table.peers()) == {replacements[3], replacements[2]}  # cache empty: bucket shrinks
    table.remove(members[0])  # unknown: no-op
    assert len(table) == 2


def test_remove_without_replacements_just_drops_the_peer():
    local = make_peers(1, seed=11)[0]
    table = RoutingTable(local)
    peers = make_peers(5, seed=12)
    for p in peers:
        table.seen(p)
    table.remove(peers[0])
    assert peers[0] not in table and len(table) == 4
    assert table.seen(peers[0]) is None  # can come back
    assert peers[0] in table


def test_closest_is_sorted_by_xor_distance_and_respects_n_and_exclude():
    local = make_peers(1, seed=13)[0]
    table = RoutingTable(local)
    for p in make_peers(300, seed=14):
        table.seen(p)
    held = table.peers()
    assert len(held) > 40
    rng = random.Random(15)
    for _ in range(5):
        target = rng.getrandbits(256)
        want = by_distance(held, target)
        assert table.closest(target) == want[:K]
        assert table.closest(target, n=7) == want[:7]
        assert table.closest(target, n=7, exclude=want[0]) == want[1:8]
        assert table.closest(target, n=7, exclude=want[20]) == want[:7]
    # the target being a held peer's own id: that peer first, unless excluded
    p = held[0]
    assert table.closest(node_id(p), n=1) == [p]
    assert p not in table.closest(node_id(p), exclude=p)


@pytest.mark.parametrize("index", [0, 1, 2, 7, 100, 200, 254, 255])
def test_random_id_lands_in_the_requested_bucket(index):
    local = make_peers(1, seed=16)[0]
    table = RoutingTable(local)
    rng = random.Random(index)
    ids = {table.random_id(index, rng) for _ in range(20)}
    assert all(table.bucket_index(i) == index for i in ids)
    if index >= 8:
        assert len(ids) > 1  # random, not a fixed point


def test_stale_buckets_respects_the_interval_with_a_fake_clock():
    local = make_peers(1, seed=17)[0]
    clock = Clock(0.0)
    table = RoutingTable(local, clock=clock)
    assert table.stale_buckets(100) == []  # empty table: nothing to refresh
    far = peers_in_bucket(table, 255, 1)[0]
    near = peers_in_bucket(table, 252, 1, seed=1)[0]
    table.seen(far)
    table.seen(near)
    # buckets 252 and 255 were just created; 253 and 254 were never looked into
    assert table.stale_buckets(100) == [253, 254]
    clock.t = 50.0
    table.touch(table.random_id(253))
    assert table.stale_buckets(100) == [254]
    clock.t = 99.9
    assert table.stale_buckets(100) == [254]
    clock.t = 100.0
    assert table.stale_buckets(100) == [252, 254, 255]
    clock.t = 150.0
    assert table.stale_buckets(100) == [252, 253, 254, 255]
    table.touch(table.random_id(255))
    assert table.stale_buckets(100) == [252, 253, 254]
    assert table.stale_buckets(1000) == [254]  # only the never-touched bucket


# -- lookup ------------------------------------------------------------------------------------


def run_lookup(lookup: Lookup, answer, max_steps: int = 100_000) -> list[PeerId]:
    """Drive ``lookup`` to its end, one answer at a time, in the order the requests went out.
    ``answer(peer)`` is the peers it names, or None when the request fails. Returns whom it asked."""
    asked = []
    in_flight = deque(lookup.next())
    asked += in_flight
    for _ in range(max_steps):
        assert len(lookup.pending()) <= lookup.alpha
        assert lookup.in_flight == len(lookup.pending())
        if not in_flight:
            break
        p = in_flight.popleft()
        named = answer(p)
        if named is None:
            lookup.failed(p)
        else:
            lookup.answered(p, named)
        new = lookup.next()
        asked += new
        in_flight.extend(new)
    else:
        pytest.fail("the lookup did not terminate")
    assert lookup.done
    return asked


def test_lookup_keeps_at_most_alpha_requests_in_flight():
    local, *seeds = make_peers(11, seed=20)
    lookup = Lookup(12345, seeds, local, k=20, alpha=3)
    first = lookup.next()
    assert len(first) == 3 and len(set(first)) == 3
    assert lookup.next() == []  # all three still in flight
    lookup.answered(first[0], [])
    second = lookup.next()
    assert len(second) == 1 and second[0] not in first
    lookup.failed(first[1])
    assert len(lookup.next()) == 1
    assert lookup.next() == []
    assert len(lookup.pending()) == 3


def test_lookup_asks_the_closest_first_and_ends_when_the_k_closest_answered():
    target = 2**200 + 7
    local, *pool = make_peers(9, seed=21)
    ranked = by_distance(pool, target)
    lookup = Lookup(target, list(reversed(ranked)), local, k=3, alpha=3)
    assert not lookup.done
    assert lookup.next() == ranked[:3]
    lookup.answered(ranked[0], [])
    lookup.answered(ranked[1], [])
    assert not lookup.done  # ranked[2] is among the k closest and has not answered
    lookup.answered(ranked[2], [])
    assert lookup.done
    assert lookup.next() == []  # the farther seeds are never asked
    assert lookup.queried == 3
    assert lookup.closest() == ranked[:3]


def test_lookup_goes_on_when_an_answer_names_closer_peers():
    target = 99
    local, *pool = make_peers(8, seed=22)
    ranked = by_distance(pool, target)
    far, closer = ranked[4:], ranked[:4]
    lookup = Lookup(target, far, local, k=2, alpha=2)
    asked = lookup.next()
    assert asked == far[:2]
    lookup.answered(asked[0], closer)
    lookup.answered(asked[1], [])
    assert not lookup.done  # two closer peers are known and not asked yet
    assert lookup.next() == closer[:2]
    lookup.answered(closer[0], [])
    lookup.answered(closer[1], [])
    assert lookup.done
    assert lookup.closest() == closer[:2]
    assert lookup.closest(n=10) == [closer[0], closer[1], far[0], far[1]]


def test_lookup_ignores_the_local_peer_and_duplicates():
    target = 5
    local, *pool = make_peers(6, seed=23)
    seeds = [local, pool[0], pool[0], pool[1], local]
    lookup = Lookup(target, seeds, local, k=20, alpha=3)
    assert lookup.round_of(local) == 0  # never a candidate

    def answer(p):
        return [local, p, *pool, *pool]

    asked = run_lookup(lookup, answer)
    assert local not in asked
    assert len(asked) == len(set(asked)) == 5
    assert set(lookup.closest()) == set(pool)


def test_an_answer_naming_itself_or_known_peers_does_not_loop():
    target = 1 << 100
    local, *pool = make_peers(10, seed=24)
    lookup = Lookup(target, pool[:2], local, k=20, alpha=2)
    calls = []

    def answer(p):
        calls.append(p)
        return [p, *pool[:2]]  # itself and the seeds, again and again

    asked = run_lookup(lookup, answer)
    assert sorted(asked) == sorted(pool[:2])
    assert len(calls) == 2


def test_answers_from_peers_not_asked_are_ignored():
    local, a, b, stranger, named = make_peers(5, seed=25)
    lookup = Lookup(7, [a, b], local, k=20, alpha=1)
    (first,) = lookup.next()
    other = b if first == a else a
    lookup.answered(stranger, [named])  # never a candidate
    lookup.answered(other, [named])  # a candidate, but not asked
    lookup.failed(other)  # likewise: not asked, cannot fail
    lookup.answered(first, [])
    lookup.answered(first, [named])  # a second answer from the same peer
    assert lookup.next() == [other]
    lookup.answered(other, [])
    assert lookup.done
    assert lookup.round_of(named) == 0
    assert set(lookup.closest()) == {a, b}


def test_failed_peers_are_routed_around():
    target = 3
    local, *pool = make_peers(6, seed=26)
    ranked = by_distance(pool, target)
    lookup = Lookup(target, pool, local, k=2, alpha=2)
    assert lookup.next() == ranked[:2]
    lookup.failed(ranked[0])
    assert not lookup.done
    assert lookup.next() == [ranked[2]]  # the next closest takes the failed one's place
    lookup.answered(ranked[1], [])
    lookup.answered(ranked[2], [])
    assert lookup.done
    assert lookup.closest() == [ranked[1], ranked[2]]
    lookup.answered(ranked[0], [])  # a late answer from a failed peer changes nothing
    assert lookup.closest() == [ranked[1], ranked[2]]


def test_a_lookup_whose_every_peer_fails_ends_empty():
    local, *pool = make_peers(5, seed=27)
    lookup = Lookup(1, pool, local, k=2, alpha=2)
    asked = run_lookup(lookup, lambda p: None)
    assert sorted(asked) == sorted(pool)
    assert lookup.closest() == []
    assert lookup.rounds == 0


def test_a_lookup_without_seeds_is_done_at_once():
    local = make_peers(1, seed=28)[0]
    lookup = Lookup(1, [], local)
    assert lookup.done and lookup.next() == [] and lookup.closest() == []


def test_rounds_seeds_are_one_and_a_peer_named_in_round_r_is_r_plus_one():
    local, s1, s2, p2, p3, p4 = make_peers(6, seed=29)
    chain = {s1: [p2, s2], s2: [], p2: [p3, s1], p3: [p4], p4: []}
    lookup = Lookup(11, [s1, s2], local, k=20, alpha=3)
    run_lookup(lookup, lambda p: chain[p])
    assert [lookup.round_of(p) for p in (s1, s2, p2, p3, p4)] == [1, 1, 2, 3, 4]
    assert lookup.rounds == 4


def test_rounds_count_only_the_closest_that_answered():
    target = 77
    local, *pool = make_peers(6, seed=30)
    ranked = by_distance(pool, target)
    seed_peer, deep = ranked[0], ranked[-1]  # the deep chain leads only farther away
    lookup = Lookup(target, [seed_peer], local, k=1, alpha=1)
    assert lookup.next() == [seed_peer]
    lookup.answered(seed_peer, [deep])
    assert lookup.done and lookup.rounds == 1
    assert lookup.round_of(deep) == 2


def test_the_candidate_set_is_capped():
    local, seed_peer = make_peers(2, seed=31)
    flood = make_peers(Lookup.MAX_CANDIDATES + 500, seed=32)
    big = 10 * Lookup.MAX_CANDIDATES
    lookup = Lookup(0, [seed_peer], local, k=big, alpha=big)
    assert lookup.next() == [seed_peer]
    lookup.answered(seed_peer, flood)
    asked = lookup.next()
    assert len(asked) + 1 == Lookup.MAX_CANDIDATES
    # the closest ones are kept, whatever order they were named in
    assert set(asked) == set(by_distance(flood, 0)[: Lookup.MAX_CANDIDATES - 1])


def test_the_cap_applies_to_seeds_too(monkeypatch):
    monkeypatch.setattr(Lookup, "MAX_CANDIDATES", 5)
    local, *pool = make_peers(12, seed=33)
    lookup = Lookup(0, pool, local, k=100, alpha=100)
    assert lookup.next() == by_distance(pool, 0)[:5]


def test_a_flood_named_first_does_not_crowd_out_closer_peers_named_later(monkeypatch):
    monkeypatch.setattr(Lookup, "MAX_CANDIDATES", 10)
    local, *rest = make_peers(40, seed=34)
    ranked = by_distance(rest, 0)
    near, honest, liar, far = ranked[:5], ranked[5], ranked[-9], ranked[-8:]
    lookup = Lookup(0, [honest, liar], local, k=3, alpha=2)
    assert set(lookup.next()) == {honest, liar}
    lookup.answered(liar, far)  # the candidate set is now full of far peers
    lookup.answered(honest, near)  # closer peers, named later, still get in
    while not lookup.done:
        batch = lookup.next()
        assert batch
        for p in batch:
            lookup.answered(p, [])
    assert lookup.closest() == near[:3]


# -- a simulated network -----------------------------------------------------------------------

NETWORK_SIZE = 500


@pytest.fixture(scope="module")
def network():
    """500 peers; each routing table saw a random half of the network, in random order."""
    rng = random.Random(2024)
    peers = [make_peer(rng) for _ in range(NETWORK_SIZE)]
    tables = {}
    for p in peers:
        table = RoutingTable(p)
        for q in rng.sample(peers, NETWORK_SIZE // 2):
            table.seen(q)
        tables[p] = table
    return peers, tables


def test_simulated_lookup_finds_the_true_k_closest_in_few_rounds(network):
    peers, tables = network
    rng = random.Random(1)
    local = make_peer(rng)  # outside the network: it only knows three random seeds
    for _ in range(8):
        target = rng.getrandbits(256)
        lookup = Lookup(target, rng.sample(peers, 3), local)
        asked = run_lookup(lookup, lambda p: tables[p].closest(target))
        assert lookup.closest() == by_distance(peers, target)[:K]
        assert len(asked) == len(set(asked)) == lookup.queried
        assert lookup.queried < NETWORK_SIZE // 5  # it homes in, it does not crawl
        assert 1 < lookup.rounds <= 6


def test_simulated_lookup_routes_around_dead_peers(network):
    peers, tables = network
    rng = random.Random(2)
    dead = set(rng.sample(peers, NETWORK_SIZE // 10))
    alive = [p for p in peers if p not in dead]
    local = make_peer(rng)
    failures = 0

    def answer(p):
        nonlocal failures
        if p in dead:
            failures += 1
            return None
        return tables[p].closest(target)

    for _ in range(8):
        target = rng.getrandbits(256)
        lookup = Lookup(target, rng.sample(peers, 5), local)
        run_lookup(lookup, answer)
        assert lookup.closest() == by_distance(alive, target)[:K]
    assert failures > 0  # the dead peers were really on the way


def test_a_removed_peer_leaves_the_replacement_list_and_is_not_promoted_later():
    local = KeyPair.generate().peer_id
    t = RoutingTable(local, k=2)
    peers = []
    while len(peers) < 3:  # three peers of one bucket (the farthest: half of all ids land there)
        p = KeyPair.generate().peer_id
        if t.bucket_index(node_id(p)) == 255:
            peers.append(p)
    h1, h2, bad = peers
    t.seen(h1)
    t.seen(h2)
    t.seen(bad)  # the bucket is full: bad waits in the replacement list
    t.ping_result(h1, True)
    assert bad not in t
    t.remove(bad)  # what a misbehaving or failing peer gets
    t.remove(h2)  # an honest peer fails one request: its slot must not go to bad
    assert bad not in t
    assert h1 in t and h2 not in t and len(t) == 1
    t.seen(bad)  # only by answering again does a peer (re-)enter
    assert bad in t
