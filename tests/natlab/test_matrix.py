"""The connectivity matrix: real Lattica nodes behind every kind of NAT find and call each other.

Two public relay/bootstrap hosts and two sites of each kind, one node process per host
(``peer.py``). For every ordered pair of kinds the node of the first site of one kind calls, by
PeerId alone, an actor on the node of the second site of the other kind; the test records the
path the call ended on (direct TCP, direct QUIC or relayed) and prints the matrix. Every pair
must end direct except symmetric -> symmetric.
"""

from __future__ import annotations

import json
import os
import select
import sys
import time

import pytest

from .lab import Lab, TwoRelays

KINDS6 = ("public", "full_cone", "address_restricted", "port_restricted", "symmetric", "firewall")
PEER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "peer.py")
REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
SHORT = {
    "public": "pub",
    "full_cone": "full",
    "address_restricted": "addr",
    "port_restricted": "port",
    "symmetric": "sym",
    "firewall": "fw",
}


pytestmark = pytest.mark.usefixtures("need_lab")  # (tests/natlab/conftest.py)


class Proc:
    """A lab node process (``script``: peer.py unless given) that talks JSON lines; waits for its
    ``ready`` line unless ``ready_within`` is None."""

    def __init__(
        self,
        lab: Lab,
        host,
        args: list[str],
        *,
        script: str = PEER,
        ready_within: float | None = 30,
        log_name: str | None = None,
    ) -> None:
        env = dict(os.environ, PYTHONPATH=REPO + os.pathsep + os.environ.get("PYTHONPATH", ""))
        logs = os.environ.get("LATTICA_LAB_LOGS")  # a directory: each node's debug log goes there
        extra, err = [], None
        if logs:
            extra, err = ["--log", "DEBUG"], open(os.path.join(logs, f"{log_name or host.name}.log"), "w")
        self.p = lab.popen(
            host,
            [sys.executable, "-u", script, "--ip", host.ip, *extra, *args],
            stdin=-1,
            stdout=-1,
            stderr=err,
            text=True,
            env=env,
        )
        if ready_within is not None:
            self.ready = self.read(ready_within)
            assert self.ready.get("event") == "ready", self.ready
            self.peer_id = self.ready["peer_id"]
            self.addrs = self.ready.get("addrs", [])

    def read(self, timeout: float) -> dict:
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([self.p.stdout], [], [], left)[0]:
                raise TimeoutError("lab node did not answer")
            line = self.p.stdout.readline()
            if not line:
                raise EOFError(f"lab node exited ({self.p.poll()})")
            msg = json.loads(line)
            if msg.get("event") != "bootstrap-failed":
                return msg

    def ask(self, cmd: dict, timeout: float = 30) -> dict:
        self.p.stdin.write(json.dumps(cmd) + "\n")
        self.p.stdin.flush()
        return self.read(timeout)


def _settled(st: dict) -> bool:
    return st["reachability"] == "public" or (st["reachability"] == "private" and len(st["relays"]) >= 1)


@pytest.fixture(scope="module")
def mesh():
    with Lab(prefix="nlm") as lab:
        relays = TwoRelays(lab).start()
        sites = {(kind, i): lab.add_site(kind) for i in (0, 1) for kind in KINDS6}
        nodes = {}
        for key, site in sites.items():
            nodes[key] = Proc(lab, site.host, relays.boot)
        deadline = time.monotonic() + 60
        status = {}
        while time.monotonic() < deadline:
            status = {key: n.ask({"cmd": "status"}) for key, n in nodes.items()}
            if all(_settled(st) for st in status.values()):
                break
            time.sleep(1)
        yield lab, relays.procs, nodes, status
        for n in list(nodes.values()) + relays.procs:
            try:
                n.p.stdin.write('{"cmd": "quit"}\n')
                n.p.stdin.flush()
            except OSError:
                pass


EXPECTED_REACHABILITY = {
    "public": "public",
    "full_cone": "public",
    "address_restricted": "private",
    "port_restricted": "private",
    "symmetric": "private",
    "firewall": "private",
}


def test_autonat_classifies_every_kind(mesh):
    _, _, nodes, status = mesh
    lines = [f"{'site':<22}{'reachability':<14}{'mapping':<22}relays  reason"]
    for (kind, i), st in sorted(status.items()):
        lines.append(
            f"{kind + '#' + str(i):<22}{st['reachability']:<14}{st['mapping']:<22}{len(st['relays']):<8}{st['reason'][:70]}"
        )
    print("\n" + "\n".join(lines))
    for (kind, _), st in status.items():
        assert st["reachability"] == EXPECTED_REACHABILITY[kind], (kind, st)
        if st["reachability"] == "private":
            assert st["relays"], (kind, st)
    for kind in ("full_cone", "address_restricted", "port_restricted"):
        assert all(status[(kind, i)]["mapping"] in ("endpoint-independent", "unknown") for i in (0, 1))
    assert all(status[("symmetric", i)]["mapping"] in ("endpoint-dependent", "unknown") for i in (0, 1))


def test_every_pair_connects_and_calls(mesh):
    _, relays, nodes, _ = mesh
    results = {}
    for a in KINDS6:
        for b in KINDS6:
            caller, callee = nodes[(a, 0)], nodes[(b, 1)]
            r = caller.ask({"cmd": "call", "peer": callee.peer_id, "timeout": 40, "settle": 12}, timeout=60)
            results[(a, b)] = r
    width = 7
    lines = ["caller \\ callee " + "".join(f"{SHORT[b]:>{width}}" for b in KINDS6)]
    for a in KINDS6:
        cells = []
        for b in KINDS6:
            r = results[(a, b)]
            cells.append(f"{(r.get('path') or 'FAIL') if r.get('ok') else 'FAIL':>{width}}")
        lines.append(f"{SHORT[a]:<16}" + "".join(cells))
    print("\n" + "\n".join(lines))
    times = sorted(r["ms"] for r in results.values() if r.get("ok"))
    if times:
        print(
            f"time to first call (spawn + 2 calls, by PeerId): median {times[len(times) // 2]:.0f} ms, max {times[-1]:.0f} ms"
        )
    failed = {k: v for k, v in results.items() if not v.get("ok")}
    for k, v in failed.items():
        print(f"FAILED {k}: {v.get('error')}")
    assert not failed, failed
    direct = sum(r["path"] in ("tcp", "quic") for r in results.values())
    print(f"direct: {direct}/{len(results)}")
    # where the pairs ended: a punch that also got TCP through makes it the primary path (TCP is
    # the fast one), a moment after QUIC came up (the table above is the first direct path)
    time.sleep(2.0)
    conns = {a: nodes[(a, 0)].ask({"cmd": "status"})["conns"] for a in KINDS6}
    settled = {
        (a, b): ("tcp" if "tcp" in conns[a].get(nodes[(b, 1)].peer_id, []) else results[(a, b)]["path"])
        for a in KINDS6
        for b in KINDS6
    }
    lines = ["settled: caller \\ callee " + "".join(f"{SHORT[b]:>{width}}" for b in KINDS6)]
    lines += [f"{SHORT[a]:<25}" + "".join(f"{settled[(a, b)]:>{width}}" for b in KINDS6) for a in KINDS6]
    print("\n".join(lines))
    print(f"on TCP: {sum(v == 'tcp' for v in settled.values())}/{len(settled)}")
    for (a, b), path in settled.items():  # why a direct pair stayed on QUIC: both ends' punches
        if path == "quic":
            for who, other in ((a, (b, 1)), (b, (a, 0))):
                me = nodes[(who, 0 if who == a else 1)]
                recent = me.ask({"cmd": "holepunch"}).get("recent", [])
                mine = [
                    {k: r.get(k) for k in ("outcome", "attempt", "path", "mode", "reason")}
                    for r in recent
                    if r.get("peer") == nodes[other].peer_id
                ]
                print(f"  quic {a}->{b}: {who} punches {mine}")
    for (a, b), r in results.items():
        if (a, b) != ("symmetric", "symmetric"):
            # dialable directly, or hole punched (many-port probing when one side is symmetric)
            assert r["path"] in ("tcp", "quic"), ((a, b), r)
    # Two symmetric NATs: both sides' ports are unpredictable, so these stay relayed (the
    # call above still worked).
