"""The DHT between real nodes: three processes on loopback (put/get, subkeys from several
writers, providers, peer records, names resolved mesh-wide, a name that expires when its process
is killed), persistence across a restart, and bad input from peers: forged records, forged peer
records, oversized values, quota and rate exhaustion, and peers that answer lookups with garbage or
with themselves. Each is rejected with a typed error at the sender (or recorded as misbehaviour),
and the lookups still complete."""

import json
import os
import signal
import subprocess
import sys
import time

import pytest

import lattica
import sample_actors as sa
from dht_actors import DhtProbe
from lattica.actors.dht import DhtConfig, dht_ref
from lattica.mesh.process import ServerProcess
from lattica.errors import ActorNotFound, RecordRejected, StoreFailed
from lattica.kademlia import key_id
from lattica.records import Entry, PeerRecord, StoreLimits, encode_subkey, entry_to_wire, sign_entry
from helpers import wait_for

pytestmark = pytest.mark.timeout(90)

TCP = "/ip4/127.0.0.1/tcp/0"


def _dht(node):
    return node._host.runtime.dht


def _call(node, peer, method, *args):
    """Call ``peer``'s dht actor directly from ``node`` (as a peer of the protocol would)."""
    rt = node._host.runtime
    return node.run(_await(rt.call(dht_ref(peer), method, args, {}, timeout=5)), timeout=10)


async def _await(fut):
    return await fut


# -- three processes --------------------------------------------------------------------------


@pytest.fixture
def three():
    """This process's default node and two server processes, all joined to one DHT."""
    lattica.shutdown()
    with ServerProcess([TCP], "--allow", "dht_actors.*", "--allow", "sample_actors.*") as a, ServerProcess([TCP], "--allow", "dht_actors.*", "--allow", "sample_actors.*") as b:
        node = lattica.init(allow=["sample_actors.*"], bootstrap=[a.addr("tcp"), b.addr("tcp")])
        pa = DhtProbe.options(node=a.peer_id).remote()
        pb = DhtProbe.options(node=b.peer_id).remote()
        assert pa.bootstrap.remote().result(10) >= 2  # A finds B through us
        assert pb.bootstrap.remote().result(10) >= 2
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
    assert {str(k): v.value for k, v in rec.items()} == {str(node.peer_id): [0, 8], a.peer_id: [8, 16], b.peer_id: [16, 24]}
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
        lattica.get_actor(name, timeout=3)
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

        def cli(*args):
            out = subprocess.run([sys.executable, "-m", "lattica.cli", "dht", *args, "--bootstrap", addr], capture_output=True, text=True, timeout=60)
            assert out.returncode == 0, out.stderr
            return json.loads(out.stdout)

        assert cli("put", "cli/key", '{"n": 5}')["replicas"] == 2
        assert cli("get", "cli/key")["subkeys"][""]["value"] == {"n": 5}
        assert lattica.dht.get("cli/key", node=boot).result(10).value == {"n": 5}
        assert cli("get", "cli/none") == {"key": "cli/none", "found": False, "subkeys": {}}
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
        assert wait_for(lambda: len(holders()) == len(before) + 1, timeout=5)  # one more copy, at a node the lookup asked
        assert before < holders()
    finally:
        for n in nodes:
            n.stop()


def test_a_peer_is_called_by_its_peer_id_alone_through_its_dht_record():
    with lattica.Node([TCP], allow=["sample_actors.*"]) as hub, lattica.Node([TCP], allow=["sample_actors.*"]) as b, lattica.Node([TCP]) as c:
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
            c.run(_await(c._host.runtime.call(dht_ref(lattica.KeyPair.generate().peer_id), "ping", (), {}, timeout=10)), timeout=20)


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
            assert _call(b2, hub.peer_id, "put_peer_record", PeerRecord.create(b2.keypair, b2.addrs).to_wire())  # so c never hears of it)
            assert b2.peer_id not in c._host.conns
            assert [str(a) for a in c._host.peer_addrs[b2.peer_id]] == [old]  # c knows only the old place
            assert c._host.runtime.dht.store.peer_record(b2.peer_id) is not None  # ... and holds the old record

            async def call():
                ref = sa.Counter.options(node=b2.peer_id).remote(9)
                return await ref.get.remote()

            assert c.run(call(), timeout=20) == 9
