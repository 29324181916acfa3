"""Hole punching between two NATed nodes: they meet through a relay, the side that received the
relayed connection punches, and calls end on the direct path. Nodes only talk to the relays (no
DHT walks), so a pair's first contact is usually the call itself (then its path starts "relay").

Cases: two port-restricted cones (TCP simultaneous open or QUIC), a NAT that remaps ports
(mappings are still endpoint-independent, but not at the listening port), and one symmetric side
against port- and address-filtering peers (many-port probing).
"""

from __future__ import annotations

import time

import pytest

from .lab import Lab, TwoRelays
from .test_matrix import Proc

CASES = [
    # (caller kind, callee kind, how the hole is punched)
    ("port_restricted", "port_restricted", "simultaneous"),
    ("port_remap", "address_restricted", "simultaneous"),
    ("port_restricted", "symmetric", "birthday"),
    ("symmetric", "firewall", "birthday"),
]


pytestmark = pytest.mark.usefixtures("need_lab")  # (tests/natlab/conftest.py)


@pytest.fixture(scope="module")
def lab():
    with Lab(prefix="nlh") as lab:
        # two relays: a node learns its mapping type from two observers at different IPs
        lab.boot = TwoRelays(lab).start().boot
        yield lab


def _node(lab: Lab, kind: str) -> Proc:
    return Proc(lab, lab.add_site(kind).host, lab.boot + ["--no-dht-bootstrap"])


def _wait_private(node: Proc, mapping: bool = True) -> dict:
    """The node's status once it knows it is private and holds reservations (and, if
    ``mapping``, its mapping type: a TCP-only node never learns it, QUIC dials show it)."""
    deadline = time.monotonic() + 40
    while time.monotonic() < deadline:
        st = node.ask({"cmd": "status"})
        if st["reachability"] == "private" and st["relays"] and (st["mapping"] != "unknown" or not mapping):
            return st
        time.sleep(0.5)
    raise AssertionError(f"node never settled: {st}")


def _punches_settled(node: Proc) -> dict:
    """The node's hole-punch status once no punch is under way (at most 10 s): the caller may
    see the direct path a moment before the callee's punch records it."""
    deadline = time.monotonic() + 10
    while (punches := node.ask({"cmd": "holepunch"}))["active"] and time.monotonic() < deadline:
        time.sleep(0.2)
    return punches


@pytest.mark.parametrize("transport", ["tcp", "any"])
def test_dcutr_makes_the_relayed_connection_direct(lab, transport):
    """Both nodes punch with libp2p's DCUtR only (as libp2p nodes do): the same roles and timing
    over /libp2p/dcutr, and the punched TCP connection (a simultaneous open, in libp2p's roles)
    or QUIC's runs libp2p's stack."""
    args = lab.boot + ["--no-dht-bootstrap", "--dcutr-only"] + (["--tcp-only"] if transport == "tcp" else [])
    callee = Proc(lab, lab.add_site("port_restricted").host, args)
    _wait_private(callee, mapping=False)  # (DCUtR exchanges no mapping type)
    caller = Proc(lab, lab.add_site("port_restricted").host, args)
    _wait_private(caller, mapping=False)
    r = caller.ask({"cmd": "call", "peer": callee.peer_id, "timeout": 30, "settle": 15}, timeout=60)
    punches = _punches_settled(callee)
    print(f"\nDCUtR over {transport}, port_restricted -> port_restricted: {r}; punches: {punches}")
    assert r["ok"] and r["path"] in (("tcp",) if transport == "tcp" else ("tcp", "quic")), r
    done = [p for p in punches["recent"] if p["peer"] == caller.peer_id and p["outcome"] == "direct"]
    assert done and done[-1]["mode"] == "simultaneous", punches


@pytest.mark.parametrize("caller_kind,callee_kind,mode", CASES, ids=[f"{a}->{b}" for a, b, _ in CASES])
def test_relayed_connection_becomes_direct(lab, caller_kind, callee_kind, mode):
    # the callee settles first: once it publishes circuit addresses the relay drops it from its
    # DHT table, so the caller's own lookups while it starts do not meet it before the call
    callee = _node(lab, callee_kind)
    st_callee = _wait_private(callee)
    caller = _node(lab, caller_kind)
    st_caller = _wait_private(caller)
    r = caller.ask({"cmd": "call", "peer": callee.peer_id, "timeout": 30, "settle": 15}, timeout=60)
    punches = _punches_settled(callee)
    print(
        f"\n{caller_kind} ({st_caller['mapping']}) -> {callee_kind} ({st_callee['mapping']}): {r}; punches: {punches}"
    )
    assert r["ok"], r
    assert r["path"] in ("tcp", "quic"), r
    # Both sides are private: the only way to a direct path is a punch, which the callee records
    # (it may have happened just before the call: DHT upkeep can make nodes meet through the relay).
    done = [p for p in punches["recent"] if p["peer"] == caller.peer_id and p["outcome"] == "direct"]
    assert done and done[-1]["mode"] == mode, punches
