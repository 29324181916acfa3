"""Our node behind a NAT reserves on a go-libp2p relay (p2pd 0.32's circuit relay v2 service, on a
public host of the NAT lab) and is reached through it (issue 50). NAT lab (tests/natlab/lab.py:
namespaces and nftables, root): our two relays answer AutoNAT (the node learns it is private),
the go relay is one it is told to reserve on; a node of ours on another host dials the circuit
address through go's relay, pings across it (go limits a circuit to 2 min and 128 KiB: enough to
coordinate), and the two end on a direct path (the NATed node received the relayed connection,
so it starts the hole punch)."""

from __future__ import annotations

import asyncio
import pathlib
import tempfile
import time

import pytest
from natlab.lab import Lab, TwoRelays
from natlab.test_matrix import Proc

from lattica.bench._peers.p2pd import Daemon

pytestmark = pytest.mark.timeout(180)


@pytest.fixture(scope="module")
def need_lab() -> None:
    ok, why = Lab.available()  # (as tests/natlab/conftest.py's need_lab: root, ip netns, nft)
    if not ok:
        pytest.skip(why)


@pytest.fixture(scope="module")
def lab(need_lab):
    with Lab(prefix="ngr") as lab:
        lab.relays = TwoRelays(lab)
        lab.go_host = lab.public_host("gorelay")
        lab.relays.start()
        yield lab


def test_ours_behind_a_nat_is_reached_through_a_go_relay(lab, p2pd_binary) -> None:
    host = lab.go_host
    with tempfile.TemporaryDirectory(prefix="p2pd-lab-") as tmp:
        go = Daemon(
            p2pd_binary,
            pathlib.Path(tmp),
            listen=(f"/ip4/{host.ip}/tcp/4001",),
            popen=lambda argv, **kw: lab.popen(host, argv, **kw),
        )
        try:
            go_peer, go_addrs = asyncio.run(go.identify())
            relay = f"/ip4/{host.ip}/tcp/4001/p2p/{go_peer}"
            natted = Proc(
                lab,
                lab.add_site("port_restricted").host,
                [*lab.relays.boot, "--no-dht-bootstrap", "--reserve", relay],
            )
            deadline = time.monotonic() + 60
            st: dict = {}
            while time.monotonic() < deadline:
                st = natted.ask({"cmd": "status"})
                if st["reachability"] == "private" and relay + "/p2p-circuit" in st["relays"]:
                    break
                time.sleep(0.3)
            # (it may hold reservations on our relays too: it is connected to them)
            assert st.get("reachability") == "private" and relay + "/p2p-circuit" in st.get("relays", ()), st

            circuit = f"{relay}/p2p-circuit/p2p/{natted.peer_id}"
            caller = Proc(lab, lab.public_host("caller"), [])
            assert caller.ask({"cmd": "connect", "addr": circuit, "timeout": 20}) == {"ok": True}
            assert caller.ask({"cmd": "ping", "peer": natted.peer_id})["ok"]
            # the relayed connection goes direct (the NATed side punches: it received it)
            deadline = time.monotonic() + 30
            conns: list = []
            while time.monotonic() < deadline:
                conns = caller.ask({"cmd": "status"})["conns"].get(natted.peer_id, [])
                if set(conns) & {"tcp", "quic"}:
                    break
                time.sleep(0.3)
            assert set(conns) & {"tcp", "quic"}, conns
            assert caller.ask({"cmd": "call", "peer": natted.peer_id}).get("ok"), "no call over the direct path"
        finally:
            go.stop()
