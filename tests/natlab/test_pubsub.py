"""Pub-sub across NATs: one topic, a subscriber behind each of the six NAT kinds.

Two public relays are the bootstrap nodes and do not join the topic; membership gossip is off
(the lab default), so the subscribers meet only through the DHT, under the topic's key. Each
must find some of the others and form a mesh (relayed links are fine; they upgrade to direct as
any connection does), and a message published by each must reach all the others. Prints, per
node, its mesh and the path to each mesh peer, and how long meshing and delivery took.
"""

from __future__ import annotations

import time

import pytest

from .lab import Lab, TwoRelays
from .test_matrix import KINDS6, SHORT, Proc, _settled

TOPIC = "lab/news"


pytestmark = pytest.mark.usefixtures("need_lab")  # (tests/natlab/conftest.py)


def test_a_topic_reaches_a_subscriber_behind_every_nat_kind():
    with Lab(prefix="nlps") as lab:
        relays = TwoRelays(lab)
        sites = {kind: lab.add_site(kind) for kind in KINDS6}  # (every site before any node: see test_content)
        boot = relays.start().boot
        nodes = {kind: Proc(lab, site.host, boot) for kind, site in sites.items()}
        name = {p.peer_id: SHORT[k] for k, p in nodes.items()}
        try:
            deadline = time.monotonic() + 60
            while not all(_settled(n.ask({"cmd": "status"})) for n in nodes.values()):
                assert time.monotonic() < deadline, "NAT status never settled"
                time.sleep(1)
            t0 = time.monotonic()
            for n in nodes.values():
                assert n.ask({"cmd": "subscribe", "topic": TOPIC}).get("ok")
            deadline = t0 + 60
            while True:
                meshes = {k: n.ask({"cmd": "pubsub", "topic": TOPIC})["mesh"] for k, n in nodes.items()}
                if all(len(m) >= 2 for m in meshes.values()):
                    break
                assert time.monotonic() < deadline, (
                    f"meshes never formed: { {SHORT[k]: len(m) for k, m in meshes.items()} }"
                )
                time.sleep(1)
            meshed_s = time.monotonic() - t0
            t1 = time.monotonic()
            for kind, n in nodes.items():
                assert n.ask({"cmd": "publish", "topic": TOPIC, "data": f"from {kind}"}).get("ok")
            want = {f"from {k}" for k in KINDS6}
            deadline = t1 + 20
            while True:
                got = {k: set(n.ask({"cmd": "received", "topic": TOPIC})["got"]) for k, n in nodes.items()}
                if all(g == want for g in got.values()):
                    break
                assert time.monotonic() < deadline, (
                    f"not delivered: { {SHORT[k]: sorted(want - g) for k, g in got.items() if g != want} }"
                )
                time.sleep(0.2)
            delivered_s = time.monotonic() - t1
            meshes = {k: n.ask({"cmd": "pubsub", "topic": TOPIC})["mesh"] for k, n in nodes.items()}
            lines = [
                f"{SHORT[k]:<6}"
                + " ".join(
                    f"{name.get(p, '?')}:{'/'.join(paths) or '-'}"
                    for p, paths in sorted(m.items(), key=lambda x: name.get(x[0], ""))
                )
                for k, m in meshes.items()
            ]
            print(
                f"\npub-sub across NATs: meshes of >= 2 in {meshed_s:.1f} s after subscribing, 6 x 6 messages delivered in {delivered_s:.2f} s"
            )
            print("\n".join(lines))
        finally:
            for n in list(nodes.values()) + relays.procs:
                try:
                    n.p.stdin.write('{"cmd": "quit"}\n')
                    n.p.stdin.flush()
                except OSError:
                    pass
