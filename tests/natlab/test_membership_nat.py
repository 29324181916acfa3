"""Membership (heartbeats and gossip, on by default in a Node) across every kind of NAT.

The matrix runs with membership off, to test the NAT ladder alone. Here two relays and one node
behind each kind of NAT run it on: members reach their watchers by PeerId, whatever the path
(direct, punched or relayed). Every view must come to hold every member alive, and no live member
may be suspected or declared dead meanwhile.
"""

from __future__ import annotations

import time

import pytest

from .lab import Lab, TwoRelays
from .test_matrix import KINDS6, Proc, _settled

WATCH = 20.0  # seconds of views sampled once the views are complete


pytestmark = pytest.mark.usefixtures("need_lab")  # (tests/natlab/conftest.py)


def test_every_member_sees_every_other_alive_across_nats():
    with Lab(prefix="nlb") as lab:
        two = TwoRelays(lab).start("--membership", "on")
        relays, boot = two.procs, two.boot
        nodes = {kind: Proc(lab, lab.add_site(kind).host, [*boot, "--membership", "on"]) for kind in KINDS6}
        everyone = [*relays, *nodes.values()]
        ids = {p.peer_id for p in everyone}
        name = {p.peer_id: kind for kind, p in nodes.items()} | {r.peer_id: f"relay{i}" for i, r in enumerate(relays)}

        deadline = time.monotonic() + 60
        while not all(_settled(n.ask({"cmd": "status"})) for n in nodes.values()):
            assert time.monotonic() < deadline, "NAT status never settled"
            time.sleep(1)

        def views() -> dict[str, dict[str, str]]:
            return {
                p.peer_id: {m["peer_id"]: m["state"] for m in p.ask({"cmd": "members"})["members"]} for p in everyone
            }

        t0 = time.monotonic()
        deadline = t0 + 60
        while True:
            v = views()
            missing = {name[p]: sorted(name.get(q, q) for q in ids if view.get(q) != "alive") for p, view in v.items()}
            if not any(missing.values()):
                break
            if time.monotonic() >= deadline:
                states = {
                    name[p]: {name.get(q, q): view.get(q, "absent") for q in missing[name[p]]}
                    for p, view in v.items()
                    if missing[name[p]]
                }
                gone = {q for p in everyone for q in ids if v[p.peer_id].get(q) != "alive"}
                inside = {}
                for p in everyone:
                    d = p.ask({"cmd": "members_debug"})
                    d["members"] = {
                        name.get(q, q): e for q, e in d["members"].items() if q in gone or p.peer_id in gone
                    }
                    inside[name[p.peer_id]] = d
                pytest.fail(
                    f"views never complete (not seen alive): {states}\nthe views inside: {inside}\nnames: {name}"
                )
            time.sleep(1)
        print(
            f"\nmembership across NATs: all {len(ids)} views complete {time.monotonic() - t0:.1f} s after the NAT status settled"
        )

        false = []
        end = time.monotonic() + WATCH
        while time.monotonic() < end:
            time.sleep(1)
            for p, view in views().items():
                false += [f"{name[p]} held {name.get(q, q)} {s}" for q, s in view.items() if q in ids and s != "alive"]
        assert not false, false[:10]
        print(f"membership across NATs: no live member suspected or declared dead in {WATCH:.0f} s")
