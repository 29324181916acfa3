"""NAT mappings that expire while a connection is idle.

A private node's only way in is its connection to its relay; behind a NAT that connection lives
only as long as the router's mapping, which for UDP (QUIC) lasts as long as the router's UDP
timeout after the last packet out. Here a symmetric NAT forgets UDP mappings after 3 s of silence
and the private node speaks QUIC only:

* with keepalives more frequent than that (1 s), the mapping survives a long idle time and a
  stranger's call reaches the node through its relay at once;
* with keepalives rarer than that (30 s) the mapping expires, the relay can no longer reach the
  node, and a call fails with a reason within its timeout (no hang, no crash) — the control
  showing the lab really expires mappings. Callers sit behind another symmetric NAT, so no hole
  punch can give them a way around the relay. The default keepalive (15 s) is below the UDP
  timeouts of common NATs (30 s and more; Linux: 30 s / 120 s).
"""

from __future__ import annotations

import time

import pytest

from .lab import Lab
from .test_matrix import Proc

IDLE = 8.0  # seconds of silence, well past the router's 3 s UDP timeout


@pytest.fixture(scope="module", autouse=True)
def need_lab():
    ok, why = Lab.available()
    if not ok:
        pytest.skip(why)  # needs root, ip netns and nft: CI has them (.ci/run installs them)


@pytest.fixture(scope="module")
def lab():
    with Lab(prefix="nli") as lab:
        lab.relay = Proc(lab, lab.public_host("relay"), ["--relay"])
        yield lab


def _caller(lab: Lab) -> Proc:
    """A node behind another symmetric NAT: between two symmetric NATs no hole can be punched,
    so whatever the two nodes say to each other goes through the relay."""
    return Proc(lab, lab.add_site("symmetric").host, ["--bootstrap", lab.relay.addrs[0], "--no-dht-bootstrap"])


def _private(lab: Lab, keepalive: float) -> Proc:
    site = lab.add_site("symmetric", udp_timeout=3)
    quic_relay = next(a for a in lab.relay.addrs if "/quic" in a)
    node = Proc(lab, site.host, ["--quic-only", "--keepalive", str(keepalive), "--bootstrap", quic_relay, "--no-dht-bootstrap"])
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        st = node.ask({"cmd": "status"})
        if st["relays"]:
            return node
        time.sleep(0.5)
    raise AssertionError(f"node never took a reservation: {st}")


def _quiet(*nodes: Proc) -> None:
    """Wait until no hole punch is running (its messages would refresh the mapping)."""
    deadline = time.monotonic() + 60
    while any(n.ask({"cmd": "holepunch"})["active"] for n in nodes):
        assert time.monotonic() < deadline, "hole punching never ended"
        time.sleep(0.5)


def test_keepalives_hold_the_mapping_through_idle_time(lab):
    node = _private(lab, keepalive=1.0)
    relays = node.ask({"cmd": "status"})["relays"]
    caller = _caller(lab)
    _quiet(node, caller)
    time.sleep(IDLE)
    assert node.ask({"cmd": "status"})["relays"] == relays  # same reservation, never lost
    t0 = time.monotonic()
    r = caller.ask({"cmd": "call", "peer": node.peer_id, "timeout": 20}, timeout=30)
    assert r.get("ok"), r
    assert r["path"] == "relay" and time.monotonic() - t0 < 5  # in through the relay, at once
