"""NAT lab: the time from a fresh SDK process behind a NAT to a direct path with our node, against
the same with another SDK node in its place, measured in the same run (docs/benchmarks.md, "NAT
lab: a fresh SDK process to a direct path, with our node and with another SDK node").

Positions as in tests/interop/test_sdk_nat.py: our two relay nodes (``TwoRelays``); the SDK node
``A`` (GradientHQ Lattica SDK 1.0.21, rust-libp2p 0.54, driven by
lattica/bench/_peers/sdk_nat_peer.py) behind a port-restricted NAT reserving a slot on the first
relay; the peer ``B`` behind another port-restricted NAT. Two cases, interleaved round by round
(each round on fresh sites and fresh processes, the case that goes first alternating):

* ``SDK -> ours``: ``B`` is our node (tests/natlab/peer.py), started first and settled (private,
  holding its reservations on both relays).
* ``SDK -> SDK``: ``B`` is a second SDK process, reserving a slot on the second relay, started first
  (its ``ready`` line: the reservation shows).

Then a fresh SDK process ``A`` starts with ``B``'s circuit address through the second relay as its
Kademlia bootstrap (the only way the SDK dials an address at build, see test_sdk_nat.py), so it
reaches ``B`` through the relay and DCUtR runs over that relayed connection. ``t0`` is taken just
before ``A``'s process is spawned; the times come from ``A``'s own log (the SDK's tracing, UTC
timestamps to the microsecond, the same clock as ``t0``): the same observer in both cases, and no
polling that would perturb either node or round the figures up. Per round: ``swarm`` (its first
log line: interpreter, the SDK's import and its swarm up), ``reserved`` (its reservation on
the first relay: a ``/p2p-circuit`` listen address), ``relayed`` (the connection to ``B``
through the relay established), ``punch`` (rust-libp2p's "Attempting to hole-punch": ``B``'s DCUtR CONNECT arrived), ``direct``
(a connection to ``B`` on a non-relayed address established) and ``ready`` (its ``ready`` line
read here: the driver saw the reservation, polling every 0.1 s; the start of the process as a
baseline).

Asserted: behaviour only, never times. In every round ``A`` ends on a direct connection to ``B``
with rust-libp2p's DCUtR reporting success, and ``B`` sees ``A`` directly too (our node: a TCP or
QUIC connection and its hole punch recorded as "direct"; an SDK ``B``: a non-relayed address of
``A`` among its connections). Two rounds of each case by default (about 30 s), five with
``--slow`` (about 65 s).
"""

from __future__ import annotations

import datetime
import re
import statistics
import time

import pytest
from natlab.lab import Lab, TwoRelays

from .test_sdk_nat import SdkProc, _our_node, _settled, _stop, need_lab  # noqa: F401 -- need_lab: a fixture

pytestmark = pytest.mark.usefixtures("need_lab")

CONNECTED = re.compile(r"Connection established with peer: (\S+), via: (\S+),")
PHASES = ("swarm", "reserved", "relayed", "punch", "direct", "ready")


@pytest.fixture(scope="module")
def benchlab():
    with Lab(prefix="nlsb") as lab:
        lab.relays = TwoRelays(lab).start()
        yield lab


def _stamp(line: str) -> float:
    """The epoch seconds of a line of the SDK's tracing (``2026-01-01T12:00:00.123456Z ...``)."""
    when = datetime.datetime.strptime(line.split()[0], "%Y-%m-%dT%H:%M:%S.%fZ")
    return when.replace(tzinfo=datetime.UTC).timestamp()


def _phases(sdk: SdkProc, peer: str, t0: float) -> dict[str, float]:
    """Seconds from ``t0`` to each phase in the SDK's log (those it reached), towards ``peer``."""
    got: dict[str, float] = {}
    lines = sdk.log().splitlines()
    if lines:
        got["swarm"] = _stamp(lines[0]) - t0
    for line in lines:
        m = CONNECTED.search(line)
        if m and m.group(1) == peer:
            got.setdefault("relayed" if "/p2p-circuit" in m.group(2) else "direct", _stamp(line) - t0)
        elif "Listening on: " in line and "/p2p-circuit" in line:
            got.setdefault("reserved", _stamp(line) - t0)
        elif "Attempting to hole-punch" in line and f"target={peer}" in line:
            got.setdefault("punch", _stamp(line) - t0)
        elif f'Dcutr event: Event {{ remote_peer_id: PeerId("{peer}"), result: Ok(' in line:
            got.setdefault("dcutr_ok", _stamp(line) - t0)
    return got


def _until_direct(sdk: SdkProc, peer: str, t0: float, within: float = 20) -> dict[str, float]:
    """``sdk``'s phases once its log shows a direct connection to ``peer`` and DCUtR's success
    (or ``within`` s passed)."""
    deadline = time.monotonic() + within
    while True:
        got = _phases(sdk, peer, t0)
        if ("direct" in got and "dcutr_ok" in got) or time.monotonic() > deadline:
            return got
        time.sleep(0.2)


def _fresh_sdk(lab: Lab, sdk_python, b_circuit: str) -> tuple[SdkProc, float, float]:
    """A fresh SDK process ``A`` on a fresh port-restricted site, bootstrapping from ``b_circuit``:
    it, ``t0`` (just before the spawn) and the seconds to its ``ready`` line."""
    host = lab.add_site("port_restricted").host
    t0 = time.time()
    sdk = SdkProc(lab, host, sdk_python, lab.relays.addrs[0], [b_circuit])
    return sdk, t0, time.time() - t0


def _with_ours(lab: Lab, sdk_python) -> dict:
    """SDK -> ours: our node settles on its site, then a fresh SDK dials it through relay two."""
    ours, st = _our_node(lab)
    sdk = None
    try:
        two = lab.relays.procs[1].peer_id
        circuit = [f"{a}/p2p/{ours.peer_id}" for a in st["relays"] if f"/tcp/4001/p2p/{two}/" in a]
        assert circuit, st
        sdk, t0, ready = _fresh_sdk(lab, sdk_python, circuit[0])
        got = {**_until_direct(sdk, ours.peer_id, t0), "ready": ready}
        conns, punches = _settled(ours, sdk)
        mine = [p for p in punches["recent"] if p["peer"] == sdk.peer_id]
        got["b_direct"] = bool(set(conns) & {"tcp", "quic"} and mine and mine[-1]["outcome"] == "direct")
        got["evidence"] = f"our connections {conns}, our punches {mine}\n{sdk.log(('dcutr', 'Dcutr', 'Connection'))}"
        return got
    finally:
        if sdk is not None:
            sdk.close()
        _stop(ours)


def _with_sdk(lab: Lab, sdk_python) -> dict:
    """SDK -> SDK: an SDK node ``B`` reserves on relay two, then a fresh SDK dials it there."""
    b = SdkProc(lab, lab.add_site("port_restricted").host, sdk_python, lab.relays.addrs[1])
    sdk = None
    try:
        assert b.ready["circuit"], f"B took no reservation: {b.ready}\n{b.log(last=20)}"
        sdk, t0, ready = _fresh_sdk(lab, sdk_python, b.ready["circuit"][0])
        got = {**_until_direct(sdk, b.peer_id, t0), "ready": ready}
        seen = b.ask({"cmd": "status", "peer": sdk.peer_id})
        got["b_direct"] = any("/p2p-circuit" not in a for a in seen["addresses"])
        got["evidence"] = (
            f"B's view of A {seen}\nA: {sdk.log(('dcutr', 'Dcutr', 'Connection'))}\nB: {b.log(('dcutr', 'Dcutr', 'Connection'))}"
        )
        return got
    finally:
        if sdk is not None:
            sdk.close()
        b.close()


CASES = {"SDK -> ours": _with_ours, "SDK -> SDK": _with_sdk}


def _s(x: float | None) -> str:
    return "-" if x is None else f"{x:.3f}"


def _gap(got: dict) -> float | None:
    """From the relayed connection to the direct one: what ``B`` and the punch take."""
    return got["direct"] - got["relayed"] if "direct" in got and "relayed" in got else None


def _row(case: str, n: int, got: dict) -> str:
    return f"{case:<13}{n:>3}" + "".join(f"{_s(got.get(k)):>9}" for k in PHASES) + f"{_s(_gap(got)):>16}"


@pytest.mark.timeout(600)
def test_a_fresh_sdk_process_goes_direct_with_ours_as_with_another_sdk(benchlab, sdk_python, request):
    rounds = 5 if request.config.getoption("--slow") else 2
    results: dict[str, list[dict]] = {case: [] for case in CASES}
    header = f"{'case':<13}{'n':>3}" + "".join(f"{k:>9}" for k in PHASES) + f"{'relayed->direct':>16}"
    print("\n" + header, flush=True)
    for n in range(1, rounds + 1):
        order = list(CASES) if n % 2 else list(CASES)[::-1]  # (interleaved: drift hits both)
        for case in order:
            got = CASES[case](benchlab, sdk_python)
            results[case].append(got)
            print(_row(case, n, got), flush=True)
    lines = [header] + [_row(case, n, got) for case, runs in results.items() for n, got in enumerate(runs, 1)]
    for case, runs in results.items():
        for k in (*PHASES, "relayed->direct"):
            xs = sorted(x for r in runs if (x := _gap(r) if k == "relayed->direct" else r.get(k)) is not None)
            if xs:
                lines.append(
                    f"{case:<13}{k:<16} median {statistics.median(xs):.3f} s, max {xs[-1]:.3f} s ({len(xs)} rounds)"
                )
    lines.append("(seconds from A's spawn, from A's log; ready: its ready line, read here)")
    print("\n" + "\n".join(lines))
    for case, runs in results.items():
        for n, got in enumerate(runs, 1):
            ok = "direct" in got and "dcutr_ok" in got and "relayed" in got and got["b_direct"]
            assert ok, f"{case}, round {n}: {got}"
