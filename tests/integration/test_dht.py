"""The DHT between real nodes: three processes on loopback (put/get, subkeys from several
writers, providers, peer records, names resolved mesh-wide, a name that expires when its process
is killed), persistence across a restart, and bad input from peers: forged records, forged peer
records, oversized values, quota and rate exhaustion, and peers that answer lookups with garbage or
with themselves. Each is rejected with a typed error at the sender (or recorded as misbehaviour),
and the lookups still complete. Then the protocol's finer points between nodes on loopback: expired
records in answers do not brand their holders, peer records are served as signed, local failures
evict nobody, addresses in answers are only hints, name registrations are short-lived, one bad
subkey hides only itself, republish never extends a record, delete outlives a long-lived record,
name refreshes do not pile up, and lookups have an overall deadline."""

import asyncio
import concurrent.futures
import json
import os
import signal
import socket
import subprocess
import sys
import time
import types

import pytest

import lattica
import lattica.actors.dht.lookups as dht_lookups
import lattica.actors.dht.upkeep as dht_upkeep
import sample_actors as sa
from dht_actors import DhtProbe
from helpers import wait_for
from lattica import codec
from lattica._identity import KeyPair
from lattica._multiaddr import Multiaddr
from lattica._runtime import ASYNC, ActorRef
from lattica.actors.dht import DhtConfig, dht_ref, name_key
from lattica.dht._kademlia import key_id, node_id
from lattica.dht._records import Entry, PeerRecord, StoreLimits, encode_subkey, entry_to_wire, sign_entry
from lattica.errors import ActorNotFound, RecordRejected, StoreFailed
from lattica.mesh.process import ServerProcess

pytestmark = pytest.mark.timeout(90)

TCP = "/ip4/127.0.0.1/tcp/0"


def _dht(node):
    return node._host.services.dht


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


# -- three processes --------------------------------------------------------------------------


@pytest.fixture
def three():
    """This process's default node and two server processes, all joined to one DHT."""
    lattica.shutdown()
    with (
        ServerProcess([TCP], "--allow", "dht_actors.*", "--allow", "sample_actors.*") as a,
        ServerProcess([TCP], "--allow", "dht_actors.*", "--allow", "sample_actors.*") as b,
    ):
        node = lattica.init(allow=["sample_actors.*"], bootstrap=[a.addr("tcp"), b.addr("tcp")])
        pa = DhtProbe.options(node=a.peer_id).remote()
        pb = DhtProbe.options(node=b.peer_id).remote()
        # A finds B through us: init returns once one bootstrap peer is connected, so a bootstrap
        # of A may run before we have B; a node bootstraps again, as these do here
        assert wait_for(lambda: pa.bootstrap.remote().result(10) >= 2, 10)
        assert wait_for(lambda: pb.bootstrap.remote().result(10) >= 2, 10)
        try:
            yield node, (a, pa), (b, pb)
        finally:
            lattica.shutdown()


def test_put_here_get_there_and_subkeys_from_three_writers_merge(three):
    node, (a, pa), (b, pb) = three
    assert lattica.dht.put("plain", {"x": 1}).result(10) == 3  # every node is among the k closest
    assert pb.get.remote("plain").result(10) == {"": {"x": 1}}
    # three writers, each under its own PeerId subkey (owner-signed), never overwrite each other
    assert lattica.dht.put("swarm/layers", [0, 8], subkey=node.peer_id).result(10) == 3
    assert pa.put.remote("swarm/layers", [8, 16], subkey=lattica.PeerId.from_string(a.peer_id)).result(10) == 3
    assert pb.put.remote("swarm/layers", [16, 24], subkey=lattica.PeerId.from_string(b.peer_id)).result(10) == 3
    rec = lattica.dht.get("swarm/layers").result(10)
    assert {str(k): v.value for k, v in rec.items()} == {
        str(node.peer_id): [0, 8],
        a.peer_id: [8, 16],
        b.peer_id: [16, 24],
    }
    assert all(v.expiration > time.time() + 50 for v in rec.values())
    # a delete is a tombstone that outlives the record
    assert lattica.dht.delete("plain").result(10) == 3
    assert lattica.dht.get("plain").result(10) is None
    assert pa.get.remote("plain").result(10) is None


def test_a_peer_cannot_write_another_peers_subkey(three):
    node, (a, pa), (b, pb) = three
    with pytest.raises(RecordRejected, match="owned by"):
        pa.put.remote("swarm/layers", [6, 6], subkey=node.peer_id).result(10)  # A signs as itself


def test_providers_and_peer_records_across_processes(three):
    node, (a, pa), (b, pb) = three
    assert pa.provide.remote(b"cid-1").result(10) >= 1
    assert lattica.dht.find_providers(b"cid-1").result(10) == [lattica.PeerId.from_string(a.peer_id)]
    assert pb.find_providers.remote(b"cid-1").result(10) == [lattica.PeerId.from_string(a.peer_id)]
    assert lattica.dht.find_providers(b"nobody-provides-this").result(10) == []
    addrs = pb.find_peer.remote(lattica.PeerId.from_string(a.peer_id)).result(10)
    assert a.addr("tcp").split("/p2p/")[0] in addrs


def test_a_named_actor_resolves_from_any_node(three, token):
    node, (a, pa), (b, pb) = three
    name = f"trainer-{token}"
    c = sa.Counter.options(node=lattica.PeerId.from_string(a.peer_id), name=name).remote(41)
    assert c.incr.remote().result(10) == 42
    assert wait_for(lambda: _resolves(name), timeout=10)
    ref = lattica.get_actor(name)
    assert ref.peer_id == c.peer_id and ref.get.remote().result(10) == 42
    assert pb.call_named.remote(name, "get").result(10) == 42  # B resolves it through the DHT too
    lattica.kill(c)
    assert wait_for(lambda: not _resolves(name), timeout=10)  # killed: its name is withdrawn


def test_get_actor_waits_for_a_name_registered_after_it_started(three, token):
    """A caller that starts before the callee has registered (the cold-start race) gets the
    actor once the registration lands, not ActorNotFound from the first empty lookup."""
    node, (a, pa), (b, pb) = three
    name = f"late-{token}"
    where = lattica.PeerId.from_string(a.peer_id)
    warm = sa.Counter.options(node=where).remote(0)  # (the spawn path warm: the race is the DHT's, not imports')
    assert warm.get.remote().result(10) == 0
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        pending = pool.submit(lattica.get_actor, name, None, 8.0)
        time.sleep(0.25)  # lookups have come back empty by now (get_actor looks again for ~1 s)
        assert not pending.done()
        c = sa.Counter.options(node=where, name=name).remote(6)
        ref = pending.result(10)
    assert ref.peer_id == c.peer_id and ref.get.remote().result(10) == 6
    lattica.kill(c)
    lattica.kill(warm)


def test_get_actor_of_an_unknown_name_fails_with_actor_not_found_within_its_timeout(three, token):
    t0 = time.monotonic()
    with pytest.raises(ActorNotFound, match="no live actor named"):
        lattica.get_actor(f"nobody-{token}", timeout=1.5)
    assert 0.5 < time.monotonic() - t0 < 3.0  # looked again for a while, then gave up in time


CHILD = r"""
import json, os, sys
import lattica
from lattica.actors.dht import DhtConfig
node = lattica.init(["/ip4/127.0.0.1/tcp/0"], allow=["sample_actors.*"], dht=DhtConfig(name_ttl=3.0))
print(json.dumps({"peer_id": str(node.peer_id), "addrs": [str(a) for a in node.addrs]}), flush=True)
sys.stdin.read()
"""


def test_a_name_expires_when_its_process_is_killed(default_node, token):
    proc = subprocess.Popen([sys.executable, "-c", CHILD], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        info = json.loads(proc.stdout.readline())
        default_node.connect(info["addrs"][0])
        lattica.dht.bootstrap().result(10)
        name = f"worker-{token}"
        c = sa.Counter.options(node=lattica.PeerId.from_string(info["peer_id"]), name=name).remote(1)
        assert c.get.remote().result(10) == 1
        assert wait_for(lambda: _resolves(name), timeout=10)
        time.sleep(3.5)  # past name_ttl: the live actor's registration was refreshed meanwhile
        assert _resolves(name)
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(10)
        assert wait_for(lambda: not _resolves(name), timeout=10)  # no refresh: the record expires
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def _resolves(name):
    try:
        lattica.get_actor(name, timeout=1)
        return True
    except ActorNotFound:
        return False


# -- persistence ------------------------------------------------------------------------------


def test_a_restarted_node_keeps_what_it_held(tmp_path):
    key = tmp_path / "node.key"
    path = tmp_path / "dht.store"
    with lattica.Node([TCP], key_path=key, dht_path=path) as holder, lattica.Node([TCP]) as writer:
        writer.connect(holder.addrs[0])
        assert lattica.dht.put("kept", "across restarts", ttl=600, node=writer).result(10) == 2
    assert path.exists()
    with lattica.Node([TCP], key_path=key, dht_path=path) as holder, lattica.Node([TCP]) as reader:
        reader.connect(holder.addrs[0])
        assert lattica.dht.get("kept", node=reader).result(10).value == "across restarts"


# -- bad input --------------------------------------------------------------------------------


@pytest.fixture
def pair():
    with lattica.Node([TCP]) as a, lattica.Node([TCP]) as b:
        a.connect(b.addrs[0])
        yield a, b


def test_a_forged_owned_record_is_rejected_at_the_sender(pair):
    a, b = pair
    key, sk, exp = b"swarm/layers", encode_subkey(b.peer_id), time.time() + 60  # b's subkey ...
    mine = sign_entry(a.keypair, key, encode_subkey(a.peer_id), b"\xa1v", exp)  # a valid signature, by a
    with pytest.raises(RecordRejected, match="not signed by that peer"):
        _call(a, b.peer_id, "store", key, [sk, b"\xa1v", exp, mine.signature])  # ... claimed by a
    with pytest.raises(RecordRejected, match="not signed by that peer"):
        _call(a, b.peer_id, "store", key, [sk, b"\xa1v", exp, b""])
    owned = f"config[owner:{b.peer_id}]".encode()  # a key owned by b: any subkey needs b's signature
    signed = sign_entry(b.keypair, owned, b"", b"\x01", exp)
    with pytest.raises(RecordRejected, match="not signed by that peer"):  # b's signature, value swapped
        _call(a, b.peer_id, "store", owned, entry_to_wire(b"", Entry(b"\x02", exp, signed.signature)))
    assert _dht(b).store.get(key_id(key)) is None and _dht(b).store.get(key_id(owned)) is None
    assert _dht(b).rejected == 3


def test_a_forged_peer_record_is_rejected(pair):
    a, b = pair
    real = PeerRecord.create(b.keypair, b.addrs)
    wire = real.to_wire()
    wire[2] = ["/ip4/6.6.6.6/tcp/6666"]  # addresses changed after signing
    with pytest.raises(RecordRejected, match="not signed"):
        _call(a, b.peer_id, "put_peer_record", wire)
    impostor = PeerRecord.create(a.keypair, a.addrs).to_wire()
    impostor[0] = b.peer_id.to_bytes()  # a's signature, claiming to be b
    with pytest.raises(RecordRejected, match="not signed"):
        _call(a, b.peer_id, "put_peer_record", impostor)
    assert _call(a, b.peer_id, "put_peer_record", real.to_wire()) is True


def test_oversized_expired_and_far_future_records_are_rejected(pair):
    a, b = pair
    big = b"\x00" * (StoreLimits().max_value + 1)
    with pytest.raises(RecordRejected, match="value is"):
        _call(a, b.peer_id, "store", b"k", [b"", big, time.time() + 60, b""])
    with pytest.raises(RecordRejected, match="expired"):
        _call(a, b.peer_id, "store", b"k", [b"", b"\x01", time.time() - 1, b""])
    with pytest.raises(RecordRejected, match="expires more than"):
        _call(a, b.peer_id, "store", b"k", [b"", b"\x01", time.time() + 10 * 86400, b""])
    with pytest.raises(RecordRejected, match="record is"):
        _call(a, b.peer_id, "store", b"k", ["not", "a", "record"])
    # the facade refuses too: no replica accepts, and the error says why
    with pytest.raises(StoreFailed, match="value is"):
        lattica.dht.put("k", b"\x00" * 20000, node=a).result(10)


def test_quota_and_rate_limits_reject_and_the_node_keeps_serving():
    limits = StoreLimits(peer_records=5, rate=5.0, burst=8.0)
    with lattica.Node([TCP], dht=DhtConfig(limits=limits)) as b, lattica.Node([TCP]) as a:
        a.connect(b.addrs[0])
        exp = time.time() + 60
        for i in range(5):
            assert _call(a, b.peer_id, "store", f"q{i}".encode(), [b"", b"\x01", exp, b""]) is True
        with pytest.raises(RecordRejected, match="quota"):
            _call(a, b.peer_id, "store", b"q5", [b"", b"\x01", exp, b""])
        assert _call(a, b.peer_id, "store", b"q0", [b"", b"\x02", exp + 1, b""]) is True  # own record: no extra charge
        with pytest.raises(RecordRejected, match="rate limit"):
            for i in range(20):
                _call(a, b.peer_id, "store", b"q0", [b"", b"\x02", exp + 2 + i, b""])
        assert _call(a, b.peer_id, "ping") is True  # still serving
        assert _dht(b).store.usage(a.peer_id)[0] == 5


def test_a_put_reports_how_many_replicas_accepted():
    strict = StoreLimits(max_value=8)
    with lattica.Node([TCP]) as a, lattica.Node([TCP]) as b, lattica.Node([TCP], dht=DhtConfig(limits=strict)) as c:
        a.connect(b.addrs[0])
        a.connect(c.addrs[0])
        assert lattica.dht.put("partly", "x" * 20, node=a).result(10) == 2  # c refused: value too large


def test_lookups_complete_past_peers_that_answer_garbage_or_themselves():
    nodes = [lattica.Node([TCP]).start() for _ in range(6)]
    try:
        hub, liar, echo, *honest = nodes
        for n in nodes[1:]:
            n.connect(hub.addrs[0])
        for n in nodes:
            lattica.dht.bootstrap(node=n).result(10)

        async def garbage(target):
            return [["not", "a", "peer"], 42]

        async def only_itself(target):
            return [[echo.peer_id, echo.addrs]]

        liar._host.runtime.actors["dht"].bound["find_node"] = garbage
        echo._host.runtime.actors["dht"].bound["find_node"] = only_itself
        liar._host.runtime.actors["dht"].bound["find_value"] = garbage
        for n in honest:
            lattica.dht.bootstrap(node=n).result(10)
        asker = honest[0]
        assert lattica.dht.put("survives", 7, node=honest[1]).result(10) >= 3
        assert lattica.dht.get("survives", node=asker).result(10).value == 7
        svc = _dht(asker)
        assert liar.peer_id in svc.misbehaved  # recorded ...
        assert liar.peer_id not in svc.table  # ... and kept out of the routing table
        for n in honest:
            assert lattica.dht.get("survives", node=n).result(10).value == 7
    finally:
        for n in nodes:
            n.stop()


def test_the_cli_puts_and_gets_through_a_bootstrap_node():
    with lattica.Node([TCP]) as boot:
        addr = str(boot.addrs[0])

        def cli(*args, status=0):
            out = subprocess.run(
                [sys.executable, "-m", "lattica.cli", "dht", *args, "--bootstrap", addr],
                capture_output=True,
                text=True,
                timeout=60,
            )
            assert out.returncode == status, out.stderr
            return json.loads(out.stdout)

        assert cli("put", "cli/key", '{"n": 5}')["replicas"] == 2
        assert cli("get", "cli/key")["subkeys"][""]["value"] == {"n": 5}
        assert lattica.dht.get("cli/key", node=boot).result(10).value == {"n": 5}
        assert cli("get", "cli/none", status=1) == {
            "key": "cli/none",
            "found": False,
            "subkeys": {},
        }  # (a script can test for it)
        assert cli("peer", str(boot.peer_id))["addrs"] == [addr.split("/p2p/")[0]]


def test_a_successful_get_caches_the_record_at_the_closest_node_that_lacked_it():
    # one replica, k = 3: a reader's 3 closest always include a node without the record (at most
    # two hold it: the replica, and the peer a put stores on while its lookup still runs)
    cfg = lambda: DhtConfig(k=3, replication=1)  # noqa: E731
    nodes = [lattica.Node([TCP], dht=cfg()).start() for _ in range(7)]
    try:
        for n in nodes[1:]:
            n.connect(nodes[0].addrs[0])
        for _ in range(2):
            for n in nodes:
                lattica.dht.bootstrap(node=n).result(10)
        kid = key_id(b"cached")

        def holders():
            return {n.peer_id for n in nodes if _dht(n).store.get(kid) is not None}

        writer = nodes[1]
        assert lattica.dht.put("cached", "v", node=writer).result(10) == 1
        before = holders()
        assert 1 <= len(before) <= 2
        reader = next(n for n in nodes if n.peer_id not in before and n is not writer)
        assert lattica.dht.get("cached", node=reader).result(10).value == "v"
        assert wait_for(
            lambda: len(holders()) == len(before) + 1, timeout=5
        )  # one more copy, at a node the lookup asked
        assert before < holders()
    finally:
        for n in nodes:
            n.stop()


def test_a_peer_is_called_by_its_peer_id_alone_through_its_dht_record():
    with (
        lattica.Node([TCP], allow=["sample_actors.*"]) as hub,
        lattica.Node([TCP], allow=["sample_actors.*"]) as b,
        lattica.Node([TCP]) as c,
    ):
        b.connect(hub.addrs[0])
        c.connect(hub.addrs[0])
        for n in (hub, b, c):
            lattica.dht.bootstrap(node=n).result(10)
        c.disconnect(b.peer_id)  # (the joins' lookups connected them)
        assert wait_for(lambda: b.peer_id not in c._host.conns and c.peer_id not in b._host.conns)
        c._host.peer_addrs.pop(b.peer_id, None)  # c forgets where b is

        async def call_b():
            ref = sa.Counter.options(node=b.peer_id).remote(5)  # a spawn addressed by PeerId only
            return await ref.get.remote()

        assert c.run(call_b(), timeout=20) == 5
        assert str(b.addrs[0]).split("/p2p/")[0] in [str(a) for a in c._host.peer_addrs[b.peer_id]]
        with pytest.raises(lattica.errors.PeerUnreachable, match="DHT"):
            c.run(
                _await(c._host.runtime.call(dht_ref(lattica.KeyPair.generate().peer_id), "ping", (), {}, timeout=10)),
                timeout=20,
            )


def test_a_peer_that_moved_to_a_new_port_is_found_again_through_its_newest_record(tmp_path):
    key = tmp_path / "b.key"
    with lattica.Node([TCP], allow=["sample_actors.*"]) as hub, lattica.Node([TCP]) as c:
        c.connect(hub.addrs[0])
        with lattica.Node([TCP], key_path=key, allow=["sample_actors.*"]) as b:
            b.connect(hub.addrs[0])
            for n in (hub, b, c):
                lattica.dht.bootstrap(node=n).result(10)
            c.connect(b.addrs[0])
            old = str(b.addrs[0]).split("/p2p/")[0]
        assert wait_for(lambda: b.peer_id not in c._host.conns)
        with lattica.Node([TCP], key_path=key, allow=["sample_actors.*"]) as b2:  # same identity, new port
            assert str(b2.addrs[0]).split("/p2p/")[0] != old
            b2.connect(hub.addrs[0])  # publishes its new signed record at the hub only (no lookups,
            assert _call(
                b2, hub.peer_id, "put_peer_record", PeerRecord.create(b2.keypair, b2.addrs).to_wire()
            )  # so c never hears of it)
            assert b2.peer_id not in c._host.conns
            assert [str(a) for a in c._host.peer_addrs[b2.peer_id]] == [old]  # c knows only the old place
            assert c._host.services.dht.store.peer_record(b2.peer_id) is not None  # ... and holds the old record

            async def call():
                ref = sa.Counter.options(node=b2.peer_id).remote(9)
                return await ref.get.remote()

            assert c.run(call(), timeout=20) == 9


# -- found in review (r1..r16): records in answers, hints, eviction, names, republish, lookups --


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
    assert rec is not None and dict(rec) == {
        "fresh": lattica.dht.Value("live", live.expiration)
    }  # its answer was used ...
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
    assert wait_for(lambda: len(a._host.all_conns) == 1)  # (a adopts it as the handshake's last message arrives)
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
    refresh = svc._refresh_live

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
        svc._refresh_live = counted_refresh
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
