"""Regressions from the DHT review, at the level of the routing table and the record store: a
removed peer cannot come back from a replacement list, provider and peer records are charged to
per-peer quotas (peer records by their bytes), and a hostile store file is skipped row by row."""

import time

import msgpack
import pytest

from lattica.errors import RecordRejected
from lattica.identity import KeyPair
from lattica.kademlia import RoutingTable, key_id, node_id
from lattica.multiaddr import Multiaddr
from lattica.records import PeerRecord, RecordStore, StoreLimits

pytestmark = pytest.mark.timeout(30)


# -- r6 ---------------------------------------------------------------------------------------


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


# -- r9 ---------------------------------------------------------------------------------------


def test_provider_and_peer_records_are_charged_to_the_storing_peers_quota():
    limits = StoreLimits(peer_records=10)
    st = RecordStore(limits)
    attacker, honest = KeyPair.generate().peer_id, KeyPair.generate().peer_id
    for i in range(10):
        st.add_provider(b"junk-%d" % i, attacker, 3600)
    assert st.usage(attacker)[0] == 10 and st.usage(attacker)[1] > 0
    with pytest.raises(RecordRejected, match="quota"):
        st.add_provider(b"junk-10", attacker, 3600)
    st.add_provider(b"junk-0", attacker, 7200)  # refreshing its own record costs nothing more
    assert st.usage(attacker)[0] == 10
    st.add_provider(b"real-content", honest, 3600)  # the attacker's quota is not everyone's
    assert [p for p, _ in st.providers(b"real-content")] == [honest]
    assert st.usage(honest)[0] == 1

    # peer records: charged to whoever stored them, by their size in bytes
    st2 = RecordStore(StoreLimits(peer_records=1000, peer_bytes=20_000))
    sender = KeyPair.generate().peer_id
    long = "/dns4/" + ".".join(["a" * 60] * 3) + "/tcp/"
    rec = PeerRecord.create(KeyPair.generate(), [Multiaddr(f"{long}{i}") for i in range(1, 33)])
    text_bytes = sum(len(t) for t in rec.texts)
    assert text_bytes > 5000
    assert st2.put_peer_record(rec, sender) is True
    records, used = st2.usage(sender)
    assert records == 1 and used >= text_bytes
    st2.put_peer_record(PeerRecord.create(KeyPair.generate(), rec.addrs), sender)
    st2.put_peer_record(PeerRecord.create(KeyPair.generate(), rec.addrs), sender)
    with pytest.raises(RecordRejected, match="quota"):  # a fourth ~6 KB record passes 20 000 bytes
        st2.put_peer_record(PeerRecord.create(KeyPair.generate(), rec.addrs), sender)
    assert st2.usage(sender)[0] == 3
    # a peer's own record, published by itself, counts against its own quota
    own = KeyPair.generate()
    st2.put_peer_record(PeerRecord.create(own, [Multiaddr("/ip4/192.0.2.1/tcp/4001")]))
    assert st2.usage(own.peer_id)[0] == 1


# -- r5 ---------------------------------------------------------------------------------------


def test_a_hostile_store_file_is_skipped_and_the_node_still_starts(tmp_path):
    import lattica

    kp = KeyPair.generate()
    good_peer = PeerRecord.create(kp, [Multiaddr("/ip4/1.2.3.4/tcp/1")]).to_wire()
    writer = KeyPair.generate().peer_id
    good_value = [b"good-key", b"", b"\xa1v", time.time() + 600, b"", writer.to_bytes()]
    hostile = [
        {"v": 1, "values": 5},
        {"v": 1, "providers": None},
        {"v": 1, "peers": [[good_peer, "soon"]]},
        {"v": 1, "values": [None, 7, "x", [1, 2], good_value], "providers": [[b"\x00" * 32, None], 3, [b"k", [[b"not-a-peer", 1e18]]]], "peers": "abc"},
        {"v": 1, "values": {"a": 1}, "providers": {"b": 2}, "peers": [[None, None], [good_peer, None], 5]},
    ]
    for obj in hostile:
        st = RecordStore()
        st.load(msgpack.packb(obj, use_bin_type=True))  # never raises on wrong shapes
    st = RecordStore()
    assert st.load(msgpack.packb(hostile[3], use_bin_type=True)) == 1  # the one valid row is kept
    assert st.get(key_id(b"good-key"))[1][b""].value == b"\xa1v"

    for i, obj in enumerate(hostile + [b"\x93\x01\x02"]):  # the last: not even a dict
        path = tmp_path / f"dht-{i}.store"
        path.write_bytes(obj if isinstance(obj, bytes) else msgpack.packb(obj, use_bin_type=True))
        with lattica.Node(["/ip4/127.0.0.1/tcp/0"], dht_path=str(path)) as node:
            assert node.running  # the file was input like any other: bad rows skipped, good kept
            assert node._host.runtime.dht.store.record_count == (1 if i == 3 else 0)
