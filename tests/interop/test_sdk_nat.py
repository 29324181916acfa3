"""The Lattica SDK (GradientHQ, 1.0.21: rust-libp2p 0.54) behind a port-restricted NAT and our
node behind another meet through our circuit relay v2 and end on a direct path with DCUtR
(``/libp2p/dcutr``), in both role assignments. NAT lab (tests/natlab/lab.py: namespaces and
nftables, root): two of our relay nodes (``TwoRelays``), each node on its own port-restricted
site; the SDK runs lattica/bench/_peers/sdk_nat_peer.py with the SDK venv's interpreter, from a
temporary folder (its key and storage land there), reserving a slot on the first relay at build.

* We dial the SDK: our node dials the SDK's ``/p2p-circuit`` address through the first relay; the
  SDK received the relayed connection, so rust-libp2p starts DCUtR (its log: "Attempting to
  hole-punch as listener") and our node answers (``_on_dcutr``). Our node starts only once the
  SDK's Kademlia lookups at start (to the relays, ``/lattica/1.0.0``) are over: our relays' tables
  keep a private node of ours (actors/dht/libp2p.py keeps a peer unless all its listen addresses
  are circuits), so a lookup answered while our node is up hands the SDK its circuit addresses
  and the SDK dials it through a relay first, which swaps the roles (seen in about one run in
  four before the wait).
* The SDK dials us: the SDK has no call that dials an address once built (``connect`` takes a
  PeerId and only dials addresses its swarm already knows), so it gets our node's circuit
  address through the second relay, ``.../p2p/<relay two>/p2p-circuit/p2p/<our id>``, as its
  Kademlia bootstrap: Kademlia's bootstrap query dials it at build, through the relay (never the
  SDK's own relay as a bootstrap: that dial races the relay client's and drops the reservation).
  We received the relayed connection, so we start DCUtR (``_exchange_dcutr``) and rust-libp2p
  answers ("Attempting to hole-punch as dialer").

Both private sides are behind port-restricted NATs: a direct connection between them only comes
from a punch. Each test checks our side (a direct TCP or QUIC connection to the SDK; the hole
punch status records the SDK with outcome "direct") and the SDK's (its address book holds a
direct address of our node; in the first test this also shows that its identify check,
protocolVersion ``/lattica/1.0.0``, kept our node: in the second our node is its bootstrap,
exempt from the check). rust-libp2p's DCUtR sends every address it has as a
candidate, the lab's "public" 198.51.100.x and the private 10.x ones alike (no global filter).
"""

from __future__ import annotations

import json
import os
import select
import shutil
import subprocess
import tempfile
import time

import pytest
from natlab.lab import Lab, TwoRelays
from natlab.test_matrix import Proc

from lattica.bench._peers import HERE

SDK_NAT_PEER = HERE / "sdk_nat_peer.py"
# (the SDK's tracing: its connections, DCUtR attempts and DCUtR outcomes, "Dcutr event")
RUST_LOG = "info,libp2p_dcutr=debug,libp2p_relay=debug,lattica::network::core=debug"
SDK_EVIDENCE = ("dcutr", "Dcutr", "Connection established with", "relay")


@pytest.fixture(scope="module")
def need_lab() -> None:
    ok, why = Lab.available()  # (as tests/natlab/conftest.py's need_lab: root, ip netns, nft)
    if not ok:
        pytest.skip(why)


pytestmark = pytest.mark.usefixtures("need_lab")


@pytest.fixture(scope="module")
def lab():
    with Lab(prefix="nls") as lab:
        lab.relays = TwoRelays(lab).start()
        yield lab


class SdkProc:
    """sdk_nat_peer.py in a lab namespace, run by the SDK venv's interpreter (never with our
    checkout on its path: its package is also named lattica) from a temporary folder, which also
    holds its log (the SDK's tracing)."""

    def __init__(self, lab: Lab, host, sdk_python, relay: str, bootstraps: list[str] = ()) -> None:
        self.home = tempfile.mkdtemp(prefix="sdk-nat-")
        self.log_path = os.path.join(self.home, "sdk.log")
        env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}
        env.update(RUST_LOG=RUST_LOG, NO_COLOR="1")
        argv = [str(sdk_python), "-u", str(SDK_NAT_PEER), "--ip", host.ip, "--relay", relay]
        for addr in bootstraps:
            argv += ["--bootstrap", addr]
        with open(self.log_path, "w") as log:
            self.p = lab.popen(
                host, argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log, text=True, cwd=self.home, env=env
            )
        self.peer_id = ""
        try:
            self.ready = self.read(30)
        except BaseException:
            self.close()
            raise
        self.peer_id = self.ready["peer_id"]

    def read(self, timeout: float) -> dict:
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([self.p.stdout], [], [], left)[0]:
                raise TimeoutError(f"the SDK node did not answer; its log ends:\n{self.log(last=40)}")
            line = self.p.stdout.readline()
            if not line:
                raise EOFError(f"the SDK node exited ({self.p.poll()}); its log ends:\n{self.log(last=40)}")
            if line.startswith("{"):
                return json.loads(line)

    def ask(self, cmd: dict, timeout: float = 20) -> dict:
        self.p.stdin.write(json.dumps(cmd) + "\n")
        self.p.stdin.flush()
        return self.read(timeout)

    def log(self, grep: tuple[str, ...] = (), last: int | None = None) -> str:
        """The SDK's log lines holding one of ``grep`` (all without), the ``last`` ones only."""
        with open(self.log_path, errors="replace") as f:
            lines = [ln.rstrip() for ln in f if not grep or any(g in ln for g in grep)]
        return "\n".join(lines[-last:] if last else lines)

    def close(self) -> None:
        try:
            self.p.stdin.write('{"cmd": "quit"}\n')
            self.p.stdin.flush()
            self.p.wait(5)
        except (OSError, subprocess.TimeoutExpired):
            self.p.kill()
        logs = os.environ.get("LATTICA_LAB_LOGS")  # (a directory: the nodes' logs are kept there)
        if logs:
            shutil.copy(self.log_path, os.path.join(logs, f"sdk-{self.peer_id[-8:] or os.getpid()}.log"))
        shutil.rmtree(self.home, ignore_errors=True)


def _our_node(lab: Lab) -> tuple[Proc, dict]:
    """Our node on a port-restricted site, talking to the relays only, once it knows it is
    private and holds its reservations (it learnt its observed addresses by then); its status."""
    node = Proc(lab, lab.add_site("port_restricted").host, lab.relays.boot + ["--no-dht-bootstrap"])
    deadline = time.monotonic() + 40
    while time.monotonic() < deadline:
        st = node.ask({"cmd": "status"})
        if st["reachability"] == "private" and st["relays"]:
            return node, st
        time.sleep(0.3)
    raise AssertionError(f"our node never settled: {st}")


def _sdk_node(lab: Lab, sdk_python, bootstraps: list[str] = ()) -> SdkProc:
    """The SDK on a port-restricted site, once its reservation on the first relay shows."""
    sdk = SdkProc(lab, lab.add_site("port_restricted").host, sdk_python, lab.relays.addrs[0], bootstraps)
    assert sdk.ready["circuit"], f"the SDK took no reservation: {sdk.ready}\n{sdk.log(SDK_EVIDENCE)}"
    return sdk


def _lookups_over(sdk: SdkProc, two: str, quiet: float = 1.5, within: float = 15) -> None:
    """Wait until the SDK's Kademlia has met the second relay (through the first one's DHT) and
    logged nothing for ``quiet`` s: its lookups at start are over. A node of ours already up
    then would be in their answers (our relays' Kademlia tables keep a private node that lists
    direct addresses next to its circuits) and the SDK would dial it, through a relay."""
    deadline = time.monotonic() + within
    last, since = -1, time.monotonic()
    while time.monotonic() < deadline:
        count = len(sdk.log(("kademlia event",)).splitlines())
        if count != last:
            last, since = count, time.monotonic()
        elif time.monotonic() - since >= quiet and two in sdk.ask({"cmd": "status"})["peers"]:
            return
        time.sleep(0.25)
    raise AssertionError(f"the SDK's Kademlia never went quiet (or never met {two}):\n{sdk.log(last=20)}")


def _settled(ours: Proc, sdk: SdkProc, within: float = 20) -> tuple[list[str], dict]:
    """Our connections to the SDK (their transports) and our hole punch status, once a direct
    one is up and the punch recorded (or ``within`` s passed)."""
    deadline = time.monotonic() + within
    while True:
        conns = ours.ask({"cmd": "status"})["conns"].get(sdk.peer_id, [])
        punches = ours.ask({"cmd": "holepunch"})
        done = [p for p in punches["recent"] if p["peer"] == sdk.peer_id]
        if (set(conns) & {"tcp", "quic"} and done and not punches["active"]) or time.monotonic() > deadline:
            return conns, punches
        time.sleep(0.3)


def _check_direct(ours: Proc, sdk: SdkProc) -> None:
    conns, punches = _settled(ours, sdk)
    seen = sdk.ask({"cmd": "status", "peer": ours.peer_id})
    evidence = f"our connections {conns}, our punches {punches}, the SDK's view {seen}\n{sdk.log(SDK_EVIDENCE)}"
    print(f"\nour connections to the SDK: {conns}; our punches: {punches['recent']}\nSDK: {seen}")
    print(sdk.log(("Attempting to hole-punch", "Dcutr event")))
    assert set(conns) & {"tcp", "quic"}, evidence
    mine = [p for p in punches["recent"] if p["peer"] == sdk.peer_id]
    assert mine and mine[-1]["outcome"] == "direct" and mine[-1]["path"] in ("tcp", "quic"), evidence
    assert ours.peer_id in seen["peers"], evidence
    assert any("/p2p-circuit" not in a for a in seen["addresses"]), evidence


def _stop(node: Proc) -> None:
    try:
        node.p.stdin.write('{"cmd": "quit"}\n')
        node.p.stdin.flush()
        node.p.wait(10)
    except (OSError, subprocess.TimeoutExpired):
        node.p.kill()


def test_we_dial_the_sdk_through_our_relay(lab, sdk_python):
    """Our node dials the SDK's circuit address: the SDK starts DCUtR, we answer."""
    sdk = _sdk_node(lab, sdk_python)
    ours = None
    try:
        _lookups_over(sdk, lab.relays.procs[1].peer_id)
        ours, _ = _our_node(lab)
        assert ours.ask({"cmd": "connect", "addr": sdk.ready["circuit"][0]}, timeout=30) == {"ok": True}
        _check_direct(ours, sdk)
        roles = sdk.log((f"target={ours.peer_id}",))
        assert "hole-punch as listener" in roles and "as dialer" not in roles, roles  # (the SDK initiated)
    finally:
        sdk.close()
        if ours is not None:
            _stop(ours)


def test_the_sdk_dials_us_through_our_relay(lab, sdk_python):
    """The SDK dials our circuit address (through the second relay, as its Kademlia bootstrap):
    we start DCUtR, the SDK answers."""
    ours, st = _our_node(lab)
    sdk = None
    try:
        two = lab.relays.procs[1].peer_id
        circuit = [f"{a}/p2p/{ours.peer_id}" for a in st["relays"] if f"/tcp/4001/p2p/{two}/" in a]
        assert circuit, st
        sdk = _sdk_node(lab, sdk_python, circuit[:1])
        _check_direct(ours, sdk)
        roles = sdk.log((f"target={ours.peer_id}",))
        assert "hole-punch as dialer" in roles and "as listener" not in roles, roles  # (we initiated)
    finally:
        if sdk is not None:
            sdk.close()
        _stop(ours)
