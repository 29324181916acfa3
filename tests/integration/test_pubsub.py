"""Pub-sub between real nodes on loopback (docs/pubsub.md): delivery through the mesh, signed
messages, validators, subscriptions read from threads, loops and actors, and what hostile or
careless peers get: forged, replayed, stale, oversized and malformed messages, strangers."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

import lattica
import sample_actors as sa
from helpers import call_as, spawn_local, wait_for
from lattica.actors.pubsub import pubsub_ref, wire
from lattica.actors.pubsub.bundle import Bundle
from lattica.config import PubSubConfig
from lattica.errors import NodeClosed, PermissionDenied, ProtocolError, Timeout
from lattica.pubsub._router import flood_tag
from lattica.trust import MeshKey

pytestmark = pytest.mark.timeout(90)

TCP = "/ip4/127.0.0.1/tcp/0"


@pytest.fixture
def line():
    """Five members in a line (0-1-2-3-4): messages must travel through the mesh (the members do
    not look for the topics' other subscribers: they would all connect)."""
    key = MeshKey.generate()
    nodes = [
        lattica.Node([TCP], mesh=key, allow=["sample_actors.*"], pubsub=PubSubConfig(discover=False)).start()
        for _ in range(5)
    ]
    try:
        for a, b in zip(nodes, nodes[1:]):
            b.connect(a.addrs[0])
        yield nodes
    finally:
        for n in nodes:
            n.stop()


def _meshed(nodes, topic):
    """Every node has its neighbours in its mesh (the ends one, the others two)."""
    return wait_for(lambda: [len(lattica.pubsub.peers(topic, node=n)) for n in nodes] == [1, 2, 2, 2, 1], timeout=10)


def test_a_message_reaches_every_subscriber_through_the_mesh(line):
    subs = [lattica.pubsub.subscribe("news", node=n) for n in line]
    assert _meshed(line, "news")
    assert lattica.pubsub.publish("news", {"v": 1, "blob": b"\x00" * 1000}, node=line[0]).result(5) == 1
    for i, sub in enumerate(subs):
        msg = sub.get(timeout=5)
        assert msg.data == {"v": 1, "blob": b"\x00" * 1000} and msg.author == line[0].peer_id and msg.topic == "news"
        assert msg.via == (None if i == 0 else line[i - 1].peer_id)
    for sub in subs:
        with pytest.raises(Timeout):
            sub.get(timeout=0.3)  # exactly once
    assert lattica.pubsub.topics(node=line[2]) == ["news"]


def test_order_from_one_author_and_many_messages(line):
    subs = [lattica.pubsub.subscribe("seq", node=n) for n in line]
    assert _meshed(line, "seq")
    for i in range(300):
        lattica.pubsub.publish("seq", i, node=line[4])
    got = [[sub.get(timeout=10).data for _ in range(300)] for sub in subs]
    for g in got:
        assert sorted(g) == list(range(300))
    assert got[3] == list(range(300)), "a neighbour gets one author's messages in order"


def test_subscriptions_from_threads_other_loops_and_actors(line):
    a, b = line[0], line[1]
    sub = lattica.pubsub.subscribe("x", node=b)
    collector = spawn_local(b, sa.Collector)
    lattica.pubsub.subscribe("x", handler=collector.on_message, node=b)
    got_async = []

    def reader():
        async def main():
            async for msg in sub:
                got_async.append(msg.data)
                if len(got_async) == 3:
                    break

        asyncio.run(main())

    t = threading.Thread(target=reader)
    t.start()
    assert wait_for(lambda: lattica.pubsub.peers("x", node=a) == [] and lattica.pubsub.peers(node=a), timeout=10)
    lattica.pubsub.subscribe("x", node=a)
    assert wait_for(lambda: lattica.pubsub.peers("x", node=a) == [b.peer_id], timeout=10)
    for i in range(3):
        lattica.pubsub.publish("x", i, node=a)
    t.join(10)
    assert got_async == [0, 1, 2]
    assert wait_for(lambda: len(call_as(b, collector, "got")) == 3, timeout=5)
    assert [item[2] for item in call_as(b, collector, "got")] == [0, 1, 2]
    sub.close()
    with pytest.raises(NodeClosed):
        sub.get(timeout=1)


def test_a_slow_reader_holds_at_most_its_queue():
    with lattica.Node([TCP]) as n:
        sub = lattica.pubsub.subscribe("q", maxsize=10, node=n)
        for i in range(50):
            lattica.pubsub.publish("q", i, node=n).result(5)
        assert sub.dropped == 40 and [sub.get(timeout=1).data for _ in range(10)] == list(range(40, 50))


def test_leaving_a_topic_stops_delivery_and_the_mesh(line):
    subs = [lattica.pubsub.subscribe("leave", node=n) for n in line[:2]]
    assert wait_for(lambda: lattica.pubsub.peers("leave", node=line[0]) == [line[1].peer_id], timeout=10)
    subs[1].close()
    assert wait_for(lambda: lattica.pubsub.peers("leave", node=line[0]) == [], timeout=10)
    assert lattica.pubsub.topics(node=line[1]) == []
    assert lattica.pubsub.publish("leave", 1, node=line[0]).result(5) == 0


def test_validators_accept_reject_and_ignore(line):
    a, b, c = line[0], line[1], line[2]
    subs = {n: lattica.pubsub.subscribe("v", node=n) for n in (a, b, c)}
    assert wait_for(lambda: len(lattica.pubsub.peers("v", node=b)) == 2, timeout=10)

    async def check(msg):
        await asyncio.sleep(0.01)
        return {"ok": True, "bad": False}.get(msg.data)  # anything else: ignore

    lattica.pubsub.validator("v", check, node=b)
    for data in ("bad", "other", "ok"):
        lattica.pubsub.publish("v", data, node=a).result(5)
    assert subs[b].get(timeout=5).data == "ok" and subs[c].get(timeout=5).data == "ok"
    with pytest.raises(Timeout):
        subs[c].get(timeout=0.5)  # b passed on neither the rejected nor the ignored one
    router = b._host.services.pubsub.router
    assert router.score(a.peer_id, b._host.loop.time()) < 0, "the peer that sent a rejected message is scored down"
    assert b._host.services.pubsub.rejected == 1


def _envelope(node, topic, data, seqno=None, sign=True):
    body = b"".join(bytes(c) for c in lattica.codec.encode(data))
    author = node.peer_id.to_bytes()
    seqno = time.time_ns() if seqno is None else seqno
    certs = node._host.trust.presented  # (a member's messages carry its mesh certificates)
    sig = node.keypair.sign(Bundle([body], certs).signed_bytes(topic, author, seqno)) if sign else b"\x00" * 64
    return [topic, author, seqno, [body], sig, certs]


def _batch(*msgs):
    return [[], list(msgs), [], [], [], [], []]


def test_forged_replayed_stale_and_oversized_messages_are_dropped(line):
    a, b, c = line[0], line[1], line[2]
    sub = lattica.pubsub.subscribe("f", node=b)
    lattica.pubsub.subscribe("f", node=a)
    lattica.pubsub.subscribe("f", node=c)
    assert wait_for(lambda: len(lattica.pubsub.peers("f", node=b)) == 2, timeout=10)
    ref = pubsub_ref(b.peer_id)
    svc = b._host.services.pubsub
    good = _envelope(a, "f", "good")
    call_as(a, ref, "rpc", _batch(good))
    assert sub.get(timeout=5).data == "good"
    forged = _envelope(line[3], "f", "forged")  # signed by another key than its author's
    forged[1] = line[4].peer_id.to_bytes()
    unsigned = _envelope(a, "f", "unsigned", sign=False)
    stale = _envelope(a, "f", "stale", seqno=time.time_ns() - 3600 * 10**9)  # a replay from long ago
    call_as(a, ref, "rpc", _batch(forged, unsigned, stale))
    call_as(c, ref, "rpc", _batch(good))  # a replay within the seen cache, through another peer
    with pytest.raises(Timeout):
        sub.get(timeout=0.5)
    assert svc.rejected == 3
    assert svc.router.score(a.peer_id, b._host.loop.time()) < svc.router.scores.params.graylist_threshold
    fine = _envelope(a, "f", "fine")
    call_as(a, ref, "rpc", _batch(fine))  # a is graylisted: nothing it sends is looked at
    with pytest.raises(Timeout):
        sub.get(timeout=0.5)
    call_as(c, ref, "rpc", _batch(fine))  # the same message from a peer in good standing
    assert sub.get(timeout=5).data == "fine"
    big = _envelope(c, "f", b"x" * (2 << 20))
    with pytest.raises(ProtocolError, match="at most"):
        call_as(c, ref, "rpc", _batch(big))


@pytest.mark.parametrize(
    "bad",
    [
        [],
        "x",
        [[], [], [], [], [], []],
        [[["t", "yes"]], [], [], [], [], [], []],
        [[], [["t", b"a", -1, [b""], b""]], [], [], [], [], []],
        [[], [], [["t", ["notbytes"]]], [], [], [], []],
        [[], [], [], [b"x" * 200], [], [], []],
        [[], [], [], [], [""], [], []],
        [[], [], [], [], [], [["t", "soon"]], []],
        [[["t" * 300, True]], [], [], [], [], [], []],
        [[], [], [], [], ["t"] * 2000, [], []],
        [[], [], [["t", [b""] * 10]], [], [], [], []],  # ids too short to be ids
        [[], [], [["t", [b"i" * 20]]] * 65, [], [], [], []],  # more IHAVE topics than a batch may name
        [[], [], [["t", [b"i" * 20] * 3000]], [b"i" * 20] * 3000, [], [], []],  # more ids than a batch may name
    ],
)
def test_malformed_batches_are_refused_whole(line, bad):
    a, b = line[0], line[1]
    with pytest.raises(ProtocolError):
        call_as(a, pubsub_ref(b.peer_id), "rpc", bad)
    assert lattica.pubsub.publish("still", 1, node=b).result(5) == 0  # the node is fine


def test_strangers_cannot_publish_or_read(mesh):
    host, member, stranger = mesh
    sub = lattica.pubsub.subscribe("m", node=host)
    with pytest.raises(PermissionDenied):
        call_as(stranger, pubsub_ref(host.peer_id), "rpc", _batch(_envelope(stranger, "m", "hi")))
    with pytest.raises(PermissionDenied, match="opens no pub-sub topic to strangers"):
        call_as(stranger, pubsub_ref(host.peer_id), "open_rpc", _batch(_envelope(stranger, "m", "hi")))
    theirs = lattica.pubsub.subscribe("m", node=stranger)
    ours = lattica.pubsub.subscribe("m", node=member)
    assert wait_for(lambda: lattica.pubsub.peers("m", node=host) == [member.peer_id], timeout=10)
    time.sleep(1.5)  # heartbeats: the stranger never enters the host's view
    assert stranger.peer_id not in lattica.pubsub.peers(node=host)
    lattica.pubsub.publish("m", "members only", node=host).result(5)
    assert ours.get(timeout=5).data == "members only" and sub.get(timeout=5).data == "members only"
    assert lattica.pubsub.publish("m", "from a stranger", node=stranger).result(5) == 0
    with pytest.raises(Timeout):
        sub.get(timeout=0.5)
    assert theirs.get(timeout=5).data == "from a stranger"  # (its own, delivered to itself)
    with pytest.raises(Timeout):
        theirs.get(timeout=0.5)  # nothing of the mesh's


def test_seqnos_follow_the_clock_however_long_the_node_runs():
    with lattica.Node([TCP]) as n:
        svc = n._host.services.pubsub
        sub = lattica.pubsub.subscribe("clock", node=n)
        svc._seqno = time.time_ns() - 3600 * 10**9  # as if the last message was an hour ago
        lattica.pubsub.publish("clock", 1, node=n).result(5)
        assert abs(sub.get(timeout=5).seqno - time.time_ns()) < 10 * 10**9
        lattica.pubsub.publish("clock", 2, node=n).result(5)
        lattica.pubsub.publish("clock", 3, node=n).result(5)
        a, b = sub.get(timeout=5).seqno, sub.get(timeout=5).seqno
        assert b > a, "seqnos only grow, even within one clock tick"


def test_a_validator_that_never_answers_costs_nothing_lasting(line):
    a, b_node = line[0], line[1]
    svc = b_node._host.services.pubsub
    svc.cfg.validate_timeout = 0.5  # (PubSubConfig(validate_timeout=...) on a node of its own)
    sub = lattica.pubsub.subscribe("slow", node=b_node)
    lattica.pubsub.subscribe("slow", node=a)
    assert wait_for(lambda: lattica.pubsub.peers("slow", node=b_node) == [a.peer_id], timeout=10)

    async def never(msg):
        await asyncio.sleep(3600)

    lattica.pubsub.validator("slow", never, node=b_node)
    for i in range(5):
        lattica.pubsub.publish("slow", i, node=a)
    time.sleep(1.5)
    with pytest.raises(Timeout):
        sub.get(timeout=0.1)
    assert svc._validating == 0 and svc._payloads == {}
    assert svc.router.score(a.peer_id, b_node._host.loop.time()) >= 0, "ignored, not blamed"


def test_a_fresh_process_publishes_at_once_and_exits():
    """Cold start: a script starts a node with one bootstrap peer, publishes straight away and
    ends; the subscriber that was already there gets the message."""
    import os
    import subprocess
    import sys

    key = MeshKey.generate()
    with lattica.Node([TCP], mesh=key) as sub_node:
        sub = lattica.pubsub.subscribe("cold", node=sub_node)
        script = f"""
import lattica
lattica.init([], bootstrap=[{str(sub_node.addrs[0])!r}])
print(lattica.pubsub.publish("cold", {{"hello": "from a script"}}).result(10))
"""
        env = {**os.environ, "LATTICA_MESH": key.to_text()}
        t0 = time.monotonic()
        out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60, env=env)
        assert out.returncode == 0, out.stderr[-2000:]
        assert out.stdout.strip() == "1", out.stdout
        msg = sub.get(timeout=5)
        assert msg.data == {"hello": "from a script"} and msg.author != sub_node.peer_id
        print(f"\npubsub cold start: a fresh process published and exited in {time.monotonic() - t0:.2f} s")


def test_a_node_stopping_right_after_publishing_delivers_first():
    """A node that publishes and stops at once (a script's last line) lets its batches arrive
    before its connections close, even to a peer that is busy for a moment."""
    key = MeshKey.generate()
    with lattica.Node([TCP], mesh=key) as b:
        a = lattica.Node([TCP], mesh=key).start()
        a.connect(b.addrs[0])
        sub = lattica.pubsub.subscribe("last", node=b)
        lattica.pubsub.subscribe("last", node=a)
        assert wait_for(lambda: lattica.pubsub.peers("last", node=a) == [b.peer_id], timeout=10)
        busy = threading.Event()
        b._host.loop.call_soon_threadsafe(lambda: (busy.set(), time.sleep(0.5)))
        assert busy.wait(5)
        for i in range(3):
            lattica.pubsub.publish("last", i, node=a)
        a.stop()
        assert sorted(sub.get(timeout=5).data for _ in range(3)) == [0, 1, 2]


def test_control_queued_for_a_peer_is_bounded():
    from lattica.actors.pubsub.sending import BOUNDS
    from lattica.actors.pubsub.service import _load
    from lattica.pubsub._outbound import Outbound
    from lattica.pubsub._router import Rpc

    _load()  # (what a node's first use of pub-sub loads)
    ob = Outbound(BOUNDS)
    for i in range(100):
        ob.add(
            Rpc(
                subscribe=[(f"t{i}-{k}", True) for k in range(100)],
                graft=["g"] * 100,
                prune=[("p", 1.0)] * 100,
                iwant=[b"i" * 20] * 500,
                idontwant=[b"d" * 20] * 500,
                ihave=[("t", [b"h" * 20] * 100)],
            ),
            cap=4096,
            cap_bytes=1 << 20,
        )
    p = ob.pending
    assert max(len(p.subscribe), len(p.graft), len(p.prune)) <= wire.MAX_ENTRIES
    assert len(p.ihave) <= wire.MAX_IHAVE_TOPICS
    assert sum(len(i) for _, i in p.ihave) + len(p.iwant) + len(p.idontwant) <= wire.MAX_BATCH_IDS


def test_ids_over_a_batch_s_budget_trim_the_ihaves_not_drop_them():
    """Over the batch's 5,000 ids, IHAVE ids are cut to what fits (the newest kept), not all
    dropped: the heartbeat's IHAVE of what the author said it sent is how a peer it lied about
    gets the message."""
    from lattica.actors.pubsub.sending import BOUNDS
    from lattica.actors.pubsub.service import _load
    from lattica.pubsub._outbound import Outbound
    from lattica.pubsub._router import Rpc

    _load()  # (what a node's first use of pub-sub loads)
    ob = Outbound(BOUNDS)
    ob.add(Rpc(ihave=[("t", [b"o" * 20] * 4999)]), cap=4096, cap_bytes=1 << 20)
    ob.add(Rpc(ihave=[("u", [b"n" * 20] * 10)], iwant=[b"i" * 20] * 100), cap=4096, cap_bytes=1 << 20)
    p = ob.pending
    assert sum(len(i) for _, i in p.ihave) + len(p.iwant) + len(p.idontwant) == wire.MAX_BATCH_IDS
    assert p.ihave[-1] == ("u", [b"n" * 20] * 10) and len(p.iwant) == 100


def test_messages_queued_for_a_peer_are_bounded_in_bytes_and_sent_in_bounded_calls():
    from lattica.actors.pubsub.sending import BATCH_BYTES as _BATCH_BYTES
    from lattica.actors.pubsub.sending import BOUNDS
    from lattica.pubsub._outbound import Outbound
    from lattica.pubsub._router import Rpc

    big = [wire.envelope("t", b"a", i, Bundle([bytes([i % 256]) * 900_000]), b"s") for i in range(40)]
    ob = Outbound(BOUNDS)
    ob.add(Rpc(messages=big[:5], ihave=[("t", [b"h" * 20])]), cap=4096, cap_bytes=32 << 20)
    assert ob.pending.ihave and ob.dropped == 0
    ob.add(Rpc(messages=big[5:]), cap=4096, cap_bytes=32 << 20)
    assert not ob.pending.ihave, "gossip goes first"
    kept = (32 << 20) // 900_000  # 37
    assert (
        ob.pending.messages == big[-kept:] and ob.bytes == kept * 900_000 and ob.dropped == 40 - kept
    )  # then the oldest
    calls = []
    while ob.pending:
        calls.append(ob.take())
    assert [m for c in calls for m in c.messages] == big[-kept:] and ob.bytes == 0
    assert all(sum(m.size for m in c.messages) <= _BATCH_BYTES for c in calls) and len(calls) == 5


def test_a_blocking_get_on_the_node_loop_is_refused():
    with lattica.Node([TCP]) as n:
        sub = lattica.pubsub.subscribe("loop", node=n)

        async def on_loop():
            with pytest.raises(RuntimeError, match="block the node loop"):
                sub.get(timeout=1)
            return True

        assert n.run(on_loop(), timeout=5)


def test_coroutine_handlers_run_and_a_failing_heartbeat_does_not_end_the_upkeep():
    with lattica.Node([TCP]) as n:
        seen = []

        async def handler(msg):
            await asyncio.sleep(0)
            seen.append(msg.data)

        lattica.pubsub.subscribe("h", handler=handler, node=n)
        lattica.pubsub.publish("h", "x", node=n).result(5)
        assert wait_for(lambda: seen == ["x"], timeout=5)
        svc = n._host.services.pubsub
        real, beats = svc.router.heartbeat, []

        def flaky(now):
            beats.append(now)
            if len(beats) == 1:
                raise RuntimeError("a bad heartbeat")
            real(now)

        svc.router.heartbeat = flaky
        assert wait_for(lambda: len(beats) >= 3, timeout=10), "heartbeats go on after one failed"


def test_cancelled_waits_on_a_quiet_topic_do_not_pile_up():
    with lattica.Node([TCP]) as n:
        sub = lattica.pubsub.subscribe("quiet", node=n)

        async def wait_a_little():
            for _ in range(500):
                try:
                    await asyncio.wait_for(sub.next(), 0.001)
                except TimeoutError:
                    pass

        asyncio.run(wait_a_little())
        assert len(sub._waiters) <= 70


def test_each_peer_s_round_trip_is_measured(line):
    """The echo window of the mesh-delivery score is the peer's measured round trip."""
    a, b = line[0], line[1]
    lattica.pubsub.subscribe("rtt", node=a)
    lattica.pubsub.subscribe("rtt", node=b)
    router = a._host.services.pubsub.router
    assert wait_for(lambda: b.peer_id in router._rtt, timeout=10)
    assert 0 < router._rtt[b.peer_id] < 1.0


def _publish_in_one_turn(node, topic, items):
    """Publish ``items`` from ``node``'s loop without yielding (they leave as one bundle)."""
    svc = node._host.services.pubsub

    async def go():
        return [svc.publish(topic, x) for x in items]

    return node.run(go(), timeout=10)


def test_messages_published_together_leave_as_one_bundle_and_arrive_one_by_one(line):
    subs = [lattica.pubsub.subscribe("b", node=n) for n in line]
    assert _meshed(line, "b")
    reach = _publish_in_one_turn(line[2], "b", list(range(600)))
    assert reach == [2] * 600  # each publish says the peers it goes to
    svc = line[2]._host.services.pubsub
    # the first goes at once (nothing of ours was on the way), the other 599 in bundles of at most 256
    assert svc.stats()["bundles"] == 4
    for sub in subs:
        got = [sub.get(timeout=10) for _ in range(600)]
        assert [m.data for m in got] == list(range(600))
        assert len({m.seqno for m in got}) == 600 and all(m.author == line[2].peer_id for m in got)
    for sub in subs:
        with pytest.raises(Timeout):
            sub.get(timeout=0.3)  # exactly once


def test_a_bundle_passes_on_whole_and_items_are_delivered_where_accepted(line):
    subs = [lattica.pubsub.subscribe("odd", node=n) for n in line]
    assert _meshed(line, "odd")
    lattica.pubsub.validator("odd", lambda m: m.data % 2 == 0 or None, node=line[1])  # odd ones: ignore
    lattica.pubsub.validator("odd", lambda m: m.data < 100 or None, node=line[3])  # all ignored: not passed on
    _publish_in_one_turn(line[0], "odd", list(range(10)))
    _publish_in_one_turn(line[0], "odd", list(range(100, 110)))
    both = list(range(10)) + list(range(100, 110))
    assert [subs[0].get(timeout=5).data for _ in range(20)] == both
    assert [subs[1].get(timeout=5).data for _ in range(10)] == [0, 2, 4, 6, 8, 100, 102, 104, 106, 108]
    assert [
        subs[2].get(timeout=5).data for _ in range(20)
    ] == both  # the odd ones rode along to a node without a validator
    for sub in subs[3:]:  # node 3 ignores the whole second bundle: it goes no further
        assert [sub.get(timeout=5).data for _ in range(10)] == list(range(10))
    for sub in subs:
        with pytest.raises(Timeout):
            sub.get(timeout=0.3)
    assert all(n._host.services.pubsub.rejected == 0 for n in line)


def _bundle(node, topic, items, seqno=None, flooded=()):
    bodies = [b"".join(bytes(c) for c in lattica.codec.encode(x)) for x in items]
    author = node.peer_id.to_bytes()
    seqno = time.time_ns() if seqno is None else seqno
    bundle = Bundle(bodies, node._host.trust.presented, flooded)
    signed = [
        topic,
        author,
        seqno,
        bundle.wire(),
        node.keypair.sign(bundle.signed_bytes(topic, author, seqno)),
        bundle.certs,
    ]
    return signed + [list(flooded)] if flooded else signed


def test_a_bundle_with_a_changed_or_relabelled_item_is_refused_whole(line):
    a, b, c = line[0], line[1], line[2]
    subs = {t: lattica.pubsub.subscribe(t, node=b) for t in ("t", "u")}
    for n in (a, c):
        for t in ("t", "u"):
            lattica.pubsub.subscribe(t, node=n)
    assert wait_for(
        lambda: len(lattica.pubsub.peers("t", node=b)) == 2 and len(lattica.pubsub.peers("u", node=b)) == 2, timeout=10
    )
    forged = _bundle(a, "t", ["one", "two"])
    forged[3] = [forged[3][0], b"".join(bytes(x) for x in lattica.codec.encode("evil"))]
    relabelled = _bundle(a, "t", ["for t"])
    relabelled[0] = "u"
    call_as(c, pubsub_ref(b.peer_id), "rpc", _batch(forged, relabelled))
    for sub in subs.values():
        with pytest.raises(Timeout):
            sub.get(timeout=0.5)  # not even the untouched item: the signature covers them all
    assert b._host.services.pubsub.rejected == 2


def test_large_messages_travel_the_mesh(line):
    subs = [lattica.pubsub.subscribe("big", node=n) for n in line[:3]]
    assert wait_for(lambda: [len(lattica.pubsub.peers("big", node=n)) for n in line[:3]] == [1, 2, 1], timeout=10)
    blob = bytes(range(256)) * 1200  # 300 KiB: carried out of band, as a view of the frame
    assert lattica.pubsub.publish("big", {"w": blob}, node=line[0]).result(5) == 1
    for sub in subs:
        assert sub.get(timeout=10).data == {"w": blob}


def test_subscribers_find_each_other_through_the_dht():
    """Two subscribers that know only a bootstrap node (which does not join the topic) find each
    other under the topic's key, connect, mesh, and one's messages reach the other."""
    key = MeshKey.generate()
    boot = lattica.Node([TCP], mesh=key, membership=False).start()  # (membership gossip would introduce them too)
    try:
        a = lattica.Node([TCP], mesh=key, membership=False).start()
        b = lattica.Node([TCP], mesh=key, membership=False).start()
        try:
            for n in (a, b):
                n.connect(boot.addrs[0])
            assert b.peer_id not in a._host.conns
            sub = lattica.pubsub.subscribe("found", node=b)
            lattica.pubsub.subscribe("found", node=a)
            assert wait_for(lambda: lattica.pubsub.peers("found", node=a) == [b.peer_id], timeout=15)
            assert lattica.pubsub.publish("found", "hello", node=a).result(5) == 1
            assert sub.get(timeout=5).data == "hello"
            assert lattica.pubsub.topics(node=boot) == []
        finally:
            a.stop()
            b.stop()
    finally:
        boot.stop()


def test_an_author_beyond_its_rate_is_ignored_not_blamed_on_the_sender():
    """Bundles from one author beyond ``author_rate`` a second are ignored: no author can push
    the seen cache out within the clock window (then replay), and the peer that passed them on
    is not scored down."""
    key = MeshKey.generate()
    a = lattica.Node([TCP], mesh=key, membership=False, pubsub=PubSubConfig(discover=False)).start()
    b = lattica.Node([TCP], mesh=key, membership=False, pubsub=PubSubConfig(discover=False, author_rate=10.0)).start()
    try:
        b.connect(a.addrs[0])
        sub = lattica.pubsub.subscribe("r", node=b)
        lattica.pubsub.subscribe("r", node=a)
        assert wait_for(lambda: lattica.pubsub.peers("r", node=b) == [a.peer_id], timeout=10)
        base = time.time_ns()
        call_as(a, pubsub_ref(b.peer_id), "rpc", _batch(*(_envelope(a, "r", i, seqno=base + i) for i in range(50))))
        got = []
        while True:
            try:
                got.append(sub.get(timeout=0.5).data)
            except Timeout:
                break
        assert got == list(range(10)), got
        svc = b._host.services.pubsub
        assert svc.rejected == 0 and svc.router.score(a.peer_id, b._host.loop.time()) >= 0
        time.sleep(0.3)  # the bucket refills at 10 a second
        call_as(a, pubsub_ref(b.peer_id), "rpc", _batch(_envelope(a, "r", "later")))
        assert sub.get(timeout=5).data == "later"
    finally:
        a.stop()
        b.stop()


def test_a_publisher_yielding_between_messages_paces_its_bundles_and_loses_nothing(line):
    """One message per turn of the loop, thousands a second: the publisher keeps its bundles
    within half the rate receivers allow an author (bigger bundles instead), so none is ignored."""
    subs = [lattica.pubsub.subscribe("pace", node=n) for n in line[:3]]
    assert wait_for(lambda: [len(lattica.pubsub.peers("pace", node=n)) for n in line[:3]] == [1, 2, 1], timeout=10)
    svc = line[1]._host.services.pubsub

    async def go():
        t0 = time.monotonic()
        for i in range(3000):
            svc.publish("pace", i)
            await asyncio.sleep(0)
        return time.monotonic() - t0

    took = line[1].run(go(), timeout=60)
    rate = svc.cfg.author_rate / 2
    assert svc.stats()["bundles"] <= rate + rate * (took + 0.5), (svc.stats()["bundles"], took)
    for sub in subs:
        assert [sub.get(timeout=10).data for _ in range(3000)] == list(range(3000))
    assert all(n._host.services.pubsub.rejected == 0 for n in line[:3])


def test_open_topics_reach_strangers_and_nothing_else_does():
    """A node may open topics to strangers (PubSubConfig.open_topics): a peer of another mesh
    then meets it in those topics alone, publishes into them (its messages need no membership)
    and reads them; the mesh's other topics stay its own, whatever the stranger sends."""
    key = MeshKey.generate()
    cfg = PubSubConfig(discover=False, open_topics=("public/*",))
    host = lattica.Node([TCP], mesh=key, membership=False, pubsub=cfg).start()
    member = lattica.Node([TCP], mesh=key, membership=False, pubsub=cfg).start()
    stranger = lattica.Node([TCP], mesh=MeshKey.generate(), membership=False, pubsub=cfg).start()
    try:
        member.connect(host.addrs[0])
        stranger.connect(host.addrs[0])
        subs = {}
        nodes = {"host": host, "member": member, "stranger": stranger}
        for name, n in nodes.items():
            for t in ("public/news", "secret"):
                subs[(name, t)] = lattica.pubsub.subscribe(t, node=n)
        assert wait_for(
            lambda: (
                lattica.pubsub.peers("public/news", node=host) == sorted([member.peer_id, stranger.peer_id], key=str)
            ),
            timeout=10,
        )
        # (each subscription reaches the host on its own: the member's to "secret" may come a moment later)
        assert wait_for(lambda: lattica.pubsub.peers("secret", node=host) == [member.peer_id], timeout=10)
        assert lattica.pubsub.peers("secret", node=stranger) == []
        lattica.pubsub.publish("secret", "mesh only", node=member).result(5)
        lattica.pubsub.publish("public/news", "for all", node=member).result(5)
        assert subs[("host", "secret")].get(timeout=5).data == "mesh only"
        assert subs[("stranger", "public/news")].get(timeout=5).data == "for all"
        assert lattica.pubsub.publish("public/news", "from outside", node=stranger).result(5) == 1
        assert subs[("host", "public/news")].get(timeout=5).data == "for all"
        assert subs[("host", "public/news")].get(timeout=5).data == "from outside"
        assert [subs[("member", "public/news")].get(timeout=5).data for _ in range(2)] == [
            "for all",
            "from outside",
        ]  # passed on by the host
        assert lattica.pubsub.publish("secret", "sneaking in", node=stranger).result(5) == 0
        call_as(
            stranger,
            pubsub_ref(host.peer_id),
            "open_rpc",
            [[["secret", True]], [_envelope(stranger, "secret", "forced in")], [], [], ["secret"], [], []],
        )
        with pytest.raises(Timeout):
            subs[("host", "secret")].get(timeout=0.5)
        assert subs[("stranger", "secret")].get(timeout=5).data == "sneaking in"  # (its own, delivered to itself)
        with pytest.raises(Timeout):
            subs[("stranger", "secret")].get(timeout=0.5)  # nothing of the mesh's reached it
        assert lattica.pubsub.peers("secret", node=host) == [member.peer_id]
        with pytest.raises(PermissionDenied):
            call_as(
                stranger,
                pubsub_ref(host.peer_id),
                "rpc",
                _batch(_envelope(stranger, "public/news", "the members' door")),
            )
    finally:
        for n in (host, member, stranger):
            n.stop()


def test_an_author_s_flood_set_spares_its_peers_the_forwards():
    """Four members, all connected: each subscriber has the author's copy of each message and no
    forward of it (before flood sets, each got about three copies)."""
    key = MeshKey.generate()
    nodes = [lattica.Node([TCP], mesh=key, pubsub=PubSubConfig(discover=False)).start() for _ in range(4)]
    try:
        for i, a in enumerate(nodes):
            for b in nodes[i + 1 :]:
                b.connect(a.addrs[0])
        subs = [lattica.pubsub.subscribe("fs", node=n) for n in nodes]
        assert wait_for(lambda: all(len(lattica.pubsub.peers("fs", node=n)) == 3 for n in nodes), timeout=10)
        for i in range(10):
            assert lattica.pubsub.publish("fs", i, node=nodes[0]).result(5) == 3
            time.sleep(0.02)
        for sub in subs[1:]:
            assert [sub.get(timeout=5).data for _ in range(10)] == list(range(10))
        time.sleep(0.3)  # (a forward would have arrived by now)
        assert [n._host.services.pubsub.copies for n in nodes[1:]] == [10, 10, 10]
    finally:
        for n in nodes:
            n.stop()


def test_a_flood_set_is_signed_and_a_peer_it_names_wrongly_is_only_delayed(line):
    a, b, c, d = line[0], line[1], line[2], line[3]
    subs = [lattica.pubsub.subscribe("fl", node=n) for n in line]
    assert _meshed(line, "fl")
    named = sorted(flood_tag(n.peer_id.to_bytes()) for n in (b, c))
    lied = _bundle(a, "fl", ["to b only"], flooded=named)  # says c had it from a too: it did not
    call_as(a, pubsub_ref(b.peer_id), "rpc", _batch(lied))
    assert subs[1].get(timeout=5).data == "to b only"
    msg = subs[2].get(timeout=10)  # b did not forward it to c, but told c at its heartbeat
    assert msg.data == "to b only" and msg.via == b.peer_id
    assert subs[3].get(timeout=5).via == c.peer_id, "d was not named: c forwards it as usual"
    widened = _bundle(a, "fl", ["widened"], flooded=named[:1])
    widened[6] = named  # a tag added on the way: the signature no longer holds
    call_as(c, pubsub_ref(d.peer_id), "rpc", _batch(widened))
    with pytest.raises(Timeout):
        subs[3].get(timeout=0.5)
    assert d._host.services.pubsub.rejected == 1


def test_a_copy_with_other_certificates_or_flood_set_cannot_pre_empt_the_author_s(line):
    """A message id covers everything the signature does: a copy whose certificates, flood set or
    topic were changed on the way is another message, refused on its own, and the author's copy still
    arrives (and its sender is not blamed for the fake)."""
    a, b, c = line[0], line[1], line[2]
    sub = lattica.pubsub.subscribe("pre", node=b)
    for n in (a, c):
        lattica.pubsub.subscribe("pre", node=n)
    assert wait_for(lambda: len(lattica.pubsub.peers("pre", node=b)) == 2, timeout=10)
    svc = b._host.services.pubsub
    ref = pubsub_ref(b.peer_id)
    tag = flood_tag(b.peer_id.to_bytes())
    lattica.pubsub.subscribe("pre2", node=b)
    for k, change in enumerate(
        [
            lambda m: m.__setitem__(5, m[5] + m[5]),
            lambda m: m.__setitem__(6, [tag, b"\x00" * 8]),
            lambda m: m.__setitem__(0, "pre2"),
        ]
    ):  # other certificates, flood set, topic
        genuine = _bundle(a, "pre", [f"genuine {k}"], flooded=[tag])
        fake = list(genuine)
        change(fake)
        call_as(c, ref, "rpc", _batch(fake))  # sent first
        call_as(a, ref, "rpc", _batch(genuine))
        assert sub.get(timeout=5).data == f"genuine {k}"
        assert svc.rejected == k + 1
    now = b._host.loop.time()
    assert svc.router.score(a.peer_id, now) >= 0, "the author's own copy did not count as invalid"
