"""NAT mappings that expire while a connection is idle.

A private node's only way in is its connection to its relay; behind a NAT that connection lives
only as long as the router's mapping, which for UDP (QUIC) lasts as long as the router's UDP
timeout after the last packet out. Here a symmetric NAT forgets UDP mappings after 3 s of silence
and the private node speaks QUIC only. The tests read the router's connection-tracking table
(``/proc/net/nf_conntrack`` in its namespace), so they see the mapping itself:

with keepalives more frequent than the timeout (1 s) the mapping survives 20 s without calls at
the same public port, and a stranger's call comes in through the relay at once.

A mapping that expires anyway (here: the router drops both directions before connection
tracking sees them, for twice its timeout, as when a NAT forgets its table or reboots): the
node's next packets leave through a new public port; the relay routes QUIC datagrams by
connection id, so the connection migrates to the new address (aioquic validates the path) and
the reservation and the in-stream circuits through it carry on (a spliced circuit, on its own TCP
sockets through the relay, does not depend on the UDP mapping at all).

The control: with keepalives every 30 s instead, the same idle time outlives the mapping (the
node's other traffic leaves gaps longer than 3 s), so it is the keepalives that hold it. The
default keepalive (15 s) is below the UDP timeouts of common NATs (30 s and more; Linux: 30 s /
120 s).

Callers sit behind another symmetric NAT, so no hole punch gives them a way around the relay.
"""

from __future__ import annotations

import time

import pytest

from .lab import Lab
from .test_matrix import Proc

IDLE = 20.0  # seconds without calls, far past the router's 3 s UDP timeout


pytestmark = pytest.mark.usefixtures("need_lab")  # (tests/natlab/conftest.py)


@pytest.fixture(scope="module")
def lab():
    with Lab(prefix="nli") as lab:
        lab.relay = Proc(lab, lab.public_host("relay"), ["--relay", "--membership", "off"])
        yield lab


def _caller(lab: Lab, relay: Proc | None = None) -> Proc:
    """A node behind another symmetric NAT: between two symmetric NATs no hole can be punched,
    so whatever the two nodes say to each other goes through the relay."""
    relay = relay or lab.relay
    return Proc(
        lab,
        lab.add_site("symmetric").host,
        ["--bootstrap", relay.addrs[0], "--no-dht-bootstrap", "--membership", "off"],
    )


def _in_stream_relay(lab: Lab) -> Proc:
    """A second relay that carries circuits inside its connections (never on spliced sockets)."""
    if getattr(lab, "relay2", None) is None:
        lab.relay2 = Proc(lab, lab.public_host("relaytwo"), ["--relay", "--relay-in-stream", "--membership", "off"])
    return lab.relay2


def _private(lab: Lab, keepalive: float, relay: Proc | None = None) -> tuple[Proc, object]:
    relay = relay or lab.relay
    site = lab.add_site("symmetric", udp_timeout=3)
    quic_relay = next(a for a in relay.addrs if "/quic" in a)
    # membership off everywhere here: its heartbeats (every 0.5 s) would hold the mapping,
    # whatever the keepalives do
    node = Proc(
        lab,
        site.host,
        [
            "--quic-only",
            "--keepalive",
            str(keepalive),
            "--bootstrap",
            quic_relay,
            "--no-dht-bootstrap",
            "--membership",
            "off",
        ],
    )
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        st = node.ask({"cmd": "status"})
        if st["relays"]:
            return node, site
        time.sleep(0.5)
    raise AssertionError(f"node never took a reservation: {st}")


def _mapped_ports(lab: Lab, site, relay_ip: str) -> list[int]:
    """Public ports of the router's live UDP mappings from the node's listening socket (where
    its QUIC connections leave from) to the relay's."""
    table = lab.run(site.router, ["cat", "/proc/net/nf_conntrack"]).stdout
    ports = []
    for line in table.splitlines():
        f = line.split()
        sport = next((x for x in f if x.startswith("sport=")), None)
        if "udp" in f and f"src={site.host.ip}" in f and f"dst={relay_ip}" in f and sport == "sport=4001":
            ports.append(int([x for x in f if x.startswith("dport=")][-1][6:]))  # the reply's
    return ports


def _watch(lab: Lab, site, relay_ip: str) -> list[list[int]]:
    """The node's mappings to the relay, read twice a second for ``IDLE`` seconds."""
    seen = []
    end = time.monotonic() + IDLE
    while time.monotonic() < end:
        time.sleep(0.5)
        seen.append(_mapped_ports(lab, site, relay_ip))
    return seen


def _quiet(*nodes: Proc) -> None:
    """Wait until no hole punch is running (its messages would refresh the mapping)."""
    deadline = time.monotonic() + 60
    while any(n.ask({"cmd": "holepunch"})["active"] for n in nodes):
        assert time.monotonic() < deadline, "hole punching never ended"
        time.sleep(0.5)


def test_keepalives_hold_the_mapping_through_idle_time(lab):
    node, site = _private(lab, keepalive=1.0)
    relay_ip = lab.relay.ready["addrs"][0].split("/")[2]
    relays = node.ask({"cmd": "status"})["relays"]
    caller = _caller(lab)
    _quiet(node, caller)
    before = _mapped_ports(lab, site, relay_ip)
    assert before and all(ports == before for ports in _watch(lab, site, relay_ip))  # the same mapping, kept alive
    assert node.ask({"cmd": "status"})["relays"] == relays  # same reservation, never lost
    t0 = time.monotonic()
    r = caller.ask({"cmd": "call", "peer": node.peer_id, "timeout": 20}, timeout=30)
    assert r.get("ok"), r
    assert r["path"] == "relay" and time.monotonic() - t0 < 5  # in through the relay, at once


def test_without_keepalives_the_mapping_expires_while_idle(lab):
    node, site = _private(lab, keepalive=30.0)
    relay_ip = lab.relay.ready["addrs"][0].split("/")[2]
    before = _mapped_ports(lab, site, relay_ip)
    seen = _watch(lab, site, relay_ip)
    assert before and any(before[0] not in ports for ports in seen), (before, seen)  # that mapping expired


@pytest.mark.parametrize("circuits", ["spliced", "in-stream"])
def test_an_expired_mapping_is_recovered_and_nothing_leaks(lab, circuits):
    """The mapping expires anyway: the node's next packets leave through a new public port, its
    QUIC connection to the relay migrates there, and a stranger's call gets in again; the relay
    holds no extra reservation. A spliced circuit (its own TCP sockets through the relay, even for
    a node that reached the relay over QUIC) does not depend on the UDP mapping at all; an
    in-stream one rides the migrating QUIC connection."""
    relay = lab.relay if circuits == "spliced" else _in_stream_relay(lab)
    node, site = _private(lab, keepalive=1.0, relay=relay)
    relay_ip = relay.ready["addrs"][0].split("/")[2]
    caller = _caller(lab, relay)
    _quiet(node, caller)
    r = caller.ask({"cmd": "call", "peer": node.peer_id, "timeout": 20}, timeout=30)
    assert r.get("ok"), r
    before = _mapped_ports(lab, site, relay_ip)
    reservations = relay.ask({"cmd": "status"})["relay"]["reservations"]
    # dropped before connection tracking sees them (raw priority), neither the node's packets
    # nor the relay's refresh the mapping
    lab.nft(
        site.router,
        f"""
table inet blackout {{
    chain pre {{
        type filter hook prerouting priority raw; policy accept;
        ip saddr {site.host.ip} meta l4proto udp drop
        ip saddr {relay_ip} meta l4proto udp drop
    }}
}}""",
    )
    time.sleep(6.0)  # twice the router's UDP timeout: the mapping is gone
    assert _mapped_ports(lab, site, relay_ip) == []
    lab.run(site.router, ["nft", "delete", "table", "inet", "blackout"])
    t0 = time.monotonic()
    r = {}
    while time.monotonic() - t0 < 60:
        r = caller.ask({"cmd": "call", "peer": node.peer_id, "timeout": 10}, timeout=20)
        if r.get("ok"):
            break
        time.sleep(0.5)
    recovered = time.monotonic() - t0
    assert r.get("ok"), r
    # the call may have come in on a spliced circuit (its own TCP sockets through the relay, which
    # the UDP blackout did not touch); the QUIC connection to the relay makes a new mapping with
    # its next packet (a keepalive within 1 s)
    deadline = time.monotonic() + 5
    while not (after := _mapped_ports(lab, site, relay_ip)) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert after and after != before  # a new mapping: the old one really expired
    assert node.ask({"cmd": "status"})["relays"]  # holding a reservation again
    assert relay.ask({"cmd": "status"})["relay"]["reservations"] == reservations  # renewed, not added
    print(
        f"\nidle NAT ({circuits} circuits): expired mapping recovered, a stranger's call in again after {recovered:.1f} s"
    )


def test_a_lost_tcp_mapping_is_recovered_by_a_new_connection(lab):
    """The same for a node that listens on TCP only (it may still have dialed the relay over
    QUIC too): the router forgets all its mappings (3 s timeouts for TCP and UDP, everything
    between the node and the relay dropped for 6 s). A QUIC connection migrates; a TCP one's
    next keepalive leaves through a new port, the relay resets it (no such connection there),
    and the node dials the relay again (over whatever wins the race). The relay, dialed again by a peer it holds a
    connection to, probes the old one and aborts it; the circuit the caller had into the node
    dies when the relay's socket towards the node gives up (TCP_USER_TIMEOUT); the caller's next
    call makes a new circuit. The relay holds no extra reservation."""
    site = lab.add_site("symmetric", udp_timeout=3)
    relay_ip = lab.relay.ready["addrs"][0].split("/")[2]
    tcp_relay = next(a for a in lab.relay.addrs if "/tcp/" in a)
    node = Proc(
        lab,
        site.host,
        ["--tcp-only", "--keepalive", "5", "--bootstrap", tcp_relay, "--no-dht-bootstrap", "--membership", "off"],
    )
    deadline = time.monotonic() + 30
    while not node.ask({"cmd": "status"})["relays"]:
        assert time.monotonic() < deadline, "node never took a reservation"
        time.sleep(0.5)
    caller = _caller(lab)
    _quiet(node, caller)
    r = caller.ask({"cmd": "call", "peer": node.peer_id, "timeout": 20}, timeout=30)
    assert r.get("ok"), r
    reservations = lab.relay.ask({"cmd": "status"})["relay"]["reservations"]
    # from now on the router forgets an established TCP mapping after 3 s without packets; a
    # call refreshes the node's mappings under that timeout, then both directions are dropped
    lab.run(site.router, ["sysctl", "-qw", "net.netfilter.nf_conntrack_tcp_timeout_established=3"])
    r = caller.ask({"cmd": "call", "peer": node.peer_id, "timeout": 20}, timeout=30)
    assert r.get("ok"), r
    lab.nft(
        site.router,
        f"""
table inet blackout {{
    chain pre {{
        type filter hook prerouting priority raw; policy accept;
        ip saddr {site.host.ip} drop
        ip saddr {relay_ip} drop
    }}
}}""",
    )
    time.sleep(6.0)
    lab.run(site.router, ["nft", "delete", "table", "inet", "blackout"])
    t0 = time.monotonic()
    r = {}
    while time.monotonic() - t0 < 60:
        r = caller.ask({"cmd": "call", "peer": node.peer_id, "timeout": 10}, timeout=20)
        if r.get("ok"):
            break
        time.sleep(0.5)
    recovered = time.monotonic() - t0
    assert r.get("ok"), r
    assert node.ask({"cmd": "status"})["relays"]
    assert lab.relay.ask({"cmd": "status"})["relay"]["reservations"] == reservations
    print(f"\nidle NAT, TCP only: lost mapping recovered, a stranger's call in again after {recovered:.1f} s")
