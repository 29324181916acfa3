"""What the DHT's table takes in and hands out, judged on a fake host view (no sockets): peers
that only advertise private addresses are neither admitted nor given to peers off our network,
a peer we reach at a private IP (our LAN) keeps its private addresses for LAN askers, and a
member membership holds down leaves the table (issue 16)."""

import types

from lattica._identity import KeyPair
from lattica._membership import MemberDown
from lattica._multiaddr import Multiaddr
from lattica.actors.dht.state import DhtState


class _Host:
    def __init__(self):
        self.keypair = KeyPair.generate()
        self.peer_addrs = {}
        self.conns = {}
        self.spawned = []

    def spawn(self, coro):
        coro.close()  # the table's ping of its oldest peer: not under test here
        self.spawned.append(coro)


def _state():
    host = _Host()
    rt = types.SimpleNamespace(host=host, peer_id=host.keypair.peer_id)
    return DhtState(rt), host


def _peer():
    return KeyPair.generate().peer_id


def _conn_from(ip):
    return types.SimpleNamespace(is_closed=False, transport="tcp", remote_addr=Multiaddr(f"/ip4/{ip}/tcp/4001"))


PUBLIC = Multiaddr("/ip4/203.0.113.7/tcp/4001")  # not private by our rule (documentation range)
PRIVATE = Multiaddr("/ip4/10.1.2.3/tcp/4001")


def test_a_peer_with_only_private_addresses_is_not_admitted_unless_it_is_on_our_lan():
    dht, host = _state()
    far, near, mixed = _peer(), _peer(), _peer()
    host.peer_addrs = {far: [PRIVATE], near: [Multiaddr("/ip4/192.168.1.9/tcp/4001")], mixed: [PRIVATE, PUBLIC]}
    host.conns = {far: _conn_from("198.51.100.1"), near: _conn_from("192.168.1.9")}
    for p in (far, near, mixed):
        dht.seen(p)
    assert far not in dht.table
    assert near in dht.table and mixed in dht.table
    dht.seen(far)  # calling us again does not bring it back either
    assert far not in dht.table


def test_answers_to_peers_off_our_network_carry_no_private_addresses():
    dht, host = _state()
    mixed, lan_only, asker_far, asker_lan = _peer(), _peer(), _peer(), _peer()
    host.conns = {
        lan_only: _conn_from("10.1.2.4"),
        asker_far: _conn_from("198.51.100.2"),
        asker_lan: _conn_from("10.1.2.5"),
    }
    host.peer_addrs = {mixed: [PRIVATE, PUBLIC], lan_only: [Multiaddr("/ip4/10.1.2.4/tcp/4001")]}
    dht.seen(mixed)
    dht.seen(lan_only)
    assert dht.peers_wire([mixed, lan_only], asker_far) == [[mixed, [PUBLIC]]]
    assert dht.peers_wire([mixed, lan_only], asker_lan) == [
        [mixed, [PRIVATE, PUBLIC]],
        [lan_only, [Multiaddr("/ip4/10.1.2.4/tcp/4001")]],
    ]


def test_a_member_held_down_leaves_the_table():
    dht, host = _state()
    peer = _peer()
    host.peer_addrs = {peer: [PUBLIC]}
    dht.seen(peer)
    assert peer in dht.table
    dht.on_membership(MemberDown(types.SimpleNamespace(id=str(peer)), "dead"))
    assert peer not in dht.table
    dht.on_membership(MemberDown(types.SimpleNamespace(id="not-a-peer-id"), "dead"))  # ignored
