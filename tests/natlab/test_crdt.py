"""CRDT replicas across NATs: one mesh document, a replica behind each of the six NAT kinds.

Two public relays are the bootstrap nodes and do not open the document; membership gossip is off
(the lab default): the replicas meet through the DHT, under the document's pub-sub topic. Each
writes its own key; every replica must end with all six (live over pub-sub, and anti-entropy
between replicas that meet, relayed or direct). Then a seventh node behind a port-restricted NAT
opens the document late and catches up from whichever replicas it meets. Prints how long each
step took and the path to each replica peer.
"""

from __future__ import annotations

import time

import pytest

from .lab import Lab, TwoRelays
from .test_matrix import KINDS6, SHORT, Proc, _settled

DOC = "lab/doc"


pytestmark = pytest.mark.usefixtures("need_lab")  # (tests/natlab/conftest.py)


def test_replicas_behind_every_nat_kind_converge_and_a_late_one_catches_up():
    with Lab(prefix="nlcr") as lab:
        relays = TwoRelays(lab)
        sites = {kind: lab.add_site(kind) for kind in KINDS6}
        late_site = lab.add_site("port_restricted")
        boot = relays.start().boot
        nodes = {kind: Proc(lab, site.host, boot) for kind, site in sites.items()}
        late = None
        name = {p.peer_id: SHORT[k] for k, p in nodes.items()}
        try:
            deadline = time.monotonic() + 60
            while not all(_settled(n.ask({"cmd": "status"})) for n in nodes.values()):
                assert time.monotonic() < deadline, "NAT status never settled"
                time.sleep(1)
            t0 = time.monotonic()
            for n in nodes.values():
                assert n.ask({"cmd": "crdt_open", "name": DOC}).get("ok")
            for kind, n in nodes.items():
                assert n.ask({"cmd": "crdt_set", "name": DOC, "key": kind, "value": f"from {kind}"}).get("ok")
            want = {k: f"from {k}" for k in KINDS6}
            deadline = t0 + 60
            while True:
                views = {k: n.ask({"cmd": "crdt_get", "name": DOC}) for k, n in nodes.items()}
                if all(v["m"] == want for v in views.values()):
                    break
                assert time.monotonic() < deadline, (
                    f"not converged: { {SHORT[k]: sorted(set(want) - set(v['m'])) for k, v in views.items()} }"
                )
                time.sleep(0.5)
            converged_s = time.monotonic() - t0
            assert all(v["stats"]["refused"] == 0 for v in views.values())
            late = Proc(lab, late_site.host, boot)
            deadline = time.monotonic() + 60
            while not _settled(late.ask({"cmd": "status"})):
                assert time.monotonic() < deadline, "the late node's NAT status never settled"
                time.sleep(1)
            t1 = time.monotonic()
            assert late.ask({"cmd": "crdt_open", "name": DOC}).get("ok")
            deadline = t1 + 60
            while (got := late.ask({"cmd": "crdt_get", "name": DOC}))["m"] != want:
                assert time.monotonic() < deadline, f"the late replica has {sorted(got['m'])}"
                time.sleep(0.5)
            caught_up_s = time.monotonic() - t1
            lines = [
                f"{SHORT[k]:<6}"
                + " ".join(
                    f"{name.get(p, '?')}:{'/'.join(paths) or '-'}"
                    for p, paths in sorted(v["peers"].items(), key=lambda x: name.get(x[0], ""))
                )
                for k, v in views.items()
            ]
            print(
                f"\nCRDT across NATs: 6 replicas held all 6 writes {converged_s:.1f} s after opening; a late replica caught up in {caught_up_s:.1f} s"
            )
            print("\n".join(lines))
        finally:
            for n in list(nodes.values()) + relays.procs + ([late] if late else []):
                try:
                    n.p.stdin.write('{"cmd": "quit"}\n')
                    n.p.stdin.flush()
                except OSError:
                    pass
