"""Regressions from the DHT review, between real nodes on loopback TCP: expired records in answers
do not brand their holders, peer records are served as signed, local failures do not evict peers,
addresses in answers are only hints, name registrations are short-lived, one bad subkey hides only
itself, republish never extends a record, delete outlives a long-lived record, name refreshes do
not pile up, lookups have an overall deadline, and nodes sharing one loop (astart) stay usable."""

import asyncio
import socket
import threading
import time
import types

import pytest

import lattica
import lattica.actors.dht.lookups as dht_lookups
import lattica.actors.dht.upkeep as dht_upkeep
from lattica import codec
from lattica.actor import current_runtime
from lattica.actors.dht import DhtConfig, dht_ref, name_key
from lattica.errors import RecordRejected, StoreFailed
from lattica.identity import KeyPair
from lattica.kademlia import key_id, node_id
from lattica.multiaddr import Multiaddr
from lattica.records import Entry, PeerRecord, StoreLimits, encode_subkey, entry_to_wire, sign_entry
from lattica.runtime import ASYNC, ActorRef
from helpers import wait_for

pytestmark = pytest.mark.timeout(60)

TCP = "/ip4/127.0.0.1/tcp/0"


def _dht(node):
    return node._host.runtime.dht


def _call(node, peer, method, *args):
    """Call ``peer``'s dht actor directly from ``node`` (as a peer of the protocol would)."""
    rt = node._host.runtime
    return node.run(_await(rt.call(dht_ref(peer), method, args, {}, timeout=5)), timeout=10)


async def _await(fut):
    return await fut


def _on_loop(node, fn):
    """Run ``fn()`` on ``node``'s loop (its DHT state is only touched there) and return its result."""

    async def go():
        return fn()

    return node.run(go(), timeout=5)


def _stored(node, key, subkey=b""):
    held = _on_loop(node, lambda: _dht(node).store.get(key_id(key)))
    return None if held is None else held[1].get(subkey)


@pytest.fixture
def nodes():
    """Start nodes on demand (``nodes(n, **opts)``); all are stopped after the test."""
    started = []

    def make(n=1, **opts):
        out = [lattica.Node([TCP], **opts).start() for _ in range(n)]
        started.extend(out)
        return out

    yield make
    for n in started:
        n.stop()


def _join(*ns):
    """Connect every node to the first and bootstrap them all."""
    for n in ns[1:]:
        n.connect(ns[0].addrs[0])
    for n in ns:
        lattica.dht.bootstrap(node=n).result(10)


# -- r1 -----------------------------------------------------------------------------------------


def test_an_expired_record_in_an_answer_is_skipped_without_blaming_its_holder(nodes):
    reader, holder = nodes(2)
    _dht(holder).store.clock = lambda: time.time() - 5.0  # the holder's clock is 5 s behind
    _join(reader, holder)
    svc = _dht(reader)
    assert holder.peer_id in svc.table
    now = time.time()
    stale = Entry(codec.encode_bytes("stale"), now - 1.0)  # live for the holder, expired for the reader
    live = Entry(codec.encode_bytes("live"), now + 60.0)
    _on_loop(holder, lambda: _dht(holder).store.put(b"skewed", b"", stale, holder.peer_id))
    _on_loop(holder, lambda: _dht(holder).store.put(b"skewed", encode_subkey("fresh"), live, holder.peer_id))
    rec = lattica.dht.get("skewed", node=reader).result(10)
    assert rec is not None and dict(rec) == {"fresh": lattica.dht.Value("live", live.expiration)}  # its answer was used ...
    assert holder.peer_id not in svc.misbehaved  # ... the expired record skipped, nobody blamed
    assert holder.peer_id in svc.table


# -- r2 -----------------------------------------------------------------------------------------


def test_a_peer_record_over_non_canonical_addresses_is_re_served_exactly_as_signed(nodes):
    reader, holder = nodes(2)
    _join(reader, holder)
    m = KeyPair.generate()  # a peer that is not online; its record lives on the holder
    texts = ["/ip6/0:0:0:0:0:0:0:1/tcp/4001"]  # canonical text would be /ip6/::1/tcp/4001
    seq = time.time_ns() // 1000
    wire = [m.peer_id.to_bytes(), seq, texts, m.sign(PeerRecord._payload(m.peer_id, seq, texts))]
    rec = PeerRecord.from_wire(wire, StoreLimits())
    assert rec.texts == texts and rec.to_wire()[2] == texts
    assert PeerRecord.from_wire(rec.to_wire(), StoreLimits()).addrs == rec.addrs  # still verifies
    assert _call(reader, holder.peer_id, "put_peer_record", wire) is True
    assert _on_loop(reader, lambda: _dht(reader).store.peer_record(m.peer_id)) is None  # the reader must ask
    assert lattica.dht.find_peer(m.peer_id, node=reader).result(10) == [Multiaddr("/ip6/::1/tcp/4001")]
    svc = _dht(reader)
    assert holder.peer_id not in svc.misbehaved
    assert holder.peer_id in svc.table


# -- r14 ----------------------------------------------------------------------------------------


def test_a_local_connection_limit_does_not_evict_peers_from_the_table(nodes):
    # membership off: it redials a member whose connection drops, which would take a's one slot
    (a,) = nodes(1, max_connections=1, membership=False)
    honest, squatter = nodes(2, membership=False)
    _join(a, honest)
    svc = _dht(a)
    assert honest.peer_id in svc.table

    async def drop_all():
        for c in list(a._host.all_conns):
            c.abort("test: idle connections closed")

    a.run(drop_all(), timeout=5)
    assert wait_for(lambda: not a._host.all_conns and not honest._host.conns.get(a.peer_id), timeout=5)
    squatter.connect(a.addrs[0])  # holds a's only connection slot
    assert len(a._host.all_conns) == 1
    lattica.dht.bootstrap(node=a).result(10)  # every call to honest fails locally (ConnectionLimit)
    assert honest.peer_id not in svc.misbehaved
    assert honest.peer_id in svc.table


# -- r3 -----------------------------------------------------------------------------------------


def test_addresses_named_in_answers_are_hints_that_never_displace_a_peers_own(nodes):
    (asker,) = nodes(1, dht=DhtConfig(request_timeout=1.0, lookup_timeout=3.0))  # bounded, whatever the network
    liar, x = nodes(2)
    asker.connect(liar.addrs[0])
    asker.connect(x.addrs[0])
    lattica.dht.bootstrap(node=asker).result(10)
    assert liar.peer_id in _dht(asker).table and x.peer_id in _dht(asker).table
    book = asker._host.peer_addrs
    x_own = _on_loop(asker, lambda: list(book[x.peer_id]))  # from identify: what x said itself
    assert x_own
    bogus = [Multiaddr(f"/ip4/10.255.0.{i}/tcp/1") for i in range(8)]
    fakes = [KeyPair.generate().peer_id for _ in range(30)]
    named = [[x.peer_id, bogus]] + [[f, [Multiaddr("/ip4/127.0.0.1/tcp/1")]] for f in fakes]  # refused at once
    value = Entry(codec.encode_bytes("v"), time.time() + 60)

    async def find_value(kid):  # a record, and closer "peers" with made-up addresses
        return [[entry_to_wire(b"", value)], named]

    async def find_node(target):
        return named

    bound = liar._host.runtime.actors["dht"].bound
    bound["find_value"] = find_value
    bound["find_node"] = find_node
    # a quorum-1 get stops at the liar's answer: the peers it named are never called
    assert lattica.dht.get("hinted", quorum=1, node=asker).result(10).value == "v"
    assert _on_loop(asker, lambda: list(book[x.peer_id])) == x_own
    assert _on_loop(asker, lambda: [f for f in fakes if f in book]) == []
    # a full lookup through the liar: x is called at its own addresses, never the named ones
    asker.run(_dht(asker).find_closest(node_id(x.peer_id)), timeout=20)
    assert _on_loop(asker, lambda: list(book[x.peer_id])) == x_own
    assert x.peer_id in _dht(asker).table and x.peer_id not in _dht(asker).misbehaved


# -- r10 ----------------------------------------------------------------------------------------


def test_an_actor_name_registration_beyond_300_s_is_refused_by_storing_nodes(nodes):
    a, b = nodes(2)
    _join(a, b)
    key = name_key("coordinator")
    sk = encode_subkey(a.peer_id)
    value = codec.encode_bytes(ActorRef(a.peer_id, "coordinator", {"work": ASYNC}))
    skew = StoreLimits().clock_skew

    def store(expiration):
        return _call(a, b.peer_id, "store", key, entry_to_wire(sk, sign_entry(a.keypair, key, sk, value, expiration)))

    with pytest.raises(RecordRejected, match="at most 300"):
        store(time.time() + 86400)
    with pytest.raises(RecordRejected, match="at most 300"):
        store(time.time() + 300 + skew + 10)
    assert store(time.time() + 290) is True
    with pytest.raises(StoreFailed, match="at most 300"):  # the registrant's own node refuses too
        a.run(_dht(a).put(key, value, subkey=a.peer_id, ttl=3600, republish=False), timeout=10)
    assert _call(a, b.peer_id, "store", b"not/a/name", [b"", b"\xa1v", time.time() + 3600, b""]) is True


# -- r4 -----------------------------------------------------------------------------------------


def test_an_undecodable_subkey_or_value_hides_only_itself(nodes):
    a, b, atk = nodes(3)
    _join(a, b, atk)
    assert lattica.dht.put("shards", "layer0-3", subkey="w1", node=a).result(10) >= 2
    assert lattica.dht.put("shards", "layer4-7", subkey="w2", node=b).result(10) >= 2
    exp = time.time() + 3600
    for peer in (a.peer_id, b.peer_id):
        assert _call(atk, peer, "store", b"shards", [b"x-garbage-tag", b"\x01", exp, b""]) is True  # unknown subkey tag
        assert _call(atk, peer, "store", b"shards", [encode_subkey("w3"), b"\xff\xff", exp, b""]) is True  # bad value
    for n in (a, b, atk):
        rec = lattica.dht.get("shards", node=n).result(10)
        assert rec is not None and {k: v.value for k, v in rec.items()} == {"w1": "layer0-3", "w2": "layer4-7"}


# -- r8 -----------------------------------------------------------------------------------------


def test_republish_re_stores_the_same_record_and_forgets_it_once_expired(nodes, monkeypatch):
    a, b = nodes(2)
    _join(a, b)
    svc = _dht(a)
    assert lattica.dht.put("ephemeral", 1, ttl=400, node=a).result(10) == 2
    (entry,) = _on_loop(a, lambda: list(svc._mine.values()))
    assert _stored(b, b"ephemeral").expiration == entry.expiration
    (c,) = nodes(1)  # joins after the put: republish must bring it the record ...
    _join(a, c)
    real = time.time

    def at(shift):
        clock = types.SimpleNamespace(time=lambda: real() + shift, monotonic=time.monotonic)
        for module in (dht_lookups, dht_upkeep):  # the DHT's wall-clock reads
            monkeypatch.setattr(module, "time", clock)

    for shift in (300.0, 390.0):
        at(shift)
        a.run(svc.republish(), timeout=20)
        (mine,) = _on_loop(a, lambda: list(svc._mine.values()))
        assert mine == entry  # ... the very same record: not re-signed, never extended
        for n in (a, b, c):
            assert _stored(n, b"ephemeral").expiration == entry.expiration
    at(401.0)  # past its expiration: forgotten, not stored again
    a.run(svc.republish(), timeout=20)
    assert _on_loop(a, lambda: dict(svc._mine)) == {}


# -- r7 -----------------------------------------------------------------------------------------


def test_delete_after_a_long_ttl_put_hides_the_record(nodes):
    a, b = nodes(2)
    _join(a, b)
    assert lattica.dht.put("doc", "v1", ttl=600, node=a).result(10) == 2
    put_exp = _stored(b, b"doc").expiration
    assert lattica.dht.delete("doc", node=a).result(10) == 2  # default tombstone ttl: 60 s
    for n in (a, b):
        tomb = _stored(n, b"doc")
        assert tomb.value == b"" and tomb.expiration > put_exp  # the tombstone outlives the record
        assert lattica.dht.get("doc", node=n).result(10) is None
    assert _on_loop(a, lambda: dict(_dht(a)._mine)) == {}  # and it is not re-published


# -- r16 ----------------------------------------------------------------------------------------


def test_name_refreshes_do_not_pile_up(nodes):
    (n,) = nodes(1, dht=DhtConfig(name_ttl=0.6, persist_interval=0.05))  # refresh every 0.2 s
    svc = _dht(n)
    state = {"runs": 0, "running": 0, "max_running": 0, "puts": 0}
    refresh = svc._refresh_names

    async def slow_put(key, value, subkey=None, ttl=60.0, republish=True):
        state["puts"] += 1
        await asyncio.sleep(0.5)  # a slow WAN put: one refresh takes longer than name_ttl / 3
        return 1

    async def counted_refresh():
        state["runs"] += 1
        state["running"] += 1
        state["max_running"] = max(state["max_running"], state["running"])
        try:
            await refresh()
        finally:
            state["running"] -= 1

    def install():
        svc.put = slow_put
        svc._refresh_names = counted_refresh
        for i in range(10):
            svc.register_name(f"svc-{i}", ActorRef(n.peer_id, f"svc-{i}", {"f": ASYNC}))

    _on_loop(n, install)
    assert wait_for(lambda: state["runs"] >= 3, timeout=4)
    runs, max_running = _on_loop(n, lambda: (state["runs"], state["max_running"]))
    assert max_running == 1, f"{max_running} _refresh_names ran at once"
    assert state["puts"] <= 10 * (runs + 1)  # initial publish + one put per name and run


# -- r13 ----------------------------------------------------------------------------------------


def test_a_lookup_ends_within_lookup_timeout_despite_named_peers_that_never_answer(nodes):
    cfg = DhtConfig(request_timeout=0.5, lookup_timeout=1.0)
    (asker,) = nodes(1, dht=cfg)
    (liar,) = nodes(1)
    _join(asker, liar)
    hole = socket.socket()  # accepts TCP connections (kernel backlog) and never speaks
    hole.bind(("127.0.0.1", 0))
    hole.listen(256)
    try:
        silent = Multiaddr(f"/ip4/127.0.0.1/tcp/{hole.getsockname()[1]}")
        fakes = [KeyPair.generate().peer_id for _ in range(40)]

        async def find_node(target):
            return [[f, [silent, Multiaddr("/ip4/127.0.0.1/tcp/1")]] for f in fakes]

        liar._host.runtime.actors["dht"].bound["find_node"] = find_node
        target = node_id(KeyPair.generate().peer_id)
        t0 = time.monotonic()
        lk = asker.run(_dht(asker).find_closest(target), timeout=30)
        took = time.monotonic() - t0
        # without a deadline: 40 silent peers, alpha at a time, request_timeout each (~7 s)
        assert len(fakes) * cfg.request_timeout / cfg.alpha > 3 * cfg.lookup_timeout
        assert took < cfg.lookup_timeout + 0.75, f"lookup took {took:.2f} s"
        assert lk.queried > cfg.alpha  # the lookup did go after the named peers ...
        assert liar.peer_id in lk.closest()  # ... and settled for the peers that answered
        # the overall deadline also bounds the facade's lookups
        t0 = time.monotonic()
        lattica.dht.get("nothing-here", node=asker).result(10)
        assert time.monotonic() - t0 < cfg.lookup_timeout + 0.75
    finally:
        hole.close()


# -- r11 / r12 ----------------------------------------------------------------------------------


def test_stopping_one_of_two_astarted_nodes_keeps_current_runtime_for_the_other():
    lattica.shutdown()  # no default node: current_runtime() must come from the loop's own nodes

    async def main():
        n1 = await lattica.Node([TCP]).astart()
        n2 = await lattica.Node([TCP]).astart()
        n3 = None
        try:
            assert current_runtime().peer_id in (n1.peer_id, n2.peer_id)
            await n2.astop()
            assert current_runtime().peer_id == n1.peer_id  # the later node's stop left n1's mapping
            n3 = await lattica.Node([TCP]).astart()
            await n1.astop()  # the node the loop's calls went through stops; n3 still runs
            assert current_runtime().peer_id == n3.peer_id
            assert str(n3.peer_id) in lattica.dht.owned_key("x")
        finally:
            for n in (n1, n2, n3):
                if n is not None:
                    await n.astop()

    asyncio.run(asyncio.wait_for(main(), 20))


def test_concurrent_astart_does_not_deadlock_and_stop_points_to_astop():
    async def main():
        n = lattica.Node([TCP])
        started = []

        async def start():
            node = await n.astart()
            started.append(node.running)  # whoever awaited astart gets a started node
            return node

        try:
            r1, r2 = await asyncio.wait_for(asyncio.gather(start(), start()), 5)
            assert r1 is n and r2 is n and n.running
            with pytest.raises(RuntimeError, match="astop"):
                n.stop()
            assert n.running  # stop() refused: the node still runs
        finally:
            await n.astop()
        assert not n.running
        assert started == [True, True], "an astart() returned before the node had started"

    outcome = []

    def run():  # in a thread of its own: a deadlocked loop cannot be interrupted from inside
        try:
            asyncio.run(main())
            outcome.append(None)
        except BaseException as e:  # noqa: BLE001 -- re-raised in the test
            outcome.append(e)

    t = threading.Thread(target=run, daemon=True)
    t.start()
    t.join(15)
    assert outcome, "two concurrent astart() calls deadlocked the loop"
    if outcome[0] is not None:
        raise outcome[0]
